//! The harness's nftables table, owned: created at the start of a run, faults added and
//! flushed through it, deleted when it is dropped (also on an error or ctrl-c).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::rules;

/// The table of one run. Dropping it deletes the table.
#[derive(Debug)]
pub struct Firewall {
    _private: (),
}

/// Runs `script` through `nft -f -` (one transaction: all of it or none).
pub fn nft(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e} (is nftables installed?)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft: writing the rules: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft refused:\n{script}{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Firewall {
    /// Creates the table for `members` members (a table left by an earlier run that was
    /// killed is replaced).
    pub fn create(members: usize, relays: bool) -> Result<Firewall, String> {
        let _ = nft(&rules::delete());
        nft(&rules::table(members, relays))?;
        Ok(Firewall { _private: () })
    }

    /// Adds fault rules (the text of [`rules::cut`] or [`rules::loss`]).
    pub fn add(&self, rules: &str) -> Result<(), String> {
        nft(rules)
    }

    /// Removes every fault rule.
    pub fn heal(&self) -> Result<(), String> {
        nft(&rules::heal())
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        if let Err(e) = nft(&rules::delete()) {
            eprintln!("nemesis: deleting the nft table: {e}");
        }
    }
}
