//! What other programs leave on a node nodus takes over, removed by `nodus cleanup
//! --foreign` (or `--kube-proxy`): their nftables tables, and the chains of their
//! iptables rules with the jumps to them from the base chains. Which tables and chains
//! are whose is the caller's to say; kube-proxy's iptables chains are named here
//! (checklist K.65), since the kubelet's (`KUBE-FIREWALL`, `KUBE-KUBELET-CANARY`,
//! `KUBE-IPTABLES-HINT`) share their prefix and must stay. Every rule of other programs
//! stays.
//!
//! The iptables half goes through `iptables-save` and `iptables-restore --noflush` (and
//! their `ip6` twins), as kube-proxy's own cleanup does: they speak whichever backend
//! (legacy or nft) wrote the rules. Without those programs there is nothing of that
//! kind to remove, or no way to; either way it is reported, never guessed at.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::apply::Error;
use crate::nft::{Family, Socket, Table};

/// Chains kube-proxy's iptables mode creates by name.
const FIXED_CHAINS: [&str; 9] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-MARK-MASQ",
    "KUBE-PROXY-CANARY",
    "KUBE-LOAD-BALANCER",
];

/// Prefixes of its per-service and per-endpoint chains.
const PER_SERVICE_PREFIXES: [&str; 6] = [
    "KUBE-SVC-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-XLB-",
    "KUBE-EXT-",
    "KUBE-SVL-",
];

/// Whether kube-proxy's iptables mode made the chain `name` (the kubelet's are not).
pub fn is_kube_proxy_chain(name: &str) -> bool {
    FIXED_CHAINS.contains(&name) || PER_SERVICE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The tables named `name` in the `ip` and `ip6` families.
pub fn tables_named(name: &str) -> [Table; 2] {
    [Family::Ip, Family::Ip6].map(|family| Table {
        family,
        name: name.into(),
    })
}

/// `table ip kube-proxy`.
pub fn describe(table: &Table) -> String {
    format!("table {} {}", table.family.name(), table.name)
}

/// Those of `tables` for which `act` (on a socket in the calling thread's network
/// namespace) says yes; `doing` names the act in an error.
fn tables_where(
    tables: &[Table],
    doing: &str,
    act: impl Fn(&mut Socket, &Table) -> crate::nft::Result<bool>,
) -> Result<Vec<Table>, Error> {
    let mut socket = Socket::open().map_err(Error::Open)?;
    let mut chosen = Vec::new();
    for table in tables {
        if act(&mut socket, table)
            .map_err(Error::netlink(format!("{doing} {}", describe(table))))?
        {
            chosen.push(table.clone());
        }
    }
    Ok(chosen)
}

/// Those of `tables` that exist.
pub fn existing_tables(tables: &[Table]) -> Result<Vec<Table>, Error> {
    tables_where(tables, "looking for", Socket::table_exists)
}

/// Deletes `tables`; the ones that were there.
pub fn remove_tables(tables: &[Table]) -> Result<Vec<Table>, Error> {
    tables_where(tables, "deleting", Socket::delete_table_if_exists)
}

/// The chains that go from one iptables backend's rules, and how.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// `table/chain`.
    pub chains: Vec<String>,
    /// The `iptables-restore --noflush` input that removes them.
    script: String,
}

/// The removal of the chains `owned` accepts from an `iptables-save` listing. Jumps to
/// them are deleted first (from any chain that stays), then every one of them is
/// flushed, then deleted, so that no chain is deleted while another still refers to it.
pub fn removal_script(saved: &str, owned: impl Fn(&str) -> bool) -> Removal {
    let mut tables: Vec<TableRemoval<'_>> = Vec::new();
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push(TableRemoval {
                name,
                chains: Vec::new(),
                jumps: Vec::new(),
            });
        } else if let Some(table) = tables.last_mut() {
            if let Some(chain) = line.strip_prefix(':') {
                let chain = chain.split_whitespace().next().unwrap_or_default();
                if owned(chain) {
                    table.chains.push(chain);
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let owner = rule.split_whitespace().next().unwrap_or_default();
                if !owned(owner) && jump_target(rule).is_some_and(&owned) {
                    table.jumps.push(rule);
                }
            }
        }
    }
    let mut removal = Removal::default();
    for table in tables.iter().filter(|table| !table.chains.is_empty()) {
        let chains = table.chains.iter();
        removal
            .chains
            .extend(chains.map(|chain| format!("{}/{chain}", table.name)));
        table.write(&mut removal.script);
    }
    removal
}

/// What goes from one table of an `iptables-save` listing.
struct TableRemoval<'s> {
    name: &'s str,
    /// The chains that go.
    chains: Vec<&'s str>,
    /// Rules of other chains that jump to them, as listed after `-A `.
    jumps: Vec<&'s str>,
}

impl TableRemoval<'_> {
    fn write(&self, script: &mut String) {
        script.push_str(&format!("*{}\n", self.name));
        for rule in &self.jumps {
            script.push_str(&format!("-D {rule}\n"));
        }
        for chain in &self.chains {
            script.push_str(&format!("-F {chain}\n"));
        }
        for chain in &self.chains {
            script.push_str(&format!("-X {chain}\n"));
        }
        script.push_str("COMMIT\n");
    }
}

/// The chain a rule jumps or goes to (`-j X`, `-g X`).
fn jump_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "-g" {
            return words.next();
        }
    }
    None
}

/// The removal of the chains `owned` accepts from what `program` (`iptables`,
/// `ip6tables`, or a backend's own such as `iptables-legacy`) lists; `Ok(None)` when
/// `<program>-save` is not installed.
pub fn chains_to_remove(
    program: &str,
    owned: impl Fn(&str) -> bool,
) -> std::io::Result<Option<Removal>> {
    let save = format!("{program}-save");
    match Command::new(&save).stderr(Stdio::piped()).output() {
        Ok(output) if output.status.success() => Ok(Some(removal_script(
            &String::from_utf8_lossy(&output.stdout),
            owned,
        ))),
        Ok(output) => Err(std::io::Error::other(format!(
            "{save}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(std::io::Error::other(format!("{save}: {error}"))),
    }
}

/// Removes the chains `owned` accepts with `program`; the chains removed (none when
/// there were none, or no such program).
pub fn remove_chains(program: &str, owned: impl Fn(&str) -> bool) -> std::io::Result<Vec<String>> {
    let removal = chains_to_remove(program, owned)?.unwrap_or_default();
    if removal.chains.is_empty() {
        return Ok(Vec::new());
    }
    let restore = format!("{program}-restore");
    let mut child = Command::new(&restore)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| std::io::Error::other(format!("{restore}: {error}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(removal.script.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        return Err(std::io::Error::other(format!(
            "{restore} refused the removal: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(removal.chains)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `iptables-save` of a node where kube-proxy ran in iptables mode beside the
    /// kubelet and another program.
    const SAVED: &str = "\
# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:OTHER - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A INPUT -j OTHER
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-ABC - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XYZ - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-XYZ
-A KUBE-SVC-XYZ -j KUBE-SEP-ABC
-A KUBE-SEP-ABC -p tcp -j DNAT --to-destination 10.0.0.5:6443
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
";

    #[test]
    fn k65_kube_proxys_chains_and_their_jumps_go_the_kubelets_and_others_stay() {
        let removal = removal_script(SAVED, is_kube_proxy_chain);
        assert_eq!(removal.chains.len(), 8);
        assert_eq!(removal.chains[0], "filter/KUBE-FORWARD");
        assert_eq!(
            removal.script,
            "*filter\n\
             -D INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
             -D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -F KUBE-FORWARD\n-F KUBE-PROXY-FIREWALL\n-F KUBE-SERVICES\n\
             -X KUBE-FORWARD\n-X KUBE-PROXY-FIREWALL\n-X KUBE-SERVICES\n\
             COMMIT\n\
             *nat\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             -F KUBE-MARK-MASQ\n-F KUBE-POSTROUTING\n-F KUBE-SEP-ABC\n-F KUBE-SERVICES\n-F KUBE-SVC-XYZ\n\
             -X KUBE-MARK-MASQ\n-X KUBE-POSTROUTING\n-X KUBE-SEP-ABC\n-X KUBE-SERVICES\n-X KUBE-SVC-XYZ\n\
             COMMIT\n"
        );
        let nothing = "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(
            removal_script(nothing, is_kube_proxy_chain),
            Removal::default()
        );
    }
}
