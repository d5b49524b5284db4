//! The view as one process shares it: a [`ViewWriter`] that only the watch feed holds,
//! and [`ViewReader`]s for everything that answers from it (DNS queries, health checks,
//! the mesh, external backends).
//!
//! Completeness (every watch delivered its initial list) lives here too, beside the
//! view, so that no reader keeps a flag of its own, as kube-rs keeps readiness on its
//! reflector's store; so does staleness: a view restored from disk is whole but old until
//! the lists replace it.

use crate::View;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

struct Shared {
    view: RwLock<View>,
    complete: AtomicBool,
    /// The view was restored from disk and the lists have not completed since.
    stale: AtomicBool,
}

impl Shared {
    /// A panic while the lock was held cannot leave the view half applied in a way
    /// readers must avoid (each update is applied whole), so a poisoned lock is used as
    /// it is.
    fn read(&self) -> RwLockReadGuard<'_, View> {
        self.view
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }
}

/// The one writer of the view. Not `Clone`: whoever holds it is the feed.
pub struct ViewWriter(Arc<Shared>);

/// A reader of the view, as many as needed.
#[derive(Clone)]
pub struct ViewReader(Arc<Shared>);

impl ViewWriter {
    pub fn new(view: View) -> ViewWriter {
        ViewWriter(Arc::new(Shared {
            view: RwLock::new(view),
            complete: AtomicBool::new(false),
            stale: AtomicBool::new(false),
        }))
    }

    pub fn reader(&self) -> ViewReader {
        ViewReader(self.0.clone())
    }

    pub fn read(&self) -> RwLockReadGuard<'_, View> {
        self.0.read()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, View> {
        self.0
            .view
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every watched kind has delivered its initial list. A later relist keeps the view
    /// complete: it replaces objects without emptying the view first.
    pub fn mark_complete(&self) {
        self.0.complete.store(true, Ordering::Release);
        self.0.stale.store(false, Ordering::Release);
    }

    /// The view was restored from disk ([`View::restore`]): whole, but stale until the
    /// lists complete.
    pub fn mark_restored(&self) {
        self.0.stale.store(true, Ordering::Release);
    }

    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }

    pub fn is_stale(&self) -> bool {
        self.0.is_stale()
    }
}

impl ViewReader {
    pub fn read(&self) -> RwLockReadGuard<'_, View> {
        self.0.read()
    }

    /// Whether the view holds every watch's initial list; before that, an answer from it
    /// may be missing objects that exist.
    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }

    /// Whether the view holds a whole cluster: the lists, or the last whole view restored
    /// from disk while the lists are not in (stale, but what an answer may rest on).
    pub fn is_whole(&self) -> bool {
        self.0.is_complete() || self.0.is_stale()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_the_writers_view_and_its_completeness() {
        let writer = ViewWriter::new(View::new("node-a"));
        let reader = writer.reader();
        assert!(!reader.is_complete());
        assert_eq!(reader.read().node_name(), "node-a");
        writer.mark_complete();
        assert!(reader.clone().is_complete());
    }

    #[test]
    fn a_restored_view_is_whole_but_stale_until_the_lists_complete() {
        let writer = ViewWriter::new(View::new("node-a"));
        let reader = writer.reader();
        writer.mark_restored();
        assert!(reader.is_whole() && !reader.is_complete() && writer.is_stale());
        writer.mark_complete();
        assert!(reader.is_whole() && reader.is_complete() && !writer.is_stale());
    }

    #[test]
    fn a_panic_while_writing_leaves_the_view_readable() {
        let writer = ViewWriter::new(View::new("node-a"));
        let reader = writer.reader();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = writer.write();
            panic!("while holding the lock");
        }));
        assert_eq!(reader.read().node_name(), "node-a");
    }
}
