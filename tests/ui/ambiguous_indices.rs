// Two leading `usize` parameters: a 2-D kernel, or an index and a `usize` argument? The
// macro does not guess: it asks for `dims`.
#[offload::kernel]
fn k(i: usize, n: usize, x: &mut [f32]) {
    x[i] = n as f32;
}

fn main() {}
