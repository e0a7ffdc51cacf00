use offload::{map, Runtime};

#[offload::kernel]
fn scale(i: usize, a: f32, x: &mut [f32]) {
    x[i] *= a;
}

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().host_devices(1).build()?;
    let gpu = rt.device(0)?;
    let mut x = vec![1.0f32; 8];
    // An f64 scalar where `f32` was declared.
    gpu.data(map::tofrom(&mut x), |x| scale::launch(&gpu, 8, 2.0f64, x))
}
