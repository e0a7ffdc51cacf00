// `packed` lays the struct out unlike the C struct the GPU's code declares.
#[derive(offload::DeviceCopy, Clone, Copy)]
#[repr(C, packed)]
pub struct P {
    a: u32,
    b: u64,
}

fn main() {}
