//! What `bench compare` writes from its runs: the markdown tables (`compare.md`), the
//! CSV of every run, the chart (`compare.svg`) and the ratio lines printed at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use plotters::prelude::*;

use super::machine::cpus;
use super::{CompareArgs, CompareWorkload, Figures, Run, Series};

/// "YYYY-MM-DD HH:MM UTC" for now.
pub(super) fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_date(secs)
}

fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar, in 400-year
    // eras of 146,097 days that start on March 1st).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

pub(super) struct Report<'a> {
    pub(super) args: &'a CompareArgs,
    pub(super) runs: &'a [Run],
    pub(super) etcd_version: &'a str,
    pub(super) fsync: (f64, f64),
    /// Loopback TCP round trip p50, µs.
    pub(super) rtt: f64,
    pub(super) date: String,
}

type Key = (CompareWorkload, Series, usize);

impl Report<'_> {
    /// Each series' figures over all rounds.
    fn aggregates(&self) -> BTreeMap<Key, Figures> {
        let mut sums: BTreeMap<Key, (Figures, usize)> = BTreeMap::new();
        for r in self.runs {
            let (a, rounds) = sums.entry((r.workload, r.series, r.clients)).or_default();
            a.ok += r.figures.ok;
            a.seconds += r.figures.seconds;
            a.cpu += r.figures.cpu;
            a.client_cpu += r.figures.client_cpu;
            a.p50_ms += r.figures.p50_ms;
            a.p99_ms += r.figures.p99_ms;
            *rounds += 1;
        }
        sums.into_iter()
            .map(|(key, (mut a, rounds))| {
                a.p50_ms /= rounds as f64;
                a.p99_ms /= rounds as f64;
                (key, a)
            })
            .collect()
    }

    /// Rate of `a` over rate of `b` in each round both ran.
    fn per_round_ratios(
        &self,
        w: CompareWorkload,
        clients: usize,
        a: Series,
        b: Series,
    ) -> Vec<f64> {
        let rate = |s: Series, round: usize| {
            self.runs
                .iter()
                .find(|r| {
                    r.workload == w && r.series == s && r.clients == clients && r.round == round
                })
                .map(|r| r.figures.rate())
        };
        (1..=self.args.rounds)
            .filter_map(|round| match (rate(a, round), rate(b, round)) {
                (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                _ => None,
            })
            .collect()
    }

    pub(super) fn markdown(&self) -> String {
        let agg = self.aggregates();
        let mut md = String::new();
        let _ = writeln!(md, "# oncekv and etcd on one machine, {}\n", self.date);
        let _ = writeln!(
            md,
            "{} CPUs; fdatasync of a 256-byte append p50 {:.0} µs, p99 {:.0} µs; loopback TCP \
             round trip p50 {:.0} µs. etcd {} \
             (3 processes) and oncekv {} (`oncekv dev`: 3 members in one process), fsync on, \
             on 127.0.0.1; {} round(s) of {} s runs, each round from empty data \
             directories, odd rounds etcd first. Load generator: `oncekv bench` in the same \
             process for both (etcd v3 wire protocol, one gRPC connection per member, \
             requests spread over all members; followers forward to the leader).\n",
            cpus(),
            self.fsync.0,
            self.fsync.1,
            self.rtt,
            self.etcd_version,
            env!("CARGO_PKG_VERSION"),
            self.args.rounds,
            self.args.duration(),
        );
        let _ = writeln!(
            md,
            "Command: `oncekv bench compare --clients {} --workloads {} --duration {} --rounds {} --value-size {} --key-space {}{}`\n",
            self.args
                .clients()
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.args
                .workloads
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(","),
            self.args.duration(),
            self.args.rounds,
            self.args.value_size(),
            self.args.key_space(),
            self.args
                .oncekv_args
                .iter()
                .map(|a| format!(" --oncekv-arg={a}"))
                .collect::<String>(),
        );
        for &w in &self.args.workloads {
            let _ = match w {
                CompareWorkload::Put => writeln!(
                    md,
                    "## put ({}-byte values, 8-byte keys over {} keys)\n",
                    self.args.value_size(),
                    self.args.key_space()
                ),
                CompareWorkload::Range => writeln!(
                    md,
                    "## range (linearizable gets of one key, over {} keys)\n",
                    self.args.key_space()
                ),
            };
            let _ = writeln!(
                md,
                "| clients | etcd req/s | oncekv req/s | oncekv/etcd | per round | etcd p50 / p99 ms | oncekv p50 / p99 ms | server CPU µs/req etcd / oncekv | load generator CPU µs/req etcd / oncekv |"
            );
            let _ = writeln!(
                md,
                "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
            );
            for &c in self.args.clients() {
                let e = figures(&agg, (w, Series::Etcd, c));
                let o = figures(&agg, (w, Series::Oncekv, c));
                let _ = writeln!(
                    md,
                    "| {c} | {:.0} | {:.0} | **{}** | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
                    e.rate(),
                    o.rate(),
                    ratio(o.rate(), e.rate()),
                    ratios(&self.per_round_ratios(w, c, Series::Oncekv, Series::Etcd)),
                    e.p50_ms,
                    e.p99_ms,
                    o.p50_ms,
                    o.p99_ms,
                    e.cpu_per_op_us(),
                    o.cpu_per_op_us(),
                    e.client_cpu_per_op_us(),
                    o.client_cpu_per_op_us(),
                );
            }
            // One write's floor: it is durable on a quorum once the leader's and a
            // follower's fsync are done, and it crosses the network at least twice (client
            // to leader and back, leader to follower and back).
            if w == CompareWorkload::Put && self.args.clients().contains(&1) {
                let e = figures(&agg, (w, Series::Etcd, 1));
                let o = figures(&agg, (w, Series::Oncekv, 1));
                let floor_ms = (self.fsync.0 + 2.0 * self.rtt) / 1000.0;
                if o.p50_ms > 0.0 && e.p50_ms > 0.0 {
                    let _ = writeln!(
                        md,
                        "\nOne client's put against the floor of one fdatasync plus two loopback \
                         round trips ({floor_ms:.2} ms): oncekv's p50 is {} times it, etcd's {}.",
                        ratio(o.p50_ms, floor_ms),
                        ratio(e.p50_ms, floor_ms),
                    );
                }
            }
            // What the machine allows at the most clients: a ratio to etcd cannot exceed
            // this, however cheap oncekv's side, since the load runs on the same CPUs.
            if let Some(&c) = self.args.clients().iter().max() {
                let e = figures(&agg, (w, Series::Etcd, c));
                let o = figures(&agg, (w, Series::Oncekv, c));
                let ceiling = o.ceiling(cpus());
                if ceiling > 0.0 && e.rate() > 0.0 {
                    let _ = writeln!(
                        md,
                        "\nThe load generator shares the machine: at {c} clients it spent {:.0} µs \
                         of CPU per request against oncekv, so {} CPUs complete at most {:.0} \
                         requests/s even with a server that cost nothing, {} times etcd's rate.",
                        o.client_cpu_per_op_us(),
                        cpus(),
                        ceiling,
                        ratio(ceiling, e.rate()),
                    );
                }
            }
            let tracked = self
                .args
                .clients
                .iter()
                .any(|&c| agg.contains_key(&(w, Series::OncekvTracked, c)));
            if tracked {
                let _ = writeln!(
                    md,
                    "\nThe oncekv client against oncekv (it sends to the leader; one client, one session, per member endpoint, shared by the request loops):\n"
                );
                let _ = writeln!(
                    md,
                    "| clients | exactly-once req/s | untracked req/s | exactly-once/untracked | per round | exactly-once p50 / p99 ms | untracked p50 / p99 ms |"
                );
                let _ = writeln!(md, "| ---: | ---: | ---: | ---: | --- | ---: | ---: |");
                for &c in self.args.clients() {
                    let t = figures(&agg, (w, Series::OncekvTracked, c));
                    let u = figures(&agg, (w, Series::OncekvUntracked, c));
                    let _ = writeln!(
                        md,
                        "| {c} | {:.0} | {:.0} | **{}** | {} | {:.2} / {:.2} | {:.2} / {:.2} |",
                        t.rate(),
                        u.rate(),
                        ratio(t.rate(), u.rate()),
                        ratios(&self.per_round_ratios(
                            w,
                            c,
                            Series::OncekvTracked,
                            Series::OncekvUntracked
                        )),
                        t.p50_ms,
                        t.p99_ms,
                        u.p50_ms,
                        u.p99_ms,
                    );
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(
            md,
            "Rates are requests over seconds summed across rounds; latencies are the mean of the rounds' percentiles. Every run is in runs.csv; the chart is compare.svg."
        );
        md
    }

    /// The ratio lines printed at the end of the run.
    pub(super) fn summary(&self) -> String {
        let agg = self.aggregates();
        let mut out = String::new();
        for &w in &self.args.workloads {
            for &c in self.args.clients() {
                let e = figures(&agg, (w, Series::Etcd, c));
                let o = figures(&agg, (w, Series::Oncekv, c));
                let _ = writeln!(
                    out,
                    "{:<5} {c:>4} clients: etcd {:>8.0}/s  oncekv {:>8.0}/s  oncekv/etcd {} (per round {})",
                    w.name(),
                    e.rate(),
                    o.rate(),
                    ratio(o.rate(), e.rate()),
                    ratios(&self.per_round_ratios(w, c, Series::Oncekv, Series::Etcd)),
                );
            }
        }
        out
    }

    pub(super) fn csv(&self) -> String {
        let mut out = String::from(
            "round,server,client,workload,clients,ok,errors,seconds,rate,p50_ms,p99_ms,server_cpu_s,client_cpu_s,load\n",
        );
        for r in self.runs {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{:.3},{:.1},{:.3},{:.3},{:.2},{:.2},{:.2}",
                r.round,
                if r.series == Series::Etcd {
                    "etcd"
                } else {
                    "oncekv"
                },
                r.series.client().name(),
                r.workload.name(),
                r.clients,
                r.figures.ok,
                r.errors,
                r.figures.seconds,
                r.figures.rate(),
                r.figures.p50_ms,
                r.figures.p99_ms,
                r.figures.cpu,
                r.figures.client_cpu,
                r.load
            );
        }
        out
    }

    /// Per workload, a column of two panels: requests/s, then p50 (thick) and p99 (thin)
    /// latency, against the number of clients.
    pub(super) fn chart(&self, path: &Path) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
        let agg = self.aggregates();
        let columns = self.args.workloads.len();
        let root = SVGBackend::new(path, (560 * columns as u32, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let root = root
            .titled(
                &format!(
                    "oncekv vs etcd {}, 3 members each, {} CPUs, fdatasync p50 {:.0} µs ({})",
                    self.etcd_version,
                    cpus(),
                    self.fsync.0,
                    self.date
                ),
                ("sans-serif", 18),
            )
            .map_err(|e| fail(&e))?;
        let panels = root.split_evenly((2, columns));
        // The client counts sit at evenly spaced positions (1, 16, 64 would crowd a
        // linear axis and get unlabelled ticks on a log one), each labelled with its count.
        let counts = self.args.clients();
        let x_range = -0.3..(counts.len().max(1) - 1) as f64 + 0.3;
        let x_label = |x: &f64| {
            let i = x.round();
            match counts.get(i as usize) {
                Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                _ => String::new(),
            }
        };
        for (col, &w) in self.args.workloads.iter().enumerate() {
            let lines: Vec<(Series, Vec<(f64, Figures)>)> = Series::ALL
                .iter()
                .map(|&s| {
                    let points = self
                        .args
                        .clients
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &c)| agg.get(&(w, s, c)).map(|a| (i as f64, *a)))
                        .collect();
                    (s, points)
                })
                .filter(|(_, p): &(Series, Vec<_>)| !p.is_empty())
                .collect();
            let top = lines
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, a)| a.rate()))
                .fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(&panels[col])
                .caption(format!("{}: throughput", w.name()), ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range.clone(), 0.0..top * 1.15)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("clients")
                .y_desc("requests/s")
                .light_line_style(TRANSPARENT)
                .disable_x_mesh()
                .x_labels(counts.len() * 10 + 1)
                .x_label_formatter(&x_label)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(|e| fail(&e))?;
            for (s, points) in &lines {
                let color = s.color();
                let xy: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.rate())).collect();
                chart
                    .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                    .map_err(|e| fail(&e))?
                    .label(s.name())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(xy.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| fail(&e))?;

            let top = lines
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, a)| a.p99_ms))
                .fold(0.1, f64::max);
            let mut chart = ChartBuilder::on(&panels[columns + col])
                .caption(
                    format!("{}: latency, p50 (thick) and p99 (thin)", w.name()),
                    ("sans-serif", 16),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(x_range.clone(), 0.0..top * 1.15)
                .map_err(|e| fail(&e))?;
            chart
                .configure_mesh()
                .x_desc("clients")
                .y_desc("ms")
                .light_line_style(TRANSPARENT)
                .disable_x_mesh()
                .x_labels(counts.len() * 10 + 1)
                .x_label_formatter(&x_label)
                .draw()
                .map_err(|e| fail(&e))?;
            for (s, points) in &lines {
                let color = s.color();
                let p50: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.p50_ms)).collect();
                let p99: Vec<(f64, f64)> = points.iter().map(|(c, a)| (*c, a.p99_ms)).collect();
                chart
                    .draw_series(LineSeries::new(p50.clone(), color.stroke_width(3)))
                    .map_err(|e| fail(&e))?;
                chart
                    .draw_series(p50.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
                chart
                    .draw_series(LineSeries::new(p99, color.stroke_width(1)))
                    .map_err(|e| fail(&e))?;
            }
        }
        root.present().map_err(|e| fail(&e))?;
        Ok(())
    }
}

/// A series' figures over all rounds, or zeros where it has no run (a row then says so).
fn figures(agg: &BTreeMap<Key, Figures>, key: Key) -> Figures {
    agg.get(&key).copied().unwrap_or_default()
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn ratios(r: &[f64]) -> String {
    if r.is_empty() {
        return "-".into();
    }
    r.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::System;
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 (a leap day of a century year) 12:34.
        assert_eq!(utc_date(951_827_640), "2000-02-29 12:34 UTC");
        assert_eq!(utc_date(1_795_564_800), "2026-11-25 00:00 UTC");
    }

    fn run(round: usize, series: Series, clients: usize, ok: u64, seconds: f64) -> Run {
        Run {
            round,
            series,
            workload: CompareWorkload::Put,
            clients,
            errors: 0,
            load: 0.0,
            figures: Figures {
                ok,
                seconds,
                cpu: ok as f64 * 1e-4,
                client_cpu: ok as f64 * 5e-5,
                p50_ms: round as f64,
                p99_ms: 10.0 * round as f64,
            },
        }
    }

    fn args() -> CompareArgs {
        CompareArgs {
            clients: vec![1, 64],
            workloads: vec![CompareWorkload::Put],
            duration: Some(1.0),
            read_duration: None,
            rounds: 2,
            value_size: Some(256),
            key_space: Some(1000),
            scale: false,
            systems: vec![System::Etcd, System::Oncekv],
            no_oncekv_client: false,
            out: PathBuf::from("unused"),
            etcd: PathBuf::from("etcd"),
            oncekv: None,
            oncekv_args: Vec::new(),
            keep: false,
        }
    }

    #[test]
    fn ratios_are_taken_within_rounds_and_over_summed_rates() {
        let runs = vec![
            run(1, Series::Etcd, 64, 1000, 1.0),
            run(1, Series::Oncekv, 64, 3000, 1.0),
            run(2, Series::Oncekv, 64, 1000, 1.0),
            run(2, Series::Etcd, 64, 1000, 2.0),
        ];
        let args = args();
        let report = Report {
            args: &args,
            runs: &runs,
            etcd_version: "3.4.23",
            fsync: (150.0, 300.0),
            rtt: 25.0,
            date: utc_date(0),
        };
        // Round 1: 3000/1000; round 2: 1000/500.
        let per_round =
            report.per_round_ratios(CompareWorkload::Put, 64, Series::Oncekv, Series::Etcd);
        assert_eq!(per_round, vec![3.0, 2.0]);
        let agg = report.aggregates();
        let e = agg[&(CompareWorkload::Put, Series::Etcd, 64)];
        let o = agg[&(CompareWorkload::Put, Series::Oncekv, 64)];
        // Summed: 2000 puts in 3 s against 4000 in 2 s.
        assert!((o.rate() / e.rate() - 3.0).abs() < 1e-9);
        assert!((o.p50_ms - 1.5).abs() < 1e-9, "mean of the rounds' p50");
        let md = report.markdown();
        assert!(
            md.contains("| 64 | 667 | 2000 | **3.00** | 3.00 2.00 |"),
            "{md}"
        );
        // No run at 1 client: the row says so instead of dividing by zero.
        assert!(md.contains("| 1 | 0 | 0 | **-** | - |"), "{md}");
        // The load generator's 50 µs per request: 2 CPUs complete at most 40,000/s.
        assert!((o.client_cpu_per_op_us() - 50.0).abs() < 1e-9);
        assert!((o.ceiling(2) - 40_000.0).abs() < 1e-6);
        assert!(
            md.contains("at 64 clients it spent 50 µs of CPU per request against oncekv"),
            "{md}"
        );
        let csv = report.csv();
        assert_eq!(csv.lines().count(), 5);
        assert!(
            csv.contains("\n2,etcd,wire,put,64,1000,0,2.000,500.0,"),
            "{csv}"
        );
    }

    #[test]
    fn the_chart_is_an_svg_with_every_series() {
        let runs = vec![
            run(1, Series::Etcd, 1, 900, 1.0),
            run(1, Series::Etcd, 64, 6000, 1.0),
            run(1, Series::Oncekv, 1, 800, 1.0),
            run(1, Series::Oncekv, 64, 15000, 1.0),
            run(1, Series::OncekvTracked, 64, 14000, 1.0),
        ];
        let mut args = args();
        args.rounds = 1;
        let report = Report {
            args: &args,
            runs: &runs,
            etcd_version: "3.4.23",
            fsync: (150.0, 300.0),
            rtt: 25.0,
            date: utc_date(0),
        };
        // The floor: 150 µs fdatasync + 2 x 25 µs round trips; both p50s are 1 ms.
        let md = report.markdown();
        assert!(
            md.contains("(0.20 ms): oncekv's p50 is 5.00 times it, etcd's 5.00."),
            "{md}"
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("c.svg");
        report.chart(&path).unwrap_or_else(|e| panic!("{e}"));
        let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        for label in [
            "etcd",
            "oncekv, oncekv client exactly-once",
            "put: throughput",
        ] {
            assert!(svg.contains(label), "no {label:?} in the chart");
        }
        assert!(
            !svg.contains("untracked"),
            "a series with no runs is not drawn"
        );
    }
}
