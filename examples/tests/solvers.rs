//! The examples' solvers at small sizes, on every backend present: the multi-device grid
//! equals the single-device one bit for bit, and the single-device one equals the CPU
//! reference.

use offload_examples::jacobi::KernelChoice;
use offload_examples::{jacobi, stencil3d};
use offload_tests::{check, on_every_backend, on_every_device};

#[test]
fn jacobi_multi_device_equals_single_device_and_the_cpu() {
    for (kernel, peer_stores) in
        [(KernelChoice::Tuned, true), (KernelChoice::Tuned, false), (KernelChoice::Generated, true)]
    {
        let args = jacobi::Args { nx: 70, ny: 45, niter: 23, peer_stores, kernel, ..Default::default() };
        let cpu = jacobi::reference(&args);
        on_every_backend(
            "jacobi",
            2,
            |b| b,
            |rt| {
                let devices: Vec<usize> = (0..rt.num_devices()).collect();
                let single = jacobi::solve(rt, &devices[..1], &args)?;
                let multi = jacobi::solve(rt, &devices, &args)?;
                check!(
                    jacobi::max_diff(&single.grid, &multi.grid, args.nx, args.ny) == 0.0,
                    "multi != single"
                );
                check!(jacobi::max_diff(&cpu, &single.grid, args.nx, args.ny) == 0.0, "single != cpu");
                check!(
                    (single.norm - multi.norm).abs() <= 1e-6 * single.norm.max(1.0),
                    "norms {} {}",
                    single.norm,
                    multi.norm
                );
                check!(rt.live_mappings().is_empty(), "mappings left");
                Ok(())
            },
        );
    }
}

#[test]
fn jacobi_generated_and_tuned_kernels_give_the_same_grid_on_each_device() {
    let args = |kernel| jacobi::Args { nx: 131, ny: 77, niter: 31, kernel, ..Default::default() };
    let cpu = jacobi::reference(&args(KernelChoice::Tuned));
    on_every_device("jacobi, generated vs tuned kernel", |rt, d| {
        let tuned = jacobi::solve(rt, &[d], &args(KernelChoice::Tuned))?;
        let generated = jacobi::solve(rt, &[d], &args(KernelChoice::Generated))?;
        let (nx, ny) = (131, 77);
        check!(jacobi::max_diff(&cpu, &tuned.grid, nx, ny) == 0.0, "tuned != cpu");
        check!(jacobi::max_diff(&cpu, &generated.grid, nx, ny) == 0.0, "generated != cpu");
        // The norms sum the same squares in another order.
        check!(
            (tuned.norm - generated.norm).abs() <= 1e-5 * tuned.norm,
            "norms {} {}",
            tuned.norm,
            generated.norm
        );
        Ok(())
    });
}

#[test]
fn stencil3d_multi_device_equals_single_device_and_the_cpu() {
    for peer_stores in [true, false] {
        let args = stencil3d::Args { nx: 19, ny: 13, nz: 11, niter: 7, peer_stores, ..Default::default() };
        let cpu = stencil3d::reference(&args);
        on_every_backend(
            "stencil3d",
            2,
            |b| b,
            |rt| {
                let devices: Vec<usize> = (0..rt.num_devices()).collect();
                let (_, single) = stencil3d::solve(rt, &devices[..1], &args)?;
                let (_, multi) = stencil3d::solve(rt, &devices, &args)?;
                check!(stencil3d::max_diff(&single, &multi) == 0.0, "multi != single");
                check!(stencil3d::max_diff(&cpu, &single) == 0.0, "single != cpu");
                check!(rt.live_mappings().is_empty(), "mappings left");
                Ok(())
            },
        );
    }
}

/// Jacobi split as a grid of parts (2 x 2, 1 x 3, 3 x 1 and 1 x 1, parts sharing devices
/// where there are more parts than devices), with each kernel: the grid equals the
/// single-device run's bit for bit (periodic rows exchanged across the wrap, columns
/// across faces), the generated kernel's layers computed first and its inner boxes beside
/// the exchange.
#[test]
fn jacobi_on_grids_of_parts_equals_single_device() {
    let args = |kernel| jacobi::Args { nx: 70, ny: 45, niter: 23, kernel, ..Default::default() };
    let cpu = jacobi::reference(&args(KernelChoice::Generated));
    on_every_backend(
        "jacobi on grids",
        2,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            for kernel in [KernelChoice::Generated, KernelChoice::Tuned, KernelChoice::Teams] {
                let single = jacobi::solve(rt, &devices[..1], &args(kernel))?;
                check!(jacobi::max_diff(&cpu, &single.grid, 70, 45) == 0.0, "{kernel:?}: single != cpu");
                for shape in [[2, 2], [1, 3], [3, 1], [1, 1]] {
                    let grid = jacobi::solve_grid(rt, &devices, &args(kernel), shape)?;
                    check!(
                        jacobi::digest(&grid.grid, 70, 45) == jacobi::digest(&single.grid, 70, 45),
                        "{kernel:?} on {shape:?}: max |grid - single| = {}",
                        jacobi::max_diff(&grid.grid, &single.grid, 70, 45)
                    );
                    check!(
                        (single.norm - grid.norm).abs() <= 1e-5 * single.norm.max(1.0),
                        "{kernel:?} on {shape:?}: norms {} {}",
                        single.norm,
                        grid.norm
                    );
                    // The generated kernel's layers go first, its inner boxes beside the
                    // exchange (timed); the others' whole boxes before it.
                    check!(
                        grid.halo.is_some() == (kernel == KernelChoice::Generated),
                        "{kernel:?} on {shape:?}: halo times {:?}",
                        grid.halo
                    );
                }
            }
            Ok(())
        },
    );
}

/// The 3-D stencil split as a grid of boxes (2 x 2 x 2, 1 x 2 x 3, 3 x 1 x 1), parts
/// sharing devices: the cube equals the single-device run's bit for bit.
#[test]
fn stencil3d_on_grids_of_parts_equals_single_device() {
    let args = stencil3d::Args { nx: 19, ny: 13, nz: 11, niter: 7, ..Default::default() };
    on_every_backend(
        "stencil3d on grids",
        2,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let (_, single) = stencil3d::solve(rt, &devices[..1], &args)?;
            for shape in [[2, 2, 2], [1, 2, 3], [3, 1, 1]] {
                let (_, grid, halo) = stencil3d::solve_grid(rt, &devices, &args, shape)?;
                check!(stencil3d::digest(&grid) == stencil3d::digest(&single), "{shape:?}: grid != single");
                // The layers went first and the inner boxes ran beside the exchange: timed.
                check!(halo.is_some(), "{shape:?}: no halo times");
            }
            Ok(())
        },
    );
}

/// Both solvers with NCCL moving every region (one thread over the parts, as a rank runs
/// them), on each backend where an NCCL communicator can be made over its devices (CUDA
/// GPUs with NCCL loadable): Jacobi on 2 x 2 and the stencil on 2 x 2 x 2 give the
/// single-device grids bit for bit, and Jacobi's norm (summed on the devices by NCCL) the
/// single device's. Where none can be made, the case says why it skips.
#[test]
fn grids_over_nccl_equal_single_device() {
    let jargs =
        jacobi::Args { nx: 70, ny: 45, niter: 9, kernel: KernelChoice::Generated, ..Default::default() };
    let sargs = stencil3d::Args { nx: 19, ny: 13, nz: 11, niter: 7, ..Default::default() };
    on_every_backend(
        "grids over NCCL",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            // Made here rather than by OFFLOAD_HALO (which `nccl_in_process` reads).
            let across = match offload::collective::NcclComm::of_devices(rt, &devices) {
                Ok(c) => offload_examples::ranks::NcclInProcess(c),
                Err(e) => {
                    println!("SKIP grids over NCCL on these devices: {e}");
                    return Ok(());
                }
            };
            let single = jacobi::solve(rt, &devices[..1], &jargs)?;
            let place =
                |parts: usize| (0..parts).map(|p| Some(devices[p % devices.len()])).collect::<Vec<_>>();
            let grid = jacobi::solve_grid_held(rt, &place(4), &jargs, [2, 2], &across)?;
            check!(
                jacobi::digest(&grid.grid, 70, 45) == jacobi::digest(&single.grid, 70, 45),
                "jacobi 2x2 over NCCL: max |grid - single| = {}",
                jacobi::max_diff(&grid.grid, &single.grid, 70, 45)
            );
            // The norm summed on the devices by ncclAllReduce: the same squares in another order.
            check!(
                (single.norm - grid.norm).abs() <= 1e-5 * single.norm.max(1.0),
                "jacobi 2x2 over NCCL: norms {} {}",
                single.norm,
                grid.norm
            );
            let (_, s1) = stencil3d::solve(rt, &devices[..1], &sargs)?;
            let (_, cube, _) = stencil3d::solve_grid_held(rt, &place(8), &sargs, [2, 2, 2], &across)?;
            check!(stencil3d::digest(&cube) == stencil3d::digest(&s1), "stencil 2x2x2 over NCCL != single");
            Ok(())
        },
    );
}

#[test]
fn inference_pipeline_matches_the_cpu_and_the_serial_run() {
    use offload_examples::inference::{check, uniform, Deployment, Mlp};
    let (width, rows, batches) = (48, 20, 9);
    let model = Mlp::new(3, width);
    let inputs: Vec<Vec<f32>> = (0..batches).map(|b| uniform(7 + b as u64, rows * width)).collect();
    on_every_backend(
        "inference",
        1,
        |b| b,
        |rt| {
            let devices: Vec<usize> = (0..rt.num_devices()).collect();
            let d = Deployment::new(rt, &model, &devices, rows)?;
            let mut out = vec![vec![0f32; rows * width]; batches];
            let mut serial = vec![vec![0f32; rows * width]; batches];
            let report = d.run(&inputs, &mut out, 2, |_| {})?;
            d.run_serially(&inputs, &mut serial)?;
            check!(report.batches_per_device.iter().sum::<usize>() == batches);
            let all: Vec<usize> = (0..batches).collect();
            let every_row: Vec<usize> = (0..rows).collect();
            let (err, n) = check(&model, &inputs, &out, &all, &every_row);
            check!(n == batches * rows && err < 1e-5, "relative error {err:e}");
            let (err, _) = check(&model, &inputs, &serial, &all, &every_row);
            check!(err < 1e-5, "serial relative error {err:e}");
            Ok(())
        },
    );
}

#[test]
fn staged_inference_matches_the_cpu_and_the_whole_model_pipeline() {
    use offload_examples::inference::{check, uniform, Deployment, Mlp, StagedDeployment};
    let (width, rows, batches) = (32, 12, 7);
    let model = Mlp::new(4, width);
    let inputs: Vec<Vec<f32>> = (0..batches).map(|b| uniform(11 + b as u64, rows * width)).collect();
    on_every_backend(
        "staged inference",
        1,
        |b| b,
        |rt| {
            let n = rt.num_devices();
            let mut whole = vec![vec![0f32; rows * width]; batches];
            Deployment::new(rt, &model, &[0], rows)?.run(&inputs, &mut whole, 2, |_| {})?;
            // Two stages over two devices (or one), and four stages over them in turn.
            for stage_devices in [vec![0, 1 % n], vec![0, 1 % n, 0, 1 % n]] {
                let mut out = vec![vec![0f32; rows * width]; batches];
                let staged =
                    StagedDeployment::new(rt, &model, &stage_devices, rows, offload::Precision::Fp32)?;
                let report = staged.run(&inputs, &mut out, 3)?;
                check!(report.micro_batches == batches);
                let all: Vec<usize> = (0..batches).collect();
                let every_row: Vec<usize> = (0..rows).collect();
                let (err, _) = check(&model, &inputs, &out, &all, &every_row);
                check!(err < 1e-5, "{stage_devices:?}: relative error {err:e}");
                // The same GEMMs in the same order as the whole model's (the same bits on host
                // devices; a GPU's library may pick another algorithm).
                let diff = out
                    .iter()
                    .flatten()
                    .zip(whole.iter().flatten())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                check!(diff <= 1e-5, "{stage_devices:?}: {diff} from the whole-model pipeline");
            }
            let e = StagedDeployment::<f32>::new(rt, &model, &[0; 5], rows, offload::Precision::Fp32)
                .err()
                .map(|e| e.to_string());
            check!(e.is_some_and(|e| e.contains("5 stages for 4 layers")));
            Ok(())
        },
    );
}

/// Eight devices, as on the 8-GPU machines not lent here: host devices stand in for them.
#[test]
fn eight_host_devices_run_every_solver_and_the_pipeline() {
    use offload_examples::inference::{check as check_mlp, uniform, Deployment, Mlp};
    let rt = offload::Runtime::builder().env(|_| None).gpus(false).host_devices(8).build().expect("runtime");
    let devices: Vec<usize> = (0..8).collect();
    let args = jacobi::Args { nx: 40, ny: 43, niter: 9, ..Default::default() };
    let single = jacobi::solve(&rt, &devices[..1], &args).expect("jacobi 1");
    let multi = jacobi::solve(&rt, &devices, &args).expect("jacobi 8");
    assert_eq!(jacobi::max_diff(&single.grid, &multi.grid, args.nx, args.ny), 0.0);
    let args = stencil3d::Args { nx: 9, ny: 8, nz: 21, niter: 5, ..Default::default() };
    let (_, s1) = stencil3d::solve(&rt, &devices[..1], &args).expect("stencil 1");
    let (_, s8) = stencil3d::solve(&rt, &devices, &args).expect("stencil 8");
    assert_eq!(stencil3d::max_diff(&s1, &s8), 0.0);
    // Grids of parts, a device a part: Jacobi on 2 x 2 host devices, the stencil on 2 x 2 x 2.
    let (_, grid, _) = stencil3d::solve_grid(&rt, &devices, &args, [2, 2, 2]).expect("stencil 2x2x2");
    assert_eq!(stencil3d::digest(&grid), stencil3d::digest(&s1));
    let args = jacobi::Args { nx: 40, ny: 43, niter: 9, ..Default::default() };
    let single = jacobi::solve(&rt, &devices[..1], &args).expect("jacobi 1");
    let grid = jacobi::solve_grid(&rt, &devices[..4], &args, [2, 2]).expect("jacobi 2x2");
    assert_eq!(jacobi::digest(&grid.grid, 40, 43), jacobi::digest(&single.grid, 40, 43));
    let model = Mlp::new(2, 16);
    let inputs: Vec<Vec<f32>> = (0..32).map(|b| uniform(b, 8 * 16)).collect();
    let mut out = vec![vec![0f32; 8 * 16]; 32];
    let report = Deployment::new(&rt, &model, &devices, 8)
        .expect("deploy")
        .run(&inputs, &mut out, 2, |_| {})
        .expect("run");
    assert_eq!(report.batches_per_device.len(), 8);
    // Work stealing: how many each device takes depends on timing; all are done, spread out.
    assert_eq!(report.batches_per_device.iter().sum::<usize>(), 32);
    assert!(
        report.batches_per_device.iter().filter(|&&n| n > 0).count() >= 2,
        "{:?}",
        report.batches_per_device
    );
    let all: Vec<usize> = (0..32).collect();
    assert!(check_mlp(&model, &inputs, &out, &all, &[0, 7]).0 < 1e-5);
    assert!(rt.live_mappings().is_empty());
}
