//! Multi-device 2-D Jacobi, the port of NVIDIA's multi-GPU Jacobi (the
//! `multi-gpu-programming-models` suite): the same grid, boundary conditions (sine on the
//! left and right columns, periodic top and bottom), norm and command line. It runs on one
//! device, then on all, and prints single time, multi time, speedup and efficiency; the
//! multi-device result must equal the single-device one bit for bit, and at small sizes a
//! CPU reference too.
//!
//! ```text
//! cargo run --release -p offload-examples --example jacobi -- -nx 16384 -ny 16384 -niter 1000
//! ```
//! Options: `-niter N` (1000), `-nccheck N` (norm every N iterations, 1), `-nx N`, `-ny N`
//! (16384), `-csv`, `-ndev N` (all), `-rows N` (rows per GPU thread, 16),
//! `-halo peer|memcpy` (peer stores from the kernel, or `target_memcpy` after it),
//! `-kernel generated|teams|tuned` (the `#[offload::kernel]` step, its teams form, or the hand-written one: tuned,
//! the default), `-grid RxC` (the multi-device run split into R bands of rows by C bands
//! of columns, part p on device p mod the devices, instead of by rows), `-check`
//! (force the CPU reference). Without GPUs it runs on host devices (two unless
//! `OFFLOAD_HOST_DEVICES` says otherwise).

use offload_examples::jacobi::{
    digest, max_diff, reference, solve, solve_grid, solve_grid_held, Args, KernelChoice,
};
use offload_examples::options::Options;
use offload_examples::ranks::grid_in_process;
use offload_examples::{example_devices, example_runtime};

const USAGE: &str = "jacobi [-niter N] [-nccheck N] [-nx N] [-ny N] [-csv] [-ndev N] [-rows N] [-halo peer|memcpy] [-kernel generated|teams|tuned] [-grid RxC] [-check]";

fn parse() -> Result<Args, String> {
    let o = Options::parse(&["csv", "check"])?;
    o.only(
        &["niter", "nccheck", "nx", "ny", "csv", "ndev", "rows", "halo", "kernel", "grid", "check"],
        USAGE,
    )?;
    let d = Args::default();
    let kernels = [
        ("generated", KernelChoice::Generated),
        ("tuned", KernelChoice::Tuned),
        ("teams", KernelChoice::Teams),
    ];
    let a = Args {
        niter: o.num("niter", d.niter)?,
        nccheck: o.num("nccheck", d.nccheck)?.max(1),
        nx: o.num("nx", d.nx)?,
        ny: o.num("ny", d.ny)?,
        csv: o.has("csv"),
        ndev: o.num_opt("ndev")?,
        rows: o.num("rows", d.rows)?.max(1),
        peer_stores: o.choice("halo", &[("peer", true), ("memcpy", false)], d.peer_stores)?,
        check: o.has("check"),
        kernel: o.choice("kernel", &kernels, d.kernel)?,
        grid: o.grid("grid")?,
    };
    if a.nx < 3 || a.ny < 3 {
        return Err("-nx and -ny must be at least 3".into());
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
        println!(
            "Jacobi relaxation: {} iterations on {} x {} mesh, norm every {} iterations, {} kernel, {} halo exchange",
            args.niter,
            args.ny,
            args.nx,
            args.nccheck,
            kernel_name(args.kernel),
            if args.kernel != KernelChoice::Tuned {
                "in-kernel (1 device) / target_memcpy"
            } else if args.peer_stores {
                "peer-store"
            } else {
                "target_memcpy"
            }
        );
        println!("Single device:");
    }
    let single = solve(&rt, &devices[..1], &args)?;
    if !args.csv {
        match args.grid {
            Some([r, c]) => println!("Num devices: {}, a grid of {r} x {c} parts.", devices.len()),
            None => println!("Num devices: {}.", devices.len()),
        }
    }
    let multi = match args.grid {
        Some(shape) => match grid_in_process(&rt, &devices, shape[0] * shape[1], args.csv) {
            Some((across, placement)) => solve_grid_held(&rt, &placement, &args, shape, &across)?,
            None => solve_grid(&rt, &devices, &args, shape)?,
        },
        None => solve(&rt, &devices, &args)?,
    };
    let diff = max_diff(&single.grid, &multi.grid, args.nx, args.ny);
    let mut ok = diff == 0.0;
    let small = args.nx * args.ny * args.niter <= 64 << 20;
    let cpu = (args.check || small).then(|| max_diff(&reference(&args), &single.grid, args.nx, args.ny));
    if let Some(d) = cpu {
        ok &= d <= 1e-6;
    }
    let (t1, tn, n) = (single.seconds, multi.seconds, devices.len());
    if args.csv {
        println!(
            "offload-{}, {}, {}, {}, {}, {n}, {t1:.6}, {tn:.6}",
            kernel_name(args.kernel),
            args.nx,
            args.ny,
            args.niter,
            args.nccheck
        );
    } else {
        println!(
            "{}x{}: 1 device: {t1:8.4} s, {n} devices: {tn:8.4} s, speedup: {:8.2}, efficiency: {:8.2}",
            args.ny,
            args.nx,
            t1 / tn,
            t1 / (n as f64 * tn) * 100.0
        );
        println!(
            "final norm: single {:.6}, multi {:.6}; max |multi - single| = {diff:e}{}",
            single.norm,
            multi.norm,
            cpu.map_or(String::new(), |d| format!("; max |single - cpu| = {d:e}"))
        );
        if let Some(h) = multi.halo {
            println!("{}", offload_examples::ranks::describe(&h, offload_examples::ranks::AT_GRID_LAYERS));
        }
    }
    println!("result: norm {:.6}, grid digest {:#018x}", multi.norm, digest(&multi.grid, args.nx, args.ny));
    if !ok {
        return Err("results differ".into());
    }
    Ok(())
}

/// The run under `mpirun -np N`: the grid's rows split over the ranks, each rank's slab
/// over its own devices, halos between ranks by MPI while the interior updates; rank 0
/// prints, and with `-check` (or at small sizes) compares the gathered grid with a
/// single-process run on its first device, bit for bit.
#[cfg(feature = "mpi")]
fn across_ranks(cluster: &offload::cluster::Cluster, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use offload_examples::jacobi::solve_slab;
    use offload_examples::ranks::{gather_grid, MpiEdges, RankRun};

    if let Some(shape) = args.grid {
        return grid_across_ranks(cluster, args, shape);
    }
    let run = RankRun::start(cluster, args.ny, args.nx, args.ndev)?;
    let (rt, devices) = (run.runtime(), &run.devices);
    let edges = MpiEdges::new(cluster, rt, devices, &run.slab, true)?;
    run.print_placements(cluster);
    if cluster.is_root() {
        println!(
            "Jacobi relaxation: {} iterations on {} x {} mesh across {} ranks, norm every {} iterations, {} kernel, halos between ranks {}",
            args.niter,
            args.ny,
            args.nx,
            cluster.size(),
            args.nccheck,
            kernel_name(args.kernel),
            if edges.direct() { "device to device (CUDA-aware MPI)" } else { "through pinned host buffers" }
        );
    }
    cluster.barrier();
    let out = solve_slab(rt, devices, args, run.rows.clone(), Some(&edges))?;
    let seconds = cluster.max(out.seconds);
    let Some(grid) = gather_grid(cluster, &run.ranks, &out.grid)? else { return Ok(()) };
    let small = args.nx * args.ny * args.niter <= 64 << 20;
    let single = (args.check || small).then(|| solve(rt, &devices[..1], args)).transpose()?;
    println!(
        "{}x{}: {} ranks x {} devices: {seconds:8.4} s{}",
        args.ny,
        args.nx,
        cluster.size(),
        devices.len(),
        single.as_ref().map_or(String::new(), |s| format!(
            ", 1 device of rank 0: {:8.4} s, speedup: {:8.2}",
            s.seconds,
            s.seconds / seconds
        ))
    );
    if let Some(h) = out.halo {
        println!("{}", offload_examples::ranks::describe(&h, offload_examples::ranks::AT_RANK_EDGES));
    }
    println!("result: norm {:.6}, grid digest {:#018x}", out.norm, digest(&grid, args.nx, args.ny));
    if let Some(s) = single {
        let diff = max_diff(&s.grid, &grid, args.nx, args.ny);
        let same = s.grid[args.nx..(args.ny - 1) * args.nx] == grid[args.nx..(args.ny - 1) * args.nx];
        println!("final norm: single {:.6}, ranks {:.6}; max |ranks - single| = {diff:e}", s.norm, out.norm);
        if !same {
            return Err("the ranks' grid differs from the single-process one".into());
        }
    }
    Ok(())
}

/// The run under `mpirun -np N` with `-grid RxC`: the grid of parts split over the ranks
/// (contiguous runs of parts, at least one a rank), each rank's parts on its devices, the
/// faces between ranks through pinned buffers and MPI; rank 0 prints, and with `-check`
/// (or at small sizes) compares the gathered grid with a single-process run on its first
/// device, bit for bit.
#[cfg(feature = "mpi")]
fn grid_across_ranks(
    cluster: &offload::cluster::Cluster,
    args: &Args,
    shape: [usize; 2],
) -> Result<(), Box<dyn std::error::Error>> {
    use offload::partition::GridPartition;
    use offload_examples::jacobi::solve_grid_held;
    use offload_examples::ranks::{gather_grid_parts, grid_owners, grid_placement, MpiGrid, RankRun};

    let parts = shape[0] * shape[1];
    if parts < cluster.size() {
        return Err(format!(
            "a grid of {parts} parts over {} ranks: every rank needs a part",
            cluster.size()
        )
        .into());
    }
    let run = RankRun::start(cluster, args.ny, args.nx, args.ndev)?;
    let (rt, devices) = (run.runtime(), &run.devices);
    let owners = grid_owners(parts, cluster.size());
    let placement = grid_placement(&owners, cluster.rank(), devices);
    let part = GridPartition::new(&[args.ny, args.nx], &shape, 1)?.with_periodic(&[true, false])?;
    let across = MpiGrid::new(cluster, rt, &part, &owners, &placement)?;
    run.print_placements(cluster);
    if cluster.is_root() {
        println!(
            "Jacobi relaxation: {} iterations on {} x {} mesh as {} x {} parts across {} ranks, norm every {} iterations, {} kernel, faces between ranks {}",
            args.niter,
            args.ny,
            args.nx,
            shape[0],
            shape[1],
            cluster.size(),
            args.nccheck,
            kernel_name(args.kernel),
            across.engine()
        );
    }
    cluster.barrier();
    let out = solve_grid_held(rt, &placement, args, shape, &across)?;
    let seconds = cluster.max(out.seconds);
    let Some(grid) = gather_grid_parts(cluster, &part, &owners, out.grid)? else { return Ok(()) };
    let small = args.nx * args.ny * args.niter <= 64 << 20;
    let single = (args.check || small).then(|| solve(rt, &devices[..1], args)).transpose()?;
    println!(
        "{}x{}: {} x {} parts on {} ranks: {seconds:8.4} s",
        args.ny,
        args.nx,
        shape[0],
        shape[1],
        cluster.size()
    );
    if let Some(h) = out.halo {
        println!(
            "{}",
            offload_examples::ranks::describe(
                &h,
                "between parts, per step and part on rank 0 (layers first)"
            )
        );
    }
    println!("result: norm {:.6}, grid digest {:#018x}", out.norm, digest(&grid, args.nx, args.ny));
    if let Some(s) = single {
        let diff = max_diff(&s.grid, &grid, args.nx, args.ny);
        println!("final norm: single {:.6}, ranks {:.6}; max |ranks - single| = {diff:e}", s.norm, out.norm);
        if digest(&s.grid, args.nx, args.ny) != digest(&grid, args.nx, args.ny) {
            return Err("the ranks' grid differs from the single-process one".into());
        }
    }
    Ok(())
}

/// The name `-kernel` takes for `k`.
fn kernel_name(k: KernelChoice) -> &'static str {
    match k {
        KernelChoice::Generated => "generated",
        KernelChoice::Teams => "teams",
        KernelChoice::Tuned => "tuned",
    }
}
