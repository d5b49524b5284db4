//! `dig`'s output, read the one way every test reads it: the status, the header flags and
//! the record lines of each section (with `+noall +answer`, every record line is an
//! answer).

use std::net::SocketAddr;
use std::process::Command;

/// What `dig` printed, reduced to what tests compare.
#[derive(Clone, Debug, Default)]
pub struct DigReply {
    /// `NOERROR`, `NXDOMAIN`…; empty when dig printed no header (a timeout).
    pub status: String,
    /// The header flags: `qr aa rd`.
    pub flags: String,
    pub answers: Vec<String>,
    pub authority: Vec<String>,
    pub additional: Vec<String>,
    /// Both streams as printed: dig warns of a malformed reply on either.
    pub raw: String,
}

impl DigReply {
    pub fn parse(raw: &str) -> DigReply {
        let after = |marker: &str, end: char| {
            raw.split(marker)
                .nth(1)
                .and_then(|s| s.split(end).next())
                .unwrap_or("")
                .to_string()
        };
        let records = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
                .map(str::to_string)
                .collect()
        };
        let section = |name: &str| -> Vec<String> {
            raw.split(&format!(";; {name} SECTION:\n"))
                .nth(1)
                .map(|s| records(s.split("\n\n").next().unwrap_or("")))
                .unwrap_or_default()
        };
        // `+noall +answer` prints no section headers, only the answers.
        let answers = if raw.contains(" SECTION:\n") {
            section("ANSWER")
        } else {
            records(raw)
        };
        DigReply {
            status: after("status: ", ','),
            flags: after("flags: ", ';'),
            answers,
            authority: section("AUTHORITY"),
            additional: section("ADDITIONAL"),
            raw: raw.to_string(),
        }
    }

    /// Each answer as `TYPE DATA` (without name, TTL and class), sorted.
    pub fn typed_data(&self) -> Vec<String> {
        self.answer_fields(3)
    }

    /// Each answer's data alone, sorted.
    pub fn data(&self) -> Vec<String> {
        self.answer_fields(4)
    }

    fn answer_fields(&self, skipped: usize) -> Vec<String> {
        let mut data: Vec<String> = self
            .answers
            .iter()
            .map(|l| {
                l.split_whitespace()
                    .skip(skipped)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        data.sort();
        data
    }
}

/// `dig @server -p port +tries=1 +time=3 ARGS` from this namespace.
pub fn dig(server: SocketAddr, args: &[&str]) -> DigReply {
    let output = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+tries=1", "+time=3"])
        .args(args)
        .output()
        .expect("dig is installed (dnsutils)");
    DigReply::parse(&format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
