//! `nodus status`: asks a running agent for `/status` and prints one screen.

use crate::agent::status::{Status, unix_ms};
use anyhow::Context;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// "3.2 s ago", "4 min ago".
fn ago(now: u64, then: u64) -> String {
    let seconds = now.saturating_sub(then) as f64 / 1e3;
    match seconds {
        s if s < 60.0 => format!("{s:.1} s ago"),
        s if s < 3600.0 => format!("{:.0} min ago", s / 60.0),
        s => format!("{:.1} h ago", s / 3600.0),
    }
}

/// One screen for people.
pub fn render(status: &Status, now: SystemTime) -> String {
    use std::fmt::Write;
    let now = unix_ms(now);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nodus {} on node {}, started {}, {}",
        status.version,
        status.node,
        ago(now, status.started_unix_ms),
        if status.ready { "ready" } else { "NOT READY" }
    );
    let _ = writeln!(
        out,
        "\n{:<10} {:<10} {:<52} {:<22} ERRORS",
        "SUBSYSTEM", "STATE", "OBJECTS", "LAST SYNC (TOOK)"
    );
    for s in &status.subsystems {
        let state = match (s.enabled, s.synced) {
            (false, _) => "off",
            (true, true) => "synced",
            (true, false) => "NOT SYNCED",
        };
        let objects = s
            .objects
            .iter()
            .map(|(kind, n)| match n {
                1 => format!("1 {kind}"),
                n => format!("{n} {kind}s"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let last = match (s.last_sync_unix_ms, s.last_sync_duration_ms) {
            (Some(at), Some(ms)) => format!("{} ({ms:.1} ms)", ago(now, at)),
            (Some(at), None) => ago(now, at),
            _ => "-".into(),
        };
        let errors = if s.enabled {
            s.errors.to_string()
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "{:<10} {:<10} {:<52} {:<22} {errors}",
            s.name, state, objects, last
        );
    }
    out.push('\n');
    for s in &status.subsystems {
        if let Some(detail) = &s.detail {
            let _ = writeln!(out, "{}: {detail}", s.name);
        }
        if let (Some(error), Some(at)) = (&s.last_error, s.last_error_unix_ms) {
            let _ = writeln!(out, "{}: last error {}: {error}", s.name, ago(now, at));
        }
    }
    if !status.mesh_peers.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<24} {:<42} {:<16} {:>12} {:>12}",
            "PEER", "ENDPOINT", "HANDSHAKE", "RECEIVED", "SENT"
        );
        for peer in &status.mesh_peers {
            let endpoint = peer.endpoint.map_or_else(|| "-".into(), |e| e.to_string());
            let handshake = peer
                .last_handshake_unix_s
                .map_or_else(|| "never".into(), |at| ago(now, at.saturating_mul(1000)));
            let _ = writeln!(
                out,
                "{:<24} {:<42} {:<16} {:>12} {:>12}",
                peer.node, endpoint, handshake, peer.received_bytes, peer.sent_bytes
            );
        }
    }
    out
}

/// `nodus status`: asks the agent at `addr` and prints its one-screen summary.
pub fn print(addr: SocketAddr) -> anyhow::Result<()> {
    let body = get_status(addr, Duration::from_secs(5))
        .with_context(|| format!("asking nodus at {addr} (is it running? --http-addr)"))?;
    let status: Status =
        serde_json::from_str(&body).with_context(|| format!("{addr}/status is not a status"))?;
    print!("{}", render(&status, SystemTime::now()));
    Ok(())
}

/// The body of `GET /status`, which must answer 200.
fn get_status(addr: SocketAddr, timeout: Duration) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET /status HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head.split_whitespace().nth(1).unwrap_or_default();
    anyhow::ensure!(code == "200", "{addr}/status answered {head:?}: {body}");
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::board::Setup;
    use crate::agent::metrics::Metrics;
    use crate::agent::process::ProcessState;
    use crate::agent::status::status;
    use nodus_mesh::metrics::MeshMetrics;
    use nodus_proxy::metrics::ProxyMetrics;
    use std::sync::Arc;

    #[test]
    fn the_mesh_line_counts_peers_and_shows_a_failure_until_the_next_sync() {
        let metrics = Metrics::default();
        let _ = metrics.status.setup.set(Setup {
            node: "node-1".into(),
            proxy: false,
            egress_only_table: true,
            dns: false,
            mesh: true,
            on_change: None,
        });
        let mesh = Arc::new(MeshMetrics::default());
        metrics.mesh.set(mesh.clone());
        mesh.synced(Duration::from_millis(4), 2, true, 2, 3);
        let text = render(
            &status(&metrics, &ProcessState::default()),
            SystemTime::now(),
        );
        assert!(
            text.contains("mesh       synced     2 peers, 0 recent handshakes, 3 routes"),
            "{text}"
        );
        assert!(text.contains("(4.0 ms)"), "{text}");
        assert!(text.contains("the mesh's egress masquerade"), "{text}");
        std::thread::sleep(Duration::from_millis(2));
        mesh.sync_failed(&"setting the link up: Operation not permitted");
        let text = render(
            &status(&metrics, &ProcessState::default()),
            SystemTime::now(),
        );
        assert!(text.contains("mesh       NOT SYNCED"), "{text}");
        assert!(text.contains("mesh: last error"), "{text}");
        std::thread::sleep(Duration::from_millis(2));
        mesh.synced(Duration::from_millis(1), 0, false, 2, 3);
        assert!(
            render(
                &status(&metrics, &ProcessState::default()),
                SystemTime::now()
            )
            .contains("mesh       synced")
        );
    }

    #[test]
    fn the_screen_names_every_subsystem_and_the_last_error() {
        let metrics = Metrics::default();
        let _ = metrics.status.setup.set(Setup {
            node: "node-1".into(),
            proxy: true,
            egress_only_table: false,
            dns: true,
            mesh: false,
            on_change: None,
        });
        let _ = metrics
            .status
            .dns_addrs
            .set(vec!["127.0.0.1:53".parse().expect("addr")]);
        metrics.status.view.synced(Duration::from_micros(300));
        let proxy = Arc::new(ProxyMetrics::default());
        metrics.proxy.set(proxy.clone());
        proxy.sync_failed("the kernel refused the batch");
        let text = render(
            &status(&metrics, &ProcessState::default()),
            SystemTime::now(),
        );
        assert!(text.contains("on node node-1"), "{text}");
        assert!(text.contains("NOT READY"), "{text}");
        for line in [
            "view       synced",
            "proxy      NOT SYNCED",
            "mesh       off",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        assert!(text.contains("answering on 127.0.0.1:53"), "{text}");
        assert!(
            text.contains("proxy: last error 0.0 s ago: the kernel refused the batch"),
            "{text}"
        );
    }
}
