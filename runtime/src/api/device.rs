//! The [`Device`] handle: one device of a runtime and the constructs of the safe API on it.

use crate::data_env::UpdateDirection;
use crate::error::{Error, Result};
use crate::kernel::LaunchArg;
use crate::kernel::{DeviceCopy, Kernel};
use crate::range::HostRange;
use crate::rt::Runtime;

use super::*;

/// One device (or the initial device) of a runtime, for the safe API.
#[derive(Clone, Copy, Debug)]
pub struct Device<'rt> {
    rt: &'rt Runtime,
    number: usize,
}

impl Runtime {
    /// Device `number` for the safe API; `initial_device()` gives the host fallback.
    /// Under `OMP_TARGET_OFFLOAD=mandatory` with no device, every number fails with
    /// [`crate::Error::OffloadMandatory`] (what the handle is for is device constructs).
    pub fn device(&self, number: usize) -> Result<Device<'_>> {
        self.construct_target(number)?;
        Ok(Device { rt: self, number })
    }

    /// The `if` clause: device `number` when `condition` holds, else the initial device
    /// (regions run on the host, data constructs do nothing), as OpenMP's `if(false)`.
    pub fn device_if(&self, condition: bool, number: usize) -> Result<Device<'_>> {
        let d = self.device(number)?;
        if condition {
            Ok(d)
        } else {
            self.device(self.initial_device())
        }
    }
}

impl<'rt> Device<'rt> {
    /// The device number.
    pub fn number(&self) -> usize {
        self.number
    }

    /// The runtime.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// `#pragma omp target data map(...)`: maps `maps`, runs `body` with their device
    /// views, then unmaps them (copying `from` ranges back) whether `body` failed or not.
    ///
    /// A panic of `body` ends the region as an error would (its maps are ended, so
    /// nothing it mapped stays mapped), then resumes: `body` is the caller's own code.
    #[track_caller]
    pub fn data<'a, L: MapList<'a>, R>(
        &self,
        maps: L,
        body: impl FnOnce(L::Views) -> Result<R>,
    ) -> Result<R> {
        let items = super::entry_items(self.rt, self.number, &maps)?;
        // SAFETY: every item borrows its host slice for 'a (shared for reads, exclusive for
        // `from` kinds), and `maps` is alive until the end of this function.
        unsafe { self.rt.target_data_begin(self.number, &items)? };
        // A panic of `body` is held until the region has ended.
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(maps.views(self.number, false))));
        // SAFETY: as above.
        let end = unsafe { self.rt.target_data_end(self.number, &items) };
        drop(maps);
        let r = r.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        end.map(|()| r)
    }

    /// `#pragma omp target enter data` over borrowed slices; the returned guard ends it
    /// (`target exit data`: `from` for maps that copy back, `release` for the others) when
    /// dropped or [`Mapped::exit`](crate::Mapped::exit)ed, so the slices stay borrowed for as long as they are
    /// mapped. `map::from` enters as `alloc` (and copies back at the end).
    ///
    /// ```
    /// use offload::{map, Runtime};
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let gpu = rt.device(0)?;
    /// let (x, mut y) = (vec![1u8; 64], vec![0u8; 64]);
    /// let entered = gpu.enter_data((map::to(&x), map::from(&mut y)))?;
    /// let (xv, _yv) = entered.views();
    /// assert!(rt.is_present(x.as_ptr() as usize, 0)? && xv.len() == 64);
    /// entered.exit()?; // or drop it
    /// assert!(rt.live_mappings().is_empty());
    /// # Ok::<(), offload::Error>(())
    /// ```
    #[track_caller]
    pub fn enter_data<'a, L: MapList<'a>>(&self, maps: L) -> Result<crate::Mapped<'rt, 'a, L>> {
        crate::Mapped::enter(*self, maps)
    }

    /// `#pragma omp target data map(...)` as a guard: the region ends (its maps' exit
    /// half) when the guard is dropped or [`Mapped::exit`](crate::Mapped::exit)ed. Unlike [`Device::data`]'s
    /// body, the guard lends the host copy of exclusively borrowed maps
    /// ([`Mapped::host_mut`](crate::Mapped::host_mut)) for the `target update` pattern.
    #[track_caller]
    pub fn data_region<'a, L: MapList<'a>>(&self, maps: L) -> Result<crate::Mapped<'rt, 'a, L>> {
        crate::Mapped::region(*self, maps)
    }

    /// `#pragma omp target exit data` over borrowed slices (`from` needs `&mut`).
    #[track_caller]
    pub fn exit_data<'a, L: MapList<'a>>(&self, maps: L) -> Result<()> {
        let mut items = Vec::new();
        maps.items(&mut items);
        // SAFETY: `from` kinds are only made from exclusive borrows, held by `maps`.
        unsafe { self.rt.exit_data(self.number, &items) }
    }

    /// `#pragma omp target update to(...)`.
    #[track_caller]
    pub fn update_to<T: DeviceCopy>(&self, host: &[T]) -> Result<()> {
        // SAFETY: `host` is borrowed for reads during the call.
        unsafe { self.rt.update(self.number, UpdateDirection::To, &[(HostRange::of(host), false)]) }
    }

    /// `#pragma omp target update from(...)`.
    #[track_caller]
    pub fn update_from<T: DeviceCopy>(&self, host: &mut [T]) -> Result<()> {
        // SAFETY: `host` is borrowed exclusively during the call; any bits are valid `T`.
        unsafe { self.rt.update(self.number, UpdateDirection::From, &[(HostRange::of(host), false)]) }
    }

    /// Gets `kernel` ready on this device (GPUs compile and load it on first use; this
    /// does it now, e.g. before a timed run; its 32-bit variant too, which launches that
    /// fit it run). A no-op on host devices.
    pub fn prepare(&self, kernel: &Kernel) -> Result<()> {
        self.rt.prepare_kernel(self.number, kernel)
    }

    /// Runs `kernel` over `n` work items; views among `args` must be mapped on this device
    /// (a target region whose arguments are all present).
    #[track_caller]
    pub fn launch<A: KernelArgs>(&self, kernel: &Kernel, n: usize, args: A) -> Result<()> {
        self.launch_at(kernel, n, args, std::panic::Location::caller())
    }

    /// [`Device::launch`] as called from `at` (for the trace's construct line).
    pub(crate) fn launch_at<A: KernelArgs>(
        &self,
        kernel: &Kernel,
        n: usize,
        args: A,
        at: &'static std::panic::Location<'static>,
    ) -> Result<()> {
        // A team size given at launch is the GPU block this launch runs with.
        let kernel = &args.block().map_or(*kernel, |b| kernel.with_block(b));
        let mut launch_args = args.launch_args(self.number, kernel)?;
        // On the initial device views are host memory itself; a view of a shared borrow
        // gets a private copy so that a kernel writing to it cannot write through `&`.
        // 16-byte words: the copy is aligned for every element type up to 16 bytes, and an
        // empty view still gets a real, aligned address.
        let mut copies: Vec<Vec<u128>> = Vec::new();
        if self.number == self.rt.initial_device() {
            for (i, range) in args.shared_views() {
                let mut words = vec![0u128; range.bytes.div_ceil(16).max(1)];
                // SAFETY: the view borrows `range` shared for its lifetime; `words` holds at
                // least `range.bytes` bytes and is a separate allocation.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        range.begin as *const u8,
                        words.as_mut_ptr().cast::<u8>(),
                        range.bytes,
                    )
                };
                copies.push(words);
                let copy = copies.last().map_or(0, |c| c.as_ptr() as usize);
                launch_args[i] = match launch_args[i] {
                    // The copy's base is as far before it as the view's base is.
                    LaunchArg::MappedBase { base, section } => {
                        LaunchArg::MappedBase { base: copy.wrapping_sub(section - base), section: copy }
                    }
                    _ => LaunchArg::Mapped(copy),
                };
            }
        }
        if self.number == self.rt.initial_device() {
            // Views are host memory (exclusive borrows, or the copies above, of the same
            // length): their extents are known, so host kernels can be bounds-checked.
            return self.rt.run_on_host(kernel, n, &launch_args, &args.view_extents());
        }
        // SAFETY: no map list; mapped arguments are translated through the present table
        // (device memory of the right extent).
        unsafe {
            self.rt.target_launch_at(self.number, kernel, &[], &launch_args, crate::rt::ArgShape::Full(n), at)
        }
    }

    /// `C = alpha op(A) op(B) + beta C` in f32 (column-major, as BLAS) on mapped views:
    /// [`Device::gemm`] without a bias, in `g`'s precision (fp32 unless `g.tf32`).
    pub fn sgemm(
        &self,
        g: &crate::Gemm,
        a: DeviceSlice<'_, f32>,
        b: DeviceSlice<'_, f32>,
        c: DeviceSlice<'_, f32>,
    ) -> Result<()> {
        self.gemm(g, a, b, c, None)
    }

    /// `D = act(alpha op(A) op(B) + beta C + bias)` ([`crate::Gemm`], column-major as
    /// BLAS; D is C's memory) on mapped views of `f32`, `bf16` or `f16` elements, with f32
    /// accumulation: cuBLASLt on CUDA devices, the bias and the activation fused into its
    /// epilogue; `matrixmultiply`'s kernel over the device's threads on host devices, which
    /// compute the same precisions (see [`crate::gemm`]), and bf16 on the CPU's bf16 dot
    /// products where it has them ([`crate::RuntimeBuilder::host_bf16_dot`]). Each view must span its operand
    /// (the bias `g.m` elements) within one mapped range or a [`crate::DeviceBuffer::view`],
    /// and C's must be writable (not of a shared borrow); C must not overlap the other
    /// operands.
    ///
    /// ```
    /// use offload::half::bf16;
    /// use offload::{map, Activation, Gemm, Runtime};
    ///
    /// let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build()?;
    /// let dev = rt.device(0)?;
    /// let v = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    /// // Column-major A (2 x 2) times B (2 x 1), plus a bias, ReLU.
    /// let (a, b, bias) = (v(&[1.0, 0.0, 0.0, 1.0]), v(&[3.0, -4.0]), v(&[0.5, 0.5]));
    /// let mut c = v(&[0.0, 0.0]);
    /// let g = Gemm { m: 2, n: 1, k: 2, lda: 2, ldb: 2, ldc: 2, activation: Activation::Relu, ..Gemm::default() };
    /// dev.data((map::to(&a), map::to(&b), map::to(&bias), map::from(&mut c)), |(a, b, bias, c)| {
    ///     dev.gemm(&g, a, b, c, Some(bias))
    /// })?;
    /// assert_eq!(c, v(&[3.5, 0.0]));
    /// # Ok::<(), offload::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a view of another device, one too short for its
    /// operand, a C that kernels may not write, TF32 asked of elements that are not f32, or
    /// a call inside a [`Device::record`] body (a recording holds launches only);
    /// [`Error::NotPresent`] for an operand not mapped whole; [`Error::NoKernelImpl`] on a
    /// backend without BLAS (HIP); the library's errors as [`Error::Driver`].
    pub fn gemm<T: crate::GemmElement>(
        &self,
        g: &crate::Gemm,
        a: DeviceSlice<'_, T>,
        b: DeviceSlice<'_, T>,
        c: DeviceSlice<'_, T>,
        bias: Option<DeviceSlice<'_, T>>,
    ) -> Result<()> {
        let (ea, eb, ec) = g.extents()?;
        let invalid = |what: String| Error::InvalidArgument { routine: "gemm", what };
        if g.tf32 && T::TYPE != crate::ElementType::F32 {
            return Err(invalid(format!(
                "TF32 applies to f32 operands, not {}: {} already has f32 accumulation",
                T::TYPE.name(),
                T::TYPE.name()
            )));
        }
        if g.activation == crate::Activation::GeluExact {
            return Err(invalid(
                "no GEMM library fuses exact GELU into its epilogue: run offload_kernels::linear, \
                 which applies it after the product, or take Activation::Gelu (the tanh form)"
                    .into(),
            ));
        }
        // A recording holds kernel launches only (a library's product is not one).
        self.rt.not_recording(self.number, "a gemm")?;
        // C is written: as for a generated kernel's `&mut` argument (`check_writable`), only
        // a writable view or device scratch.
        if !c.device_writable() {
            return Err(invalid(format!(
                "operand 2 (C) is written, but its view {} comes from a shared borrow; pass a \
                 writable view (map::from, map::tofrom, map::to_mut, map::alloc_mut, HostBuffer::view) \
                 or device scratch (HostBuffer::shared_view)",
                c.host_range()
            )));
        }
        let mut operands = [None; 4];
        let views = [Some((a, ea)), Some((b, eb)), Some((c, ec)), bias.map(|v| (v, g.m))];
        for (i, (v, need)) in views.into_iter().enumerate().filter_map(|(i, o)| o.map(|o| (i, o))) {
            let name = ["A", "B", "C", "the bias"][i];
            if v.device() != self.number || v.len() < need {
                return Err(invalid(format!(
                    "operand {i} ({name}): a view of {} elements on device {} for {need} elements on device {}",
                    v.len(),
                    v.device(),
                    self.number
                )));
            }
            let span = HostRange::new(v.host_range().begin, need * std::mem::size_of::<T>());
            operands[i] = Some(crate::rt::GemmOperand { span, resident: v.is_device_resident() });
        }
        self.rt.gemm_on(self.number, g, T::TYPE, g.precision::<T>(), operands)
    }

    /// `#pragma omp target map(...)`: a launch with its own map list; `args` builds the
    /// kernel's arguments from the maps' views.
    #[track_caller]
    pub fn target<'a, L: MapList<'a>, A: KernelArgs>(
        &self,
        kernel: &Kernel,
        n: usize,
        maps: L,
        args: impl FnOnce(L::Views) -> A,
    ) -> Result<()> {
        let at = std::panic::Location::caller();
        // Its kernel's failure, found by its own copies back, is its own error.
        let origin = crate::origin::Origin { construct: "target", kernel: Some(kernel.name()), at };
        self.data(maps, |views| self.launch_at(kernel, n, args(views), at))
            .map_err(|e| origin.failed(self.number, e))
    }
}
