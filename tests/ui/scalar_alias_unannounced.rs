// C's `typedef float Real;` ported as a Rust alias and used in a kernel the macro was not
// told of: the macro reads `Real` as a struct, and the error says how to tell it.
type Real = f32;

#[offload::kernel]
fn scale(i: usize, a: Real, x: &mut [Real]) {
    x[i] *= a;
}

fn main() {}
