//! The full sync: the whole view into the `nodus` table, adopting what is there.
//!
//! A restart must not drop traffic, so an existing table is never deleted:
//!
//! 1. The skeleton is refreshed in one transaction (objects created if missing, its
//!    chains flushed and rewritten). The shared maps keep the previous run's elements,
//!    and the chains those point at stay, so services keep working meanwhile. Only if
//!    the kernel refuses that (a set or base chain defined differently by another
//!    version) is the table recreated.
//! 2. The shared maps' elements are read once into a snapshot of keys, and the dispatch
//!    rules' key blocks ([`crate::plan::EndpointKeys::adopt`]), so that each chain gets its
//!    block back. Services are then programmed in transactions of about
//!    [`super::full_sync_batch_messages`] messages, each creating its chains before the elements
//!    that name them. A chain whose rules are in place (as many, the first carrying the
//!    plan's digest: [`ChainPlan::is_in_place`]) is not written again, nor is an element
//!    already present with the same data; one with other data is deleted and re-added
//!    within the same transaction. So an adoption after a restart sends nothing that is in
//!    place, and its commits, which write no rule, spare the kernel a validation of the
//!    whole table each. A table just created gets each service's chains and rules first,
//!    then its endpoint map elements, and last its elements in the skeleton's shared
//!    sets, which make it reachable, in a few commits at the end
//!    ([`FullSync::enter_services`]).
//! 3. What the previous run left and nobody claimed is removed: map elements first, then
//!    chains are flushed, then chains and sets deleted, each step in its own bounded
//!    transactions, so no map or rule ever points at a missing chain.
//!
//! Two Services with one ExternalIP or LB IP and port never get here: the planner leaves
//! the contested address to the older one. A key that still collides (two Services with
//! one ClusterIP, which the API server prevents) goes to the first in the view's order,
//! and the second is reported as refused. Shared elements (hairpin pairs, which carry no
//! data) are no conflict: every service that wants one claims it. A transaction the
//! kernel refuses is retried service by service, so one bad service does not block the
//! others.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use hashbrown::HashTable;

use nodus_view::ServiceName;
use nodus_view::model::Family;
use tracing::{error, warn};

use super::{
    Error, Proxy, Record, RefusedService, SyncReport, UdpCheck, full_sync_batch_messages,
    service_key,
};
use crate::nft::{self, Element, ElementData, ListedData, ListedElement, Table, Tuple, Value};
use crate::plan::{
    ChainPlan, ElementPlan, EndpointKeys, PlanBatch, Planner, ServicePlan, SharedKind, SharedSet,
    Skeleton, TABLE,
};

/// The shared maps' elements during a full sync, by [`slot_id`] of set and key: those a
/// previous run left, with a hash of their data (a verdict names a chain; kept whole,
/// 20,000 of them were a few MiB of the sync's peak), and how many services of this sync
/// claim each key (one, or several for a shared element). The key itself is read again
/// from the table for the few leftovers to delete, rather than kept for every element.
#[derive(Debug, Default)]
struct Slots {
    /// Sorted by id: 16 bytes an element, its claims counted beside.
    existing: Vec<(u64, u64)>,
    existing_claims: Vec<u32>,
    /// Claims on keys the table did not hold, found by the id, which is a hash already.
    new_claims: HashTable<(u64, u32)>,
}

impl Slots {
    fn of(mut existing: Vec<(u64, u64)>) -> Slots {
        existing.sort_unstable();
        existing.shrink_to_fit();
        Slots {
            existing_claims: vec![0; existing.len()],
            existing,
            new_claims: HashTable::new(),
        }
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.existing
            .binary_search_by_key(&id, |(slot, _)| *slot)
            .ok()
    }

    /// A hash of the data of the table's element `id`, if it held one.
    fn existing_data(&self, id: u64) -> Option<u64> {
        self.position(id).map(|at| self.existing[at].1)
    }

    fn claims_mut(&mut self, id: u64) -> &mut u32 {
        match self.position(id) {
            Some(at) => &mut self.existing_claims[at],
            None => {
                let entry = self
                    .new_claims
                    .entry(id, |(claimed, _)| *claimed == id, |(claimed, _)| *claimed)
                    .or_insert((id, 0));
                &mut entry.into_mut().1
            }
        }
    }

    fn claim(&mut self, id: u64) {
        *self.claims_mut(id) += 1;
    }

    fn unclaim(&mut self, id: u64) {
        let claims = self.claims_mut(id);
        *claims = claims.saturating_sub(1);
    }

    /// Whether a service of this sync wants the element `id`.
    fn claimed(&self, id: u64) -> bool {
        match self.position(id) {
            Some(at) => self.existing_claims[at] > 0,
            None => self
                .new_claims
                .find(id, |(claimed, _)| *claimed == id)
                .is_some_and(|(_, claims)| *claims > 0),
        }
    }

    /// Whether the table held the element `id` and nobody claimed it: a leftover.
    fn is_leftover(&self, id: u64) -> bool {
        self.position(id)
            .is_some_and(|at| self.existing_claims[at] == 0)
    }

    fn has_leftovers(&self) -> bool {
        self.existing_claims.contains(&0)
    }
}

/// The endpoint map elements a previous run left, and which of them this sync claimed.
/// Keys come in runs (a chain's block), so they are kept as runs, each element as a 32-bit
/// hash of its data (as a footprint keeps it: a collision leaves one element whose
/// endpoint changed during the restart in place, 1 in 4 billion): 5 bytes an element, and
/// at 100,000 endpoints or more this is still the sync's largest structure.
#[derive(Debug, Default)]
struct EndpointElements {
    /// Per run of consecutive keys, in key order: its first key, and the index in `data`
    /// of its first element.
    runs: Vec<(u32, u32)>,
    /// Per element, in key order: a hash of its data, truncated.
    data: Vec<u32>,
    claimed: Vec<bool>,
}

impl EndpointElements {
    /// The elements of one map, as listed (key, data hash), in any order.
    fn of(mut listed: Vec<(u32, u64)>) -> EndpointElements {
        listed.sort_unstable();
        listed.dedup_by_key(|(key, _)| *key);
        let mut runs: Vec<(u32, u32)> = Vec::new();
        let mut previous: Option<u32> = None;
        for (index, (key, _)) in listed.iter().enumerate() {
            if previous.and_then(|p| p.checked_add(1)) != Some(*key) {
                runs.push((*key, u32::try_from(index).unwrap_or(u32::MAX)));
            }
            previous = Some(*key);
        }
        runs.shrink_to_fit();
        // Not `collect()` from `listed`: that would keep its allocation, twice the size.
        let mut data = Vec::with_capacity(listed.len());
        data.extend(listed.iter().map(|(_, data)| *data as u32));
        EndpointElements {
            runs,
            claimed: vec![false; listed.len()],
            data,
        }
    }

    /// Where `key`'s element is, if the table held one.
    fn position(&self, key: u32) -> Option<usize> {
        let run = self
            .runs
            .partition_point(|(first, _)| *first <= key)
            .checked_sub(1)?;
        let (first, start) = self.runs[run];
        let at = start as usize + (key - first) as usize;
        (at < self.run_end(run)).then_some(at)
    }

    /// The index in `data` past the last element of run `run`.
    fn run_end(&self, run: usize) -> usize {
        self.runs
            .get(run + 1)
            .map_or(self.data.len(), |(_, next)| *next as usize)
    }

    /// Every key, in order.
    fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs
            .iter()
            .enumerate()
            .flat_map(|(run, (first, start))| {
                (0..self.run_end(run) - *start as usize).map(move |offset| first + offset as u32)
            })
    }
}

/// The elements a previous run left in the maps of ports that dispatch by endpoint count
/// ([`SharedKind::PortEndpoints`]), summed up per port. A port's elements are the indexes
/// 0…N−1 after its address, protocol and port, all in the map of its count N, so each run
/// is kept as its element count, its highest index and a sum of hashes of each index with
/// its data: about 40 bytes a port, none per element. A run whose sum the plan matches is
/// left alone, one that differs is deleted and written again whole in one transaction,
/// and one no plan claims is read back from the table and deleted with the leftovers.
#[derive(Debug, Default)]
struct PortRuns(HashTable<PortRun>);

#[derive(Debug)]
struct PortRun {
    /// [`slot_id`] of the map and the key's bytes before the index.
    id: u64,
    /// The count of the map it is in: the elements a whole run has.
    count: u16,
    elements: u32,
    last: u32,
    digest: u64,
    claimed: bool,
}

/// What a full sync does with a port's run: nothing, delete and add it whole, or add it.
#[derive(Debug, PartialEq, Eq)]
enum RunState {
    InPlace,
    Stale,
    Missing,
}

impl PortRuns {
    /// Counts one listed element of `map`.
    fn list(&mut self, map: SharedSet, element: &ListedElement) {
        let Some((id, index)) = port_run_key(map, &element.key) else {
            return;
        };
        let digest = element_digest(index, listed_data_hash(&element.data));
        let run = self
            .0
            .entry(id, |run| run.id == id, |run| run.id)
            .or_insert(PortRun {
                id,
                count: map.endpoint_count(),
                elements: 0,
                last: 0,
                digest: 0,
                claimed: false,
            })
            .into_mut();
        run.elements = run.elements.saturating_add(1);
        run.last = run.last.max(index);
        run.digest = run.digest.wrapping_add(digest);
    }

    /// Runs that are not the indexes 0…N−1 of their map's count N: another program
    /// changed them, and nothing short of reading their keys again can mend them.
    fn broken(&self) -> HashSet<u64> {
        self.0
            .iter()
            .filter(|run| {
                run.elements != u32::from(run.count)
                    || run.last.checked_add(1) != Some(run.elements)
            })
            .map(|run| run.id)
            .collect()
    }

    fn remove(&mut self, ids: &HashSet<u64>) {
        self.0.retain(|run| !ids.contains(&run.id));
    }

    /// Claims the run `id` for a plan whose elements there sum to `digest`.
    fn claim(&mut self, id: u64, digest: u64) -> RunState {
        match self.0.find_mut(id, |run| run.id == id) {
            Some(run) => {
                run.claimed = true;
                if run.digest == digest {
                    RunState::InPlace
                } else {
                    RunState::Stale
                }
            }
            None => RunState::Missing,
        }
    }

    fn unclaim(&mut self, id: u64) {
        if let Some(run) = self.0.find_mut(id, |run| run.id == id) {
            run.claimed = false;
        }
    }

    fn unclaimed(&self) -> HashSet<u64> {
        self.0
            .iter()
            .filter(|run| !run.claimed)
            .map(|run| run.id)
            .collect()
    }
}

/// The run a key of a map of [`SharedKind::PortEndpoints`] belongs to (a hash of the map
/// and the key's bytes before its index), and its index.
fn port_run_key(map: SharedSet, key: &[u8]) -> Option<(u64, u32)> {
    let split = key.len().checked_sub(4)?;
    let (prefix, index) = key.split_at(split);
    Some((
        slot_id(map, prefix),
        u32::from_ne_bytes(index.try_into().ok()?),
    ))
}

/// A planned element's run and its part of the run's digest.
fn planned_port_run(element: &ElementPlan) -> Option<(u64, u64)> {
    let (id, index) = port_run_key(element.set, &element.element.key.to_bytes())?;
    Some((
        id,
        element_digest(index, planned_data_hash(&element.element.data)),
    ))
}

fn element_digest(index: u32, data: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    (index, data).hash(&mut hasher);
    hasher.finish()
}

/// A chain as a previous run left it: a hash of its name, its rules, and the digest its
/// first rule carries ([`ChainPlan::digest`]), 0 for none (a digest of 0 is as unlikely as
/// any other, and then only costs the chain a rewrite).
#[derive(Debug, Clone, Copy)]
struct ListedChain {
    name: u64,
    first_digest: u64,
    rules: u32,
}

/// The chains a previous run left, sorted by name hash: 24 bytes a chain.
#[derive(Debug, Default)]
struct ListedChains(Vec<ListedChain>);

impl ListedChains {
    /// Counts a rule of `chain`; its place in the chain.
    fn push_rule(&mut self, chain: &str, comment: Option<&str>) -> u32 {
        let name = name_hash(Object::Chain, chain);
        match self.0.last_mut() {
            // A dump lists the rules of one chain together, in order.
            Some(last) if last.name == name => {
                last.rules += 1;
                last.rules - 1
            }
            _ => {
                self.0.push(ListedChain {
                    name,
                    rules: 1,
                    first_digest: comment
                        .and_then(ChainPlan::digest_of_comment)
                        .unwrap_or_default(),
                });
                0
            }
        }
    }

    fn sort(&mut self) {
        self.0.sort_unstable_by_key(|chain| chain.name);
        self.0.shrink_to_fit();
    }

    fn in_place(&self, chain: &ChainPlan) -> bool {
        let name = name_hash(Object::Chain, chain.name());
        self.0
            .binary_search_by_key(&name, |listed| listed.name)
            .ok()
            .is_some_and(|at| {
                let listed = self.0[at];
                let digest = Some(listed.first_digest).filter(|digest| *digest != 0);
                chain.is_in_place(listed.rules as usize, digest)
            })
    }
}

/// A service in the transaction being built, kept until it commits so that it can be
/// retried alone.
struct Member {
    plan: ServicePlan,
    /// By index into `plan.chains`: whether the kernel's chain holds its rules already.
    in_place: Vec<bool>,
    /// Indexes into `plan.elements`.
    stale: Vec<usize>,
    missing: Vec<usize>,
}

pub(super) struct FullSync<'a, 'v> {
    proxy: &'a mut Proxy,
    planner: &'a Planner<'v>,
    report: &'a mut SyncReport,
    table: Table,
    /// The table was created by this sync: nothing to adopt or clean up.
    fresh: bool,
    /// What the shared maps held before this sync, and the claims on their keys.
    slots: Slots,
    /// What a previous run left in the endpoint maps: reused where the plan wants the same
    /// key with the same verdict, avoided by new blocks, and deleted where unclaimed.
    endpoint_elements: HashMap<SharedSet, EndpointElements>,
    /// The chains a previous run left, with their rules' digests: those in place are not
    /// written again.
    chains: ListedChains,
    /// Hashes of every chain and set this sync programs, by kind and name.
    wanted: HashSet<u64>,
    batch: PlanBatch,
    members: Vec<Member>,
    /// Messages per transaction ([`full_sync_batch_messages`]).
    batch_messages: usize,
    /// The UDP flows of the services programmed, for the conntrack cleanup after.
    udp: &'a mut UdpCheck,
    /// Endpoint maps the table holds: committed by this sync, or listed by its snapshot
    /// (a map of [`SharedKind::PortEndpoints`] only with its dispatch chain in place).
    maps_in_table: HashSet<SharedSet>,
    /// The maps of [`SharedKind::PortEndpoints`] a previous run left, and their runs.
    port_maps: Vec<SharedSet>,
    port_runs: PortRuns,
}

impl<'a, 'v> FullSync<'a, 'v> {
    pub(super) fn new(
        proxy: &'a mut Proxy,
        planner: &'a Planner<'v>,
        report: &'a mut SyncReport,
        udp: &'a mut UdpCheck,
    ) -> FullSync<'a, 'v> {
        FullSync {
            udp,
            proxy,
            planner,
            report,
            table: Table::inet(TABLE),
            fresh: false,
            slots: Slots::default(),
            endpoint_elements: HashMap::new(),
            chains: ListedChains::default(),
            wanted: HashSet::new(),
            batch: PlanBatch::new(),
            members: Vec::new(),
            batch_messages: full_sync_batch_messages(planner.service_count()),
            maps_in_table: HashSet::new(),
            port_maps: Vec::new(),
            port_runs: PortRuns::default(),
        }
    }

    /// Programs the view; the skeleton it programmed, for the applier's records.
    pub(super) fn run(mut self) -> Result<Skeleton, Error> {
        self.proxy.endpoint_maps.clear();
        self.proxy.port_map_elements.clear();
        let skeleton = self.skeleton()?;
        // A fresh allocator: the table is about to be reprogrammed from scratch, and what a
        // previous run or a refused partial sync left is reserved instead (a block on the
        // old allocator's free lists may still hold live keys after a refused commit), or
        // adopted by the chain whose rule uses it.
        let mut keys = EndpointKeys::new();
        if !self.fresh {
            self.snapshot(&mut keys)?;
        }
        self.proxy.applied.clear();
        self.proxy.no_local.clear();
        self.proxy.shared.clear();
        let planner = self.planner;
        // An adoption sends few messages for many services, and each member holds its plan
        // until the commit: the services are bounded too, more tightly when adopting, whose
        // snapshot is alive meanwhile and whose commits are cheap (they write no rule).
        let max_members = self.batch_messages / if self.fresh { 4 } else { 16 };
        for plan in planner.services(&mut keys) {
            self.add(plan)?;
            if self.batch.len() >= self.batch_messages || self.members.len() >= max_members {
                self.flush()?;
            }
        }
        self.flush()?;
        if self.fresh {
            self.enter_services(&mut keys)?;
        } else {
            self.remove_leftovers()
                .map_err(|error| Error::Leftovers(Box::new(error)))?;
        }
        keys.release_reserved();
        self.proxy.keys = keys;
        let mut maps = std::mem::take(&mut self.maps_in_table);
        if !self.fresh {
            // The leftovers' removal deleted the others.
            maps.retain(|map| self.wanted.contains(&name_hash(Object::Set, &map.name())));
        }
        self.proxy.endpoint_maps = maps;
        Ok(skeleton)
    }

    fn skeleton(&mut self) -> Result<Skeleton, Error> {
        let skeleton = self.planner.skeleton();
        for chain in &skeleton.chains {
            self.wanted.insert(name_hash(Object::Chain, chain.name()));
        }
        for set in &skeleton.sets {
            self.wanted.insert(name_hash(Object::Set, &set.set.name));
        }
        let exists = self
            .proxy
            .socket
            .table_exists(&self.table)
            .map_err(Error::netlink("looking for the nodus table"))?;
        if exists {
            let batch = self.proxy.skeleton_refresh(&skeleton)?;
            match self.proxy.commit(&batch.into_batch(), self.report) {
                Ok(()) => return Ok(skeleton),
                Err(refusal @ nft::Error::Refused { .. }) => {
                    warn!(error = %refusal, "cannot adopt the existing nodus table; recreating it");
                }
                Err(other) => return Err(Error::netlink("refreshing the skeleton")(other)),
            }
        }
        let mut batch = PlanBatch::new();
        batch.recreate_skeleton(&skeleton);
        self.proxy
            .commit(&batch.into_batch(), self.report)
            .map_err(Error::netlink("creating the nodus table"))?;
        self.fresh = true;
        Ok(skeleton)
    }

    /// Reads the shared maps as a previous run left them, the blocks its dispatch rules
    /// use, and its chains' rule counts and digests. A table that carried only the egress
    /// masquerade has none.
    fn snapshot(&mut self, keys: &mut EndpointKeys) -> Result<(), Error> {
        let endpoint_maps = self
            .proxy
            .socket
            .list_sets(&self.table, |name| {
                SharedSet::endpoints_from_name(name).is_some()
            })
            .map_err(Error::netlink("listing the endpoint maps"))?;
        for map in endpoint_maps
            .iter()
            .filter_map(|name| SharedSet::endpoints_from_name(name))
        {
            if map.kind == SharedKind::PortEndpoints {
                self.port_maps.push(map);
                continue;
            }
            let mut listed: Vec<(u32, u64)> = Vec::new();
            self.proxy
                .socket
                .each_element(&self.table, &map.name(), |element| {
                    if let Some([Value::Integer32(key)]) = tuple_from_bytes(map, &element.key)
                        .as_ref()
                        .map(|t| &t.0[..])
                    {
                        listed.push((*key, listed_data_hash(&element.data)));
                    }
                })
                .map_err(Error::netlink("listing the endpoint maps"))?;
            let elements = EndpointElements::of(listed);
            keys.reserve(map, elements.keys());
            self.endpoint_elements.insert(map, elements);
            self.maps_in_table.insert(map);
        }
        let chains = &mut self.chains;
        self.proxy
            .socket
            .each_rule(&self.table, |rule| {
                let place = chains.push_rule(rule.chain, rule.comment);
                if let Some(dispatch) = rule.dispatch
                    && let Some(map) = SharedSet::endpoints_from_name(dispatch.map)
                    && map.kind == SharedKind::Endpoints
                {
                    let place = u16::try_from(place).unwrap_or(u16::MAX);
                    keys.adopt(rule.chain, place, map, dispatch.offset, dispatch.modulus);
                }
            })
            .map_err(Error::netlink("listing the rules"))?;
        chains.sort();
        for map in self.port_maps.clone() {
            let runs = &mut self.port_runs;
            self.proxy
                .socket
                .each_element(&self.table, &map.name(), |element| runs.list(map, &element))
                .map_err(Error::netlink("listing the endpoint maps"))?;
            if map
                .dispatch_chain()
                .is_some_and(|chain| self.chains.in_place(&chain))
            {
                self.maps_in_table.insert(map);
            }
        }
        self.delete_broken_port_runs()?;
        self.batch = PlanBatch::assuming_maps(&self.maps_in_table);
        let mut existing = Vec::new();
        self.each_shared_element(|set, element| {
            existing.push((slot_id(set, &element.key), listed_data_hash(&element.data)));
        })?;
        self.slots = Slots::of(existing);
        Ok(())
    }

    /// Adds one service to the transaction being built, unless one of its keys belongs
    /// to a service programmed earlier in this sync.
    fn add(&mut self, plan: ServicePlan) -> Result<(), Error> {
        super::warn_contested(&plan, self.report);
        // Endpoint keys are this sync's blocks: new ones clear of every key the table holds,
        // or a chain's own block adopted from the table, which no other chain is given.
        // They are checked against `endpoint_elements`, not slots.
        let keys: Vec<(usize, u64)> = plan
            .elements
            .iter()
            .enumerate()
            .filter(|(_, element)| !element.set.is_endpoint_map())
            .map(|(index, element)| (index, planned_slot_id(element)))
            .collect();
        // A shared element (a hairpin pair) may be wanted by several services.
        if let Some(index) = keys.iter().find_map(|(index, key)| {
            (!plan.elements[*index].set.kind.is_shared() && self.slots.claimed(*key))
                .then_some(*index)
        }) {
            let element = &plan.elements[index];
            let reason = format!(
                "{} in {} is already programmed for another service",
                element
                    .element
                    .key
                    .0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" . "),
                element.set.name()
            );
            self.refuse(&plan, reason);
            return Ok(());
        }
        for element in &plan.elements {
            if element.set.kind == SharedKind::PortEndpoints {
                *self.proxy.port_map_elements.entry(element.set).or_default() += 1;
            }
        }
        let mut stale = Vec::new();
        let mut missing = Vec::new();
        for (index, element) in plan.elements.iter().enumerate() {
            if element.set.kind != SharedKind::Endpoints {
                continue;
            }
            let existing = match element.element.key.0[..] {
                [Value::Integer32(key)] => self
                    .endpoint_elements
                    .get_mut(&element.set)
                    .and_then(|listed| Some((listed.position(key)?, listed))),
                _ => None,
            };
            match existing {
                Some((at, listed)) => {
                    listed.claimed[at] = true;
                    if listed.data[at] != planned_data_hash(&element.element.data) as u32 {
                        stale.push(index);
                        missing.push(index);
                    }
                }
                None => missing.push(index),
            }
        }
        for (range, id, digest) in port_runs_of(&plan) {
            match self.port_runs.claim(id, digest) {
                RunState::InPlace => {}
                RunState::Stale => {
                    stale.extend(range.clone());
                    missing.extend(range);
                }
                RunState::Missing => missing.extend(range),
            }
        }
        for (index, key) in keys {
            self.slots.claim(key);
            match self.slots.existing_data(key) {
                Some(data) if data == planned_data_hash(&plan.elements[index].element.data) => {}
                Some(_) => {
                    stale.push(index);
                    missing.push(index);
                }
                None => missing.push(index),
            }
        }
        // Only the removal of leftovers asks, and a fresh table has none.
        if !self.fresh {
            for (object, name) in needed_objects(&plan) {
                self.wanted.insert(name_hash(object, &name));
            }
        }
        let in_place = plan
            .chains
            .iter()
            .map(|chain| self.chains.in_place(chain))
            .collect();
        let member = Member {
            plan,
            in_place,
            stale,
            missing,
        };
        program(&mut self.batch, &member, self.fresh);
        self.members.push(member);
        Ok(())
    }

    /// Commits the transaction being built, and starts the next with the endpoint maps the
    /// table now holds.
    fn flush(&mut self) -> Result<(), Error> {
        let batch = std::mem::take(&mut self.batch);
        let committed = self.commit_members(batch);
        self.batch = PlanBatch::assuming_maps(&self.maps_in_table);
        committed
    }

    /// Commits `batch` for the members; when the kernel refuses it, retries each of its
    /// services alone and reports those refused again.
    fn commit_members(&mut self, batch: PlanBatch) -> Result<(), Error> {
        let declared: Vec<SharedSet> = batch.declared_maps().collect();
        let batch = batch.into_batch();
        let members = std::mem::take(&mut self.members);
        // Services an adoption found wholly in place send nothing, and are programmed all
        // the same.
        if batch.is_empty() {
            for member in &members {
                self.record(&member.plan);
            }
            return Ok(());
        }
        match self.proxy.commit(&batch, self.report) {
            Ok(()) => {
                self.maps_in_table.extend(declared);
                for member in &members {
                    self.record(&member.plan);
                }
                return Ok(());
            }
            Err(refusal @ nft::Error::Refused { .. }) => {
                error!(error = %refusal, "a full-sync transaction was refused; retrying its services one by one");
            }
            Err(other) => return Err(Error::netlink("programming services")(other)),
        }
        for member in members {
            let mut alone = PlanBatch::new();
            program(&mut alone, &member, self.fresh);
            match self.proxy.commit(&alone.into_batch(), self.report) {
                Ok(()) => self.record(&member.plan),
                Err(refusal @ nft::Error::Refused { .. }) => {
                    error!(
                        service = %format!("{}/{}", member.plan.namespace, member.plan.name),
                        error = %refusal,
                        "service refused by the kernel"
                    );
                    for (_, id, _) in port_runs_of(&member.plan) {
                        self.port_runs.unclaim(id);
                    }
                    for element in &member.plan.elements {
                        if !element.set.is_endpoint_map() {
                            self.slots.unclaim(planned_slot_id(element));
                        }
                        // Its endpoint elements in place go with its old chains.
                        if let ([Value::Integer32(key)], Some(listed)) = (
                            &element.element.key.0[..],
                            self.endpoint_elements.get_mut(&element.set),
                        ) && let Some(at) = listed.position(*key)
                        {
                            listed.claimed[at] = false;
                        }
                    }
                    // Not its endpoint maps: other services use them.
                    for (object, name) in own_objects(&member.plan) {
                        self.wanted.remove(&name_hash(object, &name));
                    }
                    self.refuse(&member.plan, refusal.to_string());
                }
                Err(other) => return Err(Error::netlink("programming a service")(other)),
            }
        }
        Ok(())
    }

    /// The rest of a cold start: the programmed services' endpoint map elements, then
    /// their elements in the skeleton's shared sets, which lead traffic into their chains.
    /// Until now no path from a base chain reached those chains, so each commit that wrote
    /// rules made the kernel validate little more than the skeleton (`nft_table_validate`
    /// walks every path from the base chains); entering them last, in a few large
    /// commits (about ten at 50,000 services), validates the whole table a few times
    /// rather than once per commit. The endpoint elements go in commits of their own,
    /// which write no verdict and so validate nothing, each before the entries that reach
    /// them: every service becomes reachable with its endpoints in place. The services
    /// are planned again for these elements, in the key blocks their records hold, rather
    /// than their elements kept from the first half.
    fn enter_services(&mut self, keys: &mut EndpointKeys) -> Result<(), Error> {
        // What only the removal of leftovers needs, and a fresh table has none.
        self.slots = Slots::default();
        self.wanted = HashSet::new();
        let planner = self.planner;
        // Each batch holds its elements planned until its commit, and two are filling at
        // once: at four times this, 50,000 services' entering held 8.8 MiB (a third of the
        // cold start's peak). The commits it adds validate the table a few more times, in
        // no time the bench could tell apart.
        let limit = self.batch_messages;
        let mut endpoints = PlanBatch::new();
        let mut entries = PlanBatch::new();
        for (namespace, name) in planner.service_names() {
            let Some(blocks) = self
                .proxy
                .applied
                .get(service_key(namespace, name))
                .map(|footprint| footprint.blocks(namespace, name))
            else {
                continue;
            };
            let plan = planner.service(namespace, name, &mut keys.lease(&blocks));
            endpoints.fill_endpoints(&plan);
            entries.enter_service(&plan);
            if endpoints.element_count() >= limit {
                self.commit_entries(std::mem::take(&mut endpoints))?;
            }
            if entries.element_count() >= limit {
                self.commit_entries(std::mem::take(&mut endpoints))?;
                self.commit_entries(std::mem::take(&mut entries))?;
            }
        }
        self.commit_entries(endpoints)?;
        self.commit_entries(entries)
    }

    /// A refusal here is not retried service by service: the full sync adopts the table
    /// instead ([`Error::Unentered`]).
    fn commit_entries(&mut self, batch: PlanBatch) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        self.proxy
            .commit(&batch.into_batch(), self.report)
            .map_err(|error| match error {
                refusal @ nft::Error::Refused { .. } => Error::Unentered(refusal),
                other => Error::netlink("entering the services")(other),
            })
    }

    fn record(&mut self, plan: &ServicePlan) {
        self.proxy.shared.claim(plan, 1);
        self.udp.planned(plan);
        self.proxy.record(
            service_key(&plan.namespace, &plan.name),
            Some(Record::of(plan.digest(), plan)),
        );
        self.report.added += 1;
    }

    fn refuse(&mut self, plan: &ServicePlan, reason: String) {
        warn!(service = %format!("{}/{}", plan.namespace, plan.name), %reason, "service not programmed");
        self.report.refused.push(RefusedService {
            service: ServiceName {
                namespace: plan.namespace.clone(),
                name: plan.name.clone(),
            },
            reason,
        });
    }

    /// Calls `each` for every element of the skeleton's shared sets and maps, as the dumps
    /// arrive; a set the table lacks is skipped.
    fn each_shared_element(
        &mut self,
        mut each: impl FnMut(SharedSet, ListedElement),
    ) -> Result<(), Error> {
        let skeleton_sets = Family::ALL
            .into_iter()
            .flat_map(|family| SharedKind::ALL.map(|kind| SharedSet::new(kind, family)));
        for set in skeleton_sets {
            let listed = self
                .proxy
                .socket
                .each_element(&self.table, &set.name(), |element| each(set, element));
            match listed {
                Err(missing) if missing.is_missing() => continue,
                listed => listed.map_err(Error::netlink("listing the shared maps"))?,
            }
        }
        Ok(())
    }

    /// The keys of the runs `ids` in the maps of [`SharedKind::PortEndpoints`], read from
    /// the table.
    fn port_run_elements(&mut self, ids: &HashSet<u64>) -> Result<Vec<ElementPlan>, Error> {
        let mut elements = Vec::new();
        if ids.is_empty() {
            return Ok(elements);
        }
        for map in self.port_maps.clone() {
            self.proxy
                .socket
                .each_element(&self.table, &map.name(), |element| {
                    let selected =
                        port_run_key(map, &element.key).is_some_and(|(id, _)| ids.contains(&id));
                    if let Some(key) = tuple_from_bytes(map, &element.key).filter(|_| selected) {
                        elements.push(ElementPlan {
                            set: map,
                            element: Element::new(key),
                        });
                    }
                })
                .map_err(Error::netlink("listing the endpoint maps"))?;
        }
        Ok(elements)
    }

    /// Deletes the runs another program changed in the maps of
    /// [`SharedKind::PortEndpoints`] before any service is programmed: their ports are
    /// then written whole, as if new.
    fn delete_broken_port_runs(&mut self) -> Result<(), Error> {
        let broken = self.port_runs.broken();
        if broken.is_empty() {
            return Ok(());
        }
        warn!(
            ports = broken.len(),
            "endpoint runs changed by another program; writing them again"
        );
        let elements = self.port_run_elements(&broken)?;
        for chunk in elements.chunks(self.batch_messages * 8) {
            let mut batch = PlanBatch::new();
            batch.delete_leftover_elements(chunk);
            self.commit_cleanup(batch)?;
        }
        self.port_runs.remove(&broken);
        Ok(())
    }

    /// Removes the previous run's elements, chains and sets that this sync did not claim.
    fn remove_leftovers(&mut self) -> Result<(), Error> {
        // The unclaimed elements' keys, read back from the table.
        let slots = std::mem::take(&mut self.slots);
        let mut elements: Vec<ElementPlan> = Vec::new();
        if slots.has_leftovers() {
            self.each_shared_element(|set, element| {
                let leftover = slots.is_leftover(slot_id(set, &element.key));
                if let Some(key) = tuple_from_bytes(set, &element.key).filter(|_| leftover) {
                    elements.push(ElementPlan {
                        set,
                        element: Element::new(key),
                    });
                }
            })?;
        }
        drop(slots);
        let endpoint_elements = std::mem::take(&mut self.endpoint_elements);
        let mut endpoint_keys: Vec<ElementPlan> = endpoint_elements
            .iter()
            .flat_map(|(map, listed)| {
                listed
                    .keys()
                    .zip(&listed.claimed)
                    .filter(|(_, claimed)| !**claimed)
                    .map(|(key, _)| ElementPlan {
                        set: *map,
                        element: Element::new(Value::Integer32(key)),
                    })
            })
            .collect();
        drop(endpoint_elements);
        let unclaimed = self.port_runs.unclaimed();
        endpoint_keys.extend(self.port_run_elements(&unclaimed)?);
        let wanted = &self.wanted;
        let chains = self
            .proxy
            .socket
            .list_chains(&self.table, |name| {
                !wanted.contains(&name_hash(Object::Chain, name))
            })
            .map_err(Error::netlink("listing chains"))?;
        // Anonymous sets belong to rules and go with them.
        let sets = self
            .proxy
            .socket
            .list_sets(&self.table, |name| {
                !name.starts_with("__") && !wanted.contains(&name_hash(Object::Set, name))
            })
            .map_err(Error::netlink("listing sets"))?;
        self.report.leftovers_removed +=
            elements.len() + endpoint_keys.len() + chains.len() + sets.len();

        // Dispatch elements before endpoint keys: a service of the previous run that is gone
        // stops being dispatched before its endpoints go.
        for chunk in elements
            .chunks(self.batch_messages * 8)
            .chain(endpoint_keys.chunks(self.batch_messages * 8))
        {
            let mut batch = PlanBatch::new();
            batch.delete_leftover_elements(chunk);
            self.commit_cleanup(batch)?;
        }
        for chunk in chains.chunks(self.batch_messages) {
            let mut batch = PlanBatch::new();
            chunk.iter().for_each(|chain| batch.flush_chain(chain));
            self.commit_cleanup(batch)?;
        }
        for chunk in chains.chunks(self.batch_messages) {
            let mut batch = PlanBatch::new();
            chunk.iter().for_each(|chain| batch.delete_chain(chain));
            self.commit_cleanup(batch)?;
        }
        for chunk in sets.chunks(self.batch_messages) {
            let mut batch = PlanBatch::new();
            chunk.iter().for_each(|set| batch.delete_set(set));
            self.commit_cleanup(batch)?;
        }
        Ok(())
    }

    fn commit_cleanup(&mut self, batch: PlanBatch) -> Result<(), Error> {
        self.proxy
            .commit(&batch.into_batch(), self.report)
            .map_err(Error::netlink("committing the removal"))
    }
}

fn program(batch: &mut PlanBatch, member: &Member, fresh: bool) {
    if fresh {
        batch.add_service_unentered(&member.plan);
    } else {
        let pick = |indexes: &[usize]| -> Vec<&ElementPlan> {
            indexes.iter().map(|&i| &member.plan.elements[i]).collect()
        };
        batch.adopt_service(
            &member.plan,
            &member.in_place,
            &pick(&member.stale),
            &pick(&member.missing),
        );
    }
}

/// Chains and sets live in separate namespaces of a table: an older layout had a map
/// named like each dispatch chain, and only the chain is still wanted.
#[derive(Hash, Clone, Copy)]
enum Object {
    Chain,
    Set,
}

/// The chains and sets a service alone owns.
fn own_objects(plan: &ServicePlan) -> impl Iterator<Item = (Object, String)> {
    plan.chains
        .iter()
        .map(|chain| (Object::Chain, chain.name().to_string()))
        .chain(
            plan.sets
                .iter()
                .map(|set| (Object::Set, set.set.name.clone())),
        )
}

/// Everything a service needs in the table: its own objects and the endpoint maps it
/// shares.
fn needed_objects(plan: &ServicePlan) -> impl Iterator<Item = (Object, String)> {
    own_objects(plan).chain(plan.endpoint_maps().into_iter().flat_map(|map| {
        let chain = (map.kind == SharedKind::PortEndpoints)
            .then(|| (Object::Chain, map.dispatch_chain_name()));
        std::iter::once((Object::Set, map.name())).chain(chain)
    }))
}

/// The runs of `plan` in maps of [`SharedKind::PortEndpoints`]: the indexes of their
/// elements in `plan.elements`, each run's id and the sum of its elements' digests.
fn port_runs_of(plan: &ServicePlan) -> Vec<(std::ops::Range<usize>, u64, u64)> {
    let mut runs: Vec<(std::ops::Range<usize>, u64, u64)> = Vec::new();
    for (index, element) in plan.elements.iter().enumerate() {
        if element.set.kind != SharedKind::PortEndpoints {
            continue;
        }
        let Some((id, digest)) = planned_port_run(element) else {
            continue;
        };
        match runs.last_mut() {
            Some((range, run, sum)) if *run == id && range.end == index => {
                range.end = index + 1;
                *sum = sum.wrapping_add(digest);
            }
            _ => runs.push((index..index + 1, id, digest)),
        }
    }
    runs
}

fn name_hash(object: Object, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    object.hash(&mut hasher);
    name.hash(&mut hasher);
    hasher.finish()
}

/// Which slot a shared set's key has: a hash of the set and the key's bytes.
fn slot_id(set: SharedSet, key: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    (set, key).hash(&mut hasher);
    hasher.finish()
}

pub(super) fn planned_slot_id(element: &ElementPlan) -> u64 {
    slot_id(element.set, &element.element.key.to_bytes())
}

/// An element's data as the table holds it, hashed: a verdict, or a value's bytes…
fn listed_data_hash(data: &Option<ListedData>) -> u64 {
    let mut hasher = DefaultHasher::new();
    match data {
        None => 0u8.hash(&mut hasher),
        Some(ListedData::Verdict(verdict)) => (1u8, verdict).hash(&mut hasher),
        Some(ListedData::Value(bytes)) => (2u8, bytes).hash(&mut hasher),
    }
    hasher.finish()
}

/// …and as the plan wants it, hashed alike: equal data, equal hashes.
fn planned_data_hash(data: &Option<ElementData>) -> u64 {
    let mut hasher = DefaultHasher::new();
    match data {
        None => 0u8.hash(&mut hasher),
        Some(ElementData::Verdict(verdict)) => (1u8, verdict).hash(&mut hasher),
        Some(ElementData::Value(value)) => (2u8, value.to_bytes()).hash(&mut hasher),
    }
    hasher.finish()
}

/// A key of a shared map from the kernel's bytes, to delete it.
fn tuple_from_bytes(set: SharedSet, bytes: &[u8]) -> Option<Tuple> {
    Tuple::from_bytes(&set.definition().key, bytes)
}

#[cfg(test)]
mod tests {
    use super::EndpointElements;

    #[test]
    fn endpoint_elements_are_found_by_key_in_their_runs() {
        // Two blocks, 4…6 and 16…17, and a lone key at the top of the key space, listed
        // out of order as a hash map's dump is.
        let listed = vec![(17, 7), (4, 1), (u32::MAX, 9), (6, 3), (16, 6), (5, 2)];
        let elements = EndpointElements::of(listed);
        assert_eq!(elements.runs, [(4, 0), (16, 3), (u32::MAX, 5)]);
        let found = |key| elements.position(key).map(|at| elements.data[at]);
        assert_eq!(
            [4, 5, 6, 16, 17, u32::MAX].map(found),
            [1, 2, 3, 6, 7, 9].map(Some)
        );
        assert_eq!([0, 3, 7, 15, 18, u32::MAX - 1].map(found), [None; 6]);
        assert_eq!(
            elements.keys().collect::<Vec<_>>(),
            [4, 5, 6, 16, 17, u32::MAX]
        );
        assert_eq!(EndpointElements::of(Vec::new()).position(0), None);
    }
}
