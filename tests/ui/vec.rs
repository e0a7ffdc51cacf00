#[offload::kernel]
fn with_vec(i: usize, x: &mut [f32]) {
    let v = vec![1.0f32; 4];
    x[i] = v[0];
}

fn main() {}
