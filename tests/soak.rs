//! A soak under threads (issue 25, item 4): 16 threads on 3 host devices (and every GPU
//! present) mapping, launching, updating and unmapping their own arrays (disjoint ranges)
//! and one array they all map at once, whole and in nested parts (overlapping ranges,
//! reference counting under contention), in regions, enter/exit pairs, `nowait` scopes and
//! pipelines, for a fixed number of operations, checking every result as they go; then
//! every device's table is empty and its pool holds nothing. `soak_long` (ignored: `cargo
//! test -p offload-tests --release --test soak -- --ignored`) runs 20 times as many
//! operations.

use std::sync::atomic::{AtomicU64, Ordering};

use offload::pipeline::Pipeline;
use offload::{map, Runtime};
use offload_tests::{assert_clean, check};

#[offload::kernel]
fn bump(i: usize, by: u32, x: &mut [u32]) {
    x[i] += by;
}

#[offload::kernel]
fn twice(i: usize, x: &[u32], y: &mut [u32]) {
    y[i] = 2 * x[i];
}

#[offload::kernel(reduction(+: total))]
fn sum_of(i: usize, x: &[u32], total: &mut u64) {
    *total += x[i] as u64;
}

/// A small deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `threads` threads, `ops` operations each, over every device of `rt`.
fn soak(rt: &Runtime, threads: usize, ops: usize) -> offload::Result<u64> {
    let devices = rt.num_devices();
    let shared: Vec<u32> = (0..50_000).map(|i| i % 97).collect();
    let shared_sum: u64 = shared.iter().map(|&v| v as u64).sum();
    let done = AtomicU64::new(0);
    std::thread::scope(|s| -> offload::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (shared, done) = (&shared, &done);
                s.spawn(move || -> offload::Result<()> {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                    let mut own: Vec<u32> = vec![t as u32; 1000 + 37 * t];
                    let mut expect = t as u32;
                    for _ in 0..ops {
                        let gpu = rt.device(rng.below(devices as u64) as usize)?;
                        let by = 1 + rng.below(5) as u32;
                        match rng.below(7) {
                            // A data region around a launch.
                            0 => {
                                let n = own.len();
                                gpu.data(map::tofrom(&mut own), |x| bump::launch(&gpu, n, by, x))?;
                                expect += by;
                            }
                            // Enter, update to, launch, update from, exit.
                            1 => {
                                let n = own.len();
                                let mut m = gpu.enter_data(map::to_mut(&mut own))?;
                                let v = m.views();
                                m.host_mut(&v)?.fill(expect + 1);
                                m.update_to(&v)?;
                                bump::launch(&gpu, n, by, v)?;
                                m.update_from(&v)?;
                                m.exit()?;
                                expect += 1 + by;
                            }
                            // The array every thread maps: a reduction over it.
                            2 => {
                                let total =
                                    gpu.data(map::to(shared), |x| sum_of::reduce(&gpu, shared.len(), x))?;
                                check!(total == shared_sum, "thread {t}: shared sum {total} != {shared_sum}");
                            }
                            // A part of the shared array, mapped inside a region that maps it
                            // whole (nested, overlapping other threads' parts).
                            3 => {
                                let a = rng.below(shared.len() as u64 / 2) as usize;
                                let b = a + 1 + rng.below((shared.len() - a - 1) as u64) as usize;
                                let part = &shared[a..b];
                                let want: u64 = part.iter().map(|&v| v as u64).sum();
                                let total = gpu.data(map::to(shared), |_| {
                                    gpu.data(map::to(part), |x| sum_of::reduce(&gpu, part.len(), x))
                                })?;
                                check!(
                                    total == want,
                                    "thread {t}: sum of shared[{a}..{b}] {total} != {want}"
                                );
                            }
                            // A `nowait` scope: enter, launch and exit as dependent tasks.
                            4 => {
                                let (d, n) = (gpu.number(), own.len());
                                rt.nowait(|s| -> offload::Result<()> {
                                    let (entered, x) = s.enter(d, map::tofrom(&mut own), &[])?;
                                    let (items, args) = bump::args(n, by, x)?;
                                    let k = s.launch(d, &bump::KERNEL, items, args, &[&entered])?;
                                    s.exit(d, x, &[&k])?;
                                    Ok(())
                                })??;
                                expect += by;
                            }
                            // A pipeline over every device: batches of the thread's array.
                            5 => {
                                let all: Vec<usize> = (0..devices).collect();
                                let inputs: Vec<&[u32]> = own.chunks(250).collect();
                                let mut out: Vec<Vec<u32>> =
                                    inputs.iter().map(|c| vec![0; c.len()]).collect();
                                let p = Pipeline::new(rt, &all, 2)?;
                                p.run(&inputs, &mut out, |dev, _, x, y| twice::launch(dev, x.len(), x, y))?;
                                check!(
                                    out.iter().flatten().all(|&v| v == 2 * expect),
                                    "thread {t}: a pipeline's batch is wrong"
                                );
                            }
                            // The shared array mapped around a launch on the thread's own.
                            _ => {
                                let n = own.len();
                                gpu.data((map::to(shared), map::tofrom(&mut own)), |(_, x)| {
                                    bump::launch(&gpu, n, by, x)
                                })?;
                                expect += by;
                            }
                        }
                        check!(own.iter().all(|&v| v == expect), "thread {t}: {} != {expect}", own[0]);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| offload::Error::InvalidArgument {
                routine: "soak",
                what: "a thread panicked".into(),
            })??;
        }
        Ok(())
    })?;
    for d in 0..devices {
        rt.synchronize(d)?;
        assert_clean(rt, d)?;
    }
    Ok(done.load(Ordering::Relaxed))
}

fn runtime() -> offload::Result<Runtime> {
    Runtime::builder().host_devices(3).synchronous(offload_tests::synchronous()).build()
}

#[test]
fn sixteen_threads_on_every_device_lose_nothing() -> offload::Result<()> {
    let rt = runtime()?;
    let ops = soak(&rt, 16, 400)?;
    check!(ops == 16 * 400, "{ops} operations");
    println!(
        "soak: 16 threads x 400 operations on {} devices, every result right, nothing left",
        rt.num_devices()
    );
    Ok(())
}

#[test]
#[ignore = "long: about 20 times the normal run"]
fn soak_long() -> offload::Result<()> {
    let rt = runtime()?;
    let ops = soak(&rt, 16, 8000)?;
    println!("soak: {ops} operations on {} devices, every result right, nothing left", rt.num_devices());
    Ok(())
}
