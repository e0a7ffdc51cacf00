// A barrier is a teams kernel's (`#[offload::kernel(teams = THREADS)]`).
#[offload::kernel]
fn k(i: usize, x: &mut [f32]) {
    offload::barrier();
    x[i] = 0.0;
}

fn main() {}
