//! A simulated disk that remembers what was synced, so a simulated crash loses exactly
//! what a real one could: unsynced bytes (a random prefix of them survives, as a torn
//! write) and directory entries created or removed since the directory's last sync.
//!
//! With `break_fsync` the disk acknowledges `fdatasync` without syncing anything: the
//! `--break fsync` switch that proves the checkers notice lost acknowledged writes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use oncekv_server::disk::{AppendFile, Disk, ReadAt};
use rand::Rng;

/// One file's bytes; `synced` of them survive a crash for sure.
#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    synced: usize,
}

type InodeRef = Arc<Mutex<Inode>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct Tree {
    /// The directory as the running process sees it.
    names: BTreeMap<PathBuf, InodeRef>,
    /// The directory entries a crash keeps (as of each directory's last sync).
    durable: BTreeMap<PathBuf, InodeRef>,
    dirs: BTreeSet<PathBuf>,
}

/// An in-memory [`Disk`] for one simulated node; it outlives the node's crashes.
#[derive(Debug, Default)]
pub struct MemDisk {
    tree: Mutex<Tree>,
    break_fsync: bool,
    /// How long each log batch takes to reach the disk (simulated milliseconds).
    sync_delay_ms: AtomicU64,
}

impl MemDisk {
    pub fn new(break_fsync: bool) -> MemDisk {
        MemDisk {
            tree: Mutex::default(),
            break_fsync,
            sync_delay_ms: AtomicU64::new(0),
        }
    }

    /// Makes every later log batch take `ms` of simulated time to reach the disk (0: no
    /// time, the default).
    pub fn set_sync_delay(&self, ms: u64) {
        self.sync_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// What a power loss leaves: durable directory entries, each file cut to its synced
    /// length plus a random part of what was written after it. Returns the bytes lost.
    pub fn crash(&self, rng: &mut impl Rng) -> u64 {
        let mut tree = lock(&self.tree);
        tree.names = tree.durable.clone();
        let mut lost = 0;
        for inode in tree.names.values() {
            let mut f = lock(inode);
            let unsynced = f.data.len().saturating_sub(f.synced);
            if unsynced > 0 {
                let keep = f.synced + rng.gen_range(0..=unsynced);
                lost += (f.data.len() - keep) as u64;
                f.data.truncate(keep);
            }
            f.synced = f.synced.min(f.data.len());
        }
        lost
    }

    /// Erases everything, as a new disk (a member replaced with an empty data directory).
    pub fn wipe(&self) {
        *lock(&self.tree) = Tree::default();
    }

    /// Total bytes stored (for the trace).
    pub fn bytes(&self) -> u64 {
        let tree = lock(&self.tree);
        tree.names.values().map(|i| lock(i).data.len() as u64).sum()
    }

    fn get(&self, path: &Path) -> io::Result<InodeRef> {
        lock(&self.tree)
            .names
            .get(path)
            .cloned()
            .ok_or_else(|| not_found(path))
    }

    fn insert(&self, path: &Path, fail_if_exists: bool) -> io::Result<Box<dyn AppendFile>> {
        let mut tree = lock(&self.tree);
        if fail_if_exists && tree.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        let inode = InodeRef::default();
        tree.names.insert(path.to_path_buf(), inode.clone());
        Ok(Box::new(MemFile {
            inode,
            break_fsync: self.break_fsync,
        }))
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

struct MemFile {
    inode: InodeRef,
    break_fsync: bool,
}

impl AppendFile for MemFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        lock(&self.inode).data.extend_from_slice(buf);
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        if !self.break_fsync {
            let mut f = lock(&self.inode);
            f.synced = f.data.len();
        }
        Ok(())
    }
}

#[derive(Debug)]
struct MemReader(InodeRef);

impl ReadAt for MemReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let f = lock(&self.0);
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = f
            .data
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(lock(&self.0).data.len() as u64)
    }
}

impl Disk for MemDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        lock(&self.tree).dirs.insert(dir.to_path_buf());
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let tree = lock(&self.tree);
        Ok(tree
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let inode = self.get(path)?;
        let data = lock(&inode).data.clone();
        Ok(data)
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn ReadAt>> {
        Ok(Arc::new(MemReader(self.get(path)?)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        self.insert(path, true)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        self.insert(path, false)
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let inode = self.get(path)?;
        let mut f = lock(&inode);
        let len = usize::try_from(len).map_err(io::Error::other)?;
        f.data.truncate(len);
        f.synced = f.synced.min(len);
        if !self.break_fsync {
            f.synced = f.data.len();
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        lock(&self.tree)
            .names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut tree = lock(&self.tree);
        let inode = tree.names.remove(from).ok_or_else(|| not_found(from))?;
        tree.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut tree = lock(&self.tree);
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        tree.durable.retain(|p, _| !in_dir(p));
        let entries: Vec<_> = tree
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), i.clone()))
            .collect();
        tree.durable.extend(entries);
        Ok(())
    }

    fn runs_on_runtime(&self) -> bool {
        true
    }

    fn sync_delay(&self) -> Duration {
        Duration::from_millis(self.sync_delay_ms.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    // The whole point of the simulated disk: synced data survives, unsynced may not.
    #[test]
    fn crash_keeps_synced_bytes_and_durable_names_only() {
        let disk = MemDisk::new(false);
        let dir = Path::new("/n/log");
        disk.create_dir_all(dir).unwrap();
        let mut a = disk.create_new(&dir.join("a")).unwrap();
        a.write_all(b"synced").unwrap();
        a.sync_data().unwrap();
        disk.sync_dir(dir).unwrap();
        a.write_all(b"-unsynced").unwrap();
        let mut b = disk.create_new(&dir.join("b")).unwrap();
        b.write_all(b"never in the directory").unwrap();
        b.sync_data().unwrap();
        disk.crash(&mut StdRng::seed_from_u64(1));
        let a = disk.read(&dir.join("a")).unwrap();
        assert!(a.starts_with(b"synced") && a.len() <= b"synced-unsynced".len());
        assert_eq!(disk.list_dir(dir).unwrap(), vec!["a".to_string()]);
    }

    // `--break fsync` must really lose acknowledged data, or the teeth test proves nothing.
    #[test]
    fn broken_fsync_loses_acknowledged_bytes() {
        let dir = Path::new("/n");
        let lost: u64 = (0..20)
            .map(|s| {
                let d = MemDisk::new(true);
                let mut f = d.create_new(&dir.join("a")).unwrap();
                f.write_all(&[7; 1000]).unwrap();
                f.sync_data().unwrap();
                d.sync_dir(dir).unwrap();
                d.crash(&mut StdRng::seed_from_u64(s))
            })
            .sum();
        assert!(lost > 0);
    }
}
