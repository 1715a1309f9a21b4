//! The file-system seam under the raft log and the snapshot file.
//!
//! Production uses [`OsDisk`] (plain `std::fs`, with real `fdatasync`/`fsync`). A
//! deterministic simulation passes its own [`Disk`] that keeps synced and unsynced bytes
//! apart, so that a simulated crash loses exactly what a real one could lose.
//!
//! The trait is deliberately small: it covers what the log store and the snapshot file
//! do (append-only files, whole-file reads, positional reads of sealed data, truncation on
//! recovery, rename, directory sync) and nothing else.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// A file system the log store and the snapshot file run on.
///
/// Durability contract, as POSIX: bytes written with [`AppendFile::write_all`] survive a
/// crash only once [`AppendFile::sync_data`] returned; a created, renamed or removed
/// directory entry only once [`Disk::sync_dir`] of its directory returned.
pub trait Disk: Send + Sync + fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the files in `dir` (not paths), in any order.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole content of `path` (`NotFound` if it does not exist).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A handle for positional reads. It keeps the file readable after it is removed.
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadAt>>;
    /// Creates `path`, failing if it exists, for appending.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Creates `path` empty (replacing any file of that name), for appending.
    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Cuts `path` to `len` bytes and makes the cut durable (`set_len` + `fsync`).
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// `true` for a deterministic simulation: the log store then replays and writes on the
    /// async runtime (one task) instead of on a blocking thread, so that the order of
    /// events is a function of the simulation seed alone.
    fn runs_on_runtime(&self) -> bool {
        false
    }
    /// How long each batch of the log takes to reach the disk, on the runtime's clock;
    /// read only where the log writes on the runtime ([`runs_on_runtime`](Self::runs_on_runtime)).
    /// A simulation slows a node's disk this way so that crashes land while the node's
    /// own entries are still unsynced and its peers' copies are not.
    fn sync_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// A file open for appending.
pub trait AppendFile: Send {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// `fdatasync`: everything written so far survives a crash once this returns `Ok`.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Reserves the file's blocks up to `len` bytes, zero-filled, so that appends within
    /// them change no file size and their `fdatasync` has less metadata to commit. The
    /// file's length becomes `len` (if it was shorter); the write position stays. A file
    /// system that cannot answers `Unsupported` (the default).
    fn preallocate(&mut self, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A file open for positional reads.
pub trait ReadAt: Send + Sync + fmt::Debug {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
}

/// A [`ReadAt`] file read in order from `pos` up to `end`, as [`io::Read`].
#[derive(Debug)]
pub struct ReadFrom<'a> {
    pub file: &'a dyn ReadAt,
    pub pos: u64,
    pub end: u64,
}

impl io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.end.saturating_sub(self.pos)).min(buf.len() as u64) as usize;
        if n > 0 {
            self.file.read_exact_at(&mut buf[..n], self.pos)?;
            self.pos += n as u64;
        }
        Ok(n)
    }
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsDisk;

/// The disk production runs on.
pub fn os_disk() -> Arc<dyn Disk> {
    Arc::new(OsDisk)
}

impl Disk for OsDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadAt>> {
        Ok(Arc::new(File::open(path)?))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(file))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        Ok(Box::new(File::create(path)?))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(len)?;
        file.sync_all()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

impl AppendFile for File {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        io::Write::write_all(self, buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }

    /// `fallocate` first, so that a full disk fails here rather than in a record's write;
    /// then zeros written over the new range. A fallocated block is "unwritten" until
    /// written, and the first write into it changes the extent map, which the
    /// `fdatasync` covering it must then commit through the file system's journal; into
    /// blocks already written, a record batch's fdatasync flushes data alone (figures in
    /// crates/oncekv-server/benches/README.md). The zeros reach the disk with the next
    /// `sync_data`.
    fn preallocate(&mut self, len: u64) -> io::Result<()> {
        use rustix::fs::FallocateFlags;
        let from = self.metadata()?.len();
        match rustix::fs::fallocate(&*self, FallocateFlags::empty(), 0, len) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP) => return Err(io::ErrorKind::Unsupported.into()),
            Err(e) => return Err(e.into()),
        }
        write_zeros(self, from, len)
    }
}

/// Writes zeros over `[from, to)` of `file` (positional writes: the file's write position
/// stays).
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    const CHUNK: usize = 64 * 1024;
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let mut at = from;
    while at < to {
        let n = (to - at).min(CHUNK as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or the new one:
/// temporary file, `fsync`, rename over `path`, `fsync` of the directory.
pub fn write_atomically(disk: &dyn Disk, path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(disk, path, |f| f.write_all(bytes))
}

/// [`write_atomically`] of what `write` writes.
pub fn write_atomically_with(
    disk: &dyn Disk,
    path: &Path,
    write: impl FnOnce(&mut dyn AppendFile) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = Path::new(&tmp_name);
    let mut f = disk.create(tmp)?;
    write(&mut *f)?;
    f.sync_data()?;
    drop(f);
    disk.rename(tmp, path)?;
    disk.sync_dir(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // The reservation is zeros, leaves what was written alone, and appends still land
    // right after the last write (not after the reserved range).
    #[test]
    fn preallocate_zero_fills_past_the_written_bytes_and_keeps_the_write_position() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("seg");
        let mut file = OsDisk.create_new(&path).unwrap();
        file.write_all(&[7u8; 100]).unwrap();
        match file.preallocate(200_000) {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return,
            r => r.unwrap(),
        }
        assert_eq!(fs::metadata(&path).unwrap().len(), 200_000);
        file.write_all(&[9u8; 50]).unwrap();
        // A second step starts where the first one ended.
        file.preallocate(300_000).unwrap();
        file.sync_data().unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 300_000);
        assert!(bytes[..100].iter().all(|&b| b == 7));
        assert!(bytes[100..150].iter().all(|&b| b == 9));
        assert!(bytes[150..].iter().all(|&b| b == 0));
    }
}
