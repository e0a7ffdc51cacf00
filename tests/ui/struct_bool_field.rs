// A `bool` field is not DeviceCopy: not every byte is a bool.
#[derive(Clone, Copy, offload::DeviceCopy)]
#[repr(C)]
struct Params {
    on: bool,
    scale: f32,
}

fn main() {}
