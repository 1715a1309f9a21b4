//! etcd's database file (bbolt's format, version 2), written and read whole, in memory.
//!
//! A snapshot that etcdctl and etcdutl can open must be this file: `etcdctl snapshot
//! status` opens it with bbolt and runs bbolt's consistency check, and `snapshot restore`
//! hands it to etcd's backend. Only what a snapshot needs is here: a set of top-level
//! buckets of sorted key/value pairs, written once into a fresh file, and read back.
//!
//! The layout, as bbolt lays it out (all integers little-endian, as on the machines etcd
//! runs on):
//!
//! - Every page starts with a 16-byte header: page id (u64), flags (u16), element count
//!   (u16), overflow (u32: how many pages past this one the page runs on).
//! - Pages 0 and 1 are meta pages: magic, version, page size, flags, the root bucket
//!   (root page id, sequence), the freelist's page id, the high-water page id (pages
//!   in use), the transaction id and an FNV-1a 64 checksum of the fields before it. A
//!   reader takes the valid one with the higher transaction id.
//! - Page 2 here is an empty freelist: every page below the high-water mark is in use, and
//!   bbolt's check counts each page as reachable or free.
//! - Leaf pages hold 16-byte elements (flags, pos, key size, value size), then the keys
//!   and values; `pos` counts from the element itself to its key. Branch pages hold
//!   elements (pos, key size, child page id) whose key is the child's first key.
//! - A bucket is an element of its parent flagged as a bucket, whose value is the bucket's
//!   root page id and sequence; root 0 means the bucket's page follows inline in the value.
//!   The root bucket (in the meta) holds the top-level buckets.
//!
//! The writer never writes inline buckets (every bucket gets a root page, which bbolt
//! reads the same); the reader takes both. Nested buckets are refused: etcd has none.

use std::collections::{BTreeMap, HashSet};

/// The page size written: etcd's on Linux (the OS page size).
pub const PAGE_SIZE: usize = 4096;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const FREELIST: u16 = 0x10;
const BUCKET_FLAG: u32 = 0x01;
const HEADER: usize = 16;
const ELEMENT: usize = 16;
/// Bytes of the meta that the checksum covers (every field before it).
const META_SUMMED: usize = 56;
/// Deeper than any real tree: a loop in a damaged file stops here, not in a stack
/// overflow.
const MAX_DEPTH: usize = 64;

/// Buckets by name, each a list of key/value pairs in key order.
pub type Buckets = BTreeMap<Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>>;

/// A file that is not a bbolt database, or a damaged one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid etcd database file: {0}")]
pub struct DbError(String);

fn bad<T>(why: impl Into<String>) -> Result<T, DbError> {
    Err(DbError(why.into()))
}

/// Whether `bytes` starts as a bbolt file does (its first meta page's magic).
pub fn looks_like_db(bytes: &[u8]) -> bool {
    read_u32(bytes, HEADER) == Some(MAGIC)
}

// ---------------------------------------------------------------------------------------
// Writing

/// The file holding `buckets` (each bucket's pairs must be in strictly increasing key
/// order: the caller's invariant, checked in debug builds), in memory.
#[cfg(test)]
pub fn write(buckets: &Buckets) -> std::io::Result<Vec<u8>> {
    let mut db = DbWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, pairs) in buckets {
        db.bucket(
            name,
            pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
        )?;
    }
    Ok(db.finish()?.into_inner())
}

/// A database written one bucket at a time, each from an iterator of its pairs, into
/// `W` (a file, or memory) as its pages fill: only the current page and the first key of
/// each page are held, never the pairs.
pub struct DbWriter<W> {
    out: Writer<W>,
    /// Each bucket written so far, with its root page.
    roots: Vec<(Vec<u8>, u64)>,
}

impl<W> std::fmt::Debug for DbWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbWriter")
            .field("pages", &self.out.pages)
            .field("buckets", &self.roots.len())
            .finish()
    }
}

impl<W: std::io::Write + std::io::Seek> DbWriter<W> {
    /// A database written into `out`, from its current position (which becomes page 0).
    pub fn new(out: W) -> DbWriter<W> {
        DbWriter {
            out: Writer {
                out,
                pages: 0,
                page: Vec::new(),
                failed: None,
            },
            roots: Vec::new(),
        }
    }

    /// Writes bucket `name` holding `pairs`. Buckets must come in increasing name order
    /// and each bucket's keys in strictly increasing order (checked in debug builds).
    pub fn bucket<K, V>(
        &mut self,
        name: &[u8],
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> std::io::Result<()>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        debug_assert!(
            self.roots
                .last()
                .is_none_or(|(last, _)| last.as_slice() < name),
            "buckets out of order"
        );
        self.out.start()?;
        let root = self.out.tree(pairs, 0)?;
        self.roots.push((name.to_vec(), root));
        Ok(())
    }

    /// Writes the root bucket, then the metas and the freelist over the first three pages;
    /// the writer is left at the end of the file.
    pub fn finish(self) -> std::io::Result<W> {
        use std::io::SeekFrom;
        let DbWriter { mut out, roots } = self;
        out.start()?;
        let headers: Vec<(Vec<u8>, [u8; 16])> = roots
            .into_iter()
            .map(|(name, root)| {
                let mut h = [0u8; 16];
                h[..8].copy_from_slice(&root.to_le_bytes());
                (name, h)
            })
            .collect();
        let root = out.tree(headers.iter().map(|(n, h)| (n, h)), BUCKET_FLAG)?;
        let high_water = out.pages;
        let mut first = vec![0u8; 3 * PAGE_SIZE];
        for txid in 0..2u64 {
            let page = &mut first[txid as usize * PAGE_SIZE..][..PAGE_SIZE];
            page_header(page, txid, META, 0, 0);
            let meta = &mut page[HEADER..];
            meta[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            meta[4..8].copy_from_slice(&VERSION.to_le_bytes());
            meta[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
            // flags 12..16 and the root's sequence 24..32 stay zero.
            meta[16..24].copy_from_slice(&root.to_le_bytes());
            meta[32..40].copy_from_slice(&2u64.to_le_bytes());
            meta[40..48].copy_from_slice(&high_water.to_le_bytes());
            meta[48..56].copy_from_slice(&txid.to_le_bytes());
            let sum = fnv1a64(&meta[..META_SUMMED]);
            meta[56..64].copy_from_slice(&sum.to_le_bytes());
        }
        page_header(&mut first[2 * PAGE_SIZE..], 2, FREELIST, 0, 0);
        let mut w = out.out;
        let end = w.stream_position()?;
        let start = end - high_water * PAGE_SIZE as u64;
        w.seek(SeekFrom::Start(start))?;
        w.write_all(&first)?;
        w.seek(SeekFrom::Start(end))?;
        w.flush()?;
        Ok(w)
    }
}

struct Item<'a> {
    key: &'a [u8],
    value: &'a [u8],
    flags: u32,
}

struct Writer<W> {
    out: W,
    /// Pages written so far: the next page's id.
    pages: u64,
    /// The page being filled.
    page: Vec<u8>,
    /// A write that failed inside a tree (reported when the tree is done).
    failed: Option<std::io::Error>,
}

impl<W: std::io::Write> Writer<W> {
    /// Reserves pages 0 to 2 (the metas and the freelist, written by `finish`) before the
    /// first data page.
    fn start(&mut self) -> std::io::Result<()> {
        if self.pages == 0 {
            self.out.write_all(&[0u8; 3 * PAGE_SIZE])?;
            self.pages = 3;
        }
        Ok(())
    }

    /// Writes the page filled by `page` and returns its id.
    fn emit(&mut self) -> u64 {
        let id = self.pages;
        if self.failed.is_none()
            && let Err(e) = self.out.write_all(&self.page)
        {
            self.failed = Some(e);
        }
        self.pages += (self.page.len() / PAGE_SIZE) as u64;
        id
    }

    fn tree<K, V>(
        &mut self,
        pairs: impl IntoIterator<Item = (K, V)>,
        flags: u32,
    ) -> std::io::Result<u64>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut level: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut page: Vec<(K, V)> = Vec::new();
        let mut size = HEADER;
        let mut last: Option<Vec<u8>> = None;
        for (k, v) in pairs {
            if cfg!(debug_assertions) {
                debug_assert!(
                    last.as_deref().is_none_or(|l| l < k.as_ref()),
                    "keys out of order"
                );
                last = Some(k.as_ref().to_vec());
            }
            let more = ELEMENT + k.as_ref().len() + v.as_ref().len();
            if !page.is_empty() && size + more > PAGE_SIZE {
                level.push(self.flush_leaf(&mut page, size, flags));
                size = HEADER;
            }
            size += more;
            page.push((k, v));
        }
        // The last page (an empty bucket gets one empty leaf).
        level.push(self.flush_leaf(&mut page, size, flags));
        while level.len() > 1 {
            let mut next = Vec::new();
            let mut start = 0;
            while start < level.len() {
                let mut end = start;
                let mut size = HEADER;
                while end < level.len() {
                    let more = ELEMENT + level[end].0.len();
                    if end > start + 1 && size + more > PAGE_SIZE {
                        break;
                    }
                    size += more;
                    end += 1;
                }
                let id = self.branch(&level[start..end], size);
                next.push((std::mem::take(&mut level[start].0), id));
                start = end;
            }
            level = next;
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(level[0].1),
        }
    }

    /// Writes the pairs gathered in `page` as a leaf and empties it: the leaf's first key
    /// and its page id.
    fn flush_leaf<K, V>(
        &mut self,
        page: &mut Vec<(K, V)>,
        size: usize,
        flags: u32,
    ) -> (Vec<u8>, u64)
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let items: Vec<Item<'_>> = page
            .iter()
            .map(|(k, v)| Item {
                key: k.as_ref(),
                value: v.as_ref(),
                flags,
            })
            .collect();
        let first = items.first().map_or_else(Vec::new, |i| i.key.to_vec());
        let id = self.leaf(&items, size);
        drop(items);
        page.clear();
        (first, id)
    }

    /// Starts a page of `size` bytes (header included) in `self.page`: its bytes, to fill
    /// before [`emit`](Self::emit).
    fn page(&mut self, flags: u16, count: usize, size: usize) -> &mut [u8] {
        let pages = size.div_ceil(PAGE_SIZE).max(1);
        self.page.clear();
        self.page.resize(pages * PAGE_SIZE, 0);
        // Counts are bounded by the page size (an element takes 16 bytes), except for a
        // single oversized item, so they fit bbolt's u16.
        page_header(
            &mut self.page,
            self.pages,
            flags,
            count as u16,
            (pages - 1) as u32,
        );
        &mut self.page
    }

    fn leaf(&mut self, items: &[Item<'_>], size: usize) -> u64 {
        let page = self.page(LEAF, items.len(), size);
        let mut data = HEADER + items.len() * ELEMENT;
        for (i, item) in items.iter().enumerate() {
            let at = HEADER + i * ELEMENT;
            let element = &mut page[at..at + ELEMENT];
            element[0..4].copy_from_slice(&item.flags.to_le_bytes());
            element[4..8].copy_from_slice(&((data - at) as u32).to_le_bytes());
            element[8..12].copy_from_slice(&(item.key.len() as u32).to_le_bytes());
            element[12..16].copy_from_slice(&(item.value.len() as u32).to_le_bytes());
            page[data..data + item.key.len()].copy_from_slice(item.key);
            data += item.key.len();
            page[data..data + item.value.len()].copy_from_slice(item.value);
            data += item.value.len();
        }
        self.emit()
    }

    fn branch(&mut self, children: &[(Vec<u8>, u64)], size: usize) -> u64 {
        let page = self.page(BRANCH, children.len(), size);
        let mut data = HEADER + children.len() * ELEMENT;
        for (i, (key, child)) in children.iter().enumerate() {
            let at = HEADER + i * ELEMENT;
            let element = &mut page[at..at + ELEMENT];
            element[0..4].copy_from_slice(&((data - at) as u32).to_le_bytes());
            element[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
            element[8..16].copy_from_slice(&child.to_le_bytes());
            page[data..data + key.len()].copy_from_slice(key);
            data += key.len();
        }
        self.emit()
    }
}

fn page_header(page: &mut [u8], id: u64, flags: u16, count: u16, overflow: u32) {
    page[0..8].copy_from_slice(&id.to_le_bytes());
    page[8..10].copy_from_slice(&flags.to_le_bytes());
    page[10..12].copy_from_slice(&count.to_le_bytes());
    page[12..16].copy_from_slice(&overflow.to_le_bytes());
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------
// Reading

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

struct Meta {
    page_size: usize,
    root: u64,
    high_water: u64,
    txid: u64,
}

/// The meta at byte `at`, if it is a valid one.
fn meta_at(bytes: &[u8], at: usize) -> Option<Meta> {
    let m = bytes.get(at + HEADER..at + HEADER + 64)?;
    let ok = read_u32(m, 0)? == MAGIC
        && read_u32(m, 4)? == VERSION
        && read_u64(m, 56)? == fnv1a64(&m[..META_SUMMED]);
    ok.then_some(Meta {
        page_size: read_u32(m, 8)? as usize,
        root: read_u64(m, 16)?,
        high_water: read_u64(m, 40)?,
        txid: read_u64(m, 48)?,
    })
}

/// The valid meta with the higher transaction id.
fn best_meta(bytes: &[u8]) -> Result<Meta, DbError> {
    if !looks_like_db(bytes) {
        return bad("no bbolt magic at the start");
    }
    let first = meta_at(bytes, 0);
    // The second meta sits one page in: the first's page size, or (if the first is
    // damaged) the usual sizes.
    let page_sizes: Vec<usize> = match (&first, read_u32(bytes, HEADER + 8)) {
        (Some(m), _) => vec![m.page_size],
        (None, Some(size)) => vec![size as usize, 4096, 8192, 16384, 32768, 65536],
        (None, None) => vec![4096],
    };
    let second = page_sizes
        .iter()
        .filter(|s| **s >= 1024)
        .find_map(|s| meta_at(bytes, *s));
    let meta = match (first, second) {
        (Some(a), Some(b)) => {
            if b.txid > a.txid {
                b
            } else {
                a
            }
        }
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return bad("both meta pages are damaged (checksum mismatch)"),
    };
    if !(1024..=1 << 20).contains(&meta.page_size) || !meta.page_size.is_power_of_two() {
        return bad(format!("page size {} is not plausible", meta.page_size));
    }
    Ok(meta)
}

/// The database's size as bbolt reports it (pages in use times the page size).
pub fn size(bytes: &[u8]) -> Result<u64, DbError> {
    let meta = best_meta(bytes)?;
    Ok(meta.high_water.saturating_mul(meta.page_size as u64))
}

/// Every top-level bucket of the file `bytes` with its pairs, in key order. Trailing
/// bytes past the last page (a snapshot's checksum) are ignored.
pub fn read(bytes: &[u8]) -> Result<Buckets, DbError> {
    let meta = best_meta(bytes)?;
    let reader = Reader {
        bytes,
        page_size: meta.page_size,
        high_water: meta.high_water,
    };
    let mut seen = HashSet::new();
    let mut top = Vec::new();
    reader.walk(Root::Page(meta.root), &mut top, &mut seen, 0)?;
    let mut buckets = Buckets::new();
    for (flags, name, value) in top {
        if flags & BUCKET_FLAG == 0 {
            return bad(format!(
                "key {:?} at the top level is not a bucket",
                String::from_utf8_lossy(name)
            ));
        }
        let mut pairs = Vec::new();
        reader.walk(bucket_root(name, value)?, &mut pairs, &mut seen, 0)?;
        let pairs = pairs
            .into_iter()
            .map(|(flags, k, v)| {
                if flags & BUCKET_FLAG != 0 {
                    bad(format!(
                        "bucket {:?} holds a nested bucket; etcd's database has none",
                        String::from_utf8_lossy(name)
                    ))
                } else {
                    Ok((k.to_vec(), v.to_vec()))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        buckets.insert(name.to_vec(), pairs);
    }
    Ok(buckets)
}

/// Where a bucket's tree starts: a page of the file, or a page inline in its value.
enum Root<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

fn bucket_root<'a>(name: &[u8], value: &'a [u8]) -> Result<Root<'a>, DbError> {
    let Some(root) = read_u64(value, 0) else {
        return bad(format!(
            "bucket {:?} has a short header",
            String::from_utf8_lossy(name)
        ));
    };
    Ok(if root == 0 {
        Root::Inline(&value[16..])
    } else {
        Root::Page(root)
    })
}

type Element<'a> = (u32, &'a [u8], &'a [u8]);

struct Reader<'a> {
    bytes: &'a [u8],
    page_size: usize,
    high_water: u64,
}

impl<'a> Reader<'a> {
    /// The bytes of page `id`, overflow included.
    fn page(&self, id: u64) -> Result<&'a [u8], DbError> {
        // Pages 0 and 1 are the metas; any other page below the high-water mark may hold
        // data (bbolt puts the freelist wherever it has room).
        if id < 2 || id >= self.high_water {
            return bad(format!(
                "page {id} is outside the data pages (2..{})",
                self.high_water
            ));
        }
        let at = usize::try_from(id)
            .ok()
            .and_then(|i| i.checked_mul(self.page_size))
            .filter(|at| at + HEADER <= self.bytes.len());
        let Some(at) = at else {
            return bad(format!(
                "page {id} is past the end of the file (truncated?)"
            ));
        };
        let overflow = read_u32(self.bytes, at + 12).unwrap_or(0) as usize;
        let len = (overflow + 1).saturating_mul(self.page_size);
        let Some(page) = self.bytes.get(at..at.saturating_add(len)) else {
            return bad(format!(
                "page {id} runs past the end of the file (truncated?)"
            ));
        };
        if read_u64(page, 0) != Some(id) {
            return bad(format!("page {id} names itself {:?}", read_u64(page, 0)));
        }
        Ok(page)
    }

    /// Appends the leaf elements of the tree at `root` to `out`, in order.
    fn walk(
        &self,
        root: Root<'a>,
        out: &mut Vec<Element<'a>>,
        seen: &mut HashSet<u64>,
        depth: usize,
    ) -> Result<(), DbError> {
        if depth > MAX_DEPTH {
            return bad("the tree is deeper than any real one (a loop?)");
        }
        let page = match root {
            Root::Inline(page) => page,
            Root::Page(id) => {
                if !seen.insert(id) {
                    return bad(format!("page {id} is referenced twice"));
                }
                self.page(id)?
            }
        };
        let flags = read_u16(page, 8).unwrap_or(0);
        let count = read_u16(page, 10).unwrap_or(0) as usize;
        let short = || {
            DbError(format!(
                "an element of page {} runs past the page",
                read_u64(page, 0).unwrap_or(0)
            ))
        };
        match flags {
            LEAF => {
                for i in 0..count {
                    let at = HEADER + i * ELEMENT;
                    let e = page.get(at..at + ELEMENT).ok_or_else(short)?;
                    let (Some(f), Some(pos), Some(ks), Some(vs)) = (
                        read_u32(e, 0),
                        read_u32(e, 4),
                        read_u32(e, 8),
                        read_u32(e, 12),
                    ) else {
                        return Err(short());
                    };
                    let k = at + pos as usize;
                    let v = k + ks as usize;
                    let key = page.get(k..v).ok_or_else(short)?;
                    let value = page.get(v..v + vs as usize).ok_or_else(short)?;
                    out.push((f, key, value));
                }
                Ok(())
            }
            BRANCH if matches!(root, Root::Page(_)) => {
                for i in 0..count {
                    let at = HEADER + i * ELEMENT;
                    let child = read_u64(page, at + 8).ok_or_else(short)?;
                    self.walk(Root::Page(child), out, seen, depth + 1)?;
                }
                Ok(())
            }
            other => bad(format!(
                "page {} has type {other:#x} where a leaf or branch belongs",
                read_u64(page, 0).unwrap_or(0)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample(keys: usize, value_len: usize) -> Buckets {
        let mut b = Buckets::new();
        b.insert(b"empty".to_vec(), vec![]);
        b.insert(
            b"key".to_vec(),
            (0..keys)
                .map(|i| {
                    (
                        format!("k{i:08}").into_bytes(),
                        vec![(i % 251) as u8; value_len + i % 7],
                    )
                })
                .collect(),
        );
        b.insert(
            b"meta".to_vec(),
            vec![(b"consistent_index".to_vec(), 9u64.to_be_bytes().to_vec())],
        );
        b
    }

    #[test]
    fn what_is_written_reads_back() {
        // One leaf; many leaves under branches (three levels); values that overflow.
        for (keys, value_len) in [(0, 0), (3, 10), (20_000, 40), (50, 9_000), (2, 300_000)] {
            let buckets = sample(keys, value_len);
            let file = write(&buckets).unwrap();
            assert_eq!(file.len() % PAGE_SIZE, 0);
            assert!(looks_like_db(&file));
            assert_eq!(read(&file).unwrap(), buckets, "{keys} keys of {value_len}");
            // A snapshot's trailing checksum does not disturb reading.
            let mut sealed = file.clone();
            sealed.extend_from_slice(&[7u8; 32]);
            assert_eq!(read(&sealed).unwrap(), buckets);
        }
    }

    #[test]
    fn every_page_is_reachable_exactly_once() {
        // bbolt's check: each page below the high-water mark is a meta, the freelist, or
        // reached once from the root (overflow pages included).
        let file = write(&sample(5_000, 700)).unwrap();
        let meta = meta_at(&file, 0).unwrap();
        let reader = Reader {
            bytes: &file,
            page_size: PAGE_SIZE,
            high_water: meta.high_water,
        };
        let mut seen = HashSet::new();
        let mut top = Vec::new();
        reader
            .walk(Root::Page(meta.root), &mut top, &mut seen, 0)
            .unwrap();
        for (_, name, value) in &top {
            let mut pairs = Vec::new();
            reader
                .walk(bucket_root(name, value).unwrap(), &mut pairs, &mut seen, 0)
                .unwrap();
        }
        let mut covered = 3u64;
        let mut pages: Vec<u64> = seen.into_iter().collect();
        pages.sort();
        for id in pages {
            assert_eq!(id, covered, "page {id} follows a gap");
            covered += 1 + u64::from(read_u32(&file, id as usize * PAGE_SIZE + 12).unwrap());
        }
        assert_eq!(covered, meta.high_water);
        assert_eq!(meta.high_water as usize * PAGE_SIZE, file.len());
    }

    #[test]
    fn the_newer_valid_meta_is_used_and_damage_is_an_error() {
        let buckets = sample(100, 50);
        let file = write(&buckets).unwrap();
        // Damaging one meta leaves the other.
        for at in [HEADER + 20, PAGE_SIZE + HEADER + 20] {
            let mut one = file.clone();
            one[at] ^= 1;
            assert_eq!(read(&one).unwrap(), buckets);
        }
        let mut both = file.clone();
        both[HEADER + 20] ^= 1;
        both[PAGE_SIZE + HEADER + 20] ^= 1;
        assert!(read(&both).unwrap_err().0.contains("meta"));
        assert!(read(b"hello, this is not a database").is_err());
        // Every truncation and every single-byte change is either read or refused: never a
        // panic.
        for len in (0..file.len()).step_by(97) {
            let _ = read(&file[..len]);
        }
        for at in (0..file.len()).step_by(13) {
            let mut damaged = file.clone();
            damaged[at] = damaged[at].wrapping_add(0x55);
            let _ = read(&damaged);
        }
    }

    #[test]
    fn inline_buckets_are_read() {
        // bbolt writes small buckets inline: header (root 0) then a leaf page.
        let mut inline = vec![0u8; 16];
        let mut page = vec![0u8; HEADER + ELEMENT];
        page_header(&mut page, 0, LEAF, 1, 0);
        page[HEADER + 4..HEADER + 8].copy_from_slice(&(ELEMENT as u32).to_le_bytes());
        page[HEADER + 8..HEADER + 12].copy_from_slice(&2u32.to_le_bytes());
        page[HEADER + 12..HEADER + 16].copy_from_slice(&3u32.to_le_bytes());
        page.extend_from_slice(b"abxyz");
        inline.extend_from_slice(&page);
        let mut w = Writer {
            out: Vec::new(),
            pages: 0,
            page: Vec::new(),
            failed: None,
        };
        w.start().unwrap();
        let root = w.tree([(&b"small"[..], &inline[..])], BUCKET_FLAG).unwrap();
        let reader = Reader {
            bytes: &w.out,
            page_size: PAGE_SIZE,
            high_water: (w.out.len() / PAGE_SIZE) as u64,
        };
        let mut top = Vec::new();
        reader
            .walk(Root::Page(root), &mut top, &mut HashSet::new(), 0)
            .unwrap();
        let mut pairs = Vec::new();
        reader
            .walk(
                bucket_root(top[0].1, top[0].2).unwrap(),
                &mut pairs,
                &mut HashSet::new(),
                0,
            )
            .unwrap();
        assert_eq!(pairs, vec![(0, &b"ab"[..], &b"xyz"[..])]);
    }
}
