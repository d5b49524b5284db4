//! The run loop's ticks: one every [`CHECK_PERIOD`], so that the loop also runs when the
//! cluster is quiet (the proxy checks its table on it), and one sooner when a subsystem
//! asks for it ([`nodus_view::Subsystem::wake_at`]: the proxy's UDP conntrack cleanup
//! that syncs less than a second apart left waiting).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::Stream;
use nodus_proxy::subsystem::CHECK_PERIOD;
use tokio::sync::Notify;

use super::watch::WatchItem;

/// Ticks come at least this far apart: a subsystem that asks again and again for a time
/// already past (a bug) costs the loop ten wake-ups a second, not a core.
const MIN_GAP: Duration = Duration::from_millis(100);

/// When the subsystems want the next tick, shared between the loop, which sets it after
/// every batch, and the stream of ticks.
#[derive(Debug, Default)]
pub struct Wakes {
    at: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Wakes {
    /// The subsystems want a tick by `at` (`None`: the periodic one will do).
    pub fn set(&self, at: Option<Instant>) {
        let mut wanted = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        if *wanted != at {
            *wanted = at;
            self.changed.notify_one();
        }
    }

    fn get(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A tick every [`CHECK_PERIOD`] after the one before, or at the time `wakes` holds when
/// that comes first (but never within [`MIN_GAP`] of the last).
pub fn ticks(wakes: Arc<Wakes>) -> impl Stream<Item = WatchItem> + Send + 'static {
    futures::stream::unfold(wakes, |wakes| async move {
        let last = tokio::time::Instant::now();
        let periodic = last + CHECK_PERIOD;
        loop {
            let at = wakes.get().map_or(periodic, |at| {
                tokio::time::Instant::from_std(at).clamp(last + MIN_GAP, periodic)
            });
            tokio::select! {
                () = tokio::time::sleep_until(at) => break,
                () = wakes.changed.notified() => {}
            }
        }
        Some((WatchItem::Tick, wakes))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn is_tick(item: Option<WatchItem>) -> bool {
        matches!(item, Some(WatchItem::Tick))
    }

    /// `after` from now on the runtime's clock (paused here, so not the system's).
    fn in_(after: Duration) -> Instant {
        (tokio::time::Instant::now() + after).into_std()
    }

    /// That `took` is `expected`, to the timer's millisecond.
    fn about(took: Duration, expected: Duration) {
        assert!(
            took >= expected && took < expected + Duration::from_millis(5),
            "{took:?} for {expected:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_tick_comes_every_period_and_sooner_when_asked() {
        let wakes = Arc::new(Wakes::default());
        let mut ticks = Box::pin(ticks(wakes.clone()));
        let start = tokio::time::Instant::now();
        assert!(is_tick(ticks.next().await));
        about(start.elapsed(), CHECK_PERIOD);

        // Asked for in a second, while the stream already waits for the period.
        let waiting = tokio::time::Instant::now();
        let next = tokio::spawn(async move {
            let tick = ticks.next().await;
            (is_tick(tick), ticks)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        wakes.set(Some(in_(Duration::from_secs(1))));
        let (ticked, mut ticks) = next.await.expect("the stream's task");
        assert!(ticked);
        about(waiting.elapsed(), Duration::from_millis(1010));

        // A time already past, asked for and never withdrawn: ticks come MIN_GAP apart.
        wakes.set(Some(in_(Duration::ZERO)));
        let before = tokio::time::Instant::now();
        assert!(is_tick(ticks.next().await));
        assert!(is_tick(ticks.next().await));
        about(before.elapsed(), MIN_GAP * 2);

        // Withdrawn: back to the period.
        wakes.set(None);
        let before = tokio::time::Instant::now();
        assert!(is_tick(ticks.next().await));
        about(before.elapsed(), CHECK_PERIOD);
    }
}
