//! `nodus-cni`: the CNI plugin that links a pod to its node, in place of the reference
//! `ptp` plugin that k3s and Talos do not ship and Debian builds against glibc. The runtime
//! runs it as `nodus-cni` (a copy of the nodus binary, which answers to that name);
//! addresses come from the delegated IPAM plugin (`host-local`). It speaks CNI 1.1:
//! `STATUS` says whether the node's agent answers, `GC` removes what lost `DEL`s left.
//!
//! - [`error`]: failures as CNI reports them, with the specification's codes.
//! - [`protocol`]: the environment, the configuration, the IPAM result and the replies;
//!   pure, so tested without root.
//! - [`ipam`]: running the IPAM plugin.
//! - [`link`]: the veth pair, addresses and routes, over rtnetlink.
//! - [`gate`]: waiting, in `ADD`, until the node's agent has isolated the pod.

pub mod error;
pub mod gate;
pub mod ipam;
pub mod link;
pub mod protocol;

pub use error::{Error, code};
use protocol::{Addressing, Command, Config, Invocation};
use std::io::{Read, Write};
use std::process::ExitCode;

/// The plugin's `type` in a conflist, and the file name the runtime runs it by.
pub const PLUGIN: &str = "nodus-cni";

/// The largest network configuration read from stdin; a conflist entry is a few hundred
/// bytes.
const MAX_CONFIG: u64 = 1 << 20;

/// The plugin's process: reads the call from the environment and stdin, prints the result
/// or the error on stdout, as the runtime expects.
pub fn main() -> ExitCode {
    let mut config = Vec::new();
    let read = std::io::stdin()
        .take(MAX_CONFIG + 1)
        .read_to_end(&mut config)
        .map_err(|e| Error::new(code::IO, format!("reading the configuration: {e}")))
        .and_then(|_| {
            if config.len() as u64 > MAX_CONFIG {
                Err(Error::config(format!(
                    "the network configuration is larger than {MAX_CONFIG} bytes"
                )))
            } else {
                Ok(())
            }
        });
    let outcome = read
        .and_then(|()| Invocation::from_env(|name| std::env::var(name).ok()))
        .and_then(|call| run(&call, &config));
    let (reply, status) = match outcome {
        Ok(reply) => (reply, ExitCode::SUCCESS),
        Err(error) => {
            let version = Config::parse(&config)
                .map(|c| c.version)
                .unwrap_or_else(|_| protocol::LATEST_VERSION.to_string());
            eprintln!("{PLUGIN}: {error}");
            (
                Some(protocol::error_result(&version, &error)),
                ExitCode::FAILURE,
            )
        }
    };
    if let Some(reply) = reply {
        let mut out = std::io::stdout().lock();
        // Nothing is left to tell anyone when stdout itself fails.
        let _ = writeln!(out, "{reply}").and_then(|()| out.flush());
    }
    status
}

/// Carries out `call` with the network configuration `config`; `ADD` and `VERSION` reply.
/// `STATUS` and `GC` (1.1.0) reply nothing; a failure is their answer.
pub fn run(call: &Invocation, config: &[u8]) -> Result<Option<serde_json::Value>, Error> {
    if call.command == Command::Version {
        return Ok(Some(protocol::version_result()));
    }
    let parsed = Config::parse(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::new(code::IO, format!("starting the runtime: {e}")))?;
    let netns = call.netns.as_deref();
    match (call.command, netns) {
        // Able to take ADDs: the agent answers at the gate (when there is one), and the
        // IPAM plugin says it is available.
        (Command::Status, _) => {
            parsed.allows_status_and_gc()?;
            if let Some(socket) = &parsed.policy_socket {
                gate::agent_answers(socket)?;
            }
            ipam::delegate(&parsed.ipam, &call.cni_path, Command::Status, config)?;
            Ok(None)
        }
        // What DELs missed: links of attachments gone, then their leases.
        (Command::Gc, _) => {
            parsed.allows_status_and_gc()?;
            let valid = &parsed.valid_attachments;
            runtime.block_on(link::gc(&parsed.network, valid))?;
            ipam::delegate(&parsed.ipam, &call.cni_path, Command::Gc, config)?;
            ipam::release_stale_leases(&parsed.ipam, &call.cni_path, config, valid)?;
            Ok(None)
        }
        (Command::Add, Some(netns)) => {
            let result = ipam::delegate(&parsed.ipam, &call.cni_path, Command::Add, config)?;
            let made = Addressing::parse(&result).and_then(|addressing| {
                let ends = runtime.block_on(link::add(
                    call,
                    netns,
                    &parsed.network,
                    parsed.mtu,
                    &addressing,
                ))?;
                // The pod's containers start when ADD returns: its isolation first.
                if let (Some(socket), Some((namespace, name))) = (&parsed.policy_socket, &call.pod)
                {
                    let request = gate::GateRequest {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        ips: addressing
                            .addresses
                            .iter()
                            .map(|a| a.address.addr)
                            .collect(),
                    };
                    if let Err(error) = gate::pass(socket, &request, gate::WAIT) {
                        let _ = runtime.block_on(link::del(call));
                        return Err(error);
                    }
                }
                Ok((ends, addressing))
            });
            match made {
                Ok(((host, pod), addressing)) => Ok(Some(protocol::add_result(
                    &parsed,
                    &host,
                    &pod,
                    &addressing,
                ))),
                Err(error) => {
                    // The addresses go back, or they would leak one per failed ADD.
                    let _ = ipam::delegate(&parsed.ipam, &call.cni_path, Command::Del, config);
                    Err(error)
                }
            }
        }
        // The link (with the node's route to the address) goes before the lease: an
        // address given back while its route stays would fail the next pod's ADD. Both
        // steps are no-ops when done already, so a DEL that failed half-way is retried.
        (Command::Del, _) => {
            runtime.block_on(link::del(call))?;
            ipam::delegate(&parsed.ipam, &call.cni_path, Command::Del, config)?;
            Ok(None)
        }
        (Command::Check, Some(netns)) => {
            let previous = parsed
                .prev_result
                .as_ref()
                .ok_or_else(|| Error::config("CHECK needs the prevResult of the ADD it checks"))?;
            let addressing = Addressing::parse(previous)?;
            ipam::delegate(&parsed.ipam, &call.cni_path, Command::Check, config)?;
            runtime.block_on(link::check(call, netns, &addressing))?;
            Ok(None)
        }
        // `Invocation::from_env` gives ADD and CHECK a namespace.
        (command, _) => Err(Error::environment(format!(
            "CNI_NETNS is not set for {}",
            command.as_str()
        ))),
    }
}
