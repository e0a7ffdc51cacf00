// An association borrows its buffer and its host slice: neither can be freed, nor the
// host slice touched except through the guard, while it lives.
use offload::{DeviceBuffer, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().host_devices(1).build()?;
    let buf = DeviceBuffer::<i32>::new(&rt.device(0)?, 8)?;
    let mut host = vec![0i32; 8];
    let assoc = buf.associate(&mut host, 0)?;
    drop(buf);
    host[0] = 1;
    assoc.update_to()
}
