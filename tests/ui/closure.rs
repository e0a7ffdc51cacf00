#[offload::kernel]
fn with_closure(i: usize, x: &mut [f32]) {
    let f = |v: f32| v * 2.0;
    x[i] = f(x[i]);
}

fn main() {}
