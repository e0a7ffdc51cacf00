//! The generated kernels of `offload_kernels::generated` on every device of every backend,
//! each against the hand-written kernel it replaces (same device) and the Rust function it
//! is written as (run on the host). Tolerances, per kernel: fill, add, scale, bias + ReLU and
//! the 3-D stencil are exact (the same operations in the same order); saxpy may differ by
//! one rounding (a GPU may fuse `a * x + y` into one FMA): 2^-23 (|a x| + |y|); sum by the order
//! of the additions: `n * 2^-23 * sum(|x|)`. The Jacobi step is checked bit for bit by the
//! examples' solver tests.

use offload::map;
use offload_kernels::generated as g;
use offload_kernels::{BIAS_ACT, FILL_F32, SAXPY, SUM_F32};
use offload_tests::{check, check_eq, on_every_device};

fn data(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0).collect()
}

#[test]
fn element_wise_kernels_match_the_hand_written_ones_and_the_rust_functions() {
    on_every_device("generated element-wise kernels", |rt, d| {
        let gpu = rt.device(d)?;
        let n = 300_007;
        let x = data(n);
        let (mut yg, mut yh) = (data(n), data(n));
        yg.reverse();
        yh.reverse();
        let y0 = yg.clone();
        let (mut ig, mut fg, mut fh) = (vec![3i32; n], vec![0f32; n], vec![0f32; n]);
        gpu.data(
            (
                map::to(&x),
                map::tofrom(&mut yg),
                map::tofrom(&mut yh),
                map::tofrom(&mut ig),
                map::tofrom(&mut fg),
                map::tofrom(&mut fh),
            ),
            |(x, yg, yh, ig, fg, fh)| {
                g::saxpy::launch(&gpu, n, 1.5, x, yg)?;
                gpu.launch(&SAXPY, n, (1.5f32, x, yh))?;
                g::fill_i32::launch(&gpu, n, -4, ig)?;
                g::add_i32::launch(&gpu, 10..n, 9, ig)?;
                g::fill_f32::launch(&gpu, n, 0.75, fg)?;
                g::scale_f32::launch(&gpu, n, 4.0, fg)?;
                gpu.launch(&FILL_F32, n, (3.0f32, fh))
            },
        )?;
        let mut want = y0.clone();
        for i in 0..n {
            g::saxpy(i, 1.5, &x, &mut want);
        }
        // One rounding of `a * x` (the size of its terms, not of the result, bounds it).
        let tol = |i: usize| f32::EPSILON * (1.5 * x[i].abs() + y0[i].abs());
        let close = |a: &[f32], b: &[f32]| (0..n).all(|i| (a[i] - b[i]).abs() <= tol(i));
        check!(close(&yg, &want), "saxpy vs the Rust function");
        check!(close(&yg, &yh), "saxpy vs the hand-written kernel");
        check!(ig[..10].iter().all(|&v| v == -4) && ig[10..].iter().all(|&v| v == 5), "fill_i32 + add_i32");
        check_eq!(fg, fh);
        Ok(())
    });
}

#[test]
fn the_sum_matches_the_hand_written_one_within_its_rounding() {
    on_every_device("generated sum", |rt, d| {
        let gpu = rt.device(d)?;
        let n = (1 << 21) + 5;
        let x = data(n);
        let (mut sg, mut sh) = ([0.25f32], [0.25f32]);
        gpu.data((map::to(&x), map::tofrom(&mut sg), map::tofrom(&mut sh)), |(x, sg, sh)| {
            g::sum_f32::launch(&gpu, n, x, sg)?;
            gpu.launch(&SUM_F32, n, (x, sh))
        })?;
        let want: f64 = 0.25 + x.iter().map(|&v| f64::from(v)).sum::<f64>();
        let tol = n as f64 * f64::from(f32::EPSILON) * x.iter().map(|v| f64::from(v.abs())).sum::<f64>();
        for (what, got) in [("generated", sg[0]), ("hand-written", sh[0])] {
            check!((f64::from(got) - want).abs() <= tol, "{what}: {got} vs {want} (tolerance {tol:e})");
        }
        Ok(())
    });
}

#[test]
fn bias_and_relu_match_the_hand_written_epilogue() {
    on_every_device("generated bias + activation", |rt, d| {
        let gpu = rt.device(d)?;
        let (rows, features) = (333, 96);
        let bias = data(features);
        let y0 = data(rows * features);
        for relu in [false, true] {
            let (mut yg, mut yh) = (y0.clone(), y0.clone());
            gpu.data((map::to(&bias), map::tofrom(&mut yg), map::tofrom(&mut yh)), |(b, yg, yh)| {
                g::bias_act::launch(&gpu, rows * features, features, relu, yg, b)?;
                gpu.launch(&BIAS_ACT, rows * features, (yh, b, features as u64, u32::from(relu)))
            })?;
            check_eq!(yg, yh);
            let mut want = y0.clone();
            for i in 0..rows * features {
                g::bias_act(i, features, relu, &mut want, &bias);
            }
            check_eq!(yg, want);
        }
        Ok(())
    });
}

#[test]
fn the_3d_stencil_matches_the_tuned_one_bit_for_bit() {
    on_every_device("generated 3-D stencil", |rt, d| {
        let gpu = rt.device(d)?;
        let (nz, ny, nx) = (19, 23, 41);
        let a = data(nz * ny * nx);
        let (mut bg, mut bh) = (vec![0f32; a.len()], vec![0f32; a.len()]);
        gpu.data((map::to(&a), map::tofrom(&mut bg), map::tofrom(&mut bh)), |(a, bg, bh)| {
            g::stencil7_step::launch(&gpu, (1..nz - 1, 1..ny - 1, 1..nx - 1), ny, nx, a, bg)?;
            let null = offload::DevicePtr::NULL;
            offload_kernels::stencil::stencil7_step(&gpu, nx, ny, 1, nz - 1, 4, a, bh, null, null)
        })?;
        check_eq!(bg, bh);
        let mut want = vec![0f32; a.len()];
        for z in 1..nz - 1 {
            for y in 1..ny - 1 {
                for x in 1..nx - 1 {
                    g::stencil7_step(z, y, x, ny, nx, &a, &mut want);
                }
            }
        }
        check_eq!(bg, want);
        Ok(())
    });
}

/// `halo::pack` and `halo::unpack` move each face, edge and corner of 2-D and 3-D grids
/// split unevenly (halos 1 and 2) between a part's array and a contiguous buffer on every
/// device, exactly as `GridBox::pack` and `unpack` do on the host, touching nothing else;
/// a buffer or an array of the wrong length, or a region outside the array's box, is
/// refused naming which.
#[test]
fn halo_boxes_pack_and_unpack_every_face_edge_and_corner() {
    use offload::partition::halo;
    use offload::partition::{GridPartition, Reach};
    on_every_device("halo boxes", |rt, d| {
        let dev = rt.device(d)?;
        for (extents, shape, halo_width) in [
            (&[9usize, 11][..], &[2usize, 3][..], 1),
            (&[8, 9, 10][..], &[2, 2, 3][..], 1),
            (&[12, 11][..], &[2, 2][..], 2),
        ] {
            let g = GridPartition::new(extents, shape, halo_width)?;
            for p in 0..g.parts() {
                let mapped = g.mapped(p);
                let local: Vec<f64> = (0..mapped.len()).map(|i| i as f64 * 0.5 + p as f64).collect();
                for e in g.exchanges(p, Reach::Corners) {
                    let mut packed = vec![f64::NAN; e.recv.len()];
                    dev.data((map::to(&local), map::from(&mut packed)), |(src, dst)| {
                        halo::pack(&dev, &e.recv, &mapped, src, dst)
                    })?;
                    let mut want = vec![0f64; e.recv.len()];
                    e.recv.pack(&mapped, &local, &mut want);
                    check!(
                        packed == want,
                        "{extents:?} part {p}: {} {:?}: {packed:?} vs {want:?}",
                        e.kind(),
                        e.direction
                    );
                    let mut back = vec![-1f64; mapped.len()];
                    dev.data((map::to(&packed), map::tofrom(&mut back)), |(src, dst)| {
                        halo::unpack(&dev, &e.recv, &mapped, src, dst)
                    })?;
                    let mut want = vec![-1f64; mapped.len()];
                    e.recv.unpack(&mapped, &packed, &mut want);
                    check!(back == want, "{extents:?} part {p}: {} {:?} unpacked", e.kind(), e.direction);
                }
            }
        }
        let g = GridPartition::new(&[6, 6], &[2, 2], 1)?;
        let (mapped, face) = (g.mapped(0), g.exchanges(0, Reach::Faces).next().map(|e| e.recv));
        let face =
            face.ok_or_else(|| offload::Error::InvalidArgument { routine: "test", what: "no face".into() })?;
        let (array, mut short, mut buffer) =
            (vec![1f32; mapped.len()], vec![0f32; face.len() - 1], vec![0f32; face.len()]);
        let refused = |r: offload::Result<()>, what: &str| -> offload::Result<()> {
            match r {
                Err(offload::Error::InvalidArgument { what: w, .. }) => check!(w.contains(what), "{w}"),
                other => check!(false, "expected InvalidArgument ({what}), got {other:?}"),
            }
            Ok(())
        };
        let r = dev
            .data((map::to(&array), map::from(&mut short)), |(a, b)| halo::pack(&dev, &face, &mapped, a, b));
        refused(r, "the buffer holds 1 elements")?;
        let r = dev.data((map::to(&array[1..]), map::from(&mut buffer)), |(a, b)| {
            halo::pack(&dev, &face, &mapped, a, b)
        });
        refused(r, "the array holds 15 elements")?;
        let r = dev.data((map::to(&array), map::from(&mut buffer)), |(a, b)| {
            halo::pack(&dev, &g.mapped(3), &mapped, a, b)
        });
        refused(r, "is not a box inside")?;
        // An empty region copies nothing, wherever it lies.
        let (empty, mut none) = (offload::partition::GridBox::new(&[0..0, 9..9]), Vec::<f32>::new());
        dev.data((map::to(&array), map::from(&mut none)), |(a, b)| halo::pack(&dev, &empty, &mapped, a, b))?;
        Ok(())
    });
}

#[test]
fn every_halo_kernel_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc("halo", &offload::partition::halo::all());
}
