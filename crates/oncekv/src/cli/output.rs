//! What the client commands print, in etcdctl 3.4's formats: `simple` (lines), `json`
//! (see [`super::json`]) and `table` (member list and endpoint status only).
//!
//! Output is built as bytes, not text: keys and values are printed as stored, as etcdctl
//! does, even when they are not UTF-8.

use oncekv_client::{
    DeleteResponse, EventType, KeyValue, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseRevokeResponse, LeaseTimeToLiveResponse, MemberListResponse, PutResponse, RangeResponse,
    TxnOpResponse, TxnResponse, WatchResponse,
};

use super::CliError;
use super::endpoint_status::EndpointStatus;
use super::json;

/// `-w` / `--write-out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    // Lines, as etcdctl prints them by default.
    #[default]
    Simple,
    // etcd's JSON (Go field names, base64 keys and values, zero fields left out).
    Json,
    // A table (member list and endpoint status only).
    Table,
}

/// How a `get` prints its key-values in the simple format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GetStyle {
    /// `--print-value-only`: values without their keys.
    pub value_only: bool,
    /// `--count-only`: only the number of keys.
    pub count_only: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    format: Format,
    hex: bool,
}

impl Printer {
    pub fn format(&self) -> Format {
        self.format
    }

    pub fn new(format: Format, hex: bool) -> Printer {
        Printer { format, hex }
    }

    /// Refuses `-w table` for a command that has no table (before the command runs, so a
    /// write is not made only to fail printing it).
    pub fn no_table(&self) -> Result<(), CliError> {
        match self.format {
            Format::Table => Err("table not supported as output format".into()),
            _ => Ok(()),
        }
    }

    fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// A key or value as etcdctl prints it: raw, or `\x`-prefixed hex with `--hex`.
    fn bytes(&self, out: &mut Vec<u8>, b: &[u8]) {
        if self.hex {
            for byte in b {
                out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
            }
        } else {
            out.extend_from_slice(b);
        }
    }

    /// A key-value: the key's line (unless `value_only`), then the value's line (empty
    /// for a keys-only read, as etcdctl prints it).
    fn kv(&self, out: &mut Vec<u8>, kv: &KeyValue, value_only: bool) {
        if !value_only {
            self.bytes(out, &kv.key);
            out.push(b'\n');
        }
        self.bytes(out, &kv.value);
        out.push(b'\n');
    }

    /// One leader as `elect -l` prints it: its key, then its value.
    pub fn leader(&self, kv: &KeyValue) -> Vec<u8> {
        let mut out = Vec::new();
        self.kv(&mut out, kv, false);
        out
    }

    pub fn put(&self, r: &PutResponse) -> Vec<u8> {
        if self.json() {
            return json::put(r);
        }
        let mut out = b"OK\n".to_vec();
        if let Some(prev) = &r.prev_kv {
            self.kv(&mut out, prev, false);
        }
        out
    }

    pub fn get(&self, r: &RangeResponse, style: GetStyle) -> Vec<u8> {
        if self.json() {
            return json::range(r);
        }
        let mut out = Vec::new();
        if style.count_only {
            out.extend_from_slice(format!("{}\n", r.count).as_bytes());
            return out;
        }
        for kv in &r.kvs {
            self.kv(&mut out, kv, style.value_only);
        }
        out
    }

    pub fn del(&self, r: &DeleteResponse) -> Vec<u8> {
        if self.json() {
            return json::delete(r);
        }
        let mut out = format!("{}\n", r.deleted).into_bytes();
        for kv in &r.prev_kvs {
            self.kv(&mut out, kv, false);
        }
        out
    }

    /// `SUCCESS` or `FAILURE`, then for each op of the branch that ran a blank line and
    /// what the op's own command prints.
    pub fn txn(&self, r: &TxnResponse) -> Vec<u8> {
        if self.json() {
            return json::txn(r);
        }
        let mut out = Vec::new();
        self.txn_simple(&mut out, r);
        out
    }

    fn txn_simple(&self, out: &mut Vec<u8>, r: &TxnResponse) {
        out.extend_from_slice(if r.succeeded {
            b"SUCCESS\n"
        } else {
            b"FAILURE\n"
        });
        for op in &r.responses {
            out.push(b'\n');
            match op {
                TxnOpResponse::Get(r) => out.extend(self.get(r, GetStyle::default())),
                TxnOpResponse::Put(r) => out.extend(self.put(r)),
                TxnOpResponse::Delete(r) => out.extend(self.del(r)),
                TxnOpResponse::Txn(r) => self.txn_simple(out, r),
            }
        }
    }

    /// Each event: `PUT` or `DELETE`, then the previous key-value (if the watch asked for
    /// it and there was one), then the key-value (a delete's value line is empty).
    pub fn watch(&self, r: &WatchResponse) -> Vec<u8> {
        if self.json() {
            return json::watch(r);
        }
        let mut out = Vec::new();
        for e in &r.events {
            out.extend_from_slice(match e.kind {
                EventType::Put => b"PUT\n",
                EventType::Delete => b"DELETE\n",
            });
            if let Some(prev) = &e.prev_kv {
                self.kv(&mut out, prev, false);
            }
            self.kv(&mut out, &e.kv, false);
        }
        out
    }

    /// What etcdctl prints on stdout when a watch is cancelled for compaction (only in
    /// JSON: the simple format says it on stderr).
    pub fn watch_compacted(&self, compact_revision: i64) -> Vec<u8> {
        if self.json() {
            json::watch_compacted(compact_revision)
        } else {
            Vec::new()
        }
    }

    pub fn lease_grant(&self, r: &LeaseGrantResponse) -> Vec<u8> {
        if self.json() {
            return json::lease_grant(r);
        }
        format!("lease {:016x} granted with TTL({}s)\n", r.id, r.ttl).into_bytes()
    }

    pub fn lease_revoke(&self, id: i64, r: &LeaseRevokeResponse) -> Vec<u8> {
        if self.json() {
            return json::lease_revoke(r);
        }
        format!("lease {id:016x} revoked\n").into_bytes()
    }

    pub fn keep_alive(&self, r: &LeaseKeepAliveResponse) -> Vec<u8> {
        if self.json() {
            return json::keep_alive(r);
        }
        format!("lease {:016x} keepalived with TTL({})\n", r.id, r.ttl).into_bytes()
    }

    /// What a keep-alive loop prints when the lease is gone (simple format only).
    /// etcdctl's `lease list`: the count, then each ID in hex. (JSON: the IDs, without
    /// the header, which the client's call does not return.)
    pub fn lease_list(&self, ids: &[i64]) -> Vec<u8> {
        if self.json() {
            let leases: Vec<String> = ids.iter().map(|id| format!("{{\"ID\":{id}}}")).collect();
            return format!("{{\"leases\":[{}]}}\n", leases.join(",")).into_bytes();
        }
        let mut out = format!("found {} leases\n", ids.len());
        for id in ids {
            out.push_str(&format!("{id:016x}\n"));
        }
        out.into_bytes()
    }

    pub fn keep_alive_ended(&self, id: i64) -> Vec<u8> {
        if self.json() {
            return Vec::new();
        }
        format!("lease {id:016x} expired or revoked.\n").into_bytes()
    }

    pub fn time_to_live(&self, r: &LeaseTimeToLiveResponse, keys: bool) -> Vec<u8> {
        if self.json() {
            return json::time_to_live(r);
        }
        if r.granted_ttl == 0 && r.ttl == -1 {
            return format!("lease {:016x} already expired\n", r.id).into_bytes();
        }
        let mut out = format!(
            "lease {:016x} granted with TTL({}s), remaining({}s)",
            r.id, r.granted_ttl, r.ttl
        )
        .into_bytes();
        if keys {
            out.extend_from_slice(b", attached keys([");
            for (i, key) in r.keys.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(key);
            }
            out.extend_from_slice(b"])");
        }
        out.push(b'\n');
        out
    }

    pub fn member_list(&self, r: &MemberListResponse) -> Vec<u8> {
        let rows: Vec<Vec<String>> = r
            .members
            .iter()
            .map(|m| {
                let status = if m.name.is_empty() {
                    "unstarted"
                } else {
                    "started"
                };
                vec![
                    format!("{:x}", m.id),
                    status.to_string(),
                    m.name.clone(),
                    m.peer_urls.join(","),
                    m.client_urls.join(","),
                    m.is_learner.to_string(),
                ]
            })
            .collect();
        match self.format {
            Format::Json => json::member_list(r),
            Format::Table => table(
                &[
                    "ID",
                    "STATUS",
                    "NAME",
                    "PEER ADDRS",
                    "CLIENT ADDRS",
                    "IS LEARNER",
                ],
                &rows,
            ),
            Format::Simple => lines(&rows),
        }
    }

    pub fn endpoint_status(&self, statuses: &[EndpointStatus]) -> Vec<u8> {
        let rows: Vec<Vec<String>> = statuses
            .iter()
            .map(|e| {
                let s = &e.status;
                vec![
                    e.endpoint.clone(),
                    format!("{:x}", s.header.member_id),
                    s.version.clone(),
                    human_bytes(s.db_size.max(0).unsigned_abs()),
                    (s.leader == s.header.member_id).to_string(),
                    s.is_learner.to_string(),
                    s.raft_term.to_string(),
                    s.raft_index.to_string(),
                    s.raft_applied_index.to_string(),
                    s.errors.join(", "),
                ]
            })
            .collect();
        match self.format {
            Format::Json => json::endpoint_status(statuses),
            Format::Table => table(
                &[
                    "ENDPOINT",
                    "ID",
                    "VERSION",
                    "DB SIZE",
                    "IS LEADER",
                    "IS LEARNER",
                    "RAFT TERM",
                    "RAFT INDEX",
                    "RAFT APPLIED INDEX",
                    "ERRORS",
                ],
                &rows,
            ),
            Format::Simple => lines(&rows),
        }
    }
}

/// Rows as etcdctl's simple format prints them: fields joined by ", ".
fn lines(rows: &[Vec<String>]) -> Vec<u8> {
    let mut out = String::new();
    for row in rows {
        out.push_str(&row.join(", "));
        out.push('\n');
    }
    out.into_bytes()
}

/// A bordered table: headers centred, cells right-aligned (etcdctl's table layout).
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> Vec<u8> {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .chain([h.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let border: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let mut out = border.clone();
    for (h, w) in headers.iter().zip(&widths) {
        let gap = w - h.chars().count();
        let left = gap / 2;
        out.push_str(&format!(
            "| {}{h}{} ",
            " ".repeat(left),
            " ".repeat(gap - left)
        ));
    }
    out.push_str("|\n");
    out.push_str(&border);
    for row in rows {
        for (i, w) in widths.iter().enumerate() {
            let cell = row.get(i).map_or("", String::as_str);
            out.push_str(&format!("| {cell:>w$} "));
        }
        out.push_str("|\n");
    }
    out.push_str(&border);
    out.into_bytes()
}

/// A size in SI units as etcdctl prints it (`0 B`, `25 kB`, `1.5 MB`).
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let mut exp = 0;
    let mut scale = 1f64;
    while exp + 1 < UNITS.len() && (n as f64) >= scale * 1000.0 {
        exp += 1;
        scale *= 1000.0;
    }
    let value = ((n as f64) / scale * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[exp])
    } else {
        format!("{value:.0} {}", UNITS[exp])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Scripts parse these sizes; they must read as etcdctl's do.
    #[test]
    fn sizes_print_in_si_units_as_etcdctl() {
        let cases = [
            (0, "0 B"),
            (9, "9 B"),
            (999, "999 B"),
            (1000, "1.0 kB"),
            (24576, "25 kB"),
            (1_536_000, "1.5 MB"),
            (20_480, "20 kB"),
        ];
        for (n, want) in cases {
            assert_eq!(human_bytes(n), want, "{n}");
        }
    }

    // The table must line up whatever the cell widths are.
    #[test]
    fn tables_centre_headers_and_right_align_cells() {
        let got = table(&["ID", "NAME"], &[vec!["1".into(), "n1".into()]]);
        let want = "+----+------+\n\
                    | ID | NAME |\n\
                    +----+------+\n\
                    |  1 |   n1 |\n\
                    +----+------+\n";
        assert_eq!(String::from_utf8_lossy(&got), want);
    }

    #[test]
    fn hex_prints_every_byte_with_a_prefix() {
        let mut out = Vec::new();
        Printer::new(Format::Simple, true).bytes(&mut out, b"k\x01");
        assert_eq!(out, b"\\x6b\\x01");
    }
}
