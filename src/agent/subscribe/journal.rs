//! The numbered batches that subscribers catch up from: names only, never objects.
//!
//! Every batch that changes a service or node gets the next number. The journal keeps the
//! names of the last batches (at most [`KEPT_NAMES`] names), so that a subscriber that was
//! behind, or that reconnects, is sent only what changed since the batch it last
//! finished, read from the view as it is then. What is no longer kept costs it a
//! snapshot. With no subscriber for [`RESUME_WINDOW`], nothing is kept at all: an agent
//! nobody reads from holds no journal.

use nodus_view::{ChangeSet, ServiceName};
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Names the journal keeps at most: at about 100 bytes each, 400 KiB at the worst.
pub const KEPT_NAMES: usize = 4096;
/// How long batches are kept after the last subscriber left, for it to resume.
pub const RESUME_WINDOW: Duration = Duration::from_secs(60);

/// What one numbered batch changed.
#[derive(Debug)]
enum Changed {
    /// Everything may differ (the initial lists, this node's zone, a batch too large to
    /// keep by name): whoever was before it needs a snapshot.
    Everything,
    Names {
        services: Vec<ServiceName>,
        nodes: Vec<String>,
    },
}

impl Changed {
    fn names(&self) -> usize {
        match self {
            Changed::Everything => 0,
            Changed::Names { services, nodes } => services.len() + nodes.len(),
        }
    }
}

/// What a subscriber has to be sent next.
#[derive(Debug, PartialEq)]
pub enum Work {
    /// Nothing: it has every batch, or the view is not complete yet.
    UpToDate,
    /// Everything, as of batch `seq`; it drops what it held first.
    Snapshot { seq: u64 },
    /// What batches after its own up to `seq` changed, each name once.
    Changes {
        seq: u64,
        services: Vec<ServiceName>,
        nodes: Vec<String>,
    },
    /// What it missed is no longer kept.
    Behind,
}

pub struct Journal {
    /// The last batch's number; 0 until the view is complete.
    last: u64,
    /// The batches up to `last`, oldest first, without gaps.
    kept: VecDeque<(u64, Changed)>,
    names: usize,
    subscribers: usize,
    /// When the last subscriber left.
    left: Option<Instant>,
}

impl Journal {
    pub fn new() -> Journal {
        Journal {
            last: 0,
            kept: VecDeque::new(),
            names: 0,
            subscribers: 0,
            left: None,
        }
    }

    /// The last batch's number (0: the view is not complete yet).
    pub fn last(&self) -> u64 {
        self.last
    }

    pub fn attach(&mut self) {
        self.subscribers += 1;
    }

    pub fn detach(&mut self, now: Instant) {
        self.subscribers = self.subscribers.saturating_sub(1);
        if self.subscribers == 0 {
            self.left = Some(now);
        }
    }

    /// Numbers a batch that changed `changes` (or, with `everything`, all of the view)
    /// and returns its number. A batch that changed nothing a subscriber sees is not
    /// numbered.
    pub fn record(&mut self, changes: &ChangeSet, everything: bool, now: Instant) -> u64 {
        if !everything && changes.services.is_empty() && changes.nodes.is_empty() {
            return self.last;
        }
        self.last += 1;
        let read = self.subscribers > 0 || self.left.is_some_and(|left| now - left < RESUME_WINDOW);
        if !read {
            self.kept.clear();
            self.names = 0;
            return self.last;
        }
        let changed = if everything || changes.services.len() + changes.nodes.len() > KEPT_NAMES {
            Changed::Everything
        } else {
            Changed::Names {
                services: changes.services.iter().cloned().collect(),
                nodes: changes.nodes.iter().cloned().collect(),
            }
        };
        self.names += changed.names();
        self.kept.push_back((self.last, changed));
        while self.names > KEPT_NAMES {
            if let Some((_, dropped)) = self.kept.pop_front() {
                self.names -= dropped.names();
            }
        }
        self.last
    }

    /// Where a subscriber that finished batch `seq` of this journal may resume: `seq`
    /// when everything after it is kept, else nowhere (it needs a snapshot).
    pub fn resume_at(&self, seq: u64) -> Option<u64> {
        let kept_from = self.kept.front().map_or(self.last + 1, |(first, _)| *first);
        (seq <= self.last && seq + 1 >= kept_from && seq > 0).then_some(seq)
    }

    /// What a subscriber that finished batch `sent` (`None`: nothing yet) needs next.
    pub fn work(&self, sent: Option<u64>) -> Work {
        let Some(sent) = sent else {
            return if self.last == 0 {
                Work::UpToDate
            } else {
                Work::Snapshot { seq: self.last }
            };
        };
        if sent >= self.last {
            return Work::UpToDate;
        }
        match self.kept.front() {
            Some((first, _)) if *first <= sent + 1 => {}
            _ => return Work::Behind,
        }
        let mut services = BTreeSet::new();
        let mut nodes = BTreeSet::new();
        for (_, changed) in self.kept.iter().filter(|(seq, _)| *seq > sent) {
            match changed {
                Changed::Everything => return Work::Snapshot { seq: self.last },
                Changed::Names {
                    services: s,
                    nodes: n,
                } => {
                    services.extend(s.iter());
                    nodes.extend(n.iter());
                }
            }
        }
        Work::Changes {
            seq: self.last,
            services: services.into_iter().cloned().collect(),
            nodes: nodes.into_iter().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> ServiceName {
        ServiceName {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn changes(services: &[&str]) -> ChangeSet {
        ChangeSet {
            services: services.iter().map(|name| service(name)).collect(),
            ..ChangeSet::default()
        }
    }

    #[test]
    fn a_subscriber_gets_a_snapshot_then_each_name_once() {
        let now = Instant::now();
        let mut journal = Journal::new();
        assert_eq!(
            journal.work(None),
            Work::UpToDate,
            "the view is not complete yet"
        );
        journal.attach();
        assert_eq!(journal.record(&ChangeSet::default(), true, now), 1);
        assert_eq!(journal.work(None), Work::Snapshot { seq: 1 });
        assert_eq!(journal.work(Some(1)), Work::UpToDate);
        journal.record(&changes(&["a", "b"]), false, now);
        journal.record(&changes(&["b", "c"]), false, now);
        assert_eq!(
            journal.record(&ChangeSet::default(), false, now),
            3,
            "a batch that changes nothing is not numbered"
        );
        assert_eq!(
            journal.work(Some(1)),
            Work::Changes {
                seq: 3,
                services: vec![service("a"), service("b"), service("c")],
                nodes: vec![],
            }
        );
        assert_eq!(journal.resume_at(2), Some(2));
        assert_eq!(journal.resume_at(4), None, "a number not given yet");
        // The initial batch is kept as "everything": resuming before it is a snapshot.
        assert_eq!(journal.work(Some(0)), Work::Snapshot { seq: 3 });
        journal.record(&ChangeSet::default(), true, now);
        assert_eq!(journal.work(Some(3)), Work::Snapshot { seq: 4 });
    }

    #[test]
    fn the_journal_is_bounded_and_kept_only_while_read() {
        let now = Instant::now();
        let mut journal = Journal::new();
        journal.attach();
        journal.record(&ChangeSet::default(), true, now);
        let names: Vec<String> = (0..KEPT_NAMES).map(|i| format!("s{i}")).collect();
        for chunk in names.chunks(1000) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            journal.record(&changes(&chunk), false, now);
        }
        journal.record(&changes(&["late"]), false, now);
        assert!(journal.names <= KEPT_NAMES);
        assert_eq!(
            journal.work(Some(1)),
            Work::Behind,
            "the oldest batch is gone"
        );
        let seq = journal.last();
        assert!(matches!(journal.work(Some(seq - 1)), Work::Changes { .. }));
        // Too large to keep by name: anyone before it needs a snapshot.
        let huge: Vec<&str> = names.iter().map(String::as_str).chain(["x"]).collect();
        journal.record(&changes(&huge), false, now);
        assert_eq!(journal.work(Some(seq)), Work::Snapshot { seq: seq + 1 });
        // The last subscriber leaves: kept for a while, then nothing is.
        journal.detach(now);
        journal.record(&changes(&["a"]), false, now + RESUME_WINDOW / 2);
        assert!(journal.resume_at(seq + 1).is_some());
        journal.record(&changes(&["b"]), false, now + RESUME_WINDOW);
        assert!(journal.kept.is_empty() && journal.names == 0);
        assert_eq!(journal.resume_at(seq + 2), None);
    }
}
