//! The mesh inside `nodus run` ([`start`]): a task that re-plans from the view after every batch that
//! the watch loop applied, syncs the kernel, polls the device for the metrics (and to
//! repair outside changes), and publishes our annotations when the Node lacks them. The
//! run loop drives it through [`MeshSubsystem`].

use crate::Error;
use crate::apply::{Mesh, Poll};
use crate::config::Config;
use crate::metrics::MeshMetrics;
use crate::plan::{self, needs_publish, own_annotations};
use crate::publish::publish;
use nodus_view::config::Cluster;
use nodus_view::{Applied, Subsystem, View, ViewReader};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the device is read back and the plan re-applied without a view change.
pub const POLL_PERIOD: Duration = Duration::from_secs(10);

type Annotations = BTreeMap<&'static str, String>;

/// The mesh's front door: opens the WireGuard device as `config` says (adopting a
/// running one) and starts the task that keeps it in step with `view`.
/// `policy_socket`: the isolation gate nodus-cni waits on, written in the conflist.
pub async fn start(
    config: &Config,
    cluster: &Cluster,
    policy_socket: Option<&Path>,
    view: ViewReader,
    client: kube::Client,
) -> Result<MeshSubsystem, Error> {
    let metrics = Arc::new(MeshMetrics::default());
    let mesh = Mesh::start(config.settings(cluster, policy_socket), metrics.clone()).await?;
    Ok(MeshSubsystem::spawn(mesh, view, client, metrics))
}

/// The mesh as the run loop sees it: a poke to its task after every batch that touched a
/// Node. Dropping it ends the task.
pub struct MeshSubsystem {
    changed: watch::Sender<()>,
    task: JoinHandle<()>,
    /// The device is the embedded one, which the kernel deletes when nodus exits.
    pub device_ends_with_process: bool,
    pub metrics: Arc<MeshMetrics>,
}

impl MeshSubsystem {
    /// Starts the mesh's task (inside a tokio runtime). It programs nothing before the
    /// first batch after the view is complete.
    fn spawn(
        mesh: Mesh,
        view: ViewReader,
        client: kube::Client,
        metrics: Arc<MeshMetrics>,
    ) -> MeshSubsystem {
        let device_ends_with_process = mesh.device_ends_with_process();
        let (changed, view_changed) = watch::channel(());
        let task = tokio::spawn(follow(mesh, view, client, view_changed));
        MeshSubsystem {
            changed,
            task,
            device_ends_with_process,
            metrics,
        }
    }
}

impl Subsystem for MeshSubsystem {
    fn name(&self) -> &'static str {
        "mesh"
    }

    fn after_batch(&mut self, _view: &View, applied: &Applied) {
        if applied.initial_sync || !applied.changes.nodes.is_empty() || applied.changes.this_node {
            self.changed.send_replace(());
        }
    }

    /// The task runs until this is dropped: if it ended, it panicked.
    fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }
}

/// Runs until `view_changed`'s sender goes. Nothing is programmed before its first signal,
/// which the watch loop sends once the view is complete.
async fn follow(
    mut mesh: Mesh,
    view: ViewReader,
    client: kube::Client,
    mut view_changed: watch::Receiver<()>,
) {
    let mut poll = tokio::time::interval(POLL_PERIOD);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut complete = false;
    let mut publishing: Option<(JoinHandle<()>, Annotations)> = None;
    let mut published: Option<Annotations> = None;
    // The last plan: its claims are the established ones. At start, what the device
    // holds (the process before granted it).
    let mut last = plan::Desired::adopted(mesh.held_peers());
    loop {
        mesh.metrics.heartbeat.beat();
        tokio::select! {
            changed = view_changed.changed() => {
                if changed.is_err() {
                    return;
                }
                complete = true;
            }
            _ = poll.tick() => {
                match mesh.poll().await {
                    Ok(Poll::Read) => {}
                    Ok(Poll::Recreated) => {
                        let error = format!(
                            "the device {} had vanished; created it again",
                            mesh.interface()
                        );
                        mesh.metrics.sync_failed(&error);
                        tracing::warn!("{error}");
                    }
                    // A sync against a device that cannot be read would report success
                    // blindly whenever no peer changed.
                    Err(error) => {
                        mesh.metrics.sync_failed(&error);
                        tracing::error!(%error, "reading the mesh device failed; retrying at the next poll");
                        continue;
                    }
                }
            }
        }
        if !complete {
            continue;
        }
        let settings = mesh.plan_settings();
        let (desired, wanted, node, missing) = {
            let view = view.read();
            let desired = plan::desired(&view, &settings, mesh.public_key(), &last);
            let wanted = own_annotations(
                mesh.public_key(),
                settings.listen_port,
                desired.published_endpoint,
                plan::peer_endpoints_seen(&desired, mesh.learned()),
                view.this_node(),
            );
            let missing = needs_publish(view.this_node(), &wanted);
            (desired, wanted, view.node_name().to_string(), missing)
        };
        if desired.skipped != last.skipped {
            for (node, reason) in &desired.skipped {
                match *reason {
                    // A node that has just joined publishes these a moment later.
                    plan::NO_KEY | plan::NO_POD_CIDRS => {
                        tracing::info!(node = %node, reason, "node left out of the mesh")
                    }
                    _ => {
                        tracing::warn!(node = %node, reason, "node left out of the mesh: what it claims is refused")
                    }
                }
            }
        }
        match mesh.sync(&desired).await {
            Ok(report) if report.changed() => {
                tracing::info!(?report, peers = desired.peers.len(), "mesh synced");
            }
            Ok(_) => {}
            Err(error) => {
                mesh.metrics.sync_failed(&error);
                tracing::error!(%error, "mesh sync failed; retrying at the next poll");
            }
        }
        last = desired;
        if let Some((task, annotations)) = publishing.take_if(|(task, _)| task.is_finished()) {
            drop(task);
            published = Some(annotations);
        }
        if !missing {
            published = None;
        }
        // Published but not yet back through the watch: wait for it rather than patch again.
        if missing && publishing.is_none() && published.as_ref() != Some(&wanted) {
            let task = tokio::spawn(publish(client.clone(), node, wanted.clone()));
            publishing = Some((task, wanted));
        }
    }
}
