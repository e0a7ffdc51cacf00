// A slice mapped through a guard stays borrowed while the guard lives: the host cannot
// write it behind the device's back, nor free it while it is mapped.
use offload::{map, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().host_devices(1).build()?;
    let gpu = rt.device(0)?;
    let mut y = vec![0.0f32; 8];
    let entered = gpu.enter_data(map::tofrom(&mut y))?;
    y[0] = 1.0;
    drop(y);
    entered.exit()
}
