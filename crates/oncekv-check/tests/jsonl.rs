//! Histories written and read as JSON Lines, and judged as the CLI judges them: the form
//! the real-process nemesis and etcd runs hand their histories over in.

use oncekv_check::jsonl::{self, ReadError};
use oncekv_check::lock::{self, Acquisition, Change, WriteOutcome};
use oncekv_check::watch::{Record, Seen, Watched};
use oncekv_check::{Call, Event, Outcome, final_key, final_value, own_key};

fn event(client: usize, key: &str, call: Call, outcome: Outcome, start: u64, end: u64) -> Event {
    Event {
        client,
        key: key.into(),
        call,
        outcome,
        start,
        end,
    }
}

fn put(value: &str) -> Call {
    Call::Put {
        value: value.into(),
    }
}

fn get() -> Call {
    Call::Get {
        serializable: false,
    }
}

fn ok(value: Option<&str>) -> Outcome {
    Outcome::Ok(value.map(str::to_string))
}

/// Client 0 puts `a` then `b` on `k0` (both acknowledged); client 1 reads `k0` after
/// both returned and sees `read`. Every call variant appears once, so the round trip
/// covers them all.
fn history(read: &str) -> Vec<Event> {
    vec![
        event(0, "k0", put("a"), ok(None), 0, 10),
        event(0, "k0", put("b"), ok(None), 20, 30),
        event(1, "k0", get(), ok(Some(read)), 40, 50),
        event(1, "k1", Call::Delete, Outcome::Unknown, 41, 60),
        event(
            1,
            "k2",
            Call::Cas {
                expect: None,
                value: "c".into(),
            },
            ok(Some("true")),
            61,
            70,
        ),
        event(
            0,
            "k2",
            Call::Get { serializable: true },
            Outcome::Failed("no leader".into()),
            71,
            72,
        ),
        event(
            0,
            "lease/7",
            Call::LeaseGrant { id: 7, ttl: 5 },
            ok(None),
            73,
            74,
        ),
        event(
            0,
            "lease/7",
            Call::LeaseRevoke {
                id: 7,
                long_lived: false,
            },
            ok(None),
            75,
            76,
        ),
    ]
}

fn to_jsonl(history: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    jsonl::write(&mut out, history).expect("writing to a Vec");
    out
}

// The nemesis writes what the simulation's types hold; if a field or variant did not
// survive the trip, its histories would be judged on something else than was recorded.
#[test]
fn a_history_round_trips_through_json_lines() {
    let h = history("b");
    let text = to_jsonl(&h);
    assert_eq!(text.iter().filter(|b| **b == b'\n').count(), h.len());
    let back: Vec<Event> = jsonl::read(text.as_slice()).expect("reading what was written");
    assert_eq!(back, h);
}

// The point of the CLI: a read that returns a value older than an acknowledged write
// is caught in a file just as in the simulation, and a correct history passes.
#[test]
fn a_stale_read_in_a_file_is_a_violation_and_a_fresh_one_is_not() {
    let stale = jsonl::check_history(to_jsonl(&history("a")).as_slice(), Some(0))
        .expect("a readable history");
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert!(stale[0].starts_with("linearizability"), "{stale:?}");
    assert!(stale[0].contains("k0"), "{stale:?}");
    let fresh = jsonl::check_history(to_jsonl(&history("b")).as_slice(), Some(0))
        .expect("a readable history");
    assert_eq!(fresh, Vec::<String>::new());
    // What the CLI prints: the same violations, and no key left undecided by histories
    // this small.
    let judged = jsonl::judge_history(to_jsonl(&history("a")).as_slice(), Some(0))
        .expect("a readable history");
    assert_eq!(judged.violations, stale);
    assert_eq!(judged.inconclusive, Vec::<String>::new());
}

/// The README's ```json blocks, in order: the history, the watches, the locks.
fn readme_examples() -> Vec<String> {
    include_str!("../README.md")
        .split("```json\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .map(str::to_string)
        .collect()
}

// The documented format, written by hand as a harness in another language (or one
// against etcd) would write it, reads as the types say and is judged.
#[test]
fn the_readme_examples_read_and_pass() {
    let examples = readme_examples();
    assert_eq!(examples.len(), 3, "{examples:?}");
    let h: Vec<Event> = jsonl::read(examples[0].as_bytes()).expect("the history example");
    assert_eq!(h.len(), 3);
    assert_eq!(h[1].outcome, ok(Some("a")));
    assert_eq!(h[2].call, Call::Delete);
    assert_eq!(h[2].outcome, Outcome::Unknown);
    assert_eq!(
        jsonl::check_history(examples[0].as_bytes(), Some(0)),
        Ok(Vec::new())
    );
    assert_eq!(jsonl::check_watches(examples[1].as_bytes()), Ok(Vec::new()));
    let locks: Vec<lock::Line> = jsonl::read(examples[2].as_bytes()).expect("the locks example");
    assert_eq!(locks.len(), 4);
    assert_eq!(jsonl::check_locks(examples[2].as_bytes()), Ok(Vec::new()));
}

// Exit status 2 and the line to look at, rather than a verdict on half a file.
#[test]
fn an_unreadable_line_is_reported_with_its_number() {
    let text = "{\"client\":0,\"key\":\"k0\",\"call\":\"delete\",\"outcome\":\"unknown\",\"start\":0,\"end\":1}\n\n{\"client\":0,\"key\":\n";
    let e: ReadError = jsonl::check_history(text.as_bytes(), None).expect_err("line 3 is cut");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.to_string().starts_with("line 3: "), "{e}");
}

// Without --clients, every client in the history owes the own-key count and a final
// read: client 1 below never made one, and that must not pass silently.
#[test]
fn without_a_client_count_every_client_named_is_counted() {
    let mut h = vec![
        event(0, &own_key(0), put("x"), ok(None), 0, 5),
        event(
            0,
            &final_key(0),
            get(),
            ok(Some(&final_value("x", 1))),
            10,
            12,
        ),
        event(1, "k0", put("y"), ok(None), 0, 5),
    ];
    let v = jsonl::check_history(to_jsonl(&h).as_slice(), None).expect("readable");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("c1 never finished"), "{v:?}");
    h.pop();
    assert_eq!(
        jsonl::check_history(to_jsonl(&h).as_slice(), None),
        Ok(Vec::new())
    );
}

// A watcher that skipped a revision is caught from its file line; one that saw every
// event of its range (a put, an overwrite, a delete, with their previous values) passes.
#[test]
fn a_watch_file_with_a_gap_is_a_violation() {
    let history = vec![
        Seen {
            revision: 2,
            key: "k0".into(),
            put: true,
            value: "a".into(),
            prev: None,
        },
        Seen {
            revision: 3,
            key: "k0".into(),
            put: true,
            value: "b".into(),
            prev: Some("a".into()),
        },
        Seen {
            revision: 4,
            key: "k0".into(),
            put: false,
            value: String::new(),
            prev: Some("b".into()),
        },
    ];
    let line = |skip: Option<i64>| Watched {
        record: Record {
            start: 1,
            seen: history
                .iter()
                .filter(|s| Some(s.revision) != skip)
                .cloned()
                .collect(),
            ..Record::default()
        },
        history: history.clone(),
    };
    let mut text = Vec::new();
    jsonl::write(&mut text, &[line(None), line(Some(3))]).expect("writing to a Vec");
    let v = jsonl::check_watches(text.as_slice()).expect("readable");
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("watcher w1"), "{v:?}");
}

// A write seen as refused that history holds: the locks file carries both sides, in any
// order (changes are put in revision order on reading).
#[test]
fn a_locks_file_judges_the_record_against_the_history() {
    let change = |revision, key: &str, value: &str, create_revision| {
        lock::Line::Change(Change {
            revision,
            key: key.into(),
            put: true,
            value: value.into(),
            create_revision,
        })
    };
    let written = lock::fenced_value(2, 0, 0);
    let acquisition = |outcome| {
        lock::Line::Acquisition(Acquisition {
            locker: 0,
            key: "lock/a".into(),
            token: 2,
            writes: vec![(written.clone(), outcome)],
            lost: false,
        })
    };
    let lines = |outcome| {
        vec![
            acquisition(outcome),
            change(3, lock::FENCED, &written, 3),
            change(2, "lock/a", "", 2),
        ]
    };
    let judge = |outcome| {
        let mut text = Vec::new();
        jsonl::write(&mut text, &lines(outcome)).expect("writing to a Vec");
        jsonl::check_locks(text.as_slice()).expect("readable")
    };
    assert_eq!(judge(WriteOutcome::Written), Vec::<String>::new());
    let v = judge(WriteOutcome::Refused);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("Refused, history has it 1 times"), "{v:?}");
}
