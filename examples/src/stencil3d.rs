//! The 3-D 7-point stencil solver of `examples/stencil3d.rs`, as a library so that tests
//! and benches run the same code.

use std::sync::Barrier;
use std::time::Instant;

use offload::partition::{DistributedArray, RowPartition};
use offload::{MapType, Runtime};
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
}

impl Default for Args {
    fn default() -> Self {
        Self { nx: 256, ny: 256, nz: 256, niter: 100, ndev: None, planes: 16, csv: false }
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
    let barrier = Barrier::new(devices.len());
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), offload::Error> {
        let handles: Vec<_> = (0..devices.len())
            .map(|p| {
                let (grids, barrier) = (&grids, &barrier);
                s.spawn(move || -> Result<(), offload::Error> {
                    let dev = rt.device(devices[p])?;
                    let planes = part.owned(p).len();
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
                        )?;
                        // Each part sends its own halos as soon as its step is done; the
                        // barrier keeps the next step from reading them early.
                        grids[dst].send_halos(p, false)?;
                        barrier.wait();
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(poisoned())))
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let [g0, g1] = grids;
    let (newest, other) = if args.niter % 2 == 0 { (g0, g1) } else { (g1, g0) };
    drop(other);
    newest.gather()?;
    Ok(seconds)
}

fn poisoned() -> offload::Error {
    offload::Error::InvalidArgument { routine: "stencil3d", what: "a device thread panicked".into() }
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
