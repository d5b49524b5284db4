//! Address ranges: CIDRs and addresses merged into sorted, disjoint intervals. The proxy's
//! interval sets need them (the kernel refuses overlapping intervals in one set, and CIDRs
//! from users may overlap or repeat), and DNS's allow-list is looked up in them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{Cidr, Family};

/// The inclusive ranges covered by `cidrs` and `addresses` of `family`, sorted, with
/// overlapping and adjacent ranges merged.
pub fn merged_ranges(
    cidrs: &[Cidr],
    addresses: &[IpAddr],
    family: Family,
) -> Vec<(IpAddr, IpAddr)> {
    let ranges: Vec<(u128, u128)> = cidrs
        .iter()
        .filter(|cidr| cidr.family() == family)
        .map(|cidr| cidr_bounds(*cidr))
        .chain(
            addresses
                .iter()
                .filter(|ip| Family::of(**ip) == family)
                .map(|ip| (to_number(*ip), to_number(*ip))),
        )
        .collect();
    into_addresses(merge(ranges), family)
}

/// `ranges` (inclusive, of both families) sorted, with overlapping and adjacent ones of
/// a family merged: the IPv4 ones first.
pub fn merge_ranges(ranges: impl IntoIterator<Item = (IpAddr, IpAddr)>) -> Vec<(IpAddr, IpAddr)> {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for (start, end) in ranges {
        let numbers = (to_number(start), to_number(end));
        match Family::of(start) {
            Family::V4 => v4.push(numbers),
            Family::V6 => v6.push(numbers),
        }
    }
    let mut merged = into_addresses(merge(v4), Family::V4);
    merged.extend(into_addresses(merge(v6), Family::V6));
    merged
}

fn merge(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The inclusive ranges of `cidr` less the `except` ranges inside it (a NetworkPolicy's
/// `ipBlock`), sorted and disjoint.
pub fn block_ranges(cidr: Cidr, except: &[Cidr]) -> Vec<(IpAddr, IpAddr)> {
    let family = cidr.family();
    let holes = merged_ranges(except, &[], family);
    let (mut next, end) = cidr_bounds(cidr);
    let mut ranges = Vec::new();
    for (hole_start, hole_end) in holes.into_iter().map(|(s, e)| (to_number(s), to_number(e))) {
        if hole_end < next || hole_start > end {
            continue;
        }
        if hole_start > next {
            ranges.push((next, hole_start - 1));
        }
        match hole_end.checked_add(1) {
            Some(after) => next = after,
            None => return into_addresses(ranges, family),
        }
    }
    if next <= end {
        ranges.push((next, end));
    }
    into_addresses(ranges, family)
}

fn into_addresses(ranges: Vec<(u128, u128)>, family: Family) -> Vec<(IpAddr, IpAddr)> {
    ranges
        .into_iter()
        .map(|(start, end)| (from_number(start, family), from_number(end, family)))
        .collect()
}

fn width(family: Family) -> u32 {
    match family {
        Family::V4 => 32,
        Family::V6 => 128,
    }
}

fn cidr_bounds(cidr: Cidr) -> (u128, u128) {
    let host_bits = width(cidr.family()) - u32::from(cidr.prefix);
    let host_mask = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
    let start = to_number(cidr.addr) & !host_mask;
    (start, start | host_mask)
}

pub fn to_number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(ip) => u128::from(u32::from(ip)),
        IpAddr::V6(ip) => u128::from(ip),
    }
}

pub fn from_number(number: u128, family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(number).unwrap_or(u32::MAX))),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(number)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().expect("cidr")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge() {
        let cidrs = [
            cidr("10.0.1.0/24"),
            cidr("10.0.0.0/16"),
            cidr("192.168.0.0/25"),
            cidr("192.168.0.128/25"),
            cidr("fd00::/64"),
        ];
        let merged = merged_ranges(&cidrs, &[ip("203.0.113.7")], Family::V4);
        assert_eq!(
            merged,
            [
                (ip("10.0.0.0"), ip("10.0.255.255")),
                (ip("192.168.0.0"), ip("192.168.0.255")),
                (ip("203.0.113.7"), ip("203.0.113.7")),
            ]
        );
        assert_eq!(
            merged_ranges(&[cidr("0.0.0.0/0")], &[], Family::V4),
            [(ip("0.0.0.0"), ip("255.255.255.255"))]
        );
        assert_eq!(
            block_ranges(
                cidr("10.0.0.0/16"),
                &[
                    cidr("10.0.1.0/24"),
                    cidr("10.0.0.0/24"),
                    cidr("10.0.255.0/24")
                ]
            ),
            [(ip("10.0.2.0"), ip("10.0.254.255"))]
        );
        assert_eq!(
            block_ranges(cidr("0.0.0.0/0"), &[cidr("10.0.0.0/8")]),
            [
                (ip("0.0.0.0"), ip("9.255.255.255")),
                (ip("11.0.0.0"), ip("255.255.255.255"))
            ]
        );
        assert_eq!(block_ranges(cidr("10.0.0.0/8"), &[cidr("10.0.0.0/8")]), []);
        assert_eq!(
            merged_ranges(&cidrs, &[], Family::V6),
            [(ip("fd00::"), ip("fd00::ffff:ffff:ffff:ffff"))]
        );
    }
}
