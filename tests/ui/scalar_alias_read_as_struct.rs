// An alias of a scalar type passed to a kernel the macro was not told of: the macro takes
// `Real` for a struct, and rustc's error (on the struct bound) says how to tell it.
type Real = f32;

#[offload::kernel]
fn fill(i: usize, a: Real, y: &mut [f32]) {
    y[i] = 1.0;
}

fn main() {}
