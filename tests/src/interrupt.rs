//! Ctrl-C for a long run of a test (the upstream e2e suites): SIGINT or SIGTERM does not
//! end the test's process at once, which would leave the nodes' kubelets, containers,
//! cgroups and namespaces behind, but is passed on to the program it runs and remembered,
//! so that the test ends through its `Drop`s and removes what it made.

#![allow(unsafe_code)] // sigaction(2) and kill(2), each with its SAFETY comment

use anyhow::{Context, bail};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

/// The signal that arrived (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// The program being run, which a signal is passed on to (0: none).
static RUNNING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
    let child = RUNNING.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; the pid is our own child's, still unreaped.
        unsafe { libc::kill(child, libc::SIGINT) };
    }
}

/// From now on SIGINT and SIGTERM are caught for this process: [`interrupted`] tells
/// whether one came, and [`run`] passes it on. A handler (unlike `SIG_IGN`) does not pass
/// to the programs this process starts: they keep the default action.
pub fn catch() -> anyhow::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only touches atomics and calls
        // kill(2), both async-signal-safe.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &raw const action, std::ptr::null_mut())
        };
        if installed != 0 {
            return Err(std::io::Error::last_os_error()).context("installing a signal handler");
        }
    }
    Ok(())
}

/// The signal that came since [`catch`], if one did.
pub fn interrupted() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Runs `command` to its end; a signal caught meanwhile is passed on to it as SIGINT.
/// Refuses to start it once a signal has come.
pub fn run(command: &mut Command) -> anyhow::Result<ExitStatus> {
    if let Some(signal) = interrupted() {
        bail!(
            "interrupted (signal {signal}) before {:?}",
            command.get_program()
        );
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let pid = i32::try_from(child.id()).context("a pid")?;
    RUNNING.store(pid, Ordering::SeqCst);
    // A signal between the spawn and the store above.
    if interrupted().is_some() {
        // SAFETY: kill(2) of our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let status = child.wait();
    RUNNING.store(0, Ordering::SeqCst);
    status.context("waiting")
}
