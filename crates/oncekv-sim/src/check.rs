//! Client-side checkers over the recorded history:
//!
//! - **exactly-once, counted**: only client `c` writes `own/c`, so its final version must
//!   lie between the number of its acknowledged puts and that plus its unknown ones, and
//!   its final value must be one of its puts no older than the last acknowledged one
//!   (an acknowledged write is present; nothing was applied twice);
//! - **leases**: a grant with a fresh explicit id must never answer "already exists", and
//!   a long-lived lease this client granted must not be "not found" at its revoke;
//! - **liveness**: every client finished and its final read (after the faults) succeeded;
//! - linearizability of the shared keys is in [`crate::linearizability`].

use crate::linearizability;
use crate::workload::{Call, Event, Outcome, own_key};

/// Every violation found in `history`.
pub fn history(history: &[Event], clients: usize) -> Vec<String> {
    let mut out = Vec::new();
    for c in 0..clients {
        own_key_count(history, c, &mut out);
    }
    for e in history {
        match (&e.call, &e.outcome) {
            (Call::LeaseGrant { id, .. }, Outcome::Failed(msg))
                if msg.contains("already exists") =>
            {
                out.push(format!(
                    "exactly-once: c{} lease grant {id} (fresh id) answered {msg:?}",
                    e.client
                ));
            }
            (
                Call::LeaseRevoke {
                    id,
                    long_lived: true,
                },
                Outcome::Failed(msg),
            ) if msg.contains("not found") => {
                out.push(format!(
                    "c{} revoking its long-lived lease {id} answered {msg:?} (lost or revoked twice)",
                    e.client
                ));
            }
            _ => {}
        }
    }
    out.extend(linearizability::check_all(history));
    out
}

fn own_key_count(history: &[Event], c: usize, out: &mut Vec<String>) {
    let key = own_key(c);
    let puts: Vec<(usize, &Event)> = history
        .iter()
        .filter(|e| e.client == c && e.key == key && matches!(e.call, Call::Put { .. }))
        .enumerate()
        .collect();
    let acked = puts
        .iter()
        .filter(|(_, e)| matches!(e.outcome, Outcome::Ok(_)))
        .count() as i64;
    let unknown = puts
        .iter()
        .filter(|(_, e)| e.outcome == Outcome::Unknown)
        .count() as i64;
    let last_acked = puts
        .iter()
        .rev()
        .find(|(_, e)| matches!(e.outcome, Outcome::Ok(_)))
        .map(|(i, _)| *i);
    let final_read = history
        .iter()
        .find(|e| e.client == c && e.key == format!("final/{c}"));
    let Some(final_read) = final_read else {
        out.push(format!("liveness: c{c} never finished its workload"));
        return;
    };
    let (value, version) = match &final_read.outcome {
        Outcome::Ok(Some(v)) => match v.rsplit_once("@v") {
            Some((value, version)) => (Some(value.to_string()), version.parse().unwrap_or(-1)),
            None => (None, -1),
        },
        Outcome::Ok(None) => (None, 0),
        other => {
            out.push(format!(
                "liveness: c{c}'s final read after the faults: {other:?}"
            ));
            return;
        }
    };
    if version < acked || version > acked + unknown {
        out.push(format!(
            "exactly-once: {key} is at version {version} after {acked} acknowledged and \
             {unknown} unknown puts"
        ));
    }
    let position = value.as_ref().and_then(|v| {
        puts.iter().find_map(|(i, e)| match &e.call {
            Call::Put { value } if value == v => Some(*i),
            _ => None,
        })
    });
    match (last_acked, position) {
        (Some(_), None) => out.push(format!(
            "durability: {key} holds {value:?}, not one of c{c}'s puts (acknowledged puts lost)"
        )),
        (Some(a), Some(p)) if p < a => out.push(format!(
            "durability: {key} holds put #{p} but put #{a} was acknowledged later"
        )),
        _ => {}
    }
}
