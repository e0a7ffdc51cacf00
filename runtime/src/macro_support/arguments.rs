//! A generated kernel's arguments: the launchers' checks (writable views, reductions,
//! overlaps, work-item counts, team sizes), the twin's reads of the argument block, and
//! [`ArgCollector`], which builds a launch's argument list in the kernel's order.

use crate::api::{DeviceSlice, KernelArgument};
use crate::error::{Error, Result};
use crate::kernel::LaunchArg;
use crate::kernel::{HostLaunch, Kernel, KernelScalar, KernelStruct, Scalar};
use crate::range::HostRange;

use super::views::Element;

/// Implemented by a type for itself only: `A: AliasOf<T>` holds when `A` is `T`. The
/// kernel macro asserts each entry of `types(Alias = T)` with it.
#[diagnostic::on_unimplemented(
    message = "an alias in `types(..)` is `{Self}`, not `{T}` as the option says",
    label = "this alias is `{Self}`",
    note = "`types(Real = f32)` tells the kernel macro what the alias `Real` stands for: give the type the alias has"
)]
pub trait AliasOf<T> {}

impl<T> AliasOf<T> for T {}

/// Compiles only when `A` is `T` (see [`AliasOf`]).
pub const fn alias_is<A: AliasOf<T>, T>() {}

/// Compiles only when `T` is a kernel struct: asserted, at the type's place in the
/// signature, for each type a kernel takes as a struct (a name it does not know).
pub const fn is_kernel_struct<T: KernelStruct>() {}

/// The work items of a launch over `points` of its space, `per_point` each (a teams
/// kernel's threads per team, else 1): an error naming `kernel` when the count overflows.
pub fn work_items(kernel: &'static str, points: usize, per_point: usize) -> Result<usize> {
    points.checked_mul(per_point).ok_or_else(|| Error::KernelArgument {
        kernel,
        index: 0,
        what: format!("{points} teams of {per_point} threads: more work items than a usize holds"),
    })
}

/// Scalar argument `k` (passed as `u64`) as a `usize`.
pub fn index_arg(l: &HostLaunch<'_>, k: usize) -> std::result::Result<usize, String> {
    let v: u64 = l.scalar(k)?;
    usize::try_from(v).map_err(|_| format!("argument {k}: {v} does not fit in usize"))
}

/// A teams kernel's team size given at launch (`teams = ..=MAX`), checked: 1 to `most`
/// threads, whole warps (a multiple of 32) when `warps` (the kernel reduces over teams).
pub fn team_size_of(kernel: &'static str, size: usize, most: usize, warps: bool) -> Result<usize> {
    let bad = |what: String| Error::KernelArgument { kernel, index: 0, what };
    if size == 0 || size > most {
        return Err(bad(format!(
            "a team of {size} threads: this kernel's teams have 1 to {most} (`teams = ..={most}`)"
        )));
    }
    if warps && !size.is_multiple_of(32) {
        return Err(bad(format!(
            "a team of {size} threads: this kernel reduces over its teams, which are whole warps (a multiple of 32)"
        )));
    }
    Ok(size)
}

/// Scalar argument `k` as a teams kernel's team size given at launch: 1 to `most` threads.
pub fn team_size_arg(l: &HostLaunch<'_>, k: usize, most: usize) -> std::result::Result<usize, String> {
    let t = index_arg(l, k)?;
    if t == 0 || t > most {
        return Err(format!(
            "a team of {t} threads: this kernel's teams have 1 to {most} (its `teams = ..={most}`)"
        ));
    }
    Ok(t)
}

/// Scalar argument `k` (passed as `u32`) as a `bool`.
pub fn bool_arg(l: &HostLaunch<'_>, k: usize) -> std::result::Result<bool, String> {
    Ok(l.scalar::<u32>(k)? != 0)
}

/// The bits of a `bf16` or `f16` argument of a host launch, passed as a `u32`
/// ([`ArgCollector::bits16`]).
pub fn bits16_arg(l: &HostLaunch<'_>, k: usize) -> std::result::Result<u16, String> {
    let w = l.scalar::<u32>(k)?;
    u16::try_from(w).map_err(|_| format!("argument {k}: {w:#x} is not the bits of a 16-bit float"))
}

/// An error unless kernels may write `view` ([`DeviceSlice::device_writable`]), given for
/// the `&mut` argument `name` (position `index` after the indices) of `kernel`.
pub fn check_writable<T>(
    kernel: &'static str,
    index: usize,
    name: &str,
    view: &DeviceSlice<'_, T>,
) -> Result<()> {
    if view.device_writable() {
        return Ok(());
    }
    Err(Error::KernelArgument {
        kernel,
        index,
        what: format!(
            "`{name}` is declared `&mut [{}]` but the view {} is not writable: it comes from a shared \
             borrow (map it with map::from, map::tofrom, map::to_mut or map::alloc_mut, or use a HostBuffer's view)",
            std::any::type_name::<T>(),
            view.host_range()
        ),
    })
}

/// An error unless `view`, given for reduction variable `name` (position `index`) of
/// `kernel`, is writable (an exclusive borrow) or a [`crate::DeviceBuffer`]'s (device memory
/// itself), and holds the element the reduction combines into. (A `HostBuffer`'s shared
/// view is refused: on the initial device its kernels write a private copy, and the result
/// would be lost.)
pub fn check_reduction<T>(
    kernel: &'static str,
    index: usize,
    name: &str,
    op: &str,
    view: &DeviceSlice<'_, T>,
) -> Result<()> {
    let combines = view.is_writable() || view.is_resident();
    if !combines || view.is_empty() {
        return Err(Error::KernelArgument {
            kernel,
            index,
            what: format!(
                "`{name}` is a `{op}` reduction variable: it takes a writable view or a device buffer's view \
                 of at least one {} (the result is combined into element 0), got {} view {} of {} elements",
                std::any::type_name::<T>(),
                if combines { "a writable" } else { "a shared" },
                view.host_range(),
                view.len()
            ),
        });
    }
    Ok(())
}

/// An error if a view that kernel `kernel` writes overlaps another of its views: a launch's
/// views are distinct memory (the generated code may assume so, as C's `restrict`). Each
/// view comes with its argument's position, its name and whether the kernel writes it; the
/// error names the position of the written one. `None` stands for a reduction variable the
/// runtime provides (a `reduce`: no view of the program's).
pub fn check_disjoint(kernel: &'static str, views: &[Option<(usize, &str, HostRange, bool)>]) -> Result<()> {
    for (i, (ka, a, ra, wa)) in views.iter().enumerate().filter_map(|(i, v)| Some((i, (*v)?))) {
        for &(kb, b, rb, wb) in views[i + 1..].iter().flatten() {
            let overlap = ra.bytes > 0 && rb.bytes > 0 && ra.begin < rb.end() && rb.begin < ra.end();
            if overlap && (wa || wb) {
                let (written, index) = if wa { (a, ka) } else { (b, kb) };
                return Err(Error::KernelArgument {
                    kernel,
                    index,
                    what: format!(
                        "the views `{a}` ({ra}) and `{b}` ({rb}) overlap and the kernel writes `{written}`: \
                         iterations could read elements another writes"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The argument block's positions a struct takes: its words (8 bytes each when it is
/// 8-aligned, else 4), so C lays it out where the runtime puts it.
pub const fn words<T: KernelStruct>() -> usize {
    std::mem::size_of::<T>() / word_bytes::<T>()
}

const fn word_bytes<T>() -> usize {
    if std::mem::align_of::<T>() >= 8 {
        8
    } else {
        4
    }
}

/// Fails to compile unless `T` may be a field of a `#[derive(offload::DeviceCopy)]` struct.
pub const fn assert_kernel_field<T: Element>() {}

/// Struct argument `k` (its [`words`] from position `k`) of a host launch.
pub fn struct_arg<T: KernelStruct>(l: &HostLaunch<'_>, k: usize) -> std::result::Result<T, String> {
    let mut out = std::mem::MaybeUninit::<T>::uninit();
    let dst = out.as_mut_ptr().cast::<u8>();
    let w = word_bytes::<T>();
    for i in 0..words::<T>() {
        let bytes = if w == 8 {
            l.scalar::<u64>(k + i)?.to_ne_bytes().to_vec()
        } else {
            l.scalar::<u32>(k + i)?.to_ne_bytes().to_vec()
        };
        // SAFETY: word `i` of `out`, `w` bytes inside it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(i * w), w) };
    }
    // SAFETY: every byte was written (no padding); every bit pattern of a DeviceCopy type is
    // valid.
    Ok(unsafe { out.assume_init() })
}

/// Builds a generated kernel's argument list in the kernel's order, with each view's
/// extent and shared borrow: for a launch on a device, or only to describe the views.
#[derive(Debug)]
pub struct ArgCollector<'k> {
    launch: Option<(usize, &'k Kernel)>,
    args: Vec<LaunchArg>,
    extents: Vec<Option<usize>>,
    shared: Vec<(usize, HostRange)>,
}

impl<'k> ArgCollector<'k> {
    /// For a launch of `kernel` on `device` (views are checked against it).
    pub fn launching(device: usize, kernel: &'k Kernel) -> Self {
        Self { launch: Some((device, kernel)), args: Vec::new(), extents: Vec::new(), shared: Vec::new() }
    }

    /// To describe the views (their extents and shared borrows) only.
    pub fn describing() -> ArgCollector<'static> {
        ArgCollector { launch: None, args: Vec::new(), extents: Vec::new(), shared: Vec::new() }
    }

    fn push(&mut self, a: LaunchArg, extent: Option<usize>) {
        self.args.push(a);
        self.extents.push(extent);
    }

    /// A `usize` (an index bound, a length, a `usize` argument), as `u64`.
    pub fn index(&mut self, v: u64) {
        self.push(LaunchArg::Value(Scalar::U64(v)), None);
    }

    /// A scalar argument.
    pub fn scalar<T: KernelScalar>(&mut self, v: T) {
        self.push(LaunchArg::Value(v.into_scalar()), None);
    }

    /// A `bool` argument, as `u32`.
    pub fn flag(&mut self, v: bool) {
        self.push(LaunchArg::Value(Scalar::U32(u32::from(v))), None);
    }

    /// A `bf16` or `f16` argument's bits, as `u32` (the kernel narrows them).
    pub fn bits16(&mut self, bits: u16) {
        self.push(LaunchArg::Value(Scalar::U32(u32::from(bits))), None);
    }

    /// A struct by value, as its [`words`].
    pub fn words<T: KernelStruct>(&mut self, v: &T) {
        // SAFETY: a kernel struct has no padding: its bytes are initialized.
        let bytes =
            unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
        if word_bytes::<T>() == 8 {
            for c in bytes.chunks_exact(8) {
                self.push(
                    LaunchArg::Value(Scalar::U64(u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))),
                    None,
                );
            }
        } else {
            for c in bytes.chunks_exact(4) {
                self.push(
                    LaunchArg::Value(Scalar::U32(u32::from_ne_bytes(c.try_into().unwrap_or([0; 4])))),
                    None,
                );
            }
        }
    }

    /// A view.
    pub fn view<T>(&mut self, v: &DeviceSlice<'_, T>) -> Result<()> {
        let at = self.args.len();
        let arg = match self.launch {
            Some((device, kernel)) => v.launch_arg(device, at, kernel)?,
            None => LaunchArg::Device(0),
        };
        if let Some(range) = crate::api::SharedView::shared_range(v) {
            self.shared.push((at, range));
        }
        self.push(arg, Some(v.host_range().bytes));
        Ok(())
    }

    /// A place the runtime fills with memory of its own (a `reduce`'s slot).
    pub fn runtime_slot(&mut self) {
        self.push(LaunchArg::Device(0), None);
    }

    /// The arguments.
    pub fn into_args(self) -> Vec<LaunchArg> {
        self.args
    }

    /// Each argument's view extent, by position.
    pub fn into_extents(self) -> Vec<Option<usize>> {
        self.extents
    }

    /// The views of shared borrows, by position.
    pub fn into_shared(self) -> Vec<(usize, HostRange)> {
        self.shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::KernelArg;
    use crate::macro_support::SharedSlice;

    /// A kernel struct of 4- and 8-byte fields, no padding (what the derive checks).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct P {
        a: f32,
        b: u32,
        c: f64,
    }
    // SAFETY: plain numbers, every bit pattern valid, no padding (16 bytes).
    unsafe impl crate::DeviceCopy for P {}
    // SAFETY: the C definition has the same fields in the same order.
    unsafe impl KernelStruct for P {
        const C_SOURCE: &'static str = "struct P { float a; unsigned int b; double c; };";
    }

    #[test]
    fn structs_are_elements_and_arguments_word_by_word() {
        let mut buf = [P { a: 1.5, b: 7, c: -2.25 }; 3];
        {
            let s = SharedSlice::team_local(&mut buf[..], "k", "ps");
            let mut e = s.get(1);
            e.c = 9.0;
            s.set(2, e);
            assert_eq!(s.sub(1, 3).get(1), P { a: 1.5, b: 7, c: 9.0 });
        }
        assert_eq!(buf[2].c, 9.0);
        // By value: 8-byte words (the struct is 8-aligned), read back by the twin.
        let mut c = ArgCollector::describing();
        c.words(&buf[2]);
        let args: Vec<KernelArg> = c
            .into_args()
            .into_iter()
            .map(|a| match a {
                LaunchArg::Value(s) => KernelArg::Scalar(s),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(args.len(), words::<P>());
        assert_eq!(words::<P>(), 2);
        let l = HostLaunch::new("k", 1, &args);
        assert_eq!(struct_arg::<P>(&l, 0), Ok(buf[2]));
    }
}
