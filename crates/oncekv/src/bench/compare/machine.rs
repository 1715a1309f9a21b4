//! What `bench compare` reads about the machine it runs on: CPU time and resident memory
//! of a process, disk used under a directory, the load average, the CPU count and memory,
//! and probes of fsync and loopback latency, the floor under a write.

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

/// Fields 14 and 15 of /proc/PID/stat (utime, stime), in seconds. The kernel reports
/// them in USER_HZ, which is 100 on every Linux architecture this runs on.
pub(super) fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name (field 2) is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `rest` starts at field 3, so fields 14 and 15 are at 11 and 12.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// VmRSS of /proc/PID/status, in bytes (0 when the process is gone). It counts the
/// pages resident now, shared ones included, as `ps` and `top` do.
pub(super) fn process_rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| kib_field(&s, "VmRSS:"))
        .unwrap_or(0)
}

/// MemTotal of /proc/meminfo, in bytes (0 when unreadable).
pub(super) fn memory_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| kib_field(&s, "MemTotal:"))
        .unwrap_or(0)
}

/// The value of a "Name:   1234 kB" line, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix(name))?;
    let kib: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes of disk allocated to the files under `path`, as `du` counts them (blocks, not
/// lengths: a preallocated log segment counts whole). Symbolic links are not followed.
pub(super) fn disk_usage_bytes(path: &Path) -> Result<u64, String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", path.display()))?;
            total += disk_usage_bytes(&entry.path())?;
        }
    }
    Ok(total)
}

pub(super) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

pub(super) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// fdatasync latency of 256-byte appends to a file in `dir` (what a log write costs):
/// (p50, p99) in microseconds over 500 appends.
pub(super) fn fsync_probe(dir: &Path) -> Result<(f64, f64), String> {
    let path = dir.join("fsync-probe");
    let fail = |e: std::io::Error| format!("fsync probe in {}: {e}", dir.display());
    let mut file = std::fs::File::create(&path).map_err(fail)?;
    let block = [0x5au8; 256];
    let mut times = Vec::with_capacity(500);
    for _ in 0..500 {
        file.write_all(&block).map_err(fail)?;
        let start = Instant::now();
        file.sync_data().map_err(fail)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() * 99 / 100]))
}

/// The p50, in microseconds, of 2,000 round trips of a 64-byte message over a loopback
/// TCP connection (Nagle off) to a thread echoing it: the network's share of the floor
/// under one write's latency.
pub(super) fn round_trip_probe() -> Result<f64, String> {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    let fail = |e: std::io::Error| format!("round-trip probe: {e}");
    let listener = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        while conn.read_exact(&mut buf).is_ok() {
            conn.write_all(&buf)?;
        }
        Ok(())
    });
    let mut conn = TcpStream::connect(addr).map_err(fail)?;
    conn.set_nodelay(true).map_err(fail)?;
    let mut buf = [0x5au8; 64];
    let mut times = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let start = Instant::now();
        conn.write_all(&buf).map_err(fail)?;
        conn.read_exact(&mut buf).map_err(fail)?;
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    drop(conn);
    let _ = echo.join();
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields_are_read_as_bytes() {
        // The units /proc prints are KiB, whatever the "kB" says.
        let status = "Name:\toncekv\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\n";
        assert_eq!(kib_field(status, "VmRSS:"), Some(2048 * 1024));
        assert_eq!(kib_field(status, "VmSwap:"), None);
    }

    #[test]
    fn disk_usage_counts_the_files_below() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let empty = disk_usage_bytes(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(dir.path().join("a")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("a/f"), vec![1u8; 64 * 1024])
            .unwrap_or_else(|e| panic!("{e}"));
        let full = disk_usage_bytes(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(full >= empty + 64 * 1024, "{empty} then {full}");
        assert!(process_rss_bytes(std::process::id()) > 0);
    }
}
