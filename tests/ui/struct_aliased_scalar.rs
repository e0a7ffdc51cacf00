// A field named as a scalar type that an alias makes another: the C struct would differ.
#[allow(non_camel_case_types)]
type u64 = u32;

#[derive(offload::DeviceCopy, Clone, Copy)]
#[repr(C)]
pub struct Q {
    a: u64,
    b: u32,
}

fn main() {}
