//! Plans into nf_tables transactions: the skeleton and services for a cold start, in
//! bounded batches, and one service's add, update or removal for incremental syncs.
//!
//! Within a batch, objects are created before anything refers to them: sets and chains
//! first, then rules, then map elements (which name chains). References are dropped
//! before objects go: elements are deleted and chains flushed before chains and sets are
//! deleted. Elements whose key may change hands between services (an external address
//! and port) are added at the end of the batch, after every service's deletes, so that
//! the order of services in a transaction never matters. Every batch is therefore valid
//! on its own, and a cold start may be split into many commits without a map ever
//! pointing at a missing chain.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::TABLE;

use super::objects::{
    ChainPlan, ElementPlan, ServicePlan, SetDifference, SetPlan, SharedKind, SharedSet, Skeleton,
};
use super::rule::RulePlan;
use crate::nft::{Batch, Element, Rule, Set, SetRef, Table};

/// A batch on the `nodus` table, remembering the sets it creates so that rules in the
/// same batch refer to them by the batch-local id as nft does.
#[derive(Debug)]
pub struct PlanBatch {
    batch: Batch,
    created_sets: HashMap<String, SetRef>,
    /// Adds of elements that [`super::SharedKind::changes_hands`], sent last.
    deferred: Vec<ElementPlan>,
    /// While set, adds of elements in the shared sets and maps are left out
    /// ([`PlanBatch::add_service_unentered`]).
    withhold_shared: bool,
    /// Endpoint maps an earlier transaction of the same sync created: not declared again.
    maps_in_table: HashSet<SharedSet>,
    /// Elements this batch adds to (+) and deletes from (-) each port endpoint map.
    port_map_changes: HashMap<SharedSet, i64>,
}

/// What a partial sync's batch does to the port endpoint maps: their element counts, and
/// the maps it deletes with their dispatch chains because it empties them
/// ([`PlanBatch::delete_emptied_port_maps`]).
#[derive(Debug, Default)]
pub struct PortMapChanges {
    changes: HashMap<SharedSet, i64>,
    pub emptied: Vec<SharedSet>,
}

impl PortMapChanges {
    /// Applies the committed batch to `held`, the elements of each port endpoint map in
    /// the table; an emptied map is no longer held.
    pub fn apply_to(&self, held: &mut HashMap<SharedSet, u32>) {
        for (map, change) in &self.changes {
            let count = i64::from(held.get(map).copied().unwrap_or(0)) + change;
            match u32::try_from(count) {
                Ok(count) if count > 0 => {
                    held.insert(*map, count);
                }
                _ => {
                    held.remove(map);
                }
            }
        }
    }
}

impl Default for PlanBatch {
    fn default() -> PlanBatch {
        PlanBatch::new()
    }
}

impl PlanBatch {
    pub fn new() -> PlanBatch {
        PlanBatch {
            batch: Batch::new(Table::inet(TABLE)),
            created_sets: HashMap::new(),
            deferred: Vec::new(),
            withhold_shared: false,
            maps_in_table: HashSet::new(),
            port_map_changes: HashMap::new(),
        }
    }

    /// A batch that takes `maps` for existing endpoint maps (with their dispatch chains,
    /// for those that have one), as an earlier committed transaction left them, and does
    /// not declare them again: each `add map`, even of an existing one, walks the table's
    /// list of sets in the kernel, and a dispatch chain's rules would be written again.
    pub fn assuming_maps(maps: &HashSet<SharedSet>) -> PlanBatch {
        PlanBatch {
            maps_in_table: maps.clone(),
            ..PlanBatch::new()
        }
    }

    /// Deletes, at the end of the batch, each port endpoint map the batch empties and its
    /// dispatch chain: `held` counts the elements of each map in the table before it.
    /// Nothing refers to such a map's chain any more (a port's entry goes to the chain of
    /// the map that holds its elements, and the entries are deleted before), so the chain
    /// and the map go in the same transaction; otherwise every endpoint count a Service
    /// ever passed through would keep a chain that every later commit walks. A count that
    /// is too high (an element two services claim) only keeps a map; one too low makes
    /// the kernel refuse the transaction, and the full sync after it counts again.
    pub fn delete_emptied_port_maps(&mut self, held: &HashMap<SharedSet, u32>) -> PortMapChanges {
        let changes = std::mem::take(&mut self.port_map_changes);
        let mut emptied: Vec<SharedSet> = changes
            .iter()
            .filter(|(map, change)| {
                held.get(map)
                    .is_some_and(|count| i64::from(*count) + **change <= 0)
            })
            .map(|(map, _)| *map)
            .collect();
        emptied.sort();
        for map in &emptied {
            let chain = map.dispatch_chain_name();
            self.batch.flush_chain(&chain);
            self.batch.delete_chain(&chain);
            self.batch.delete_set(&map.name());
        }
        PortMapChanges { changes, emptied }
    }

    /// The endpoint maps this batch declares.
    pub fn declared_maps(&self) -> impl Iterator<Item = SharedSet> + '_ {
        self.created_sets
            .keys()
            .filter_map(|name| SharedSet::endpoints_from_name(name))
    }

    /// Messages so far (a deferred element counts as one).
    pub fn len(&self) -> usize {
        self.batch.len() + self.deferred.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batch.is_empty() && self.deferred.is_empty()
    }

    /// Set elements added or deleted so far.
    pub fn element_count(&self) -> usize {
        self.batch.element_count() + self.deferred.len()
    }

    pub fn into_batch(mut self) -> Batch {
        let deferred = std::mem::take(&mut self.deferred);
        self.add_elements_now(deferred);
        self.batch
    }

    /// Replaces whatever `nodus` table exists with the skeleton: the table is added (so
    /// that deleting it cannot fail), deleted with everything in it, and built again, in
    /// one transaction.
    pub fn recreate_skeleton(&mut self, skeleton: &Skeleton) {
        self.batch.add_table().delete_table().add_table();
        for set in &skeleton.sets {
            let reference = self.add_set(&set.set);
            if !set.elements.is_empty() {
                self.batch.add_elements(&reference, &set.elements);
            }
        }
        for chain in &skeleton.chains {
            self.batch.add_chain(&chain.chain);
        }
        for chain in &skeleton.chains {
            self.add_rules(chain);
        }
    }

    /// Brings an existing `nodus` table's skeleton up to date without deleting anything,
    /// in one transaction: objects are created if missing, the skeleton's chains are
    /// flushed and rewritten, and its own sets ([`Skeleton::own_sets`]) changed by their
    /// `differences` (by name) from what the table holds, or refilled where none is given.
    /// The shared maps keep their elements, so every service of a previous run keeps
    /// working until it is re-programmed, and so do the NetworkPolicy sets, until their
    /// own transaction brings them up to date. The kernel refuses this when a set or base
    /// chain exists with another definition; then only [`PlanBatch::recreate_skeleton`]
    /// helps.
    pub fn refresh_skeleton(
        &mut self,
        skeleton: &Skeleton,
        differences: &HashMap<&str, SetDifference<'_>>,
    ) {
        self.batch.add_table();
        for set in &skeleton.sets {
            match (
                set.is_skeletons_own(),
                differences.get(set.set.name.as_str()),
            ) {
                (false, _) => {
                    self.add_set(&set.set);
                }
                (true, Some(difference)) => self.converge_set(&set.set, difference),
                (true, None) => self.refill_sets(std::slice::from_ref(set)),
            }
        }
        for chain in &skeleton.chains {
            self.batch.add_chain(&chain.chain);
            self.batch.flush_chain(chain.name());
        }
        for chain in &skeleton.chains {
            self.add_rules(chain);
        }
    }

    /// Programs `plan` over a table a previous run may have left parts of it in: its sets
    /// are created if missing, its chains too, and every chain not `in_place` (by index;
    /// one with other rules, see [`ChainPlan::is_in_place`]) is flushed and rewritten; the
    /// elements in `stale` (present with other data) are deleted, and then those in
    /// `missing` (which includes the stale ones) are added. Elements already present
    /// with the same data are left alone, so nothing is ever missing in between.
    pub fn adopt_service(
        &mut self,
        plan: &ServicePlan,
        in_place: &[bool],
        stale: &[&ElementPlan],
        missing: &[&ElementPlan],
    ) {
        self.ensure_endpoint_maps(plan.endpoint_maps());
        for set in &plan.sets {
            let reference = self.add_set(&set.set);
            if !set.elements.is_empty() {
                self.batch.flush_set(&reference);
                self.batch.add_elements(&reference, &set.elements);
            }
        }
        let rewritten = || {
            plan.chains
                .iter()
                .enumerate()
                .filter(|(index, _)| !in_place.get(*index).copied().unwrap_or(false))
                .map(|(_, chain)| chain)
        };
        for chain in rewritten() {
            self.batch.add_chain(&chain.chain);
            self.batch.flush_chain(chain.name());
        }
        for chain in rewritten() {
            self.add_rules(chain);
        }
        self.delete_elements(stale.iter().copied());
        self.add_elements(missing.iter().copied());
    }

    /// Deletes elements a previous run left in the shared maps.
    pub fn delete_leftover_elements(&mut self, elements: &[ElementPlan]) {
        self.delete_elements(elements.iter());
    }

    /// Flushes a chain a previous run left, dropping its references to other chains and
    /// sets before they are deleted in a later transaction.
    pub fn flush_chain(&mut self, name: &str) {
        self.batch.flush_chain(name);
    }

    pub fn delete_chain(&mut self, name: &str) {
        self.batch.delete_chain(name);
    }

    pub fn delete_set(&mut self, name: &str) {
        self.batch.delete_set(name);
    }

    /// Programs a service that is not in the table yet: what
    /// [`PlanBatch::update_service`] sends from an empty plan, without comparing anything
    /// (a cold start adds every service, and hashing each element into sets to find it
    /// new was a tenth of the planning).
    pub fn add_service(&mut self, plan: &ServicePlan) {
        self.ensure_endpoint_maps(
            plan.elements
                .iter()
                .filter(|e| e.set.is_endpoint_map())
                .map(|e| e.set),
        );
        for set in &plan.sets {
            self.add_filled_set(set);
        }
        for chain in &plan.chains {
            self.batch.add_chain(&chain.chain);
        }
        for chain in &plan.chains {
            self.add_rules(chain);
        }
        self.add_elements(plan.elements.iter());
    }

    /// Programs a service that is not in the table yet, all but its elements in the
    /// shared sets and maps: its own sets, chains and rules, which no path from a base
    /// chain reaches until [`PlanBatch::fill_endpoints`] and [`PlanBatch::enter_service`]
    /// add the rest. A rule that binds an endpoint map makes the kernel check every
    /// element already in it (`nf_tables_bind_set`); with the rules in first, the maps
    /// are empty when they are bound.
    pub fn add_service_unentered(&mut self, plan: &ServicePlan) {
        self.withhold_shared = true;
        self.add_service(plan);
        self.withhold_shared = false;
    }

    /// The second part of [`PlanBatch::add_service_unentered`]: `plan`'s endpoint map
    /// elements, sent with those of the other services of the batch, one message per map
    /// (each message makes the kernel look its set up by name in the table's list).
    pub fn fill_endpoints(&mut self, plan: &ServicePlan) {
        self.defer(plan.elements.iter().filter(|e| e.set.is_endpoint_map()));
    }

    /// The last part of [`PlanBatch::add_service_unentered`]: `plan`'s elements in the
    /// skeleton's shared sets, whose verdicts name the chains added then, one message per
    /// set for the whole batch. Nothing is deleted in such a batch, so the order of its
    /// adds does not matter.
    pub fn enter_service(&mut self, plan: &ServicePlan) {
        self.defer(plan.elements.iter().filter(|e| !e.set.is_endpoint_map()));
    }

    /// Removes everything `old` programmed.
    pub fn remove_service(&mut self, old: &ServicePlan) {
        self.update_service(old, &ServicePlan::empty(&old.namespace, &old.name));
    }

    /// Turns the programmed `old` into `new`: unchanged chains, sets and elements are
    /// left alone, so established flows and affinity entries survive. A service's own
    /// map whose elements change is flushed and refilled in the same transaction.
    pub fn update_service(&mut self, old: &ServicePlan, new: &ServicePlan) {
        let old_sets: HashMap<&str, &SetPlan> = old
            .sets
            .iter()
            .map(|set| (set.set.name.as_str(), set))
            .collect();
        let new_sets: HashSet<&str> = new.sets.iter().map(|set| set.set.name.as_str()).collect();
        let old_chains: HashMap<&str, &ChainPlan> = old
            .chains
            .iter()
            .map(|chain| (chain.name(), chain))
            .collect();
        let new_chains: HashMap<&str, &ChainPlan> = new
            .chains
            .iter()
            .map(|chain| (chain.name(), chain))
            .collect();
        let old_elements: HashSet<&ElementPlan> = old.elements.iter().collect();
        let new_elements: HashSet<&ElementPlan> = new.elements.iter().collect();
        // A rule names an endpoint map only with a block whose elements are new.
        self.ensure_endpoint_maps(
            new.elements
                .iter()
                .filter(|e| e.set.is_endpoint_map() && !old_elements.contains(e))
                .map(|e| e.set),
        );

        for set in &new.sets {
            match old_sets.get(set.set.name.as_str()) {
                None => self.add_filled_set(set),
                Some(old_set) if old_set.elements != set.elements => {
                    let reference = self.set_ref(&set.set.name);
                    self.batch.flush_set(&reference);
                    if !set.elements.is_empty() {
                        self.batch.add_elements(&reference, &set.elements);
                    }
                }
                Some(_) => {}
            }
        }
        for chain in new
            .chains
            .iter()
            .filter(|c| !old_chains.contains_key(c.name()))
        {
            self.batch.add_chain(&chain.chain);
        }
        self.delete_elements(old.elements.iter().filter(|e| !new_elements.contains(e)));
        // Old chains whose rules change or that go: flush them, dropping their jumps.
        for chain in &old.chains {
            if new_chains.get(chain.name()) != Some(&chain) {
                self.batch.flush_chain(chain.name());
            }
        }
        for chain in &new.chains {
            if old_chains.get(chain.name()) != Some(&chain) {
                self.add_rules(chain);
            }
        }
        self.add_elements(new.elements.iter().filter(|e| !old_elements.contains(e)));
        for chain in old
            .chains
            .iter()
            .filter(|c| !new_chains.contains_key(c.name()))
        {
            self.batch.delete_chain(chain.name());
        }
        for set in old
            .sets
            .iter()
            .filter(|set| !new_sets.contains(set.set.name.as_str()))
        {
            self.batch.delete_set(&set.set.name);
        }
    }

    /// Creates `sets` if missing and replaces their elements with theirs.
    pub fn refill_sets(&mut self, sets: &[SetPlan]) {
        for set in sets {
            let reference = self.add_set(&set.set);
            self.batch.flush_set(&reference);
            if !set.elements.is_empty() {
                self.batch.add_elements(&reference, &set.elements);
            }
        }
    }

    /// Creates `set` if missing, and changes its elements by `difference`.
    pub fn converge_set(&mut self, set: &Set, difference: &SetDifference<'_>) {
        let reference = self.add_set(set);
        self.change_elements(&reference, &difference.gone, &difference.came);
    }

    /// Turns the elements of the sets `old` into those of `new` (sets of one name): the
    /// elements only one of them has are deleted or added, the others left alone.
    pub fn update_set_elements(&mut self, old: &[SetPlan], new: &[SetPlan]) {
        for set in new {
            let before: HashSet<&Element> = old
                .iter()
                .find(|o| o.set.name == set.set.name)
                .map(|o| o.elements.iter().collect())
                .unwrap_or_default();
            let after: HashSet<&Element> = set.elements.iter().collect();
            let gone: Vec<Element> = before
                .iter()
                .filter(|e| !after.contains(*e))
                .map(|e| (*e).clone())
                .collect();
            let came: Vec<Element> = set
                .elements
                .iter()
                .filter(|e| !before.contains(e))
                .cloned()
                .collect();
            let reference = self.set_ref(&set.set.name);
            self.change_elements(&reference, &gone, &came);
        }
    }

    /// Deletes `gone` from the set `reference` names, then adds `came`.
    fn change_elements(&mut self, reference: &SetRef, gone: &[Element], came: &[Element]) {
        if !gone.is_empty() {
            self.batch.delete_elements(reference, gone);
        }
        if !came.is_empty() {
            self.batch.add_elements(reference, came);
        }
    }

    /// Creates `maps` unless they exist (an `add` of an existing
    /// map is a no-op), once per batch, and the shared dispatch chain of those that have
    /// one, its rules written anew (a chain's rules are added again each time). Other
    /// services share them: a port map goes when a batch empties it
    /// ([`PlanBatch::delete_emptied_port_maps`]), a block map only in a full sync, which
    /// removes those left unused.
    fn ensure_endpoint_maps(&mut self, maps: impl IntoIterator<Item = SharedSet>) {
        for map in maps {
            if !self.maps_in_table.contains(&map) && !self.created_sets.contains_key(&map.name()) {
                self.add_set(&map.definition());
                if let Some(chain) = map.dispatch_chain() {
                    self.batch.add_chain(&chain.chain);
                    self.batch.flush_chain(chain.name());
                    self.add_rules(&chain);
                }
            }
        }
    }

    /// Creates a service's own set with its elements.
    fn add_filled_set(&mut self, set: &SetPlan) {
        let reference = self.add_set(&set.set).created();
        if !set.elements.is_empty() {
            self.batch.add_elements(&reference, &set.elements);
        }
    }

    fn add_set(&mut self, set: &Set) -> SetRef {
        let reference = self.batch.add_set(set);
        self.created_sets
            .insert(set.name.clone(), reference.clone());
        reference
    }

    fn set_ref(&self, name: &str) -> SetRef {
        set_ref(&self.created_sets, name)
    }

    /// Writes the rules of `chain`, the first with the chain's comment.
    fn add_rules(&mut self, chain: &ChainPlan) {
        for (index, rule) in chain.rules.iter().enumerate() {
            let mut rule = self.rule(chain.name(), rule);
            if index == 0 {
                rule = rule.with_comment(chain.comment());
            }
            self.batch.add_rule(&rule);
        }
    }

    fn rule(&mut self, chain: &str, rule: &RulePlan) -> Rule {
        let created_sets = &self.created_sets;
        let exprs = rule.to_exprs(&mut self.batch, |name| set_ref(created_sets, name));
        Rule::new(chain, exprs)
    }

    fn add_elements<'a>(&mut self, elements: impl Iterator<Item = &'a ElementPlan>) {
        if self.withhold_shared {
            return;
        }
        let (deferred, now): (Vec<&ElementPlan>, Vec<&ElementPlan>) =
            elements.partition(|element| element.set.kind.changes_hands());
        self.defer(deferred.into_iter());
        self.add_elements_now(now.into_iter().cloned());
    }

    /// Adds `elements` at the end of the batch, with the other deferred ones of their set.
    fn defer<'a>(&mut self, elements: impl Iterator<Item = &'a ElementPlan>) {
        self.deferred.extend(elements.cloned());
    }

    /// Adds `elements` where they stand in the batch, one message per set.
    fn add_elements_now(&mut self, elements: impl IntoIterator<Item = ElementPlan>) {
        for (set, elements) in by_set(elements) {
            self.count_port_map_change(set, elements.len(), 1);
            let reference = self.set_ref(&set.name());
            self.batch.add_elements(&reference, &elements);
        }
    }

    fn delete_elements<'a>(&mut self, elements: impl Iterator<Item = &'a ElementPlan>) {
        for (set, elements) in by_set(elements.cloned()) {
            self.count_port_map_change(set, elements.len(), -1);
            let reference = self.set_ref(&set.name());
            self.batch.delete_elements(&reference, &elements);
        }
    }

    /// Counts what adding (`sign` 1) or deleting (-1) `count` elements of `set` does to
    /// it, when it is a port endpoint map. Such elements never change hands, so none
    /// waits among the deferred ones.
    fn count_port_map_change(&mut self, set: SharedSet, count: usize, sign: i64) {
        if set.kind == SharedKind::PortEndpoints {
            let count = i64::try_from(count).unwrap_or(i64::MAX);
            *self.port_map_changes.entry(set).or_default() += sign * count;
        }
    }
}

/// A set created in this batch by its id, any other by name.
fn set_ref(created_sets: &HashMap<String, SetRef>, name: &str) -> SetRef {
    created_sets
        .get(name)
        .cloned()
        .unwrap_or_else(|| SetRef::named(name))
}

/// Elements grouped by set, one message per set.
fn by_set(elements: impl IntoIterator<Item = ElementPlan>) -> BTreeMap<SharedSet, Vec<Element>> {
    let mut grouped: BTreeMap<SharedSet, Vec<Element>> = BTreeMap::new();
    for element in elements {
        grouped
            .entry(element.set)
            .or_default()
            .push(element.element);
    }
    grouped
}

/// The transactions of a cold start: the skeleton, then services packed into batches of
/// about `budget` messages (a service is never split), planned lazily from `plans` so
/// that the whole ruleset is never held at once. Small transactions keep the kernel's
/// commit lock short, so forwarding does not stall while a large table is built.
pub fn cold_start<I>(skeleton: &Skeleton, plans: I, budget: usize) -> ColdStart<I::IntoIter>
where
    I: IntoIterator<Item = ServicePlan>,
{
    let mut first = PlanBatch::new();
    first.recreate_skeleton(skeleton);
    ColdStart {
        skeleton: Some(first.into_batch()),
        plans: plans.into_iter(),
        budget,
    }
}

/// The iterator of [`cold_start`].
pub struct ColdStart<I> {
    skeleton: Option<Batch>,
    plans: I,
    budget: usize,
}

impl<I: Iterator<Item = ServicePlan>> Iterator for ColdStart<I> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if let Some(skeleton) = self.skeleton.take() {
            return Some(skeleton);
        }
        let mut batch = PlanBatch::new();
        for plan in self.plans.by_ref() {
            batch.add_service(&plan);
            if batch.len() >= self.budget {
                break;
            }
        }
        (!batch.is_empty()).then(|| batch.into_batch())
    }
}
