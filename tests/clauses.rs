//! The clauses a port needs, on every backend present and the initial device: base
//! pointers of array sections, `use_device_ptr`/`use_device_addr`, the `if` clause, and
//! `declare target` variables.

use std::ffi::c_void;

use offload::{
    map, BackendKind, DeviceGlobal, Error, HostLaunch, Kernel, LaunchArg, MapItem, Result, Runtime, Scalar,
};
use offload_kernels::ADD_I32;
use offload_tests::{check, check_eq, fails, on_every_backend};

/// `x[i + ioff] += v` for `i < n`, with `x` the array's base: C's kernel over a section.
fn add_at(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
    let (v, ioff): (i32, u64) = (l.scalar(0)?, l.scalar(1)?);
    let (base, _) = l.ptr::<i32>(2)?;
    for i in 0..l.n() {
        // SAFETY: the launch maps `x[ioff..ioff + n]` and passes `x`'s base.
        unsafe { *base.add(i + ioff as usize) += v };
    }
    Ok(())
}

static ADD_AT: Kernel = Kernel::new("add_at").with_host(add_at).with_cuda(
    r#"extern "C" __global__ void add_at(int v, unsigned long long ioff, int* x, unsigned long long n) {
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
             i += (unsigned long long)gridDim.x * blockDim.x) x[i + ioff] += v; }"#,
);

fn each_device_and_the_initial_one(what: &str, case: impl Fn(&Runtime, usize) -> Result<()>) {
    on_every_backend(what, 1, |b| b, |rt| (0..=rt.num_devices()).try_for_each(|d| case(rt, d)));
}

#[test]
fn a_base_pointer_is_translated_through_its_mapped_section() {
    each_device_and_the_initial_one("base pointers", |rt, d| {
        let mut arr: Vec<i32> = (0..100).collect();
        // Safe form: map arr[40..60], pass it as the base of arr, index from the base.
        let gpu = rt.device(d)?;
        gpu.data(map::tofrom(&mut arr[40..60]), |v| {
            gpu.launch(&ADD_AT, 20, (1000i32, 40u64, v.based_at(40)?))
        })?;
        check!(
            arr[40..60].iter().enumerate().all(|(i, &x)| x == i as i32 + 1040),
            "device {d}: {:?}",
            &arr[40..44]
        );
        check!(arr[..40].iter().enumerate().all(|(i, &x)| x == i as i32));
        check!(arr[60..].iter().enumerate().all(|(i, &x)| x == i as i32 + 60));
        // A shared section on the initial device gets a private copy, rebased too.
        let ro: Vec<i32> = vec![7; 10];
        gpu.data(map::to(&ro[5..]), |v| gpu.launch(&ADD_AT, 5, (1i32, 5u64, v.based_at(5)?)))?;
        check_eq!(ro, vec![7; 10]);
        // The raw form: LaunchArg::mapped_base(base, section).
        let p = arr.as_mut_ptr();
        let args = [
            LaunchArg::Value(Scalar::I32(1)),
            LaunchArg::Value(Scalar::U64(90)),
            LaunchArg::mapped_base(p.cast_const(), p.wrapping_add(90).cast_const()),
        ];
        // SAFETY: the map list maps arr[90..100] for the launch; `arr` is not otherwise used.
        unsafe { rt.target_launch(d, &ADD_AT, 10, &[MapItem::tofrom(p.wrapping_add(90), 40)], &args)? };
        check!(arr[90..].iter().enumerate().all(|(i, &x)| x == i as i32 + 91), "raw: {:?}", &arr[90..92]);
        // A base whose section is not mapped is refused, naming both.
        if d != rt.initial_device() {
            // SAFETY: the launch fails before running.
            let e = fails(unsafe { rt.target_launch(d, &ADD_AT, 10, &[], &args) }, "unmapped section")?;
            check!(matches!(e, Error::KernelArgument { index: 2, .. }), "{e:?}");
            check!(e.to_string().contains("section"), "{e}");
        }
        let e = fails(gpu.data(map::to(&ro[..]), |v| v.based_at(usize::MAX).map(drop)), "base before 0")?;
        check!(matches!(e, Error::Overflow { .. }), "{e:?}");
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn use_device_ptr_of_a_base_gives_the_device_address_the_base_corresponds_to() {
    each_device_and_the_initial_one("use_device_ptr of a base", |rt, d| {
        let a: Vec<i32> = (0..256).collect();
        let gpu = rt.device(d)?;
        // Safe form: the base of a view mapped past element 0, as a kernel receives it.
        gpu.data(map::to(&a[64..192]), |v| {
            let section = v.device_addr(rt)?;
            check!(section.is_some(), "device {d}: the section is not mapped");
            check_eq!(v.based_at(64)?.device_addr(rt)?, section.map(|s| s.wrapping_sub(256)));
            Ok(())
        })?;
        // The OpenMP shape: map(to: A[64:128]) with its base, then use_device_ptr(A).
        let (base, section) = (a.as_ptr(), a[64..].as_ptr());
        // SAFETY: `a` is valid for reads during the calls; release copies nothing back.
        unsafe { rt.enter_data(d, &[MapItem::to(section, 512).with_base(base)])? };
        let at = |p: *const i32| p as usize;
        let expected = if d == rt.initial_device() {
            Some(at(base) as u64)
        } else {
            rt.mapped_ptr(at(section), d)?.map(|s| s - 256)
        };
        check_eq!(rt.use_device_ptr(at(base), d)?, expected);
        // Inside the section, as before; past its end, nothing (the host address in C).
        check_eq!(rt.use_device_ptr(at(section) + 8, d)?, rt.mapped_ptr(at(section) + 8, d)?);
        if d != rt.initial_device() {
            check_eq!(rt.use_device_ptr(at(a[192..].as_ptr()), d)?, None);
        }
        // SAFETY: release copies nothing back.
        unsafe { rt.exit_data(d, &[MapItem::release(section, 512)])? };
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn a_kernel_indexing_from_one_struct_member_into_the_next_is_refused_on_host_devices() {
    #[repr(C)]
    struct T {
        i: i32,
        j: i32,
    }
    // libomptarget gives t.i and t.j mapped by one construct one block; offload an entry
    // each, so the argument's extent is the member's (docs/PORTING.md, row 42a).
    on_every_backend(
        "members",
        1,
        |b| b,
        |rt| {
            let mut t = T { i: 1, j: 2 };
            let (i, j) = (&raw mut t.i, &raw mut t.j);
            let maps = [MapItem::tofrom(i, 4), MapItem::tofrom(j, 4)];
            let args = [LaunchArg::Value(Scalar::I32(10)), LaunchArg::mapped(i)];
            let hosts: Vec<usize> = (0..rt.num_devices())
                .filter(|&d| rt.describe(d).is_ok_and(|x| x.kind == BackendKind::Host))
                .collect();
            for &d in &hosts {
                // SAFETY: the launch is refused before the kernel runs past `t.i`.
                let e = fails(unsafe { rt.target_launch(d, &ADD_I32, 2, &maps, &args) }, "across members")?;
                check!(e.to_string().contains("wants 2 elements but only 1 are mapped"), "device {d}: {e}");
                // Mapping the enclosing object as one item is what works.
                let whole = [MapItem::tofrom(i, 8)];
                // SAFETY: `t` is touched only through the launch, which maps all of it.
                unsafe { rt.target_launch(d, &ADD_I32, 2, &whole, &args)? };
            }
            let n = hosts.len() as i32;
            check_eq!((t.i, t.j), (1 + 10 * n, 2 + 10 * n));
            Ok(())
        },
    );
}

#[test]
fn use_device_ptr_and_if_clause_in_the_omp_shape() {
    use offload::omp::*;
    let rt = use_runtime(Runtime::builder().env(|_| None).host_devices(2).build().expect("runtime"))
        .expect("global");
    let run = || -> Result<()> {
        let init = omp_get_initial_device()?;
        for dev in 0..omp_get_num_devices()? {
            let mut x = vec![1i32; 64];
            let xp = x.as_mut_ptr();
            let v = |p: *mut i32| p.cast::<c_void>().cast_const();
            // Not mapped: the host pointer itself (OpenMP 5.1).
            check_eq!(use_device_ptr(v(xp), dev)?, xp.cast::<c_void>());
            // SAFETY: `x` outlives the region and is touched only through it.
            unsafe {
                target_data_begin(dev, &[MapItem::tofrom(xp, 256)])?;
                let d = use_device_ptr(v(xp), dev)?;
                check!(d != xp.cast(), "device {dev}: not translated");
                check_eq!(use_device_addr(v(xp.add(4)), dev)?, d.cast::<u8>().add(16).cast::<c_void>());
                // Device memory used directly (is_device_ptr).
                omp_target_memset(d, 0, 256, dev)?;
                // if(false): the region runs on the host, on the host copy.
                let args = [LaunchArg::Value(Scalar::I32(5)), LaunchArg::mapped(xp)];
                target(if_device(false, dev)?, &ADD_I32, 64, &[], &args)?;
                check_eq!(x[0], 6);
                target(if_device(true, dev)?, &ADD_I32, 64, &[], &args)?;
                target_data_end(dev, &[MapItem::tofrom(xp, 256)])?;
            }
            check!(x.iter().all(|&e| e == 5), "device {dev}: {}", x[0]);
            // if(false) on a data construct maps nothing.
            // SAFETY: nothing is copied.
            unsafe { target_enter_data(if_device(false, dev)?, &[MapItem::to(x.as_ptr(), 256)])? };
            check!(!omp_target_is_present(v(xp), dev)?);
            check_eq!(if_device(false, dev)?, init);
        }
        check!(matches!(if_device(true, 99), Err(Error::NoSuchDevice { .. })));
        check!(rt.live_mappings().is_empty());
        Ok(())
    };
    run().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_safe_if_clause_runs_on_the_initial_device() {
    on_every_backend(
        "device_if",
        1,
        |b| b,
        |rt| {
            let mut x = vec![0i32; 32];
            for cond in [true, false] {
                let dev = rt.device_if(cond, 0)?;
                check_eq!(dev.number(), if cond { 0 } else { rt.initial_device() });
                dev.data(map::tofrom(&mut x), |v| offload_kernels::add_i32(&dev, 1, v))?;
            }
            check!(x.iter().all(|&e| e == 2));
            check!(rt.device_if(false, 99).is_err());
            Ok(())
        },
    );
}

/// One global per test run on every device: the runtimes of the backends are made in
/// turn, so each finds it unloaded and loads it from the host copy.
static TABLE: DeviceGlobal<[i32; 8]> = DeviceGlobal::new([1, 2, 3, 4, 5, 6, 7, 8]);

#[test]
fn declare_target_globals_have_a_copy_per_device() {
    on_every_backend(
        "declare target",
        1,
        |b| b,
        |rt| {
            *TABLE.host() = [1, 2, 3, 4, 5, 6, 7, 8];
            let host = TABLE.host_ptr() as usize;
            for d in 0..rt.num_devices() {
                let dev = rt.device(d)?;
                check!(!rt.is_present(host, d)?, "device {d}: loaded before first use");
                dev.launch(&ADD_I32, 8, (10i32, TABLE.arg(&dev)?))?;
                check!(rt.is_present(host, d)?);
                check_eq!(rt.mapped_ptr(host, d)?, Some(TABLE.device_addr(&dev)?));
                check_eq!(*TABLE.host(), [1, 2, 3, 4, 5, 6, 7, 8]);
                // A map of it copies nothing: it is present with an infinite count.
                let mut seen = [0i32; 8];
                // SAFETY: the table's host copy is not touched during the region (it is
                // `tofrom`, but present forever, so nothing is copied back into it).
                unsafe {
                    rt.target_data_begin(d, &[MapItem::tofrom(TABLE.host_ptr(), 32)])?;
                    rt.target_data_end(d, &[MapItem::tofrom(TABLE.host_ptr(), 32)])?;
                }
                check_eq!(*TABLE.host(), [1, 2, 3, 4, 5, 6, 7, 8]);
                TABLE.update_from(&dev)?;
                seen.copy_from_slice(&*TABLE.host());
                check_eq!(seen, [11, 12, 13, 14, 15, 16, 17, 18]);
                // Host change, update to, kernel, update from.
                TABLE.host()[0] = 100;
                TABLE.update_to(&dev)?;
                dev.launch(&ADD_I32, 8, (1i32, TABLE.arg(&dev)?))?;
                TABLE.update_from(&dev)?;
                check_eq!(TABLE.host()[..2], [101, 13]);
                *TABLE.host() = [1, 2, 3, 4, 5, 6, 7, 8];
            }
            // On the initial device the kernel writes the host copy itself.
            let init = rt.device(rt.initial_device())?;
            init.launch(&ADD_I32, 8, (1i32, TABLE.arg(&init)?))?;
            check_eq!(TABLE.host()[..2], [2, 3]);
            TABLE.update_from(&init)?; // a no-op there
            check_eq!(TABLE.host()[7], 9);
            // Each device keeps its own copy: device 0's still holds what its kernels made,
            // not the host's reset values nor the initial device's.
            let dev0 = rt.device(0)?;
            TABLE.update_from(&dev0)?;
            check_eq!(TABLE.host()[..3], [101, 13, 14]);
            Ok(())
        },
    );
}

#[test]
fn the_base_pointer_kernel_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc("clause kernels", &[&ADD_AT]);
}

#[test]
fn a_global_on_the_initial_device_holds_no_lock_across_the_launch() {
    static PAIR: DeviceGlobal<[i32; 8]> = DeviceGlobal::new([0; 8]);
    fn add_both(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
        // SAFETY: arguments 0 and 1 are copies of the global (8 i32 each).
        let (a, b) = unsafe { (l.slice_mut::<i32>(0, 8)?, l.slice_mut::<i32>(1, 8)?) };
        a.iter_mut().chain(b.iter_mut()).for_each(|v| *v += 1);
        Ok(())
    }
    static ADD_BOTH: Kernel = Kernel::new("add_both").with_host(add_both);
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(1).build().expect("runtime");
    let init = rt.device(rt.initial_device()).expect("initial device");
    // The same global twice in one launch: no deadlock; each argument is a copy.
    init.launch(&ADD_BOTH, 1, (PAIR.arg(&init).expect("arg"), PAIR.arg(&init).expect("arg")))
        .expect("launch");
    assert_eq!(*PAIR.host(), [1; 8]);
    // A global's argument is `Send`: it goes into a nowait launch.
    let dev = rt.device(0).expect("device 0");
    rt.nowait(|s| {
        let arg = PAIR.arg(&dev)?;
        s.launch(0, &ADD_I32, 8, (5i32, arg), &[]).map(drop)
    })
    .expect("scope")
    .expect("launch");
    PAIR.update_from(&dev).expect("update");
    assert_eq!(*PAIR.host(), [6; 8]);
}

#[test]
fn a_global_whose_host_copy_the_program_mapped_is_refused() {
    static MAPPED: DeviceGlobal<[u32; 4]> = DeviceGlobal::new([1; 4]);
    on_every_backend(
        "declare target over a program mapping",
        1,
        |b| b,
        |rt| {
            let dev = rt.device(0)?;
            // The host copy as the case expects it, whatever an earlier run left there.
            *MAPPED.host() = [1; 4];
            let host = MAPPED.host();
            // SAFETY: the host copy is locked while it is read (entering only reads).
            unsafe { rt.enter_data(0, &[MapItem::to(host.as_ptr(), 4)])? };
            drop(host);
            let e = fails(MAPPED.arg(&dev).map(drop), "a global mapped by the program")?;
            check!(e.to_string().contains("mapped by the program"), "{e}");
            // SAFETY: nothing is copied back.
            unsafe { rt.exit_data(0, &[MapItem::delete(MAPPED.host_ptr(), 4)])? };
            dev.launch(&ADD_I32, 4, (1i32, MAPPED.arg(&dev)?))?;
            MAPPED.update_from(&dev)?;
            check_eq!(*MAPPED.host(), [2; 4]);
            *MAPPED.host() = [1; 4];
            Ok(())
        },
    );
}

#[test]
fn a_captured_pointer_is_found_through_its_sections_base() {
    // C: `target enter data map(tofrom: A[64:128])`, then `target` capturing `A` and indexing
    // `A[i + 64]`: the pointer is initialised through the section its map named it the
    // base of (OpenMP 5.2, 5.8.6), as `omp_get_mapped_ptr` of a zero-length section does.
    each_device_and_the_initial_one("captured base pointers", |rt, d| {
        let mut a: Vec<i32> = (0..256).collect();
        let base = a.as_mut_ptr();
        let section = base.wrapping_add(64);
        let args =
            [LaunchArg::Value(Scalar::I32(1000)), LaunchArg::Value(Scalar::U64(64)), LaunchArg::mapped(base)];
        // SAFETY: `a` outlives the mapping, ended below; the host does not touch it meanwhile.
        unsafe {
            rt.enter_data(d, &[MapItem::tofrom(section, 128 * 4).with_base(base)])?;
            rt.target_launch(d, &ADD_AT, 128, &[], &args)?;
            rt.exit_data(d, &[MapItem::from(section, 128 * 4)])?;
        }
        check!(
            a[64..192].iter().enumerate().all(|(i, &x)| x == i as i32 + 1064),
            "device {d}: {:?}",
            &a[64..66]
        );
        check!(a[..64].iter().enumerate().all(|(i, &x)| x == i as i32));
        check!(a[192..].iter().enumerate().all(|(i, &x)| x == i as i32 + 192));
        // Without the base in the map, `A` is below the section and maps to nothing there.
        if d != rt.initial_device() {
            // SAFETY: as above; the launch fails before running.
            let e = unsafe {
                rt.enter_data(d, &[MapItem::to(section.cast_const(), 128 * 4)])?;
                let r = fails(rt.target_launch(d, &ADD_AT, 128, &[], &args), "A without its base");
                rt.exit_data(d, &[MapItem::release(section.cast_const(), 128 * 4)])?;
                r?
            };
            check!(matches!(e, Error::KernelArgument { index: 2, .. }), "{e:?}");
            check!(e.to_string().contains("nor the base of one"), "{e}");
        }
        check!(rt.live_mappings().is_empty());
        Ok(())
    });
}

#[test]
fn a_captured_pointer_to_device_memory_keeps_its_value() {
    // C: `int *p = omp_target_alloc(...)`, then `target` using `p` with no map and no
    // `is_device_ptr`: p points to no mapped storage and keeps its value (5.8.6).
    on_every_backend(
        "captured device pointers",
        1,
        |b| b,
        |rt| {
            for d in 0..rt.num_devices() {
                let p = rt.target_alloc(64 * 4, d)?;
                let args = [LaunchArg::Value(Scalar::I32(7)), LaunchArg::Mapped(p as usize)];
                // SAFETY: `p` is 64 i32 of device `d`, freed below.
                unsafe {
                    rt.target_memset(p, 0, 64 * 4, d)?;
                    rt.target_launch(d, &ADD_I32, 64, &[], &args)?;
                }
                let mut back = vec![0i32; 64];
                // SAFETY: `back` holds 64 i32; `p` is device memory of that size.
                unsafe {
                    rt.target_memcpy(back.as_mut_ptr() as u64, p, 64 * 4, 0, 0, rt.initial_device(), d)?
                };
                // SAFETY: allocated above, no longer used.
                unsafe { rt.target_free(p, d)? };
                check_eq!(back, vec![7; 64]);
                // A host address inside no mapping, and no device memory, is refused.
                let x = [0i32; 4];
                let host_args = [LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(x.as_ptr())];
                // SAFETY: the launch is refused before running.
                let e = fails(unsafe { rt.target_launch(d, &ADD_I32, 4, &[], &host_args) }, "host memory")?;
                check!(e.to_string().contains("is not mapped on device"), "{e}");
            }
            check!(rt.live_mappings().is_empty());
            Ok(())
        },
    );
}

#[test]
fn an_implicit_map_of_a_partly_mapped_variable_maps_the_part_present() {
    // C: `target enter data map(to: arr[50:2])`, then `target` using `arr` with no map clause
    // (an implicit `tofrom: arr[0:100]`): only the part present keeps device storage (OpenMP
    // 5.2, 5.8.3), the region moves its count and the kernel's `arr` is translated through it.
    on_every_backend(
        "implicit maps",
        1,
        |b| b,
        |rt| {
            for d in 0..rt.num_devices() {
                let mut arr: Vec<i32> = (0..100).collect();
                let p = arr.as_mut_ptr();
                let part = p.wrapping_add(50);
                let implicit = [MapItem::tofrom(p, 400).implicit()];
                let args = [
                    LaunchArg::Value(Scalar::I32(1000)),
                    LaunchArg::Value(Scalar::U64(50)),
                    LaunchArg::mapped(p),
                ];
                // SAFETY: `arr` outlives every mapping, all ended below; the host does not touch
                // it meanwhile.
                unsafe {
                    rt.enter_data(d, &[MapItem::to(part.cast_const(), 8)])?;
                    rt.target_launch(d, &ADD_AT, 2, &implicit, &args)?;
                    let e = rt.entry(part as usize, d)?;
                    check!(
                        e.as_ref().is_some_and(|e| e.ref_count == 1 && e.range.bytes == 8),
                        "device {d}: {e:?}"
                    );
                    check_eq!(rt.live_mappings().len(), 1);
                    // The same map written explicitly is an extension, as before.
                    let explicit = [MapItem::tofrom(p, 400)];
                    let e = fails(rt.target_launch(d, &ADD_AT, 2, &explicit, &args), "explicit extension")?;
                    check!(matches!(e, Error::Extension { .. }), "{e:?}");
                    rt.exit_data(d, &[MapItem::from(part, 8)])?;
                }
                check!(arr[50..52] == [1050, 1051], "device {d}: {:?}", &arr[48..54]);
                check!(arr.iter().enumerate().all(|(i, &v)| v == i as i32 || (50..52).contains(&i)));
                // Nothing of it mapped: the implicit map is the whole variable's, copied both ways.
                let args = [
                    LaunchArg::Value(Scalar::I32(1)),
                    LaunchArg::Value(Scalar::U64(0)),
                    LaunchArg::mapped(p),
                ];
                // SAFETY: as above.
                unsafe { rt.target_launch(d, &ADD_AT, 100, &implicit, &args)? };
                check!(arr[0] == 1 && arr[99] == 100 && arr[50] == 1051, "device {d}: {:?}", &arr[..3]);
                // Implicit maps are a target region's: refused on the data constructs.
                // SAFETY: refused before anything is mapped.
                let e = fails(
                    unsafe { rt.enter_data(d, &[MapItem::to(p.cast_const(), 400).implicit()]) },
                    "enter",
                )?;
                check!(e.to_string().contains("implicit"), "{e}");
                check!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
            }
            Ok(())
        },
    );
}

/// Set by [`gated_add`] once it runs; it then waits until [`IMPLICIT_GATE_OPEN`].
static IMPLICIT_GATE_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static IMPLICIT_GATE_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `add_at`, once the test opens its gate (an error after a minute).
fn gated_add(l: &HostLaunch<'_>) -> std::result::Result<(), String> {
    use std::sync::atomic::Ordering::SeqCst;
    IMPLICIT_GATE_STARTED.store(true, SeqCst);
    let start = std::time::Instant::now();
    while !IMPLICIT_GATE_OPEN.load(SeqCst) {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return Err("the gate was never opened".into());
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    add_at(l)
}

static GATED_ADD_AT: Kernel = Kernel::new("gated_add_at").with_host(gated_add);

#[test]
fn an_implicit_map_ends_on_the_part_it_entered_whatever_others_map_meanwhile() {
    // A region maps `arr[0:100]` implicitly where `arr[50:2]` is present; while its kernel
    // runs, another thread maps `arr[10:5]`. The region's end and its kernel's pointer must
    // use the part the region entered, not a new lookup (which would now find `arr[10:5]`,
    // end that thread's mapping and leave `arr[50:2]` counted for ever). Host devices, each
    // construct waiting, so that the region's end comes after the other thread's map.
    use std::sync::atomic::Ordering::SeqCst;
    let rt = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .host_devices(1)
        .synchronous(true)
        .build()
        .expect("runtime");
    let mut arr: Vec<i32> = (0..100).collect();
    let p = arr.as_mut_ptr();
    let (part, other) = (p.wrapping_add(50), p.wrapping_add(10));
    IMPLICIT_GATE_STARTED.store(false, SeqCst);
    IMPLICIT_GATE_OPEN.store(false, SeqCst);
    let (pa, oa) = (p as usize, other as usize);
    let r: Result<()> = std::thread::scope(|s| {
        // SAFETY: `arr` outlives every mapping, all ended below; only the runtime's copies
        // touch it until then (the same for each block below).
        unsafe { rt.enter_data(0, &[MapItem::to(part.cast_const(), 8)])? };
        let region = s.spawn(|| {
            let p = pa as *mut i32;
            let args = [
                LaunchArg::Value(Scalar::I32(1000)),
                LaunchArg::Value(Scalar::U64(50)),
                LaunchArg::mapped(p),
            ];
            // SAFETY: as above.
            unsafe { rt.target_launch(0, &GATED_ADD_AT, 2, &[MapItem::tofrom(p, 400).implicit()], &args) }
        });
        while !IMPLICIT_GATE_STARTED.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        // `alloc`: a copy would queue behind the gated kernel on the host device's one worker.
        // SAFETY: as above.
        let mapped = unsafe { rt.enter_data(0, &[MapItem::alloc(oa as *const i32, 20)]) };
        IMPLICIT_GATE_OPEN.store(true, SeqCst);
        let ran = region
            .join()
            .unwrap_or_else(|_| Err(Error::InvalidArgument { routine: "thread", what: "panicked".into() }));
        mapped?;
        ran?;
        let counts = |at: *mut i32| rt.entry(at as usize, 0).map(|e| e.map(|e| e.ref_count));
        check_eq!(counts(part)?, Some(1));
        check_eq!(counts(other)?, Some(1));
        // SAFETY: as above.
        unsafe {
            rt.exit_data(0, &[MapItem::release(oa as *const i32, 20)])?;
            rt.exit_data(0, &[MapItem::from(part, 8)])?;
        }
        Ok(())
    });
    r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&arr[48..54], &[48, 49, 1050, 1051, 52, 53]);
    assert!(rt.live_mappings().is_empty(), "{:?}", rt.live_mappings());
}
