//! The `wireguard-go` backend: Debian's `wireguard-go`, started by nodus when no daemon
//! serves the device, and driven over its UAPI socket ([`super::uapi`]).
//!
//! `wireguard-go` runs as its own daemon rather than inside nodus, so a restart of nodus
//! finds the device, its peers and their sessions where it left them, and nodus's own
//! SIGTERM and SIGINT handling is untouched. The daemon creates its TUN link down; the
//! agent sets it up with the MTU.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use super::uapi::UapiDevice;
use crate::Error;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a new `wireguard-go` gets to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// A daemon that serves device `name` in this network namespace, if one answers.
pub async fn running(name: &str) -> Option<UapiDevice> {
    let device = UapiDevice::of(name);
    // The socket directory is shared by every namespace: a daemon counts as ours only if
    // the link is in this one.
    (link_exists(name) && device.state().await.is_ok()).then_some(device)
}

/// Where `binary` would be run from: itself if it names a path, else the first match in
/// `PATH`, as the shell would look it up.
pub fn find(binary: &Path) -> Option<PathBuf> {
    let is_executable = |path: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if binary.components().count() > 1 {
        return is_executable(binary).then(|| binary.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
}

/// Adopts the running daemon of device `name`, or starts `wireguard_go` for it.
pub async fn open(name: &str, wireguard_go: &Path) -> Result<UapiDevice, Error> {
    if let Some(device) = running(name).await {
        tracing::info!(device = name, "adopting the running wireguard-go");
        return Ok(device);
    }
    let device = UapiDevice::of(name);
    let _ = std::fs::remove_file(device.socket());
    // wireguard-go forks its daemon and returns once the device and socket exist. Its
    // stdio must not be ours: the daemon would hold a caller's pipes open forever.
    let status = tokio::process::Command::new(wireguard_go)
        .arg(name)
        .env("LOG_LEVEL", "error")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map_err(Error::io(format!("starting {}", wireguard_go.display())))?;
    if !status.success() {
        return Err(Error::device(
            format!("starting {} {name}", wireguard_go.display()),
            status,
        ));
    }
    let started = Instant::now();
    loop {
        match device.state().await {
            Ok(_) => break,
            Err(error) if started.elapsed() > START_TIMEOUT => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    tracing::info!(device = name, "started wireguard-go");
    Ok(device)
}

fn link_exists(name: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated string; the call only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_found_as_the_shell_would() {
        let sh = find(Path::new("sh")).expect("sh is in PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(find(&sh), Some(sh.clone()));
        assert_eq!(find(Path::new("/nonexistent/wireguard-go")), None);
        assert_eq!(find(Path::new("nodus-no-such-program")), None);
        // A file that is not executable is not a daemon to start.
        let dir = std::env::temp_dir().join(format!("nodus-find-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("wireguard-go");
        std::fs::write(&file, "").expect("file");
        assert_eq!(find(&file), None);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
