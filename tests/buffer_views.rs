//! `DeviceBuffer::view`: device memory taken wherever a mapped view is, on every device of
//! every backend: by generated kernels (`&[T]` and `&mut [T]`, whole and sliced), by
//! `Device::gemm` (every operand, alone and mixed with mapped views), with no present-table
//! entry made or needed; a buffer of another device refused; and a model's weights placed
//! from pageable memory through the runtime's staging on GPUs.

use offload::{map, Activation, BackendKind, DeviceBuffer, Error, Gemm, InfoFlags};
use offload_tests::{check, check_eq, on_every_device, on_every_device_with};

#[offload::kernel]
fn axpy(i: usize, a: f32, x: &[f32], y: &mut [f32]) {
    y[i] += a * x[i];
}

#[test]
fn generated_kernels_read_and_write_buffer_views() {
    on_every_device("buffer views in kernels", |rt, d| {
        let dev = rt.device(d)?;
        let x = DeviceBuffer::from_slice(&dev, &[1f32, 2.0, 3.0, 4.0])?;
        let y = DeviceBuffer::from_slice(&dev, &[10f32; 4])?;
        axpy::launch(&dev, 4, 2.0, x.view(), y.view())?;
        check_eq!(y.to_vec()?, vec![12.0, 14.0, 16.0, 18.0]);
        // Part of a buffer; the rest untouched.
        axpy::launch(&dev, 2, 1.0, x.view().slice(2..)?, y.view().slice(..2)?)?;
        check_eq!(y.to_vec()?, vec![15.0, 18.0, 16.0, 18.0]);
        // Mixed with a mapped view of a host slice.
        let host = [100f32; 4];
        dev.data(map::to(&host), |h| axpy::launch(&dev, 4, 1.0, h, y.view()))?;
        check_eq!(y.to_vec()?, vec![115.0, 118.0, 116.0, 118.0]);
        check!(y.view().is_device_resident() && !x.view().is_writable());
        check_eq!(y.view().device_addr(rt)?, Some(y.addr()));
        check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
        Ok(())
    });
}

#[test]
fn gemm_takes_buffer_views_for_every_operand() {
    on_every_device("buffer views in gemm", |rt, d| {
        let dev = rt.device(d)?;
        // Column-major 2 x 3 (A) times 3 x 2 (B), plus a bias, ReLU.
        let (a, b, bias) =
            ([1f32, 0.0, 0.0, 1.0, 1.0, -1.0], [1f32, 2.0, 3.0, -4.0, 0.0, 1.0], [0.5f32, 0.0]);
        let g = Gemm {
            m: 2,
            n: 2,
            k: 3,
            lda: 2,
            ldb: 3,
            ldc: 2,
            activation: Activation::Relu,
            ..Gemm::default()
        };
        let want = vec![4.5f32, 0.0, 0.0, 0.0];
        let (ab, bb, biasb) = (
            DeviceBuffer::from_slice(&dev, &a)?,
            DeviceBuffer::from_slice(&dev, &b)?,
            DeviceBuffer::from_slice(&dev, &bias)?,
        );
        let c = DeviceBuffer::<f32>::new(&dev, 4)?;
        dev.gemm(&g, ab.view(), bb.view(), c.view(), Some(biasb.view()))?;
        check_eq!(c.to_vec()?, want);
        // A mapped, the rest buffers; C a mapped host slice.
        let mut out = [f32::NAN; 4];
        dev.data((map::to(&a), map::from(&mut out)), |(av, cv)| {
            dev.gemm(&g, av, bb.view(), cv, Some(biasb.view()))
        })?;
        check_eq!(out.to_vec(), want);
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn gemm_refuses_a_c_that_is_also_an_input() {
    on_every_device("gemm with C aliasing an input", |rt, d| {
        let dev = rt.device(d)?;
        let x = DeviceBuffer::from_slice(&dev, &[1f32; 4])?;
        let y = DeviceBuffer::from_slice(&dev, &[1f32; 4])?;
        let z = DeviceBuffer::from_slice(&dev, &[0f32; 4])?;
        let g = Gemm { m: 2, n: 2, k: 2, lda: 2, ldb: 2, ldc: 2, ..Gemm::default() };
        for (needle, r) in [
            ("operand 2 (C) overlaps operand 0 (A)", dev.gemm(&g, x.view(), y.view(), x.view(), None)),
            ("operand 2 (C) overlaps operand 1 (B)", dev.gemm(&g, y.view(), x.view(), x.view(), None)),
            (
                "operand 2 (C) overlaps operand 3 (the bias)",
                dev.gemm(&g, x.view(), y.view(), z.view(), Some(z.view().slice(2..)?)),
            ),
        ] {
            match r {
                Err(Error::InvalidArgument { what, .. }) => check!(what.contains(needle), "{needle}: {what}"),
                other => check!(false, "{needle}: expected InvalidArgument, got {other:?}"),
            }
        }
        check_eq!(x.to_vec()?, vec![1.0; 4]);
        // A and B may share memory: both are only read.
        let c = DeviceBuffer::<f32>::new(&dev, 4)?;
        dev.gemm(&g, x.view(), x.view(), c.view(), None)?;
        check_eq!(c.to_vec()?, vec![2.0; 4]);
        Ok(())
    });
}

#[test]
fn a_buffer_of_another_device_is_refused() {
    on_every_device("buffer views of another device", |rt, d| {
        let other = (d + 1) % rt.num_devices().max(1);
        if other == d {
            println!("SKIP buffer views of another device: one device");
            return Ok(());
        }
        let (dev, odev) = (rt.device(d)?, rt.device(other)?);
        let x = DeviceBuffer::from_slice(&odev, &[1f32; 4])?;
        let y = DeviceBuffer::<f32>::new(&dev, 4)?;
        match axpy::launch(&dev, 4, 1.0, x.view(), y.view()) {
            Err(Error::KernelArgument { what, .. }) => {
                check!(what.contains(&format!("device {other}")), "{what}")
            }
            r => check!(false, "expected KernelArgument, got {r:?}"),
        }
        let g = Gemm { m: 2, n: 2, k: 1, lda: 2, ldb: 1, ldc: 2, ..Gemm::default() };
        match dev.gemm(&g, x.view(), y.view(), y.view(), None) {
            Err(Error::InvalidArgument { what, .. }) => {
                check!(
                    what.contains(&format!("operand 0 (A): a view of 4 elements on device {other}")),
                    "{what}"
                )
            }
            r => check!(false, "expected InvalidArgument, got {r:?}"),
        }
        Ok(())
    });
}

#[test]
fn weights_from_pageable_memory_are_staged_into_buffers_on_gpus() {
    let traced = |b: offload::RuntimeBuilder| b.info(InfoFlags::TRANSFERS).capture_info();
    on_every_device_with("weights through staging", traced, |rt, d| {
        let dev = rt.device(d)?;
        // Above the staging threshold (16 MiB): a 2048 x 2048 layer's weights in f32.
        let w: Vec<f32> = (0..2048 * 2048).map(|i| (i % 7) as f32).collect();
        rt.take_info();
        let b = DeviceBuffer::from_slice(&dev, &w)?;
        let lines = rt.take_info();
        let upload = lines.iter().find(|l| l.contains("copy host->device 16777216 bytes"));
        check!(upload.is_some(), "no trace of the upload: {lines:?}");
        let upload = upload.map(String::as_str).unwrap_or_default();
        if rt.describe(d)?.kind == BackendKind::Cuda {
            check!(upload.contains("(staged"), "a 16 MiB pageable upload on a GPU: {upload}");
        } else {
            println!("NOTE weights through staging: device {d} is a host device, whose copies are memcpy: {upload}");
        }
        check_eq!(b.to_vec()?[..8].to_vec(), w[..8].to_vec());
        Ok(())
    });
}
