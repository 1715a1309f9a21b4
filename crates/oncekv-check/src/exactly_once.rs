//! The exactly-once checks over a history of calls ([`crate::history`]):
//!
//! - **exactly-once, counted**: only client `c` writes `own/c`, so its final version must
//!   lie between the number of its acknowledged puts and that plus its unknown ones, and
//!   its final value must be one of its puts no older than the last acknowledged one
//!   (an acknowledged write is present; nothing was applied twice);
//! - **leases**: a grant with a fresh explicit id must never answer "already exists", and
//!   a long-lived lease this client granted must not be "not found" at its revoke;
//! - **liveness**: every client finished and its final read (after the faults) succeeded.
//!
//! Linearizability of the shared keys is [`crate::linearizability`]; [`crate::check_calls`]
//! runs both.

use crate::history::{Call, Event, Outcome, final_key, own_key};

/// Every exactly-once, lease and liveness violation in `history`, for clients
/// `0..clients`.
pub fn check(history: &[Event], clients: usize) -> Vec<String> {
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
        .find(|e| e.client == c && e.key == final_key(c));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::final_value;

    fn put(value: &str, outcome: Outcome) -> Event {
        Event {
            client: 0,
            key: own_key(0),
            call: Call::Put {
                value: value.into(),
            },
            outcome,
            start: 0,
            end: 1,
        }
    }

    /// Two puts, the second unknown, then a final read of `value` at `version`.
    fn history(value: &str, version: i64) -> Vec<Event> {
        vec![
            put("a", Outcome::Ok(None)),
            put("b", Outcome::Unknown),
            Event {
                client: 0,
                key: final_key(0),
                call: Call::Get {
                    serializable: false,
                },
                outcome: Outcome::Ok(Some(final_value(value, version))),
                start: 2,
                end: 3,
            },
        ]
    }

    // The count is the exactly-once promise itself: one version per applied put, the
    // unknown one applied at most once, the acknowledged one never lost.
    #[test]
    fn the_own_key_counts_each_put_once() {
        assert_eq!(check(&history("a", 1), 1), Vec::<String>::new());
        assert_eq!(check(&history("b", 2), 1), Vec::<String>::new());
        let twice = check(&history("b", 3), 1);
        assert!(
            twice.len() == 1 && twice[0].starts_with("exactly-once"),
            "{twice:?}"
        );
        let lost = check(&history("x", 1), 1);
        assert!(
            lost.len() == 1 && lost[0].starts_with("durability"),
            "{lost:?}"
        );
    }
}
