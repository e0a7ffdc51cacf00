//! Multi-device 3-D 7-point stencil (Jacobi relaxation of Laplace's equation on a cube,
//! fixed faces): the grid's planes are split over the devices; halo planes go to the
//! neighbours by peer stores from the kernel, or with `-halo memcpy` by `target_memcpy`
//! (peer copies where the devices have peer access) after every step. Runs on one device, then on all, prints the times, and
//! checks the multi-device grid equals the single-device one (and a CPU reference at small
//! sizes).
//!
//! ```text
//! cargo run --release -p offload-examples --example stencil3d -- -n 512 -niter 100
//! ```
//! Options: `-n N` (cube edge, 256), `-nx/-ny/-nz N`, `-niter N` (100), `-ndev N` (all),
//! `-planes N` (planes per GPU thread, 16), `-csv`, `-halo peer|memcpy` (peer stores from
//! the kernel, or `target_memcpy` after it), `-grid ZxYxX` (the multi-device run split into
//! a grid of boxes along z, y and x, part p on device p mod the devices, instead of by
//! planes), `-check` (the CPU reference at any size; under
//! `mpirun`, the single-process run on rank 0's first device).
//!
//! Built with `--features mpi` and started by `mpirun -np N`, the planes are split over the
//! ranks first, each rank's slab over its own devices (see `jacobi.rs`).

use offload_examples::options::Options;
use offload_examples::ranks::grid_in_process;
use offload_examples::stencil3d::{digest, max_diff, reference, solve, solve_grid, solve_grid_held, Args};
use offload_examples::{example_devices, example_runtime};

const USAGE: &str =
    "stencil3d [-n N | -nx N -ny N -nz N] [-niter N] [-ndev N] [-planes N] [-csv] [-halo peer|memcpy] [-grid ZxYxX] [-check]";

fn parse() -> Result<Args, String> {
    let o = Options::parse(&["csv", "check"])?;
    o.only(&["n", "nx", "ny", "nz", "niter", "ndev", "planes", "csv", "halo", "grid", "check"], USAGE)?;
    let d = Args::default();
    // `-n` sets every edge; `-nx`, `-ny`, `-nz` one each.
    let n: Option<usize> = o.num_opt("n")?;
    let a = Args {
        nx: o.num("nx", n.unwrap_or(d.nx))?,
        ny: o.num("ny", n.unwrap_or(d.ny))?,
        nz: o.num("nz", n.unwrap_or(d.nz))?,
        niter: o.num("niter", d.niter)?,
        ndev: o.num_opt("ndev")?,
        planes: o.num("planes", d.planes)?.max(1),
        csv: o.has("csv"),
        peer_stores: o.choice("halo", &[("peer", true), ("memcpy", false)], d.peer_stores)?,
        check: o.has("check"),
        grid: o.grid("grid")?,
    };
    if a.nx < 3 || a.ny < 3 || a.nz < 3 {
        return Err("every edge must be at least 3".into());
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    #[cfg(feature = "mpi")]
    if offload_examples::ranks::run_across_ranks(|c| across_ranks(c, &args))? {
        return Ok(());
    }
    let rt = example_runtime()?;
    let devices = example_devices(&rt, args.ndev);
    if !args.csv {
        print!("{}", rt.device_report());
        println!("7-point stencil: {} iterations on {} x {} x {}", args.niter, args.nz, args.ny, args.nx);
    }
    let (t1, single) = solve(&rt, &devices[..1], &args)?;
    let (tn, multi, halo) = match args.grid {
        Some(shape) => match grid_in_process(&rt, &devices, shape.iter().product(), args.csv) {
            Some((across, placement)) => solve_grid_held(&rt, &placement, &args, shape, &across)?,
            None => solve_grid(&rt, &devices, &args, shape)?,
        },
        None => solve(&rt, &devices, &args).map(|(t, g)| (t, g, None))?,
    };
    let diff = max_diff(&single, &multi);
    let small = args.nx * args.ny * args.nz * args.niter <= 64 << 20;
    let cpu = (small || args.check).then(|| max_diff(&reference(&args), &single));
    let n = devices.len();
    // Bytes each step must move at least: read and write every interior point once.
    let gbs = |t: f64| 2.0 * 4.0 * (args.nx * args.ny * args.nz) as f64 * args.niter as f64 / t / 1e9;
    if args.csv {
        println!(
            "offload-stencil3d, {}, {}, {}, {}, {n}, {t1:.6}, {tn:.6}",
            args.nx, args.ny, args.nz, args.niter
        );
    } else {
        println!(
            "{}x{}x{}: 1 device: {t1:8.4} s ({:.0} GB/s), {n} devices: {tn:8.4} s ({:.0} GB/s), speedup: {:8.2}, efficiency: {:8.2}",
            args.nz,
            args.ny,
            args.nx,
            gbs(t1),
            gbs(tn),
            t1 / tn,
            t1 / (n as f64 * tn) * 100.0
        );
        println!(
            "max |multi - single| = {diff:e}{}",
            cpu.map_or(String::new(), |d| format!("; max |single - cpu| = {d:e}"))
        );
        if let Some(h) = halo {
            println!("{}", offload_examples::ranks::describe(&h, offload_examples::ranks::AT_GRID_LAYERS));
        }
    }
    println!("result: grid digest {:#018x}", digest(&multi));
    if diff != 0.0 || cpu.is_some_and(|d| d > 1e-6) {
        return Err("results differ".into());
    }
    Ok(())
}

/// The run under `mpirun -np N`: the cube's planes split over the ranks, each rank's slab
/// over its own devices, halo planes between ranks by MPI while the interior updates; rank
/// 0 prints, and with `-check` (or at small sizes) compares the gathered cube with a
/// single-process run on its first device, bit for bit.
#[cfg(feature = "mpi")]
fn across_ranks(cluster: &offload::cluster::Cluster, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use offload_examples::ranks::{gather_grid, MpiEdges, RankRun};
    use offload_examples::stencil3d::solve_slab;

    if let Some(shape) = args.grid {
        return grid_across_ranks(cluster, args, shape);
    }
    let plane = args.nx * args.ny;
    let run = RankRun::start(cluster, args.nz, plane, args.ndev)?;
    let (rt, devices) = (run.runtime(), &run.devices);
    let edges = MpiEdges::new(cluster, rt, devices, &run.slab, false)?;
    run.print_placements(cluster);
    if cluster.is_root() {
        println!(
            "7-point stencil: {} iterations on {} x {} x {} across {} ranks, halos between ranks {}",
            args.niter,
            args.nz,
            args.ny,
            args.nx,
            cluster.size(),
            if edges.direct() { "device to device (CUDA-aware MPI)" } else { "through pinned host buffers" }
        );
    }
    cluster.barrier();
    let (seconds, slab_grid, halo) = solve_slab(rt, devices, args, run.rows.clone(), Some(&edges))?;
    let seconds = cluster.max(seconds);
    let Some(grid) = gather_grid(cluster, &run.ranks, &slab_grid)? else { return Ok(()) };
    let small = plane * args.nz * args.niter <= 64 << 20;
    let single = (args.check || small).then(|| solve(rt, &devices[..1], args)).transpose()?;
    let gbs = |t: f64| 2.0 * 4.0 * (plane * args.nz) as f64 * args.niter as f64 / t / 1e9;
    println!(
        "{}x{}x{}: {} ranks x {} devices: {seconds:8.4} s ({:.0} GB/s){}",
        args.nz,
        args.ny,
        args.nx,
        cluster.size(),
        devices.len(),
        gbs(seconds),
        single.as_ref().map_or(String::new(), |(t1, _)| format!(
            ", 1 device of rank 0: {t1:8.4} s ({:.0} GB/s), speedup: {:8.2}",
            gbs(*t1),
            t1 / seconds
        ))
    );
    if let Some(h) = halo {
        println!("{}", offload_examples::ranks::describe(&h, offload_examples::ranks::AT_RANK_EDGES));
    }
    println!("result: grid digest {:#018x}", digest(&grid));
    if let Some((_, s)) = single {
        println!("max |ranks - single| = {:e}", max_diff(&s, &grid));
        if s != grid {
            return Err("the ranks' cube differs from the single-process one".into());
        }
    }
    Ok(())
}

/// The run under `mpirun -np N` with `-grid ZxYxX`: the grid of boxes split over the ranks
/// (contiguous runs of parts, at least one a rank), each rank's parts on its devices, the
/// faces between ranks through pinned buffers and MPI; rank 0 compares the gathered cube
/// with a single-process run on its first device (with `-check`, or at small sizes).
#[cfg(feature = "mpi")]
fn grid_across_ranks(
    cluster: &offload::cluster::Cluster,
    args: &Args,
    shape: [usize; 3],
) -> Result<(), Box<dyn std::error::Error>> {
    use offload::partition::GridPartition;
    use offload_examples::ranks::{gather_grid_parts, grid_owners, grid_placement, MpiGrid, RankRun};
    use offload_examples::stencil3d::solve_grid_held;

    let parts = shape.iter().product::<usize>();
    if parts < cluster.size() {
        return Err(format!(
            "a grid of {parts} parts over {} ranks: every rank needs a part",
            cluster.size()
        )
        .into());
    }
    let run = RankRun::start(cluster, args.nz, args.nx * args.ny, args.ndev)?;
    let (rt, devices) = (run.runtime(), &run.devices);
    let owners = grid_owners(parts, cluster.size());
    let placement = grid_placement(&owners, cluster.rank(), devices);
    let part = GridPartition::new(&[args.nz, args.ny, args.nx], &shape, 1)?;
    let across = MpiGrid::new(cluster, rt, &part, &owners, &placement)?;
    run.print_placements(cluster);
    if cluster.is_root() {
        println!(
            "7-point stencil: {} iterations on {} x {} x {} as {} x {} x {} parts across {} ranks, faces between ranks {}",
            args.niter,
            args.nz,
            args.ny,
            args.nx,
            shape[0],
            shape[1],
            shape[2],
            cluster.size(),
            across.engine()
        );
    }
    cluster.barrier();
    let (seconds, mine, halo) = solve_grid_held(rt, &placement, args, shape, &across)?;
    let seconds = cluster.max(seconds);
    let Some(grid) = gather_grid_parts(cluster, &part, &owners, mine)? else { return Ok(()) };
    println!(
        "{}x{}x{}: {parts} parts on {} ranks: {seconds:8.4} s",
        args.nz,
        args.ny,
        args.nx,
        cluster.size()
    );
    if let Some(h) = halo {
        println!(
            "{}",
            offload_examples::ranks::describe(
                &h,
                "between parts, per step and part on rank 0 (layers first)"
            )
        );
    }
    println!("result: grid digest {:#018x}", digest(&grid));
    let small = args.nx * args.ny * args.nz * args.niter <= 64 << 20;
    if args.check || small {
        let (_, single) = solve(rt, &devices[..1], args)?;
        println!("max |ranks - single| = {:e}", max_diff(&single, &grid));
        if digest(&single) != digest(&grid) {
            return Err("the ranks' cube differs from the single-process one".into());
        }
    }
    Ok(())
}
