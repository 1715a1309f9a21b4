//! After the faults: how long service took to return after each heal, the final reads
//! of every key (no acknowledged write lost), and the cluster's history from revision 1
//! (the watchers' and lockers' reference), read by a watch of every key.

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::WatchOptions;
use oncekv_check::lock::{Change, FENCED, LOCK};
use oncekv_check::watch::Seen;
use oncekv_check::{Call, Event, Outcome, final_key, final_value, own_key};

use crate::etcd::{self, text};
use crate::recorder::Recorder;

/// Whether `e` is a write that succeeded (a compare-and-swap that answered, either way,
/// was served by the leader as much as a put).
fn ok_write(e: &Event) -> bool {
    matches!(
        e.call,
        Call::Put { .. } | Call::Delete | Call::Cas { .. } | Call::LeaseGrant { .. }
    ) && matches!(e.outcome, Outcome::Ok(_))
}

fn ok_linearizable_read(e: &Event) -> bool {
    matches!(
        e.call,
        Call::Get {
            serializable: false
        }
    ) && matches!(e.outcome, Outcome::Ok(_))
}

/// How long after the heal at `heal` (run-clock ms) the cluster first both completed a
/// write and a linearizable read that were begun at or after the heal, by any client:
/// `None` if that did not happen before `until` (the next fault, or the end).
pub fn unavailability(history: &[Event], heal: u64, until: u64) -> Option<u64> {
    let first = |pred: fn(&Event) -> bool| {
        history
            .iter()
            .filter(|e| e.start >= heal && e.end <= until && pred(e))
            .map(|e| e.end)
            .min()
    };
    let write = first(ok_write)?;
    let read = first(ok_linearizable_read)?;
    Some(write.max(read) - heal)
}

/// A linearizable read of `key` on any member, tried on each in turn for up to 20 s.
async fn read(endpoints: &[String], key: &str) -> Result<Option<etcd_client::KeyValue>, String> {
    let mut last = String::new();
    for attempt in 0..40 {
        let endpoint = &endpoints[attempt % endpoints.len()];
        match etcd::connect(endpoint, Duration::from_secs(1)).await {
            Ok(mut c) => match c.get(key, None).await {
                Ok(r) => return Ok(r.kvs().first().cloned()),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    Err(last)
}

/// The final reads, recorded: every shared key the history names (by `reader`) and each
/// tracked writer's own key (by that writer, as `oncekv-check`'s final read).
pub async fn final_reads(recorder: &Recorder, endpoints: &[String], reader: usize, tracked: usize) {
    let keys: BTreeSet<String> = recorder
        .calls()
        .into_iter()
        .filter(|e| e.key.starts_with('k'))
        .map(|e| e.key)
        .collect();
    for key in keys {
        let start = recorder.now();
        let outcome = match read(endpoints, &key).await {
            Ok(kv) => Outcome::Ok(kv.map(|kv| text(kv.value()))),
            Err(e) => Outcome::Failed(format!("final read: {e}")),
        };
        let call = Call::Get {
            serializable: false,
        };
        recorder.record(reader, key, call, outcome, start);
    }
    for c in 0..tracked {
        let start = recorder.now();
        let outcome = match read(endpoints, &own_key(c)).await {
            Ok(Some(kv)) => Outcome::Ok(Some(final_value(&text(kv.value()), kv.version()))),
            Ok(None) => Outcome::Ok(None),
            Err(e) => Outcome::Failed(format!("final read: {e}")),
        };
        let call = Call::Get {
            serializable: false,
        };
        recorder.record(c, final_key(c), call, outcome, start);
    }
}

/// One event of the whole keyspace's history.
#[derive(Debug, Clone)]
pub struct Historic {
    pub seen: Seen,
    pub create_revision: i64,
}

/// The whole keyspace's history from revision 1 up to the current revision, by a watch
/// on `endpoint` (after the faults: every member has it).
pub async fn history(endpoint: &str) -> Result<Vec<Historic>, String> {
    let mut client = etcd::connect(endpoint, Duration::from_secs(5)).await?;
    let current = client
        .get(PROBE_ANY, None)
        .await
        .map_err(|e| format!("current revision: {e}"))?
        .header()
        .map_or(0, |h| h.revision());
    let options = WatchOptions::new()
        .with_all_keys()
        .with_prev_key()
        .with_start_revision(1);
    let mut stream = client
        .watch("\0", Some(options))
        .await
        .map_err(|e| format!("watch from revision 1: {e}"))?;
    let mut out: Vec<Historic> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.last().map_or(0, |h| h.seen.revision) < current {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .map_err(|_| format!("the watch from revision 1 stalled before revision {current}"))?
            .map_err(|e| format!("watch from revision 1: {e}"))?
            .ok_or("the watch from revision 1 ended")?;
        if message.compact_revision() > 0 || message.canceled() {
            return Err(format!(
                "the watch from revision 1 was cancelled: {:?} (compacted at {})",
                message.cancel_reason(),
                message.compact_revision()
            ));
        }
        for e in message.events() {
            if let (Some(seen), Some(kv)) = (crate::watchers::seen(e), e.kv()) {
                out.push(Historic {
                    seen,
                    create_revision: kv.create_revision(),
                });
            }
        }
    }
    Ok(out)
}

/// Any key: a read's header carries the current revision.
const PROBE_ANY: &str = "probe";

/// The history of keys under `prefix`, as a watcher of it should have seen it.
pub fn watched(history: &[Historic], prefix: &str) -> Vec<Seen> {
    history
        .iter()
        .filter(|h| h.seen.key.starts_with(prefix))
        .map(|h| h.seen.clone())
        .collect()
}

/// The history of the lock's keys and of the fenced key, for the fencing checker.
pub fn lock_changes(history: &[Historic]) -> Vec<Change> {
    let lock_prefix = format!("{LOCK}/");
    history
        .iter()
        .filter(|h| h.seen.key.starts_with(&lock_prefix) || h.seen.key == FENCED)
        .map(|h| Change {
            revision: h.seen.revision,
            key: h.seen.key.clone(),
            put: h.seen.put,
            value: h.seen.value.clone(),
            create_revision: h.create_revision,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(call: Call, outcome: Outcome, start: u64, end: u64) -> Event {
        Event {
            client: 0,
            key: "probe".into(),
            call,
            outcome,
            start,
            end,
        }
    }

    fn put(start: u64, end: u64, ok: bool) -> Event {
        let outcome = if ok {
            Outcome::Ok(None)
        } else {
            Outcome::Unknown
        };
        event(Call::Put { value: "v".into() }, outcome, start, end)
    }

    fn get(start: u64, end: u64, serializable: bool) -> Event {
        event(Call::Get { serializable }, Outcome::Ok(None), start, end)
    }

    // Service is back when both a write and a linearizable read begun after the heal
    // have succeeded: the later of the two counts.
    #[test]
    fn unavailability_is_until_both_a_write_and_a_linearizable_read_succeed() {
        let h = [
            put(900, 1_200, true), // begun before the heal: says nothing about after it
            put(1_000, 2_000, false),
            get(1_100, 1_300, true), // serializable: a minority member may answer it
            get(1_200, 1_500, false),
            put(1_400, 2_600, true),
            put(2_000, 2_100, true),
        ];
        assert_eq!(unavailability(&h, 1_000, 10_000), Some(1_100));
    }

    #[test]
    fn no_successful_write_before_the_next_fault_is_no_figure() {
        let h = [get(1_000, 1_100, false), put(1_000, 5_000, true)];
        assert_eq!(unavailability(&h, 1_000, 4_000), None);
        assert_eq!(unavailability(&h, 1_000, 6_000), Some(4_000));
    }

    #[test]
    fn lock_history_keeps_only_the_lock_keys_and_the_fenced_key() {
        let h = |key: &str, revision| Historic {
            seen: Seen {
                revision,
                key: key.into(),
                put: true,
                value: String::new(),
                prev: None,
            },
            create_revision: revision,
        };
        let all = [h("lock/1a", 2), h("k0.1", 3), h("fenced", 4), h("lockx", 5)];
        let changes = lock_changes(&all);
        assert_eq!(
            changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
            [2, 4]
        );
        assert_eq!(watched(&all, "k").len(), 1);
    }
}
