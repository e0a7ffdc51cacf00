//! The examples' solvers at small sizes, on every backend present: the multi-device grid
//! equals the single-device one bit for bit, and the single-device one equals the CPU
//! reference.

use offload_examples::{jacobi, stencil3d};
use offload_tests::{check, on_every_backend};

#[test]
fn jacobi_multi_device_equals_single_device_and_the_cpu() {
    for peer_stores in [true, false] {
        let args = jacobi::Args { nx: 70, ny: 45, niter: 23, peer_stores, ..Default::default() };
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
