//! `nodus cleanup` for the mesh: the device (with its addresses and routes), the UAPI
//! socket of a userspace device, and the CNI conflist. The key file stays: a node that comes
//! back keeps its identity. Also the links another CNI left (`nodus cleanup --foreign`).

use std::path::Path;

use crate::Error;
use crate::backend::uapi::SOCKET_DIR;
use crate::links::Links;

/// What [`remove`] found and removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub device: bool,
    pub conflist: bool,
}

/// Removes the mesh's device named `interface` and the conflist at `conflist`, whichever
/// exist. Deleting the device also ends a `wireguard-go` serving it; an embedded device
/// is already gone with the nodus that ran it.
pub async fn remove(interface: &str, conflist: &Path) -> Result<Removed, Error> {
    let links = Links::new()?;
    let mut removed = Removed::default();
    if let Some(link) = links.find(interface).await? {
        links.delete(link.index).await?;
        removed.device = true;
    }
    let socket = Path::new(SOCKET_DIR).join(format!("{interface}.sock"));
    remove_file_if_present(&socket)?;
    removed.conflist = remove_file_if_present(conflist)?;
    Ok(removed)
}

/// Those of the links `names` that exist.
pub async fn existing_links(names: &[&str]) -> Result<Vec<String>, Error> {
    let links = Links::new()?;
    let mut found = Vec::new();
    for name in names {
        if links.find(name).await?.is_some() {
            found.push(name.to_string());
        }
    }
    Ok(found)
}

/// Deletes the links `names` (their addresses and routes go with them); those that were
/// there.
pub async fn remove_links(names: &[&str]) -> Result<Vec<String>, Error> {
    let links = Links::new()?;
    let mut removed = Vec::new();
    for name in names {
        if let Some(link) = links.find(name).await? {
            links.delete(link.index).await?;
            removed.push(name.to_string());
        }
    }
    Ok(removed)
}

/// Removes the file at `path`; whether it was there.
pub fn remove_file_if_present(path: &Path) -> Result<bool, Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(Error::io(format!("removing {}", path.display()))(error)),
    }
}
