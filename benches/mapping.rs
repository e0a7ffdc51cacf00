//! Mapping overhead on a host device: present-table lookups at 1, 1 000 and 100 000 live
//! entries, enter+exit of a range already present, and enter+exit of a new 4 KiB range.
//!
//! `cargo bench -p offload-benches --bench mapping`

#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use offload::{MapItem, MapType, Runtime};

/// Bytes per mapped chunk when filling the table.
const CHUNK: usize = 64;

fn runtime() -> Runtime {
    Runtime::builder().env(|_| None).host_devices(1).build().expect("host device runtime")
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("present_lookup");
    for &entries in &[1usize, 1_000, 100_000] {
        let rt = runtime();
        let host = vec![0u8; entries * CHUNK];
        let items: Vec<MapItem> = host.chunks(CHUNK).map(|c| MapItem::slice(c, MapType::ALLOC)).collect();
        // SAFETY: `host` outlives the mappings (released below).
        unsafe { rt.enter_data(0, &items) }.expect("map");
        // Probe addresses spread over the table, in a fixed pseudo-random order.
        let probes: Vec<usize> =
            (0..1024u64).map(|i| (i.wrapping_mul(2_654_435_761) as usize) % entries).collect();
        let base = host.as_ptr() as usize;
        g.bench_with_input(BenchmarkId::from_parameter(entries), &entries, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & 1023;
                black_box(rt.is_present(base + probes[i] * CHUNK + 7, 0).expect("lookup"))
            })
        });
        let release: Vec<MapItem> = host.chunks(CHUNK).map(|c| MapItem::slice(c, MapType::RELEASE)).collect();
        // SAFETY: as above.
        unsafe { rt.exit_data(0, &release) }.expect("unmap");
    }
    g.finish();
}

fn enter_exit(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("enter_exit");
    let x = vec![1u8; 4096];
    let to = [MapItem::slice(&x, MapType::TO)];
    let release = [MapItem::slice(&x, MapType::RELEASE)];
    // SAFETY: `x` outlives every mapping of it in this function.
    unsafe { rt.enter_data(0, &to) }.expect("map");
    g.bench_function("present_4KiB", |b| {
        b.iter(|| {
            // SAFETY: as above.
            unsafe {
                rt.enter_data(0, black_box(&to)).expect("enter");
                rt.exit_data(0, black_box(&release)).expect("exit");
            }
        })
    });
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &release) }.expect("unmap");
    g.bench_function("new_4KiB_host_device", |b| {
        b.iter(|| {
            // SAFETY: as above; each iteration allocates, copies in, and frees.
            unsafe {
                rt.enter_data(0, black_box(&to)).expect("enter");
                rt.exit_data(0, black_box(&release)).expect("exit");
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = lookup, enter_exit
}
criterion_main!(benches);
