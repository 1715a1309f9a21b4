//! A fixed workload of Puts through `StateMachine::apply`, for counting instructions with
//! valgrind (`scripts/apply-instructions` runs it): unlike time on a shared machine, the
//! count of a tracked put minus that of an untracked one is exact and repeatable.
//!
//! `cargo run --release -p oncekv-core --example apply_cost -- <tracked|untracked> <puts>
//! [per-entry] [clients]`: registers `clients` sessions (default 1,000), loads 100 k
//! etcd-style keys with 100-byte values, then applies `puts` Puts of random keys by random
//! clients, `per-entry` (default 1) to a log entry. Only the last phase differs between the
//! modes; the script subtracts a run with 0 puts and counts inside `apply` only.

use std::hint::black_box;
use std::process::ExitCode;

use bytes::Bytes;
use oncekv_core::{Command, LogPayload, Op, PutRequest, Settings, StateMachine};
use support::{Rng, secret_of};

#[path = "../benches/support/mod.rs"]
mod support;

const KEYS: usize = 100_000;

fn arg(args: &[String], i: usize, default: u64) -> Result<u64, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| format!("not a number: {s:?}")),
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let tracked = match args.first().map(String::as_str) {
        Some("tracked") => true,
        Some("untracked") => false,
        _ => return Err("first argument: tracked or untracked".into()),
    };
    let puts = arg(args, 1, 0)?;
    let per_entry = arg(args, 2, 1)?.max(1);
    let clients = arg(args, 3, 1_000)?.max(1);

    let mut sm = StateMachine::new(Settings {
        session_ttl_ms: u64::MAX / 4,
        ..Settings::default()
    });
    let mut index = 0;
    for _ in 0..clients {
        index += 1;
        let register = Command::RegisterClient {
            secret: secret_of(index),
            nonce: 0,
        };
        black_box(sm.apply(
            index,
            &LogPayload {
                cluster_time: 1,
                commands: vec![register],
            },
        ));
    }
    let keys: Vec<Bytes> = (0..KEYS)
        .map(|i| Bytes::from(format!("/registry/pods/default/pod-{i:08}")))
        .collect();
    let value = Bytes::from(vec![b'v'; 100]);
    for key in &keys {
        index += 1;
        let put = Command::Untracked(Op::put(key.clone(), value.clone()));
        black_box(sm.apply(
            index,
            &LogPayload {
                cluster_time: 1,
                commands: vec![put],
            },
        ));
    }

    let mut rng = Rng(0x1234_5678);
    let mut commands = Vec::new();
    for n in 0..puts {
        let client_id = 1 + rng.below(clients);
        let key = keys[rng.below(KEYS as u64) as usize].clone();
        let op = Op::Put(PutRequest {
            key,
            value: value.clone(),
            ..PutRequest::default()
        });
        // Rising per client.
        let seq = index * 1024 + commands.len() as u64 + 1;
        commands.push(support::command(tracked, client_id, seq, op));
        if commands.len() as u64 == per_entry || n + 1 == puts {
            index += 1;
            let entry = LogPayload {
                cluster_time: 2,
                commands: std::mem::take(&mut commands),
            };
            black_box(sm.apply(index, &entry));
        }
    }
    let stats = sm.stats();
    if stats.duplicates + stats.rejected != 0 {
        return Err(format!("a tracked put was not executed: {stats:?}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("apply_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
