//! The 2-D Jacobi solver of `examples/jacobi.rs`, as a library so that tests and benches
//! run the same code: NVIDIA's multi-GPU Jacobi (sine on the left and right columns,
//! periodic top and bottom, L2 norm of the update) over any number of devices.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use crate::ranks::{
    step_across, step_layers_first, Across, GridAcross, HaloClock, HaloTimes, LayersFirst, RankEdges,
};
use crate::spin_barrier::{run_in_lockstep, Stop};
use crate::{newest, seconds_when_done};
use offload::partition::{DistributedArray, DistributedGrid, GridBox, GridPartition, Reach, RowPartition};
use offload::{DeviceBuffer, DevicePtr, DeviceSlice, HostBuffer, MapType, Runtime};
use offload_kernels::generated::{jacobi_step as generated_step, jacobi_teams, JACOBI_TEAM_COLUMNS};
use offload_kernels::stencil::{jacobi_step, JacobiShape, JACOBI_STEP};

/// Which Jacobi kernel a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    /// `offload_kernels::generated::jacobi_step`, written once with `#[offload::kernel]`:
    /// one thread per point; on one device it stores the periodic halo rows itself, across
    /// devices the halos go by `target_memcpy` after each step.
    Generated,
    /// `offload_kernels::generated::jacobi_teams`, a teams kernel written with
    /// `#[offload::kernel(teams = 256)]`: the hand-written kernel's shape (a strip of rows per
    /// thread) with the row's neighbours in team-local memory; halos as `Generated`.
    Teams,
    /// `offload_kernels::stencil::JACOBI_STEP`, hand-written CUDA C: a strip of rows per
    /// thread with neighbours in registers, halos by peer stores (or `-halo memcpy`).
    Tuned,
}

/// A Jacobi run's settings (the command line of NVIDIA's example, plus ours).
#[derive(Clone, Debug)]
pub struct Args {
    /// Iterations.
    pub niter: usize,
    /// The norm is computed every `nccheck` iterations.
    pub nccheck: usize,
    /// Columns.
    pub nx: usize,
    /// Rows.
    pub ny: usize,
    /// Print CSV (and no progress lines).
    pub csv: bool,
    /// Devices to use (all when `None`).
    pub ndev: Option<usize>,
    /// Rows per GPU thread.
    pub rows: usize,
    /// Halos by peer stores from the kernel (else `target_memcpy` after each step).
    pub peer_stores: bool,
    /// Always check against the CPU reference.
    pub check: bool,
    /// The kernel.
    pub kernel: KernelChoice,
    /// Split the grid over a grid of parts, bands of rows by bands of columns
    /// ([`solve_grid`]), instead of by rows.
    pub grid: Option<[usize; 2]>,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            niter: 1000,
            nccheck: 1,
            nx: 16384,
            ny: 16384,
            csv: false,
            ndev: None,
            rows: 16,
            peer_stores: true,
            check: false,
            kernel: KernelChoice::Tuned,
            grid: None,
        }
    }
}

/// The initial grid: sine on the left and right columns, zero elsewhere.
pub fn initial(nx: usize, ny: usize) -> Vec<f32> {
    initial_rows(nx, ny, 0..ny)
}

/// Rows `rows` of the initial grid.
pub fn initial_rows(nx: usize, ny: usize, rows: Range<usize>) -> Vec<f32> {
    let mut a = vec![0f32; nx * rows.len()];
    for (i, iy) in rows.enumerate() {
        let y0 = (2.0 * std::f64::consts::PI * iy as f64 / (ny - 1) as f64).sin() as f32;
        a[i * nx] = y0;
        a[i * nx + nx - 1] = y0;
    }
    a
}

/// What one run gives back.
#[derive(Debug)]
pub struct Outcome {
    /// Seconds of the iteration loop (mapping and gathering excluded).
    pub seconds: f64,
    /// The last norm computed.
    pub norm: f32,
    /// The final grid.
    pub grid: Vec<f32>,
    /// Across ranks: where the edge parts' steps went.
    pub halo: Option<HaloTimes>,
}

/// Runs `args.niter` iterations on `devices` (one host thread each).
pub fn solve(rt: &Runtime, devices: &[usize], args: &Args) -> Result<Outcome, offload::Error> {
    solve_slab(rt, devices, args, 0..args.ny, None)
}

/// Runs `args.niter` iterations on global rows `rows` of the grid (halo rows included)
/// on `devices`, with `edges` the ranks that hold the other rows (`None`: `rows` is the
/// whole grid, which wraps on itself); the outcome's grid is the slab, its norm the whole
/// grid's.
pub fn solve_slab(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    rows: Range<usize>,
    edges: Option<&dyn RankEdges>,
) -> Result<Outcome, offload::Error> {
    let (nx, ny) = (args.nx, args.ny);
    let part = RowPartition::new(rows.len(), nx, devices.len(), 1)?;
    let mut a = initial_rows(nx, ny, rows);
    let mut a_new = a.clone();
    let across = edges.map(|edges| Across { edges, clock: HaloClock::default() });
    let (seconds, norm) = run_steps(rt, devices, args, part, &mut a, &mut a_new, across.as_ref())?;
    let grid = if args.niter.is_multiple_of(2) { a } else { a_new };
    Ok(Outcome { seconds, norm, grid, halo: across.and_then(|a| a.clock.per_step()) })
}

/// Maps both grids, runs the iterations with one host thread per device, gathers the
/// newest grid; returns the loop's seconds and the last norm.
fn run_steps(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    part: RowPartition,
    a: &mut [f32],
    a_new: &mut [f32],
    across: Option<&Across<'_>>,
) -> Result<(f64, f32), offload::Error> {
    let parts = devices.len();
    let grids = [
        DistributedArray::map(rt, devices, a, part, MapType::TO)?,
        DistributedArray::map(rt, devices, a_new, part, MapType::TO)?,
    ];
    let tuned = args.kernel == KernelChoice::Tuned;
    let ranks = across.map(|a| a.edges);
    // Peer stores need every neighbour pair to reach each other directly, and a step in
    // one launch (across ranks, edge rows go first, in launches of their own).
    let peer = tuned
        && ranks.is_none()
        && args.peer_stores
        && (0..parts).all(|p| {
            rt.can_access_peer(devices[(p + 1) % parts], devices[p]).unwrap_or(false)
                && rt.can_access_peer(devices[(p + parts - 1) % parts], devices[p]).unwrap_or(false)
        });
    // Where part p pushes its first and last rows when `dst` (0 or 1) is the output grid.
    let pushes = |dst: usize, p: usize| -> Result<(DevicePtr, DevicePtr), offload::Error> {
        if !peer {
            return Ok((DevicePtr::NULL, DevicePtr::NULL));
        }
        let (prev, next) = ((p + parts - 1) % parts, (p + 1) % parts);
        // SAFETY: halo rows of the neighbours' output grids, mapped for the whole run,
        // reachable by peer access (checked above), written only in this step's kernel.
        Ok(unsafe {
            (
                DevicePtr::new(grids[dst].row_addr(prev, part.owned(prev).end)?),
                DevicePtr::new(grids[dst].row_addr(next, part.owned(next).start - 1)?),
            )
        })
    };
    let mut norms = Vec::with_capacity(parts);
    // Where each part's norms are read to, one step late: the copy of step i's norm is
    // queued behind step i's kernel and waited for after step i + 1 is queued, so the
    // device never waits for the host.
    let mut lates = Vec::with_capacity(parts);
    for &d in devices {
        lates.push(HostBuffer::<f32>::new(rt, 2)?);
        let n = HostBuffer::<f32>::new(rt, 2)?;
        n.enter(d, MapType::TO)?;
        let generated = match (args.kernel, generated_step::CHECKED) {
            (KernelChoice::Teams, true) => &jacobi_teams::KERNEL_CHECKED,
            (KernelChoice::Teams, false) => &jacobi_teams::KERNEL,
            (_, true) => &generated_step::KERNEL_CHECKED,
            (_, false) => &generated_step::KERNEL,
        };
        rt.device(d)?.prepare(if tuned { &JACOBI_STEP } else { generated })?;
        norms.push(n);
    }
    // Per-part norms, double-buffered by iteration: the leader sums step i's while the
    // others may already write step i + 1's.
    let partial = Mutex::new(vec![[0f32; 2]; parts]);
    let norm_out = Mutex::new(0f32);
    let start = Instant::now();
    // A part that fails stops the others at their next barrier; its error is the run's.
    let states: Vec<_> = norms.iter_mut().zip(lates).collect();
    run_in_lockstep(devices, states, |p, (norm, late), barrier| -> Result<(), Stop> {
        let dev = rt.device(devices[p])?;
        // The step whose norm is being read, and its read (which holds `late` meanwhile).
        let mut late = Some(late);
        let mut reading: Option<(usize, offload::QueuedRead<f32>)> = None;
        // The leader's half: step `iter`'s norm, summed over the parts (and ranks).
        let sum = |iter: usize| -> Result<(), Stop> {
            let slot = iter % 2;
            let mut total: f32 = partial.lock().map_err(|_| poisoned())?.iter().map(|n| n[slot]).sum();
            if let Some(r) = ranks {
                total = r.sum(f64::from(total)) as f32;
            }
            *norm_out.lock().map_err(|_| poisoned())? = total.sqrt();
            if !args.csv && iter.is_multiple_of(100) && ranks.is_none_or(|r| r.is_root()) {
                println!("{iter:5}, {:.6}", total.sqrt());
            }
            Ok(())
        };
        let push = [pushes(0, p)?, pushes(1, p)?];
        let launches =
            StepLaunch { args, grids: &grids, part, p, parts, across_ranks: ranks.is_some(), push };
        let step =
            |dev: &offload::Device<'_>, iter: usize, rows: Range<usize>, norm_view: DeviceSlice<'_, f32>| {
                launches.run(dev, iter, rows, norm_view)
            };
        for iter in 0..args.niter {
            let dst = 1 - iter % 2;
            let want_norm = iter % args.nccheck == 0 || (!args.csv && iter % 100 == 0);
            let end = part.owned(p).len() + 1;
            let norm_view = norm.view(devices[p]);
            step_across(rt, &dev, devices[p], p, end, across, &grids[dst], |d, rows| {
                step(d, iter, rows, norm_view)
            })?;
            // The step before's norm: its copy ran before this step's kernel.
            let read = reading.take();
            let before = read.as_ref().map(|(it, _)| *it);
            if let Some((it, r)) = read {
                let buf = r.wait()?;
                partial.lock().map_err(|_| poisoned())?[p][it % 2] = buf[it % 2];
                late = Some(buf);
            }
            if let (true, Some(buf)) = (want_norm, late.take()) {
                reading = Some((iter, buf.read_queued(norm.shared_view(devices[p]))?));
            }
            // The generated kernel stores one device's periodic halos itself.
            if !peer && (tuned || parts > 1 || ranks.is_some()) {
                grids[dst].send_halos(p, ranks.is_none())?;
            }
            // Every halo of this step is written before any device starts the next.
            let leader = barrier.wait()?;
            if let (true, Some(it)) = (leader, before) {
                sum(it)?;
            }
        }
        // The last step's norm.
        let last = reading.as_ref().map(|(it, _)| *it);
        if let Some((it, r)) = reading.take() {
            partial.lock().map_err(|_| poisoned())?[p][it % 2] = r.wait()?[it % 2];
        }
        drop(late);
        if let (true, Some(it)) = (barrier.wait()?, last) {
            sum(it)?;
        }
        Ok(())
    })?;
    let seconds = seconds_when_done(rt, devices, start)?;
    newest(grids, args.niter).gather()?;
    let norm = *norm_out.lock().map_err(|_| poisoned())?;
    Ok((seconds, norm))
}

/// What a part's steps launch with: the run's settings, both grids, the part and the
/// neighbours' halo rows its kernel stores into (peer stores), for each output grid.
struct StepLaunch<'g, 'a> {
    args: &'g Args,
    grids: &'g [DistributedArray<'a, f32>; 2],
    part: RowPartition,
    /// This part, of `parts`.
    p: usize,
    parts: usize,
    /// Other ranks hold rows of the grid.
    across_ranks: bool,
    push: [(DevicePtr, DevicePtr); 2],
}

impl StepLaunch<'_, '_> {
    /// The part's rows `rows` (1-based, halo row 0) of step `iter`, with the kernel chosen.
    fn run(
        &self,
        dev: &offload::Device<'_>,
        iter: usize,
        rows: Range<usize>,
        norm_view: DeviceSlice<'_, f32>,
    ) -> Result<(), offload::Error> {
        let (src, dst) = (iter % 2, 1 - iter % 2);
        let shape = StepShape {
            nx: self.args.nx,
            rows,
            end: self.part.owned(self.p).len() + 1,
            wrap: self.parts == 1 && !self.across_ranks,
            push: self.push[dst],
        };
        launch_step(
            dev,
            self.args,
            shape,
            [self.grids[src].view(self.p), self.grids[dst].view(self.p)],
            norm_view,
            iter % 2,
        )
    }
}

/// Where one launch of a step computes: rows `rows` (1-based, halo row 0) of an array of
/// `nx` columns whose computed rows end at `end`; `wrap`: the array is the whole periodic
/// grid (the generated kernels store its halo rows); `push`: the tuned kernel's peer
/// stores of its first and last rows.
struct StepShape {
    nx: usize,
    rows: Range<usize>,
    end: usize,
    wrap: bool,
    push: (DevicePtr, DevicePtr),
}

/// One step of `args.kernel` from `grids[0]` into `grids[1]`, its squared update added to
/// slot `slot` of `norm_view` (the other slot zeroed for the next step).
fn launch_step(
    dev: &offload::Device<'_>,
    args: &Args,
    s: StepShape,
    [src, dst]: [DeviceSlice<'_, f32>; 2],
    norm_view: DeviceSlice<'_, f32>,
    slot: usize,
) -> Result<(), offload::Error> {
    let StepShape { nx, rows, end, wrap, push } = s;
    if rows.is_empty() {
        return Ok(());
    }
    match args.kernel {
        KernelChoice::Tuned => {
            let shape =
                JacobiShape { nx, iy_start: rows.start, iy_end: rows.end, rows_per_thread: args.rows };
            jacobi_step(dev, shape, src, dst, norm_view, slot, push.0, push.1)
        }
        KernelChoice::Teams => {
            let strip = args.rows.max(1);
            let col_blocks = (nx - 2).div_ceil(JACOBI_TEAM_COLUMNS);
            jacobi_teams::launch(
                dev,
                col_blocks * rows.len().div_ceil(strip),
                nx,
                rows.start,
                rows.end,
                strip,
                col_blocks,
                wrap && rows.start == 1 && rows.end == end,
                src,
                dst,
                norm_view.slice(slot..slot + 1)?,
                norm_view.slice(1 - slot..2 - slot)?,
            )
        }
        KernelChoice::Generated => generated_step::launch(
            dev,
            (rows, 1..nx - 1),
            nx,
            end,
            wrap,
            src,
            dst,
            norm_view.slice(slot..slot + 1)?,
            norm_view.slice(1 - slot..2 - slot)?,
        ),
    }
}

/// Runs `args.niter` iterations split as a grid of parts: `shape[0]` bands of rows by
/// `shape[1]` bands of columns, part `p` on `devices[p % devices.len()]` (one host thread
/// a part), the halos exchanged across faces after each step ([`DistributedGrid`]). Gives
/// the bits of [`solve`] on one device; the norm is summed part by part, so it may differ
/// from [`solve`]'s in its last bits.
pub fn solve_grid(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    shape: [usize; 2],
) -> Result<Outcome, offload::Error> {
    let (nx, ny) = (args.nx, args.ny);
    let part = GridPartition::new(&[ny, nx], &shape, 1)?.with_periodic(&[true, false])?;
    let parts = part.parts();
    if devices.is_empty() {
        return Err(offload::Error::InvalidArgument {
            routine: "jacobi",
            what: "no device to run on".into(),
        });
    }
    let devices: Vec<usize> = (0..parts).map(|p| devices[p % devices.len()]).collect();
    let devices = &devices[..];
    let (mut a, mut a_new) = (initial(nx, ny), initial(nx, ny));
    let (seconds, norm, halo) = {
        let grids = [
            DistributedGrid::map(rt, devices, &mut a, part.clone(), Reach::Faces, MapType::TO)?,
            DistributedGrid::map(rt, devices, &mut a_new, part.clone(), Reach::Faces, MapType::TO)?,
        ];
        let mut norms = Vec::with_capacity(parts);
        for &d in devices {
            let dev = rt.device(d)?;
            norms.push(DeviceBuffer::<f32>::from_slice(&dev, &[0.0; 2])?);
        }
        // Per-part norms by iteration parity: the leader sums step i's while the others may
        // already write step i + 1's.
        let partial = Mutex::new(vec![[0f32; 2]; parts]);
        let norm_out = Mutex::new(0f32);
        let clock = HaloClock::default();
        let start = Instant::now();
        run_in_lockstep(devices, norms, |p, norm, barrier| -> Result<(), Stop> {
            let me = [LayersFirst::of(&part, p, devices[p])];
            for iter in 0..args.niter {
                let (dst, slot) = (1 - iter % 2, iter % 2);
                step_grid_parts(rt, args, &part, &grids, iter, &me, &[norm.view()], &clock, || {
                    grids[dst].send_halos(p)
                })?;
                let want_norm = iter % args.nccheck == 0 || (!args.csv && iter % 100 == 0);
                if want_norm {
                    partial.lock().map_err(|_| poisoned())?[p][slot] = norm.to_vec()?[slot];
                }
                // Every halo of this step is written before any device starts the next.
                let leader = barrier.wait()?;
                if leader && want_norm {
                    let total: f32 = partial.lock().map_err(|_| poisoned())?.iter().map(|n| n[slot]).sum();
                    *norm_out.lock().map_err(|_| poisoned())? = total.sqrt();
                    if !args.csv && iter.is_multiple_of(100) {
                        println!("{iter:5}, {:.6}", total.sqrt());
                    }
                }
            }
            Ok(())
        })?;
        let seconds = seconds_when_done(rt, devices, start)?;
        newest(grids, args.niter).gather()?;
        let norm = *norm_out.lock().map_err(|_| poisoned())?;
        (seconds, norm, clock.per_step())
    };
    let grid = if args.niter.is_multiple_of(2) { a } else { a_new };
    Ok(Outcome { seconds, norm, grid, halo })
}

/// Step `iter` of the grid parts `parts` (held by this thread; `norms[k]` part `k`'s
/// double-buffered norm), their halos sent by `exchange`. With the generated kernel the
/// layers the neighbours read go first and the inner boxes run beside the exchange (the
/// times in `clock`); the other kernels take whole rows, so each part's box is one launch
/// and the exchange follows it.
#[allow(clippy::too_many_arguments)]
fn step_grid_parts(
    rt: &Runtime,
    args: &Args,
    part: &GridPartition,
    grids: &[DistributedGrid<'_, f32>; 2],
    iter: usize,
    parts: &[LayersFirst],
    norms: &[DeviceSlice<'_, f32>],
    clock: &HaloClock,
    exchange: impl FnOnce() -> Result<(), offload::Error>,
) -> Result<(), offload::Error> {
    let (src, dst, slot) = (iter % 2, 1 - iter % 2, iter % 2);
    if args.kernel != KernelChoice::Generated {
        for (s, norm) in parts.iter().zip(norms) {
            let local = part.mapped(s.part).extents();
            let (rows, lnx) = (local[0] - 2, local[1]);
            let none = (DevicePtr::NULL, DevicePtr::NULL);
            let shape = StepShape { nx: lnx, rows: 1..rows + 1, end: rows + 1, wrap: false, push: none };
            let views = [grids[src].view(s.part), grids[dst].view(s.part)];
            launch_step(&rt.device(s.device)?, args, shape, views, *norm, slot)?;
        }
        return exchange();
    }
    // One launch of the generated kernel over box `b` (grid coordinates) of part `p`.
    let step = |p: usize, dev: &offload::Device<'_>, b: &GridBox| -> Result<(), offload::Error> {
        let Some(norm) = parts.iter().position(|s| s.part == p).map(|k| norms[k]) else { return Ok(()) };
        if b.is_empty() {
            return Ok(());
        }
        let (m, r) = (part.mapped(p), b.ranges());
        let (m0, m1) = (m.ranges()[0].start, m.ranges()[1].start);
        generated_step::launch(
            dev,
            (r[0].start - m0..r[0].end - m0, r[1].start - m1..r[1].end - m1),
            m.extents()[1],
            m.extents()[0] - 1,
            false,
            grids[src].view(p),
            grids[dst].view(p),
            norm.slice(slot..slot + 1)?,
            norm.slice(1 - slot..2 - slot)?,
        )
    };
    step_layers_first(rt, parts, clock, step, exchange)
}

/// Runs `args.niter` iterations of a grid split as `shape` whose parts this process holds
/// where `placement` says (`None`: another rank's), one thread over its parts, the halos
/// exchanged by `across` after each step (between this rank's parts and with the other
/// ranks'); the outcome's grid holds this rank's owned points (the rest as they started),
/// its norm the whole grid's.
pub fn solve_grid_held(
    rt: &Runtime,
    placement: &[Option<usize>],
    args: &Args,
    shape: [usize; 2],
    across: &dyn GridAcross,
) -> Result<Outcome, offload::Error> {
    let (nx, ny) = (args.nx, args.ny);
    let part = GridPartition::new(&[ny, nx], &shape, 1)?.with_periodic(&[true, false])?;
    let (mut a, mut a_new) = (initial(nx, ny), initial(nx, ny));
    let (seconds, norm, halo) = {
        let grids = [
            DistributedGrid::map_held(rt, placement, &mut a, part.clone(), Reach::Faces, MapType::TO)?,
            DistributedGrid::map_held(rt, placement, &mut a_new, part.clone(), Reach::Faces, MapType::TO)?,
        ];
        let held: Vec<(usize, usize)> =
            grids[0].held().map(|p| (p, placement[p].unwrap_or_default())).collect();
        // Where each held part adds its squares: its own buffer, summed on the host and over
        // the ranks by `across`; or, with NCCL, its device's buffer (the parts of one device
        // add into it in queue order), summed over the communicator's ranks on the devices
        // (ncclAllReduce) and read once.
        let nccl = across.nccl();
        let norm_devices: Vec<usize> = match nccl {
            Some(comm) => comm.held().iter().map(|&(d, _)| d).collect(),
            None => held.iter().map(|&(_, d)| d).collect(),
        };
        let mut norms = Vec::with_capacity(norm_devices.len());
        for &d in &norm_devices {
            norms.push(DeviceBuffer::<f32>::from_slice(&rt.device(d)?, &[0.0; 2])?);
        }
        let views = held
            .iter()
            .enumerate()
            .map(|(k, &(p, d))| match nccl {
                None => Ok(norms[k].view()),
                Some(_) => {
                    norm_devices.iter().position(|&n| n == d).map(|i| norms[i].view()).ok_or_else(|| {
                        offload::Error::InvalidArgument {
                            routine: "jacobi",
                            what: format!(
                                "part {p} is on device {d}, which holds no rank of the NCCL communicator"
                            ),
                        }
                    })
                }
            })
            .collect::<Result<Vec<DeviceSlice<'_, f32>>, offload::Error>>()?;
        let mut norm = 0f32;
        let clock = HaloClock::default();
        let mine: Vec<LayersFirst> = held.iter().map(|&(p, d)| LayersFirst::of(&part, p, d)).collect();
        let start = Instant::now();
        for iter in 0..args.niter {
            let (dst, slot) = (1 - iter % 2, iter % 2);
            step_grid_parts(rt, args, &part, &grids, iter, &mine, &views, &clock, || {
                across.exchange(&grids[dst])
            })?;
            if iter % args.nccheck == 0 || (!args.csv && iter % 100 == 0) {
                norm = match nccl {
                    Some(comm) => {
                        comm.sum(&norms.iter().collect::<Vec<_>>(), slot..slot + 1)?;
                        norms[0].to_vec()?[slot].sqrt()
                    }
                    None => {
                        let mut mine = 0f32;
                        for n in &norms {
                            mine += n.to_vec()?[slot];
                        }
                        (across.sum(f64::from(mine)) as f32).sqrt()
                    }
                };
                if !args.csv && iter.is_multiple_of(100) && across.is_root() {
                    println!("{iter:5}, {norm:.6}");
                }
            }
        }
        let devices: Vec<usize> = held.iter().map(|&(_, d)| d).collect();
        let seconds = seconds_when_done(rt, &devices, start)?;
        newest(grids, args.niter).gather()?;
        (seconds, norm, clock.per_step())
    };
    let grid = if args.niter.is_multiple_of(2) { a } else { a_new };
    Ok(Outcome { seconds, norm, grid, halo })
}

fn poisoned() -> offload::Error {
    offload::Error::InvalidArgument { routine: "jacobi", what: "a device thread panicked".into() }
}

/// The same iteration on the CPU, one thread, for checking small runs.
pub fn reference(args: &Args) -> Vec<f32> {
    let (nx, ny) = (args.nx, args.ny);
    let mut a = initial(nx, ny);
    let mut b = a.clone();
    for _ in 0..args.niter {
        for iy in 1..ny - 1 {
            for ix in 1..nx - 1 {
                b[iy * nx + ix] = 0.25f32
                    * (a[iy * nx + ix + 1]
                        + a[iy * nx + ix - 1]
                        + a[(iy + 1) * nx + ix]
                        + a[(iy - 1) * nx + ix]);
            }
        }
        let (top, bottom) = ((ny - 2) * nx, nx);
        b.copy_within(top + 1..top + nx - 1, 1);
        b.copy_within(bottom + 1..bottom + nx - 1, (ny - 1) * nx + 1);
        std::mem::swap(&mut a, &mut b);
    }
    a
}

/// A digest of the interior rows' bits (FNV-1a, 64 bits): equal grids, equal digests, so
/// runs in different processes can be compared by one line.
pub fn digest(grid: &[f32], nx: usize, ny: usize) -> u64 {
    grid[nx..(ny - 1) * nx]
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Interior rows only: halo rows are scratch, owned by no device.
pub fn max_diff(x: &[f32], y: &[f32], nx: usize, ny: usize) -> f32 {
    x[nx..(ny - 1) * nx].iter().zip(&y[nx..(ny - 1) * nx]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}
