//! Small blocking clients for tests and the sandbox: an HTTP GET and a TCP/UDP "who
//! answers" probe against the echo server; and a server outside the cluster that tells
//! a client which source address reached it.

use anyhow::{Context, bail};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

/// `GET path` over HTTP/1.0; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .with_context(|| format!("reading the response from {addr}"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no HTTP status from {addr}: {head:?}"))?;
    Ok((status, body.to_string()))
}

/// Sends one line over TCP and returns the echo server's one-line answer (its name).
pub fn tcp_who(addr: SocketAddr, timeout: Duration) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"who\n")?;
    // The echo server answers every message until the client is done sending.
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .with_context(|| format!("reading from {addr}"))?;
    Ok(answer.trim().to_string())
}

/// Sends one datagram and returns the echo server's answer (its name).
pub fn udp_who(socket: &UdpSocket, addr: SocketAddr, timeout: Duration) -> anyhow::Result<String> {
    socket.set_read_timeout(Some(timeout))?;
    socket.send_to(b"who\n", addr)?;
    let mut buf = [0u8; 512];
    let (n, from) = socket
        .recv_from(&mut buf)
        .with_context(|| format!("waiting for {addr}"))?;
    if n == 0 {
        bail!("empty answer from {from}");
    }
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// A TCP server in a network namespace that answers every connection with the address
/// it came from, as [`tcp_who`] reads it: what a host outside the cluster sees of a pod,
/// the node's address once the pod's traffic is masqueraded. Stops when dropped.
pub struct SourceEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SourceEcho {
    /// Listens on `addr` in the namespace named `ns`.
    pub fn start(ns: &str, addr: SocketAddr) -> anyhow::Result<SourceEcho> {
        let listener = crate::netns::enter(ns, || TcpListener::bind(addr))?
            .with_context(|| format!("binding {addr} in {ns}"))?;
        // Non-blocking, so that the loop sees `stop`.
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || answer_with_sources(&listener, &stop)
        });
        Ok(SourceEcho {
            stop,
            thread: Some(thread),
        })
    }
}

fn answer_with_sources(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((mut stream, from)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                // The client's line is read first: closing with unread data would reset
                // the connection before the answer arrives.
                let _ = stream.read(&mut [0u8; 512]);
                let _ = writeln!(stream, "{}", from.ip());
            }
            // Nobody waiting (or an aborted connection): look again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Drop for SourceEcho {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
