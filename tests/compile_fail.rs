//! Code outside `#[offload::kernel]`'s subset, launches with the wrong argument types, and
//! host access to a slice a guard keeps mapped must not compile, with an error that points
//! at the construct and says why (`tests/ui/*.rs`, each with the compiler's expected output
//! beside it).

#[test]
fn kernels_outside_the_subset_do_not_compile() {
    // trybuild compiles the cases with cargo: a bundled test executable on a machine with no
    // Rust toolchain (the GPU machine) has none to call. Everywhere cargo runs the tests
    // (CI, `scripts/test.sh`) it is there.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    if std::process::Command::new(&cargo).arg("--version").output().is_err() {
        println!(
            "SKIP compile_fail: no cargo here ({cargo:?}); the compile-fail cases need a Rust toolchain"
        );
        return;
    }
    trybuild::TestCases::new().compile_fail("ui/*.rs");
}
