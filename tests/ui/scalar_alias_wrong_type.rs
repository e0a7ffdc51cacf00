// `types(..)` names an alias with another type than the alias has: refused at compile time.
type Real = f32;

#[offload::kernel(types(Real = f64))]
fn scale(i: usize, a: Real, x: &mut [Real]) {
    x[i] *= a;
}

fn main() {}
