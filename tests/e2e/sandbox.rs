//! `nodus sandbox`: the README's first command, brought up and torn down for real.

use crate::support::{NODUS, free_port};
use nodus_testbed::netns;
use std::process::Command;

#[test]
fn sandbox_brings_every_node_up_and_removes_everything() {
    assert!(
        netns::is_root(),
        "the sandbox test needs root (network namespaces)"
    );
    let dir = std::env::temp_dir().join(format!("nodus-e2e-sandbox-{}", std::process::id()));
    let output = Command::new(NODUS)
        .args([
            "sandbox",
            "--exit-when-ready",
            "--api-port",
            &free_port().to_string(),
        ])
        .arg("--dir")
        .arg(&dir)
        .output()
        .expect("sandbox runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for node in ["node-1", "node-2", "node-3"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} missing:\n{stdout}"));
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(columns[1..], ["true", "5", "4", "10", "1"], "{row}");
    }
    assert!(
        stdout.contains("web-1") && stdout.contains("db-1"),
        "{stdout}"
    );
    // Namespace names start with "n" and the creating process's pid in hex.
    let list = netns::run("ip", &["netns", "list"]).expect("ip netns list");
    let child_prefix = format!("n{:x}", output_pid_hint(&stdout));
    assert!(
        !list.lines().any(|l| l.starts_with(&child_prefix)),
        "sandbox left namespaces behind:\n{list}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sandbox prints its pid so that leftovers can be told apart from other tests'.
fn output_pid_hint(stdout: &str) -> u32 {
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sandbox pid: "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid line in:\n{stdout}"));
    pid & 0xfffff
}
