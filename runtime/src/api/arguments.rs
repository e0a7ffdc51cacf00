//! What a kernel launch of the safe API takes: [`KernelArgument`]s (views, scalars,
//! [`DevicePtr`]s) in tuples ([`KernelArgs`]).
use crate::error::{Error, Result};
use crate::kernel::LaunchArg;
use crate::kernel::{Kernel, KernelScalar};
use crate::range::HostRange;

use super::*;

/// A raw device address as a kernel argument (e.g. a neighbour's halo row, for peer
/// stores), or null.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null pointer.
    pub const NULL: Self = Self(0);

    /// A kernel argument that is the device address `addr`.
    ///
    /// # Safety
    /// Whatever the kernel does through it must be valid: memory of the launching device,
    /// or of a device it has peer access to, that lives through the launch. (On host
    /// devices device memory is host memory, so this is a host-memory contract.)
    pub unsafe fn new(addr: u64) -> Self {
        Self(addr)
    }

    /// The address.
    pub fn addr(self) -> u64 {
        self.0
    }
}

// SAFETY: a `DevicePtr` is made only by the unsafe `DevicePtr::new`, whose caller vouches
// for the address.
unsafe impl KernelArgument for DevicePtr {
    fn launch_arg(&self, _: usize, _: usize, _: &Kernel) -> Result<LaunchArg> {
        Ok(LaunchArg::Device(self.0))
    }
}

// SAFETY: a device address is no view of host memory.
unsafe impl SharedView for DevicePtr {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}

/// One kernel argument of the safe API: a scalar or a [`DeviceSlice`].
///
/// # Safety
/// Launches trust the argument: a `LaunchArg::Mapped` or `MappedBase` must name host
/// memory the argument borrows (exclusively when a kernel may write it), a
/// `LaunchArg::Device` device memory it keeps alive, and `view_range` its true extent.
pub unsafe trait KernelArgument {
    /// The argument in the OpenMP launch shape, checked against the launching device.
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg>;

    /// The host range a view names (so a launch on the initial device knows its extent).
    fn view_range(&self) -> Option<HostRange> {
        None
    }
}

// SAFETY: a value names no memory.
unsafe impl<T: KernelScalar> KernelArgument for T {
    fn launch_arg(&self, _: usize, _: usize, _: &Kernel) -> Result<LaunchArg> {
        Ok(LaunchArg::Value(self.into_scalar()))
    }
}

// SAFETY: a view names the range its map (or guard, buffer) borrows for 'a, writable only
// when that borrow is exclusive; its extent is that range's.
unsafe impl<T> KernelArgument for DeviceSlice<'_, T> {
    fn launch_arg(&self, device: usize, index: usize, kernel: &Kernel) -> Result<LaunchArg> {
        if self.device != device {
            return Err(Error::KernelArgument {
                kernel: kernel.name(),
                index,
                what: format!("a view of device {} passed to a launch on device {device}", self.device),
            });
        }
        if self.resident {
            return Ok(LaunchArg::Device(self.host as u64));
        }
        Ok(LaunchArg::Mapped(self.host))
    }

    fn view_range(&self) -> Option<HostRange> {
        Some(self.host_range())
    }
}

/// The arguments of a launch: a tuple of [`KernelArgument`]s.
///
/// # Safety
/// As [`KernelArgument`] for every argument, and `shared_views` must report every view of
/// a shared borrow.
pub unsafe trait KernelArgs {
    /// Converts every argument for a launch of `kernel` on `device`.
    fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>>;
    /// Views among the arguments that borrow host memory shared, by position.
    fn shared_views(&self) -> Vec<(usize, HostRange)>;
    /// The bytes each argument's view spans, by position (`None` for scalars and raw
    /// pointers); empty when unknown.
    fn view_extents(&self) -> Vec<Option<usize>> {
        Vec::new()
    }
    /// The threads per team (a GPU block) a launch of these arguments runs with, when they
    /// carry one (a teams kernel whose team size is given at launch, `teams = ..=MAX`);
    /// `None`: the kernel's own.
    fn block(&self) -> Option<u32> {
        None
    }
}

/// Whether an argument is a view of a shared borrow, and of which range.
///
/// # Safety
/// `shared_range` must report the range of every view of a shared borrow (the initial
/// device gives those private copies, so a kernel cannot write through `&`).
pub unsafe trait SharedView {
    /// `Some(range)` for views of shared borrows.
    fn shared_range(&self) -> Option<HostRange>;
}

// SAFETY: a value is no view.
unsafe impl<T: KernelScalar> SharedView for T {
    fn shared_range(&self) -> Option<HostRange> {
        None
    }
}

// SAFETY: reports the view's range exactly when its borrow is shared.
unsafe impl<T> SharedView for DeviceSlice<'_, T> {
    fn shared_range(&self) -> Option<HostRange> {
        (!self.writable && !self.resident).then(|| self.host_range())
    }
}

macro_rules! kernel_args_tuple {
    ($($n:ident : $i:tt),*) => {
        // SAFETY: each argument is one (a checked implementation), reported in order.
        unsafe impl<$($n: KernelArgument + SharedView),*> KernelArgs for ($($n,)*) {
            #[allow(unused_variables, unused_mut)]
            fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>> {
                Ok(vec![$(self.$i.launch_arg(device, $i, kernel)?),*])
            }
            #[allow(unused_mut)]
            fn shared_views(&self) -> Vec<(usize, HostRange)> {
                let mut v = Vec::new();
                $(if let Some(r) = self.$i.shared_range() { v.push(($i, r)); })*
                v
            }
            fn view_extents(&self) -> Vec<Option<usize>> {
                vec![$(self.$i.view_range().map(|r| r.bytes)),*]
            }
        }
    };
}
kernel_args_tuple!();
kernel_args_tuple!(A: 0);
kernel_args_tuple!(A: 0, B: 1);
kernel_args_tuple!(A: 0, B: 1, C: 2);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14);
kernel_args_tuple!(A: 0, B: 1, C: 2, D: 3, E: 4, F: 5, G: 6, H: 7, I: 8, J: 9, K: 10, L: 11, M: 12, N: 13, O: 14, P: 15);
