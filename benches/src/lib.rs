//! What the GPU benches share: timing with medians, and the guard that keeps them from
//! measuring when `cargo test --all-targets` merely runs them. The benchmarks themselves
//! are the `[[bench]]` targets of this package.

use std::time::Instant;

/// The median of `v` (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Median seconds of `reps` timed calls of `f` after `warm` untimed ones.
pub fn time(warm: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    (0..warm).for_each(|_| f());
    median(
        (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_timings() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert!(median(Vec::new()).is_nan());
        let mut calls = 0;
        let t = time(2, 5, || calls += 1);
        assert_eq!(calls, 7);
        assert!(t >= 0.0);
    }
}
