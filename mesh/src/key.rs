//! WireGuard keys and the node's key file.
//!
//! The private key lives in one file (base64, as `wg genkey` writes it), mode 0600 in a
//! directory created 0700. It is generated on first start and read on every later one, so
//! the public key that peers know stays valid across restarts.

#![allow(unsafe_code)] // syscalls and process signals, each block with its SAFETY comment

use crate::Error;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

pub const KEY_LEN: usize = 32;

/// A Curve25519 key: a peer's public key, or (inside [`KeyPair`]) the node's private one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(pub [u8; KEY_LEN]);

impl Key {
    pub fn from_base64(text: &str) -> Option<Key> {
        let bytes = STANDARD.decode(text.trim()).ok()?;
        Some(Key(bytes.try_into().ok()?))
    }

    pub fn from_hex(text: &str) -> Option<Key> {
        let text = text.as_bytes();
        if text.len() != 2 * KEY_LEN {
            return None;
        }
        let mut key = [0; KEY_LEN];
        for (byte, pair) in key.iter_mut().zip(text.chunks_exact(2)) {
            let digit = |c: u8| (c as char).to_digit(16);
            *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Some(Key(key))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }
}

/// Public keys print as base64, the form `wg` and the annotations use.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// Never the key itself: a `Key` may be the private one, and a `{:?}` in a log line or an
/// error must not carry it. Public keys print with `Display`.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(…)")
    }
}

/// The node's key pair. The private half never prints.
#[derive(Clone)]
pub struct KeyPair {
    private: Key,
    pub public: Key,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair {{ public: {} }}", self.public)
    }
}

impl KeyPair {
    pub fn from_private(private: Key) -> KeyPair {
        let secret = x25519_dalek::StaticSecret::from(private.0);
        let public = Key(x25519_dalek::PublicKey::from(&secret).to_bytes());
        KeyPair { private, public }
    }

    /// A fresh pair from the kernel's random source, clamped as `wg genkey` does.
    pub fn generate() -> Result<KeyPair, Error> {
        let mut bytes = [0u8; KEY_LEN];
        let mut filled = 0;
        while filled < KEY_LEN {
            // SAFETY: the pointer and length describe the unfilled tail of `bytes`.
            let n = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), KEY_LEN - filled, 0)
            };
            if n < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::io("reading random bytes for a key")(error));
                }
                continue;
            }
            filled += n as usize;
        }
        bytes[0] &= 248;
        bytes[31] = (bytes[31] & 127) | 64;
        Ok(KeyPair::from_private(Key(bytes)))
    }

    pub fn private(&self) -> &Key {
        &self.private
    }

    /// Reads the key file, or creates it (and its directory) with a new key.
    pub fn load_or_create(path: &Path) -> Result<KeyPair, Error> {
        let shown = path.display();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let key = Key::from_base64(&text).ok_or_else(|| {
                    Error::device(format!("key file {shown}"), "not a base64 WireGuard key")
                })?;
                tighten_mode(path)?;
                tighten_directory(path)?;
                Ok(KeyPair::from_private(key))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let pair = KeyPair::generate()?;
                write_new(path, &pair.private)?;
                tighten_directory(path)?;
                tracing::info!(path = %shown, public_key = %pair.public, "generated the WireGuard key");
                Ok(pair)
            }
            Err(error) => Err(Error::io(format!("reading key file {shown}"))(error)),
        }
    }
}

/// A key file that others can read is fixed rather than trusted as is.
fn tighten_mode(path: &Path) -> Result<(), Error> {
    let context = || format!("checking the mode of {}", path.display());
    let mode = std::fs::metadata(path)
        .map_err(Error::io(context()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "key file readable by others; setting 0600");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(Error::io(context()))?;
    }
    Ok(())
}

/// The key's directory, when it holds nothing but the key (as `/var/lib/nodus`, which the
/// kubelet creates 0755 for the DaemonSet's hostPath), is made 0700: no other user learns
/// even when the key changed. A directory shared with other files is left as it is, with a
/// warning: its mode is not nodus's to change.
fn tighten_directory(key: &Path) -> Result<(), Error> {
    let Some(dir) = key.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    let context = || format!("checking the mode of {}", dir.display());
    let mode = std::fs::metadata(dir)
        .map_err(Error::io(context()))?
        .permissions()
        .mode();
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let temporary = key.with_extension("tmp");
    let only_the_key = std::fs::read_dir(dir)
        .map_err(Error::io(context()))?
        .filter_map(Result::ok)
        .all(|entry| entry.path() == key || entry.path() == temporary);
    if only_the_key {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(Error::io(format!("setting the mode of {}", dir.display())))?;
    } else {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777), "the WireGuard key's directory holds other files and others can list it; give the key a directory of its own");
    }
    Ok(())
}

/// Writes a new key file, 0600, replaced whole ([`nodus_durable::replace`]): a crash never
/// leaves a half-written key.
fn write_new(path: &Path, key: &Key) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(Error::io(format!("creating {}", dir.display())))?;
    }
    let content = format!("{}\n", key.to_base64());
    nodus_durable::replace(path, &path.with_extension("tmp"), 0o600, content.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_base64_and_hex() {
        let pair = KeyPair::generate().expect("key");
        let text = pair.public.to_base64();
        assert_eq!(text.len(), 44);
        assert_eq!(Key::from_base64(&text), Some(pair.public));
        assert_eq!(Key::from_hex(&pair.public.to_hex()), Some(pair.public));
        assert_eq!(Key::from_base64("short"), None);
        assert_eq!(Key::from_hex("zz"), None);
    }

    #[test]
    fn the_public_key_matches_wg_pubkey() {
        // `echo AAEB…AUE= | wg pubkey` prints the expected key.
        let private =
            Key::from_base64("AAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAUE=").expect("key");
        let pair = KeyPair::from_private(private);
        assert_eq!(
            pair.public.to_base64(),
            "pOCSkrZRwni5dyxWn1+puxPZBrRqtoyd+dwrRAn4ogk="
        );
    }

    #[test]
    fn the_key_file_is_private_and_stable() {
        let dir = std::env::temp_dir().join(format!("nodus-key-{}", std::process::id()));
        let path = dir.join("sub/wireguard.key");
        let first = KeyPair::load_or_create(&path).expect("created");
        let dir_mode = std::fs::metadata(path.parent().expect("dir"))
            .expect("dir")
            .permissions()
            .mode();
        let file_mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(file_mode & 0o777, 0o600);
        let second = KeyPair::load_or_create(&path).expect("read");
        assert_eq!(first.public, second.public);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        KeyPair::load_or_create(&path).expect("read");
        let file_mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(file_mode & 0o777, 0o600);
        // A directory the kubelet made for the key (0755) becomes private; one shared with
        // other files keeps its mode.
        let key_dir = path.parent().expect("dir");
        std::fs::set_permissions(key_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        KeyPair::load_or_create(&path).expect("read");
        let mode = |p: &Path| std::fs::metadata(p).expect("mode").permissions().mode() & 0o777;
        assert_eq!(mode(key_dir), 0o700);
        std::fs::set_permissions(key_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(key_dir.join("other"), "").expect("another file");
        KeyPair::load_or_create(&path).expect("read");
        assert_eq!(mode(key_dir), 0o755);
        assert_eq!(format!("{:?}", first.private()), "Key(…)");
        assert!(!format!("{first:?}").contains(&first.private().to_base64()));
        std::fs::write(&path, "garbage").expect("write");
        assert!(KeyPair::load_or_create(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
