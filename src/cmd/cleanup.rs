//! `nodus cleanup`: remove what nodus programmed on this host, or, with `--foreign` (or
//! `--kube-proxy`), what the programs nodus replaces left behind: kube-proxy's and
//! flannel's nftables tables, iptables chains, devices and CNI configuration, listed
//! before anything is removed.

use crate::config::Config;
use nodus_proxy::leftovers;
use nodus_proxy::nft::Table;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A program nodus replaces, by what it leaves on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    KubeProxy,
    Flannel,
}

/// The iptables programs, one per family and backend, whose chains are looked at.
const IPTABLES: [&str; 4] = [
    "iptables",
    "ip6tables",
    "iptables-legacy",
    "ip6tables-legacy",
];

impl Foreign {
    pub const ALL: [Foreign; 2] = [Foreign::KubeProxy, Foreign::Flannel];

    fn name(self) -> &'static str {
        match self {
            Foreign::KubeProxy => "kube-proxy",
            Foreign::Flannel => "flannel",
        }
    }

    /// Its nftables tables, `ip` and `ip6`, named as itself (kube-proxy's nftables mode,
    /// flannel's `EnableNFTables`).
    fn tables(self) -> [Table; 2] {
        leftovers::tables_named(self.name())
    }

    fn owns_chain(self, chain: &str) -> bool {
        match self {
            Foreign::KubeProxy => leftovers::is_kube_proxy_chain(chain),
            // Its masquerade and forwarding chains (`FLANNEL-POSTRTG`, `FLANNEL-FWD`).
            Foreign::Flannel => chain.starts_with("FLANNEL-"),
        }
    }

    /// Its links: the dummy device of kube-proxy's IPVS mode; flannel's VXLAN and
    /// WireGuard devices and the bridge its `bridge` CNI plugin makes.
    fn links(self) -> &'static [&'static str] {
        match self {
            Foreign::KubeProxy => &["kube-ipvs0"],
            Foreign::Flannel => &[
                "flannel.1",
                "flannel-v6.1",
                "flannel-wg",
                "flannel-wg-v6",
                "cni0",
            ],
        }
    }

    /// Whether it writes the CNI configuration file `name`.
    fn writes_cni_config(self, name: &str) -> bool {
        self == Foreign::Flannel
            && name.contains("flannel")
            && (name.ends_with(".conflist") || name.ends_with(".conf"))
    }
}

/// Asks `question` on the terminal; refuses off a terminal, since nothing said yes.
fn confirmed(question: &str) -> anyhow::Result<bool> {
    use std::io::IsTerminal;
    anyhow::ensure!(
        std::io::stdin().is_terminal(),
        "refusing to remove anything without --yes when not on a terminal"
    );
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    let yes = matches!(answer.trim(), "y" | "Y" | "yes");
    if !yes {
        println!("nothing removed");
    }
    Ok(yes)
}

/// Deletes the proxy's table, the mesh's device and the CNI conflist, after asking on a
/// terminal unless `yes`. Services and pod traffic between nodes stop at once on this
/// node, which is why it asks.
pub async fn own(yes: bool, config: &Config) -> anyhow::Result<()> {
    let mesh = &config.mesh;
    let question = format!(
        "Remove the nftables table inet nodus, the WireGuard device {} and {}? Services and \
         pod traffic between nodes stop working on this node.",
        mesh.interface,
        mesh.cni_conflist.display()
    );
    if !yes && !confirmed(&question)? {
        return Ok(());
    }
    if nodus_proxy::apply::cleanup()? {
        println!("removed table inet nodus")
    } else {
        println!("no table inet nodus; nothing to remove")
    }
    let removed = nodus_mesh::cleanup::remove(&mesh.interface, &mesh.cni_conflist)
        .await
        .map_err(|error| anyhow::anyhow!("removing the mesh: {error}"))?;
    if removed.device {
        println!("removed WireGuard device {} and its routes", mesh.interface)
    } else {
        println!("no WireGuard device {}", mesh.interface)
    }
    if removed.conflist {
        println!("removed {}", mesh.cni_conflist.display())
    } else {
        println!("no {}", mesh.cni_conflist.display())
    }
    Ok(())
}

/// What `programs` left on this host.
#[derive(Default)]
struct Leftovers {
    tables: Vec<Table>,
    /// By iptables program, the chains (`table/chain`) that go.
    chains: Vec<(&'static str, Vec<String>)>,
    links: Vec<String>,
    files: Vec<PathBuf>,
}

impl Leftovers {
    async fn find(programs: &[Foreign], cni_dir: &Path) -> anyhow::Result<Leftovers> {
        let tables: Vec<Table> = programs.iter().flat_map(|p| p.tables()).collect();
        let tables = leftovers::existing_tables(&tables)
            .map_err(|error| anyhow::anyhow!("looking for nftables tables: {error}"))?;
        let mut chains = Vec::new();
        for program in IPTABLES {
            let removal = leftovers::chains_to_remove(program, |c| owned(programs, c))
                .map_err(|error| anyhow::anyhow!("listing the chains of {program}: {error}"))?;
            if let Some(removal) = removal.filter(|r| !r.chains.is_empty()) {
                chains.push((program, removal.chains));
            }
        }
        let names: Vec<&str> = programs.iter().flat_map(|p| p.links()).copied().collect();
        let links = nodus_mesh::cleanup::existing_links(&names)
            .await
            .map_err(|error| anyhow::anyhow!("looking for links: {error}"))?;
        let mut files = Vec::new();
        // No CNI directory: nothing of theirs in it.
        for entry in std::fs::read_dir(cni_dir).into_iter().flatten() {
            let entry = entry.map_err(|error| {
                anyhow::anyhow!("reading the CNI directory {}: {error}", cni_dir.display())
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if programs.iter().any(|p| p.writes_cni_config(&name)) {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(Leftovers {
            tables,
            chains,
            links,
            files,
        })
    }

    fn is_empty(&self) -> bool {
        self.tables.is_empty()
            && self.chains.is_empty()
            && self.links.is_empty()
            && self.files.is_empty()
    }

    /// One line each, as [`Leftovers::remove`] reports their removal.
    fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.tables.iter().map(leftovers::describe).collect();
        for (program, chains) in &self.chains {
            lines.push(chains_line(program, chains));
        }
        lines.extend(self.links.iter().map(|link| format!("link {link}")));
        lines.extend(self.files.iter().map(|file| file.display().to_string()));
        lines
    }

    /// Removes everything found, and says what went; a failure of one does not keep
    /// the others from going.
    async fn remove(&self, programs: &[Foreign]) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        match leftovers::remove_tables(&self.tables) {
            Ok(removed) => {
                for table in &removed {
                    println!("removed {}", leftovers::describe(table));
                }
            }
            Err(error) => failed.push(format!("nftables tables: {error}")),
        }
        for (program, _) in &self.chains {
            match leftovers::remove_chains(program, |c| owned(programs, c)) {
                Ok(chains) => println!("removed {}", chains_line(program, &chains)),
                Err(error) => failed.push(format!("{program}: {error}")),
            }
        }
        let links: Vec<&str> = self.links.iter().map(String::as_str).collect();
        match nodus_mesh::cleanup::remove_links(&links).await {
            Ok(removed) => {
                for link in removed {
                    println!("removed link {link}");
                }
            }
            Err(error) => failed.push(format!("links: {error}")),
        }
        for file in &self.files {
            match nodus_mesh::cleanup::remove_file_if_present(file) {
                Ok(_) => println!("removed {}", file.display()),
                Err(error) => failed.push(error.to_string()),
            }
        }
        anyhow::ensure!(
            failed.is_empty(),
            "not everything was removed: {}",
            failed.join("; ")
        );
        Ok(())
    }
}

/// Whether one of `programs` made the iptables chain `chain`.
fn owned(programs: &[Foreign], chain: &str) -> bool {
    programs.iter().any(|p| p.owns_chain(chain))
}

/// `iptables: 4 chains (nat/KUBE-SERVICES, …)`.
fn chains_line(program: &str, chains: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut names = chains
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if chains.len() > SHOWN {
        names.push_str(", …");
    }
    let plural = if chains.len() == 1 { "" } else { "s" };
    format!("{program}: {} chain{plural} ({names})", chains.len())
}

/// Lists what `programs` left on this host, then removes it after asking on a terminal
/// unless `yes`. CNI configuration is looked for beside the mesh's conflist.
pub async fn foreign(yes: bool, programs: &[Foreign], config: &Config) -> anyhow::Result<()> {
    let names: Vec<&str> = programs.iter().map(|p| p.name()).collect();
    let names = names.join(" and ");
    let cni_dir = config
        .mesh
        .cni_conflist
        .parent()
        .unwrap_or(Path::new("/etc/cni/net.d"));
    let found = Leftovers::find(programs, cni_dir).await?;
    if found.is_empty() {
        println!("nothing of {names} on this host");
        return Ok(());
    }
    println!("{names} left on this host:");
    for line in found.lines() {
        println!("  {line}");
    }
    let question = format!(
        "Remove them? Whatever still relies on {names} (Services it serves, pods on its \
         network) stops working on this node."
    );
    if !yes && !confirmed(&question)? {
        return Ok(());
    }
    found.remove(programs).await
}
