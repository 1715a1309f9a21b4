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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use oncekv_proto::etcdserverpb::kv_client::KvClient;
use oncekv_proto::etcdserverpb::watch_client::WatchClient;
use oncekv_proto::etcdserverpb::watch_request::RequestUnion;
use oncekv_proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use oncekv_proto::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::{Target, WriteOut, connect, find_leader, json_escape, percentile, run_length, seconds};

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
struct Writes {
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

/// One Watch stream with its share of the watchers.
#[derive(Debug)]
struct WatchStream {
    index: usize,
    watchers: usize,
    key: Bytes,
    prefix: bool,
    clock: Instant,
    /// Events received by every stream together.
    delivered: Arc<AtomicU64>,
}

/// Where one watcher is in the writer's sequence.
#[derive(Debug, Default, Clone, Copy)]
struct WatcherState {
    /// The sequence number expected next.
    next_seq: u64,
    last_revision: i64,
}

/// What the streams saw (one stream's, or all of them merged).
#[derive(Debug, Default)]
struct StreamResult {
    /// Each watcher's position at the end.
    positions: Vec<u64>,
    events: u64,
    /// Delivery latencies (ns), one per event.
    latencies: Vec<u64>,
    gaps: u64,
    duplicates: u64,
    /// When the last event arrived, since the clock's start.
    last_event: Duration,
    problems: u64,
    first_problem: Option<String>,
}

impl StreamResult {
    fn problem(&mut self, message: String) {
        self.problems += 1;
        self.first_problem.get_or_insert(message);
    }

    fn merge(&mut self, mut other: StreamResult) {
        self.positions.append(&mut other.positions);
        self.events += other.events;
        self.latencies.append(&mut other.latencies);
        self.gaps += other.gaps;
        self.duplicates += other.duplicates;
        self.last_event = self.last_event.max(other.last_event);
        self.problems += other.problems;
        if let Some(p) = other.first_problem {
            self.first_problem.get_or_insert(p);
        }
    }
}

impl WatchStream {
    /// Creates the watchers, says so on `ready`, then checks and times every event until
    /// `stop` says the run is over.
    async fn run(
        self,
        channel: Channel,
        ready: mpsc::Sender<Result<(), String>>,
        mut stop: watch::Receiver<bool>,
    ) -> StreamResult {
        let mut result = StreamResult::default();
        // The request side stays open for the whole run: etcd ends a Watch call whose
        // client has closed its side.
        let (requests, request_stream) = mpsc::channel(self.watchers);
        let range_end = if self.prefix {
            oncekv_core::prefix_end(&self.key)
        } else {
            Bytes::new()
        };
        for _ in 0..self.watchers {
            let create = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: self.key.clone(),
                    range_end: range_end.clone(),
                    ..Default::default()
                })),
            };
            // Cannot fail: the channel has room for every create and its receiver is
            // alive until the call below takes it.
            let _ = requests.try_send(create);
        }
        let mut responses = match WatchClient::new(channel)
            .watch(ReceiverStream::new(request_stream))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(status) => {
                let _ = ready
                    .send(Err(format!(
                        "stream {}: Watch: {:?}: {}",
                        self.index,
                        status.code(),
                        status.message()
                    )))
                    .await;
                return result;
            }
        };
        let mut watchers: HashMap<i64, WatcherState> = HashMap::with_capacity(self.watchers);
        while watchers.len() < self.watchers {
            match self.next(&mut responses, &mut stop).await {
                Some(Ok(r)) if r.created && !r.canceled => {
                    if watchers
                        .insert(r.watch_id, WatcherState::default())
                        .is_some()
                    {
                        let _ = ready
                            .send(Err(format!(
                                "stream {}: watch id {} created twice",
                                self.index, r.watch_id
                            )))
                            .await;
                        return result;
                    }
                }
                Some(Ok(r)) => {
                    let _ = ready
                        .send(Err(format!(
                            "stream {}: unexpected response while creating watchers: {}",
                            self.index,
                            describe(&r)
                        )))
                        .await;
                    return result;
                }
                Some(Err(e)) => {
                    let _ = ready.send(Err(e)).await;
                    return result;
                }
                None => return result,
            }
        }
        let _ = ready.send(Ok(())).await;

        loop {
            let response = match self.next(&mut responses, &mut stop).await {
                Some(Ok(r)) => r,
                Some(Err(e)) => {
                    result.problem(e);
                    break;
                }
                None => break,
            };
            let arrived = self.clock.elapsed();
            let Some(watcher) = watchers.get_mut(&response.watch_id) else {
                result.problem(format!(
                    "stream {}: a response for unknown watch id {}",
                    self.index, response.watch_id
                ));
                continue;
            };
            if response.canceled {
                result.problem(format!(
                    "stream {}: watcher {} cancelled: {}",
                    self.index,
                    response.watch_id,
                    describe(&response)
                ));
                continue;
            }
            for event in &response.events {
                let kv = event.kv.as_ref();
                let stamp = kv.and_then(|kv| read_stamp(&kv.value));
                let (Some(kv), Some((seq, sent)), true) =
                    (kv, stamp, event.r#type == EventType::Put as i32)
                else {
                    result.problem(format!(
                        "stream {}: watcher {}: an event that is not one of the writer's puts",
                        self.index, response.watch_id
                    ));
                    continue;
                };
                result.events += 1;
                result.latencies.push(nanos(arrived).saturating_sub(sent));
                if seq < watcher.next_seq || kv.mod_revision <= watcher.last_revision {
                    result.duplicates += 1;
                    continue;
                }
                result.gaps += seq - watcher.next_seq;
                watcher.next_seq = seq + 1;
                watcher.last_revision = kv.mod_revision;
            }
            if !response.events.is_empty() {
                result.last_event = arrived;
                self.delivered
                    .fetch_add(response.events.len() as u64, Ordering::Relaxed);
            }
        }
        result.positions = watchers.values().map(|w| w.next_seq).collect();
        drop(requests);
        result
    }

    /// The next response, `None` once `stop` is set, an error if the stream ends first.
    async fn next(
        &self,
        responses: &mut Streaming<WatchResponse>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Result<WatchResponse, String>> {
        if *stop.borrow() {
            return None;
        }
        tokio::select! {
            message = responses.message() => Some(match message {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err(format!("stream {}: the server ended the stream", self.index)),
                Err(status) => Err(format!(
                    "stream {}: {:?}: {}",
                    self.index,
                    status.code(),
                    status.message()
                )),
            }),
            _ = stop.changed() => None,
        }
    }
}

/// A response's flags, for an error message.
fn describe(r: &WatchResponse) -> String {
    format!(
        "watch_id {} created {} canceled {} compact_revision {} cancel_reason {:?} events {}",
        r.watch_id,
        r.created,
        r.canceled,
        r.compact_revision,
        r.cancel_reason,
        r.events.len()
    )
}

/// Once a second: puts acknowledged and events delivered, and their rates.
async fn report_progress(written: Arc<AtomicU64>, delivered: Arc<AtomicU64>) {
    let started = Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let (mut last_puts, mut last_events, mut last_at) = (0u64, 0u64, started);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let puts = written.load(Ordering::Relaxed);
        let events = delivered.load(Ordering::Relaxed);
        let secs = now.duration_since(last_at).as_secs_f64();
        eprintln!(
            "bench watch: {:>6.1} s  {puts:>8} puts {:>7.0}/s  {events:>10} events {:>9.0}/s",
            now.duration_since(started).as_secs_f64(),
            (puts - last_puts) as f64 / secs,
            (events - last_events) as f64 / secs,
        );
        (last_puts, last_events, last_at) = (puts, events, now);
    }
}

/// The result of a run.
#[derive(Debug)]
struct Summary {
    label: String,
    watchers: usize,
    streams: usize,
    connections: usize,
    puts: u64,
    put_error: Option<String>,
    /// From the first put sent to the last put acknowledged.
    write_seconds: f64,
    /// From the first put sent to the last event received.
    seconds: f64,
    events: u64,
    gaps: u64,
    duplicates: u64,
    /// Events of acknowledged puts that never arrived (over all watchers).
    missing: u64,
    problems: u64,
    first_problem: Option<String>,
    /// p50, p90, p99, max (milliseconds).
    delivery_ms: [f64; 4],
    put_ms: [f64; 4],
}

/// p50, p90, p99 and max of latencies in ns, in milliseconds.
fn quantiles_ms(mut ns: Vec<u64>) -> [f64; 4] {
    ns.sort_unstable();
    let ms = |n: u64| n as f64 / 1e6;
    [
        ms(percentile(&ns, 0.50)),
        ms(percentile(&ns, 0.90)),
        ms(percentile(&ns, 0.99)),
        ms(ns.last().copied().unwrap_or(0)),
    ]
}

impl Summary {
    fn new(
        label: String,
        args: &WatchArgs,
        connections: usize,
        writes: Writes,
        streams: StreamResult,
        write_started: Duration,
        write_ended: Duration,
    ) -> Summary {
        // Watchers whose stream failed during the run report no position: all of theirs
        // count as missing.
        let reported = streams.positions.len() as u64;
        let missing = streams
            .positions
            .iter()
            .map(|&p| writes.puts.saturating_sub(p))
            .sum::<u64>()
            + (args.watchers as u64).saturating_sub(reported) * writes.puts;
        let end = streams.last_event.max(write_ended);
        Summary {
            label,
            watchers: args.watchers,
            streams: args.streams,
            connections,
            puts: writes.puts,
            put_error: writes.error,
            write_seconds: (write_ended.saturating_sub(write_started)).as_secs_f64(),
            seconds: (end.saturating_sub(write_started)).as_secs_f64(),
            events: streams.events,
            gaps: streams.gaps,
            duplicates: streams.duplicates,
            missing,
            problems: streams.problems,
            first_problem: streams.first_problem,
            delivery_ms: quantiles_ms(streams.latencies),
            put_ms: quantiles_ms(writes.latencies),
        }
    }

    fn rate(count: u64, seconds: f64) -> f64 {
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    }

    fn text(&self) -> String {
        let [p50, p90, p99, max] = self.delivery_ms;
        let [w50, w90, w99, wmax] = self.put_ms;
        let mut out = format!(
            "watch {}: {} watchers on {} streams over {} connections, one writer\n",
            self.label, self.watchers, self.streams, self.connections
        );
        out += &format!(
            "  puts: {} in {:.2} s ({:.0} puts/s); latency ms p50 {w50:.2}  p90 {w90:.2}  \
             p99 {w99:.2}  max {wmax:.2}\n",
            self.puts,
            self.write_seconds,
            Self::rate(self.puts, self.write_seconds)
        );
        out += &format!(
            "  events delivered: {} in {:.2} s ({:.0} events/s)\n",
            self.events,
            self.seconds,
            Self::rate(self.events, self.seconds)
        );
        out += &format!(
            "  delivery latency ms (put sent to event received): p50 {p50:.2}  p90 {p90:.2}  \
             p99 {p99:.2}  max {max:.2}\n"
        );
        out += &format!(
            "  exactly once, in order: {} gaps, {} duplicates, {} missing\n",
            self.gaps, self.duplicates, self.missing
        );
        if let Some(e) = &self.put_error {
            out += &format!("  put error: {e}\n");
        }
        if let Some(p) = &self.first_problem {
            out += &format!("  problems: {} (the first: {p})\n", self.problems);
        }
        out
    }

    fn json(&self) -> String {
        let [p50, p90, p99, max] = self.delivery_ms;
        let [w50, w90, w99, wmax] = self.put_ms;
        let string = |s: &Option<String>| {
            s.as_deref()
                .map_or_else(|| "null".to_string(), |e| format!("\"{}\"", json_escape(e)))
        };
        // Delivery latency first: a flat reader taking the first "p99" gets the delivery's.
        format!(
            concat!(
                "{{\"op\":\"watch\",\"label\":\"{}\",\"watchers\":{},\"streams\":{},",
                "\"connections\":{},\"events\":{},\"seconds\":{:.3},\"rate\":{:.1},",
                "\"latency_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"max\":{:.3}}},",
                "\"gaps\":{},\"duplicates\":{},\"missing\":{},\"problems\":{},",
                "\"puts\":{},\"write_seconds\":{:.3},\"put_rate\":{:.1},",
                "\"put_latency_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"max\":{:.3}}},",
                "\"put_error\":{},\"first_problem\":{}}}"
            ),
            json_escape(&self.label),
            self.watchers,
            self.streams,
            self.connections,
            self.events,
            self.seconds,
            Self::rate(self.events, self.seconds),
            p50,
            p90,
            p99,
            max,
            self.gaps,
            self.duplicates,
            self.missing,
            self.problems,
            self.puts,
            self.write_seconds,
            Self::rate(self.puts, self.write_seconds),
            w50,
            w90,
            w99,
            wmax,
            string(&self.put_error),
            string(&self.first_problem),
        )
    }

    /// Fails the run unless every watcher received every acknowledged put exactly once.
    fn verdict(&self) -> Result<(), String> {
        if let Some(e) = &self.put_error {
            return Err(format!("the writer failed: {e}"));
        }
        if self.puts == 0 {
            return Err("no put completed".into());
        }
        if self.gaps + self.duplicates + self.missing + self.problems > 0 {
            return Err(format!(
                "not every event exactly once: {} gaps, {} duplicates, {} missing, {} other \
                 problems{}",
                self.gaps,
                self.duplicates,
                self.missing,
                self.problems,
                self.first_problem
                    .as_deref()
                    .map_or_else(String::new, |p| format!(" (the first: {p})"))
            ));
        }
        Ok(())
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
