//! What `bench watch` reports: progress once a second while it runs, then the summary
//! (as text or JSON) and the verdict that fails a run in which not every watcher received
//! every put exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::stream::StreamResult;
use super::{WatchArgs, Writes};
use crate::bench::{json_escape, percentile};

/// Once a second: puts acknowledged and events delivered, and their rates.
pub(super) async fn report_progress(written: Arc<AtomicU64>, delivered: Arc<AtomicU64>) {
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
pub(super) struct Summary {
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
    pub(super) fn new(
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

    pub(super) fn text(&self) -> String {
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

    pub(super) fn json(&self) -> String {
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
    pub(super) fn verdict(&self) -> Result<(), String> {
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
