//! `oncekv bench compare --scale`: what a cluster costs as its data grows.
//!
//! Per system (etcd, then oncekv, or as `--systems` says), from empty data directories:
//! `--duration` of puts of `--value-size` bytes over `--key-space` keys, every revision
//! kept (neither etcd 3.4 nor `oncekv dev` compacts unless told to); the resident memory
//! of the cluster's processes; a graceful stop (SIGTERM, and a wait for the processes to
//! exit); the disk the data directories take; a restart on the same data and ports,
//! timed from the spawn to the first linearizable get that succeeds; resident memory
//! again; `--read-duration` of linearizable gets; resident memory once more.
//!
//! A user sizes a machine for the worst of these, and the restart is where a member
//! rebuilds from its snapshot and log, so memory is read at both ends of it.
//!
//! Written to `--out`: `scale.md` (the table, the machine, the command) and `scale.csv`
//! (one row per system). oncekv's figures are set against etcd's per acknowledged put, so
//! that a system that accepted more writes is not charged for holding them.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use oncekv_proto::etcdserverpb::RangeRequest;
use oncekv_proto::etcdserverpb::kv_client::KvClient;

use super::cluster::Cluster;
use super::machine::{cpus, disk_usage_bytes, load_average, memory_total_bytes};
use super::report::utc_now;
use super::{CompareArgs, System, common};
use crate::bench::{ClientKind, Summary, Workload, connect, measure, url_of};

/// How long the processes may take to exit after SIGTERM before they are killed.
const STOP_LIMIT: Duration = Duration::from_secs(120);
/// How long a restarted cluster may take to serve its first linearizable get (a member
/// replaying gigabytes of log takes tens of seconds).
const FIRST_READ_LIMIT: Duration = Duration::from_secs(900);

/// What `compare` found out before the clusters ran.
pub(super) struct Machine<'a> {
    pub(super) etcd_version: &'a str,
    pub(super) oncekv: &'a Path,
    /// Where the data directories go (one per system, removed after it unless --keep).
    pub(super) work: &'a Path,
    /// fdatasync p50 and p99, µs.
    pub(super) fsync: (f64, f64),
    /// Loopback TCP round trip p50, µs.
    pub(super) rtt: f64,
}

/// One system's figures. Memory and disk in bytes, all processes of the cluster together.
#[derive(Debug, Clone, Default)]
struct Outcome {
    puts: u64,
    put_errors: u64,
    put_seconds: f64,
    put_p99_ms: f64,
    put_p999_ms: f64,
    put_max_ms: f64,
    rss_filled: u64,
    stop_seconds: f64,
    /// Every process exited by itself after SIGTERM (else it was killed).
    stop_clean: bool,
    disk: u64,
    first_read_seconds: f64,
    rss_first_read: u64,
    reads: u64,
    read_errors: u64,
    read_seconds: f64,
    read_p99_ms: f64,
    rss_after_reads: u64,
    first_error: Option<String>,
}

impl Outcome {
    fn put_rate(&self) -> f64 {
        rate(self.puts, self.put_seconds)
    }

    fn read_rate(&self) -> f64 {
        rate(self.reads, self.read_seconds)
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

pub(super) async fn run(
    args: &CompareArgs,
    machine: &Machine<'_>,
    value: &Bytes,
) -> Result<(), String> {
    let load = load_average();
    let mut systems: Vec<System> = Vec::new();
    for &s in &args.systems {
        if !systems.contains(&s) {
            systems.push(s);
        }
    }
    let mut results = Vec::new();
    for system in systems {
        let dir = machine.work.join(format!("scale-{}", system.name()));
        let outcome = measure_system(args, machine, system, &dir, value).await?;
        results.push((system, outcome));
        if !args.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    let md = args.out.join("scale.md");
    let csv = args.out.join("scale.csv");
    let text = markdown(args, machine, &results, &utc_now(), load);
    std::fs::write(&md, &text).map_err(|e| format!("writing {}: {e}", md.display()))?;
    std::fs::write(&csv, csv_rows(&results))
        .map_err(|e| format!("writing {}: {e}", csv.display()))?;
    print!("{}", table(&results, machine.etcd_version));
    println!("wrote {} and {}", md.display(), csv.display());
    let failed: u64 = results
        .iter()
        .map(|(_, o)| o.put_errors + o.read_errors)
        .sum();
    if failed > 0 {
        let first = results.iter().find_map(|(_, o)| o.first_error.clone());
        return Err(format!(
            "{failed} requests failed; the first: {}",
            first.unwrap_or_default()
        ));
    }
    Ok(())
}

/// The whole procedure against one system; progress on stderr.
async fn measure_system(
    args: &CompareArgs,
    machine: &Machine<'_>,
    system: System,
    dir: &Path,
    value: &Bytes,
) -> Result<Outcome, String> {
    let name = system.name();
    let say = |what: String| eprintln!("bench compare --scale: {name}: {what}");
    say(format!(
        "starting 3 members on empty data in {}",
        dir.display()
    ));
    let mut cluster = match system {
        System::Etcd => Cluster::etcd(Path::new(&args.etcd), dir).await?,
        System::Oncekv => Cluster::oncekv(machine.oncekv, &args.oncekv_args, dir).await?,
    };
    let clients = args.clients().first().copied().unwrap_or(64);
    say(format!(
        "ready at {}; {clients} clients put {}-byte values over {} keys for {} s",
        cluster.endpoints.join(","),
        args.value_size(),
        args.key_space(),
        args.duration()
    ));
    let load = |cluster: &Cluster, secs: f64| {
        common(cluster, clients, secs, ClientKind::Wire, args.key_space())
    };
    let put = Workload::Put {
        value: value.clone(),
    };
    let puts: Summary = measure(&load(&cluster, args.duration()), put, true).await?;
    let rss_filled = cluster.rss_bytes();
    say(format!(
        "{} puts ({}/s, {} failed), p99 {} ms, p99.9 {} ms, worst {} ms; resident memory {} MiB",
        thousands(puts.ok),
        thousands(puts.rate.round() as u64),
        puts.errors,
        ms(puts.latency_ms[3]),
        ms(puts.p999_ms),
        ms(puts.latency_ms[4]),
        mib(rss_filled)
    ));

    say("stopping (SIGTERM)".into());
    let stopped = cluster.stop_gracefully(STOP_LIMIT).await?;
    let mut disk = 0;
    for data in &cluster.data {
        disk += disk_usage_bytes(data)?;
    }
    say(format!(
        "{} in {:.1} s; data directories {} MiB; restarting on them",
        if stopped.clean {
            "stopped"
        } else {
            "NOT STOPPED by SIGTERM, killed"
        },
        stopped.seconds,
        mib(disk)
    ));

    cluster.respawn()?;
    let first_read = first_linearizable_get(&mut cluster).await?;
    let rss_first_read = cluster.rss_bytes();
    say(format!(
        "first linearizable get {first_read:.1} s after the restart; resident memory {} MiB; \
         linearizable gets for {} s",
        mib(rss_first_read),
        args.read_duration()
    ));
    let range = Workload::Range {
        serializable: false,
    };
    let reads: Summary = measure(&load(&cluster, args.read_duration()), range, true).await?;
    let rss_after_reads = cluster.rss_bytes();
    say(format!(
        "{}/s linearizable gets ({} failed), p99 {} ms; resident memory {} MiB",
        thousands(reads.rate.round() as u64),
        reads.errors,
        ms(reads.latency_ms[3]),
        mib(rss_after_reads)
    ));
    cluster.stop().await;
    Ok(Outcome {
        puts: puts.ok,
        put_errors: puts.errors,
        put_seconds: puts.seconds,
        put_p99_ms: puts.latency_ms[3],
        put_p999_ms: puts.p999_ms,
        put_max_ms: puts.latency_ms[4],
        rss_filled,
        stop_seconds: stopped.seconds,
        stop_clean: stopped.clean,
        disk,
        first_read_seconds: first_read,
        rss_first_read,
        reads: reads.ok,
        read_errors: reads.errors,
        read_seconds: reads.seconds,
        read_p99_ms: reads.latency_ms[3],
        rss_after_reads,
        first_error: puts.first_error.or(reads.first_error),
    })
}

/// Seconds from the restart's spawn to the first linearizable get any member answers.
/// Tried every 20 ms against each member in turn, each try bounded by a second (a
/// member without a leader holds a linearizable read until it has one).
async fn first_linearizable_get(cluster: &mut Cluster) -> Result<f64, String> {
    let urls: Vec<String> = cluster.endpoints.iter().map(|e| url_of(e)).collect();
    let mut last = String::from("no attempt finished");
    loop {
        for url in &urls {
            let attempt = async {
                let channel = connect(url, Some(Duration::from_secs(1))).await?;
                KvClient::new(channel)
                    .range(RangeRequest {
                        key: Bytes::from_static(b"00000000"),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("{url}: {:?}: {}", s.code(), s.message()))
            };
            match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                Ok(Ok(_)) => return Ok(cluster.spawned.elapsed().as_secs_f64()),
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("{url}: no answer within 2 s"),
            }
        }
        cluster.check_running()?;
        if cluster.spawned.elapsed() > FIRST_READ_LIMIT {
            return Err(format!(
                "{} served no linearizable get within {} s of its restart; the last try: {last}",
                cluster.name,
                FIRST_READ_LIMIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// oncekv's figure per oncekv put over etcd's per etcd put (`None` without both).
fn per_put(o: &Outcome, e: &Outcome, figure: impl Fn(&Outcome) -> f64) -> Option<f64> {
    if o.puts == 0 || e.puts == 0 {
        return None;
    }
    let (o, e) = (figure(o) / o.puts as f64, figure(e) / e.puts as f64);
    (e > 0.0).then(|| o / e)
}

/// oncekv's figure over etcd's (`None` without both).
fn plain(o: &Outcome, e: &Outcome, figure: impl Fn(&Outcome) -> f64) -> Option<f64> {
    let e = figure(e);
    (e > 0.0).then(|| figure(o) / e)
}

fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"))
}

/// Memory after the restart over memory after filling, at a point of the restart.
fn growth(o: &Outcome, after: u64) -> f64 {
    if o.rss_filled == 0 {
        0.0
    } else {
        after as f64 / o.rss_filled as f64
    }
}

/// How a row shows one system's figure.
type Cell = Box<dyn Fn(&Outcome) -> String>;

/// The table: a row per figure, a column per system (etcd's headed by its version), and
/// oncekv against etcd.
fn table(results: &[(System, Outcome)], etcd_version: &str) -> String {
    let find = |s: System| results.iter().find(|(x, _)| *x == s).map(|(_, o)| o);
    let (e, o) = (find(System::Etcd), find(System::Oncekv));
    let both = e.zip(o).map(|(e, o)| (o, e));
    let mut rows: Vec<(&'static str, Cell, String)> = Vec::new();
    let ratio = |f: &dyn Fn(&(&Outcome, &Outcome)) -> String| both.as_ref().map_or("-".into(), f);
    rows.push((
        "puts acknowledged",
        Box::new(|x: &Outcome| {
            format!(
                "{} ({}/s{})",
                thousands(x.puts),
                thousands(x.put_rate().round() as u64),
                failed(x.put_errors)
            )
        }),
        ratio(&|(o, e)| format!("throughput {}", times(plain(o, e, Outcome::put_rate)))),
    ));
    rows.push((
        "put p99 / p99.9 / worst",
        Box::new(|x: &Outcome| {
            format!(
                "{} / {} / {} ms",
                ms(x.put_p99_ms),
                ms(x.put_p999_ms),
                ms(x.put_max_ms)
            )
        }),
        ratio(&|(o, e)| {
            format!(
                "{} / {} / {}",
                times(plain(o, e, |x| x.put_p99_ms)),
                times(plain(o, e, |x| x.put_p999_ms)),
                times(plain(o, e, |x| x.put_max_ms))
            )
        }),
    ));
    let memory = |figure: fn(&Outcome) -> u64| {
        ratio(&move |(o, e)| format!("{} per put", times(per_put(o, e, |x| figure(x) as f64))))
    };
    // A figure in bytes: MiB per system, per put against etcd.
    let bytes = |what: &'static str, figure: fn(&Outcome) -> u64| -> (&str, Cell, String) {
        let cell = move |x: &Outcome| format!("{} MiB", mib(figure(x)));
        (what, Box::new(cell), memory(figure))
    };
    rows.push(bytes("resident memory, 3 members, after filling", |x| {
        x.rss_filled
    }));
    rows.push(bytes(
        "resident memory after restart, at the first linearizable get",
        |x| x.rss_first_read,
    ));
    rows.push(bytes("resident memory after restart and the gets", |x| {
        x.rss_after_reads
    }));
    rows.push((
        "restart's growth of memory (at the first get; after the gets)",
        Box::new(|x: &Outcome| {
            format!(
                "{:.2}x; {:.2}x",
                growth(x, x.rss_first_read),
                growth(x, x.rss_after_reads)
            )
        }),
        ratio(&|(o, e)| {
            format!(
                "{}; {}",
                times(plain(o, e, |x| growth(x, x.rss_first_read))),
                times(plain(o, e, |x| growth(x, x.rss_after_reads)))
            )
        }),
    ));
    rows.push(bytes("disk (data directories, after the stop)", |x| x.disk));
    rows.push((
        "graceful stop (SIGTERM to exit)",
        Box::new(|x: &Outcome| {
            let killed = if x.stop_clean { "" } else { ", then killed" };
            format!("{:.1} s{killed}", x.stop_seconds)
        }),
        ratio(&|(o, e)| format!("{} per put", times(per_put(o, e, |x| x.stop_seconds)))),
    ));
    rows.push((
        "restart to the first linearizable get",
        Box::new(|x: &Outcome| format!("{:.1} s", x.first_read_seconds)),
        ratio(&|(o, e)| format!("{} per put", times(per_put(o, e, |x| x.first_read_seconds)))),
    ));
    rows.push((
        "linearizable gets after restart",
        Box::new(|x: &Outcome| {
            format!(
                "{}/s, p99 {} ms{}",
                thousands(x.read_rate().round() as u64),
                ms(x.read_p99_ms),
                failed(x.read_errors)
            )
        }),
        ratio(&|(o, e)| {
            format!(
                "rate {}, p99 {}",
                times(plain(o, e, Outcome::read_rate)),
                times(plain(o, e, |x| x.read_p99_ms))
            )
        }),
    ));

    let mut out =
        format!("| per system | etcd {etcd_version} | oncekv | oncekv per put vs etcd |\n");
    out.push_str("|---|---:|---:|---|\n");
    let cell = |x: Option<&Outcome>, f: &dyn Fn(&Outcome) -> String| x.map_or("-".into(), f);
    for (what, figure, vs) in &rows {
        let _ = writeln!(
            out,
            "| {what} | {} | {} | {vs} |",
            cell(e, figure.as_ref()),
            cell(o, figure.as_ref())
        );
    }
    out
}

/// The command that repeats this run, every default spelled out.
fn command(args: &CompareArgs) -> String {
    let mut c = format!(
        "oncekv bench compare --scale --systems {} --clients {} --duration {} --value-size {} \
         --key-space {} --read-duration {}",
        args.systems
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(","),
        args.clients().first().copied().unwrap_or(64),
        args.duration(),
        args.value_size(),
        args.key_space(),
        args.read_duration(),
    );
    if args.etcd != Path::new("etcd") {
        let _ = write!(c, " --etcd {}", args.etcd.display());
    }
    if let Some(oncekv) = &args.oncekv {
        let _ = write!(c, " --oncekv {}", oncekv.display());
    }
    for a in &args.oncekv_args {
        let _ = write!(c, " --oncekv-arg={a}");
    }
    c
}

fn markdown(
    args: &CompareArgs,
    machine: &Machine<'_>,
    results: &[(System, Outcome)],
    date: &str,
    load: f64,
) -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut md = format!("# Cost as data grows: etcd and oncekv, {date}\n\n");
    let _ = writeln!(
        md,
        "{} CPUs, {:.1} GiB of memory, Linux {}; fdatasync of a 256-byte append p50 {:.0} µs, \
         p99 {:.0} µs; loopback TCP round trip p50 {:.0} µs; load average {load:.2} at the \
         start. etcd {} (3 processes) and oncekv {} (`oncekv dev`: 3 members in one \
         process), fsync on, on 127.0.0.1.\n",
        cpus(),
        memory_total_bytes() as f64 / (1u64 << 30) as f64,
        kernel.trim(),
        machine.fsync.0,
        machine.fsync.1,
        machine.rtt,
        machine.etcd_version,
        env!("CARGO_PKG_VERSION"),
    );
    let _ = writeln!(
        md,
        "Per system, from empty data directories: {} clients put {}-byte values to random \
         keys of {} (8-byte keys) for {} s over the etcd v3 wire protocol (`oncekv bench`, \
         the same code for both), every revision kept (neither compacts by default); then \
         SIGTERM and a wait for the processes to exit; a restart on the same data \
         directories and ports; from the first linearizable get that succeeds, {} s of \
         linearizable gets of the same keys by the same clients. Resident memory is VmRSS \
         summed over the cluster's processes; disk is what `du` counts in the data \
         directories.\n",
        args.clients().first().copied().unwrap_or(64),
        args.value_size(),
        args.key_space(),
        args.duration(),
        args.read_duration(),
    );
    let _ = writeln!(md, "Command: `{}`\n", command(args));
    md.push_str(&table(results, machine.etcd_version));
    md.push_str(
        "\n\"per put\": (oncekv's figure / oncekv's puts) / (etcd's figure / etcd's puts); \
         below 1, oncekv spends less per acknowledged put. Throughput, latency, growth and \
         gets: the plain ratio oncekv / etcd. Absolute figures move by tens of percent \
         between runs on a shared machine: compare ratios from one run. Every figure is in \
         scale.csv.\n",
    );
    md
}

fn csv_rows(results: &[(System, Outcome)]) -> String {
    let mut out = String::from(
        "system,puts,put_errors,put_seconds,put_rate,put_p99_ms,put_p999_ms,put_max_ms,\
         rss_filled_bytes,stop_seconds,stop_clean,disk_bytes,first_read_seconds,\
         rss_first_read_bytes,reads,read_errors,read_seconds,read_rate,read_p99_ms,\
         rss_after_reads_bytes\n",
    );
    for (system, o) in results {
        let _ = writeln!(
            out,
            "{},{},{},{:.3},{:.1},{:.3},{:.3},{:.3},{},{:.3},{},{},{:.3},{},{},{},{:.3},{:.1},{:.3},{}",
            system.name(),
            o.puts,
            o.put_errors,
            o.put_seconds,
            o.put_rate(),
            o.put_p99_ms,
            o.put_p999_ms,
            o.put_max_ms,
            o.rss_filled,
            o.stop_seconds,
            o.stop_clean,
            o.disk,
            o.first_read_seconds,
            o.rss_first_read,
            o.reads,
            o.read_errors,
            o.read_seconds,
            o.read_rate(),
            o.read_p99_ms,
            o.rss_after_reads,
        );
    }
    out
}

/// ", N failed", or nothing when none did.
fn failed(errors: u64) -> String {
    if errors > 0 {
        format!(", {} failed", thousands(errors))
    } else {
        String::new()
    }
}

/// Mebibytes, rounded, with thousands separators.
fn mib(bytes: u64) -> String {
    thousands((bytes as f64 / (1u64 << 20) as f64).round() as u64)
}

/// Milliseconds with three significant figures or so.
fn ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// 1234567 → "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn outcome(puts: u64, rss_mib: u64, first_read_seconds: f64) -> Outcome {
        Outcome {
            puts,
            put_seconds: 10.0,
            put_p99_ms: 20.0,
            put_p999_ms: 40.0,
            put_max_ms: 300.0,
            rss_filled: rss_mib * MIB,
            stop_seconds: 1.0,
            stop_clean: true,
            disk: 2 * rss_mib * MIB,
            first_read_seconds,
            rss_first_read: 2 * rss_mib * MIB,
            reads: 5000,
            read_seconds: 5.0,
            read_p99_ms: 10.0,
            rss_after_reads: 3 * rss_mib * MIB,
            ..Outcome::default()
        }
    }

    /// The ratios are what the table is for: each system's figure is divided by its own
    /// puts, so three times the writes in 4.2 times the memory is 1.40x per put, not 4.2x.
    #[test]
    fn memory_disk_and_time_are_compared_per_acknowledged_put() {
        let mut o = outcome(3000, 420, 3.0);
        o.put_max_ms = 900.0;
        o.put_errors = 2;
        let results = vec![(System::Etcd, outcome(1000, 100, 2.0)), (System::Oncekv, o)];
        let t = table(&results, "3.4.23");
        assert!(
            t.starts_with("| per system | etcd 3.4.23 | oncekv |"),
            "{t}"
        );
        for row in [
            "| puts acknowledged | 1,000 (100/s) | 3,000 (300/s, 2 failed) | throughput 3.00x |",
            "| put p99 / p99.9 / worst | 20.0 / 40.0 / 300 ms | 20.0 / 40.0 / 900 ms | 1.00x / 1.00x / 3.00x |",
            "| resident memory, 3 members, after filling | 100 MiB | 420 MiB | 1.40x per put |",
            "| resident memory after restart and the gets | 300 MiB | 1,260 MiB | 1.40x per put |",
            "| restart's growth of memory (at the first get; after the gets) | 2.00x; 3.00x | 2.00x; 3.00x | 1.00x; 1.00x |",
            "| disk (data directories, after the stop) | 200 MiB | 840 MiB | 1.40x per put |",
            // (3 s / 3000) / (2 s / 1000)
            "| restart to the first linearizable get | 2.0 s | 3.0 s | 0.50x per put |",
            "| linearizable gets after restart | 1,000/s, p99 10.0 ms | 1,000/s, p99 10.0 ms | rate 1.00x, p99 1.00x |",
        ] {
            assert!(t.contains(row), "no row {row:?} in\n{t}");
        }
        let csv = csv_rows(&results);
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.contains("\noncekv,3000,2,10.000,300.0,20.000,40.000,900.000,"));
    }

    /// One system alone, or one that acknowledged nothing, gives dashes, never a
    /// division by zero.
    #[test]
    fn a_missing_system_or_no_puts_leaves_the_ratio_out() {
        let t = table(&[(System::Oncekv, outcome(3000, 420, 3.0))], "3.4");
        assert!(
            t.contains("| resident memory, 3 members, after filling | - | 420 MiB | - |"),
            "{t}"
        );
        let t = table(
            &[
                (System::Etcd, outcome(0, 100, 2.0)),
                (System::Oncekv, outcome(3000, 420, 3.0)),
            ],
            "3.4",
        );
        assert!(t.contains("| 100 MiB | 420 MiB | - per put |"), "{t}");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        compare: CompareArgs,
    }

    /// --scale takes its own defaults (a minute of 1 KiB puts over a million keys) unless
    /// a flag is given, and refuses the flags of the other mode.
    #[test]
    fn scale_mode_has_its_own_defaults_and_flags() {
        let parse = |a: &[&str]| Cli::try_parse_from([&["x"][..], a].concat()).map(|c| c.compare);
        let scale = parse(&["--scale"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            command(&scale),
            "oncekv bench compare --scale --systems etcd,oncekv --clients 64 --duration 60 \
             --value-size 1024 --key-space 1000000 --read-duration 10"
        );
        let plain = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.clients(), &[1, 16, 64]);
        assert_eq!((plain.duration(), plain.value_size()), (5.0, 256));
        let given = parse(&["--scale", "--key-space", "200000", "--systems", "oncekv"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(given.key_space(), 200_000);
        assert_eq!(given.systems, vec![System::Oncekv]);
        assert!(parse(&["--scale", "--workloads", "put"]).is_err());
        assert!(parse(&["--read-duration", "5"]).is_err());
    }
}
