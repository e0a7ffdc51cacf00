//! What the benches share: [`Bench`], which runs each measurement through `criterion` and
//! hands back its median for the tables of docs/PERFORMANCE.md, and the guard that keeps the GPU
//! benches from measuring when `cargo test --all-targets` merely runs them. The benchmarks
//! themselves are the `[[bench]]` targets of this package.

use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Whether to measure: `cargo bench` passes `--bench`; `cargo test --all-targets` does not,
/// and then the bench only says how to run it.
pub fn measuring() -> bool {
    let on = std::env::args().any(|a| a == "--bench");
    if !on {
        println!("run with `cargo bench` (or pass --bench) to measure");
    }
    on
}

/// The start of every GPU bench named `name`: `None` when not [`measuring`], or when this
/// machine has no GPU (then a line says so and why); otherwise a runtime of the GPUs alone,
/// its device report printed.
pub fn gpu_bench(name: &str) -> offload::Result<Option<offload::Runtime>> {
    if !measuring() {
        return Ok(None);
    }
    let rt = offload::Runtime::builder().gpus(true).host_devices(0).build()?;
    if rt.num_devices() == 0 {
        println!("{name}: no GPU ({}); nothing to measure", rt.device_report().trim_end());
        return Ok(None);
    }
    print!("{}", rt.device_report());
    Ok(Some(rt))
}

/// How long `criterion` spends on one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Samples kept (criterion's minimum is 10).
    pub samples: usize,
    /// Untimed warm-up.
    pub warm_up: Duration,
    /// Target time of the timed samples together.
    pub measure: Duration,
    /// The same number of iterations in every sample (criterion's flat sampling), for
    /// work of milliseconds and more; otherwise criterion's linear ramp.
    pub flat: bool,
}

impl Budget {
    /// Nanosecond-scale host work: 50 samples over 2 s.
    pub const FAST: Budget = Budget {
        samples: 50,
        warm_up: Duration::from_millis(500),
        measure: Duration::from_secs(2),
        flat: false,
    };
    /// Millisecond-scale GPU work (large copies, kernels): 10 samples over 1 s.
    pub const SLOW: Budget = Budget {
        samples: 10,
        warm_up: Duration::from_millis(300),
        measure: Duration::from_secs(1),
        flat: true,
    };
}

/// A bench run: every measurement goes through `criterion` (its warm-up, sampling, outlier
/// report and saved baselines), and each call returns the median over criterion's samples
/// of the time per iteration, for the table the bench prints.
///
/// ```no_run
/// use offload_benches::{Bench, Budget};
/// let mut b = Bench::new("example");
/// let secs = b.wall("sum of 1000", Budget::FAST, || {
///     std::hint::black_box((0..1000u64).sum::<u64>());
/// });
/// println!("{:.1} ns", secs * 1e9);
/// ```
pub struct Bench {
    c: Criterion,
    group: String,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench").field("group", &self.group).finish_non_exhaustive()
    }
}

impl Bench {
    /// A run whose measurements are named `group/...`; criterion's command-line options
    /// (a filter, `--save-baseline`) apply.
    pub fn new(group: &str) -> Self {
        Self::with(Criterion::default().configure_from_args(), group)
    }

    /// A run with criterion configured by the caller (tests: no command line to parse).
    pub fn with(c: Criterion, group: &str) -> Self {
        Self { c, group: group.to_string() }
    }

    /// Median wall-clock seconds per call of `f`.
    pub fn wall(&mut self, id: &str, budget: Budget, mut f: impl FnMut()) -> f64 {
        self.custom(id, budget, |iters| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed()
        })
    }

    /// Median seconds per iteration of `run`, which makes `iters` iterations and returns
    /// the time they took as it measures it (GPU work: CUDA events around them).
    pub fn custom(&mut self, id: &str, budget: Budget, mut run: impl FnMut(u64) -> Duration) -> f64 {
        let samples = budget.samples.max(10);
        let mut per_iter = Vec::new();
        let mut g = self.c.benchmark_group(&self.group);
        g.sample_size(samples).warm_up_time(budget.warm_up).measurement_time(budget.measure);
        if budget.flat {
            g.sampling_mode(SamplingMode::Flat);
        }
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let d = run(iters);
                per_iter.push(d.as_secs_f64() / iters.max(1) as f64);
                d
            })
        });
        g.finish();
        // Criterion's samples are the last calls; the ones before them are its warm-up.
        let keep = samples.min(per_iter.len());
        median(per_iter.split_off(per_iter.len() - keep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn a_measurement_runs_the_closure_and_gives_its_time() {
        let mut b = Bench::with(Criterion::default(), "self-test");
        let tiny = Budget {
            samples: 10,
            warm_up: Duration::from_millis(10),
            measure: Duration::from_millis(50),
            flat: false,
        };
        let mut calls = 0u64;
        let t = b.wall("sleep", tiny, || {
            calls += 1;
            std::thread::sleep(Duration::from_micros(200));
        });
        assert!(calls >= 10, "{calls} calls");
        assert!((150e-6..50e-3).contains(&t), "{t} s per call");
    }
}
