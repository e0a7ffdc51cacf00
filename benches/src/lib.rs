//! Benchmarks live in the `[[bench]]` targets of this package.
