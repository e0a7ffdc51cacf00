//! Code outside `#[offload::kernel]`'s subset, launches with the wrong argument types, and
//! host access to a slice a guard keeps mapped must not compile, with an error that points
//! at the construct and says why (`tests/ui/*.rs`, each with the compiler's expected output
//! beside it).

#[test]
fn kernels_outside_the_subset_do_not_compile() {
    trybuild::TestCases::new().compile_fail("ui/*.rs");
}
