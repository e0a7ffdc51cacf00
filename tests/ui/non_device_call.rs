// Kernels call `#[offload::device]` functions only: `helper` has no device source.
fn helper(x: f32) -> f32 {
    x * 2.0
}

#[offload::kernel]
fn k(i: usize, x: &mut [f32]) {
    x[i] = helper(x[i]);
}

fn main() {}
