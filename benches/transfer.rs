//! Host<->device transfers side by side, one run: the runtime's copies of pageable `Vec`s
//! (staged through NUMA-local pinned buffers) vs a raw cudarc copy from the same pageable
//! memory (the driver's path) vs a raw copy from pinned memory vs the machine's own
//! multi-threaded memcpy bandwidth; then pinning in place, a chunk/thread sweep, and both
//! GPUs at once.
//!
//! `cargo bench -p offload-benches --bench transfer` (needs a GPU; says so and exits 0
//! without one). `TRANSFER_QUICK=1` skips the sweep.

use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext};
use offload::{HostRange, MapItem, MapType, Runtime, StagingConfig, UpdateDirection};
use offload_benches::{Bench, Budget};
use rayon::prelude::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Median seconds per call of `f`, which moves `bytes`, measured as `id`/size (copies of
/// 64 MiB and more sample flat, smaller ones on criterion's ramp).
fn time(bench: &mut Bench, id: &str, bytes: usize, f: impl FnMut()) -> f64 {
    let small = Budget {
        samples: 20,
        warm_up: Duration::from_millis(200),
        measure: Duration::from_millis(500),
        flat: false,
    };
    let budget = if bytes >= 64 * MIB { Budget::SLOW } else { small };
    bench.wall(&format!("{id}/{}", size_name(bytes).replace(' ', "")), budget, f)
}

fn gbs(bytes: usize, t: f64) -> f64 {
    bytes as f64 / t / 1e9
}

fn size_name(b: usize) -> String {
    if b >= GIB {
        format!("{} GiB", b / GIB)
    } else if b >= MIB {
        format!("{} MiB", b / MIB)
    } else {
        format!("{} KiB", b / KIB)
    }
}

/// `update to/from` of a present pageable range: the copy path every map uses.
fn runtime_copy(rt: &Runtime, dev: usize, host: &mut [u8], dir: UpdateDirection) {
    // SAFETY: `host` is borrowed mutably for the call; it is mapped on `dev`.
    unsafe { rt.update(dev, dir, &[(HostRange::of(host), false)]) }.expect("update");
    // A small `update to` is queued (docs/SEMANTICS.md R11): the row times the copy done.
    rt.synchronize(dev).expect("synchronize");
}

/// The machine's own memcpy bandwidth, pageable to pageable, 1 GiB (one thread, then
/// many, then as staging moves bytes); gives the bound staged copies are held to, the best
/// multi-threaded memcpy.
fn memcpy_bound(bench: &mut Bench) -> Result<f64, Box<dyn std::error::Error>> {
    let cores = std::thread::available_parallelism().map_or(16, |n| n.get());
    // The machine's own memcpy bandwidth, pageable to pageable, 1 GiB.
    let a = vec![1u8; GIB];
    let mut b = vec![2u8; GIB];
    let memcpy_1 = gbs(GIB, time(bench, "memcpy_1_thread", GIB, || b.copy_from_slice(&a)));
    print!("\nmemcpy pageable->pageable 1 GiB: {memcpy_1:.1} GB/s (1 thread)");
    // The bound staged copies are held to: the best multi-threaded memcpy here.
    let mut bound = 0f64;
    let mut counts = vec![16.min(cores), cores];
    counts.dedup();
    for threads in counts {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
        let bw = gbs(
            GIB,
            time(bench, &format!("memcpy_{threads}_threads"), GIB, || {
                pool.install(|| {
                    b.par_chunks_mut(16 * MIB)
                        .zip(a.par_chunks(16 * MIB))
                        .for_each(|(d, s)| d.copy_from_slice(s))
                })
            }),
        );
        print!(", {bw:.1} GB/s ({threads} threads)");
        bound = bound.max(bw);
    }
    // The same bytes moved the way staging moves them: 16 MiB chunks one after another, each
    // split into 1 MiB pieces over 24 threads: what bounds a staged copy on this machine.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(24.min(cores)).build()?;
    let chunked = gbs(
        GIB,
        time(bench, "memcpy_chunked", GIB, || {
            for (d, s) in b.chunks_mut(16 * MIB).zip(a.chunks(16 * MIB)) {
                pool.install(|| {
                    d.par_chunks_mut(MIB).zip(s.par_chunks(MIB)).for_each(|(d, s)| d.copy_from_slice(s))
                });
            }
        }),
    );
    println!(", {chunked:.1} GB/s (16 MiB chunks in turn, 1 MiB pieces, 24 threads)");
    Ok(bound)
}

/// The register-in-place policy at work (a runtime with the default policy): the same
/// 1 GiB mapping copied 24 times, then unmapped (which unregisters it).
fn register_in_place() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Runtime::builder().gpus(true).host_devices(0).build()?;
    let mut other = vec![4u8; GIB];
    // SAFETY: `other` outlives the mapping, deleted below.
    unsafe { policy.enter_data(0, &[MapItem::slice(&other, MapType::ALLOC)])? };
    let rates: Vec<String> = (0..24)
        .map(|_| {
            let t = Instant::now();
            runtime_copy(&policy, 0, &mut other, UpdateDirection::To);
            format!("{:.0}", gbs(GIB, t.elapsed().as_secs_f64()))
        })
        .collect();
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { policy.exit_data(0, &[MapItem::slice(&other, MapType::DELETE)])? };
    let unmap_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("\n24 successive 1 GiB h->d copies of one mapping, GB/s (registered in place after 16; unmap {unmap_ms:.1} ms):");
    println!("  {}", rates.join(" "));
    Ok(())
}

/// Staging settings swept on device 0: chunk, chunks at least, piece, threads, each
/// timed at 64 MiB, 256 MiB and 1 GiB both ways.
fn staging_sweep(bench: &mut Bench, host: &mut [u8]) -> Result<(), Box<dyn std::error::Error>> {
    println!("\nsweep (device 0): chunk MiB, chunks at least, piece KiB, threads -> GB/s h->d / d->h at 64 MiB, 256 MiB, 1 GiB");
    // Small chunks keep the ring (chunk x depth per direction) inside the last-level
    // cache, so the DMA may read the buffers from cache rather than DRAM.
    for (chunk, min_chunks, min_piece, threads) in [
        (16 * MIB, 4, MIB, 24),
        (16 * MIB, 8, 256 * KIB, 24),
        (8 * MIB, 8, 256 * KIB, 24),
        (4 * MIB, 8, 256 * KIB, 16),
        (2 * MIB, 8, 128 * KIB, 16),
        (2 * MIB, 8, 256 * KIB, 8),
        (MIB, 8, 64 * KIB, 16),
        (16 * MIB, 4, MIB, 24),
    ] {
        let cfg = StagingConfig {
            chunk,
            min_chunks,
            min_piece,
            threads,
            register_after: u32::MAX,
            ..StagingConfig::default()
        };
        let rt = Runtime::builder().gpus(true).host_devices(0).staging(cfg).build()?;
        // SAFETY: `host` outlives the mapping.
        unsafe { rt.enter_data(0, &[MapItem::slice(host, MapType::ALLOC)])? };
        let mut row =
            format!("  {:>2} MiB x{min_chunks} {:>4} KiB {threads:>2}t:", chunk / MIB, min_piece / KIB);
        for n in [64 * MIB, 256 * MIB, GIB] {
            let up = gbs(
                n,
                time(bench, &format!("sweep_{chunk}_{min_chunks}_{min_piece}_{threads}_To"), n, || {
                    runtime_copy(&rt, 0, &mut host[..n], UpdateDirection::To)
                }),
            );
            let down = gbs(
                n,
                time(bench, &format!("sweep_{chunk}_{min_chunks}_{min_piece}_{threads}_From"), n, || {
                    runtime_copy(&rt, 0, &mut host[..n], UpdateDirection::From)
                }),
            );
            row.push_str(&format!("  {up:5.1} / {down:5.1}"));
        }
        // SAFETY: as above.
        unsafe { rt.exit_data(0, &[MapItem::slice(host, MapType::DELETE)])? };
        println!("{row}");
    }
    Ok(())
}

/// All GPUs at once, each from its own pageable buffer, with staging settings `staging`.
fn all_gpus(bench: &mut Bench, staging: StagingConfig) -> Result<(), Box<dyn std::error::Error>> {
    let rt = Runtime::builder().gpus(true).host_devices(0).staging(staging).build()?;
    let n = rt.num_devices();
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![5u8; GIB]).collect();
    for (d, b) in bufs.iter().enumerate() {
        // SAFETY: the buffers outlive the mappings (deleted below).
        unsafe { rt.enter_data(d, &[MapItem::slice(b, MapType::ALLOC)])? };
    }
    for dir in [UpdateDirection::To, UpdateDirection::From] {
        let t = time(bench, &format!("all_gpus_{dir:?}"), GIB, || {
            std::thread::scope(|s| {
                for (d, b) in bufs.iter_mut().enumerate() {
                    let rt = &rt;
                    s.spawn(move || runtime_copy(rt, d, b, dir));
                }
            })
        });
        println!("all {n} GPUs at once, 1 GiB each, {dir:?}: {:.1} GB/s total", gbs(n * GIB, t));
    }
    for (d, b) in bufs.iter().enumerate() {
        // SAFETY: as above.
        unsafe { rt.exit_data(d, &[MapItem::slice(b, MapType::DELETE)])? };
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(probe) = offload_benches::gpu_bench("transfer")? else { return Ok(()) };
    let mut bench = Bench::new("transfer");
    for d in 0..probe.num_devices() {
        println!("device {d}: {}; {}", probe.placement(d)?, probe.staging_report(d)?.unwrap_or_default());
    }
    drop(probe);
    let bound = memcpy_bound(&mut bench)?;
    // The table compares copy paths, so no runtime here may pin `host` in place.
    let no_policy = StagingConfig { register_after: u32::MAX, ..StagingConfig::default() };
    let rt = Runtime::builder().gpus(true).host_devices(0).staging(no_policy).build()?;
    let always_stage = Runtime::builder()
        .gpus(true)
        .host_devices(0)
        .staging(StagingConfig { min_bytes: 0, ..no_policy })
        .build()?;

    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let stream = ctx.new_stream()?;
    // SAFETY: 1 GiB device buffer and a page-locked (not write-combined) host buffer.
    let dev_buf = unsafe { result::malloc_sync(GIB) }?;
    // SAFETY: as above.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(GIB, sys::CU_MEMHOSTALLOC_PORTABLE) }?;
    let sizes = [4 * KIB, 64 * KIB, MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB];
    println!("\nmemcpy bound (best multi-threaded memcpy above): {bound:.1} GB/s");
    println!("\n| size | dir | offload (GB/s) | driver pageable (GB/s) | pinned DMA (GB/s) | offload / driver | offload / memcpy bound | always staged (GB/s) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut host = vec![3u8; GIB];
    // SAFETY: `host` outlives the mappings (deleted below).
    unsafe {
        rt.enter_data(0, &[MapItem::slice(&host, MapType::ALLOC)])?;
        always_stage.enter_data(0, &[MapItem::slice(&host, MapType::ALLOC)])?;
    }
    for &n in &sizes {
        for dir in [UpdateDirection::To, UpdateDirection::From] {
            let ours = gbs(
                n,
                time(&mut bench, &format!("offload_{dir:?}"), n, || {
                    runtime_copy(&rt, 0, &mut host[..n], dir)
                }),
            );
            let raw = gbs(
                n,
                time(&mut bench, &format!("driver_pageable_{dir:?}"), n, || {
                    // SAFETY: `host`, `pinned` and `dev_buf` all hold at least `n` bytes; the
                    // stream is synchronised before the next use.
                    unsafe {
                        match dir {
                            UpdateDirection::To => {
                                result::memcpy_htod_async(dev_buf, &host[..n], stream.cu_stream())
                            }
                            UpdateDirection::From => {
                                result::memcpy_dtoh_async(&mut host[..n], dev_buf, stream.cu_stream())
                            }
                        }
                    }
                    .expect("copy");
                    stream.synchronize().expect("sync");
                }),
            );
            let pin = gbs(
                n,
                time(&mut bench, &format!("pinned_dma_{dir:?}"), n, || {
                    // SAFETY: as above.
                    unsafe {
                        match dir {
                            UpdateDirection::To => result::memcpy_htod_async(
                                dev_buf,
                                &pinned.as_slice().expect("pinned")[..n],
                                stream.cu_stream(),
                            ),
                            UpdateDirection::From => result::memcpy_dtoh_async(
                                &mut pinned.as_mut_slice().expect("pinned")[..n],
                                dev_buf,
                                stream.cu_stream(),
                            ),
                        }
                    }
                    .expect("copy");
                    stream.synchronize().expect("sync");
                }),
            );
            let staged = if (MIB..=64 * MIB).contains(&n) {
                format!(
                    "{:.1}",
                    gbs(
                        n,
                        time(&mut bench, &format!("always_staged_{dir:?}"), n, || runtime_copy(
                            &always_stage,
                            0,
                            &mut host[..n],
                            dir
                        ))
                    )
                )
            } else {
                "-".into()
            };
            let d = if dir == UpdateDirection::To { "h->d" } else { "d->h" };
            println!(
                "| {} | {d} | {ours:.1} | {raw:.1} | {pin:.1} | {:.2}x | {:.2} | {staged} |",
                size_name(n),
                ours / raw,
                ours / bound
            );
        }
    }
    // SAFETY: the mapping made above.
    unsafe { always_stage.exit_data(0, &[MapItem::slice(&host, MapType::DELETE)])? };
    drop(always_stage);

    register_in_place()?;

    // Pinning in place: the one-off cost, then copies at DMA speed.
    let t = Instant::now();
    let mut pinned_host = rt.pin(&mut host);
    let pin_ms = t.elapsed().as_secs_f64() * 1e3;
    let up = gbs(
        GIB,
        time(&mut bench, "pinned_in_place_To", GIB, || {
            runtime_copy(&rt, 0, &mut pinned_host, UpdateDirection::To)
        }),
    );
    let down = gbs(
        GIB,
        time(&mut bench, "pinned_in_place_From", GIB, || {
            runtime_copy(&rt, 0, &mut pinned_host, UpdateDirection::From)
        }),
    );
    let t = Instant::now();
    drop(pinned_host);
    let unpin_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("\npin 1 GiB in place: {pin_ms:.1} ms (unpin {unpin_ms:.1} ms); then h->d {up:.1} GB/s, d->h {down:.1} GB/s");
    // SAFETY: the mapping made above.
    unsafe { rt.exit_data(0, &[MapItem::slice(&host, MapType::DELETE)])? };

    if std::env::var_os("TRANSFER_QUICK").is_none() {
        staging_sweep(&mut bench, &mut host)?;
    }

    if rt.num_devices() > 1 {
        all_gpus(&mut bench, no_policy)?;
    }
    // SAFETY: no longer used.
    unsafe { result::free_sync(dev_buf) }?;
    Ok(())
}
