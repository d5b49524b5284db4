//! Sending one subscriber its work a chunk at a time: each chunk is rendered under a
//! short read of the view, and written with the view released, so that a subscriber's
//! socket never holds the feed back.

use super::journal::Work;
use super::protocol::Control;
use nodus_view::output::{named_service_line, node_line, service_line};
use nodus_view::{ServiceName, ServiceRef, Sym, View};

/// The rest of one snapshot or one catch-up.
pub struct Walk {
    /// The batch it brings its subscriber up to.
    seq: u64,
    names: Names,
    /// The next name's place in `names`.
    next: usize,
}

/// What a walk still has to send: a snapshot holds the view's references (8 bytes a
/// service), a catch-up the names the journal gave it.
enum Names {
    Snapshot {
        services: Vec<ServiceRef>,
        nodes: Vec<Sym>,
    },
    Changes {
        services: Vec<ServiceName>,
        nodes: Vec<String>,
    },
}

/// One object of a walk.
enum Item<'a> {
    ServiceAt(ServiceRef),
    Service(&'a ServiceName),
    NodeAt(Sym),
    Node(&'a str),
}

impl Names {
    fn get(&self, at: usize) -> Option<Item<'_>> {
        match self {
            Names::Snapshot { services, nodes } => match services.get(at) {
                Some(service) => Some(Item::ServiceAt(*service)),
                None => nodes
                    .get(at - services.len())
                    .map(|node| Item::NodeAt(*node)),
            },
            Names::Changes { services, nodes } => match services.get(at) {
                Some(service) => Some(Item::Service(service)),
                None => nodes.get(at - services.len()).map(|node| Item::Node(node)),
            },
        }
    }
}

impl Walk {
    /// The walk for `work` (none for [`Work::UpToDate`] and [`Work::Behind`]). A snapshot
    /// takes the view's references now.
    pub fn start(work: Work, view: &View) -> Option<Walk> {
        let (seq, names) = match work {
            Work::UpToDate | Work::Behind => return None,
            Work::Snapshot { seq } => (
                seq,
                Names::Snapshot {
                    services: view.service_refs(),
                    nodes: view.node_refs(),
                },
            ),
            Work::Changes {
                seq,
                services,
                nodes,
            } => (seq, Names::Changes { services, nodes }),
        };
        Some(Walk {
            seq,
            names,
            next: 0,
        })
    }

    /// The line a subscriber is sent before the walk's: a snapshot's announcement.
    pub fn header(&self, epoch: &str, view: &View) -> Option<Control> {
        matches!(self.names, Names::Snapshot { .. }).then(|| Control::Snapshot {
            epoch: epoch.to_string(),
            seq: self.seq,
            node: view.node_name().to_string(),
        })
    }

    /// The batch the walk brings its subscriber up to.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Appends lines to `out` until it holds `budget` bytes or the walk is done. Returns
    /// the number of objects written, and whether it is done. An object a snapshot
    /// referred to and the view no longer holds is left out: its deletion is a later
    /// batch's.
    pub fn render(&mut self, view: &View, out: &mut Vec<u8>, budget: usize) -> (u64, bool) {
        let node = view.node_context();
        let seq = self.seq;
        let mut written = 0;
        while out.len() < budget {
            let Some(item) = self.names.get(self.next) else {
                return (written, true);
            };
            self.next += 1;
            // Serialising the view's own types into a Vec cannot fail.
            let wrote = match item {
                Item::ServiceAt(at) => view
                    .service_at(at)
                    .map(|s| service_line(view.strings(), &node, &s, seq).write(out)),
                Item::Service(name) => Some(
                    named_service_line(view, &node, &name.namespace, &name.name, seq).write(out),
                ),
                Item::NodeAt(at) => view
                    .node_at(at)
                    .map(|(name, _)| node_line(view, name, seq).write(out)),
                Item::Node(name) => Some(node_line(view, name, seq).write(out)),
            };
            if let Some(Ok(())) = wrote {
                written += 1;
            }
        }
        (written, false)
    }
}
