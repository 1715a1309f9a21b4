//! `put`, `get`, `del`: their flags (shared with the request lines of `txn`), the
//! library options they become, and the calls.

use clap::{Args, ValueEnum};
use oncekv_client::{Client, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, TxnOp};

use super::output::{GetStyle, Printer};
use super::{CliError, ClientFlags, emit, parse_lease_id};

/// What `put` takes, in a command or in a `txn` request line.
#[derive(Debug, Clone, Args)]
pub struct PutOp {
    /// The key.
    pub key: String,
    /// The value; read from standard input when omitted. A value starting with '-' goes
    /// after `--` (`oncekv put -- key -value`).
    pub value: Option<String>,
    /// Attach the key to this lease (its ID in hex, as `lease grant` prints it).
    #[arg(long, value_name = "ID", value_parser = parse_lease_id)]
    pub lease: Option<i64>,
    /// Return the key-value pair before this put.
    #[arg(long)]
    pub prev_kv: bool,
    /// Keep the current value (the key must exist; give no value).
    #[arg(long)]
    pub ignore_value: bool,
    /// Keep the current lease (give no --lease).
    #[arg(long)]
    pub ignore_lease: bool,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub op: PutOp,
    #[command(flatten)]
    pub flags: ClientFlags,
}

/// A resolved put: key, value (read from stdin if needed) and options.
#[derive(Debug, Clone)]
pub struct PutRequest {
    key: Vec<u8>,
    value: Vec<u8>,
    options: PutOptions,
}

impl PutOp {
    /// The request; the value comes from `stdin` when none is given and `--ignore-value`
    /// is not set (`None`: a value is required).
    pub fn resolve(self, stdin: Option<&mut dyn std::io::Read>) -> Result<PutRequest, CliError> {
        let value = match (self.value, self.ignore_value) {
            (Some(_), true) => {
                return Err("--ignore-value keeps the current value: give only the key".into());
            }
            (Some(v), false) => v.into_bytes(),
            (None, true) => Vec::new(),
            (None, false) => match stdin {
                Some(input) => {
                    let mut value = Vec::new();
                    input
                        .read_to_end(&mut value)
                        .map_err(|e| CliError::new(format!("reading the value from stdin: {e}")))?;
                    value
                }
                None => return Err("put needs a key and a value".into()),
            },
        };
        let mut options = PutOptions::new();
        if let Some(lease) = self.lease {
            options = options.with_lease(lease);
        }
        if self.prev_kv {
            options = options.with_prev_kv();
        }
        if self.ignore_value {
            options = options.with_ignore_value();
        }
        if self.ignore_lease {
            options = options.with_ignore_lease();
        }
        Ok(PutRequest {
            key: self.key.into_bytes(),
            value,
            options,
        })
    }
}

impl PutRequest {
    pub fn into_txn_op(self) -> TxnOp {
        TxnOp::put(self.key, self.value, self.options)
    }
}

/// Linearizable or serializable read (`--consistency`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    /// Linearizable: confirmed with the leader, never stale.
    #[default]
    L,
    /// Serializable: from the contacted member's state, possibly stale, faster.
    S,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum SortBy {
    Create,
    Key,
    Modify,
    Value,
    Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum Order {
    Ascend,
    Descend,
}

/// What `get` takes, in a command or in a `txn` request line.
#[derive(Debug, Clone, Args)]
pub struct GetOp {
    /// The key, or the start of the range.
    pub key: String,
    /// The end of the range [key, range_end).
    pub range_end: Option<String>,
    /// Get the keys that start with the key.
    #[arg(long, conflicts_with_all = ["range_end", "from_key"])]
    pub prefix: bool,
    /// Get the keys greater than or equal to the key (byte order).
    #[arg(long, conflicts_with = "range_end")]
    pub from_key: bool,
    /// Return at most this many keys (0: all).
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
    /// Read the keys as they were at this revision (0: the latest). Revisions below the
    /// last compaction, or above the current one, are refused.
    #[arg(long, default_value_t = 0)]
    pub rev: i64,
    /// Get only the keys.
    #[arg(long)]
    pub keys_only: bool,
    /// Print only the values (simple output).
    #[arg(long)]
    pub print_value_only: bool,
    /// Get only the number of keys (simple output prints the number).
    #[arg(long)]
    pub count_only: bool,
    /// Linearizable (l) or serializable (s).
    #[arg(long, value_enum, default_value_t = Consistency::L)]
    pub consistency: Consistency,
    /// Sort the results by this field.
    #[arg(long, value_enum, ignore_case = true)]
    pub sort_by: Option<SortBy>,
    /// Order of the results (ascending unless given).
    #[arg(long, value_enum, ignore_case = true)]
    pub order: Option<Order>,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub op: GetOp,
    #[command(flatten)]
    pub flags: ClientFlags,
}

/// etcd clients read an empty key with a prefix or from-key flag as "every key", which
/// on the wire is the key `\0`.
pub(super) fn range_key(key: &str, prefix: bool, from_key: bool) -> Vec<u8> {
    if key.is_empty() && (prefix || from_key) {
        vec![0]
    } else {
        key.as_bytes().to_vec()
    }
}

impl GetOp {
    pub fn key(&self) -> Vec<u8> {
        range_key(&self.key, self.prefix, self.from_key)
    }

    pub fn options(&self) -> GetOptions {
        let mut o = GetOptions::new();
        if self.prefix {
            o = if self.key.is_empty() {
                o.with_from_key()
            } else {
                o.with_prefix()
            };
        }
        if self.from_key {
            o = o.with_from_key();
        }
        if let Some(end) = &self.range_end {
            o = o.with_range_end(end.as_bytes());
        }
        if self.limit != 0 {
            o = o.with_limit(self.limit);
        }
        if self.rev != 0 {
            o = o.with_revision(self.rev);
        }
        if self.keys_only {
            o = o.with_keys_only();
        }
        if self.count_only {
            o = o.with_count_only();
        }
        if self.consistency == Consistency::S {
            o = o.with_serializable();
        }
        if self.sort_by.is_some() || self.order.is_some() {
            let target = match self.sort_by {
                Some(SortBy::Create) => SortTarget::Create,
                Some(SortBy::Key) | None => SortTarget::Key,
                Some(SortBy::Modify) => SortTarget::Mod,
                Some(SortBy::Value) => SortTarget::Value,
                Some(SortBy::Version) => SortTarget::Version,
            };
            let order = match self.order {
                Some(Order::Ascend) => SortOrder::Ascend,
                Some(Order::Descend) => SortOrder::Descend,
                None => SortOrder::None,
            };
            o = o.with_sort(target, order);
        }
        o
    }

    pub fn style(&self) -> GetStyle {
        GetStyle {
            value_only: self.print_value_only,
            count_only: self.count_only,
        }
    }

    pub fn into_txn_op(self) -> TxnOp {
        TxnOp::get(self.key(), self.options())
    }
}

/// What `del` takes, in a command or in a `txn` request line.
#[derive(Debug, Clone, Args)]
pub struct DelOp {
    /// The key, or the start of the range.
    pub key: String,
    /// The end of the range [key, range_end).
    pub range_end: Option<String>,
    /// Delete the keys that start with the key.
    #[arg(long, conflicts_with_all = ["range_end", "from_key"])]
    pub prefix: bool,
    /// Delete the keys greater than or equal to the key (byte order).
    #[arg(long, conflicts_with = "range_end")]
    pub from_key: bool,
    /// Return the deleted key-value pairs.
    #[arg(long)]
    pub prev_kv: bool,
}

#[derive(Debug, Args)]
pub struct DelArgs {
    #[command(flatten)]
    pub op: DelOp,
    #[command(flatten)]
    pub flags: ClientFlags,
}

impl DelOp {
    pub fn key(&self) -> Vec<u8> {
        range_key(&self.key, self.prefix, self.from_key)
    }

    pub fn options(&self) -> DeleteOptions {
        let mut o = DeleteOptions::new();
        if self.prefix {
            o = if self.key.is_empty() {
                o.with_from_key()
            } else {
                o.with_prefix()
            };
        }
        if self.from_key {
            o = o.with_from_key();
        }
        if let Some(end) = &self.range_end {
            o = o.with_range_end(end.as_bytes());
        }
        if self.prev_kv {
            o = o.with_prev_kv();
        }
        o
    }

    pub fn into_txn_op(self) -> TxnOp {
        TxnOp::delete(self.key(), self.options())
    }
}

pub async fn put(client: Client, p: Printer, req: PutRequest) -> Result<(), CliError> {
    let r = client.put_with(req.key, req.value, req.options).await?;
    emit(&p.put(&r))
}

pub async fn get(client: Client, p: Printer, op: GetOp) -> Result<(), CliError> {
    let r = client.range(op.key(), op.options()).await?;
    emit(&p.get(&r, op.style()))
}

pub async fn del(client: Client, p: Printer, op: DelOp) -> Result<(), CliError> {
    let r = client.delete_with(op.key(), op.options()).await?;
    emit(&p.del(&r))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put_op(value: Option<&str>, ignore_value: bool) -> PutOp {
        PutOp {
            key: "k".into(),
            value: value.map(String::from),
            lease: None,
            prev_kv: false,
            ignore_value,
            ignore_lease: false,
        }
    }

    // etcdctl reads a missing value from stdin, byte for byte (a trailing newline too).
    #[test]
    fn a_put_without_a_value_reads_stdin_whole() {
        let mut input: &[u8] = b"from stdin\n";
        let req = put_op(None, false).resolve(Some(&mut input)).unwrap();
        assert_eq!(req.value, b"from stdin\n");
        let req = put_op(None, true).resolve(None).unwrap();
        assert!(req.value.is_empty(), "--ignore-value reads nothing");
        assert!(put_op(Some("v"), true).resolve(None).is_err());
        assert!(put_op(None, false).resolve(None).is_err());
    }
}
