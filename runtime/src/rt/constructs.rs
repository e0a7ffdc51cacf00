//! The OpenMP constructs in Rust shape: `target data`, `target enter/exit data`,
//! `target update`, target launches, and `synchronize`.

use std::panic::Location;

use super::recorder;
use super::*;
use crate::backend::Queue;
use crate::device::audit::AuditRule;
use crate::device::{BlocksInUse, DeviceState, Wait};
use crate::info::{InfoFields, InfoFlags};
use crate::kernel::OmpSpace;
use crate::origin::Origin;
use crate::range::{ArrayName, RangeName};

/// An operand of [`Runtime::gemm_on`]: its bytes, at a host address mapped on the device or
/// (`resident`) at a device address (a buffer's memory).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmOperand {
    pub(crate) span: HostRange,
    pub(crate) resident: bool,
}

/// The map constructs, for [`Runtime::map_construct_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapConstruct {
    /// `target data`, opening half.
    DataBegin,
    /// `target data`, closing half.
    DataEnd,
    /// `target enter data`.
    EnterData,
    /// `target exit data`.
    ExitData,
}

/// A construct's span on the timeline (`OFFLOAD_TRACE`): from its trace line to the
/// guard's drop, which traces the device's table and pool after it. Inert with no timeline.
/// With `OFFLOAD_INFO`'s every-table bit, its drop also prints the other devices' tables.
pub(crate) struct ConstructSpan<'a> {
    rt: &'a Runtime,
    device: usize,
    id: Option<(u64, u64)>,
    /// The construct's name, when the other devices' tables are printed after it.
    every_table: Option<String>,
}

impl Drop for ConstructSpan<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let usage = match self.rt.target(self.device) {
                Ok(Target::Device(d)) => d.usage(),
                _ => None,
            };
            self.rt.inner.trace.construct_end(id, self.device, usage);
        }
        if let Some(what) = self.every_table.take() {
            // What is live on the other devices: those that hold no entry are left out
            // (a two-device program would see an empty table after every construct).
            let label = format!("{what} on device {}", self.device);
            for d in self.rt.inner.devices.iter().filter(|d| d.number != self.device) {
                if let Some(table) = d.dump_table_if_any() {
                    self.rt.inner.trace.table(d.number, &label, || table);
                }
            }
        }
    }
}

/// How a launch's work and arguments are given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArgShape {
    /// Every value of the kernel's argument block, over this many work items (a generated
    /// kernel's launcher, a hand-written kernel).
    Full(usize),
    /// One argument per parameter, as OpenMP's `target` passes them, over the loops or
    /// teams of an [`OmpSpace`]: a generated kernel's hidden values (see
    /// [`crate::kernel::KernelShape`]) are added by the runtime.
    OpenMp(OmpSpace),
}

impl Runtime {
    // ---- map constructs ------------------------------------------------------------

    /// `#pragma omp target data map(...)`, the opening half: maps `items` (each moving the
    /// entry's reference count, or its hold count with [`MapType::hold`]). On the initial
    /// device it does nothing.
    ///
    /// [`MapType::hold`]: crate::MapType::hold
    ///
    /// # Safety
    /// Each item's host range must stay valid until the matching
    /// [`Runtime::target_data_end`], and `from` ranges must not be read or written
    /// elsewhere during that call.
    #[track_caller]
    pub unsafe fn target_data_begin(&self, device: usize, items: &[MapItem]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.map_construct_at(MapConstruct::DataBegin, device, items, Location::caller()) }
    }

    /// The closing half of `target data`: unmaps `items` (the same list) in reverse order.
    ///
    /// # Safety
    /// As [`Runtime::target_data_begin`].
    #[track_caller]
    pub unsafe fn target_data_end(&self, device: usize, items: &[MapItem]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.map_construct_at(MapConstruct::DataEnd, device, items, Location::caller()) }
    }

    /// `#pragma omp target enter data map(...)`.
    ///
    /// # Safety
    /// Each item's host range must be valid for reads during the call.
    #[track_caller]
    pub unsafe fn enter_data(&self, device: usize, items: &[MapItem]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.map_construct_at(MapConstruct::EnterData, device, items, Location::caller()) }
    }

    /// `#pragma omp target exit data map(...)`.
    ///
    /// # Safety
    /// Each `from` item's host range must be valid for writes and not otherwise accessed
    /// during the call.
    #[track_caller]
    pub unsafe fn exit_data(&self, device: usize, items: &[MapItem]) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.map_construct_at(MapConstruct::ExitData, device, items, Location::caller()) }
    }

    /// One of the four map constructs over `items` on `device`, as called from `at` (for
    /// the trace's construct line).
    ///
    /// # Safety
    /// As the construct's public form ([`Runtime::target_data_begin`], ...).
    pub(crate) unsafe fn map_construct_at(
        &self,
        which: MapConstruct,
        device: usize,
        items: &[MapItem],
        at: &'static Location<'static>,
    ) -> Result<()> {
        let (c, entering, verb) = match which {
            MapConstruct::DataBegin => (Construct::TargetData, true, "entering target data"),
            MapConstruct::DataEnd => (Construct::TargetData, false, "exiting target data"),
            MapConstruct::EnterData => (Construct::EnterData, true, "target enter data"),
            MapConstruct::ExitData => (Construct::ExitData, false, "target exit data"),
        };
        let checked =
            self.construct_target(device).and_then(|t| validate::map_list(c, device, items).map(|()| t));
        let _span = self.trace_construct(device, verb, at, items, "");
        let d = match checked.map_err(|e| self.refused(device, verb, at, e))? {
            Target::Device(d) => d,
            Target::Initial => return Ok(()),
        };
        self.not_recording(device, verb).map_err(|e| self.refused(device, verb, at, e))?;
        let origin = Origin::new(verb, at);
        let rule = if which == MapConstruct::DataEnd { AuditRule::RegionEnd } else { AuditRule::Unchanged };
        d.audited(verb, rule, || {
            let r = if entering {
                d.poll()?;
                // SAFETY: forwarded from the caller.
                unsafe { d.map_enter(items, c, origin) }
            } else {
                // An exit always runs, even while a failure of queued work is unreported:
                // it ends mappings whose host memory the program is about to free (a
                // guard's drop, a region's end). It reports that failure itself (its copies
                // back wait).
                d.poll_quietly();
                // SAFETY: forwarded from the caller.
                unsafe { d.map_exit(items, c, &self.inner.devices) }
            };
            r.map_err(|e| origin.failed(device, e))
        })
        .map_err(|e| self.failed(device, verb, at, e))
    }

    /// `#pragma omp target update to(...)` / `from(...)`; each range with its `present`
    /// modifier.
    ///
    /// # Safety
    /// Host ranges valid for reads (`To`) or exclusive writes (`From`) during the call.
    #[track_caller]
    pub unsafe fn update(
        &self,
        device: usize,
        dir: UpdateDirection,
        items: &[(HostRange, bool)],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.update_at(device, dir, items, Location::caller()) }
    }

    /// [`Runtime::update`] as called from `at`.
    ///
    /// # Safety
    /// As [`Runtime::update`].
    pub(crate) unsafe fn update_at(
        &self,
        device: usize,
        dir: UpdateDirection,
        items: &[(HostRange, bool)],
        at: &'static Location<'static>,
    ) -> Result<()> {
        let checked =
            self.construct_target(device).and_then(|t| validate::update_list(device, items).map(|()| t));
        let what = if dir == UpdateDirection::To { "target update to" } else { "target update from" };
        let _span = self.construct_span(device, what, at, || {
            let list: Vec<String> = items
                .iter()
                .map(|(r, p)| {
                    let name = self.range_name(device, *r, None).unwrap_or(RangeName::new(*r, None));
                    format!("{}{name}", if *p { "present, " } else { "" })
                })
                .collect();
            format!(
                "device {device}: {what} at {}:{} with {} ranges: {}",
                at.file(),
                at.line(),
                items.len(),
                list.join(" ")
            )
        });
        match checked.map_err(|e| self.refused(device, what, at, e))? {
            Target::Device(d) => {
                self.not_recording(device, what).map_err(|e| self.refused(device, what, at, e))?;
                let origin = Origin::new(what, at);
                d.audited(what, AuditRule::Unchanged, || {
                    d.poll()?;
                    // SAFETY: forwarded from the caller.
                    unsafe { d.update(items, dir, origin, &self.inner.devices) }
                        .map_err(|e| origin.failed(device, e))
                })
                .map_err(|e| self.failed(device, what, at, e))
            }
            Target::Initial => Ok(()),
        }
    }

    /// `#pragma omp target map(...)`: maps `maps`, runs `kernel` over `n` work items with
    /// `args` (mapped host addresses translated to device addresses), then unmaps `maps`.
    /// On the initial device the kernel's host implementation runs on host memory.
    /// A non-null `Device` argument that points into no live allocation of the device (nor
    /// of a device it has peer access to) is refused before anything is mapped.
    ///
    /// # Safety
    /// As [`Runtime::target_data_begin`] for `maps`; `Device` arguments must be device
    /// memory of at least what the kernel touches; on the initial device `Mapped`
    /// arguments must be valid host memory for what the kernel touches.
    #[track_caller]
    pub unsafe fn target_launch(
        &self,
        device: usize,
        kernel: &Kernel,
        n: usize,
        maps: &[MapItem],
        args: &[LaunchArg],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.target_launch_at(
                device,
                kernel,
                maps,
                args,
                ArgShape::OpenMp(OmpSpace::Items(n)),
                Location::caller(),
            )
        }
    }

    /// [`Runtime::target_launch`] over the loops or teams of `space`: `collapse(2)` and
    /// `collapse(3)` loops for 2-D and 3-D generated kernels ([`OmpSpace::loops`]),
    /// `num_teams`/`thread_limit` for teams kernels ([`OmpSpace::Teams`]). A space that does
    /// not fit the kernel (a 2-D kernel over three loops, teams for a loop kernel, a
    /// `thread_limit` below the kernel's team) is [`Error::KernelArgument`], before anything
    /// is mapped.
    ///
    /// # Safety
    /// As [`Runtime::target_launch`].
    #[track_caller]
    pub unsafe fn target_launch_space(
        &self,
        device: usize,
        kernel: &Kernel,
        space: OmpSpace,
        maps: &[MapItem],
        args: &[LaunchArg],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.target_launch_at(device, kernel, maps, args, ArgShape::OpenMp(space), Location::caller())
        }
    }

    /// [`Runtime::target_launch`] as called from `at`.
    ///
    /// # Safety
    /// As [`Runtime::target_launch`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn target_launch_at(
        &self,
        device: usize,
        kernel: &Kernel,
        maps: &[MapItem],
        args: &[LaunchArg],
        shape: ArgShape,
        at: &'static Location<'static>,
    ) -> Result<()> {
        // The work items, and whether the space fits the kernel, before anything is mapped.
        // A team size the launch gives is the GPU block it runs with.
        let (n, space, block) = match shape {
            ArgShape::Full(n) => (Ok(n), OmpSpace::Items(n), None),
            ArgShape::OpenMp(space) => match crate::kernel::omp_launch(kernel, device, space) {
                Ok((n, _, block)) => (Ok(n), space, block),
                Err(e) => (Err(e), space, None),
            },
        };
        let kernel = &block.map_or(*kernel, |b| kernel.with_block(b));
        let checked = self
            .construct_target(device)
            .and_then(|t| validate::map_list(Construct::Target, device, maps).map(|()| t))
            .and_then(|t| n.as_ref().map(|_| t).map_err(Clone::clone));
        let n = n.unwrap_or(0);
        let omp = matches!(shape, ArgShape::OpenMp(_));
        let c_shaped = omp && kernel.shape().is_some();
        let _span = (self.inner.trace.on(InfoFlags::KERNEL_ARGS)
            || self.inner.trace.on(InfoFlags::EVERY_TABLE)
            || tracing::enabled!(target: "offload", tracing::Level::DEBUG))
        .then(|| {
            let what = format!("entering target (kernel `{}`, n={n})", kernel.name());
            let mut span =
                self.trace_construct(device, &what, at, maps, &format!("; {} arguments", args.len()));
            // The other devices' tables are printed once the whole region has run.
            span.every_table =
                span.every_table.take().map(|_| format!("target (kernel `{}`)", kernel.name()));
            span
        });
        let d = match checked.map_err(|e| self.refused(device, "target", at, e))? {
            Target::Device(d) => d,
            Target::Initial if c_shaped => {
                // Host memory: each view's extent is what the map list says of it.
                let extents: Vec<Option<usize>> = args
                    .iter()
                    .map(|a| match *a {
                        LaunchArg::Mapped(h) => maps
                            .iter()
                            .map(|m| m.range)
                            .find(|r| r.begin <= h && h < r.end())
                            .map(|r| r.end() - h),
                        _ => None,
                    })
                    .collect();
                return self.run_on_host_shaped(kernel, n, args, &extents, Some(space));
            }
            Target::Initial => return self.run_on_host(kernel, n, args, &[]),
        };
        let reaches_peer =
            self.check_device_args(d, kernel, args).map_err(|e| self.refused(device, "target", at, e))?;
        if recorder::recording(self.identity(), device) {
            if !maps.is_empty() {
                return Err(recorder::refused(device, "a target region with maps"));
            }
            // A raw device address (a DeviceBuffer, target_alloc memory) has no pin that
            // would keep it allocated for the recording's replays: refused.
            if let Some(index) = args.iter().position(|a| matches!(a, LaunchArg::Device(p) if *p != 0)) {
                return Err(recorder::refused(
                    device,
                    &format!(
                        "argument {index} of kernel `{}`: a device pointer (DeviceBuffer, target_alloc memory) \
                         nothing keeps allocated for the replays; pass views of mapped data",
                        kernel.name()
                    ),
                ));
            }
            // Kept, not run: translated now, its blocks pinned while the recording lives.
            let (a, mut in_use) = d.translate_args(kernel, args, omp.then_some(&[]))?;
            let a = if c_shaped { crate::kernel::expand_c_shaped(kernel, device, a, space)? } else { a };
            let kernel = d.launching(kernel, n, &a)?;
            let launch = crate::backend::RecordedLaunch { kernel, n, args: a };
            recorder::push(launch, in_use.take_blocks());
            return Ok(());
        }
        d.audited("target", AuditRule::Unchanged, || {
            let shapes = (c_shaped.then_some(space), omp);
            // SAFETY: forwarded from the caller.
            unsafe { self.target_on(d, kernel, n, maps, args, shapes, reaches_peer, at) }
        })
    }

    /// The device half of [`Runtime::target_launch_at`]: maps, launches, unmaps. `c_shaped`:
    /// the kernel's hidden values are added; `c_pointers`: mapped arguments are C's captured
    /// pointers ([`DeviceState::translate_args`]).
    ///
    /// # Safety
    /// As [`Runtime::target_launch`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn target_on(
        &self,
        d: &DeviceState,
        kernel: &Kernel,
        n: usize,
        maps: &[MapItem],
        args: &[LaunchArg],
        (c_shaped, c_pointers): (Option<OmpSpace>, bool),
        reaches_peer: bool,
        at: &'static Location<'static>,
    ) -> Result<()> {
        let device = d.number;
        let fail = |e| self.failed(device, "target", at, e);
        d.poll().map_err(fail)?;
        let origin = Origin { construct: "target", kernel: Some(kernel.name()), at };
        // Implicit maps are read once, as the region enters (`resolved`: the list as the
        // table read it), and the launch and the region's end use that reading.
        let mut resolved = Vec::new();
        // SAFETY: forwarded from the caller.
        unsafe { d.map_enter_resolved(maps, Construct::Target, origin, &mut resolved) }
            .map_err(|e| fail(origin.failed(device, e)))?;
        let read = if resolved.is_empty() { maps } else { &resolved[..] };
        let parts: Vec<(usize, usize)> = maps
            .iter()
            .zip(read)
            .filter(|(v, p)| v.map_type.implicit && v.range.begin != p.range.begin)
            .map(|(v, p)| (v.range.begin, p.range.begin))
            .collect();
        let maps = read;
        // Mapped memory the kernel uses stays allocated until it has run (`in_use`).
        let prepared = d
            .translate_args(kernel, args, c_pointers.then_some(&parts[..]))
            .and_then(|(a, in_use)| {
                let a = match c_shaped {
                    Some(space) => crate::kernel::expand_c_shaped(kernel, device, a, space)?,
                    None => a,
                };
                Ok((d.launching(kernel, n, &a)?, a, in_use))
            })
            // Refused before the kernel ran (an argument not mapped, ...): its line (the error
            // as returned) says so between the region's entry and its exit, which still
            // unmaps what it mapped.
            .map_err(|e| self.refused(device, "target", at, origin.failed(device, e)));
        let refused = prepared.is_err();
        let launched = prepared.and_then(|(kernel, a, in_use)| {
            // A kernel that writes another device's memory (peer access) is seen there by
            // work no construct on this device orders: it waits, as OpenMP's target does.
            // (Ordering it on the two queues instead let the peer's next step, already
            // queued, delay it: slower for devices in lockstep, docs/PERFORMANCE.md.)
            let what = || crate::device::kernel_span(&kernel, n);
            if d.ordered() && !reaches_peer {
                d.timed(Queue::Compute, what, || d.enqueue_kernel(&kernel, n, &a))?;
                d.queued(origin, in_use, Default::default())
            } else {
                d.timed(Queue::Compute, what, || d.run_kernel(&kernel, n, &a))
            }
        });
        // Unmapped whatever the kernel did, so nothing stays mapped on error.
        // SAFETY: forwarded from the caller.
        let exited = unsafe { d.map_exit(maps, Construct::Target, &self.inner.devices) };
        if refused {
            return launched.and(exited.map_err(|e| origin.failed(device, e)));
        }
        launched.and(exited).map_err(|e| fail(origin.failed(device, e)))
    }

    /// Device `device` for a routine that reads, writes or frees device memory outside
    /// the constructs' queue order: the work queued before it is waited for first (and a
    /// failure of it reported). Refused inside a recorded body.
    pub(crate) fn settled(&self, device: usize) -> Result<Target<'_>> {
        self.after_queued(device, true)
    }

    /// As [`Runtime::settled`], for routines that free memory: the queued work is waited
    /// for but a failure of it is kept for a synchronising call to report (a free must
    /// happen whatever it was, and its caller may have nowhere to report it).
    pub(crate) fn waited(&self, device: usize) -> Result<Target<'_>> {
        self.after_queued(device, false)
    }

    fn after_queued(&self, device: usize, report: bool) -> Result<Target<'_>> {
        let t = self.target(device)?;
        if let Target::Device(d) = &t {
            self.not_recording(device, "a routine that reads, writes or frees device memory")?;
            if report {
                d.settle()?;
            } else {
                d.finish_queued_quietly(Wait::Events);
            }
        }
        Ok(t)
    }

    /// An error when this thread is recording a body for `device` (`what` is refused there).
    /// Compiles and loads `kernel` on device `device` now (GPUs; its narrow variant too),
    /// so that a timed launch does not pay for it. Nothing to do on the initial device.
    pub(crate) fn prepare_kernel(&self, device: usize, kernel: &Kernel) -> Result<()> {
        match self.target(device)? {
            Target::Device(d) => d.prepare(kernel),
            Target::Initial => Ok(()),
        }
    }

    /// Runs `launch` with device memory for `values` on device `device`, at the address it
    /// is given, set to `values` first and copied back into them after (one wait): a
    /// reduction's partials. Refused inside a recorded body (`what` names the call), since
    /// a replay could not return the values; a device failure names `origin`.
    pub(crate) fn with_partials(
        &self,
        device: usize,
        values: &mut [u64],
        origin: Origin,
        what: &str,
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        self.not_recording(device, what)?;
        let d = self.device_state(device)?;
        d.with_partials(values, launch).map_err(|e| origin.failed(device, e))
    }

    /// Queues a copy of `range` (mapped on device `device`, pinned there until the copy is
    /// done) into `dst`, behind the work queued before it: `HostBuffer::read_queued`.
    /// Refused inside a recorded body.
    ///
    /// # Safety
    /// `dst` holds `range.bytes` and stays allocated, untouched, until the read has been
    /// waited for ([`Runtime::wait_read`], [`Runtime::wait_read_quietly`]).
    pub(crate) unsafe fn queue_read(
        &self,
        device: usize,
        range: HostRange,
        dst: *mut u8,
        origin: Origin,
    ) -> Result<PendingRead> {
        let d = self.device_state(device)?;
        self.not_recording(device, origin.construct)?;
        let (addr, pins) = d.pinned_range(range).ok_or(Error::NotPresent {
            device,
            range,
            what: "the view given to HostBuffer::read_queued",
            name: None,
        })?;
        // SAFETY: forwarded from the caller.
        unsafe { d.queue_read(dst, addr, range.bytes, pins, origin) }
    }

    /// Waits for a read [`Runtime::queue_read`] queued on device `device` (and the work
    /// queued before it, a synchronising call that reports its failure).
    pub(crate) fn wait_read(&self, device: usize, read: &mut PendingRead) -> Result<()> {
        read.wait(self.device_state(device)?)
    }

    /// As [`Runtime::wait_read`] where the error has nowhere to go (a drop): it stays for
    /// the device's next synchronising call.
    pub(crate) fn wait_read_quietly(&self, device: usize, read: &mut PendingRead) {
        if let Ok(d) = self.device_state(device) {
            read.wait_quietly(d);
        }
    }

    /// Queues a copy of `bytes` from `src` to `dst`, host ranges mapped on offload device
    /// `device`, on its compute queue behind the work queued before it (both blocks pinned
    /// until it has run), and returns `true`; `false`, with nothing done, where the device
    /// waits for each construct or this thread records (the caller then copies as
    /// `omp_target_memcpy` does). `what` names the ranges in an error.
    pub(crate) fn queue_copy_within(
        &self,
        device: usize,
        dst: HostRange,
        src: HostRange,
        bytes: usize,
        what: &'static str,
        at: &'static Location<'static>,
    ) -> Result<bool> {
        if recorder::recording(self.identity(), device) {
            return Ok(false);
        }
        let d = match self.target(device)? {
            Target::Device(d) if d.ordered() => d,
            _ => return Ok(false),
        };
        let row = |r: HostRange| {
            d.pinned_translation(r.begin).ok_or(Error::NotPresent { device, range: r, what, name: None })
        };
        let (to, dst_pin) = row(dst)?;
        let (from, src_pin) = row(src)?;
        d.queue_copy_within(to, from, bytes, [dst_pin, src_pin], at).map(|()| true)
    }

    /// Queues a copy of `bytes` from host range `src` mapped on offload device
    /// `src_device` to host range `dst` mapped on offload device `dst_device`, on the
    /// destination's compute queue: after the work queued on the source before it, and
    /// before the source's work queued after it (the rows it reads are not overwritten
    /// first); both blocks pinned until it has run. `true` once queued; `false`, with
    /// nothing done, where the devices cannot order it so (one waits for each construct,
    /// this thread records for one, or the destination has no peer access to the source);
    /// the caller then copies as `omp_target_memcpy` does. `what` names the ranges in an
    /// error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_copy_between(
        &self,
        dst_device: usize,
        dst: HostRange,
        src_device: usize,
        src: HostRange,
        bytes: usize,
        what: &'static str,
        at: &'static Location<'static>,
    ) -> Result<bool> {
        let Some((dd, sd)) = self.peers_ordered(dst_device, src_device)? else { return Ok(false) };
        let absent = |device: usize, range: HostRange| Error::NotPresent { device, range, what, name: None };
        let (to, dst_pin) = dd.pinned_translation(dst.begin).ok_or(absent(dst_device, dst))?;
        let (from, src_pin) = sd.pinned_translation(src.begin).ok_or(absent(src_device, src))?;
        // Both sides whole inside their devices' live blocks before anything is queued.
        dd.check_range("omp_target_memcpy", to, bytes)?;
        sd.check_range("omp_target_memcpy", from, bytes)?;
        dd.queue_copy_from_peer(to, sd, from, bytes, (dst_pin, src_pin), at)?;
        self.inner.trace.event(
            crate::info::InfoFlags::TRANSFERS,
            || crate::info::InfoFields {
                kind: "memcpy",
                device: Some(dst_device),
                bytes: Some(bytes),
                ..Default::default()
            },
            || {
                format!(
                    "omp_target_memcpy {bytes} bytes, device {src_device} {from:#x} -> device {dst_device} {to:#x} \
                     (queued: after device {src_device}'s work queued before it)"
                )
            },
        );
        Ok(true)
    }

    /// Both offload devices, where they are two, `dst` reaches `src`'s memory, they run
    /// constructs in order (queued, not waited for each) and this thread records for
    /// neither: a copy between them may be queued.
    fn peers_ordered(&self, dst: usize, src: usize) -> Result<Option<(&DeviceState, &DeviceState)>> {
        let id = self.identity();
        if recorder::recording(id, dst) || recorder::recording(id, src) {
            return Ok(None);
        }
        Ok(match (self.target(dst)?, self.target(src)?) {
            (Target::Device(dd), Target::Device(sd))
                if dd.ordered()
                    && sd.ordered()
                    && dd.number != sd.number
                    && self.reaches(dd.number, sd.number) =>
            {
                Some((dd, sd))
            }
            _ => None,
        })
    }

    /// Queues a copy of `bytes` from `src` on offload device `src_device` to `dst` on
    /// offload device `dst_device` (addresses inside `omp_target_alloc` blocks, which the
    /// caller keeps allocated: a free waits for the device's queued work), ordered as
    /// [`Runtime::queue_copy_between`] orders a copy of mapped rows. `true` once queued;
    /// `false`, with nothing done, where the devices cannot order it so (one device, one
    /// that waits for each construct, this thread recording, no peer access: the caller
    /// then copies as `omp_target_memcpy` does). Both ranges are checked against their
    /// devices' live blocks first.
    pub(crate) fn queue_copy_blocks(
        &self,
        dst_device: usize,
        dst: u64,
        src_device: usize,
        src: u64,
        bytes: usize,
        at: &'static Location<'static>,
    ) -> Result<bool> {
        let Some((dd, sd)) = self.peers_ordered(dst_device, src_device)? else { return Ok(false) };
        dd.check_range("omp_target_memcpy", dst, bytes)?;
        sd.check_range("omp_target_memcpy", src, bytes)?;
        dd.queue_copy_from_peer(dst, sd, src, bytes, (BlocksInUse::new(dd), BlocksInUse::new(sd)), at)?;
        Ok(true)
    }

    /// The device address of mapped `range` on device `device`, its block held allocated
    /// while the pin lives; on the initial device the host address (nothing to hold).
    /// After the work queued on the device has completed. `what` names it in an error.
    pub(crate) fn pinned_mapped(
        &self,
        device: usize,
        range: HostRange,
        what: &'static str,
    ) -> Result<(u64, Option<DevicePin<'_>>)> {
        match self.settled(device)? {
            Target::Device(d) => d
                .pinned_translation(range.begin)
                .map(|(a, pin)| (a, Some(pin)))
                .ok_or(Error::NotPresent { device, range, what, name: None }),
            Target::Initial => Ok((range.begin as u64, None)),
        }
    }

    /// The lanes a `nowait` task on device `device` runs on, after the work the program
    /// queued there before it (waited for first: tasks run on other queues); `None` for
    /// an undeferred task, which runs on the calling thread.
    pub(crate) fn task_lanes(
        &self,
        device: usize,
        undeferred: bool,
    ) -> Result<Option<&crate::backend::worker::Lanes>> {
        let d = self.device_state(device)?;
        d.settle()?;
        if undeferred {
            Ok(None)
        } else {
            d.lanes().map(Some)
        }
    }

    /// Keeps `e`, the failure of construct `origin` on device `device` that had no caller
    /// to return it to (a guard's drop), for the device's next synchronising call to report.
    pub(crate) fn keep_failure(&self, device: usize, origin: Origin, e: Error) {
        if let Ok(d) = self.device_state(device) {
            d.keep_failure(origin, e);
        }
    }

    /// [`crate::Device::gemm`] on device `device`, its operands checked by the caller
    /// (device, length, C writable): `D = act(alpha op(A) op(B) + beta C + bias)` on the
    /// device's BLAS, queued on its compute queue, the operands' device memory pinned until
    /// it is done. `operands` are A, B, C and the bias, each a mapped host span or a
    /// buffer's device memory.
    pub(crate) fn gemm_on(
        &self,
        device: usize,
        g: &crate::Gemm,
        ty: crate::ElementType,
        precision: crate::Precision,
        operands: [Option<GemmOperand>; 4],
    ) -> Result<()> {
        let invalid = |what: String| Error::InvalidArgument { routine: "gemm", what };
        let d = match self.settled(device)? {
            Target::Device(d) => d,
            Target::Initial => {
                return Err(invalid("the initial device has no gemm; use a host device".into()))
            }
        };
        if !d.has_blas() {
            let kind = d.description().kind;
            return Err(Error::NoKernelImpl { device, kernel: "gemm", backend: kind.name() });
        }
        // The operands stay allocated until the product is done.
        let mut in_use = BlocksInUse::new(d);
        let mut addrs = [0u64; 4];
        for (i, op) in operands.iter().enumerate() {
            let Some(op) = op else { continue };
            // A buffer's view is device memory, alive while borrowed. Otherwise the whole
            // operand must lie in one mapped range (a view may name more of its buffer than
            // is mapped).
            addrs[i] = if op.resident {
                op.span.begin as u64
            } else {
                d.pin_mapped(&mut in_use, op.span).ok_or(Error::NotPresent {
                    device,
                    range: op.span,
                    what: "a gemm operand",
                    name: None,
                })?
            };
        }
        // D overwrites C while A, B and the bias are read: C's device memory must be none
        // of theirs (a buffer's or a scratch view may name the same memory twice).
        let span = |i: usize| operands[i].map(|o| (addrs[i], addrs[i] + o.span.bytes as u64));
        if let Some((c0, c1)) = span(2) {
            if let Some(i) =
                [0, 1, 3].into_iter().find(|&i| span(i).is_some_and(|(b0, b1)| c0 < b1 && b0 < c1))
            {
                return Err(invalid(format!(
                    "operand 2 (C) overlaps operand {i} ({}) on device {device}: C is written while it is read; \
                     expected distinct memory",
                    ["A", "B", "C", "the bias"][i],
                )));
            }
        }
        let ops = crate::backend::GemmOperands {
            a: addrs[0],
            b: addrs[1],
            c: addrs[2],
            bias: operands[3].map(|_| addrs[3]),
        };
        d.prepare_blas()?;
        let kernel = match precision {
            crate::Precision::Fp32 => "gemm fp32",
            crate::Precision::Tf32 => "gemm tf32",
            crate::Precision::Fp16 => "gemm fp16",
            crate::Precision::Bf16 => "gemm bf16",
        };
        let what = || InfoFields { kind: "gemm", kernel: Some(kernel), ..Default::default() };
        d.timed(Queue::Compute, what, || d.gemm(g, ty, ops))
    }

    pub(crate) fn not_recording(&self, device: usize, what: &str) -> Result<()> {
        if recorder::recording(self.identity(), device) {
            return Err(recorder::refused(device, what));
        }
        Ok(())
    }

    /// The construct line of the trace (`OFFLOAD_INFO` 0x01, as libomptarget's "Entering
    /// OpenMP data region at ..."): what, where in the program, and the map list.
    fn trace_construct(
        &self,
        device: usize,
        what: &str,
        at: &Location<'_>,
        items: &[MapItem],
        tail: &str,
    ) -> ConstructSpan<'_> {
        self.construct_span(device, what, at, || {
            let list: Vec<String> = items
                .iter()
                .map(|i| match self.range_name(device, i.range, i.array()) {
                    Some(name) => format!("{}({name})", i.map_type),
                    None => format!("{}(host {:#x}, {} bytes)", i.map_type, i.range.begin, i.range.bytes),
                })
                .collect();
            let maps = if items.is_empty() { String::new() } else { format!(": {}", list.join(" ")) };
            format!(
                "device {device}: {what} at {}:{} with {} maps{maps}{tail}",
                at.file(),
                at.line(),
                items.len()
            )
        })
    }

    /// Traces a construct's `line` (`OFFLOAD_INFO` 0x01) and, with a timeline, starts its
    /// span there: it lasts while the returned guard lives.
    fn construct_span(
        &self,
        device: usize,
        what: &str,
        at: &Location<'_>,
        line: impl FnOnce() -> String,
    ) -> ConstructSpan<'_> {
        let trace = &self.inner.trace;
        let id = trace.construct_begin();
        if id.is_some() {
            if let Ok(Target::Device(d)) = self.target(device) {
                d.write_spans_if_many();
            }
        }
        let fields = || InfoFields {
            kind: "construct",
            device: Some(device),
            at: Some(at),
            construct: id.map(|(id, _)| id),
            ..InfoFields::default()
        };
        trace.event(InfoFlags::KERNEL_ARGS, fields, line);
        let every_table = trace.on(InfoFlags::EVERY_TABLE).then(|| what.to_string());
        ConstructSpan { rt: self, device, id, every_table }
    }

    /// How the trace names `range` on `device`: as a section of the named entry it lies
    /// in, else of `own` (the item's own name), else of the named entry that held it and
    /// has left the table, else `None` (given by its bytes).
    fn range_name(&self, device: usize, range: HostRange, own: Option<ArrayName>) -> Option<RangeName> {
        let d = self.inner.devices.get(device);
        match d {
            Some(d) => d.named_range(range, own),
            None => own.map(|a| RangeName::new(range, Some(a))),
        }
    }

    /// The failure line of a construct refused before it ran (`OFFLOAD_INFO` 0x01), after
    /// its construct line: `what` on `device`, called at `at`; gives `e` back.
    fn refused(&self, device: usize, what: &str, at: &Location<'_>, e: Error) -> Error {
        self.ended_line("refused", device, what, at, e)
    }

    /// The failure line of a construct that failed once it had begun (`OFFLOAD_INFO`
    /// 0x01), after its construct line: `what` on `device`, called at `at`; gives `e` back.
    fn failed(&self, device: usize, what: &str, at: &Location<'_>, e: Error) -> Error {
        self.ended_line("failed", device, what, at, e)
    }

    /// A construct's last line when it ends in error: `how` (`refused`, `failed`) and why.
    fn ended_line(&self, how: &'static str, device: usize, what: &str, at: &Location<'_>, e: Error) -> Error {
        let fields = || InfoFields { kind: how, device: Some(device), at: Some(at), ..InfoFields::default() };
        self.inner.trace.event(InfoFlags::KERNEL_ARGS, fields, || {
            format!("device {device}: {what} at {}:{} {how}: {e}", at.file(), at.line())
        });
        e
    }

    /// Checks that every non-null `LaunchArg::Device` of a launch on `d` points into a live
    /// allocation of `d`, or of a device whose memory `d` reaches by peer access (halo
    /// exchanges pass a neighbour's rows); whether one is another device's. Those devices'
    /// queued work is waited for first: the kernel may overwrite what it still reads.
    fn check_device_args(&self, d: &DeviceState, kernel: &Kernel, args: &[LaunchArg]) -> Result<bool> {
        let mut reaches_peer = false;
        for (index, a) in args.iter().enumerate() {
            let LaunchArg::Device(p) = *a else { continue };
            if p == 0 || d.owns(p) {
                continue;
            }
            let peer = self
                .inner
                .devices
                .iter()
                .find(|q| q.number != d.number && self.reaches(d.number, q.number) && q.owns(p));
            if let Some(q) = peer {
                q.finish_queued_quietly(Wait::Events);
                reaches_peer = true;
            } else {
                return Err(Error::KernelArgument {
                    kernel: kernel.name(),
                    index,
                    what: format!(
                        "device {p:#x} is not inside a live allocation of device {}, nor of a device it \
                         has peer access to; expected a `target_alloc` block or a mapped entry's memory",
                        d.number
                    ),
                });
            }
        }
        Ok(reaches_peer)
    }

    /// Runs `kernel` on the initial device; `extents[i]`, where given, is how many bytes
    /// mapped argument `i` spans (the host memory it names is all there is).
    pub(crate) fn run_on_host(
        &self,
        kernel: &Kernel,
        n: usize,
        args: &[LaunchArg],
        extents: &[Option<usize>],
    ) -> Result<()> {
        self.run_on_host_shaped(kernel, n, args, extents, None)
    }

    /// [`Runtime::run_on_host`], the arguments in the OpenMP shape when `c_shaped`.
    fn run_on_host_shaped(
        &self,
        kernel: &Kernel,
        n: usize,
        args: &[LaunchArg],
        extents: &[Option<usize>],
        c_shaped: Option<OmpSpace>,
    ) -> Result<()> {
        let f = kernel.host_fn().ok_or(Error::NoKernelImpl {
            device: self.initial_device(),
            kernel: kernel.name(),
            backend: "host fallback",
        })?;
        let args: Vec<KernelArg> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match *a {
                LaunchArg::Mapped(h) => {
                    KernelArg::Ptr { addr: h as u64, bytes: extents.get(i).copied().flatten() }
                }
                LaunchArg::Device(p) => KernelArg::Ptr { addr: p, bytes: extents.get(i).copied().flatten() },
                LaunchArg::MappedBase { base, .. } => KernelArg::Ptr { addr: base as u64, bytes: None },
                LaunchArg::Value(s) => KernelArg::Scalar(s),
            })
            .collect();
        let args = match c_shaped {
            Some(space) => crate::kernel::expand_c_shaped(kernel, self.initial_device(), args, space)?,
            None => args,
        };
        let _hold = self.hold_initial_device(true, kernel.name())?;
        let avx512 = self.inner.settings.host_avx512 && crate::kernel::HostLaunch::cpu_has_avx512();
        run_host_kernel(&self.inner.kernel_pool, self.initial_device(), kernel.name(), f, n, &args, avx512)
    }

    /// Waits for all work queued on `device`: what constructs queued and did not wait for
    /// (a failure of it is reported here, naming the construct and where the program
    /// called it, as [`Error::Queued`]), and what the program enqueued itself on the
    /// device's queues ([`Runtime::interop`]).
    pub fn synchronize(&self, device: usize) -> Result<()> {
        match self.target(device)? {
            Target::Device(d) => {
                // One wait for the whole device, then what the constructs queued is known
                // complete: retired, its failure reported.
                self.not_recording(device, "synchronize")?;
                let synced = d.synchronize_queues();
                let finished = d.finish_queued(Wait::Done);
                d.report(synced.and(finished))
            }
            Target::Initial => Ok(()),
        }
    }

    /// OpenMP's `omp_get_wtime()` for a stream-ordered runtime: waits for the work queued
    /// on every device (as [`Runtime::synchronize`] does for one: a failure of it is
    /// reported, after the other devices were waited for), then reads the wall clock, in
    /// seconds since a point fixed for the process.
    ///
    /// C's `target` regions are complete when they return; here a launch returns once
    /// queued (docs/SEMANTICS.md R11), so `Instant::now()` around a loop of launches
    /// measures the queuing only. A timer read with `wtime` measures the work it surrounds,
    /// as `omp_get_wtime` does in the C program: the work of every thread of the program
    /// queued before the call included.
    ///
    /// ```
    /// # use offload::{map, Runtime};
    /// #[offload::kernel]
    /// fn scale(i: usize, x: &mut [f32]) {
    ///     x[i] *= 2.0;
    /// }
    ///
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let gpu = rt.device(0)?;
    /// let mut x = vec![1f32; 1 << 16];
    /// let seconds = gpu.data(map::tofrom(&mut x), |xv| {
    ///     let start = rt.wtime()?;
    ///     for _ in 0..10 {
    ///         scale::launch(&gpu, 1 << 16, xv)?; // returns once queued
    ///     }
    ///     Ok(rt.wtime()? - start) // the ten kernels have run
    /// })?;
    /// assert!(seconds >= 0.0);
    /// assert_eq!(x[0], 1024.0);
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn wtime(&self) -> Result<f64> {
        // Every device is waited for; the first failure is the one reported.
        let mut first = Ok(());
        for d in 0..self.num_devices() {
            let waited = self.synchronize(d);
            if first.is_ok() {
                first = waited;
            }
        }
        first.map(|()| wall_clock())
    }
}

/// Seconds since a point fixed for the process (the first call).
fn wall_clock() -> f64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}
