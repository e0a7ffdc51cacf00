//! Reduction variables: [`Reducible`] types with each operator's identity, and how a
//! kernel's `reduce` launches it with the runtime's own slots for them.

use crate::api::{Device, KernelArgs};
use crate::error::{Error, Result};
use crate::kernel::LaunchArg;
use crate::kernel::{Kernel, KernelScalar, Scalar};
use crate::range::HostRange;

use super::checked::{check_report, runs_host_twin, REPORT_WORDS};

/// Types a reduction may have, with each operator's identity and combination as the GPU
/// code has them: integer sums wrap (as atomic adds do), float `min`/`max` ignore NaN (as
/// `fmin`/`fmax` and Rust's `f32::min` do).
pub trait Reducible: Copy + Send + Sync {
    /// The identity of `+`.
    const ZERO: Self;
    /// The identity of `min`: the largest value (`+inf` for floats).
    const MIN_IDENTITY: Self;
    /// The identity of `max`: the smallest value (`-inf` for floats).
    const MAX_IDENTITY: Self;
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (integers wrap, as unsigned C arithmetic does).
    fn mul(a: Self, b: Self) -> Self;
    /// The smaller.
    fn min(a: Self, b: Self) -> Self;
    /// The larger.
    fn max(a: Self, b: Self) -> Self;
    /// The identity of `*`.
    const ONE: Self;
}

macro_rules! reducible_int {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            const ZERO: Self = 0;
            const MIN_IDENTITY: Self = <$t>::MAX;
            const MAX_IDENTITY: Self = <$t>::MIN;
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            const ONE: Self = 1;
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
        }
    )*};
}
reducible_int!(i32, u32, i64, u64);

macro_rules! reducible_float {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            const ZERO: Self = 0.0;
            const MIN_IDENTITY: Self = <$t>::INFINITY;
            const MAX_IDENTITY: Self = <$t>::NEG_INFINITY;
            fn add(a: Self, b: Self) -> Self { a + b }
            fn mul(a: Self, b: Self) -> Self { a * b }
            const ONE: Self = 1.0;
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            fn max(a: Self, b: Self) -> Self { a.max(b) }
        }
    )*};
}
reducible_float!(f32, f64);

/// How a generated kernel's `reduce` launches it: which variant, and where its reduction
/// variables sit among the launch's arguments.
#[derive(Debug, Clone, Copy)]
pub struct Reduction<'a> {
    /// The kernel to run: `NAME::KERNEL`, or `NAME::KERNEL_CHECKED` when `checked`.
    pub kernel: &'static Kernel,
    /// Whether `kernel` is the checked variant: a GPU launch of it then takes the address
    /// of a report as its last argument before `n` (host devices run the twin, checked
    /// either way, without one).
    pub checked: bool,
    /// The kernel's arguments' names, in order.
    pub params: &'a [&'a str],
    /// Each argument's launch position (after the indices' bounds, a struct taking its
    /// words).
    pub positions: &'a [usize],
    /// Each reduction variable, in declaration order: its launch position (where the
    /// argument list holds a [`DevicePtr::NULL`](crate::DevicePtr::NULL) placeholder) and its operator's identity.
    pub partials: &'a [(usize, Scalar)],
}

/// Bytes of one reduction slot: every reducible type fits, and every slot is 8-byte aligned.
const SLOT_BYTES: usize = 8;

/// A launch's arguments with the reduction variables' placeholders replaced by the
/// addresses of their slots, and a checked launch's report appended.
struct WithPartials<'s, A> {
    args: A,
    /// Launch position and slot address of each reduction variable.
    slots: &'s [(usize, u64)],
    /// The report's address, for a checked GPU launch.
    report: Option<u64>,
}

// SAFETY: forwards `A`'s arguments; the slots and the report are runtime-owned memory of
// the launching device (host memory on the initial device) that `launch_reduce` keeps
// alive, and not otherwise accessed, through the launch. Each slot spans `SLOT_BYTES`, the
// report `REPORT_WORDS` words.
unsafe impl<A: KernelArgs> KernelArgs for WithPartials<'_, A> {
    fn launch_args(&self, device: usize, kernel: &Kernel) -> Result<Vec<LaunchArg>> {
        let mut v = self.args.launch_args(device, kernel)?;
        for &(pos, addr) in self.slots {
            match v.get_mut(pos) {
                Some(a @ LaunchArg::Device(0)) => *a = LaunchArg::Device(addr),
                _ => {
                    return Err(Error::KernelArgument {
                        kernel: kernel.name(),
                        index: pos,
                        what: "a reduction variable's place holds no `DevicePtr::NULL` placeholder (an \
                               argument list not made by the kernel's `reduce`)"
                            .into(),
                    })
                }
            }
        }
        if let Some(r) = self.report {
            v.push(LaunchArg::Device(r));
        }
        Ok(v)
    }
    fn shared_views(&self) -> Vec<(usize, HostRange)> {
        self.args.shared_views()
    }
    fn view_extents(&self) -> Vec<Option<usize>> {
        let mut v = self.args.view_extents();
        if v.is_empty() {
            return v;
        }
        for &(pos, _) in self.slots {
            if let Some(e) = v.get_mut(pos) {
                *e = Some(SLOT_BYTES);
            }
        }
        if self.report.is_some() {
            v.push(Some(REPORT_WORDS * 8));
        }
        v
    }
    fn block(&self) -> Option<u32> {
        self.args.block()
    }
}

/// The slot's bits holding `v` (its bytes first, the rest zero).
fn slot_bits(v: Scalar) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes().0)
}

/// The value of `like`'s type a slot holding `bits` has.
fn slot_value(like: Scalar, bits: u64) -> Scalar {
    let b = bits.to_ne_bytes();
    let word = [b[0], b[1], b[2], b[3]];
    match like {
        Scalar::I32(_) => Scalar::I32(i32::from_ne_bytes(word)),
        Scalar::U32(_) => Scalar::U32(u32::from_ne_bytes(word)),
        Scalar::F32(_) => Scalar::F32(f32::from_ne_bytes(word)),
        Scalar::I64(_) => Scalar::I64(i64::from_ne_bytes(b)),
        Scalar::U64(_) => Scalar::U64(bits),
        Scalar::F64(_) => Scalar::F64(f64::from_ne_bytes(b)),
    }
}

/// `e` with the kernel argument it names by launch position also named by its name.
fn name_argument(e: Error, r: &Reduction<'_>) -> Error {
    match e {
        Error::KernelArgument { kernel, index, what } => {
            let name = r.positions.iter().position(|&p| p == index).and_then(|k| r.params.get(k));
            let what = match name {
                Some(name) => format!("`{name}`: {what}"),
                None => what,
            };
            Error::KernelArgument { kernel, index, what }
        }
        e => e,
    }
}

/// What a generated kernel's `reduce` runs: `r.kernel` over `n` work items with `args`,
/// each reduction variable's placeholder replaced by a slot the runtime provides, set to
/// its operator's identity; returns the reduced values, in declaration order (the
/// identities when `n` is 0, without a launch).
///
/// On an offload device the slots (8 bytes each, and a checked launch's report after
/// them) are one allocation, written by one copy and read back by one; on the initial
/// device they are host memory. A checked GPU launch (`r.checked`) reports an access out
/// of range as [`launch_checked`](super::launch_checked) does. A launch error naming an argument by position also
/// names it by name.
#[track_caller]
pub fn launch_reduce<A: KernelArgs>(
    device: &Device<'_>,
    r: &Reduction<'_>,
    n: usize,
    args: A,
) -> Result<Vec<Scalar>> {
    if n == 0 {
        return Ok(r.partials.iter().map(|&(_, id)| id).collect());
    }
    let at = std::panic::Location::caller();
    let rt = device.runtime();
    let number = device.number();
    let initial = rt.initial_device();
    let report = r.checked && !runs_host_twin(device)?;
    let count = r.partials.len();
    let words = count + if report { REPORT_WORDS } else { 0 };
    let mut host: Vec<u64> = r.partials.iter().map(|&(_, id)| slot_bits(id)).collect();
    host.resize(words, 0);

    let slots_at = |base: u64| -> Vec<(usize, u64)> {
        r.partials
            .iter()
            .zip((0u64..).map(|k| base + k * SLOT_BYTES as u64))
            .map(|(&(p, _), a)| (p, a))
            .collect()
    };
    let run = || -> Result<()> {
        if number == initial {
            // The initial device's memory is host memory: the slots are `host` itself,
            // which nothing else touches until the launch has returned.
            let slots = slots_at(host.as_mut_ptr() as u64);
            return device.launch_at(r.kernel, n, WithPartials { args, slots: &slots, report: None }, at);
        }
        // The partials: set by a queued copy, read back by one queued copy behind the
        // kernel, the call's one wait.
        let origin = crate::origin::Origin { construct: "target", kernel: Some(r.kernel.name()), at };
        rt.with_partials(number, &mut host, origin, "a reduction's `reduce`", |base| {
            let slots = slots_at(base);
            let report_at = report.then(|| base + (count * SLOT_BYTES) as u64);
            device.launch_at(r.kernel, n, WithPartials { args, slots: &slots, report: report_at }, at)
        })
    };
    run().map_err(|e| name_argument(e, r))?;
    if report {
        check_report(device, r.kernel, r.params, &host[count..])?;
    }
    Ok(r.partials.iter().zip(&host).map(|(&(_, id), &bits)| slot_value(id, bits)).collect())
}

/// Reduced value `k` of `values` (from [`launch_reduce`]) as `T`: an error naming `kernel`
/// if it has another type (not made by the kernel's `reduce`).
pub fn reduced<T: KernelScalar>(values: &[Scalar], k: usize, kernel: &'static str) -> Result<T> {
    values.get(k).copied().and_then(T::from_scalar).ok_or_else(|| Error::KernelArgument {
        kernel,
        index: k,
        what: format!(
            "reduced value {k} is {:?}, not a {} (a reduction list not made by the kernel's `reduce`)",
            values.get(k),
            std::any::type_name::<T>()
        ),
    })
}
