//! The delegated IPAM plugin (`host-local`): found in `CNI_PATH`, run with this call's
//! environment and the network configuration, as the specification's delegation asks.

use crate::error::{Error, code};
use crate::protocol::Command;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Runs `plugin` for `command` with `config` on its stdin; returns its result (`ADD`) or
/// `Null`. A failure carries the plugin's own code and message.
pub fn delegate(
    plugin: &str,
    cni_path: &[PathBuf],
    command: Command,
    config: &[u8],
) -> Result<Value, Error> {
    let program = cni_path
        .iter()
        .map(|dir| dir.join(plugin))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            Error::new(
                code::IO,
                format!("the IPAM plugin {plugin} is not in CNI_PATH {cni_path:?}"),
            )
        })?;
    let output = run(&program, command, config)
        .map_err(|e| Error::new(code::IO, format!("running {}: {e}", program.display())))?;
    if !output.status.success() {
        // A plugin reports its failure on stdout, as this one does.
        let reply: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        let message = reply["msg"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&output.stderr).trim().to_string());
        return Err(Error {
            code: reply["code"]
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(code::IO),
            message: format!(
                "the IPAM plugin {plugin} failed {} ({}): {message}",
                command.as_str(),
                output.status
            ),
            details: reply["details"].as_str().unwrap_or_default().to_string(),
        });
    }
    if command != Command::Add {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| Error::decode(format!("the IPAM plugin {plugin}'s result: {e}")))
}

fn run(program: &Path, command: Command, config: &[u8]) -> std::io::Result<std::process::Output> {
    let mut child = std::process::Command::new(program)
        .env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(config)?;
    }
    child.wait_with_output()
}
