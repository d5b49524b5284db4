//! Files nodus keeps across restarts (the WireGuard key, the CNI conflist, the saved
//! view): a temporary file beside the target, synced, renamed into place, then the
//! directory synced, so that neither a crash nor a power loss leaves a half-written file
//! or loses the rename. A failed write removes its temporary file: on a full disk it would
//! hold space, and the next try starts clean.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A write that failed, and which step of it.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct Error {
    pub context: String,
    pub source: std::io::Error,
}

impl Error {
    fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error { context, source }
    }
}

/// Replaces `path` with `content` through `tmp` (in the same directory), created `mode`.
pub fn replace(path: &Path, tmp: &Path, mode: u32, content: &[u8]) -> Result<(), Error> {
    replace_with(path, tmp, mode, |file| file.write_all(content))
}

/// As [`replace`], with the content written by `write` (which may stream it, through a
/// buffer of its own, rather than hold it whole).
pub fn replace_with(
    path: &Path,
    tmp: &Path,
    mode: u32,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), Error> {
    let _ = std::fs::remove_file(tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)
        .map_err(Error::io(format!("creating {}", tmp.display())))
        .and_then(|mut file| {
            write(&mut file)
                .and_then(|()| file.sync_all())
                .map_err(Error::io(format!("writing {}", tmp.display())))
        })
        .and_then(|()| {
            std::fs::rename(tmp, path)
                .map_err(Error::io(format!("renaming into {}", path.display())))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(Error::io(format!("syncing {}", dir.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_no_temporary_left() {
        let dir = std::env::temp_dir().join(format!("nodus-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (path, tmp) = (dir.join("key"), dir.join("key.tmp"));
        std::fs::write(&tmp, "a leftover of a crash").expect("leftover");
        replace(&path, &tmp, 0o600, b"new\n").expect("replace");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new\n");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!tmp.exists());
        // A target that cannot be replaced (a directory) leaves no temporary behind.
        let blocked = dir.join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).expect("dir");
        assert!(replace(&blocked, &tmp, 0o600, b"x").is_err());
        assert!(!tmp.exists());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
