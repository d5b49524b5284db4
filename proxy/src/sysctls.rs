//! The sysctls the service proxy sets: kube-proxy's conntrack settings
//! (`conntrack.maxPerCore`, `min`, `tcpEstablishedTimeout`, `tcpCloseWaitTimeout`;
//! checklist I.56), written once the conntrack module is loaded, a value of 0 leaving that
//! setting alone as upstream; and `route_localnet` for localhost NodePorts (E.35).
//!
//! Two choices differ from kube-proxy on purpose: the table size is only ever raised,
//! never lowered below what an operator set; and the hash size, a module parameter
//! global to the host, is written only after `nf_conntrack_max` was, which succeeds only
//! in the host's own network namespace, so an agent in a test namespace never touches it.

use std::io;
use std::path::{Path, PathBuf};

/// What the proxy sets on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sysctls {
    pub conntrack: ConntrackSettings,
    /// `net.ipv4.conf.all.route_localnet`: a connection from 127.0.0.1 to a NodePort,
    /// DNATed to another host, may leave this one (it is masqueraded on the way).
    pub route_localnet: bool,
}

impl Sysctls {
    /// Writes what differs under `proc` (`/proc`) and `sys` (`/sys`); each change tried.
    pub fn apply(&self, proc: &Path, sys: &Path, cpus: usize) -> Vec<SysctlChange> {
        let mut changes = self.conntrack.apply(proc, sys, cpus);
        if self.route_localnet {
            write_if(
                &proc.join(ROUTE_LOCALNET),
                |current| current != 1,
                1,
                &mut changes,
            );
        }
        changes
    }
}

/// The conntrack settings, with kube-proxy's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Table entries per CPU.
    pub max_per_core: u32,
    /// The table's size at least (when `max_per_core` is set).
    pub min: u32,
    pub tcp_established_timeout_seconds: u32,
    pub tcp_close_wait_timeout_seconds: u32,
}

impl Default for ConntrackSettings {
    fn default() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: 32_768,
            min: 131_072,
            tcp_established_timeout_seconds: 86_400,
            tcp_close_wait_timeout_seconds: 3_600,
        }
    }
}

/// One setting written, or why not.
#[derive(Debug)]
pub struct SysctlChange {
    pub path: PathBuf,
    pub from: u64,
    pub to: u64,
    pub result: io::Result<()>,
}

const MAX: &str = "sys/net/netfilter/nf_conntrack_max";
const ESTABLISHED: &str = "sys/net/netfilter/nf_conntrack_tcp_timeout_established";
const CLOSE_WAIT: &str = "sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";
const ROUTE_LOCALNET: &str = "sys/net/ipv4/conf/all/route_localnet";
/// Under `/sys`, not `/proc`.
const HASH_SIZE: &str = "module/nf_conntrack/parameters/hashsize";

impl ConntrackSettings {
    /// The table size these settings ask for on a machine with `cpus` CPUs; 0 for none.
    pub fn max(&self, cpus: usize) -> u64 {
        match self.max_per_core {
            0 => 0,
            per_core => (u64::from(per_core) * cpus as u64).max(u64::from(self.min)),
        }
    }

    /// Writes what differs under `proc` (`/proc`) and `sys` (`/sys`), and returns each
    /// change tried; a setting that cannot be read (no conntrack module) is an error too.
    pub fn apply(&self, proc: &Path, sys: &Path, cpus: usize) -> Vec<SysctlChange> {
        let mut changes = Vec::new();
        let max = self.max(cpus);
        if max > 0 {
            let raised = write_if(&proc.join(MAX), |current| current < max, max, &mut changes);
            // The hash table holds a quarter of the entries, as upstream sizes it.
            if raised {
                write_if(
                    &sys.join(HASH_SIZE),
                    |current| current < max / 4,
                    max / 4,
                    &mut changes,
                );
            }
        }
        for (path, seconds) in [
            (ESTABLISHED, self.tcp_established_timeout_seconds),
            (CLOSE_WAIT, self.tcp_close_wait_timeout_seconds),
        ] {
            if seconds > 0 {
                let seconds = u64::from(seconds);
                write_if(
                    &proc.join(path),
                    |current| current != seconds,
                    seconds,
                    &mut changes,
                );
            }
        }
        changes
    }
}

/// Writes `value` to `path` when its current value passes `wanted`; whether it now holds
/// `value`.
fn write_if(
    path: &Path,
    wanted: impl Fn(u64) -> bool,
    value: u64,
    changes: &mut Vec<SysctlChange>,
) -> bool {
    let current = std::fs::read_to_string(path).and_then(|text| {
        text.trim()
            .parse::<u64>()
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
    });
    let from = match current {
        Ok(current) if !wanted(current) => return true,
        Ok(current) => current,
        Err(error) => {
            changes.push(SysctlChange {
                path: path.to_path_buf(),
                from: 0,
                to: value,
                result: Err(error),
            });
            return false;
        }
    };
    let result = std::fs::write(path, value.to_string());
    let written = result.is_ok();
    changes.push(SysctlChange {
        path: path.to_path_buf(),
        from,
        to: value,
        result,
    });
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` and a `/sys` of test files under a directory of the test's own.
    fn tree(test: &str, values: &[(&str, &str)]) -> (PathBuf, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("nodus-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (proc, sys) = (dir.join("proc"), dir.join("sys"));
        for (path, value) in values {
            let root = if path.starts_with("module/") {
                &sys
            } else {
                &proc
            };
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().expect("parent")).expect("dirs");
            std::fs::write(file, value).expect("value");
        }
        (dir, proc, sys)
    }

    fn read(root: &Path, path: &str) -> String {
        std::fs::read_to_string(root.join(path)).expect("read")
    }

    #[test]
    fn i56_the_table_is_raised_never_lowered_and_timeouts_set() {
        let settings = ConntrackSettings::default();
        assert_eq!(settings.max(2), 131_072, "the minimum wins on two CPUs");
        assert_eq!(settings.max(8), 262_144);
        let (dir, proc, sys) = tree(
            "sysctls-raised",
            &[
                (MAX, "65536\n"),
                (HASH_SIZE, "16384\n"),
                (ESTABLISHED, "432000\n"),
                (CLOSE_WAIT, "3600\n"),
            ],
        );
        let changes = settings.apply(&proc, &sys, 8);
        assert_eq!(changes.len(), 3, "{changes:?}: close-wait already right");
        assert!(changes.iter().all(|change| change.result.is_ok()));
        assert_eq!(read(&proc, MAX), "262144");
        assert_eq!(read(&sys, HASH_SIZE), "65536");
        assert_eq!(read(&proc, ESTABLISHED), "86400");

        std::fs::remove_dir_all(dir).expect("cleanup");
        let (dir, proc, sys) = tree(
            "sysctls-kept",
            &[(MAX, "1048576\n"), (HASH_SIZE, "262144\n")],
        );
        let changes = settings.apply(&proc, &sys, 8);
        assert_eq!(
            read(&proc, MAX),
            "1048576\n",
            "an operator's larger table stays"
        );
        assert_eq!(read(&sys, HASH_SIZE), "262144\n");
        // No conntrack timeouts to read: reported, not fatal.
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(changes.iter().all(|change| change.result.is_err()));

        let off = ConntrackSettings {
            max_per_core: 0,
            min: 0,
            tcp_established_timeout_seconds: 0,
            tcp_close_wait_timeout_seconds: 0,
        };
        assert!(
            off.apply(&proc, &sys, 8).is_empty(),
            "0 leaves everything alone"
        );
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    #[test]
    fn the_hash_size_follows_only_a_table_size_that_was_written() {
        let (dir, proc, sys) = tree("sysctls-hash", &[(HASH_SIZE, "1024\n")]);
        let changes = ConntrackSettings::default().apply(&proc, &sys, 2);
        assert!(changes[0].result.is_err(), "{changes:?}");
        assert_eq!(read(&sys, HASH_SIZE), "1024\n");
        std::fs::remove_dir_all(dir).expect("cleanup");
    }
}
