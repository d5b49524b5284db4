//! A set of ours in the kernel against its plan: what to delete and what to add so that it
//! holds the plan's elements and nothing else, leaving those in place alone.
//!
//! A full sync brings the skeleton's own sets (NodePort addresses, pod and cluster ranges)
//! and the NetworkPolicy sets up to date this way, so that an adoption after a restart that
//! finds them right sends none of their elements: the kernel removes an element of a
//! `pipapo` set at a cost that grows with the set, and an element removed and added again
//! loses its counter.
//!
//! Elements are compared by their key's bytes and their end's: a concatenation's range
//! carries its inclusive end with it (`NFTA_SET_ELEM_KEY_END`), and a one-field range is two
//! elements in the kernel, its start and, flagged as an end, the first value past it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::{Error, Proxy};
use crate::nft::{Element, ListedElement, Table, Tuple};
use crate::plan::{PlanBatch, SetDifference, SetPlan, Skeleton, TABLE};

impl Proxy {
    /// A transaction that brings an existing table's skeleton up to date
    /// ([`PlanBatch::refresh_skeleton`]), its own sets by what differs.
    pub(super) fn skeleton_refresh(&mut self, skeleton: &Skeleton) -> Result<PlanBatch, Error> {
        let mut differences = HashMap::new();
        for set in skeleton.own_sets() {
            if let Some(difference) = self.set_difference(set)? {
                differences.insert(set.set.name.as_str(), difference);
            }
        }
        let mut batch = PlanBatch::new();
        batch.refresh_skeleton(skeleton, &differences);
        Ok(batch)
    }

    /// What turns the kernel's elements of `set` into its plan's. `None` when the kernel
    /// holds an element that cannot be told apart or deleted one by one (a key this set's
    /// type cannot hold, as another version might have left; a one-field range of the
    /// plan's gone, or an end without its start): then the set is refilled. Only the
    /// kernel's elements are hashed, and the plan's are copied only when some of them are
    /// in place already, so a cold start holds no second copy of the elements.
    pub(super) fn set_difference<'p>(
        &mut self,
        set: &'p SetPlan,
    ) -> Result<Option<SetDifference<'p>>, Error> {
        let table = Table::inet(TABLE);
        let step = || Error::netlink(format!("reading the set {}", set.set.name));
        let ranges = set.set.flags.interval && !set.set.key.is_concat();
        let mut listed = HashSet::new();
        let mut range_bounds = Vec::new();
        let read = self.socket.each_element(&table, &set.set.name, |element| {
            if ranges {
                range_bounds.push((element.key, element.interval_end))
            } else {
                listed.insert(element_id(&element.key, element.key_end.as_deref()));
            }
        });
        match read {
            Err(missing) if missing.is_missing() => {}
            read => read.map_err(step())?,
        }
        if ranges {
            match one_field_ranges(range_bounds) {
                Some(ids) => listed = ids,
                None => return Ok(None),
            }
        }
        let missing: Vec<&Element> = set
            .elements
            .iter()
            .filter(|element| !listed.remove(&planned_id(element, ranges)))
            .collect();
        let came = if missing.len() == set.elements.len() {
            Cow::Borrowed(&set.elements[..])
        } else {
            Cow::Owned(missing.into_iter().cloned().collect())
        };
        if listed.is_empty() {
            return Ok(Some(SetDifference {
                gone: Vec::new(),
                came,
            }));
        }
        if ranges {
            return Ok(None);
        }
        // What is left of the kernel's elements goes: read again for their keys.
        let mut gone = Vec::new();
        let mut unreadable = false;
        self.socket
            .each_element(&table, &set.set.name, |element| {
                if !listed.contains(&element_id(&element.key, element.key_end.as_deref())) {
                    return;
                }
                match deletable(set, element) {
                    Some(element) => gone.push(element),
                    None => unreadable = true,
                }
            })
            .map_err(step())?;
        Ok((!unreadable).then_some(SetDifference { gone, came }))
    }
}

/// A listed element of `set` as one to delete, if its key (and end) read back.
fn deletable(set: &SetPlan, element: ListedElement) -> Option<Element> {
    let key = Tuple::from_bytes(&set.set.key, &element.key)?;
    Some(match element.key_end {
        Some(end) => Element::range(key, Tuple::from_bytes(&set.set.key, &end)?),
        None => Element::new(key),
    })
}

/// The ranges of a one-field interval set from its listed bounds (key, whether an end):
/// each start with the end that follows it, or none for a range to the top of the type.
/// `None` when the bounds do not pair so.
fn one_field_ranges(mut bounds: Vec<(Vec<u8>, bool)>) -> Option<HashSet<u64>> {
    bounds.sort_unstable();
    let mut ids = HashSet::new();
    let mut bounds = bounds.into_iter().peekable();
    while let Some((start, is_end)) = bounds.next() {
        if is_end {
            return None;
        }
        let end = bounds.next_if(|(_, is_end)| *is_end).map(|(end, _)| end);
        if end.is_none() && bounds.peek().is_some() {
            return None;
        }
        ids.insert(element_id(&start, end.as_deref()));
    }
    Some(ids)
}

/// Which element of the plan's this is, as [`element_id`] sees the kernel's: a one-field
/// range by its start and the first value past it.
fn planned_id(element: &Element, ranges: bool) -> u64 {
    let end = if ranges {
        element
            .key_end
            .as_ref()
            .and_then(|last| last.0.first()?.successor())
            .map(|past| Tuple::from(past).to_bytes())
    } else {
        element.key_end.as_ref().map(Tuple::to_bytes)
    };
    element_id(&element.key.to_bytes(), end.as_deref())
}

/// Which element a key and an end are, in the kernel's bytes.
fn element_id(key: &[u8], end: Option<&[u8]>) -> u64 {
    let mut hasher = DefaultHasher::new();
    (key, end).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::Value;
    use std::net::Ipv4Addr;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Value {
        Value::Ipv4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn one_field_ranges_pair_each_start_with_the_end_past_it() {
        let range = Element::range(v4(10, 244, 0, 0), v4(10, 244, 255, 255));
        let top = Element::range(v4(224, 0, 0, 0), v4(255, 255, 255, 255));
        // Listed in no particular order, as a dump may give them.
        let listed = vec![
            (vec![224, 0, 0, 0], false),
            (vec![10, 245, 0, 0], true),
            (vec![10, 244, 0, 0], false),
        ];
        let ids = one_field_ranges(listed).expect("pairs");
        assert_eq!(
            ids,
            HashSet::from([planned_id(&range, true), planned_id(&top, true)])
        );
        let single = Element::range(v4(10, 0, 0, 1), v4(10, 0, 0, 1));
        let ids = one_field_ranges(vec![(vec![10, 0, 0, 1], false), (vec![10, 0, 0, 2], true)]);
        assert_eq!(ids, Some(HashSet::from([planned_id(&single, true)])));
        assert_eq!(one_field_ranges(vec![(vec![10, 0, 0, 2], true)]), None);
        assert_eq!(
            one_field_ranges(vec![(vec![10, 0, 0, 1], false), (vec![10, 0, 0, 9], false)]),
            None,
            "a start without its end before another start"
        );
    }

    #[test]
    fn concatenated_ranges_are_told_by_key_and_inclusive_end() {
        let key = Tuple(vec![v4(10, 0, 0, 1), Value::TCP]);
        let end = Tuple(vec![v4(10, 0, 0, 9), Value::TCP]);
        let element = Element::range(key.clone(), end.clone());
        assert_eq!(
            planned_id(&element, false),
            element_id(&key.to_bytes(), Some(&end.to_bytes()))
        );
        assert_ne!(
            planned_id(&element, false),
            element_id(&key.to_bytes(), None)
        );
    }
}
