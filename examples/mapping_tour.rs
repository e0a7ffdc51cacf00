//! A guided tour of OpenMP's device data environment: reference counts, `always`,
//! `present`, `hold`, `update`, `associate`, copies between devices and an array split
//! over two devices (halos, and the race of copying them back), one step at a time,
//! each with a sentence that says what to look for and the runtime's own trace of it
//! (`OFFLOAD_INFO=-1`, captured). It runs on two host devices, so on any laptop; the output
//! is shown in `docs/MAPPING.md`.
//!
//! ```text
//! cargo run --release -p offload-examples --example mapping_tour
//! ```
//!
//! With `OFFLOAD_TRACE=tour.json` it also writes the tour's timeline
//! (`scripts/trace-pictures.sh` draws it).
//!
//! The steps use `offload::omp`, the C-shaped routines a port writes, so each maps to the
//! `#pragma` in its heading; each array's first map is named (`MapItem::named`), so the
//! trace gives its ranges as `x[0:4]`; device addresses differ from run to run.

use std::ffi::c_void;

use offload::omp::*;
use offload::{InfoFlags, LaunchArg, MapItem, Result, Runtime, Scalar, UpdateDirection, UpdateItem};
use offload_kernels::ADD_I32;

/// Prints a step's heading and explanation, runs it, then prints the trace it left.
fn step(rt: &Runtime, title: &str, why: &str, body: impl FnOnce() -> Result<String>) -> Result<()> {
    rt.take_info();
    println!("## {title}\n\n{why}\n");
    // The timeline labels the step where it begins.
    rt.annotate(title);
    let outcome = body()?;
    println!("```text");
    for line in rt.take_info() {
        println!("{line}");
    }
    println!("```\n\n{outcome}\n");
    Ok(())
}

fn v<T>(p: *const T) -> *const c_void {
    p.cast()
}

/// The arguments of `ADD_I32` adding `by` to the mapped array at `p`.
fn add(p: *mut i32, by: i32) -> [LaunchArg; 2] {
    [LaunchArg::Value(Scalar::I32(by)), LaunchArg::mapped(p)]
}

/// Steps 1 to 5: reference counts, `always`, and when `from` copies back; gives `x`.
fn reference_counts(rt: &Runtime, d0: i32) -> Result<[i32; 4]> {
    let mut x = [1i32; 4];
    let xp = x.as_mut_ptr();
    step(
        rt,
        "1. `target enter data map(to: x)`",
        "An absent range gets an entry with reference count 1 and one copy to the device.",
        || {
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            unsafe { target_enter_data(d0, &[MapItem::to(xp, 16).named("x")])? };
            Ok(format!("present on device 0: {}", omp_target_is_present(v(xp), d0)?))
        },
    )?;
    step(
        rt,
        "2. the same again, with `x = 2` on the host",
        "A present range only counts up: no copy, so the device keeps 1 (the trace says why).",
        || {
            x = [2; 4];
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            unsafe { target_enter_data(d0, &[MapItem::to(xp, 16)])? };
            Ok("reference count 2; the device copy still holds 1".into())
        },
    )?;
    step(
        rt,
        "3. `target enter data map(always, to: x)`",
        "`always` copies even though the range is present, and counts up too.",
        || {
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            unsafe { target_enter_data(d0, &[MapItem::to(xp, 16).always()])? };
            Ok("reference count 3; the device copy now holds 2".into())
        },
    )?;
    step(
        rt,
        "4. a kernel, then `target exit data map(from: x)` twice",
        "An exit counts down; `from` copies back only when the entry leaves (count 0): each exit says why it copied nothing.",
        || {
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            unsafe {
                target(d0, &ADD_I32, 4, &[], &add(xp, 10))?;
                target_exit_data(d0, &[MapItem::from(xp, 16)])?;
                target_exit_data(d0, &[MapItem::from(xp, 16)])?;
            }
            Ok(format!("reference count 1; the host still has x = {:?}: nothing came back yet", x))
        },
    )?;
    step(
        rt,
        "5. the last `target exit data map(from: x)`",
        "The count reaches 0: the device's 12s come back and the entry leaves.",
        || {
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            unsafe { target_exit_data(d0, &[MapItem::from(xp, 16)])? };
            Ok(format!("x = {x:?}; present on device 0: {}", omp_target_is_present(v(xp), d0)?))
        },
    )?;

    Ok(x)
}

/// Steps 6 and 7: `present` on an absent range, and `hold`; gives `y`.
fn present_and_hold(rt: &Runtime, d0: i32) -> Result<[i32; 4]> {
    let mut y = [5i32; 4];
    let yp = y.as_mut_ptr();
    step(
        rt,
        "6. `target data map(present, alloc: y)` on an absent `y`",
        "`present` makes absence an error, named with the range; nothing is mapped.",
        || {
            // SAFETY: the arrays outlive the step; the host touches none during a construct.
            let r = unsafe { target_data_begin(d0, &[MapItem::alloc(yp, 16).present().named("y")]) };
            Ok(format!("error: {}", r.err().map_or("none".into(), |e| e.to_string())))
        },
    )?;
    step(rt, "7. `target data map(ompx_hold, tofrom: y)` with `exit data map(delete: y)` inside", "`hold` moves a second count that no exit data can take to zero: the delete zeroes the reference count only, and the entry leaves (copying back) when the region ends.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            target_data_begin(d0, &[MapItem::tofrom(yp, 16).hold().named("y")])?;
            target_exit_data(d0, &[MapItem::delete(yp, 16)])?;
            let inside = omp_target_is_present(v(yp), d0)?;
            target(d0, &ADD_I32, 4, &[], &add(yp, 1))?;
            target_data_end(d0, &[MapItem::tofrom(yp, 16).hold()])?;
            Ok(format!("present after the delete: {inside}; after the region y = {y:?}"))
        }
    })?;

    Ok(y)
}

/// Steps 8 and 9: `target update` inside a region, and `omp_target_associate_ptr`; gives
/// `u` and `h`.
fn update_and_associate(rt: &Runtime, d0: i32) -> Result<([i32; 4], [i32; 4])> {
    let mut u = [0i32; 4];
    let up = u.as_mut_ptr();
    step(rt, "8. `target update` inside `target data map(to: u)`", "The host changes `u` between two kernels and pushes it with `update to`; `update from` pulls the device's copy without ending the mapping.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            target_data_begin(d0, &[MapItem::to(up, 16).named("u")])?;
            u = [100; 4];
            target_update(d0, UpdateDirection::To, &[UpdateItem::raw(up, 16)])?;
            target(d0, &ADD_I32, 4, &[], &add(up, 1))?;
            target_update(d0, UpdateDirection::From, &[UpdateItem::raw(up, 16)])?;
            target_data_end(d0, &[MapItem::to(up, 16)])?;
        }
        Ok(format!("u = {u:?} (pulled by update from; `to` copies nothing back at the end)"))
    })?;

    let mut h = [7i32; 4];
    let hp = h.as_mut_ptr();
    step(rt, "9. `omp_target_associate_ptr`", "Device memory the program allocated becomes the range's device copy, with an infinite count: maps copy nothing, only `update` (or `always`) moves data.", || {
        let dmem = omp_target_alloc(16, d0)?;
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            omp_target_memset(dmem, 0, 16, d0)?;
            omp_target_associate_ptr(v(hp), dmem, 16, 0, d0)?;
            target_enter_data(d0, &[MapItem::to(hp, 16).named("h")])?;
            target_exit_data(d0, &[MapItem::from(hp, 16)])?;
            let after_maps = h;
            target_update(d0, UpdateDirection::From, &[UpdateItem::raw(hp, 16)])?;
            omp_target_disassociate_ptr(v(hp), d0)?;
            omp_target_free(dmem, d0)?;
            Ok(format!("after enter/exit: h = {after_maps:?} (nothing copied); after update from: h = {h:?}"))
        }
    })?;

    Ok((u, h))
}

/// Steps 10 to 12, on devices `d0` and `d1` (and the initial device `host`): one range on
/// both, a split array with halos, and the race of copying halos back; gives `w`, `a`,
/// device 0's halo after the exchange, and `b`.
#[allow(clippy::type_complexity)]
fn two_devices(rt: &Runtime, [d0, d1, host]: [i32; 3]) -> Result<([i32; 4], [i32; 8], i32, [i32; 8])> {
    let mut w = [3i32; 4];
    let wp = w.as_mut_ptr();
    step(rt, "10. the same range on two devices, and a copy between them", "Each device has its own table: mapping on device 0 leaves device 1 untouched; `omp_target_memcpy` copies device to device.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            target_enter_data(d0, &[MapItem::to(wp, 16).named("w")])?;
            let on1 = omp_target_is_present(v(wp), d1)?;
            target(d0, &ADD_I32, 4, &[], &add(wp, 40))?;
            target_enter_data(d1, &[MapItem::alloc(wp, 16).named("w")])?;
            let (src, dst) = (omp_get_mapped_ptr(v(wp), d0)?, omp_get_mapped_ptr(v(wp), d1)?);
            omp_target_memcpy(dst, src, 16, 0, 0, d1, d0)?;
            target_exit_data(d0, &[MapItem::release(wp, 16)])?;
            target_exit_data(d1, &[MapItem::from(wp, 16)])?;
            Ok(format!("present on device 1 before its own map: {on1}; w from device 1 = {w:?}"))
        }
    })?;

    let mut a = [0i32; 8];
    let ap = a.as_mut_ptr();
    let mut halo = 0i32;
    step(rt, "11. an array split over two devices: owned parts, halos, the exchange, the owned parts back", "Device 0 owns `a[0:4]`, device 1 `a[4:4]`; each maps its part and one halo element of its neighbour's with `to` (`a[0:5]`, `a[3:5]`), works on it, takes its halo from the neighbour's device (`omp_target_memcpy`, device to device) and copies back only what it owns (`target update from`), then releases its mapping: no two copies back touch the same element.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            let (left, right) = (ap, ap.add(3));
            target_enter_data(d0, &[MapItem::to(left, 20).named("a")])?;
            target_enter_data(d1, &[MapItem::to(right, 20).named_at("a", 3)])?;
            target(d0, &ADD_I32, 5, &[], &add(left, 10))?;
            target(d1, &ADD_I32, 5, &[], &add(right, 20))?;
            // The halo exchange: a[4] from device 1 to device 0, a[3] from device 0 to device 1.
            let at = |i: usize, d: i32| omp_get_mapped_ptr(v(ap.add(i)), d);
            omp_target_memcpy(at(4, d0)?, at(4, d1)?, 4, 0, 0, d0, d1)?;
            omp_target_memcpy(at(3, d1)?, at(3, d0)?, 4, 0, 0, d1, d0)?;
            omp_target_memcpy((&raw mut halo).cast(), at(4, d0)?, 4, 0, 0, host, d0)?;
            target_update(d0, UpdateDirection::From, &[UpdateItem::raw(ap, 16)])?;
            target_update(d1, UpdateDirection::From, &[UpdateItem::raw(ap.add(4), 16)])?;
            target_exit_data(d0, &[MapItem::release(left, 20)])?;
            target_exit_data(d1, &[MapItem::release(right, 20)])?;
        }
        Ok(format!("a = {a:?}; device 0's halo a[4] after the exchange: {halo} (device 1's)"))
    })?;

    let mut b = [0i32; 8];
    let bp = b.as_mut_ptr();
    step(rt, "12. the same split mapped `tofrom`: two copies back race", "Each device now copies its whole mapping back at its exit, halo included: device 1's stale `b[3]` lands over device 0's. The trace warns (`OFFLOAD_INFO` 0x80, a `WARN` event) at the first copy back into memory the other device has mapped with `from`.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            let (left, right) = (MapItem::tofrom(bp, 20).named("b"), MapItem::tofrom(bp.add(3), 20).named_at("b", 3));
            target_enter_data(d0, &[left])?;
            target_enter_data(d1, &[right])?;
            target(d0, &ADD_I32, 5, &[], &add(bp, 1))?;
            target(d1, &ADD_I32, 5, &[], &add(bp.add(3), 2))?;
            target_exit_data(d0, &[MapItem::from(bp, 20)])?;
            target_exit_data(d1, &[MapItem::from(bp.add(3), 20)])?;
        }
        Ok(format!("b = {b:?}: b[3] is device 1's halo, not device 0's 1"))
    })?;

    Ok((w, a, halo, b))
}

/// Step 13: timing target regions; gives `t`.
fn timing(rt: &Runtime, d0: i32) -> Result<[i32; 4]> {
    let mut t = [0i32; 4];
    let tp = t.as_mut_ptr();
    step(rt, "13. timing target regions: `omp_get_wtime()`", "A C `target` region is complete when it returns; here a launch returns once queued, so a clock read right after a loop of launches would time only their queuing. `omp_get_wtime()` first waits for the work queued on every device, and a C timer ports line for line.", || {
        // SAFETY: the arrays outlive the step; the host touches none during a construct.
        unsafe {
            target_enter_data(d0, &[MapItem::to(tp, 16).named("t")])?;
            let start = omp_get_wtime()?;
            for _ in 0..3 {
                target(d0, &ADD_I32, 4, &[], &add(tp, 1))?;
            }
            // The three kernels have run: this read waited for them.
            let _elapsed = omp_get_wtime()? - start;
            target_exit_data(d0, &[MapItem::from(tp, 16)])?;
        }
        Ok(format!("t = {t:?}; the second `omp_get_wtime()` returned after the three kernels had run"))
    })?;

    Ok(t)
}

fn main() -> Result<()> {
    let rt = use_runtime(
        Runtime::builder().gpus(false).host_devices(2).info(InfoFlags::ALL).capture_info().build()?,
    )?;
    let (d0, d1, host) = (0, 1, omp_get_initial_device()?);
    println!("# A tour of the device data environment\n");
    println!("Two host devices (0 and 1), each with memory of its own; the initial device is {host}.\n");

    let x = reference_counts(rt, d0)?;
    let y = present_and_hold(rt, d0)?;
    let (u, h) = update_and_associate(rt, d0)?;
    let (w, a, halo, b) = two_devices(rt, [d0, d1, host])?;
    let t = timing(rt, d0)?;

    // The runtime is the program's global one, never dropped: with OFFLOAD_TRACE set, the
    // timeline is written here (scripts/trace-pictures.sh draws it).
    rt.flush_trace()?;
    let left = rt.live_mappings();
    println!("Left mapped at the end: {} entries.", left.len());
    let split = [10, 10, 10, 10, 20, 20, 20, 20];
    let raced = [1, 1, 1, 2, 2, 2, 2, 2];
    if !left.is_empty() || x != [12; 4] || y != [6; 4] || u != [101; 4] || h != [0; 4] || w != [43; 4] {
        return Err(offload::Error::InvalidArgument {
            routine: "mapping_tour",
            what: "a step gave a wrong result".into(),
        });
    }
    if a != split || halo != 20 || b != raced || t != [3; 4] {
        return Err(offload::Error::InvalidArgument {
            routine: "mapping_tour",
            what: "a step gave a wrong result".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The tour runs to its end on host devices, each step giving the result it explains.
    #[test]
    fn the_tour_runs_and_every_step_gives_what_it_says() {
        super::main().unwrap_or_else(|e| panic!("{e}"));
    }
}
