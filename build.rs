//! Lays out the functions nodus runs side by side at the start of its code.
//!
//! The kernel maps a binary's code 64 KiB around every page a process touches, so resident
//! code follows how widely the run code is spread, not how much of it runs: about 3.4 MiB of
//! the 8.6 MiB of functions run, in blocks spread over nearly all of it. `link/` holds the
//! list, in the order a profile first ran them, and how to make it again.

fn main() {
    // Read when the script runs, not when it is compiled: a script built in another
    // checkout that shares the target directory would hand the linker that checkout's list.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    let order = std::path::Path::new(&manifest_dir).join("link/hot-functions.order");
    println!("cargo:rerun-if-changed={}", order.display());
    let release = std::env::var("PROFILE").is_ok_and(|profile| profile == "release");
    // rust-lld is the linker Rust uses for this target; other linkers lack the option.
    let lld = std::env::var("TARGET").is_ok_and(|target| target == "x86_64-unknown-linux-gnu");
    if release && lld {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        // Where each function went: what `nodus-trace-functions` names them by, since the
        // released binary has no symbol table.
        println!("cargo:rerun-if-env-changed=NODUS_LINK_MAP");
        if let Some(map) = std::env::var_os("NODUS_LINK_MAP") {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,-Map={}",
                map.to_string_lossy()
            );
            println!("cargo:rustc-link-arg-bins=-Wl,--no-demangle");
        }
    }
}
