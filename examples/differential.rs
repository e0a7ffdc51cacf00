//! The Rust twins of the C programs in `tests/differential/`: each family prints, line
//! for line, what its C program prints when compiled by clang with OpenMP offloading and
//! run on LLVM's libomptarget (host plugin, four host devices); `scripts/differential.sh`
//! runs both and compares them. Run on four host devices, as that plugin has (or none, with
//! `OFFLOAD_HOST_DEVICES=0`; `OMP_TARGET_OFFLOAD` is read too, for the `policy` family):
//!
//! ```text
//! cargo run -p offload-examples --example differential -- counts
//! ```

use std::ffi::c_void;

use offload::omp::*;
use offload::{LaunchArg, MapItem, Result, Runtime, Scalar, UpdateDirection, UpdateItem};
use offload_kernels::{ADD_I32, FILL_I32};

macro_rules! say {
    ($($t:tt)*) => { println!($($t)*) };
}

fn vp<T>(p: *const T) -> *const c_void {
    p.cast()
}

/// Element `i` of the device copy of the mapped host array `h` on `dev` (-999 if none).
fn device_value(h: *const i32, i: usize, dev: i32) -> Result<i32> {
    let mut v = -999i32;
    let d = omp_get_mapped_ptr(vp(h), dev)?;
    if !d.is_null() {
        // SAFETY: `d` is the device copy of a mapped array holding element `i`.
        unsafe { omp_target_memcpy((&raw mut v).cast(), d, 4, 0, i * 4, omp_get_initial_device()?, dev)? };
    }
    Ok(v)
}

/// `#pragma omp target map(maps) device(dev)` with `x[i] += by` over `n` elements at `x`.
///
/// # Safety
/// `x` points to `n` live elements that the host does not touch during the call.
unsafe fn add(dev: i32, x: *mut i32, n: usize, by: i32, maps: &[MapItem]) -> Result<()> {
    let args = [LaunchArg::Value(Scalar::I32(by)), LaunchArg::mapped(x)];
    // SAFETY: forwarded from the caller.
    unsafe { target(dev, &ADD_I32, n, maps, &args) }
}

/// As [`add`], with `x[i] = v`.
///
/// # Safety
/// As [`add`].
unsafe fn fill(dev: i32, x: *mut i32, n: usize, v: i32, maps: &[MapItem]) -> Result<()> {
    let args = [LaunchArg::Value(Scalar::I32(v)), LaunchArg::mapped(x)];
    // SAFETY: forwarded from the caller.
    unsafe { target(dev, &FILL_I32, n, maps, &args) }
}

fn present<T>(p: *const T, dev: i32) -> Result<i32> {
    Ok(i32::from(omp_target_is_present(vp(p), dev)?))
}

/// Cases 1-10: counts and copies.
///
/// # Safety
/// (Of every family.) Each host array lives to the end of its function and is touched by
/// the host only between constructs.
unsafe fn counts() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let mut x = [1i32; 4];
        let xp = x.as_mut_ptr();
        target_enter_data(0, &[MapItem::to(xp, 16)])?;
        say!("case 1: present {} device {}", present(xp, 0)?, device_value(xp, 0, 0)?);
        *xp = 2;
        target_enter_data(0, &[MapItem::to(xp, 16)])?;
        say!("case 2: device {}", device_value(xp, 0, 0)?);
        target_enter_data(0, &[MapItem::to(xp, 16).always()])?;
        say!("case 3: device {}", device_value(xp, 0, 0)?);
        *xp = 5;
        target_exit_data(0, &[MapItem::from(xp, 16)])?;
        say!("case 4: host {} present {}", *xp, present(xp, 0)?);
        target_exit_data(0, &[MapItem::from(xp, 16)])?;
        target_exit_data(0, &[MapItem::from(xp, 16)])?;
        say!("case 5: host {} present {}", *xp, present(xp, 0)?);
        let mut y = [7i32; 4];
        let yp = y.as_mut_ptr();
        target_enter_data(0, &[MapItem::to(yp, 16)])?;
        *yp = 8;
        target_exit_data(0, &[MapItem::release(yp, 16)])?;
        say!("case 6: host {} present {}", *yp, present(yp, 0)?);
        let z = [3i32; 4];
        for _ in 0..5 {
            target_enter_data(0, &[MapItem::to(z.as_ptr(), 16)])?;
        }
        target_exit_data(0, &[MapItem::delete(z.as_ptr(), 16)])?;
        say!("case 7: present {}", present(z.as_ptr(), 0)?);
        let mut m = [0i32; 4];
        let mp = m.as_mut_ptr();
        let mm = [MapItem::tofrom(mp, 16)];
        target_data_begin(0, &mm)?;
        target_data_begin(0, &mm)?;
        add(0, mp, 4, 1, &mm)?;
        target_data_end(0, &mm)?;
        say!("case 8: inner end host {} present {}", *mp, present(mp, 0)?);
        target_data_end(0, &mm)?;
        say!("case 8: outer end host {} present {}", *mp, present(mp, 0)?);
        let mut n = [0i32; 4];
        let np = n.as_mut_ptr();
        let nm = [MapItem::tofrom(np, 16)];
        add(0, np, 4, 1, &nm)?;
        say!("case 9: no region host {} present {}", *np, present(np, 0)?);
        target_data_begin(0, &nm)?;
        add(0, np, 4, 1, &nm)?;
        say!("case 9: in region host {} present {}", *np, present(np, 0)?);
        target_data_end(0, &nm)?;
        say!("case 9: after region host {}", *np);
        let mut b = [0i32; 4];
        let bp = b.as_mut_ptr();
        fill(0, bp, 4, 1, &[MapItem::from(bp, 16)])?;
        say!("case 10: host {}", *bp);
    }
    Ok(())
}

/// Cases 11, 13-15 and `target update`.
///
/// # Safety
/// As [`counts`].
unsafe fn present_update() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let i = [4i32; 4];
        let ip = i.as_ptr();
        target_data_begin(1, &[MapItem::alloc(ip, 16)])?;
        target_data_begin(1, &[MapItem::alloc(ip, 16).present()])?;
        say!("case 11: present {}", present(ip, 1)?);
        target_data_end(1, &[MapItem::alloc(ip, 16).present()])?;
        target_data_end(1, &[MapItem::alloc(ip, 16)])?;
        say!("case 11: after present {}", present(ip, 1)?);
        let r = [0i32; 4];
        let rp = r.as_ptr();
        target_enter_data(1, &[MapItem::to(rp, 16)])?;
        target_enter_data(1, &[MapItem::to(rp, 16)])?;
        target_exit_data(1, &[MapItem::release(rp, 16).present()])?;
        say!("case 13: after one present release {}", present(rp, 1)?);
        target_exit_data(1, &[MapItem::delete(rp, 16).present()])?;
        say!("case 13: after present delete {}", present(rp, 1)?);
        let mut u = [1i32; 8];
        let up = u.as_mut_ptr();
        target_enter_data(1, &[MapItem::to(up, 32)])?;
        *up = 9;
        *up.add(7) = 9;
        target_update(1, UpdateDirection::To, &[UpdateItem::raw(up, 32).present()])?;
        say!("case 14: device {} {}", device_value(up, 0, 1)?, device_value(up, 7, 1)?);
        add(1, up, 8, 1, &[MapItem::alloc(up, 32)])?;
        target_update(1, UpdateDirection::From, &[UpdateItem::raw(up.add(2), 16).present()])?;
        say!("case 14: host {} {} {}", *up, *up.add(2), *up.add(7));
        target_data_begin(1, &[MapItem::alloc(up.add(2), 12).present()])?;
        say!("case 15: sub-range present {}", present(up.add(2), 1)?);
        target_data_end(1, &[MapItem::alloc(up.add(2), 12).present()])?;
        target_exit_data(1, &[MapItem::from(up, 32)])?;
        say!("update: after exit host {} {} present {}", *up, *up.add(7), present(up, 1)?);
        let mut a = [2i32; 4];
        let ap = a.as_mut_ptr();
        target_update(1, UpdateDirection::To, &[UpdateItem::raw(ap, 16)])?;
        target_update(1, UpdateDirection::From, &[UpdateItem::raw(ap, 16)])?;
        say!("update: of an absent range host {} present {}", *ap, present(ap, 1)?);
    }
    Ok(())
}

/// Cases 17, 18, 20 and 21-23.
///
/// # Safety
/// As [`counts`].
unsafe fn overlap() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let mut arr: Vec<i32> = (0..100).collect();
        let p = arr.as_mut_ptr();
        target_enter_data(2, &[MapItem::alloc(p, 400)])?;
        target_enter_data(2, &[MapItem::to(p.add(98), 8)])?;
        let off = omp_get_mapped_ptr(vp(p.add(98)), 2)? as isize - omp_get_mapped_ptr(vp(p), 2)? as isize;
        say!("case 17: offset {off}");
        target_exit_data(2, &[MapItem::release(p.add(98), 8)])?;
        target_exit_data(2, &[MapItem::delete(p, 400)])?;
        target_enter_data(2, &[MapItem::alloc(p.add(50), 8)])?;
        let at = |k: usize| present(p.add(k), 2);
        say!("case 18: {} {} {} {}", at(50)?, at(51)?, at(49)?, at(52)?);
        target_exit_data(2, &[MapItem::delete(p.add(50), 8)])?;
        say!("case 18: after exit {}", at(50)?);
        target_enter_data(2, &[MapItem::to(p, 20)])?;
        for (k, v) in [(1, 100), (2, 200), (3, 300), (4, 400)] {
            *p.add(k) = v;
        }
        target_update(2, UpdateDirection::To, &[UpdateItem::raw(p.add(2), 8)])?;
        let dv = |k| device_value(p, k, 2);
        say!("case 20: device {} {} {} {}", dv(1)?, dv(2)?, dv(3)?, dv(4)?);
        target_data_begin(2, &[MapItem::alloc(p.add(3), 0).present()])?;
        say!("case 21: zero-length inside present {}", at(3)?);
        target_data_end(2, &[MapItem::alloc(p.add(3), 0).present()])?;
        target_exit_data(2, &[MapItem::release(p, 0).present()])?;
        say!("case 23: after zero-length present release {}", at(0)?);
        target_exit_data(2, &[MapItem::delete(p, 20)])?;
        let z = [0i32; 4];
        target_data_begin(2, &[MapItem::alloc(z.as_ptr(), 0)])?;
        say!("case 22: zero-length creates no entry {}", present(z.as_ptr(), 2)?);
        target_data_end(2, &[MapItem::alloc(z.as_ptr(), 0)])?;
    }
    Ok(())
}

/// Cases 24 and 25.
///
/// # Safety
/// As [`counts`].
unsafe fn hold() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let (mut m, r, d) = ([0i32; 4], [0i32; 4], [0i32; 4]);
        let mp = m.as_mut_ptr();
        let region = [
            MapItem::tofrom(mp, 16).hold(),
            MapItem::alloc(r.as_ptr(), 16).hold(),
            MapItem::alloc(d.as_ptr(), 16).hold(),
        ];
        target_data_begin(3, &region)?;
        fill(3, mp, 4, 7, &[MapItem::alloc(mp, 16)])?;
        target_exit_data(
            3,
            &[MapItem::from(mp, 16), MapItem::release(r.as_ptr(), 16), MapItem::delete(d.as_ptr(), 16)],
        )?;
        say!(
            "case 24: hold inside host {} present {} {} {}",
            *mp,
            present(mp, 3)?,
            present(r.as_ptr(), 3)?,
            present(d.as_ptr(), 3)?
        );
        target_data_end(3, &region)?;
        say!("case 24: hold after host {} present {}", *mp, present(mp, 3)?);
        let mut q = [0i32; 4];
        let qp = q.as_mut_ptr();
        target_data_begin(3, &[MapItem::tofrom(qp, 16)])?;
        fill(3, qp, 4, 5, &[MapItem::alloc(qp, 16)])?;
        target_exit_data(3, &[MapItem::from(qp, 16)])?;
        say!("case 24: plain inside host {} present {}", *qp, present(qp, 3)?);
        target_data_end(3, &[MapItem::tofrom(qp, 16)])?;
        say!("case 24: plain after host {}", *qp);
        let x = [1i32; 4];
        let xp = x.as_ptr();
        target_enter_data(3, &[MapItem::to(xp, 16)])?;
        target_data_begin(3, &[MapItem::alloc(xp, 16).hold()])?;
        target_exit_data(3, &[MapItem::delete(xp, 16)])?;
        say!("case 25: after delete present {}", present(xp, 3)?);
        target_data_end(3, &[MapItem::alloc(xp, 16).hold()])?;
        say!("case 25: after the region present {}", present(xp, 3)?);
    }
    Ok(())
}

/// Cases 26, 29 and 31.
///
/// # Safety
/// As [`counts`].
unsafe fn associate() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let init = omp_get_initial_device()?;
        let mut h = [1i32; 4];
        let hp = h.as_mut_ptr();
        let d = omp_target_alloc(16, 0)?;
        let mut ok = true;
        for _ in 0..8 {
            ok &= omp_target_associate_ptr(vp(hp), d, 16, 0, 0).is_ok();
            ok &= omp_target_is_present(vp(hp), 0)? && omp_get_mapped_ptr(vp(hp), 0)? == d;
            ok &= omp_target_disassociate_ptr(vp(hp), 0).is_ok();
            ok &= !omp_target_is_present(vp(hp), 0)?;
        }
        say!("case 26: eight rounds ok {}", i32::from(ok));
        let zero = [0i32; 4];
        omp_target_memcpy(d, vp(zero.as_ptr()), 16, 0, 0, 0, init)?;
        omp_target_associate_ptr(vp(hp), d, 16, 0, 0)?;
        add(0, hp, 4, 10, &[MapItem::tofrom(hp, 16)])?;
        say!("case 29: after a tofrom launch host {} device {}", *hp, device_value(hp, 0, 0)?);
        target_exit_data(0, &[MapItem::delete(hp, 16)])?;
        say!("case 29: after delete present {}", present(hp, 0)?);
        target_update(0, UpdateDirection::From, &[UpdateItem::raw(hp, 16)])?;
        say!("case 29: after update from host {}", *hp);
        omp_target_disassociate_ptr(vp(hp), 0)?;
        omp_target_free(d, 0)?;
        let q = [0i32; 8];
        let qp = q.as_ptr();
        say!("case 31: before {}", i32::from(omp_get_mapped_ptr(vp(qp), 0)?.is_null()));
        target_enter_data(0, &[MapItem::to(qp, 32)])?;
        let off = omp_get_mapped_ptr(vp(qp.add(4)), 0)? as isize - omp_get_mapped_ptr(vp(qp), 0)? as isize;
        say!("case 31: offset of q+4 {off}");
        target_exit_data(0, &[MapItem::delete(qp, 32)])?;
    }
    Ok(())
}

/// Cases 32, 34, 37 and 39-41.
///
/// # Safety
/// As [`counts`].
unsafe fn devices() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let init = omp_get_initial_device()?;
        let last = omp_get_num_devices()? - 1;
        say!("case 32: null for 0 bytes {}", i32::from(omp_target_alloc(0, 0)?.is_null()));
        let p = omp_target_alloc(130 * 4, 0)?;
        let src: Vec<i32> = (0..128).collect();
        let mut back = vec![0i32; 128];
        omp_target_memcpy(p, vp(src.as_ptr()), 512, 4, 0, 0, init)?;
        omp_target_memcpy(back.as_mut_ptr().cast(), p, 512, 0, 4, init, 0)?;
        say!("case 34: round trip with offsets equal {}", i32::from(back == src));
        let q = omp_target_alloc(130 * 4, last)?;
        omp_target_memcpy(q, p, 520, 0, 0, last, 0)?;
        omp_target_memcpy(back.as_mut_ptr().cast(), q, 512, 0, 4, init, last)?;
        say!("case 37: device 0 to {last}: {} {}", back[0], back[127]);
        omp_target_free(p, 0)?;
        omp_target_free(q, last)?;
        let mut h = [0i32; 16];
        let hp = h.as_mut_ptr();
        for d in 0..4 {
            let s = hp.add(d * 4);
            fill(d as i32, s, 4, d as i32, &[MapItem::from(s, 16)])?;
        }
        say!("case 39: {} {} {} {}", h[0], h[5], h[10], h[15]);
        let x = [1i32; 4];
        let xp = x.as_ptr();
        target_enter_data(0, &[MapItem::to(xp, 16)])?;
        say!(
            "case 40: present on 0 {} on 1 {} mapped on 1 null {}",
            present(xp, 0)?,
            present(xp, 1)?,
            i32::from(omp_get_mapped_ptr(vp(xp), 1)?.is_null())
        );
        target_exit_data(0, &[MapItem::delete(xp, 16)])?;
        let a = [0i32; 4];
        let da = omp_target_alloc(16, 0)?;
        omp_target_associate_ptr(vp(a.as_ptr()), da, 16, 0, 0)?;
        say!("case 41: associated on 0 {} on 1 {}", present(a.as_ptr(), 0)?, present(a.as_ptr(), 1)?);
        omp_target_disassociate_ptr(vp(a.as_ptr()), 0)?;
        omp_target_free(da, 0)?;
    }
    Ok(())
}

/// Cases 42-44: a construct decides its copies over its whole list.
///
/// # Safety
/// As [`counts`].
unsafe fn ordering() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let mut x = 0i32;
        let xp = &raw mut x;
        let list = [MapItem::alloc(xp, 4), MapItem::from(xp, 4), MapItem::alloc(xp, 4)];
        target_data_begin(0, &list)?;
        fill(0, xp, 1, 222, &[MapItem::alloc(xp, 4).present()])?;
        target_data_end(0, &list)?;
        say!("case 42: host {}", *xp);
        let mut y = 111i32;
        let yp = &raw mut y;
        add(
            0,
            yp,
            1,
            111,
            &[MapItem::alloc(yp, 4), MapItem::from(yp, 4), MapItem::to(yp, 4), MapItem::alloc(yp, 4)],
        )?;
        say!("case 43: host {}", *yp);
        let mut z = 0i32;
        let zp = &raw mut z;
        target_data_begin(0, &[MapItem::alloc(zp, 4)])?;
        target_enter_data(0, &[MapItem::alloc(zp, 4), MapItem::to(zp, 4)])?;
        fill(0, zp, 1, 222, &[MapItem::alloc(zp, 4).present()])?;
        target_exit_data(0, &[MapItem::delete(zp, 4), MapItem::from(zp, 4), MapItem::delete(zp, 4)])?;
        target_data_end(0, &[MapItem::alloc(zp, 4)])?;
        say!("case 44: host {}", *zp);
    }
    Ok(())
}

/// Rule 6: a zero-length section inside a mapped range stands for that range's entry.
///
/// # Safety
/// As [`counts`].
unsafe fn zero_length() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let mut a: [i32; 8] = std::array::from_fn(|k| k as i32);
        let ap = a.as_mut_ptr();
        target_enter_data(1, &[MapItem::alloc(ap, 20)])?;
        target_exit_data(1, &[MapItem::release(ap, 0).present()])?;
        say!("present release a[0:0]: present {}", present(ap, 1)?);
        target_enter_data(1, &[MapItem::alloc(ap, 20)])?;
        target_exit_data(1, &[MapItem::release(ap.add(3), 0)])?;
        say!("release a[3:0]: present {}", present(ap, 1)?);
        target_enter_data(1, &[MapItem::to(ap, 20)])?;
        target_enter_data(1, &[MapItem::to(ap.add(2), 0)])?;
        target_exit_data(1, &[MapItem::release(ap, 20)])?;
        say!("enter to a[2:0], release a[0:5]: present {}", present(ap, 1)?);
        fill(1, ap, 5, 9, &[MapItem::alloc(ap, 20).present()])?;
        target_exit_data(1, &[MapItem::from(ap.add(2), 0)])?;
        say!("from a[2:0] at the last count: present {} host {} {}", present(ap, 1)?, a[0], a[2]);
        for _ in 0..3 {
            target_enter_data(1, &[MapItem::alloc(ap, 20)])?;
        }
        target_exit_data(1, &[MapItem::delete(ap.add(4), 0)])?;
        say!("delete a[4:0] at count 3: present {}", present(ap, 1)?);
        target_enter_data(1, &[MapItem::alloc(ap, 20)])?;
        target_enter_data(1, &[MapItem::alloc(ap.add(5), 0)])?;
        say!("a[5:0] one past the end: present {}", present(ap.add(5), 1)?);
        target_exit_data(1, &[MapItem::release(ap.add(5), 0)])?;
        say!("release a[5:0]: a present {}", present(ap, 1)?);
        let region = [MapItem::alloc(ap.add(3), 0)];
        target_data_begin(1, &region)?;
        target_exit_data(1, &[MapItem::release(ap, 20)])?;
        say!("inside target data a[3:0], release a[0:5]: present {}", present(ap, 1)?);
        target_data_end(1, &region)?;
        say!("after the region: present {}", present(ap, 1)?);
    }
    Ok(())
}

/// `use_device_ptr` of a pointer whose mapped section starts past element 0, and a
/// zero-length section at that base.
///
/// # Safety
/// As [`counts`].
unsafe fn use_device() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        let a: Vec<i32> = (0..256).collect();
        let h = a.as_ptr();
        // map(to: A[64:128]): the section with its base, as C's A[64:128] has it.
        target_enter_data(1, &[MapItem::to(h.add(64), 512).with_base(h)])?;
        let section = omp_get_mapped_ptr(vp(h.add(64)), 1)? as i64;
        say!("A[0] present {}, A[64] present {}", present(h, 1)?, present(h.add(64), 1)?);
        let d = use_device_ptr(vp(h), 1)?;
        say!(
            "use_device_ptr(A): section minus A {}, A itself {}",
            section - d as i64,
            i32::from(d.cast_const() == vp(h))
        );
        let b = use_device_ptr(vp(h.add(100)), 1)?;
        say!("use_device_ptr(&A[100]): minus section {}", b as i64 - section);
        target_enter_data(1, &[MapItem::alloc(h, 0)])?;
        target_exit_data(1, &[MapItem::release(h.add(64), 512)])?;
        say!("enter A[0:0], release A[64:128]: present {}", present(h.add(64), 1)?);
        target_exit_data(1, &[MapItem::release(h, 0).present()])?;
        say!("present release A[0:0]: present {}", present(h.add(64), 1)?);
        let c = [0i32; 16];
        let dc = use_device_ptr(vp(c.as_ptr()), 1)?;
        say!(
            "use_device_ptr of unmapped C: C itself {}, null {}",
            i32::from(dc.cast_const() == vp(c.as_ptr())),
            i32::from(dc.is_null())
        );
    }
    Ok(())
}

/// Struct members mapped by one construct (one entry per member here; one block in
/// libomptarget).
///
/// # Safety
/// As [`counts`].
unsafe fn members() -> Result<()> {
    #[repr(C)]
    struct T {
        i: i32,
        pad: i32,
        j: i32,
    }
    // SAFETY: as the function's.
    unsafe {
        let mut t = T { i: 1, pad: 2, j: 3 };
        let (i, pad, j) = (&raw mut t.i, &raw const t.pad, &raw mut t.j);
        target_enter_data(1, &[MapItem::to(i, 4), MapItem::to(j, 4)])?;
        say!(
            "t.i present {}, t.pad present {}, t.j present {}",
            present(i, 1)?,
            present(pad, 1)?,
            present(j, 1)?
        );
        target_exit_data(1, &[MapItem::release(i, 4), MapItem::release(j, 4)])?;
        say!("after release: t.i present {}, t.j present {}", present(i, 1)?, present(j, 1)?);
        let maps = [MapItem::tofrom(i, 4), MapItem::tofrom(j, 4)];
        target_data_begin(1, &maps)?;
        add(1, i, 1, 10, &[])?;
        add(1, j, 1, 10, &[])?;
        target_data_end(1, &maps)?;
        say!("each member through its own name: {} {} {}", t.i, t.pad, t.j);
    }
    Ok(())
}

/// One step of a family whose C program runs it in a child process (`ATTEMPT` in
/// common.h): prints `who: ` and the step's line, or `who: what: fails` for an error, as
/// the C program prints when libomptarget ends the child with a fatal error.
fn attempt(who: &str, what: &str, step: impl FnOnce() -> Result<String>) {
    match step() {
        Ok(line) => say!("{who}: {line}"),
        Err(_) => say!("{who}: {what}: fails"),
    }
}

/// C's return code of a routine that returns 0 or -1 (`omp_target_associate_ptr`, ...).
fn rc(r: Result<()>) -> i32 {
    if r.is_ok() {
        0
    } else {
        -1
    }
}

/// OpenMP 5.1's `omp_initial_device` in every routine and construct, beside the same steps
/// with `omp_get_initial_device()` (each C step runs in a child process, so each step here
/// undoes what it changed).
///
/// # Safety
/// As [`counts`].
unsafe fn initial_device() -> Result<()> {
    // SAFETY: as the function's.
    unsafe {
        steps_on("initial device number", omp_get_initial_device()?);
        steps_on("omp_initial_device", omp_initial_device);
    }
    Ok(())
}

/// The steps of tests/differential/initial_device.c with device number `dev`.
///
/// # Safety
/// As [`counts`].
unsafe fn steps_on(name: &str, dev: i32) {
    let init = || omp_get_initial_device();
    let vol = [4usize];
    let (off, dim) = ([0usize], [4usize]);
    let x = [1i32, 2, 3, 4];
    let xv = vp(x.as_ptr());
    attempt(name, "set_default_device", || {
        omp_set_default_device(dev)?;
        let is_initial = omp_get_default_device()? == init()?;
        omp_set_default_device(0)?;
        Ok(format!("set_default_device, then the default is the initial device {}", i32::from(is_initial)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "alloc", || unsafe {
        let p = omp_target_alloc(16, dev)?;
        p.cast::<u8>().write_bytes(1, 16);
        omp_target_free(p, dev)?;
        Ok("alloc, host writes, free".into())
    });
    attempt(name, "is_present", || Ok(format!("is_present {}", present(x.as_ptr(), dev)?)));
    attempt(name, "mapped_ptr", || {
        let m = omp_get_mapped_ptr(xv, dev)?;
        Ok(format!("mapped_ptr is the host address {}", i32::from(m.cast_const() == xv)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "associate_ptr", || unsafe {
        let d = omp_target_alloc(16, 0)?;
        let r = rc(omp_target_associate_ptr(xv, d, 16, 0, dev));
        omp_target_free(d, 0)?;
        Ok(format!("associate_ptr returns {r}"))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "disassociate_ptr", || unsafe {
        Ok(format!("disassociate_ptr returns {}", rc(omp_target_disassociate_ptr(xv, dev))))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy", || unsafe {
        let mut y = [0i32; 4];
        omp_target_memcpy(y.as_mut_ptr().cast(), xv, 16, 0, 0, dev, dev)?;
        Ok(format!("memcpy 0 y {}", y[3]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy through device 0", || unsafe {
        let mut y = [0i32; 4];
        let d = omp_target_alloc(16, 0)?;
        omp_target_memcpy(d, xv, 16, 0, 0, 0, dev)?;
        omp_target_memcpy(y.as_mut_ptr().cast(), d, 16, 0, 0, dev, 0)?;
        omp_target_free(d, 0)?;
        Ok(format!("memcpy through device 0 y {}", y[2]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memset", || unsafe {
        let mut y = [0i32; 4];
        let yp = y.as_mut_ptr().cast::<c_void>();
        let r = omp_target_memset(yp, 7, 16, dev)?;
        Ok(format!("memset returns the pointer {} y {:x}", i32::from(r == yp), y[0]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy_rect", || unsafe {
        let mut y = [0i32; 4];
        let (o, d) = (off.as_ptr(), dim.as_ptr());
        let r = omp_target_memcpy_rect(y.as_mut_ptr().cast(), xv, 4, 1, vol.as_ptr(), o, o, d, d, dev, dev)?;
        Ok(format!("memcpy_rect {r} y {}", y[1]))
    });
    let (none, nul) = (std::ptr::null::<c_void>(), std::ptr::null::<usize>());
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy_rect query", || unsafe {
        let r = omp_target_memcpy_rect(none.cast_mut(), none, 0, 0, nul, nul, nul, nul, nul, dev, dev)?;
        Ok(format!("memcpy_rect query {r}"))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy_rect_async query", || unsafe {
        let r = omp_target_memcpy_rect_async(
            none.cast_mut(),
            none,
            0,
            0,
            nul,
            nul,
            nul,
            nul,
            nul,
            dev,
            dev,
            &[],
        )?;
        Ok(format!("memcpy_rect_async query {}", r.dimensions().unwrap_or(0)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy_async", || unsafe {
        let mut y = [0i32; 4];
        omp_target_memcpy_async(y.as_mut_ptr().cast(), xv, 16, 0, 0, dev, dev, &[])?;
        omp_taskwait()?;
        Ok(format!("memcpy_async 0 y {}", y[1]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memcpy_rect_async", || unsafe {
        let mut y = [0i32; 4];
        let (o, d) = (off.as_ptr(), dim.as_ptr());
        let yp = y.as_mut_ptr().cast();
        omp_target_memcpy_rect_async(yp, xv, 4, 1, vol.as_ptr(), o, o, d, d, dev, dev, &[])?;
        omp_taskwait()?;
        Ok(format!("memcpy_rect_async 0 y {}", y[2]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "memset_async", || unsafe {
        let mut y = [0i32; 4];
        let yp = y.as_mut_ptr().cast::<c_void>();
        omp_target_memset_async(yp, 9, 16, dev, &[])?;
        omp_taskwait()?;
        Ok(format!("memset_async returns the pointer 1 y {:x}", y[0]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "target", || unsafe {
        let mut x = [1i32, 2, 3, 4];
        let xp = x.as_mut_ptr();
        fill(dev, xp, 4, 9, &[MapItem::to(xp, 16)])?;
        Ok(format!("target ran on host memory {}", i32::from(x[0] == 9)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "enter data", || unsafe {
        target_enter_data(dev, &[MapItem::to(x.as_ptr(), 16)])?;
        let on0 = present(x.as_ptr(), 0)?;
        target_exit_data(dev, &[MapItem::delete(x.as_ptr(), 16)])?;
        Ok(format!("enter data, present on device 0 {on0}"))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "target data", || unsafe {
        target_data_begin(dev, &[MapItem::to(x.as_ptr(), 16)])?;
        let line = format!("target data, present on device 0 {}", present(x.as_ptr(), 0)?);
        target_data_end(dev, &[MapItem::to(x.as_ptr(), 16)])?;
        Ok(line)
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "update", || unsafe {
        target_update(dev, UpdateDirection::To, &[UpdateItem::raw(x.as_ptr(), 16)])?;
        Ok("update".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "exit data", || unsafe {
        let mut y = x;
        target_exit_data(dev, &[MapItem::from(y.as_mut_ptr(), 16)])?;
        Ok("exit data".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "enter data nowait", || unsafe {
        target_enter_data_nowait(dev, &[MapItem::to(x.as_ptr(), 16)], &[])?;
        omp_taskwait()?;
        let on0 = present(x.as_ptr(), 0)?;
        target_exit_data(dev, &[MapItem::delete(x.as_ptr(), 16)])?;
        Ok(format!("enter data nowait, present on device 0 {on0}"))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt(name, "use_device_ptr", || unsafe {
        target_data_begin(dev, &[MapItem::to(x.as_ptr(), 16)])?;
        let p = use_device_ptr(xv, dev)?;
        target_data_end(dev, &[MapItem::to(x.as_ptr(), 16)])?;
        Ok(format!("use_device_ptr is the host address {}", i32::from(p.cast_const() == xv)))
    });
}

/// Cases 48 and 49: `OMP_TARGET_OFFLOAD` (mandatory with no device, disabled), as
/// scripts/differential.sh runs it (the environment says which).
///
/// # Safety
/// As [`counts`].
unsafe fn policy() -> Result<()> {
    let init = omp_get_initial_device()?;
    say!(
        "queries: devices {} initial {init} default is initial {} is_initial_device {}",
        omp_get_num_devices()?,
        i32::from(omp_get_default_device()? == init),
        i32::from(omp_is_initial_device()?)
    );
    let x = [1i32, 2, 3, 4];
    let xv = vp(x.as_ptr());
    let vol = [4usize];
    let (off, dim) = ([0usize], [4usize]);
    let default = omp_get_default_device()?;
    match omp_set_default_device(2) {
        Ok(()) => {
            say!(
                "routine: set_default_device(2): returns, then the default is the initial device {}",
                i32::from(omp_get_default_device()? == init)
            );
            omp_set_default_device(default)?;
        }
        Err(_) => say!("routine: set_default_device(2): fails"),
    }
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "alloc", || unsafe {
        let p = omp_target_alloc(16, init)?;
        p.cast::<u8>().add(15).write(1);
        omp_target_free(p, init)?;
        Ok("alloc: on the initial device, host writes, free".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "alloc on device 1", || unsafe {
        let p = omp_target_alloc(16, 1)?;
        omp_target_free(p, 1)?;
        Ok(format!("alloc on device 1: not null {}", i32::from(!p.is_null())))
    });
    attempt("routine", "is_present", || Ok(format!("is_present: {}", present(x.as_ptr(), init)?)));
    attempt("routine", "mapped_ptr", || {
        let m = omp_get_mapped_ptr(xv, init)?;
        Ok(format!("mapped_ptr: the host address {}", i32::from(m.cast_const() == xv)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "associate_ptr", || unsafe {
        let mut y = [0i32; 4];
        let r = rc(omp_target_associate_ptr(xv, y.as_mut_ptr().cast(), 16, 0, init));
        Ok(format!("associate_ptr: returns {r}"))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "memcpy", || unsafe {
        let mut y = [0i32; 4];
        omp_target_memcpy(y.as_mut_ptr().cast(), xv, 16, 0, 0, init, init)?;
        Ok(format!("memcpy: 0 y {}", y[3]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "memset", || unsafe {
        let mut y = [0i32; 4];
        let yp = y.as_mut_ptr().cast::<c_void>();
        let r = omp_target_memset(yp, 7, 16, init)?;
        Ok(format!("memset: returns the pointer {} y {:x}", i32::from(r == yp), y[0]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "memcpy_rect", || unsafe {
        let mut y = [0i32; 4];
        let (o, d) = (off.as_ptr(), dim.as_ptr());
        let r =
            omp_target_memcpy_rect(y.as_mut_ptr().cast(), xv, 4, 1, vol.as_ptr(), o, o, d, d, init, init)?;
        Ok(format!("memcpy_rect: {r} y {}", y[1]))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "memcpy_rect query", || unsafe {
        let (none, nul) = (std::ptr::null::<c_void>(), std::ptr::null::<usize>());
        let r = omp_target_memcpy_rect_async(
            none.cast_mut(),
            none,
            0,
            0,
            nul,
            nul,
            nul,
            nul,
            nul,
            init,
            init,
            &[],
        )?;
        Ok(format!("memcpy_rect query: {}", r.dimensions().unwrap_or(0)))
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("routine", "memcpy_async", || unsafe {
        let mut y = [0i32; 4];
        omp_target_memcpy_async(y.as_mut_ptr().cast(), xv, 16, 0, 0, init, init, &[])?;
        omp_taskwait()?;
        Ok(format!("memcpy_async: 0 y {}", y[2]))
    });
    let on_host = |what: &str, dev: Result<i32>| {
        // SAFETY: the step's host arrays outlive its routines, and the device blocks it
        // allocates are its own and freed before it ends.
        attempt("construct", what, || unsafe {
            let mut x = [1i32, 2, 3, 4];
            let xp = x.as_mut_ptr();
            fill(dev?, xp, 4, 9, &[MapItem::to(xp, 16)])?;
            Ok(format!("{what}: ran on host memory {}", i32::from(x[0] == 9)))
        })
    };
    on_host("target", omp_get_default_device());
    on_host("target device(initial)", Ok(init));
    on_host("target if(0)", if_device(false, default));
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("construct", "enter data", || unsafe {
        target_enter_data(default, &[MapItem::to(x.as_ptr(), 16)])?;
        target_exit_data(default, &[MapItem::delete(x.as_ptr(), 16)])?;
        Ok("enter data: done".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("construct", "target data", || unsafe {
        target_data_begin(default, &[MapItem::to(x.as_ptr(), 16)])?;
        target_data_end(default, &[MapItem::to(x.as_ptr(), 16)])?;
        Ok("target data: inside".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("construct", "update", || unsafe {
        target_update(default, UpdateDirection::To, &[UpdateItem::raw(x.as_ptr(), 16)])?;
        Ok("update: done".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("construct", "exit data", || unsafe {
        let mut y = x;
        target_exit_data(default, &[MapItem::from(y.as_mut_ptr(), 16)])?;
        Ok("exit data: done".into())
    });
    // SAFETY: the step's host arrays outlive its routines, and the device blocks it
    // allocates are its own and freed before it ends.
    attempt("construct", "enter data nowait", || unsafe {
        target_enter_data_nowait(default, &[MapItem::to(x.as_ptr(), 16)], &[])?;
        omp_taskwait()?;
        target_exit_data(default, &[MapItem::delete(x.as_ptr(), 16)])?;
        Ok("enter data nowait: done".into())
    });
    Ok(())
}

fn main() -> Result<()> {
    let family = std::env::args().nth(1).unwrap_or_default();
    // Four host devices, as libomptarget's host plugin has, unless scripts/differential.sh
    // asks for none (OFFLOAD_HOST_DEVICES=0, a run without devices); OMP_TARGET_OFFLOAD as
    // it gives it; no other setting from the environment.
    let from_env = |k: &str| match k {
        "OMP_TARGET_OFFLOAD" | "OFFLOAD_HOST_DEVICES" => std::env::var(k).ok(),
        _ => None,
    };
    let mut builder = Runtime::builder().env(from_env).gpus(false);
    if std::env::var_os("OFFLOAD_HOST_DEVICES").is_none() {
        builder = builder.host_devices(4);
    }
    use_runtime(builder.build()?)?;
    // SAFETY: each family keeps to its contract (see `counts`).
    unsafe {
        match family.as_str() {
            "counts" => counts(),
            "present_update" => present_update(),
            "overlap" => overlap(),
            "hold" => hold(),
            "associate" => associate(),
            "devices" => devices(),
            "ordering" => ordering(),
            "zero_length" => zero_length(),
            "use_device" => use_device(),
            "members" => members(),
            "initial_device" => initial_device(),
            "policy" => policy(),
            other => {
                eprintln!(
                    "unknown family {other:?}; expected one of: counts, present_update, overlap, hold, \
                     associate, devices, ordering, zero_length, use_device, members, initial_device, policy"
                );
                std::process::exit(2)
            }
        }
    }
}
