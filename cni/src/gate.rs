//! The isolation gate: `ADD` of a Kubernetes pod asks the node's agent, over a Unix
//! socket, to put the pod's NetworkPolicy isolation in place for the addresses the IPAM
//! plugin gave it, and returns only once the agent confirms. The API learns a pod's
//! addresses only after its sandbox is up, so without the gate a pod's first connections
//! (an init container's) would pass before any policy isolates it.
//!
//! The exchange is one line of JSON each way: a [`GateRequest`], then a [`GateReply`].
//! The agent's side (the listener) is in `nodus run`; this is the plugin's side and the
//! shared format.

use crate::error::{Error, code};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long `ADD` waits for the agent: it answers within a batch once it knows the pod,
/// which its watch delivers before kubelet starts the sandbox.
pub const WAIT: Duration = Duration::from_secs(30);
/// The longest line either side reads.
pub const LINE_MAX: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRequest {
    pub namespace: String,
    pub name: String,
    /// What the IPAM plugin gave the pod.
    pub ips: Vec<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateReply {
    /// The pod's isolation (or the agent's word that no policy selects it) is in the
    /// kernel.
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<Result<(), String>> for GateReply {
    /// Isolated, or why not.
    fn from(outcome: Result<(), String>) -> GateReply {
        GateReply {
            ok: outcome.is_ok(),
            error: outcome.err(),
        }
    }
}

/// `STATUS` with a gate: the agent takes connections at `socket` (a socket file whose
/// agent is gone refuses them), or it has taken them since the node booted. The
/// connection closes without a request, which the agent takes for this question.
///
/// containerd asks `STATUS` for the kubelet every few seconds, and a failure makes the
/// node NotReady, so that after 300 s its running pods are evicted. That is right before
/// the agent has ever answered (no pod should be placed on a node without its network),
/// and wrong after: an agent that crashes or restarts leaves its pods' network in the
/// kernel, new pods' `ADD`s wait at the gate and fail until it is back, and the node
/// stays Ready, as with Calico's and Cilium's agents. The answer is remembered in a file
/// beside the socket (`<socket>.answered`), in `/run`, which a reboot empties.
pub fn agent_answers(socket: &Path) -> Result<(), Error> {
    let answered = answered_marker(socket);
    match UnixStream::connect(socket) {
        Ok(_) => {
            // Best effort: without the file, STATUS only stays tied to the agent.
            let _ = std::fs::write(&answered, b"");
            Ok(())
        }
        Err(_) if answered.exists() => Ok(()),
        Err(e) => Err(Error::new(
            code::PLUGIN_NOT_AVAILABLE,
            format!(
                "the node's nodus agent does not answer at {} ({e}) and has not since the \
                 node booted: a pod's ADD would wait for its NetworkPolicy isolation and fail",
                socket.display()
            ),
        )),
    }
}

/// The file that says the agent at `socket` answered since the node booted.
pub fn answered_marker(socket: &Path) -> std::path::PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".answered");
    name.into()
}

/// Asks the agent at `socket` to isolate `request`'s pod and waits for its word, at most
/// `wait`. Any failure leaves the pod unstarted: the runtime tries `ADD` again.
pub fn pass(socket: &Path, request: &GateRequest, wait: Duration) -> Result<(), Error> {
    let failed = |what: String| {
        Error::new(
            code::POLICY_PENDING,
            format!(
                "pod {}/{}: NetworkPolicy isolation not confirmed by the agent at {}: {what}",
                request.namespace,
                request.name,
                socket.display()
            ),
        )
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| failed(format!("connecting: {e}")))?;
    stream
        .set_read_timeout(Some(wait))
        .and_then(|()| stream.set_write_timeout(Some(wait)))
        .map_err(|e| failed(format!("setting timeouts: {e}")))?;
    let mut line = serde_json::to_vec(request).map_err(|e| failed(e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| failed(format!("sending: {e}")))?;
    let mut answer = String::new();
    BufReader::new(std::io::Read::take(stream, LINE_MAX as u64))
        .read_line(&mut answer)
        .map_err(|e| failed(format!("waiting for the answer: {e}")))?;
    let reply: GateReply =
        serde_json::from_str(&answer).map_err(|e| failed(format!("reading the answer: {e}")))?;
    match (reply.ok, reply.error) {
        (true, _) => Ok(()),
        (false, error) => Err(failed(error.unwrap_or_else(|| "refused".into()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn request() -> GateRequest {
        GateRequest {
            namespace: "shop".into(),
            name: "web".into(),
            ips: vec!["10.244.1.5".parse().expect("ip")],
        }
    }

    /// An agent that reads one request and answers `reply` (a raw line).
    fn agent(reply: &'static str) -> (tempdir::Dir, std::thread::JoinHandle<String>) {
        let dir = tempdir::Dir::new();
        let listener = UnixListener::bind(dir.socket()).expect("bind");
        let served = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).expect("read");
            (&stream).write_all(reply.as_bytes()).expect("write");
            line
        });
        (dir, served)
    }

    #[test]
    fn the_pod_passes_only_when_the_agent_says_so() {
        let (dir, served) = agent("{\"ok\":true}\n");
        pass(&dir.socket(), &request(), WAIT).expect("passes");
        let sent: GateRequest = serde_json::from_str(&served.join().expect("agent")).expect("json");
        assert_eq!(sent, request());

        let (dir, _served) = agent("{\"ok\":false,\"error\":\"no such pod\"}\n");
        let refused = pass(&dir.socket(), &request(), WAIT).expect_err("refused");
        assert_eq!(refused.code, code::POLICY_PENDING);
        assert!(
            refused.message.contains("no such pod"),
            "{}",
            refused.message
        );

        let (dir, _served) = agent("garbage\n");
        assert!(pass(&dir.socket(), &request(), WAIT).is_err());
        let none = tempdir::Dir::new();
        let absent = pass(&none.socket(), &request(), WAIT).expect_err("no agent");
        assert!(absent.message.contains("connecting"), "{}", absent.message);
    }

    #[test]
    fn a_silent_agent_fails_the_add_after_the_wait() {
        let dir = tempdir::Dir::new();
        let _listener = UnixListener::bind(dir.socket()).expect("bind");
        let silent = pass(&dir.socket(), &request(), Duration::from_millis(200));
        assert!(silent.is_err());
    }

    mod tempdir {
        use std::path::PathBuf;

        /// A directory of its own, removed on drop.
        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                static NEXT: std::sync::atomic::AtomicUsize =
                    std::sync::atomic::AtomicUsize::new(0);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path =
                    std::env::temp_dir().join(format!("nodus-gate-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&path).expect("dir");
                Dir(path)
            }

            pub fn socket(&self) -> PathBuf {
                self.0.join("gate.sock")
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
