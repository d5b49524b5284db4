//! `nodus view`: the resolved node view for people and scripts.
//!
//! Without `--watch` it prints the whole view once the initial lists are in. With
//! `--watch` it prints one JSON line per service or node: each one once the view is
//! complete, then each one again whenever a batch touches it (`"object": null` once it is
//! gone). Any program that reads JSON lines can be a specialised backend.

use crate::agent::feed::{complete_view, follow_cluster};
use crate::cli::ViewArgs;
use nodus_view::output::{everything, resolve_view, write_change_lines};
use std::io::Write;
use std::ops::ControlFlow;

pub async fn view(args: ViewArgs) -> anyhow::Result<()> {
    if !args.watch {
        let feed = complete_view(&args.cluster).await?;
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &resolve_view(&feed.read()))?;
        writeln!(out)?;
        return Ok(());
    }
    let (mut feed, items) = follow_cluster(&args.cluster).await?;
    let mut result = Ok(());
    let stdout = std::io::stdout();
    feed.drive(items, |feed, applied| {
        if !feed.is_complete() {
            return ControlFlow::Continue(());
        }
        let mut out = stdout.lock();
        let view = feed.read();
        let printed = if applied.initial_sync {
            write_change_lines(&view, &everything(&view), &mut out)
        } else {
            write_change_lines(&view, &applied.changes, &mut out)
        };
        match printed {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => {
                // A closed pipe (`nodus view --watch | head`) ends the stream quietly.
                if error.kind() != std::io::ErrorKind::BrokenPipe {
                    result = Err(error.into());
                }
                ControlFlow::Break(())
            }
        }
    })
    .await;
    result
}
