//! Static host records, as CoreDNS's `hosts` plugin: names outside the cluster zone answered
//! from configured lines and from a hosts file that is read again when it changes (k3s's
//! `NodeHosts`, mounted from the `coredns` ConfigMap).
//!
//! A name held here answers its addresses, or no record for another type, as the plugin
//! does; its addresses answer PTR with the first name given for them. Every other name goes
//! on to the upstreams.

use crate::lookup::{Answer, reverse_address};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, PTR};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// The TTL of host records (k3s's Corefile: `hosts … { ttl 60 }`).
const TTL: u32 = 60;
/// Lines past this many are left out: a hosts file is a handful of names, not a zone.
const MAX_LINES: usize = 10_000;

/// Names and addresses, both ways.
#[derive(Debug, Default)]
pub struct Hosts {
    addresses: HashMap<Name, Vec<IpAddr>>,
    names: HashMap<IpAddr, Name>,
}

impl Hosts {
    /// Reads hosts-file lines (`address name [alias…]`, `#` comments). A line that does not
    /// read is left out and counted in the second value.
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> (Hosts, usize) {
        let mut hosts = Hosts::default();
        let mut skipped = 0;
        for line in lines.into_iter().take(MAX_LINES) {
            let line = line.split('#').next().unwrap_or_default();
            let mut fields = line.split_whitespace();
            let Some(first) = fields.next() else {
                continue;
            };
            let address = first.split('%').next().unwrap_or(first).parse::<IpAddr>();
            let names: Option<Vec<Name>> = fields
                .map(|name| {
                    let mut name = Name::from_ascii(name).ok()?.to_lowercase();
                    name.set_fqdn(true);
                    Some(name)
                })
                .collect();
            let (Ok(address), Some(names)) = (address, names.filter(|n| !n.is_empty())) else {
                skipped += 1;
                continue;
            };
            hosts
                .names
                .entry(address)
                .or_insert_with(|| names[0].clone());
            for name in names {
                let addresses = hosts.addresses.entry(name).or_default();
                if !addresses.contains(&address) {
                    addresses.push(address);
                }
            }
        }
        (hosts, skipped)
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// The answer for `qname` (as asked, for the records' owner) if this holds it.
    pub fn answer(&self, qname: &Name, qtype: RecordType) -> Option<Answer> {
        let lower = qname.to_lowercase();
        let records: Vec<Record> = if let Some(addresses) = self.addresses.get(&lower) {
            addresses
                .iter()
                .filter_map(|address| match (address, qtype) {
                    (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(*v4))),
                    (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
                    _ => None,
                })
                .map(|data| Record::from_rdata(qname.clone(), TTL, data))
                .collect()
        } else {
            let name = self.names.get(&reverse_address(&lower)?)?;
            match qtype {
                RecordType::PTR => vec![Record::from_rdata(
                    qname.clone(),
                    TTL,
                    RData::PTR(PTR(name.clone())),
                )],
                _ => Vec::new(),
            }
        };
        Some(Answer {
            rcode: ResponseCode::NoError,
            answers: records,
            authority: Vec::new(),
            additionals: Vec::new(),
        })
    }
}

/// Host records from `dns.hosts` and a file, read again when the file changes.
pub struct HostsSource {
    inline: Vec<String>,
    file: Option<PathBuf>,
    current: RwLock<Arc<Hosts>>,
    /// The file's modification time and length (None without a file) when it was last
    /// read; None before the first read.
    read: Mutex<Option<Option<(SystemTime, u64)>>>,
}

impl HostsSource {
    /// Reads `inline` lines and `file` now; a file that cannot be read is logged, and read
    /// again at the next [`HostsSource::reload`].
    pub fn new(inline: Vec<String>, file: Option<PathBuf>) -> HostsSource {
        let source = HostsSource {
            inline,
            file,
            current: RwLock::new(Arc::default()),
            read: Mutex::new(None),
        };
        source.reload();
        source
    }

    pub fn current(&self) -> Arc<Hosts> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the file again if its modification time or length changed since it was read
    /// (or it appeared or went); true when the records were rebuilt.
    pub fn reload(&self) -> bool {
        let stamp = self.file.as_ref().and_then(|file| {
            let meta = std::fs::metadata(file).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        });
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if read.as_ref() == Some(&stamp) {
            return false;
        }
        let text = match (&self.file, stamp) {
            (Some(file), Some(_)) => match std::fs::read_to_string(file) {
                Ok(text) => text,
                Err(error) => {
                    tracing::warn!(file = %file.display(), %error, "reading the hosts file");
                    return false;
                }
            },
            _ => String::new(),
        };
        *read = Some(stamp);
        let lines = self.inline.iter().map(String::as_str).chain(text.lines());
        let (hosts, skipped) = Hosts::parse(lines);
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "host records: lines that are not `address name…` left out"
            );
        }
        tracing::info!(names = hosts.addresses.len(), "host records read");
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(hosts);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Name {
        Name::from_ascii(text).expect("name")
    }

    fn rdata(answer: Option<Answer>) -> Vec<String> {
        answer
            .expect("held")
            .answers
            .iter()
            .map(|r| r.data.to_string())
            .collect()
    }

    #[test]
    fn host_lines_answer_both_ways() {
        let (hosts, skipped) = Hosts::parse(
            "# NodeHosts\n10.0.0.1 node-1 node-1.lan\n10.0.0.2 node-2 # second\n\
             fd00::1 node-1\nnot-an-address x\n10.0.0.3\n10.0.0.4 bad..name\n\n"
                .lines(),
        );
        assert_eq!(skipped, 3);
        assert_eq!(
            rdata(hosts.answer(&name("Node-1."), RecordType::A)),
            ["10.0.0.1"]
        );
        assert_eq!(
            rdata(hosts.answer(&name("node-1."), RecordType::AAAA)),
            ["fd00::1"]
        );
        assert_eq!(
            rdata(hosts.answer(&name("node-1.lan."), RecordType::A)),
            ["10.0.0.1"]
        );
        assert!(
            rdata(hosts.answer(&name("node-2."), RecordType::AAAA)).is_empty(),
            "a held name answers no record for another type"
        );
        assert_eq!(
            rdata(hosts.answer(&name("1.0.0.10.in-addr.arpa."), RecordType::PTR)),
            ["node-1."],
            "the first name of its line"
        );
        assert!(hosts.answer(&name("node-3."), RecordType::A).is_none());
        assert!(
            hosts
                .answer(&name("9.0.0.10.in-addr.arpa."), RecordType::PTR)
                .is_none()
        );
    }

    #[test]
    fn the_file_is_read_again_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("nodus-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("NodeHosts");
        let _ = std::fs::remove_file(&file);
        let source = HostsSource::new(vec!["10.1.0.1 registry.lan".into()], Some(file.clone()));
        let held = |n: &str| source.current().answer(&name(n), RecordType::A).is_some();
        assert!(held("registry.lan.") && !held("node-1."), "no file yet");
        std::fs::write(&file, "10.0.0.1 node-1\n").expect("write");
        assert!(source.reload());
        assert!(held("registry.lan.") && held("node-1."));
        assert!(!source.reload(), "unchanged");
        std::fs::write(&file, "10.0.0.2 node-2 node-2b\n").expect("write");
        assert!(source.reload());
        assert!(held("node-2.") && !held("node-1."));
        std::fs::remove_file(&file).expect("remove");
        assert!(source.reload());
        assert!(held("registry.lan.") && !held("node-2."));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
