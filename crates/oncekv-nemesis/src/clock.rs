//! Clock skew with libfaketime (Debian's `faketime` package, `libfaketime.so.1`).
//!
//! Members of a clock-skew run start under `LD_PRELOAD=libfaketime.so.1` with
//! `FAKETIME_TIMESTAMP_FILE` naming a file of their own and `FAKETIME_NO_CACHE=1`, so
//! the library reads the offset from the file at every clock call and a new offset takes
//! effect at once, while the member runs. What it does to the clocks (measured with
//! libfaketime 0.9.10, see the crate README):
//!
//! - `CLOCK_REALTIME` moves by the offset, as expected;
//! - `CLOCK_MONOTONIC` (and `CLOCK_BOOTTIME`) are faked too, unless
//!   `FAKETIME_DONT_FAKE_MONOTONIC=1`: under the library they read the faked wall-clock
//!   time (seconds since 1970, not since boot), so a change of offset makes the monotonic
//!   clock jump by the same amount, forwards or backwards. That is the clock Rust's
//!   `Instant`, tokio's timers and a leader's read lease use (a Rust binary calls glibc's
//!   `clock_gettime`, which the library replaces);
//! - so members run with `FAKETIME_DONT_FAKE_MONOTONIC=1`: the wall clock steps, as a
//!   real machine's does, the monotonic clock does not;
//! - Go programs (etcd) read their clocks through the vDSO, not through libc, so the
//!   library changes nothing for them: against etcd the clock-skew nemesis is a no-op,
//!   and the report says so.

use std::fs;
use std::path::{Path, PathBuf};

/// Where Debian's package puts the library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The library, if installed.
pub fn library() -> Option<PathBuf> {
    let candidates = [
        LIBFAKETIME,
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// The file's text for an offset of `secs` seconds (libfaketime's relative form).
pub fn offset_text(secs: i64) -> String {
    if secs == 0 {
        "+0\n".to_string()
    } else {
        format!("{secs:+}s\n")
    }
}

/// Writes the offset whole (a new file renamed over the old one: the library, reading
/// on every call, never sees half a line).
pub fn write_offset(path: &Path, secs: i64) -> Result<(), String> {
    let tmp = path.with_extension("new");
    fs::write(&tmp, offset_text(secs)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // libfaketime takes a relative offset only with its sign ("+8s", "-8s").
    #[test]
    fn offsets_always_carry_their_sign() {
        assert_eq!(offset_text(8), "+8s\n");
        assert_eq!(offset_text(-8), "-8s\n");
        assert_eq!(offset_text(0), "+0\n");
    }

    #[test]
    fn an_offset_replaces_the_file_whole() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let f = dir.path().join("faketime");
        write_offset(&f, 5)?;
        write_offset(&f, -3)?;
        assert_eq!(fs::read_to_string(&f).map_err(|e| e.to_string())?, "-3s\n");
        assert!(!f.with_extension("new").exists());
        Ok(())
    }
}
