//! A small soak of the whole runtime on host devices, sized for Miri (`scripts/miri.sh`
//! selects it as `soak::`) and for ThreadSanitizer: a few threads on three host devices
//! mapping, launching, updating and unmapping their own arrays and one array they all map
//! at once (whole and in overlapping parts), in regions, enter/exit pairs, `nowait` scopes
//! and a pipeline, checking every result; then every table and pool is empty. The larger
//! soak is `tests/soak.rs`; this one needs no driver, hwloc or proc macro, so Miri and TSan
//! see every thread the runtime starts (device workers, lanes, rayon kernel pools).

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::kernel::{HostLaunch, Kernel};
use crate::pipeline::Pipeline;
use crate::{map, Error, Result, Runtime};

/// `x[i] += by` (arguments: `by: u32`, `x`), split over the device's kernel threads.
fn bump(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
    let by: u32 = l.scalar(0)?;
    // SAFETY: argument 1 is a mapped range of n u32 that no other argument aliases.
    let x = unsafe { l.slice_mut::<u32>(1, l.n())? };
    x.par_chunks_mut(8).for_each(|c| c.iter_mut().for_each(|v| *v += by));
    Ok(())
}

/// `y[i] = 2 * x[i]` (arguments: `x`, `y`).
fn twice(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
    // SAFETY: arguments 0 and 1 are distinct mapped ranges of n u32; only `y` is written.
    let (x, y) = unsafe { (l.slice::<u32>(0, l.n())?, l.slice_mut::<u32>(1, l.n())?) };
    y.par_iter_mut().zip(x.par_iter()).for_each(|(y, x)| *y = 2 * x);
    Ok(())
}

/// `out[0] = x[0] + ... + x[n-1]` (arguments: `x`, `out` of one u64).
fn sum(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
    // SAFETY: argument 0 is a mapped range of n u32, argument 1 another of one u64.
    let (x, out) = unsafe { (l.slice::<u32>(0, l.n())?, l.slice_mut::<u64>(1, 1)?) };
    out[0] = x.par_iter().map(|&v| u64::from(v)).sum();
    Ok(())
}

static BUMP: Kernel = Kernel::new("bump").with_host(bump);
static TWICE: Kernel = Kernel::new("twice").with_host(twice);
static SUM: Kernel = Kernel::new("sum").with_host(sum);

/// A failed check as an error that names it.
fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument { routine: "soak", what: what() })
    }
}

/// `threads` threads, `ops` operations each, over every device of `rt`; returns how many
/// operations completed.
fn soak(rt: &Runtime, threads: usize, ops: usize, shared_len: usize) -> Result<usize> {
    let devices = rt.num_devices();
    let shared: Vec<u32> = (0..shared_len as u32).map(|i| i % 97).collect();
    let shared_sum: u64 = shared.iter().map(|&v| u64::from(v)).sum();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (shared, done) = (&shared, &done);
                s.spawn(move || -> Result<()> {
                    // Each thread walks the operations in its own order (a fixed LCG).
                    let mut seed = 0x9e37_79b9_u64.wrapping_mul(t as u64 + 1);
                    let mut next = |n: usize| {
                        seed = seed
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        (seed >> 33) as usize % n
                    };
                    let mut own = vec![t as u32; 24 + 8 * t];
                    let mut expect = t as u32;
                    for op in 0..ops {
                        let dev = rt.device((t + op) % devices)?;
                        let by = 1 + next(4) as u32;
                        let n = own.len();
                        match (t + op) % 6 {
                            // A data region around a launch.
                            0 => {
                                dev.data(map::tofrom(&mut own), |x| dev.launch(&BUMP, n, (by, x)))?;
                                expect += by;
                            }
                            // Enter, write through the mapping, update to, launch, update
                            // from, exit.
                            1 => {
                                let mut m = dev.enter_data(map::to_mut(&mut own))?;
                                let v = m.views();
                                m.host_mut(&v)?.fill(expect + 1);
                                m.update_to(&v)?;
                                dev.launch(&BUMP, n, (by, v))?;
                                m.update_from(&v)?;
                                m.exit()?;
                                expect += 1 + by;
                            }
                            // The array every thread maps, summed on the device.
                            2 => {
                                let mut total = [0u64];
                                dev.data((map::to(shared), map::from(&mut total)), |(x, out)| {
                                    dev.launch(&SUM, shared.len(), (x, out))
                                })?;
                                check(total[0] == shared_sum, || {
                                    format!("thread {t}: shared sum {} != {shared_sum}", total[0])
                                })?;
                            }
                            // A part of the shared array inside a region that maps it
                            // whole (nested, overlapping other threads' parts).
                            3 => {
                                let a = next(shared.len() / 2);
                                let b = a + 1 + next(shared.len() - a - 1);
                                let part = &shared[a..b];
                                let want: u64 = part.iter().map(|&v| u64::from(v)).sum();
                                let mut total = [0u64];
                                dev.data(map::to(shared), |_| {
                                    dev.data((map::to(part), map::from(&mut total)), |(x, out)| {
                                        dev.launch(&SUM, part.len(), (x, out))
                                    })
                                })?;
                                check(total[0] == want, || {
                                    format!("thread {t}: sum of shared[{a}..{b}] {} != {want}", total[0])
                                })?;
                            }
                            // A `nowait` scope: enter, launch and exit as dependent tasks.
                            4 => {
                                let d = dev.number();
                                rt.nowait(|s| -> Result<()> {
                                    let (entered, x) = s.enter(d, map::tofrom(&mut own), &[])?;
                                    let k = s.launch(d, &BUMP, n, (by, x), &[&entered])?;
                                    s.exit(d, x, &[&k])?;
                                    Ok(())
                                })??;
                                expect += by;
                            }
                            // A pipeline over every device: batches of the thread's array.
                            _ => {
                                let all: Vec<usize> = (0..devices).collect();
                                let inputs: Vec<&[u32]> = own.chunks(16).collect();
                                let mut out: Vec<Vec<u32>> =
                                    inputs.iter().map(|c| vec![0; c.len()]).collect();
                                Pipeline::new(rt, &all, 2)?.run(&inputs, &mut out, |dev, _, x, y| {
                                    dev.launch(&TWICE, x.len(), (x, y))
                                })?;
                                check(out.iter().flatten().all(|&v| v == 2 * expect), || {
                                    format!("thread {t}: a pipeline's batch is wrong")
                                })?;
                            }
                        }
                        check(own.iter().all(|&v| v == expect), || {
                            format!("thread {t}: {} != {expect}", own[0])
                        })?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| Error::InvalidArgument {
                routine: "soak",
                what: "a thread panicked".into(),
            })??;
        }
        Ok(())
    })?;
    check(rt.live_mappings().is_empty(), || format!("mappings left: {:?}", rt.live_mappings()))?;
    for d in 0..devices {
        rt.synchronize(d)?;
        let usage = rt.pool_usage(d)?;
        check(usage.live_allocations == 0, || {
            format!("device {d} leaked {} allocations", usage.live_allocations)
        })?;
    }
    Ok(done.load(Ordering::Relaxed))
}

/// Three host devices with two kernel threads each, no GPU, nothing read from the
/// environment; `synchronous` as `OFFLOAD_SYNC`.
fn runtime(synchronous: bool) -> Result<Runtime> {
    Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(3)
        .kernel_threads(2)
        .host_device_memory(64 << 20)
        .synchronous(synchronous)
        .build()
}

#[test]
fn four_threads_on_three_host_devices_lose_nothing() -> Result<()> {
    let rt = runtime(false)?;
    let (threads, ops) = (4, if cfg!(miri) { 12 } else { 60 });
    let done = soak(&rt, threads, ops, 256)?;
    check(done == threads * ops, || format!("{done} operations"))
}

#[test]
fn four_threads_synchronous_lose_nothing() -> Result<()> {
    let rt = runtime(true)?;
    let (threads, ops) = (4, if cfg!(miri) { 6 } else { 30 });
    let done = soak(&rt, threads, ops, 256)?;
    check(done == threads * ops, || format!("{done} operations"))
}
