//! `/livez` and `/healthz`, as kube-proxy serves them and operators wire them.
//!
//! - `/livez`, for the liveness probe: every loop of the agent goes round. A stuck loop is
//!   what a restart can cure; a failing API or device is not, and does not fail it.
//! - `/healthz`, for load balancers and people: live, the proxy owes no sync for longer
//!   than kube-proxy's health timeout, and this Node is not on its way out (being deleted,
//!   or tainted by the cluster autoscaler), so that load balancers drain it first.

use crate::agent::metrics::Metrics;
use crate::agent::process::ProcessState;
use nodus_proxy::metrics::HEALTH_TIMEOUT;
use std::time::Duration;

/// A loop that has not gone round for this long is stuck: the run loop ticks every 10 s,
/// the mesh polls every 10 s and its device calls give up after 5 s.
pub const STALL: Duration = Duration::from_secs(60);

/// Why the agent is not live, if it is not.
pub fn livez(metrics: &Metrics) -> Result<(), String> {
    let stalled = |what: &str, age: Duration| {
        if age > STALL {
            Err(format!(
                "{what} has not gone round for {} s (over {} s)",
                age.as_secs(),
                STALL.as_secs()
            ))
        } else {
            Ok(())
        }
    };
    stalled("the run loop", metrics.run_loop.age())?;
    if let Some(mesh) = metrics.mesh.get() {
        stalled("the mesh's loop", mesh.heartbeat.age())?;
    }
    Ok(())
}

/// Why this node should get no traffic from load balancers, if it should not.
pub fn healthz(metrics: &Metrics, process: &ProcessState) -> Result<(), String> {
    livez(metrics)?;
    if let Some(proxy) = metrics.proxy.get()
        && !proxy.is_healthy()
    {
        return Err(format!(
            "the proxy has owed a sync for over {} s: its rules may be stale",
            HEALTH_TIMEOUT.as_secs()
        ));
    }
    if process.is_node_leaving() {
        return Err(format!(
            "this Node is being deleted or is tainted {}",
            nodus_view::wire::TAINT_TO_BE_DELETED
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_proxy::metrics::ProxyMetrics;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_leaving_node_is_unhealthy_but_live() {
        let (metrics, process) = (Metrics::default(), ProcessState::default());
        assert_eq!(healthz(&metrics, &process), Ok(()));
        process.set_node_leaving(true);
        let error = healthz(&metrics, &process).expect_err("leaving");
        assert!(error.contains("ToBeDeletedByClusterAutoscaler"), "{error}");
        assert_eq!(livez(&metrics), Ok(()));
    }

    #[test]
    fn a_sync_owed_past_the_timeout_is_unhealthy_but_live() {
        let metrics = Metrics::default();
        let proxy = Arc::new(ProxyMetrics::default());
        metrics.proxy.set(proxy.clone());
        proxy.sync_failed("refused");
        assert!(proxy.sync_owed_for().is_some());
        // Owed for a moment only: kube-proxy waits for its timeout too.
        assert_eq!(healthz(&metrics, &ProcessState::default()), Ok(()));

        let proxy = Arc::new(ProxyMetrics::default());
        let metrics = Metrics::default();
        metrics.proxy.set(proxy.clone());
        let long_ago = Instant::now()
            .checked_sub(HEALTH_TIMEOUT + Duration::from_secs(1))
            .expect("the machine has been up for a minute");
        proxy.owe_sync_since(long_ago);
        let error = healthz(&metrics, &ProcessState::default()).expect_err("stale");
        assert!(error.contains("owed a sync"), "{error}");
        assert_eq!(livez(&metrics), Ok(()));
    }
}
