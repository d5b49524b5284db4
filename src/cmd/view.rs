//! `nodus view`: the resolved node view for people and scripts.
//!
//! Without `--watch` it prints the whole view once the initial lists are in. With
//! `--watch` it prints one JSON line per service or node: each one once the view is
//! complete, then each one again whenever a batch touches it (`"object": null` once it is
//! gone). Any program that reads JSON lines can be a specialised backend.
//!
//! `--watch` follows the running agent's view through its subscription socket when one
//! answers there, so that it adds no watch of its own to the API server, and watches the
//! API server itself otherwise (`--source` chooses).

use crate::agent::feed::{complete_view, follow_cluster};
use crate::agent::subscribe::protocol::{AnyLine, Hello, Since};
use crate::cli::{ViewArgs, ViewSource};
use crate::config::Config;
use anyhow::Context as _;
use nodus_view::output::{ChangeLine, everything, resolve_view, write_change_lines};
use std::collections::HashSet;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

pub async fn view(args: ViewArgs) -> anyhow::Result<()> {
    if !args.watch {
        let feed = complete_view(&args.cluster).await?;
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &resolve_view(&feed.read()))?;
        writeln!(out)?;
        return Ok(());
    }
    if args.source != ViewSource::Api {
        let config = Config::load_or_default(args.cluster.config.as_deref())?;
        let state_dir = args.state_dir.as_deref().or(config.state_dir.as_deref());
        let socket = args
            .socket
            .clone()
            .or_else(|| {
                config
                    .subscribe
                    .socket_path(state_dir, &args.cluster.node_name)
            })
            .context("no subscription socket: pass --socket, or --state-dir and --node-name")?;
        match UnixStream::connect(&socket).await {
            Ok(stream) => return follow_agent(&socket, stream).await,
            Err(error) if args.source == ViewSource::Agent => {
                return Err(error)
                    .with_context(|| format!("subscribing to the agent at {}", socket.display()));
            }
            Err(error) => {
                tracing::info!(socket = %socket.display(), %error, "no agent answers; watching the API server")
            }
        }
    }
    follow_api(&args).await
}

/// Prints the view from a watch of the API server of its own.
async fn follow_api(args: &ViewArgs) -> anyhow::Result<()> {
    let (mut feed, items) = follow_cluster(&args.cluster).await?;
    let mut result = Ok(());
    let mut seq = 0;
    let stdout = std::io::stdout();
    feed.drive(items, |feed, applied| {
        if !feed.is_complete() || (!applied.initial_sync && applied.changes.is_empty()) {
            return ControlFlow::Continue(());
        }
        seq += 1;
        let mut out = stdout.lock();
        let view = feed.read();
        let printed = if applied.initial_sync {
            write_change_lines(&view, &everything(&view), seq, &mut out)
        } else {
            write_change_lines(&view, &applied.changes, seq, &mut out)
        };
        match printed {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => {
                // A closed pipe (`nodus view --watch | head`) ends the stream quietly.
                if !is_closed_pipe(&error) {
                    result = Err(error.into());
                }
                ControlFlow::Break(())
            }
        }
    })
    .await;
    result
}

/// The reader of stdout went (`nodus view --watch | head`): the stream ends quietly.
fn is_closed_pipe(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::BrokenPipe
}

/// A service or node by kind and name.
type Named = (String, String, String);

/// What the agent's lines have told so far.
#[derive(Default)]
struct Followed {
    /// Where to resume after a reconnection.
    since: Option<Since>,
    /// What was printed with an object, and is not gone since.
    present: HashSet<Named>,
    /// During a snapshot after a reconnection: what it has sent so far.
    resync: Option<HashSet<Named>>,
}

impl Followed {
    /// Takes in one line from the agent and prints what `nodus view --watch` prints: the
    /// object lines as they come, and after a snapshot that replaced an earlier one, a
    /// `null` line for each object that went meanwhile.
    fn line(&mut self, text: &str, out: &mut impl Write) -> anyhow::Result<()> {
        let line: AnyLine = serde_json::from_str(text).context("a line from the agent")?;
        match line.kind.as_str() {
            "Snapshot" => {
                self.since = Some(Since {
                    epoch: line.epoch,
                    seq: line.seq,
                });
                self.resync = Some(HashSet::new());
            }
            "Synced" => {
                if let Some(since) = &mut self.since {
                    since.seq = line.seq;
                }
                if let Some(seen) = self.resync.take() {
                    for (kind, namespace, name) in self.present.difference(&seen) {
                        let gone = ChangeLine {
                            seq: line.seq,
                            kind: if kind == "Node" { "Node" } else { "Service" },
                            namespace,
                            name,
                            object: None,
                        };
                        gone.write(out)?;
                    }
                    self.present = seen;
                }
                out.flush()?;
            }
            "Error" => tracing::warn!(reason = %line.reason, "the agent ends the subscription"),
            _ => {
                out.write_all(text.as_bytes())?;
                out.write_all(b"\n")?;
                let named = (line.kind, line.namespace, line.name);
                match (&mut self.resync, line.object.is_some()) {
                    (Some(seen), true) => {
                        seen.insert(named);
                    }
                    (None, true) => {
                        self.present.insert(named);
                    }
                    (_, false) => {
                        self.present.remove(&named);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Prints the agent's view from its subscription socket, reconnecting (and resuming where
/// it left) whenever the agent closes it, as it does when it restarts.
async fn follow_agent(socket: &Path, first: UnixStream) -> anyhow::Result<()> {
    let mut followed = Followed::default();
    let mut stream = Some(first);
    let mut backoff = Duration::from_millis(250);
    loop {
        let connection = match stream.take() {
            Some(connection) => Ok(connection),
            None => UnixStream::connect(socket).await,
        };
        let ended = match connection {
            Ok(connection) => subscription(connection, &mut followed).await,
            Err(error) => Err(error.into()),
        };
        match ended {
            Ok(()) => tracing::warn!("the agent closed the subscription; reconnecting"),
            Err(error) if error.downcast_ref().is_some_and(is_closed_pipe) => return Ok(()),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), retry_in = ?backoff, "following the agent")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection: the hello, then every line until the agent closes it.
async fn subscription(stream: UnixStream, followed: &mut Followed) -> anyhow::Result<()> {
    let (reading, mut writing) = stream.into_split();
    let hello = Hello {
        since: followed.since.clone(),
    };
    let mut line = serde_json::to_vec(&hello)?;
    line.push(b'\n');
    writing
        .write_all(&line)
        .await
        .context("sending the hello")?;
    let mut lines = BufReader::new(reading).lines();
    let stdout = std::io::stdout();
    while let Some(text) = lines.next_line().await.context("reading from the agent")? {
        followed.line(&text, &mut stdout.lock())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(followed: &mut Followed, lines: &[&str]) -> String {
        let mut out = Vec::new();
        for line in lines {
            followed.line(line, &mut out).expect("a line");
        }
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn a_new_snapshot_prints_what_went_while_disconnected() {
        let mut followed = Followed::default();
        let a = r#"{"seq":1,"kind":"Service","namespace":"ns","name":"a","object":{}}"#;
        let b = r#"{"seq":1,"kind":"Service","namespace":"ns","name":"b","object":{}}"#;
        let first = feed(
            &mut followed,
            &[
                r#"{"kind":"Snapshot","epoch":"e1","seq":1,"node":"n"}"#,
                a,
                b,
                r#"{"kind":"Synced","seq":1}"#,
            ],
        );
        assert_eq!(first, format!("{a}\n{b}\n"), "object lines as they come");
        assert_eq!(
            followed.since,
            Some(Since {
                epoch: "e1".into(),
                seq: 1
            })
        );
        // The agent restarted: its snapshot has only `a`; `b` went meanwhile.
        let a7 = a.replace("\"seq\":1", "\"seq\":7");
        let second = feed(
            &mut followed,
            &[
                r#"{"kind":"Snapshot","epoch":"e2","seq":7,"node":"n"}"#,
                &a7,
                r#"{"kind":"Synced","seq":7}"#,
            ],
        );
        assert_eq!(
            second,
            format!(
                "{a7}\n{}\n",
                r#"{"seq":7,"kind":"Service","namespace":"ns","name":"b","object":null}"#
            )
        );
        // A deletion in a resumed stream is printed as it comes, and forgotten.
        let gone = r#"{"seq":8,"kind":"Service","namespace":"ns","name":"a","object":null}"#;
        feed(&mut followed, &[gone, r#"{"kind":"Synced","seq":8}"#]);
        assert!(followed.present.is_empty());
        assert_eq!(followed.since.as_ref().map(|s| s.seq), Some(8));
    }
}
