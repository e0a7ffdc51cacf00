//! Cases 32-36: `target_alloc`/`target_free`, `target_memcpy`, `target_memset`, and
//! `target_memcpy_rect` in two and three dimensions between the host and a device and
//! between two devices.

use offload::{Error, LaunchArg, RectSide, Result, Runtime, Scalar};
use offload_kernels::{ADD_I32, FILL_I32};
use offload_tests::{
    assert_clean, check, check_eq, fails, on_every_backend, on_every_device, read_device, write_device,
};

/// Launches `kernel(v, p)` over `n` elements of the raw device pointer `p`.
fn launch_raw(rt: &Runtime, dev: usize, kernel: &offload::Kernel, v: i32, p: u64, n: usize) -> Result<()> {
    let args = [LaunchArg::Value(Scalar::I32(v)), LaunchArg::Device(p)];
    // SAFETY: the callers pass allocations of `dev` holding at least `n` i32.
    unsafe { rt.target_launch(dev, kernel, n, &[], &args) }
}

#[test]
fn case_32_target_alloc_and_free() {
    on_every_device("case 32", |rt, dev| {
        let init = rt.initial_device();
        check_eq!(rt.target_alloc(0, dev)?, 0);
        check_eq!(rt.target_alloc(0, init)?, 0);
        check_eq!(rt.pool_usage(dev)?.live_allocations, 0);

        // On a device: a live allocation until freed.
        let p = rt.target_alloc(256, dev)?;
        check!(p != 0);
        check_eq!(rt.pool_usage(dev)?.live_allocations, 1);
        launch_raw(rt, dev, &FILL_I32, 11, p, 64)?;
        check_eq!(read_device::<i32>(rt, p, 64, dev)?, vec![11; 64]);

        // On the initial device: plain host memory, usable directly and by memcpy.
        let n = 64;
        let h = rt.target_alloc(n * 4, init)?;
        check!(h != 0);
        check_eq!(h % 4, 0);
        // Host memory is not taken from the device.
        check_eq!(rt.pool_usage(dev)?.live_allocations, 1);
        // SAFETY: `h` is a fresh host allocation of `n` i32 (all bit patterns are valid).
        let host = unsafe { std::slice::from_raw_parts_mut(h as usize as *mut i32, n) };
        host.iter_mut().enumerate().for_each(|(i, v)| *v = i as i32);
        // A kernel on the initial device works on that host memory itself.
        launch_raw(rt, init, &ADD_I32, 100, h, n)?;
        check!(host.iter().enumerate().all(|(i, &v)| v == i as i32 + 100), "{host:?}");
        // memcpy between the two kinds of allocation.
        // SAFETY: both allocations hold `n` i32.
        unsafe { rt.target_memcpy(p, h, n * 4, 0, 0, dev, init)? };
        check_eq!(read_device::<i32>(rt, p, n, dev)?, (100..100 + n as i32).collect::<Vec<_>>());
        // `read_device` from the initial device reads host memory.
        check_eq!(read_device::<i32>(rt, h, 2, init)?, vec![100, 101]);
        // SAFETY: nothing uses `h` after this.
        unsafe { rt.target_free(h, init)? };
        // SAFETY: `h` is already freed: the runtime must refuse rather than free twice.
        let e = fails(unsafe { rt.target_free(h, init) }, "double free on the initial device")?;
        check!(
            matches!(e, Error::UnknownDevicePointer { device, addr, .. } if device == init && addr == h),
            "{e:?}"
        );

        // Null is a no-op on every device.
        // SAFETY: null is never dereferenced.
        unsafe {
            rt.target_free(0, dev)?;
            rt.target_free(0, init)?;
        }
        // A pointer inside (not at the start of) an allocation is not an allocation.
        // SAFETY: expected to fail without freeing anything.
        let e = fails(unsafe { rt.target_free(p + 4, dev) }, "free of an interior pointer")?;
        check!(matches!(e, Error::UnknownDevicePointer { device, .. } if device == dev), "{e:?}");
        check_eq!(rt.pool_usage(dev)?.live_allocations, 1);
        // SAFETY: nothing uses `p` after this.
        unsafe { rt.target_free(p, dev)? };
        // SAFETY: as above, freed already.
        let e = fails(unsafe { rt.target_free(p, dev) }, "double free on a device")?;
        check!(matches!(e, Error::UnknownDevicePointer { .. }), "{e:?}");
        // A device that does not exist.
        check!(matches!(
            fails(rt.target_alloc(4, init + 1), "alloc on no device")?,
            Error::NoSuchDevice { .. }
        ));
        assert_clean(rt, dev)
    });
}

#[test]
fn case_33_threads_allocate_launch_and_free() {
    on_every_device("case 33", |rt, dev| {
        const THREADS: usize = 16;
        // 4 B, 8 B, ..., 32 KiB.
        let sizes: Vec<usize> = (2..=15).map(|k| 1usize << k).collect();
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let sizes = &sizes;
                    s.spawn(move || -> Result<()> {
                        for round in 0..4 {
                            // All sizes live at once, in a thread-dependent order.
                            let mut order = sizes.clone();
                            order.rotate_left((t + round) % sizes.len());
                            let mut live = Vec::new();
                            for &bytes in &order {
                                let p = rt.target_alloc(bytes, dev)?;
                                check!(p != 0, "thread {t}: null for {bytes} bytes");
                                live.push((p, bytes));
                            }
                            for (k, &(p, bytes)) in live.iter().enumerate() {
                                let v = (t * 1000 + round * 100 + k) as i32;
                                launch_raw(rt, dev, &FILL_I32, v, p, bytes / 4)?;
                                launch_raw(rt, dev, &ADD_I32, 1, p, bytes / 4)?;
                            }
                            for (k, &(p, bytes)) in live.iter().enumerate() {
                                let v = (t * 1000 + round * 100 + k) as i32 + 1;
                                let got = read_device::<i32>(rt, p, bytes / 4, dev)?;
                                check!(
                                    got.iter().all(|&g| g == v),
                                    "thread {t}: {bytes} bytes: want {v}, got {got:?}"
                                );
                            }
                            for (p, _) in live {
                                // SAFETY: every launch on `p` has completed; nothing uses it.
                                unsafe { rt.target_free(p, dev)? };
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("case 33 thread panicked")).collect()
        });
        for r in results {
            r?;
        }
        assert_clean(rt, dev)
    });
}

#[test]
fn case_34_memcpy_with_offsets() {
    on_every_device("case 34", |rt, dev| {
        let init = rt.initial_device();
        let p = rt.target_alloc(130 * 4, dev)?;
        // SAFETY: inside the allocation.
        unsafe { rt.target_memset(p, 0, 130 * 4, dev)? };
        let src: Vec<i32> = (0..128).map(|i| i * 3 + 1).collect();
        // SAFETY: `src` holds 512 bytes; `p + 4` has 516 bytes behind it.
        unsafe { rt.target_memcpy(p, src.as_ptr() as u64, 512, 4, 0, dev, init)? };
        let all = read_device::<i32>(rt, p, 130, dev)?;
        check_eq!(all[0], 0);
        check_eq!(all[1..129], src[..]);
        check_eq!(all[129], 0);
        let mut back = vec![0i32; 128];
        // SAFETY: `back` holds 512 bytes and is not otherwise used; `p + 4` has 512 behind it.
        unsafe { rt.target_memcpy(back.as_mut_ptr() as u64, p, 512, 0, 4, init, dev)? };
        check_eq!(back, src);
        // Offsets on the host side too: src[10..20] to the device's elements 0..10.
        // SAFETY: 40 bytes from `src + 40` and into `p`.
        unsafe { rt.target_memcpy(p, src.as_ptr() as u64, 40, 0, 40, dev, init)? };
        let all = read_device::<i32>(rt, p, 12, dev)?;
        check_eq!(all[..10], src[10..20]);
        // Bytes past the copy are untouched.
        check_eq!(all[10..12], src[9..11]);
        // Within one device: elements 1..5 onto 100..104.
        // SAFETY: both ranges inside the allocation, disjoint.
        unsafe { rt.target_memcpy(p, p, 16, 400, 4, dev, dev)? };
        check_eq!(read_device::<i32>(rt, p + 400, 4, dev)?, src[11..15].to_vec());
        // SAFETY: nothing uses `p` after this.
        unsafe { rt.target_free(p, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_35_memcpy_null_pointers() {
    on_every_device("case 35", |rt, dev| {
        let init = rt.initial_device();
        let p = rt.target_alloc(16, dev)?;
        let host = [1i32, 2, 3, 4];
        let hp = host.as_ptr() as u64;
        let before = rt.transfer_stats(dev)?;
        // Length 0: a no-op whatever the pointers, offsets and devices.
        for (dd, sd) in [(dev, init), (init, dev), (dev, dev), (init, init)] {
            // SAFETY: nothing is copied.
            unsafe {
                rt.target_memcpy(0, 0, 0, 0, 0, dd, sd)?;
                rt.target_memcpy(0, 0, 0, 8, 16, dd, sd)?;
            }
        }
        // Length > 0 with a null pointer: an error, nothing copied.
        // SAFETY: for the calls below, each is expected to fail before copying.
        let cases = unsafe {
            [
                (rt.target_memcpy(0, hp, 4, 0, 0, dev, init), "destination pointer is null"),
                (rt.target_memcpy(0, hp, 4, 4, 0, dev, init), "destination pointer is null"),
                (rt.target_memcpy(0, p, 4, 0, 0, init, dev), "destination pointer is null"),
                (rt.target_memcpy(p, 0, 4, 0, 0, dev, init), "source pointer is null"),
                (rt.target_memcpy(p, 0, 4, 0, 0, dev, dev), "source pointer is null"),
                (rt.target_memset(0, 0, 4, dev), "pointer is null"),
            ]
        };
        for (r, needle) in cases {
            let e = fails(r, needle)?;
            check!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
            check!(e.to_string().contains(needle), "{e}");
        }
        // SAFETY: nothing is written.
        unsafe { rt.target_memset(0, 0, 0, dev)? };
        check_eq!(rt.transfer_stats(dev)?, before);
        check_eq!(host, [1, 2, 3, 4]);
        // SAFETY: nothing uses `p`.
        unsafe { rt.target_free(p, dev)? };
        assert_clean(rt, dev)
    });
}

#[test]
fn case_36_memset() {
    on_every_device("case 36", |rt, dev| {
        let p = rt.target_alloc(520, dev)?;
        launch_raw(rt, dev, &FILL_I32, -1, p, 130)?;
        // SAFETY: 520 bytes inside the allocation.
        unsafe { rt.target_memset(p, 0, 520, dev)? };
        check_eq!(read_device::<i32>(rt, p, 128, dev)?, vec![0; 128]);
        check_eq!(read_device::<i32>(rt, p, 130, dev)?, vec![0; 130]);
        // A byte value, at an unaligned place: exactly those bytes change.
        // SAFETY: bytes 5..12 of the allocation.
        unsafe { rt.target_memset(p + 5, 0xab, 7, dev)? };
        let bytes = read_device::<u8>(rt, p, 16, dev)?;
        let mut want = [0u8; 16];
        want[5..12].fill(0xab);
        check_eq!(bytes, want.to_vec());
        // SAFETY: nothing uses `p`.
        unsafe { rt.target_free(p, dev)? };
        assert_clean(rt, dev)
    });
}

// ---- memcpy_rect -------------------------------------------------------------------------

/// Row-major index of `at` in an array of extents `dims`.
fn index(at: &[usize], dims: &[usize]) -> usize {
    at.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Every multi-index of an array of extents `dims`.
fn every_index(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out.into_iter().flat_map(|p| (0..d).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// What the destination array `dst` (extents `dst_dims`) holds after copying a sub-volume
/// `volume` from `src` (extents `src_dims`) at `src_off` to `dst_off`.
fn rect_expect(
    dst: &[i32],
    dst_dims: &[usize],
    dst_off: &[usize],
    src: &[i32],
    src_dims: &[usize],
    src_off: &[usize],
    volume: &[usize],
) -> Vec<i32> {
    let mut out = dst.to_vec();
    for at in every_index(volume) {
        let d: Vec<usize> = at.iter().zip(dst_off).map(|(a, o)| a + o).collect();
        let s: Vec<usize> = at.iter().zip(src_off).map(|(a, o)| a + o).collect();
        out[index(&d, dst_dims)] = src[index(&s, src_dims)];
    }
    out
}

/// A distinct value per element: its indices as decimal digits (plus a tag per array).
fn numbered(dims: &[usize], tag: i32) -> Vec<i32> {
    every_index(dims).iter().map(|at| tag + at.iter().fold(0, |acc, &i| acc * 100 + i as i32)).collect()
}

/// One rectangular copy and its check: `src` (on `sd`, contents `src_vals`) into `dst` (on
/// `dd`, contents `dst_vals` before), then the whole destination is compared element by
/// element.
struct Rect<'a> {
    volume: &'a [usize],
    dst_off: &'a [usize],
    dst_dims: &'a [usize],
    src_off: &'a [usize],
    src_dims: &'a [usize],
}

impl Rect<'_> {
    fn run(&self, rt: &Runtime, dst: (u64, usize), src: (u64, usize)) -> Result<()> {
        // SAFETY: the callers pass arrays of their whole extents on those devices.
        unsafe {
            rt.target_memcpy_rect(
                4,
                self.volume,
                RectSide { ptr: dst.0, device: dst.1, offsets: self.dst_off, dimensions: self.dst_dims },
                RectSide { ptr: src.0, device: src.1, offsets: self.src_off, dimensions: self.src_dims },
            )
        }
    }

    fn expect(&self, dst_before: &[i32], src: &[i32]) -> Vec<i32> {
        rect_expect(dst_before, self.dst_dims, self.dst_off, src, self.src_dims, self.src_off, self.volume)
    }
}

/// Host -> device, device -> device (the same device) and device -> host, each checked
/// element by element, for the given shapes.
fn rect_round_trip(
    rt: &Runtime,
    dev: usize,
    host_dims: &[usize],
    dev_dims: &[usize],
    there: Rect<'_>,
) -> Result<()> {
    let init = rt.initial_device();
    let host = numbered(host_dims, 1_000_000);
    let dev_len: usize = dev_dims.iter().product();
    let p = rt.target_alloc(dev_len * 4, dev)?;
    launch_raw(rt, dev, &FILL_I32, -1, p, dev_len)?;

    there.run(rt, (p, dev), (host.as_ptr() as u64, init))?;
    let on_dev = read_device::<i32>(rt, p, dev_len, dev)?;
    let want = there.expect(&vec![-1; dev_len], &host);
    check_eq!(on_dev, want);
    // The copy moved exactly the volume: every other element is still -1.
    let moved: usize = there.volume.iter().product();
    check_eq!(on_dev.iter().filter(|&&v| v != -1).count(), moved);

    // Within the device: the same shape from `p` into a second allocation `q`.
    let q = rt.target_alloc(dev_len * 4, dev)?;
    launch_raw(rt, dev, &FILL_I32, -2, q, dev_len)?;
    let zero = vec![0; dev_dims.len()];
    let inner = Rect {
        volume: there.volume,
        dst_off: &zero,
        dst_dims: dev_dims,
        src_off: there.dst_off,
        src_dims: dev_dims,
    };
    inner.run(rt, (q, dev), (p, dev))?;
    check_eq!(read_device::<i32>(rt, q, dev_len, dev)?, inner.expect(&vec![-2; dev_len], &on_dev));

    // Back to the host: the device's sub-volume into a fresh host array at `src_off`.
    let mut back = vec![-3i32; host.len()];
    let home = Rect {
        volume: there.volume,
        dst_off: there.src_off,
        dst_dims: host_dims,
        src_off: there.dst_off,
        src_dims: dev_dims,
    };
    home.run(rt, (back.as_mut_ptr() as u64, init), (p, dev))?;
    check_eq!(back, home.expect(&vec![-3; host.len()], &on_dev));
    // Which equals the original host values inside the volume.
    check_eq!(back, there.expect_home(&host, host_dims));

    // SAFETY: nothing uses `p` or `q` after this.
    unsafe {
        rt.target_free(p, dev)?;
        rt.target_free(q, dev)?;
    }
    Ok(())
}

impl Rect<'_> {
    /// The host array after a round trip: `src` inside the source sub-volume, -3 elsewhere.
    fn expect_home(&self, src: &[i32], dims: &[usize]) -> Vec<i32> {
        rect_expect(&vec![-3; src.len()], dims, self.src_off, src, dims, self.src_off, self.volume)
    }
}

#[test]
fn memcpy_rect_2d_host_and_device() {
    on_every_device("memcpy_rect 2-D", |rt, dev| {
        let there = Rect {
            volume: &[3, 4],
            dst_off: &[2, 1],
            dst_dims: &[5, 7],
            src_off: &[1, 2],
            src_dims: &[6, 8],
        };
        rect_round_trip(rt, dev, &[6, 8], &[5, 7], there)?;
        // Whole rows (the innermost extent in full) and a single element.
        let rows = Rect {
            volume: &[2, 8],
            dst_off: &[3, 0],
            dst_dims: &[5, 8],
            src_off: &[4, 0],
            src_dims: &[6, 8],
        };
        rect_round_trip(rt, dev, &[6, 8], &[5, 8], rows)?;
        let one = Rect {
            volume: &[1, 1],
            dst_off: &[4, 6],
            dst_dims: &[5, 7],
            src_off: &[5, 7],
            src_dims: &[6, 8],
        };
        rect_round_trip(rt, dev, &[6, 8], &[5, 7], one)?;
        assert_clean(rt, dev)
    });
}

#[test]
fn memcpy_rect_3d_host_and_device() {
    on_every_device("memcpy_rect 3-D", |rt, dev| {
        let there = Rect {
            volume: &[2, 3, 4],
            dst_off: &[1, 1, 0],
            dst_dims: &[3, 4, 5],
            src_off: &[2, 1, 2],
            src_dims: &[4, 5, 6],
        };
        rect_round_trip(rt, dev, &[4, 5, 6], &[3, 4, 5], there)?;
        let flat = Rect {
            volume: &[1, 4, 5],
            dst_off: &[2, 0, 0],
            dst_dims: &[3, 4, 5],
            src_off: &[3, 1, 1],
            src_dims: &[4, 5, 6],
        };
        rect_round_trip(rt, dev, &[4, 5, 6], &[3, 4, 5], flat)?;
        assert_clean(rt, dev)
    });
}

#[test]
fn memcpy_rect_between_two_devices() {
    on_every_backend(
        "memcpy_rect device to device",
        2,
        |b| b,
        |rt| {
            let last = rt.num_devices() - 1;
            type Shape<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize], &'a [usize]);
            // (source extents, destination extents, volume, source offsets, destination offsets)
            let shapes: [Shape<'_>; 2] = [
                (&[6, 8], &[5, 7], &[3, 4], &[1, 2], &[2, 1]),
                (&[4, 5, 6], &[3, 4, 5], &[2, 3, 4], &[2, 1, 2], &[1, 1, 0]),
            ];
            for (src_dims, dst_dims, volume, src_off, dst_off) in shapes {
                let src_len: usize = src_dims.iter().product();
                let dst_len: usize = dst_dims.iter().product();
                let host = numbered(src_dims, 2_000_000);
                let s = rt.target_alloc(src_len * 4, 0)?;
                write_device(rt, s, &host, 0)?;
                let d = rt.target_alloc(dst_len * 4, last)?;
                launch_raw(rt, last, &FILL_I32, -1, d, dst_len)?;
                let r = Rect { volume, dst_off, dst_dims, src_off, src_dims };
                r.run(rt, (d, last), (s, 0))?;
                let got = read_device::<i32>(rt, d, dst_len, last)?;
                check_eq!(got, r.expect(&vec![-1; dst_len], &host));
                // And back the other way into a cleared source array.
                // SAFETY: the whole source allocation.
                unsafe { rt.target_memset(s, 0, src_len * 4, 0)? };
                let back = Rect {
                    volume,
                    dst_off: src_off,
                    dst_dims: src_dims,
                    src_off: dst_off,
                    src_dims: dst_dims,
                };
                back.run(rt, (s, 0), (d, last))?;
                let got = read_device::<i32>(rt, s, src_len, 0)?;
                check_eq!(
                    got,
                    rect_expect(&vec![0; src_len], src_dims, src_off, &host, src_dims, src_off, volume)
                );
                // The host array was only read.
                check_eq!(host, numbered(src_dims, 2_000_000));
                // SAFETY: nothing uses `s` or `d` after this.
                unsafe {
                    rt.target_free(s, 0)?;
                    rt.target_free(d, last)?;
                }
            }
            assert_clean(rt, 0)?;
            assert_clean(rt, last)
        },
    );
}

fn side<'a>(ptr: u64, device: usize, offsets: &'a [usize], dimensions: &'a [usize]) -> RectSide<'a> {
    RectSide { ptr, device, offsets, dimensions }
}

#[test]
fn memcpy_rect_rejects_bad_shapes() {
    on_every_device("memcpy_rect errors", |rt, dev| {
        let init = rt.initial_device();
        let p = rt.target_alloc(5 * 7 * 4, dev)?;
        launch_raw(rt, dev, &FILL_I32, -1, p, 35)?;
        let host = numbered(&[6, 8], 0);
        let hp = host.as_ptr() as u64;
        let before = rt.transfer_stats(dev)?;
        // SAFETY: for every call below, valid arrays; each call is expected to fail first.
        let cases = unsafe {
            [
                (
                    rt.target_memcpy_rect(
                        4,
                        &[3, 4],
                        side(p, dev, &[3, 1], &[5, 7]),
                        side(hp, init, &[0, 0], &[6, 8]),
                    ),
                    "exceeds extent",
                ),
                (
                    rt.target_memcpy_rect(
                        4,
                        &[3, 4],
                        side(p, dev, &[0, 0], &[5, 7]),
                        side(hp, init, &[0, 5], &[6, 8]),
                    ),
                    "exceeds extent",
                ),
                (
                    rt.target_memcpy_rect(
                        4,
                        &[3, 4],
                        side(p, dev, &[0], &[5, 7]),
                        side(hp, init, &[0, 0], &[6, 8]),
                    ),
                    "must have 2 entries",
                ),
                (
                    rt.target_memcpy_rect(
                        4,
                        &[3, 4],
                        side(0, dev, &[0, 0], &[5, 7]),
                        side(hp, init, &[0, 0], &[6, 8]),
                    ),
                    "destination pointer is null",
                ),
                (
                    rt.target_memcpy_rect(
                        4,
                        &[3, 4],
                        side(p, dev, &[0, 0], &[5, 7]),
                        side(0, init, &[0, 0], &[6, 8]),
                    ),
                    "source pointer is null",
                ),
                (
                    rt.target_memcpy_rect(4, &[], side(p, dev, &[], &[]), side(hp, init, &[], &[])),
                    "at least one dimension",
                ),
                (
                    rt.target_memcpy_rect(
                        0,
                        &[3, 4],
                        side(p, dev, &[0, 0], &[5, 7]),
                        side(hp, init, &[0, 0], &[6, 8]),
                    ),
                    "non-zero element size",
                ),
            ]
        };
        for (r, needle) in cases {
            let e = fails(r, needle)?;
            check!(matches!(e, Error::InvalidArgument { routine: "omp_target_memcpy_rect", .. }), "{e:?}");
            check!(e.to_string().contains(needle), "{e}");
        }
        check_eq!(rt.transfer_stats(dev)?, before);
        check_eq!(read_device::<i32>(rt, p, 35, dev)?, vec![-1; 35]);
        // A zero volume in some dimension copies nothing and succeeds.
        // SAFETY: nothing is copied.
        unsafe {
            rt.target_memcpy_rect(
                4,
                &[0, 4],
                side(p, dev, &[0, 0], &[5, 7]),
                side(hp, init, &[0, 0], &[6, 8]),
            )?
        };
        check_eq!(read_device::<i32>(rt, p, 35, dev)?, vec![-1; 35]);
        // SAFETY: nothing uses `p`.
        unsafe { rt.target_free(p, dev)? };
        assert_clean(rt, dev)
    });
}
