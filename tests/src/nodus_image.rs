//! The nodus image a real node runs nodus's DaemonSet from, made without an image builder
//! or a registry: the image's static binary (built as the Containerfile and CI build it)
//! and the reference CNI plugins its init container copies onto the node, laid out as the
//! Containerfile lays them out, in an OCI archive (`k8s/oci-archive.sh`) that each node's
//! containerd imports before its kubelet starts.

use crate::control_plane::k8s_script;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

/// The image's name, as the DaemonSet's kustomization sets it (`images: newName/newTag`).
pub const NODUS_IMAGE_NAME: &str = "localhost/nodus";
pub const NODUS_IMAGE_TAG: &str = "test";

/// The reference plugins the image carries and where (the Containerfile's come from
/// Debian's containernetworking-plugins; the test image's from their modules).
const IMAGE_CNI_PLUGINS: [&str; 3] = ["host-local", "portmap", "loopback"];
const IMAGE_CNI_DIR: &str = "usr/lib/nodus/cni";

/// Writes the image's archive into `dir` and returns its path.
pub fn make_archive(dir: &Path) -> anyhow::Result<PathBuf> {
    let binary = static_binary()?;
    let rootfs = dir.join("nodus-image");
    let plugins = rootfs.join(IMAGE_CNI_DIR);
    std::fs::create_dir_all(&plugins).with_context(|| format!("creating {}", plugins.display()))?;
    std::fs::copy(&binary, rootfs.join("nodus"))
        .with_context(|| format!("copying {}", binary.display()))?;
    // The reference plugins built from their modules read CNI 1.1, so the nodes' conflist
    // is 1.1.0 and containerd asks STATUS and GC as it does on a current distribution;
    // Debian's (the Containerfile's) read 1.0.0 at most.
    let reference = crate::control_plane::reference_cni_plugins()?;
    for plugin in IMAGE_CNI_PLUGINS {
        let from = reference.join(plugin);
        std::fs::copy(&from, plugins.join(plugin))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    let archive = dir.join("nodus-image.tar");
    k8s_script(
        "oci-archive.sh",
        &[
            &rootfs.to_string_lossy(),
            &archive.to_string_lossy(),
            &format!("{NODUS_IMAGE_NAME}:{NODUS_IMAGE_TAG}"),
            r#""Entrypoint":["/nodus"],"Cmd":["run"]"#,
        ],
    )?;
    std::fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    Ok(archive)
}

/// The image's binary: `NODUS_IMAGE_BINARY` when it names one (CI builds it before the
/// tests), else built here (in `target/image`) as CI and the Containerfile build it:
/// static glibc, release, without the test bed. The image has no libc, so the test build
/// cannot serve.
pub fn static_binary() -> anyhow::Result<PathBuf> {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(binary) = built.as_ref() {
        return Ok(binary.clone());
    }
    let binary = match std::env::var_os("NODUS_IMAGE_BINARY") {
        Some(binary) => PathBuf::from(binary),
        None => {
            // A target directory of its own: a build from inside `cargo test` sees another
            // environment than one from a shell and would rebuild the other's every time.
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| workspace.join("target"), PathBuf::from)
                .join("image");
            let status = Command::new(env!("CARGO"))
                .current_dir(&workspace)
                .env("RUSTFLAGS", "-C target-feature=+crt-static")
                .args(["build", "--release", "--locked", "--quiet"])
                .args(["--target", "x86_64-unknown-linux-gnu", "--bin", "nodus"])
                .args(["--no-default-features", "--features", "jemalloc"])
                .arg("--target-dir")
                .arg(&target)
                .status()
                .context("running cargo for the image's binary")?;
            if !status.success() {
                bail!("building the image's static binary: cargo {status}");
            }
            target.join("x86_64-unknown-linux-gnu/release/nodus")
        }
    };
    if !binary.is_file() {
        bail!("the image's binary {} does not exist", binary.display());
    }
    *built = Some(binary.clone());
    Ok(binary)
}
