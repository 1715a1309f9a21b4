//! The store's key search: a put that overwrites a random key of 100,000, and a get of a
//! random key, for two shapes of key:
//!
//! - `decimal8`: 8-byte decimal keys, as `oncekv bench` and etcd's benchmark tool write
//!   them; every comparison is decided within the first eight bytes.
//! - `registry35`: etcd-style `/registry/pods/default/pod-NNNNNNNN` keys (35 bytes), whose
//!   first eight bytes are all alike, so every comparison reads the key's bytes.
//!
//! Run: `cargo bench -p oncekv-core --bench kv_map`. Keys are drawn from a fixed
//! pseudo-random sequence (the same for every run), so two builds are compared on the
//! same searches.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use oncekv_core::command::{KeyRange, RangeRequest};
use oncekv_core::kv::KvStore;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEYS: u64 = 100_000;

fn key(shape: &str, n: u64) -> Bytes {
    match shape {
        "decimal8" => Bytes::from(format!("{n:08}")),
        _ => Bytes::from(format!("/registry/pods/default/pod-{n:08}")),
    }
}

/// A store holding every key of the shape, with 100-byte values.
fn filled(shape: &str) -> KvStore {
    let mut store = KvStore::default();
    let value = Bytes::from(vec![b'v'; 100]);
    for n in 0..KEYS {
        let mut w = store.begin();
        store.put(&mut w, &key(shape, n), Some(&value), None);
        store.commit(w);
    }
    // Leave the history out of the measurement: only the key map is searched below.
    let revision = store.revision();
    let _ = store.compact(revision);
    store
}

/// The keys the measured operations visit, in a fixed pseudo-random order.
fn visits(shape: &str) -> Vec<Bytes> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..4096)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            key(shape, (x >> 33) % KEYS)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    for shape in ["decimal8", "registry35"] {
        let visits = visits(shape);
        let mut group = c.benchmark_group(format!("kv_map_{shape}_100k"));
        let store = filled(shape);
        let mut i = 0;
        group.bench_function("get", |b| {
            b.iter(|| {
                i = (i + 1) % visits.len();
                let req = RangeRequest {
                    range: KeyRange::single(visits[i].clone()),
                    ..RangeRequest::default()
                };
                black_box(store.range(&req).map(|r| r.kvs.len()))
            })
        });
        let mut store = store;
        let value = Bytes::from(vec![b'w'; 100]);
        group.bench_function("overwrite", |b| {
            b.iter(|| {
                i = (i + 1) % visits.len();
                let mut w = store.begin();
                let (prev, _) = store.put(&mut w, &visits[i], Some(&value), None);
                store.commit(w);
                // Keep the history from growing through the run.
                if store.revision() % 4096 == 0 {
                    let revision = store.revision();
                    let _ = store.compact(revision);
                }
                black_box(prev.map(|p| p.version))
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
