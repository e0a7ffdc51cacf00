//! The 3-D 7-point stencil solver of `examples/stencil3d.rs`, as a library so that tests
//! and benches run the same code.

use std::time::Instant;

use crate::spin_barrier::{run_in_lockstep, Stop};
use offload::partition::{DistributedArray, RowPartition};
use offload::{DevicePtr, MapType, Runtime};
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
}

impl Default for Args {
    fn default() -> Self {
        Self { nx: 256, ny: 256, nz: 256, niter: 100, ndev: None, planes: 16, csv: false, peer_stores: true }
    }
}

/// Zero inside; the `z = 0` face at 1 and the `x = 0` face at 0.5.
pub fn initial(a: &Args) -> Vec<f32> {
    let (nx, ny, nz) = (a.nx, a.ny, a.nz);
    let mut g = vec![0f32; nx * ny * nz];
    g[..nx * ny].fill(1.0);
    for z in 1..nz {
        for y in 0..ny {
            g[(z * ny + y) * nx] = 0.5;
        }
    }
    g
}

/// Runs `args.niter` steps on `devices` (one host thread each); returns the loop's
/// seconds and the final grid.
pub fn solve(rt: &Runtime, devices: &[usize], args: &Args) -> Result<(f64, Vec<f32>), offload::Error> {
    let part = RowPartition::new(args.nz, args.nx * args.ny, devices.len(), 1)?;
    let mut a = initial(args);
    let mut b = a.clone();
    let seconds = run_steps(rt, devices, args, part, &mut a, &mut b)?;
    Ok((seconds, if args.niter % 2 == 0 { a } else { b }))
}

fn run_steps(
    rt: &Runtime,
    devices: &[usize],
    args: &Args,
    part: RowPartition,
    a: &mut [f32],
    b: &mut [f32],
) -> Result<f64, offload::Error> {
    let grids = [
        DistributedArray::map(rt, devices, a, part, MapType::TO)?,
        DistributedArray::map(rt, devices, b, part, MapType::TO)?,
    ];
    for &d in devices {
        rt.device(d)?.prepare(&STENCIL7_STEP)?;
    }
    let parts = devices.len();
    // Peer stores need each neighbour pair to reach each other directly.
    let peer = args.peer_stores
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
        for iter in 0..args.niter {
            let (src, dst) = (iter % 2, 1 - iter % 2);
            stencil7_step(
                &dev,
                args.nx,
                args.ny,
                1,
                planes + 1,
                args.planes,
                grids[src].view(p),
                grids[dst].view(p),
                push[dst].0,
                push[dst].1,
            )?;
            // Without peer stores each part sends its own halos as soon as its step is
            // done; the barrier keeps the next step from reading early.
            if !peer {
                grids[dst].send_halos(p, false)?;
            }
            barrier.wait()?;
        }
        Ok(())
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let [g0, g1] = grids;
    let (newest, other) = if args.niter % 2 == 0 { (g0, g1) } else { (g1, g0) };
    drop(other);
    newest.gather()?;
    Ok(seconds)
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

/// Largest absolute difference.
pub fn max_diff(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}
