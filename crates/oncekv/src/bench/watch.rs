//! `oncekv bench watch`: watch fan-out, after etcd's `benchmark watch-latency`.
//!
//! `--watchers` watchers of one key (or of a prefix) share `--streams` Watch streams,
//! which share `--connections` gRPC channels spread over the endpoints, so followers serve
//! watches as the leader does. Once every watcher is created, one writer puts the key
//! `--total` times (or for `--duration` seconds), at `--rate` puts per second or as fast
//! as one put outstanding at a time allows. Each value starts with the put's sequence
//! number and its send time (nanoseconds since this process's start instant), so every
//! event a watcher receives gives a delivery latency (send of the put to arrival of the
//! event: the put's commit is part of it) and its place in the sequence.
//!
//! Every watcher must receive every put exactly once, in order: a sequence number skipped
//! is a gap, one seen again (or a revision not above the previous one) a duplicate, and
//! what has not arrived `--drain` seconds after the last put is missing. Any of them fails
//! the run, as does a put error (its outcome, applied or not, would be unknown).
//!
//! Here: the flags, the run and the writer. The watchers' streams are in [`stream`], what
//! the run reports in [`summary`].

mod stream;
mod summary;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use oncekv_proto::etcdserverpb::PutRequest;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::{Target, WriteOut, connect, find_leader, run_length, seconds};
use stream::{StreamResult, WatchStream};
use summary::{Summary, report_progress};

/// The sequence number and the send time at the start of every value.
const STAMP_BYTES: usize = 16;

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: Target,
    /// Watchers, all of the same key (or prefix).
    #[arg(long, default_value_t = 1_000)]
    pub watchers: usize,
    /// Watch streams the watchers are spread over (many watchers on one stream).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Puts the writer makes (0: no limit; then --duration is required).
    #[arg(long, default_value_t = 2_000)]
    pub total: u64,
    /// Stop writing after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Puts per second (0: as fast as one writer with one put outstanding can).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Size of each value, in bytes (at least 16: the sequence number and send time).
    #[arg(long, default_value_t = 16)]
    pub value_size: usize,
    /// The key watched and written (default: a new one under /bench/watch/ each run).
    #[arg(long)]
    pub key: Option<String>,
    /// Watch --key as a prefix; the writer spreads its puts over --key-space keys under it.
    #[arg(long)]
    pub prefix: bool,
    /// With --prefix: how many keys under the prefix the writer puts.
    #[arg(long, default_value_t = 100)]
    pub key_space: u64,
    /// Seconds to wait after the last put for every watcher to receive every event.
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
}

pub async fn run(args: WatchArgs) -> Result<(), String> {
    validate(&args)?;
    let timeout = seconds("--timeout", args.target.timeout)?;
    let drain = seconds("--drain", args.drain)?;
    let duration = args
        .duration
        .map(|s| seconds("--duration", s))
        .transpose()?;
    let endpoints: Vec<String> = args.target.urls();
    let writer_url = if args.target.leader_only {
        find_leader(&endpoints, timeout).await?
    } else {
        endpoints[0].clone()
    };
    let key = args.key.clone().unwrap_or_else(|| {
        format!(
            "/bench/watch/{:016x}{}",
            rand::random::<u64>(),
            if args.prefix { "/" } else { "" }
        )
    });
    let connections = args.target.connections.unwrap_or(endpoints.len());
    let mut channels = Vec::with_capacity(connections);
    for i in 0..connections {
        channels.push(connect(&endpoints[i % endpoints.len()], None).await?);
    }
    let label = args
        .target
        .label
        .clone()
        .unwrap_or_else(|| endpoints.join(","));
    eprintln!(
        "bench watch: {} watchers of {key}{} on {} streams over {connections} connections to \
         {}; one writer to {writer_url}, {}{}",
        args.watchers,
        if args.prefix { " (prefix)" } else { "" },
        args.streams,
        endpoints.join(","),
        run_length(args.total, duration, "puts"),
        if args.rate > 0.0 {
            format!(" at {} puts/s", args.rate)
        } else {
            " as fast as it can".into()
        }
    );

    // The clock every stamp is read against: the writer's send times and the watchers'
    // arrival times are both offsets from it.
    let clock = Instant::now();
    let delivered = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = mpsc::channel(args.streams);
    let mut streams = Vec::with_capacity(args.streams);
    for s in 0..args.streams {
        let watchers = args.watchers / args.streams + usize::from(s < args.watchers % args.streams);
        let stream = WatchStream {
            index: s,
            watchers,
            key: Bytes::from(key.clone()),
            prefix: args.prefix,
            clock,
            delivered: delivered.clone(),
        };
        streams.push(tokio::spawn(stream.run(
            channels[s % channels.len()].clone(),
            ready_tx.clone(),
            stop_rx.clone(),
        )));
    }
    drop(ready_tx);
    // Every watcher is created before the first put, so each must see every put.
    let setup = async {
        for _ in 0..args.streams {
            match ready_rx.recv().await {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e),
                None => return Err("a watch stream ended during setup".to_string()),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, setup).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(format!(
                "the watchers were not all created within {timeout:?}"
            ));
        }
    }
    eprintln!("bench watch: {} watchers created", args.watchers);

    let stop_writing = Arc::new(AtomicBool::new(false));
    let interrupt = {
        let stop_writing = stop_writing.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("bench watch: interrupted; stopping the writer");
                stop_writing.store(true, Ordering::Relaxed);
            }
        })
    };
    let kv = KvClient::new(connect(&writer_url, Some(timeout)).await?);
    let written = Arc::new(AtomicU64::new(0));
    let progress = tokio::spawn(report_progress(written.clone(), delivered.clone()));
    let writer = Writer {
        key: key.clone(),
        prefix: args.prefix,
        key_space: args.key_space,
        value_size: args.value_size,
        total: args.total,
        rate: args.rate,
        clock,
        written: written.clone(),
        stop: stop_writing,
    };
    let write_started = clock.elapsed();
    let writes = writer.run(kv, duration).await;
    let write_ended = clock.elapsed();
    interrupt.abort();

    // Wait for every event of every acknowledged put to arrive, or for the drain time.
    let expected = writes.puts * args.watchers as u64;
    let drain_until = Instant::now() + drain;
    while delivered.load(Ordering::Relaxed) < expected && Instant::now() < drain_until {
        if streams.iter().all(|s| s.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(true);
    progress.abort();
    let mut total = StreamResult::default();
    for s in streams {
        match s.await {
            Ok(r) => total.merge(r),
            Err(e) => total.problem(format!("a watch stream's task failed: {e}")),
        }
    }

    let summary = Summary::new(
        label,
        &args,
        connections,
        writes,
        total,
        write_started,
        write_ended,
    );
    match args.target.write_out {
        WriteOut::Simple => print!("{}", summary.text()),
        WriteOut::Json => println!("{}", summary.json()),
    }
    summary.verdict()
}

fn validate(args: &WatchArgs) -> Result<(), String> {
    args.target.validate()?;
    if args.watchers == 0 || args.streams == 0 {
        return Err("--watchers and --streams must be at least 1".into());
    }
    if args.streams > args.watchers {
        return Err(format!(
            "--streams {} is more than --watchers {}: a stream would have no watcher",
            args.streams, args.watchers
        ));
    }
    if args.total == 0 && args.duration.is_none() {
        return Err("--total 0 (no limit) needs --duration".into());
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err(format!("--rate {}: expected 0 or more", args.rate));
    }
    if args.value_size < STAMP_BYTES {
        return Err(format!(
            "--value-size {} is too small: each value carries {STAMP_BYTES} bytes of stamp",
            args.value_size
        ));
    }
    if args.prefix && args.key_space == 0 {
        return Err("--key-space must be at least 1".into());
    }
    Ok(())
}

/// A put's value: its sequence number and send time, then padding to `size` bytes.
fn stamp(seq: u64, sent_ns: u64, size: usize) -> Bytes {
    let mut value = Vec::with_capacity(size);
    value.extend_from_slice(&seq.to_le_bytes());
    value.extend_from_slice(&sent_ns.to_le_bytes());
    value.resize(size, b'.');
    Bytes::from(value)
}

/// The sequence number and send time of a value made by [`stamp`].
fn read_stamp(value: &[u8]) -> Option<(u64, u64)> {
    let seq = u64::from_le_bytes(value.get(..8)?.try_into().ok()?);
    let sent = u64::from_le_bytes(value.get(8..STAMP_BYTES)?.try_into().ok()?);
    Some((seq, sent))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The single writer.
#[derive(Debug)]
struct Writer {
    key: String,
    prefix: bool,
    key_space: u64,
    value_size: usize,
    total: u64,
    rate: f64,
    clock: Instant,
    written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

/// What the writer did.
#[derive(Debug, Default)]
pub(super) struct Writes {
    /// Puts acknowledged: sequence numbers `0..puts`, which every watcher must receive.
    puts: u64,
    /// Put latencies (ns).
    latencies: Vec<u64>,
    error: Option<String>,
}

impl Writer {
    async fn run(self, mut kv: KvClient<Channel>, duration: Option<Duration>) -> Writes {
        let started = Instant::now();
        let mut ticks = (self.rate > 0.0).then(|| {
            let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / self.rate));
            // A put slower than the interval delays the next ones; no burst to catch up.
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        });
        let mut writes = Writes::default();
        for seq in 0.. {
            if (self.total > 0 && seq >= self.total)
                || duration.is_some_and(|d| started.elapsed() >= d)
                || self.stop.load(Ordering::Relaxed)
            {
                break;
            }
            if let Some(ticks) = ticks.as_mut() {
                ticks.tick().await;
            }
            let key = if self.prefix {
                format!("{}{:08}", self.key, seq % self.key_space)
            } else {
                self.key.clone()
            };
            let sent = self.clock.elapsed();
            let put = PutRequest {
                key: Bytes::from(key),
                value: stamp(seq, nanos(sent), self.value_size),
                ..Default::default()
            };
            match kv.put(put).await {
                Ok(_) => {
                    writes
                        .latencies
                        .push(nanos(self.clock.elapsed().saturating_sub(sent)));
                    writes.puts += 1;
                    self.written.fetch_add(1, Ordering::Relaxed);
                }
                Err(status) => {
                    // Applied or not is unknown, so what the watchers must receive is too.
                    writes.error = Some(format!(
                        "put {seq}: {:?}: {}",
                        status.code(),
                        status.message()
                    ));
                    break;
                }
            }
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_carries_its_sequence_number_and_send_time() {
        let value = stamp(7, 123_456_789, 100);
        assert_eq!(value.len(), 100);
        assert_eq!(read_stamp(&value), Some((7, 123_456_789)));
        assert_eq!(
            read_stamp(&value[..15]),
            None,
            "a value too short for a stamp"
        );
    }
}
