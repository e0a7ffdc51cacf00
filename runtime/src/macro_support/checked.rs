//! Checked launches: a GPU launch of `KERNEL_CHECKED` with a report of the first
//! out-of-range access, read back and turned into an error naming the argument.

use crate::api::{Device, DeviceSlice, KernelArgs, KernelArgument};
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::kernel::LaunchArg;
use crate::range::HostRange;

/// Words of a checked launch's report: set, argument, index, length, two scratch words
/// that out-of-range accesses are redirected to.
pub(super) const REPORT_WORDS: usize = 6;

/// A launch's arguments followed by the address of a checked launch's report.
struct WithReport<'a, A>(A, DeviceSlice<'a, u64>);

// SAFETY: forwards `A`'s arguments and adds the runtime's own report buffer.
unsafe impl<A: KernelArgs> KernelArgs for WithReport<'_, A> {
    fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>> {
        let mut v = self.0.launch_args(device, kernel)?;
        let at = v.len();
        v.push(self.1.launch_arg(device, at, kernel)?);
        Ok(v)
    }
    fn shared_views(&self) -> Vec<(usize, HostRange)> {
        self.0.shared_views()
    }
    fn view_extents(&self) -> Vec<Option<usize>> {
        let mut v = self.0.view_extents();
        if !v.is_empty() {
            v.push(Some(REPORT_WORDS * 8));
        }
        v
    }
    fn block(&self) -> Option<u32> {
        self.0.block()
    }
}

/// Launches the checked variant `kernel` (see `NAME::KERNEL_CHECKED`) of a generated
/// kernel and turns the report of an access out of range into [`Error::KernelFailed`];
/// `params` names the kernel's arguments by position. On a GPU the report (48 bytes) is
/// mapped `tofrom` around the launch, so it shows in traces and transfer counts; host
/// devices run the (always checked) host twin without one.
#[track_caller]
pub fn launch_checked<A: KernelArgs>(
    device: &Device<'_>,
    kernel: &'static Kernel,
    n: usize,
    args: A,
    params: &[&str],
) -> Result<()> {
    // Host devices and the initial device run the host twin, whose accesses are checked
    // anyway: no report to map.
    if runs_host_twin(device)? {
        return device.launch(kernel, n, args);
    }
    let mut report = [0u64; REPORT_WORDS];
    let at = std::panic::Location::caller();
    device.data(crate::map::tofrom(&mut report[..]), |r| {
        device.launch_at(kernel, n, WithReport(args, r), at)
    })?;
    check_report(device, kernel, params, &report)
}

/// Whether launches on `device` run kernels' host twins (host devices, the initial device).
pub(super) fn runs_host_twin(device: &Device<'_>) -> Result<bool> {
    let rt = device.runtime();
    Ok(device.number() == rt.initial_device()
        || rt.describe(device.number())?.kind == crate::BackendKind::Host)
}

/// The error a checked launch's `report` (see [`REPORT_WORDS`]) describes, if any.
pub(super) fn check_report(
    device: &Device<'_>,
    kernel: &'static Kernel,
    params: &[&str],
    report: &[u64],
) -> Result<()> {
    let word = |k: usize| report.get(k).copied().unwrap_or(0);
    if word(0) == 0 {
        return Ok(());
    }
    let name = usize::try_from(word(1)).ok().and_then(|k| params.get(k)).copied().unwrap_or("?");
    Err(Error::KernelFailed {
        device: device.number(),
        kernel: kernel.name(),
        message: format!(
            "argument `{name}`: index {} is out of range for a view of {} elements (a checked launch: the \
             access was not made; the first of possibly several)",
            word(2),
            word(3)
        ),
    })
}
