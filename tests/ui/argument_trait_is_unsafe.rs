// A kernel argument names memory that launches trust, so implementing the trait is an
// unsafe promise: a safe `impl` does not compile.
use offload::api::KernelArgument;
use offload::{Kernel, LaunchArg, Result};

struct Anywhere(usize);

impl KernelArgument for Anywhere {
    fn launch_arg(&self, _: usize, _: usize, _: &Kernel) -> Result<LaunchArg> {
        Ok(LaunchArg::Mapped(self.0))
    }
}

fn main() {}
