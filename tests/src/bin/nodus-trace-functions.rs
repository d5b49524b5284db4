//! `nodus-trace-functions`: runs a program and records which of its functions ran, in the
//! order they first ran, for the linker's symbol ordering file (`link/README.md`).
//!
//! ```text
//! nodus-trace-functions --map nodus.map --out DIR -- target/…/release/nodus run --config …
//! ```
//!
//! Every function's first byte becomes a breakpoint, removed at its first hit, so each
//! function costs one trap however often it runs, and a function that runs once is seen as
//! surely as a hot one (sampling would miss it, yet it maps its 64 KiB of code all the
//! same). Functions are found in the program's link map (`NODUS_LINK_MAP`, see `build.rs`),
//! so the binary traced is the one released, symbol table stripped and all. Its threads
//! are traced; children it forks are traced until they execute another program. SIGTERM
//! and SIGINT are passed on to it. x86-64 Linux only.

#![allow(unsafe_code)] // ptrace, waitpid and sigaction, each block with its SAFETY comment

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, bail};
use clap::Parser;

/// Records which functions a program runs, in the order it first runs them.
#[derive(Debug, Parser)]
struct Args {
    /// The program's link map, as lld writes it (`-Map`).
    #[arg(long)]
    map: PathBuf,
    /// Directory to write `functions-<pid>.txt` into: one mangled name per line.
    #[arg(long)]
    out: PathBuf,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<String>,
}

const INT3: u8 = 0xcc;

static STOP_ASKED: AtomicBool = AtomicBool::new(false);

extern "C" fn ask_stop(_: libc::c_int) {
    STOP_ASKED.store(true, Ordering::Relaxed);
}

/// A breakpoint at a function's entry.
struct Entry {
    name: String,
    original: u8,
    hit: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let program = PathBuf::from(&args.command[0]);
    let map = std::fs::read_to_string(&args.map)
        .with_context(|| format!("reading {}", args.map.display()))?;
    let mut entries = function_entries(&map)?;
    // SAFETY: the child only calls ptrace (async-signal-safe) between fork and exec.
    let child = unsafe {
        Command::new(&program)
            .args(&args.command[1..])
            .pre_exec(|| {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?
    };
    let pid = child.id() as libc::pid_t;
    wait(pid)?; // stopped at its exec
    let base = load_base(pid, &program)?;
    let memory = open_memory(pid)?;
    for (offset, entry) in entries.iter_mut() {
        let mut byte = [0];
        memory.read_exact_at(&mut byte, base + offset)?;
        entry.original = byte[0];
        memory.write_all_at(&[INT3], base + offset)?;
    }
    eprintln!(
        "nodus-trace-functions: {} breakpoints in {pid}",
        entries.len()
    );
    let options = libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_EXITKILL;
    ptrace(libc::PTRACE_SETOPTIONS, pid, options as usize)?;
    on_stop_signals()?;
    ptrace(libc::PTRACE_CONT, pid, 0)?;

    let order = follow(pid, base, &mut entries)?;

    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join(format!("functions-{pid}.txt"));
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    for offset in &order {
        writeln!(file, "{}", entries[offset].name)?;
    }
    eprintln!(
        "nodus-trace-functions: {} of {} functions ran; written to {}",
        order.len(),
        entries.len(),
        path.display()
    );
    Ok(())
}

/// Runs the traced program until it ends (SIGTERM first when this process is asked to
/// stop), restoring each breakpoint the first time it is hit: the functions' offsets in
/// the order they first ran.
fn follow(
    pid: libc::pid_t,
    base: u64,
    entries: &mut BTreeMap<u64, Entry>,
) -> anyhow::Result<Vec<u64>> {
    let mut order = Vec::new();
    let mut stop_sent = false;
    loop {
        if STOP_ASKED.load(Ordering::Relaxed) && !stop_sent {
            // SAFETY: signalling a child this process started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            stop_sent = true;
        }
        let mut status = 0;
        // SAFETY: waitpid writes only `status`.
        let task = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if task == -1 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => break,
                _ => return Err(error).context("waitpid"),
            }
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if task == pid {
                break;
            }
            continue;
        }
        let signal = libc::WSTOPSIG(status);
        let event = status >> 16;
        let deliver = match (signal, event) {
            (libc::SIGTRAP, 0) => {
                let mut regs = registers(task)?;
                let offset = regs.rip - 1 - base;
                match entries.get_mut(&offset) {
                    Some(entry) => {
                        // Restored in the memory of the task that trapped: threads share
                        // the program's; a forked child has a copy of its own, and traps
                        // (and is restored) separately.
                        open_memory(task)?.write_all_at(&[entry.original], regs.rip - 1)?;
                        if !entry.hit {
                            entry.hit = true;
                            order.push(offset);
                        }
                        regs.rip -= 1;
                        set_registers(task, &regs)?;
                        0
                    }
                    None => libc::SIGTRAP,
                }
            }
            (libc::SIGTRAP, libc::PTRACE_EVENT_EXEC) if task != pid => {
                ptrace(libc::PTRACE_DETACH, task, 0)?;
                continue;
            }
            // Events (clone, fork, exec) and the stop a new task starts with.
            (libc::SIGTRAP | libc::SIGSTOP, _) => 0,
            (other, _) => other,
        };
        // A task that died meanwhile cannot be continued; nothing is lost.
        let _ = ptrace(libc::PTRACE_CONT, task, deliver as usize);
    }
    Ok(order)
}

/// The functions of the `.text` output section by address, from an lld link map. Each
/// line starts with four fixed-width columns (`%16x %16x %8x %5d `: address, load address,
/// size, alignment); after them an output section is not indented, an input section by 8
/// spaces and a symbol by 16.
fn function_entries(map: &str) -> anyhow::Result<BTreeMap<u64, Entry>> {
    const COLUMNS: usize = 49;
    let mut entries = BTreeMap::new();
    let mut in_text = false;
    for line in map.lines().skip(1) {
        let (Some(columns), Some(rest)) = (line.get(..COLUMNS), line.get(COLUMNS..)) else {
            continue;
        };
        let name = rest.trim_start();
        match rest.len() - name.len() {
            0 => in_text = name == ".text",
            16 if in_text => {
                let address = columns.split_whitespace().next().unwrap_or_default();
                let address = u64::from_str_radix(address, 16)
                    .with_context(|| format!("the link map: an address in {line:?}"))?;
                let entry = Entry {
                    name: name.to_owned(),
                    original: 0,
                    hit: false,
                };
                entries.entry(address).or_insert(entry);
            }
            _ => {}
        }
    }
    if entries.is_empty() {
        bail!("the link map lists no function in .text: is it lld's?");
    }
    Ok(entries)
}

/// Where the program's first mapping starts, less its file offset: symbol addresses are
/// relative to it (a position-independent executable).
fn load_base(pid: libc::pid_t, program: &Path) -> anyhow::Result<u64> {
    let program = program.canonicalize()?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(5).map(Path::new) != Some(program.as_path()) {
            continue;
        }
        let start = fields[0].split('-').next().unwrap_or_default();
        let start = u64::from_str_radix(start, 16)?;
        let offset = u64::from_str_radix(fields[2], 16)?;
        return Ok(start - offset);
    }
    bail!("{} is not mapped in {pid}", program.display())
}

fn open_memory(pid: libc::pid_t) -> anyhow::Result<File> {
    let path = format!("/proc/{pid}/mem");
    File::options()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {path}"))
}

fn wait(pid: libc::pid_t) -> anyhow::Result<()> {
    let mut status = 0;
    // SAFETY: waitpid writes only `status`.
    if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } == -1 {
        return Err(std::io::Error::last_os_error()).context("waitpid");
    }
    if !libc::WIFSTOPPED(status) {
        bail!("{pid} did not stop at its start (status {status:#x})");
    }
    Ok(())
}

fn ptrace(request: libc::c_uint, task: libc::pid_t, data: usize) -> anyhow::Result<()> {
    // SAFETY: the requests used here take no pointer, or `data` as a plain value.
    if unsafe { libc::ptrace(request, task, 0, data) } == -1 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("ptrace {request} {task}"));
    }
    Ok(())
}

fn registers(task: libc::pid_t) -> anyhow::Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: `regs` outlives the call and has the kernel's layout.
    if unsafe { libc::ptrace(libc::PTRACE_GETREGS, task, 0, &mut regs) } == -1 {
        return Err(std::io::Error::last_os_error()).context("PTRACE_GETREGS");
    }
    Ok(regs)
}

fn set_registers(task: libc::pid_t, regs: &libc::user_regs_struct) -> anyhow::Result<()> {
    // SAFETY: `regs` has the kernel's layout; the kernel only reads it.
    if unsafe { libc::ptrace(libc::PTRACE_SETREGS, task, 0, regs) } == -1 {
        return Err(std::io::Error::last_os_error()).context("PTRACE_SETREGS");
    }
    Ok(())
}

/// SIGTERM and SIGINT interrupt the wait (no SA_RESTART) and are passed on to the program.
fn on_stop_signals() -> anyhow::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ask_stop as extern "C" fn(libc::c_int) as usize;
            if libc::sigaction(signal, &action, std::ptr::null_mut()) == -1 {
                return Err(std::io::Error::last_os_error()).context("sigaction");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_read_from_the_text_section_of_an_lld_map() -> anyhow::Result<()> {
        let map = "             VMA              LMA     Size Align Out     In      Symbol
          2fa000           2fa000      100    16 .rodata
          2fa000           2fa000      100    16         <internal>:(.rodata)
          2fa010           2fa010        0     1                 not_a_function
          2faac0           2faac0   89bcc0    64 .text
          2faac0           2faac0       2a    16         /usr/lib/x86_64-linux-gnu/Scrt1.o:(.text)
          2faac0           2faac0        0     1                 _start
          2fab00           2fab00      1a6    16         /tmp/rustc/symbols.o:(.text._ZN5nodus4main17h0123456789abcdefE)
          2fab00           2fab00      1a6     1                 _ZN5nodus4main17h0123456789abcdefE
          2fab00           2fab00      1a6     1                 an_alias_of_main
          b97780           b97780     5000    64 .data
          b97780           b97780        8     1                 also_not_a_function
";
        let names: Vec<(u64, String)> = function_entries(map)?
            .into_iter()
            .map(|(address, entry)| (address, entry.name))
            .collect();
        assert_eq!(
            names,
            [
                (0x2faac0, "_start".to_owned()),
                (0x2fab00, "_ZN5nodus4main17h0123456789abcdefE".to_owned())
            ]
        );
        Ok(())
    }
}
