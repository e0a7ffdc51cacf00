//! The 3-D 7-point stencil solver of `examples/stencil3d.rs`, as a library so that tests
//! and benches run the same code.

use std::ops::Range;
use std::time::Instant;

use crate::ranks::{
    step_across, step_layers_first, Across, GridAcross, HaloClock, HaloTimes, LayersFirst, RankEdges,
};
use crate::spin_barrier::{run_in_lockstep, Stop};
use crate::{newest, seconds_when_done};
use offload::partition::{DistributedArray, DistributedGrid, GridBox, GridPartition, Reach, RowPartition};
use offload::{DevicePtr, MapType, Runtime};
use offload_kernels::generated;
use offload_kernels::stencil::{stencil7_step, STENCIL7_STEP};

/// A stencil run's settings.
#[derive(Clone, Debug)]
pub struct Args {
    /// Points along x.
    pub nx: usize,
    /// Points along y.
    pub ny: usize,
    /// Planes along z (split over the devices).
    pub nz: usize,
    /// Iterations.
    pub niter: usize,
    /// Devices to use (all when `None`).
    pub ndev: Option<usize>,
    /// Planes per GPU thread.
    pub planes: usize,
    /// Print CSV.
    pub csv: bool,
    /// Halos by peer stores from the kernel (else `target_memcpy` after each step).
    pub peer_stores: bool,
    /// Always check (against the CPU reference, or across ranks the single-process run).
    pub check: bool,
    /// Split the cube over a grid of parts along z, y and x ([`solve_grid`]) instead of
    /// by planes.
    pub grid: Option<[usize; 3]>,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            nx: 256,
            ny: 256,
            nz: 256,
            niter: 100,
            ndev: None,
            planes: 16,
            csv: false,
            peer_stores: true,
            check: false,
            grid: None,
        }
    }
}

/// Zero inside; the `z = 0` face at 1 and the `x = 0` face at 0.5.
pub fn initial(a: &Args) -> Vec<f32> {
    initial_planes(a, 0..a.nz)
}

/// Planes `planes` of the initial grid.
pub fn initial_planes(a: &Args, planes: Range<usize>) -> Vec<f32> {
    let (nx, ny) = (a.nx, a.ny);
    let mut g = vec![0f32; nx * ny * planes.len()];
    for (i, z) in planes.enumerate() {
        let plane = &mut g[i * nx * ny..(i + 1) * nx * ny];
        if z == 0 {
            plane.fill(1.0);
        } else {
            (0..ny).for_each(|y| plane[y * nx] = 0.5);
        }
    }
    g
}

/// Runs `args.niter` steps on `devices` (one host thread each); returns the loop's
/// seconds and the final grid.
pub fn solve(rt: &Runtime, devices: &[usize], args: &Args) -> Result<(f64, Vec<f32>), offload::Error> {
    solve_slab(rt, devices, args, 0..args.nz, None).map(|(t, g, _)| (t, g))
}

/// Runs `args.niter` steps on global planes `planes` of the cube (halo planes included)
/// on `devices`, with `edges` the ranks that hold the other planes (`None`: `planes` is
/// the whole cube); returns the loop's seconds, the slab, and across ranks where the edge
/// parts' steps went.
pub fn solve_slab(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    planes: Range<usize>,
    edges: Option<&dyn RankEdges>,
) -> Result<(f64, Vec<f32>, Option<HaloTimes>), offload::Error> {
    let part = RowPartition::new(planes.len(), args.nx * args.ny, devices.len(), 1)?;
    let mut a = initial_planes(args, planes);
    let mut b = a.clone();
    let across = edges.map(|edges| Across { edges, clock: HaloClock::default() });
    let seconds = run_steps(rt, devices, args, part, &mut a, &mut b, across.as_ref())?;
    Ok((seconds, if args.niter.is_multiple_of(2) { a } else { b }, across.and_then(|a| a.clock.per_step())))
}

fn run_steps(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    part: RowPartition,
    a: &mut [f32],
    b: &mut [f32],
    across: Option<&Across<'_>>,
) -> Result<f64, offload::Error> {
    let grids = [
        DistributedArray::map(rt, devices, a, part, MapType::TO)?,
        DistributedArray::map(rt, devices, b, part, MapType::TO)?,
    ];
    for &d in devices {
        rt.device(d)?.prepare(&STENCIL7_STEP)?;
    }
    let parts = devices.len();
    let ranks = across.map(|a| a.edges);
    // Peer stores need each neighbour pair to reach each other directly, and a step in
    // one launch (across ranks, edge planes go first, in launches of their own).
    let peer = args.peer_stores
        && ranks.is_none()
        && (1..parts).all(|p| {
            rt.can_access_peer(devices[p], devices[p - 1]).unwrap_or(false)
                && rt.can_access_peer(devices[p - 1], devices[p]).unwrap_or(false)
        });
    // Part p's push targets when `dst` is the output grid: the previous part's bottom halo
    // plane and the next part's top halo plane (none at the cube's faces).
    let pushes = |dst: usize, p: usize| -> Result<(DevicePtr, DevicePtr), offload::Error> {
        if !peer {
            return Ok((DevicePtr::NULL, DevicePtr::NULL));
        }
        let prev = match p.checked_sub(1) {
            Some(q) => grids[dst].row_addr(q, part.owned(q).end)?,
            None => 0,
        };
        let next = if p + 1 < parts { grids[dst].row_addr(p + 1, part.owned(p + 1).start - 1)? } else { 0 };
        // SAFETY: halo planes of the neighbours' output grids, mapped for the whole run,
        // reachable by peer access (checked above), written only by this step's kernel.
        Ok(unsafe { (DevicePtr::new(prev), DevicePtr::new(next)) })
    };
    let start = Instant::now();
    // A part that fails stops the others at their next barrier; its error is the run's.
    run_in_lockstep(devices, vec![(); parts], |p, (), barrier| -> Result<(), Stop> {
        let dev = rt.device(devices[p])?;
        let planes = part.owned(p).len();
        let push = [pushes(0, p)?, pushes(1, p)?];
        // The part's planes `zs` (1-based, halo plane 0) of step `iter`.
        let step = |dev: &offload::Device<'_>, iter: usize, zs: Range<usize>| -> Result<(), offload::Error> {
            if zs.is_empty() {
                return Ok(());
            }
            let (src, dst) = (iter % 2, 1 - iter % 2);
            stencil7_step(
                dev,
                args.nx,
                args.ny,
                zs.start,
                zs.end,
                args.planes,
                grids[src].view(p),
                grids[dst].view(p),
                push[dst].0,
                push[dst].1,
            )
        };
        for iter in 0..args.niter {
            let dst = 1 - iter % 2;
            step_across(rt, &dev, devices[p], p, planes + 1, across, &grids[dst], |d, zs| step(d, iter, zs))?;
            // Without peer stores each part sends its own halos as soon as its step is
            // done; the barrier keeps the next step from reading early.
            if !peer {
                grids[dst].send_halos(p, false)?;
            }
            barrier.wait()?;
        }
        Ok(())
    })?;
    let seconds = seconds_when_done(rt, devices, start)?;
    newest(grids, args.niter).gather()?;
    Ok(seconds)
}

/// Runs `args.niter` steps split as a grid of parts, `shape[0] x shape[1] x shape[2]`
/// boxes along z, y and x, part `p` on `devices[p % devices.len()]` (one host thread a
/// part), by the generated kernel: each part's layers that its neighbours read first, then
/// its inner box on the device's compute lane while the layers go to the neighbours
/// across faces ([`DistributedGrid`]); returns the loop's seconds, the final grid (the
/// bits of [`solve`] on one device) and where the exchanges' time went.
pub fn solve_grid(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    shape: [usize; 3],
) -> Result<(f64, Vec<f32>, Option<HaloTimes>), offload::Error> {
    let part = GridPartition::new(&[args.nz, args.ny, args.nx], &shape, 1)?;
    if devices.is_empty() {
        return Err(offload::Error::InvalidArgument {
            routine: "stencil3d",
            what: "no device to run on".into(),
        });
    }
    let devices: Vec<usize> = (0..part.parts()).map(|p| devices[p % devices.len()]).collect();
    let (mut a, mut b) = (initial(args), initial(args));
    let clock = HaloClock::default();
    let seconds = {
        let grids = [
            DistributedGrid::map(rt, &devices, &mut a, part.clone(), Reach::Faces, MapType::TO)?,
            DistributedGrid::map(rt, &devices, &mut b, part.clone(), Reach::Faces, MapType::TO)?,
        ];
        let start = Instant::now();
        run_in_lockstep(&devices, vec![(); part.parts()], |p, (), barrier| -> Result<(), Stop> {
            let me = [LayersFirst::of(&part, p, devices[p])];
            for iter in 0..args.niter {
                let step =
                    |q: usize, d: &offload::Device<'_>, b: &GridBox| box_step(d, &part, q, b, &grids, iter);
                step_layers_first(rt, &me, &clock, step, || grids[1 - iter % 2].send_halos(p))?;
                barrier.wait()?;
            }
            Ok(())
        })?;
        let seconds = seconds_when_done(rt, &devices, start)?;
        newest(grids, args.niter).gather()?;
        seconds
    };
    Ok((seconds, if args.niter.is_multiple_of(2) { a } else { b }, clock.per_step()))
}

/// As [`solve_grid`] for a process that holds the parts `placement` names (`None`:
/// another rank's), one thread over its parts: their layers first, then their inner boxes
/// while `across` exchanges; the grid returned holds this rank's owned points (the rest as
/// they started).
pub fn solve_grid_held(
    rt: &Runtime,
    placement: &[Option<usize>],
    args: &Args,
    shape: [usize; 3],
    across: &dyn GridAcross,
) -> Result<(f64, Vec<f32>, Option<HaloTimes>), offload::Error> {
    let part = GridPartition::new(&[args.nz, args.ny, args.nx], &shape, 1)?;
    let (mut a, mut b) = (initial(args), initial(args));
    let clock = HaloClock::default();
    let seconds = {
        let grids = [
            DistributedGrid::map_held(rt, placement, &mut a, part.clone(), Reach::Faces, MapType::TO)?,
            DistributedGrid::map_held(rt, placement, &mut b, part.clone(), Reach::Faces, MapType::TO)?,
        ];
        let held: Vec<(usize, usize)> =
            grids[0].held().map(|p| (p, placement[p].unwrap_or_default())).collect();
        let start = Instant::now();
        let mine: Vec<LayersFirst> = held.iter().map(|&(p, d)| LayersFirst::of(&part, p, d)).collect();
        for iter in 0..args.niter {
            let step =
                |q: usize, d: &offload::Device<'_>, b: &GridBox| box_step(d, &part, q, b, &grids, iter);
            step_layers_first(rt, &mine, &clock, step, || across.exchange(&grids[1 - iter % 2]))?;
        }
        let devices: Vec<usize> = held.iter().map(|&(_, d)| d).collect();
        let seconds = seconds_when_done(rt, &devices, start)?;
        newest(grids, args.niter).gather()?;
        seconds
    };
    Ok((seconds, if args.niter.is_multiple_of(2) { a } else { b }, clock.per_step()))
}

/// Step `iter` of part `p` of a cube split by `part`, over box `b` of it (grid
/// coordinates) on `dev`, by the generated kernel (the tuned one's arithmetic in its order,
/// so the same bits) from `grids[iter % 2]` into the other.
fn box_step(
    dev: &offload::Device<'_>,
    part: &GridPartition,
    p: usize,
    b: &GridBox,
    grids: &[DistributedGrid<'_, f32>; 2],
    iter: usize,
) -> Result<(), offload::Error> {
    if b.is_empty() {
        return Ok(());
    }
    let m = part.mapped(p);
    let [z, y, x] = <[std::ops::Range<usize>; 3]>::try_from(
        b.ranges()
            .iter()
            .zip(m.ranges())
            .map(|(r, m)| r.start - m.start..r.end - m.start)
            .collect::<Vec<_>>(),
    )
    .map_err(|_| not_3d())?;
    let e = m.extents();
    let (src, dst) = (iter % 2, 1 - iter % 2);
    generated::stencil7_step::launch(dev, (z, y, x), e[1], e[2], grids[src].view(p), grids[dst].view(p))
}

/// The error for a part's box that is not 3-D (a partition of another grid).
fn not_3d() -> offload::Error {
    offload::Error::InvalidArgument { routine: "stencil3d", what: "a part's box is not 3-D".into() }
}

/// The same steps on the CPU, one thread.
pub fn reference(args: &Args) -> Vec<f32> {
    let (nx, ny, nz) = (args.nx, args.ny, args.nz);
    let (mut a, plane) = (initial(args), nx * ny);
    let mut b = a.clone();
    for _ in 0..args.niter {
        for z in 1..nz - 1 {
            for y in 1..ny - 1 {
                for x in 1..nx - 1 {
                    let i = z * plane + y * nx + x;
                    b[i] = (1.0f32 / 6.0f32)
                        * (a[i - 1] + a[i + 1] + a[i - nx] + a[i + nx] + a[i - plane] + a[i + plane]);
                }
            }
        }
        std::mem::swap(&mut a, &mut b);
    }
    a
}

/// A digest of the cube's bits (FNV-1a, 64 bits), to compare runs in different processes.
pub fn digest(grid: &[f32]) -> u64 {
    grid.iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Largest absolute difference.
pub fn max_diff(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}
