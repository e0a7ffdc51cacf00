//! Bad input, table-driven: every public routine of both APIs given arguments it must
//! refuse. Each case is a named closure that makes the bad call (with whatever set-up and
//! clean-up it needs) and checks the error: its variant, and the parts its message must
//! name (the device, the range or address, what was expected). The harness then checks
//! that nothing is left mapped on any device and that no device's pool holds more live
//! allocations than before the case.
//!
//! The runtime cases run on every device of every backend (`on_every_device`); the `omp`
//! cases run on every device of the process-wide runtime. Outcomes that depend on
//! reference counts, or on how exit and update treat a range partly inside a mapped one,
//! are left to the conformance tests.

use std::ffi::c_void;
use std::fmt::Display;
use std::ops::Bound;
use std::ptr::{null, null_mut};

use offload::partition::{BlockPartition, DistributedArray, RowPartition};
use offload::pipeline::Pipeline;
use offload::{
    map, DevicePtr, DeviceSlice, Error, Gemm, HostBuffer, HostLaunch, HostRange, Kernel, LaunchArg, MapItem,
    MapType, RectSide, Result, Runtime, Scalar, UpdateDirection, UpdateItem,
};
use offload_kernels::FILL_I32;
use offload_tests::{check, on_every_device};

/// What a case found: checked, or skipped because the runtime has a single device, or
/// because only host kernels check their arguments (GPU kernels take raw bytes).
enum Outcome {
    Checked,
    NeedsTwoDevices,
    HostKernelsOnly,
}

type Check = std::result::Result<Outcome, String>;

/// One bad input.
struct Case<C> {
    name: &'static str,
    run: Box<dyn Fn(&C) -> Check>,
}

fn case<C>(name: &'static str, run: impl Fn(&C) -> Check + 'static) -> Case<C> {
    Case { name, run: Box::new(run) }
}

/// `r` must be an error for which `is` holds, whose message contains each of `needles`.
fn expect<T: std::fmt::Debug>(r: Result<T>, is: impl Fn(&Error) -> bool, needles: &[&dyn Display]) -> Check {
    let e = match r {
        Ok(v) => return Err(format!("expected an error, got Ok({v:?})")),
        Err(e) => e,
    };
    if !is(&e) {
        return Err(format!("wrong error variant: {e:?}"));
    }
    let msg = e.to_string();
    for n in needles {
        let n = n.to_string();
        if !msg.contains(&n) {
            return Err(format!("message {msg:?} does not name {n:?}"));
        }
    }
    Ok(Outcome::Checked)
}

macro_rules! expect {
    ($r:expr, $pat:pat $(, $needle:expr)* $(,)?) => {
        expect($r, |e| matches!(e, $pat), &[$(&$needle as &dyn Display),*])
    };
}

/// What a launch whose kernel fails as it runs reports: its own error when launches wait
/// (`OFFLOAD_SYNC=1`), else the error of the next synchronising call, which names the
/// launch (`Error::Queued`); its cause is what the case checks.
fn reported(rt: &Runtime, d: usize, launched: Result<()>) -> Result<()> {
    match launched.and_then(|()| rt.synchronize(d)) {
        Err(Error::Queued { source, .. }) => Err(*source),
        other => other,
    }
}

/// Set-up and clean-up steps inside a case must succeed.
fn ok<T>(r: Result<T>) -> std::result::Result<T, String> {
    r.map_err(|e| format!("set-up or clean-up failed: {e}"))
}

// Unsafe calls in one place each. Every case passes either live host arrays (at least as
// long as any length it gives with them) and live device blocks, or arguments the runtime
// must refuse before it reads or writes anything; a refusal that did not happen is the
// failure the case reports.

fn enter(rt: &Runtime, d: usize, items: &[MapItem]) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.enter_data(d, items) }
}
fn exit(rt: &Runtime, d: usize, items: &[MapItem]) -> Result<()> {
    // SAFETY: see above; exit items in these cases are `release`/`delete` or refused.
    unsafe { rt.exit_data(d, items) }
}
fn begin(rt: &Runtime, d: usize, items: &[MapItem]) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.target_data_begin(d, items) }
}
fn end(rt: &Runtime, d: usize, items: &[MapItem]) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.target_data_end(d, items) }
}
fn update(rt: &Runtime, d: usize, dir: UpdateDirection, items: &[(HostRange, bool)]) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.update(d, dir, items) }
}
fn launch(rt: &Runtime, d: usize, k: &Kernel, n: usize, maps: &[MapItem], args: &[LaunchArg]) -> Result<()> {
    // SAFETY: see above; kernels touch at most `n` elements of what the runtime translated.
    unsafe { rt.target_launch(d, k, n, maps, args) }
}
#[allow(clippy::too_many_arguments)]
fn memcpy(
    rt: &Runtime,
    dst: u64,
    src: u64,
    len: usize,
    doff: usize,
    soff: usize,
    dd: usize,
    sd: usize,
) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.target_memcpy(dst, src, len, doff, soff, dd, sd) }
}
fn memset(rt: &Runtime, p: u64, len: usize, d: usize) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.target_memset(p, 0x5a, len, d) }
}
fn rect(rt: &Runtime, es: usize, vol: &[usize], dst: RectSide<'_>, src: RectSide<'_>) -> Result<()> {
    // SAFETY: see above.
    unsafe { rt.target_memcpy_rect(es, vol, dst, src) }
}
fn associate(rt: &Runtime, host: usize, dp: u64, bytes: usize, off: usize, d: usize) -> Result<()> {
    // SAFETY: see above; associations made by a case are removed by it.
    unsafe { rt.associate_ptr(host, dp, bytes, off, d) }
}
fn disassociate(rt: &Runtime, host: usize, d: usize) -> Result<()> {
    // SAFETY: no kernel runs during these cases.
    unsafe { rt.disassociate_ptr(host, d) }
}
fn free(rt: &Runtime, p: u64, d: usize) -> Result<()> {
    // SAFETY: nothing uses the block afterwards.
    unsafe { rt.target_free(p, d) }
}

fn side(
    ptr: u64,
    device: usize,
    offsets: &'static [usize],
    dimensions: &'static [usize],
) -> RectSide<'static> {
    RectSide { ptr, device, offsets, dimensions }
}

/// A host kernel that touches nothing.
fn nothing(_: &HostLaunch<'_>) -> std::result::Result<(), String> {
    Ok(())
}
static NO_IMPL: Kernel = Kernel::new("no_impl");
static NOTHING: Kernel = Kernel::new("nothing").with_host(nothing);

/// What a runtime case is given: the runtime, the device under test and, when there is
/// one, another device.
struct Ctx<'a> {
    rt: &'a Runtime,
    dev: usize,
    other: Option<usize>,
}

impl Ctx<'_> {
    fn init(&self) -> usize {
        self.rt.initial_device()
    }
    /// The first device number that does not exist.
    fn bad(&self) -> usize {
        self.rt.num_devices() + 1
    }
    /// Whether the device under test is a host device.
    fn host(&self) -> bool {
        self.rt.describe(self.dev).is_ok_and(|d| d.kind == offload::BackendKind::Host)
    }
    fn me(&self) -> String {
        format!("device {}", self.dev)
    }
    /// A live block of `bytes` on the device under test, freed after `f`.
    fn with_block(&self, bytes: usize, f: impl FnOnce(u64) -> Check) -> Check {
        let p = ok(self.rt.target_alloc(bytes, self.dev))?;
        let r = f(p);
        ok(free(self.rt, p, self.dev))?;
        r
    }
    /// A pointer the device under test allocated and freed again (back in the pool's cache).
    fn freed_block(&self, bytes: usize) -> std::result::Result<u64, String> {
        let p = ok(self.rt.target_alloc(bytes, self.dev))?;
        ok(free(self.rt, p, self.dev))?;
        Ok(p)
    }
    /// Runs `f` while `x` is mapped by `enter data` on the device under test.
    fn with_mapped(&self, x: &[i32], f: impl FnOnce() -> Check) -> Check {
        ok(enter(self.rt, self.dev, &[MapItem::slice(x, MapType::TO)]))?;
        let r = f();
        ok(exit(self.rt, self.dev, &[MapItem::slice(x, MapType::DELETE)]))?;
        r
    }
}

fn no_such(e: &Error, device: usize) -> bool {
    matches!(e, Error::NoSuchDevice { device: d, .. } if *d == device as i64)
}

/// A host range whose end overflows the address space.
const PAST_THE_END: HostRange = HostRange::new(usize::MAX - 15, 32);
const PAST_THE_END_TEXT: &str = "0xfffffffffffffff0 + 32 bytes";
/// A non-null host address that is never read: every call given it must be refused first.
const NULL_RANGE: HostRange = HostRange::new(0, 16);

fn raw(r: HostRange, t: MapType) -> MapItem {
    MapItem::new(r, t)
}

/// The runtime and safe-API cases.
fn runtime_cases<'a>() -> Vec<Case<Ctx<'a>>> {
    let mut v: Vec<Case<Ctx<'a>>> = Vec::new();

    // ---- device numbers out of range ------------------------------------------------
    macro_rules! bad_device {
        ($name:expr, |$c:ident, $b:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                let $b = $c.bad();
                let want = format!("device {} does not exist", $b);
                let n = format!("{} devices", $c.rt.num_devices());
                expect($call, |e| no_such(e, $b), &[&want, &n])
            }));
        };
    }
    bad_device!("device(): no such device", |c, b| c.rt.device(b));
    bad_device!("target_alloc: no such device", |c, b| c.rt.target_alloc(16, b));
    v.push(case("target_alloc: device usize::MAX", |c: &Ctx<'_>| {
        expect!(c.rt.target_alloc(16, usize::MAX), Error::NoSuchDevice { .. }, "does not exist")
    }));
    bad_device!("target_free: no such device", |c, b| free(c.rt, 0x1000, b));
    bad_device!("is_present: no such device", |c, b| c.rt.is_present(0x1000, b));
    bad_device!("mapped_ptr: no such device", |c, b| c.rt.mapped_ptr(0x1000, b));
    bad_device!("entry: no such device", |c, b| c.rt.entry(0x1000, b));
    bad_device!("dump_present_table: no such device", |c, b| c.rt.dump_present_table(b));
    bad_device!("enter_data: no such device", |c, b| enter(c.rt, b, &[]));
    bad_device!("exit_data: no such device", |c, b| exit(c.rt, b, &[]));
    bad_device!("target_data_begin: no such device", |c, b| begin(c.rt, b, &[]));
    bad_device!("target_data_end: no such device", |c, b| end(c.rt, b, &[]));
    bad_device!("update: no such device", |c, b| update(c.rt, b, UpdateDirection::To, &[]));
    bad_device!("target_launch: no such device", |c, b| launch(c.rt, b, &NOTHING, 1, &[], &[]));
    bad_device!("memset: no such device", |c, b| memset(c.rt, 0x1000, 4, b));
    bad_device!("associate_ptr: no such device", |c, b| associate(c.rt, 0x1000, 0x2000, 4, 0, b));
    bad_device!("disassociate_ptr: no such device", |c, b| disassociate(c.rt, 0x1000, b));
    bad_device!("mem_info: no such device", |c, b| c.rt.mem_info(b));
    bad_device!("transfer_stats: no such device", |c, b| c.rt.transfer_stats(b));
    bad_device!("pool_usage: no such device", |c, b| c.rt.pool_usage(b));
    bad_device!("describe: no such device", |c, b| c.rt.describe(b));
    bad_device!("placement: no such device", |c, b| c.rt.placement(b));
    bad_device!("synchronize: no such device", |c, b| c.rt.synchronize(b));
    bad_device!("can_access_peer: no such destination", |c, b| c.rt.can_access_peer(b, c.dev));
    bad_device!("staging_report: no such device", |c, b| c.rt.staging_report(b));
    bad_device!("worker_binding: no such device", |c, b| c.rt.worker_binding(b));
    bad_device!("Pipeline::new: no such device", |c, b| Pipeline::new(c.rt, &[c.dev, b], 2).map(drop));
    bad_device!("HostBuffer::enter: no such device", |c, b| {
        HostBuffer::<i32>::new(c.rt, 4).and_then(|buf| buf.enter(b, MapType::TO))
    });
    bad_device!("nowait enter: no such device", |c, b| {
        let x = [0i32; 4];
        c.rt.nowait(|s| s.enter(b, map::to(&x), &[]).map(drop)).and_then(|r| r)
    });
    bad_device!("memcpy: no such destination device", |c, b| {
        let h = [0u8; 16];
        memcpy(c.rt, 0x1000, h.as_ptr() as u64, 16, 0, 0, b, c.init())
    });
    bad_device!("memcpy: no such source device", |c, b| {
        let mut h = [0u8; 16];
        memcpy(c.rt, h.as_mut_ptr() as u64, 0x1000, 16, 0, 0, c.init(), b)
    });
    bad_device!("memcpy_rect: no such destination device", |c, b| {
        let h = [0u8; 16];
        rect(c.rt, 1, &[4], side(0x1000, b, &[0], &[4]), side(h.as_ptr() as u64, c.init(), &[0], &[16]))
    });
    v.push(case("dump_present_table: the initial device has no table", |c: &Ctx<'_>| {
        let i = c.init();
        expect(c.rt.dump_present_table(i), |e| no_such(e, i), &[&format!("device {i} does not exist")])
    }));
    v.push(case("Pipeline::new: the initial device", |c: &Ctx<'_>| {
        let i = c.init();
        expect(Pipeline::new(c.rt, &[i], 2).map(drop), |e| no_such(e, i), &[&format!("device {i}")])
    }));

    // ---- null host pointers with a non-zero size ------------------------------------
    macro_rules! null_host {
        ($name:expr, $routine:expr, |$c:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                expect!(
                    $call,
                    Error::InvalidArgument { routine: $routine, .. },
                    $c.me(),
                    NULL_RANGE,
                    "null host pointer",
                    "expected a host address"
                )
            }));
        };
    }
    null_host!("enter_data: null host pointer", "target enter data", |c| enter(
        c.rt,
        c.dev,
        &[raw(NULL_RANGE, MapType::TO)]
    ));
    null_host!("exit_data: null host pointer", "target exit data", |c| exit(
        c.rt,
        c.dev,
        &[raw(NULL_RANGE, MapType::RELEASE)]
    ));
    null_host!("target_data_begin: null host pointer", "target data", |c| begin(
        c.rt,
        c.dev,
        &[raw(NULL_RANGE, MapType::ALLOC)]
    ));
    null_host!("target_data_end: null host pointer", "target data", |c| end(
        c.rt,
        c.dev,
        &[raw(NULL_RANGE, MapType::FROM)]
    ));
    null_host!("target_launch: null host pointer in the map list", "target", |c| {
        launch(c.rt, c.dev, &NOTHING, 1, &[raw(NULL_RANGE, MapType::TOFROM)], &[])
    });
    null_host!("update to: null host pointer", "target update", |c| update(
        c.rt,
        c.dev,
        UpdateDirection::To,
        &[(NULL_RANGE, false)]
    ));
    null_host!("update from: null host pointer", "target update", |c| update(
        c.rt,
        c.dev,
        UpdateDirection::From,
        &[(NULL_RANGE, false)]
    ));
    null_host!("enter_data: null host pointer after a good item", "target enter data", |c| {
        let x = [1i32; 4];
        enter(c.rt, c.dev, &[MapItem::slice(&x, MapType::TO), raw(NULL_RANGE, MapType::TO)])
    });
    v.push(case("enter_data: null host pointer on the initial device", |c: &Ctx<'_>| {
        let i = c.init();
        expect!(
            enter(c.rt, i, &[raw(NULL_RANGE, MapType::TO)]),
            Error::InvalidArgument { .. },
            format!("device {i}"),
            "null host pointer"
        )
    }));
    v.push(case("memcpy: null destination (host)", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            let i = c.init();
            expect!(
                memcpy(c.rt, 0, p, 16, 0, 0, i, c.dev),
                Error::InvalidArgument { routine: "omp_target_memcpy", .. },
                format!("device {i}"),
                "destination pointer is null",
                "length 16"
            )
        })
    }));
    v.push(case("memcpy: null source (host)", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            let i = c.init();
            expect!(
                memcpy(c.rt, p, 0, 16, 0, 0, c.dev, i),
                Error::InvalidArgument { routine: "omp_target_memcpy", .. },
                format!("device {i}"),
                "source pointer is null"
            )
        })
    }));
    v.push(case("memcpy: null device source", |c: &Ctx<'_>| {
        let mut h = [0u8; 16];
        expect!(
            memcpy(c.rt, h.as_mut_ptr() as u64, 0, 16, 0, 0, c.init(), c.dev),
            Error::InvalidArgument { .. },
            c.me(),
            "source pointer is null"
        )
    }));
    v.push(case("memset: null device pointer", |c: &Ctx<'_>| {
        expect!(
            memset(c.rt, 0, 16, c.dev),
            Error::InvalidArgument { routine: "omp_target_memset", .. },
            c.me(),
            "pointer is null",
            "count 16"
        )
    }));
    v.push(case("memset: null host pointer on the initial device", |c: &Ctx<'_>| {
        let i = c.init();
        expect!(
            memset(c.rt, 0, 16, i),
            Error::InvalidArgument { routine: "omp_target_memset", .. },
            format!("device {i}"),
            "pointer is null"
        )
    }));
    v.push(case("associate_ptr: null host pointer", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            expect!(
                associate(c.rt, 0, p, 16, 0, c.dev),
                Error::InvalidArgument { routine: "omp_target_associate_ptr", .. },
                c.me(),
                "host pointer is null"
            )
        })
    }));
    v.push(case("associate_ptr: null device pointer", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        expect!(
            associate(c.rt, x.as_ptr() as usize, 0, 16, 0, c.dev),
            Error::InvalidArgument { .. },
            c.me(),
            "device pointer is null",
            "expected a device address"
        )
    }));
    v.push(case("disassociate_ptr: null host pointer", |c: &Ctx<'_>| {
        expect!(
            disassociate(c.rt, 0, c.dev),
            Error::InvalidArgument { routine: "omp_target_disassociate_ptr", .. },
            "host pointer is null"
        )
    }));
    v.push(case("memcpy_rect: null destination", |c: &Ctx<'_>| {
        let h = [0u8; 16];
        expect!(
            rect(c.rt, 1, &[4], side(0, c.dev, &[0], &[4]), side(h.as_ptr() as u64, c.init(), &[0], &[16])),
            Error::InvalidArgument { routine: "omp_target_memcpy_rect", .. },
            c.me(),
            "destination pointer is null"
        )
    }));
    v.push(case("memcpy_rect: null source", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            let i = c.init();
            expect!(
                rect(c.rt, 1, &[4], side(p, c.dev, &[0], &[16]), side(0, i, &[0], &[4])),
                Error::InvalidArgument { .. },
                format!("device {i}"),
                "source pointer is null"
            )
        })
    }));

    // ---- host ranges whose end overflows ---------------------------------------------
    macro_rules! overflowing {
        ($name:expr, $routine:expr, |$c:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                expect!(
                    $call,
                    Error::Overflow { routine: $routine, .. },
                    $c.me(),
                    PAST_THE_END_TEXT,
                    "overflows"
                )
            }));
        };
    }
    overflowing!("enter_data: range past the address space", "target enter data", |c| enter(
        c.rt,
        c.dev,
        &[raw(PAST_THE_END, MapType::TO)]
    ));
    overflowing!("exit_data: range past the address space", "target exit data", |c| exit(
        c.rt,
        c.dev,
        &[raw(PAST_THE_END, MapType::DELETE)]
    ));
    overflowing!("target_data_begin: range past the address space", "target data", |c| begin(
        c.rt,
        c.dev,
        &[raw(PAST_THE_END, MapType::TO)]
    ));
    overflowing!("target_data_end: range past the address space", "target data", |c| end(
        c.rt,
        c.dev,
        &[raw(PAST_THE_END, MapType::TOFROM)]
    ));
    overflowing!("target_launch: map range past the address space", "target", |c| launch(
        c.rt,
        c.dev,
        &NOTHING,
        1,
        &[raw(PAST_THE_END, MapType::ALLOC)],
        &[]
    ));
    overflowing!("update: range past the address space", "target update", |c| update(
        c.rt,
        c.dev,
        UpdateDirection::From,
        &[(PAST_THE_END, true)]
    ));
    overflowing!("enter_data: overflowing range after a good item", "target enter data", |c| {
        let x = [1i32; 4];
        enter(c.rt, c.dev, &[MapItem::slice(&x, MapType::TO), raw(PAST_THE_END, MapType::TO)])
    });
    v.push(case("associate_ptr: host range past the address space", |c: &Ctx<'_>| {
        c.with_block(32, |p| {
            expect!(
                associate(c.rt, PAST_THE_END.begin, p, 32, 0, c.dev),
                Error::Overflow { routine: "omp_target_associate_ptr", .. },
                c.me(),
                PAST_THE_END_TEXT
            )
        })
    }));

    // ---- map kinds a construct does not allow -----------------------------------------
    macro_rules! wrong_kind {
        ($name:expr, $routine:expr, $expected:expr, |$c:ident, $x:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                #[allow(unused_mut)]
                let mut $x = [1i32; 4];
                let range = HostRange::of(&$x);
                expect!(
                    $call,
                    Error::InvalidArgument { routine: $routine, .. },
                    $c.me(),
                    range,
                    "is not allowed",
                    $expected
                )
            }));
        };
    }
    const DATA_KINDS: &str = "expected to, from, tofrom or alloc";
    const ENTER_KINDS: &str = "expected to, tofrom or alloc";
    const EXIT_KINDS: &str = "expected from, tofrom, release or delete";
    /// A construct over a raw map list.
    type ListFn = fn(&Runtime, usize, &[MapItem]) -> Result<()>;
    let raw_lists: [(&'static str, ListFn, &'static str, &'static str, MapType); 8] = [
        ("enter_data: from", enter, "target enter data", ENTER_KINDS, MapType::FROM),
        ("enter_data: release", enter, "target enter data", ENTER_KINDS, MapType::RELEASE),
        ("enter_data: delete", enter, "target enter data", ENTER_KINDS, MapType::DELETE),
        ("exit_data: to", exit, "target exit data", EXIT_KINDS, MapType::TO),
        ("exit_data: alloc", exit, "target exit data", EXIT_KINDS, MapType::ALLOC),
        ("target_data_begin: release", begin, "target data", DATA_KINDS, MapType::RELEASE),
        ("target_data_begin: delete", begin, "target data", DATA_KINDS, MapType::DELETE),
        ("target_data_end: release", end, "target data", DATA_KINDS, MapType::RELEASE),
    ];
    for (name, construct, routine, expected, t) in raw_lists {
        v.push(case(name, move |c: &Ctx<'_>| {
            let mut x = [1i32; 4];
            let r = construct(c.rt, c.dev, &[MapItem::slice_mut(&mut x, t)]);
            expect(
                r,
                |e| matches!(e, Error::InvalidArgument { routine: r, .. } if *r == routine),
                &[&c.me(), &HostRange::of(&x), &"is not allowed", &expected],
            )
        }));
    }
    wrong_kind!("target_launch: delete in the map list", "target", DATA_KINDS, |c, x| launch(
        c.rt,
        c.dev,
        &NOTHING,
        1,
        &[MapItem::slice(&x, MapType::DELETE)],
        &[]
    ));
    wrong_kind!("target_launch: wrong kind after a good item", "target", DATA_KINDS, |c, x| {
        let y = [0i32; 4];
        launch(
            c.rt,
            c.dev,
            &NOTHING,
            1,
            &[MapItem::slice(&y, MapType::TO), MapItem::slice(&x, MapType::RELEASE)],
            &[],
        )
    });
    wrong_kind!("Device::data: map::release", "target data", DATA_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.data(map::release(&x), |_| Ok(()))));
    wrong_kind!("Device::data: map::delete", "target data", DATA_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.data(map::delete(&x), |_| Ok(()))));
    wrong_kind!("Device::enter_data: map::delete", "target enter data", ENTER_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.enter_data(map::delete(&x)).map(drop)));
    wrong_kind!("Device::enter_data: map::release", "target enter data", ENTER_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.enter_data(map::release(&x)).map(drop)));
    wrong_kind!("Device::exit_data: map::to", "target exit data", EXIT_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.exit_data(map::to(&x))));
    wrong_kind!("Device::exit_data: map::alloc", "target exit data", EXIT_KINDS, |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.exit_data(map::alloc(&x))));
    wrong_kind!("Device::target: map::release", "target data", DATA_KINDS, |c, x| {
        c.rt.device(c.dev).and_then(|d| d.target(&NOTHING, 1, map::release(&x), |v| (v,)))
    });
    v.push(case("HostBuffer::enter: release", |c: &Ctx<'_>| {
        let b = ok(HostBuffer::<i32>::new(c.rt, 4))?;
        expect!(
            b.enter(c.dev, MapType::RELEASE),
            Error::InvalidArgument { routine: "target enter data", .. },
            c.me(),
            HostRange::of(&b),
            ENTER_KINDS
        )
    }));
    v.push(case("HostBuffer::exit: to", |c: &Ctx<'_>| {
        let mut b = ok(HostBuffer::<i32>::new(c.rt, 4))?;
        let r = HostRange::of(&b);
        expect!(
            b.exit(c.dev, MapType::TO),
            Error::InvalidArgument { routine: "target exit data", .. },
            c.me(),
            r,
            EXIT_KINDS
        )
    }));
    v.push(case("enter_data: wrong kind on the initial device", |c: &Ctx<'_>| {
        let x = [1i32; 4];
        let i = c.init();
        expect!(
            enter(c.rt, i, &[MapItem::slice(&x, MapType::DELETE)]),
            Error::InvalidArgument { .. },
            format!("device {i}"),
            ENTER_KINDS
        )
    }));

    // ---- `present` on an absent range ----------------------------------------------
    macro_rules! absent {
        ($name:expr, |$c:ident, $x:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                #[allow(unused_mut)]
                let mut $x = [1i32; 4];
                let range = HostRange::of(&$x);
                expect!($call, Error::NotPresent { .. }, $c.me(), range, "is not present")
            }));
        };
    }
    absent!("enter_data: present, absent", |c, x| enter(
        c.rt,
        c.dev,
        &[MapItem::slice(&x, MapType::TO.present())]
    ));
    absent!("target_data_begin: present, absent", |c, x| begin(
        c.rt,
        c.dev,
        &[MapItem::slice(&x, MapType::ALLOC.present())]
    ));
    absent!("target_launch: present map, absent", |c, x| launch(
        c.rt,
        c.dev,
        &NOTHING,
        1,
        &[MapItem::slice(&x, MapType::TO.present())],
        &[]
    ));
    absent!("update to: present, absent", |c, x| update(
        c.rt,
        c.dev,
        UpdateDirection::To,
        &[(HostRange::of(&x), true)]
    ));
    absent!("Device::data: present, absent", |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.data(map::tofrom(&mut x).present(), |_| Ok(()))));
    absent!("Device::target: present, absent", |c, x| c.rt.device(c.dev).and_then(|d| d.target(
        &NOTHING,
        1,
        map::to(&x).present(),
        |v| (v,)
    )));
    absent!("Device::enter_data: present, absent", |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.enter_data(map::to(&x).present()).map(drop)));
    absent!("present item after a good item: nothing stays mapped", |c, x| {
        let y = [0i32; 8];
        enter(c.rt, c.dev, &[MapItem::slice(&y, MapType::TO), MapItem::slice(&x, MapType::TO.present())])
    });
    v.push(case("HostBuffer::enter: present, absent", |c: &Ctx<'_>| {
        let b = ok(HostBuffer::<i32>::new(c.rt, 4))?;
        expect!(b.enter(c.dev, MapType::TO.present()), Error::NotPresent { .. }, c.me(), HostRange::of(&b))
    }));
    v.push(case("Device::sgemm: operand not mapped", |c: &Ctx<'_>| {
        let (a, b, mut cc) = ([1f32; 4], [1f32; 4], [0f32; 4]);
        let dev = ok(c.rt.device(c.dev))?;
        // Views escape their region: they name ranges no longer mapped.
        let (va, vb, vc) = ok(dev.data((map::to(&a), map::to(&b), map::tofrom(&mut cc)), Ok))?;
        let g = Gemm {
            transa: false,
            transb: false,
            m: 2,
            n: 2,
            k: 2,
            alpha: 1.0,
            lda: 2,
            ldb: 2,
            beta: 0.0,
            ldc: 2,
            tf32: false,
            activation: offload::Activation::Identity,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        };
        expect!(
            dev.sgemm(&g, va, vb, vc),
            Error::NotPresent { what: "a gemm operand", .. },
            c.me(),
            va.host_range()
        )
    }));

    // ---- entry-side extensions ----------------------------------------------------
    macro_rules! extension {
        ($name:expr, |$c:ident, $x:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                let $x = [1i32; 8];
                $c.with_mapped(&$x[..2], || {
                    let existing = HostRange::of(&$x[..2]);
                    expect!($call, Error::Extension { .. }, $c.me(), existing, "extends the mapped")
                })
            }));
        };
    }
    extension!("enter_data: x[1:3] while x[0:2] is mapped", |c, x| enter(
        c.rt,
        c.dev,
        &[MapItem::slice(&x[1..4], MapType::TO)]
    ));
    extension!("enter_data: x[0:8] over mapped x[0:2]", |c, x| enter(
        c.rt,
        c.dev,
        &[MapItem::slice(&x, MapType::ALLOC)]
    ));
    extension!("target_data_begin: x[1:3] while x[0:2] is mapped", |c, x| begin(
        c.rt,
        c.dev,
        &[MapItem::slice(&x[1..4], MapType::TO)]
    ));
    extension!("target_launch: map extends a mapped range", |c, x| launch(
        c.rt,
        c.dev,
        &NOTHING,
        1,
        &[MapItem::slice(&x[..3], MapType::TO)],
        &[]
    ));
    extension!("Device::data: a map extends a mapped range", |c, x| c
        .rt
        .device(c.dev)
        .and_then(|d| d.data(map::to(&x[..]), |_| Ok(()))));
    extension!("Device::enter_data: extends, after a good map", |c, x| {
        let y = [0i32; 4];
        c.rt.device(c.dev).and_then(|d| d.enter_data((map::to(&y), map::to(&x[1..5]))).map(drop))
    });
    v.push(case("enter_data: two items of one list overlap partly", |c: &Ctx<'_>| {
        let x = [1i32; 8];
        expect!(
            enter(
                c.rt,
                c.dev,
                &[MapItem::slice(&x[..4], MapType::TO), MapItem::slice(&x[2..6], MapType::TO)]
            ),
            Error::Extension { .. },
            c.me(),
            HostRange::of(&x[2..6]),
            HostRange::of(&x[..4])
        )
    }));
    v.push(case("associate_ptr: over a mapped range", |c: &Ctx<'_>| {
        let x = [1i32; 4];
        c.with_block(16, |p| {
            c.with_mapped(&x, || {
                expect!(
                    associate(c.rt, x.as_ptr() as usize, p, 16, 0, c.dev),
                    Error::AlreadyMapped { .. },
                    c.me(),
                    HostRange::of(&x),
                    "already mapped"
                )
            })
        })
    }));

    // ---- memcpy offsets and lengths that overflow -------------------------------------
    v.push(case("memcpy: destination offset overflows", |c: &Ctx<'_>| {
        let h = [0u8; 16];
        c.with_block(16, |p| {
            expect!(
                memcpy(c.rt, p, h.as_ptr() as u64, 16, usize::MAX, 0, c.dev, c.init()),
                Error::Overflow { routine: "omp_target_memcpy", .. },
                format!("destination {p:#x} + offset {}", usize::MAX)
            )
        })
    }));
    v.push(case("memcpy: source offset overflows", |c: &Ctx<'_>| {
        let mut h = [0u8; 16];
        c.with_block(16, |p| {
            expect!(
                memcpy(c.rt, h.as_mut_ptr() as u64, p, 16, 0, usize::MAX - 7, c.init(), c.dev),
                Error::Overflow { .. },
                format!("source {p:#x} + offset {}", usize::MAX - 7)
            )
        })
    }));
    v.push(case("memcpy: host destination range overflows", |c: &Ctx<'_>| {
        let i = c.init();
        c.with_block(16, |p| {
            expect!(
                memcpy(c.rt, u64::MAX - 7, p, 16, 0, 0, i, c.dev),
                Error::Overflow { .. },
                format!("device {i}"),
                "host 0xfffffffffffffff8 + 16 bytes"
            )
        })
    }));
    v.push(case("memcpy: device range overflows", |c: &Ctx<'_>| {
        let h = [0u8; 16];
        c.with_block(16, |p| {
            expect!(
                memcpy(c.rt, p, h.as_ptr() as u64, usize::MAX, 0, 0, c.dev, c.init()),
                Error::OutsideAllocation { .. },
                c.me(),
                format!("{p:#x}")
            )
        })
    }));
    v.push(case("memset: count overflows the block", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            expect!(
                memset(c.rt, p + 8, usize::MAX, c.dev),
                Error::OutsideAllocation { .. },
                c.me(),
                format!("{:#x}", p + 8)
            )
        })
    }));

    // ---- device ranges outside live allocations ------------------------------------------
    macro_rules! outside {
        ($name:expr, $found:expr, |$c:ident, $p:ident| $call:expr, $addr:expr, $len:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                $c.with_block(16, |$p| {
                    let what = format!("device {:#x}..+{} bytes", $addr, $len);
                    expect!(
                        $call,
                        Error::OutsideAllocation { .. },
                        $c.me(),
                        what,
                        $found,
                        "not inside one live allocation"
                    )
                })
            }));
        };
    }
    outside!(
        "memcpy to device: past the block's end",
        "ends 16 bytes short",
        |c, p| {
            let h = [0u8; 64];
            memcpy(c.rt, p, h.as_ptr() as u64, 32, 0, 0, c.dev, c.init())
        },
        p,
        32
    );
    outside!(
        "memcpy from device: offset runs past the end",
        "ends 8 bytes short",
        |c, p| {
            let mut h = [0u8; 64];
            memcpy(c.rt, h.as_mut_ptr() as u64, p, 16, 0, 8, c.init(), c.dev)
        },
        p + 8,
        16
    );
    outside!(
        "memcpy within a device: destination past the end",
        "ends 1 bytes short",
        |c, p| {
            c.rt.target_alloc(16, c.dev)
                .and_then(|q| memcpy(c.rt, p, q, 16, 1, 0, c.dev, c.dev).and(free(c.rt, q, c.dev)))
        },
        p + 1,
        16
    );
    outside!(
        "memcpy within a device: source past the end",
        "ends 4 bytes short",
        |c, p| {
            c.rt.target_alloc(32, c.dev)
                .and_then(|q| memcpy(c.rt, q, p, 20, 0, 0, c.dev, c.dev).and(free(c.rt, q, c.dev)))
        },
        p,
        20
    );
    outside!(
        "memset: past the block's end",
        "ends 4 bytes short",
        |c, p| memset(c.rt, p + 4, 16, c.dev),
        p + 4,
        16
    );
    outside!("memset: one past the end", "ends before it", |c, p| memset(c.rt, p + 16, 1, c.dev), p + 16, 1);
    outside!(
        "memcpy: one before the block",
        "",
        |c, p| {
            let h = [0u8; 16];
            memcpy(c.rt, p - 1, h.as_ptr() as u64, 2, 0, 0, c.dev, c.init())
        },
        p - 1,
        2
    );
    outside!(
        "memcpy_rect: span past the block's end",
        "ends before it",
        |c, p| {
            let h = [0u8; 64];
            rect(
                c.rt,
                4,
                &[2, 2],
                side(p, c.dev, &[2, 2], &[4, 4]),
                side(h.as_ptr() as u64, c.init(), &[0, 0], &[4, 4]),
            )
        },
        p + 40,
        24
    );
    outside!(
        "memcpy_rect: source span past the end",
        "bytes short",
        |c, p| {
            let mut h = [0u8; 64];
            rect(
                c.rt,
                1,
                &[2, 8],
                side(h.as_mut_ptr() as u64, c.init(), &[0, 0], &[8, 8]),
                side(p, c.dev, &[1, 0], &[3, 8]),
            )
        },
        p + 8,
        16
    );
    outside!(
        "associate_ptr: device range past the block's end",
        "ends 16 bytes short",
        |c, p| {
            let x = [0i32; 8];
            associate(c.rt, x.as_ptr() as usize, p, 32, 0, c.dev)
        },
        p,
        32
    );
    outside!(
        "associate_ptr: device offset past the block",
        "ends before it",
        |c, p| {
            let x = [0i32; 1];
            associate(c.rt, x.as_ptr() as usize, p, 4, 16, c.dev)
        },
        p + 16,
        4
    );
    v.push(case("associate_ptr: device offset overflows", |c: &Ctx<'_>| {
        let x = [0i32; 1];
        c.with_block(16, |p| {
            expect!(
                associate(c.rt, x.as_ptr() as usize, p, 4, usize::MAX, c.dev),
                Error::Overflow { routine: "omp_target_associate_ptr", .. },
                format!("device pointer {p:#x} + offset {}", usize::MAX)
            )
        })
    }));
    macro_rules! freed {
        ($name:expr, |$c:ident, $p:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                let $p = $c.freed_block(16)?;
                expect!(
                    $call,
                    Error::OutsideAllocation { .. },
                    $c.me(),
                    format!("{:#x}", $p),
                    "freed or never allocated"
                )
            }));
        };
    }
    freed!("memcpy: into a freed block", |c, p| {
        let h = [0u8; 16];
        memcpy(c.rt, p, h.as_ptr() as u64, 16, 0, 0, c.dev, c.init())
    });
    freed!("memcpy: from a freed block", |c, p| {
        let mut h = [0u8; 16];
        memcpy(c.rt, h.as_mut_ptr() as u64, p, 4, 0, 0, c.init(), c.dev)
    });
    freed!("memset: a freed block", |c, p| memset(c.rt, p, 16, c.dev));
    freed!("memcpy_rect: into a freed block", |c, p| {
        let h = [0u8; 16];
        rect(c.rt, 4, &[4], side(p, c.dev, &[0], &[4]), side(h.as_ptr() as u64, c.init(), &[0], &[4]))
    });
    freed!("associate_ptr: a freed block", |c, p| {
        let x = [0i32; 4];
        associate(c.rt, x.as_ptr() as usize, p, 16, 0, c.dev)
    });
    v.push(case("memcpy: a host address used as a device pointer", |c: &Ctx<'_>| {
        let (mut x, h) = ([0u8; 16], [1u8; 16]);
        let px = x.as_mut_ptr() as u64;
        expect!(
            memcpy(c.rt, px, h.as_ptr() as u64, 16, 0, 0, c.dev, c.init()),
            Error::OutsideAllocation { .. },
            c.me(),
            format!("{px:#x}")
        )
    }));
    v.push(case("memset: an address never allocated", |c: &Ctx<'_>| {
        expect!(
            memset(c.rt, 0x10, 4, c.dev),
            Error::OutsideAllocation { .. },
            c.me(),
            "device 0x10..+4 bytes",
            "freed or never allocated"
        )
    }));
    v.push(case("memcpy: past the end of a mapped entry's device copy", |c: &Ctx<'_>| {
        let x = [1i32; 4];
        let h = [0u8; 64];
        c.with_mapped(&x, || {
            let d = ok(c.rt.mapped_ptr(x.as_ptr() as usize, c.dev))?.ok_or("not mapped")?;
            expect!(
                memcpy(c.rt, d, h.as_ptr() as u64, 32, 0, 0, c.dev, c.init()),
                Error::OutsideAllocation { .. },
                c.me(),
                format!("device {d:#x}..+32 bytes"),
                "ends 16 bytes short"
            )
        })
    }));
    v.push(case("memcpy: a block of another device as this device's", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let h = [0u8; 16];
        let p = ok(c.rt.target_alloc(16, o))?;
        let r = expect!(
            memcpy(c.rt, p, h.as_ptr() as u64, 16, 0, 0, c.dev, c.init()),
            Error::OutsideAllocation { .. },
            c.me(),
            format!("{p:#x}")
        );
        ok(free(c.rt, p, o))?;
        r
    }));
    v.push(case("memcpy between devices: source past its block", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let q = ok(c.rt.target_alloc(8, o))?;
        let r = c.with_block(16, |p| {
            expect!(
                memcpy(c.rt, p, q, 16, 0, 0, c.dev, o),
                Error::OutsideAllocation { .. },
                format!("device {o}"),
                format!("device {q:#x}..+16 bytes"),
                "ends 8 bytes short"
            )
        });
        ok(free(c.rt, q, o))?;
        r
    }));
    v.push(case("memset: a block of another device", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let p = ok(c.rt.target_alloc(16, o))?;
        let r = expect!(memset(c.rt, p, 16, c.dev), Error::OutsideAllocation { .. }, c.me());
        ok(free(c.rt, p, o))?;
        r
    }));

    // ---- associate / disassociate ---------------------------------------------------
    v.push(case("associate_ptr: size 0", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        c.with_block(16, |p| {
            expect!(
                associate(c.rt, x.as_ptr() as usize, p, 0, 0, c.dev),
                Error::InvalidArgument { .. },
                c.me(),
                "size is 0",
                "expected a non-zero size"
            )
        })
    }));
    v.push(case("associate_ptr: on the initial device", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        let i = c.init();
        expect!(
            associate(c.rt, x.as_ptr() as usize, 0x1000, 16, 0, i),
            Error::InvalidArgument { .. },
            format!("device {i}"),
            "initial device cannot have associated pointers"
        )
    }));
    v.push(case("disassociate_ptr: nothing mapped", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        let hp = x.as_ptr() as usize;
        expect!(
            disassociate(c.rt, hp, c.dev),
            Error::NotAssociated { .. },
            c.me(),
            format!("{hp:#x}"),
            "nothing is mapped there"
        )
    }));
    v.push(case("disassociate_ptr: mapped by a map clause", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        let hp = x.as_ptr() as usize;
        c.with_mapped(&x, || {
            expect!(
                disassociate(c.rt, hp, c.dev),
                Error::NotAssociated { .. },
                c.me(),
                "mapped by a map clause"
            )
        })
    }));
    v.push(case("disassociate_ptr: on the initial device", |c: &Ctx<'_>| {
        expect!(
            disassociate(c.rt, 0x1000, c.init()),
            Error::InvalidArgument { .. },
            "initial device has no associated pointers"
        )
    }));

    // ---- target_alloc / target_free -----------------------------------------------------
    v.push(case("target_free: double free", |c: &Ctx<'_>| {
        let p = c.freed_block(16)?;
        expect!(
            free(c.rt, p, c.dev),
            Error::UnknownDevicePointer { .. },
            c.me(),
            format!("{p:#x}"),
            "target_free"
        )
    }));
    v.push(case("target_free: a pointer never allocated", |c: &Ctx<'_>| {
        expect!(free(c.rt, 0x40, c.dev), Error::UnknownDevicePointer { .. }, c.me(), "0x40")
    }));
    v.push(case("target_free: an interior pointer", |c: &Ctx<'_>| {
        c.with_block(16, |p| {
            expect!(
                free(c.rt, p + 8, c.dev),
                Error::UnknownDevicePointer { .. },
                c.me(),
                format!("{:#x}", p + 8)
            )
        })
    }));
    v.push(case("target_free: inside a mapped entry's device copy", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        c.with_mapped(&x, || {
            let d = ok(c.rt.mapped_ptr(x.as_ptr() as usize, c.dev))?.ok_or("not mapped")?;
            expect!(free(c.rt, d + 4, c.dev), Error::UnknownDevicePointer { .. }, c.me())
        })
    }));
    v.push(case("target_free: a mapped entry's device copy", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        c.with_mapped(&x, || {
            let d = ok(c.rt.mapped_ptr(x.as_ptr() as usize, c.dev))?.ok_or("not mapped")?;
            let r = expect!(
                free(c.rt, d, c.dev),
                Error::InvalidArgument { .. },
                c.me(),
                format!("{d:#x}"),
                "device copy of a mapped range"
            );
            // The entry's memory is still its own.
            ok(c.rt.mapped_ptr(x.as_ptr() as usize, c.dev))?.ok_or("the failed free unmapped x")?;
            r
        })
    }));
    v.push(case("target_free: a block an association still uses", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        c.with_block(16, |p| {
            // SAFETY: the block holds 16 bytes; disassociated below.
            ok(unsafe { c.rt.associate_ptr(x.as_ptr() as usize, p, 16, 0, c.dev) })?;
            let r = expect!(
                free(c.rt, p, c.dev),
                Error::InvalidArgument { .. },
                c.me(),
                format!("{p:#x}"),
                HostRange::of(&x),
                "disassociate it first"
            );
            // SAFETY: no kernel runs.
            ok(unsafe { c.rt.disassociate_ptr(x.as_ptr() as usize, c.dev) })?;
            r
        })
    }));
    v.push(case("associate_ptr: into a mapped entry's device copy", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        let y = [0i32; 4];
        c.with_mapped(&x, || {
            let d = ok(c.rt.mapped_ptr(x.as_ptr() as usize, c.dev))?.ok_or("not mapped")?;
            expect!(
                associate(c.rt, y.as_ptr() as usize, d, 16, 0, c.dev),
                Error::InvalidArgument { .. },
                c.me(),
                format!("{d:#x}"),
                "expected memory from omp_target_alloc"
            )
        })
    }));
    v.push(case("target_free: on the wrong device", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let p = ok(c.rt.target_alloc(16, o))?;
        let r = expect!(free(c.rt, p, c.dev), Error::UnknownDevicePointer { .. }, c.me());
        ok(free(c.rt, p, o))?;
        r
    }));
    v.push(case("target_free: initial device, not from target_alloc", |c: &Ctx<'_>| {
        let x = [0u8; 16];
        let i = c.init();
        expect!(
            free(c.rt, x.as_ptr() as u64, i),
            Error::UnknownDevicePointer { routine: "omp_target_free", .. },
            format!("device {i}")
        )
    }));
    v.push(case("target_free: initial device, double free", |c: &Ctx<'_>| {
        let i = c.init();
        let p = ok(c.rt.target_alloc(16, i))?;
        ok(free(c.rt, p, i))?;
        expect!(
            free(c.rt, p, i),
            Error::UnknownDevicePointer { .. },
            format!("device {i}"),
            format!("{p:#x}")
        )
    }));
    v.push(case("target_alloc: more than the device has", |c: &Ctx<'_>| {
        expect!(
            c.rt.target_alloc(usize::MAX, c.dev),
            Error::OutOfMemory { .. },
            c.me(),
            format!("allocating {} bytes", usize::MAX)
        )
    }));
    v.push(case("target_alloc: initial device, no valid layout", |c: &Ctx<'_>| {
        expect!(
            c.rt.target_alloc(usize::MAX, c.init()),
            Error::InvalidArgument { routine: "omp_target_alloc", .. }
        )
    }));

    // ---- memcpy_rect shapes ------------------------------------------------------------
    macro_rules! bad_rect {
        ($name:expr, $pat:pat, $needle:expr, |$c:ident, $p:ident, $h:ident| $call:expr) => {
            v.push(case($name, |$c: &Ctx<'_>| {
                let $h = [0u8; 64];
                $c.with_block(64, |$p| expect!($call, $pat, $needle))
            }));
        };
    }
    bad_rect!(
        "memcpy_rect: zero dimensions",
        Error::InvalidArgument { .. },
        "at least one dimension",
        |c, p, h| {
            rect(c.rt, 4, &[], side(p, c.dev, &[], &[]), side(h.as_ptr() as u64, c.init(), &[], &[]))
        }
    );
    bad_rect!(
        "memcpy_rect: element size 0",
        Error::InvalidArgument { .. },
        "non-zero element size",
        |c, p, h| {
            rect(c.rt, 0, &[4], side(p, c.dev, &[0], &[4]), side(h.as_ptr() as u64, c.init(), &[0], &[4]))
        }
    );
    bad_rect!(
        "memcpy_rect: offsets of the wrong length",
        Error::InvalidArgument { .. },
        "destination offsets and dimensions must have 2 entries",
        |c, p, h| {
            rect(
                c.rt,
                4,
                &[2, 2],
                side(p, c.dev, &[0], &[4, 4]),
                side(h.as_ptr() as u64, c.init(), &[0, 0], &[4, 4]),
            )
        }
    );
    bad_rect!(
        "memcpy_rect: dimensions of the wrong length",
        Error::InvalidArgument { .. },
        "source offsets and dimensions must have 2 entries",
        |c, p, h| {
            rect(
                c.rt,
                4,
                &[2, 2],
                side(p, c.dev, &[0, 0], &[4, 4]),
                side(h.as_ptr() as u64, c.init(), &[0, 0], &[4, 4, 1]),
            )
        }
    );
    bad_rect!(
        "memcpy_rect: offset + volume exceeds the extent",
        Error::InvalidArgument { .. },
        "dimension 1: offset 3 + volume 2 exceeds extent 4",
        |c, p, h| {
            rect(
                c.rt,
                4,
                &[2, 2],
                side(p, c.dev, &[0, 3], &[4, 4]),
                side(h.as_ptr() as u64, c.init(), &[0, 0], &[4, 4]),
            )
        }
    );
    bad_rect!(
        "memcpy_rect: offset + volume overflows",
        Error::Overflow { routine: "omp_target_memcpy_rect", .. },
        format!("offset {} + volume 1", usize::MAX),
        |c, p, h| {
            rect(
                c.rt,
                1,
                &[1],
                side(p, c.dev, &[0], &[4]),
                side(h.as_ptr() as u64, c.init(), &[usize::MAX], &[usize::MAX]),
            )
        }
    );
    bad_rect!("memcpy_rect: stride overflows", Error::Overflow { .. }, "stride of dimension 0", |c, p, h| {
        rect(
            c.rt,
            8,
            &[1, 1],
            side(p, c.dev, &[0, 0], &[1, 1]),
            side(h.as_ptr() as u64, c.init(), &[0, 0], &[1, usize::MAX / 4]),
        )
    });
    bad_rect!(
        "memcpy_rect: strides overflow in 3 dimensions",
        Error::Overflow { .. },
        "destination stride of dimension 0",
        |c, p, h| {
            rect(
                c.rt,
                4,
                &[1, 1, 1],
                side(p, c.dev, &[0, 0, 0], &[1, 1 << 40, 1 << 30]),
                side(h.as_ptr() as u64, c.init(), &[0, 0, 0], &[1, 1, 1]),
            )
        }
    );
    bad_rect!("memcpy_rect: span overflows", Error::Overflow { .. }, "span of offsets", |c, p, h| {
        rect(
            c.rt,
            1,
            &[1, 1],
            side(p, c.dev, &[0, 0], &[1, 1]),
            side(h.as_ptr() as u64, c.init(), &[usize::MAX / 2, 0], &[usize::MAX / 2 + 1, 3]),
        )
    });
    bad_rect!(
        "memcpy_rect: host base + span overflows",
        Error::Overflow { .. },
        "source 0xfffffffffffffff0 + offset 32",
        |c, p, _h| {
            rect(c.rt, 1, &[4], side(p, c.dev, &[0], &[4]), side(u64::MAX - 15, c.init(), &[32], &[64]))
        }
    );
    bad_rect!(
        "memcpy_rect: host span past the address space",
        Error::Overflow { .. },
        "host 0xfffffffffffffff0 + 20 bytes",
        |c, p, _h| {
            rect(c.rt, 1, &[20], side(p, c.dev, &[0], &[64]), side(u64::MAX - 15, c.init(), &[0], &[20]))
        }
    );

    // ---- DeviceSlice::slice -----------------------------------------------------------
    macro_rules! bad_slice {
        ($name:expr, $pat:pat, $needle:expr, |$s:ident| $call:expr) => {
            v.push(case($name, |c: &Ctx<'_>| {
                let x = [0i32; 4];
                ok(c.rt.device(c.dev))?
                    .data(map::to(&x), |$s: DeviceSlice<'_, i32>| {
                        Ok(expect!($call, $pat, format!("device {}", c.dev), $needle))
                    })
                    .map_err(|e| e.to_string())?
            }));
        };
    }
    bad_slice!(
        "DeviceSlice::slice: ..=usize::MAX",
        Error::Overflow { routine: "DeviceSlice::slice", .. },
        format!("inclusive end bound {} + 1", usize::MAX),
        |s| s.slice(..=usize::MAX)
    );
    bad_slice!(
        "DeviceSlice::slice: excluded usize::MAX start",
        Error::Overflow { .. },
        "excluded start bound",
        |s| s.slice((Bound::Excluded(usize::MAX), Bound::Unbounded))
    );
    bad_slice!(
        "DeviceSlice::slice: start after end",
        Error::InvalidArgument { routine: "DeviceSlice::slice", .. },
        "3..2 is outside a view of 4 elements",
        |s| {
            let (a, b) = (3, 2);
            s.slice(a..b)
        }
    );
    bad_slice!(
        "DeviceSlice::slice: end past the view",
        Error::InvalidArgument { .. },
        "expected a range within 0..4",
        |s| s.slice(0..5)
    );
    bad_slice!("DeviceSlice::slice: start past the view", Error::InvalidArgument { .. }, "5..4", |s| s
        .slice(5..));
    bad_slice!(
        "DeviceSlice::slice: inclusive end past the view",
        Error::InvalidArgument { .. },
        "1..5",
        |s| s.slice(1..=4)
    );
    bad_slice!(
        "DeviceSlice::slice: of a slice, past its end",
        Error::InvalidArgument { .. },
        "0..3 is outside a view of 2 elements",
        |s| s.slice(1..3)?.slice(..3)
    );

    // ---- launches ------------------------------------------------------------------------
    v.push(case("target_launch: mapped argument not mapped", |c: &Ctx<'_>| {
        let x = [0i32; 4];
        let hp = x.as_ptr() as usize;
        expect!(
            launch(
                c.rt,
                c.dev,
                &FILL_I32,
                4,
                &[],
                &[LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(x.as_ptr())]
            ),
            Error::KernelArgument { kernel: "fill_i32", index: 1, .. },
            format!("host {hp:#x} is not mapped on device {}", c.dev)
        )
    }));
    v.push(case("target_launch: unmapped argument, maps undone", |c: &Ctx<'_>| {
        let (x, y) = ([0i32; 4], [0i32; 4]);
        expect!(
            launch(
                c.rt,
                c.dev,
                &FILL_I32,
                4,
                &[MapItem::slice(&y, MapType::TO)],
                &[LaunchArg::Value(Scalar::I32(1)), LaunchArg::mapped(x.as_ptr())]
            ),
            Error::KernelArgument { .. },
            c.me()
        )
    }));
    v.push(case("target_launch: device argument freed", |c: &Ctx<'_>| {
        let p = c.freed_block(16)?;
        expect!(
            launch(c.rt, c.dev, &FILL_I32, 4, &[], &[LaunchArg::Value(Scalar::I32(1)), LaunchArg::Device(p)]),
            Error::KernelArgument { index: 1, .. },
            format!("device {p:#x} is not inside a live allocation of device {}", c.dev)
        )
    }));
    v.push(case("target_launch: device argument never allocated, maps undone", |c: &Ctx<'_>| {
        let y = [0i32; 4];
        expect!(
            launch(
                c.rt,
                c.dev,
                &FILL_I32,
                4,
                &[MapItem::slice(&y, MapType::TO)],
                &[LaunchArg::Value(Scalar::I32(1)), LaunchArg::Device(0x40)]
            ),
            Error::KernelArgument { .. },
            "device 0x40"
        )
    }));
    v.push(case("Device::launch: a device pointer to freed memory", |c: &Ctx<'_>| {
        let p = c.freed_block(16)?;
        // SAFETY: the launch is refused before the kernel runs.
        let ptr = unsafe { DevicePtr::new(p) };
        expect!(
            ok(c.rt.device(c.dev))?.launch(&FILL_I32, 4, (1i32, ptr)),
            Error::KernelArgument { .. },
            format!("{p:#x}")
        )
    }));
    v.push(case("Device::launch: a view of another device", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let mut x = [0i32; 4];
        let r = ok(c.rt.device(o))?.data(map::tofrom(&mut x), |v| {
            Ok(expect!(
                c.rt.device(c.dev)?.launch(&FILL_I32, 4, (1i32, v)),
                Error::KernelArgument { kernel: "fill_i32", index: 1, .. },
                format!("a view of device {o} passed to a launch on device {}", c.dev)
            ))
        });
        ok(r)?
    }));
    v.push(case("Device::launch: a view after its region ended", |c: &Ctx<'_>| {
        let mut x = [0i32; 4];
        let dev = ok(c.rt.device(c.dev))?;
        let v = ok(dev.data(map::tofrom(&mut x), Ok))?;
        expect!(dev.launch(&FILL_I32, 4, (1i32, v)), Error::KernelArgument { .. }, "is not mapped on", c.me())
    }));
    v.push(case("Device::launch: a kernel without an implementation", |c: &Ctx<'_>| {
        expect!(
            ok(c.rt.device(c.dev))?.launch(&NO_IMPL, 1, ()),
            Error::NoKernelImpl { kernel: "no_impl", .. },
            c.me(),
            "has no"
        )
    }));
    v.push(case("Device::launch: a scalar of the wrong type", |c: &Ctx<'_>| {
        if !c.host() {
            return Ok(Outcome::HostKernelsOnly);
        }
        let mut x = [0i32; 4];
        let r = ok(c.rt.device(c.dev))?.data(map::tofrom(&mut x), |v| {
            Ok(expect!(
                reported(c.rt, c.dev, c.rt.device(c.dev)?.launch(&FILL_I32, 4, (1.0f32, v))),
                Error::KernelFailed { kernel: "fill_i32", .. },
                c.me(),
                "expected i32, got f32"
            ))
        });
        ok(r)?
    }));
    v.push(case("Device::launch: more work items than the view holds", |c: &Ctx<'_>| {
        if !c.host() {
            return Ok(Outcome::HostKernelsOnly);
        }
        let mut x = [0i32; 4];
        let r = ok(c.rt.device(c.dev))?.data(map::tofrom(&mut x), |v| {
            Ok(expect!(
                reported(c.rt, c.dev, c.rt.device(c.dev)?.launch(&FILL_I32, 8, (1i32, v))),
                Error::KernelFailed { .. },
                "wants 8 elements but only 4 are mapped"
            ))
        });
        ok(r)?
    }));
    v.push(case("SAXPY launched with one view as x and y", |c: &Ctx<'_>| {
        if !c.host() {
            return Ok(Outcome::HostKernelsOnly);
        }
        let mut y = [1f32; 16];
        let r = ok(c.rt.device(c.dev))?.data(map::tofrom(&mut y), |v| {
            let launched = c.rt.device(c.dev)?.launch(&offload_kernels::SAXPY, 16, (2.0f32, v, v));
            Ok(expect!(
                reported(c.rt, c.dev, launched),
                Error::KernelFailed { kernel: "saxpy", .. },
                "overlap; expected distinct ranges"
            ))
        });
        ok(r)?
    }));
    v.push(case("jacobi_step: rows that overflow", |c: &Ctx<'_>| {
        let (mut a, mut b, mut norm) = ([0f32; 16], [0f32; 16], [0f32; 2]);
        let dev = ok(c.rt.device(c.dev))?;
        let r = dev.data((map::tofrom(&mut a), map::tofrom(&mut b), map::tofrom(&mut norm)), |(a, b, n)| {
            let shape = offload_kernels::stencil::JacobiShape {
                nx: 4,
                iy_start: 1,
                iy_end: usize::MAX,
                rows_per_thread: 1,
            };
            Ok(offload_kernels::stencil::jacobi_step(
                &dev,
                shape,
                a,
                b,
                n,
                0,
                DevicePtr::NULL,
                DevicePtr::NULL,
            ))
        });
        expect!(ok(r)?, Error::Overflow { routine: "jacobi_step", .. }, usize::MAX)
    }));
    v.push(case("jacobi_step: one grid as a and a_new", |c: &Ctx<'_>| {
        let (mut a, mut norm) = ([0f32; 16], [0f32; 2]);
        let dev = ok(c.rt.device(c.dev))?;
        let r = dev.data((map::tofrom(&mut a), map::tofrom(&mut norm)), |(a, n)| {
            let shape =
                offload_kernels::stencil::JacobiShape { nx: 4, iy_start: 1, iy_end: 3, rows_per_thread: 1 };
            Ok(offload_kernels::stencil::jacobi_step(
                &dev,
                shape,
                a,
                a,
                n,
                0,
                DevicePtr::NULL,
                DevicePtr::NULL,
            ))
        });
        expect!(
            ok(r)?,
            Error::KernelArgument { kernel: "jacobi_step", index: 1, .. },
            "expected distinct grids"
        )
    }));
    v.push(case("stencil7_step: planes that overflow", |c: &Ctx<'_>| {
        let (mut a, mut b) = ([0f32; 27], [0f32; 27]);
        let dev = ok(c.rt.device(c.dev))?;
        let r = dev.data((map::tofrom(&mut a), map::tofrom(&mut b)), |(a, b)| {
            Ok(offload_kernels::stencil::stencil7_step(
                &dev,
                3,
                3,
                1,
                usize::MAX,
                1,
                a,
                b,
                DevicePtr::NULL,
                DevicePtr::NULL,
            ))
        });
        expect!(ok(r)?, Error::Overflow { routine: "stencil7_step", .. }, usize::MAX)
    }));
    v.push(case("Device::launch: too few arguments", |c: &Ctx<'_>| {
        if !c.host() {
            return Ok(Outcome::HostKernelsOnly);
        }
        expect!(
            reported(c.rt, c.dev, ok(c.rt.device(c.dev))?.launch(&FILL_I32, 4, (1i32,))),
            Error::KernelFailed { .. },
            c.me(),
            "reads argument 1 but was given 1"
        )
    }));

    // ---- sgemm ---------------------------------------------------------------------------
    macro_rules! bad_sgemm {
        ($name:expr, $pat:pat, $needle:expr, $g:expr) => {
            v.push(case($name, |c: &Ctx<'_>| {
                let (a, b, mut cc) = ([1f32; 16], [1f32; 16], [0f32; 16]);
                let dev = ok(c.rt.device(c.dev))?;
                let g: Gemm = $g;
                let r = dev.data((map::to(&a), map::to(&b), map::tofrom(&mut cc)), |(va, vb, vc)| {
                    Ok(expect!(dev.sgemm(&g, va, vb, vc), $pat, $needle))
                });
                ok(r)?
            }));
        };
    }
    const G: Gemm = Gemm {
        transa: false,
        transb: false,
        m: 4,
        n: 4,
        k: 4,
        alpha: 1.0,
        lda: 4,
        ldb: 4,
        beta: 0.0,
        ldc: 4,
        tf32: false,
        activation: offload::Activation::Identity,
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
    };
    bad_sgemm!(
        "sgemm: lda < m",
        Error::InvalidArgument { routine: "gemm", .. },
        "A: leading dimension 3 for 4 rows",
        Gemm { lda: 3, ..G }
    );
    bad_sgemm!(
        "sgemm: ldc = 0",
        Error::InvalidArgument { .. },
        "C: leading dimension 0 for 0 rows; expected at least max(1, 0)",
        Gemm { ldc: 0, m: 0, ..G }
    );
    bad_sgemm!(
        "sgemm: ldb < k (transposed)",
        Error::InvalidArgument { .. },
        "B: leading dimension 2 for 4 rows",
        Gemm { transb: true, ldb: 2, ..G }
    );
    bad_sgemm!(
        "sgemm: span overflows",
        Error::Overflow { routine: "gemm", .. },
        "A: span of 4 columns",
        Gemm { lda: usize::MAX / 2, ..G }
    );
    bad_sgemm!(
        "sgemm: view too small",
        Error::InvalidArgument { .. },
        "operand 0 (A): a view of 16 elements",
        Gemm { m: 5, lda: 5, ldc: 5, ..G }
    );
    v.push(case("sgemm: C from a shared borrow", |c: &Ctx<'_>| {
        let (a, b, cc) = ([1f32; 16], [1f32; 16], [0f32; 16]);
        let dev = ok(c.rt.device(c.dev))?;
        ok(dev.data((map::to(&a), map::to(&b), map::to(&cc)), |(va, vb, vc)| {
            Ok(expect!(
                dev.sgemm(&G, va, vb, vc),
                Error::InvalidArgument { routine: "gemm", .. },
                "operand 2 (C) is written, but its view"
            ))
        }))?
    }));
    v.push(case("sgemm: an operand of another device", |c: &Ctx<'_>| {
        let Some(o) = c.other else { return Ok(Outcome::NeedsTwoDevices) };
        let (a, b, mut cc) = ([1f32; 16], [1f32; 16], [0f32; 16]);
        let dev = ok(c.rt.device(c.dev))?;
        let r = ok(c.rt.device(o))?.data(map::to(&a), |va| {
            dev.data((map::to(&b), map::tofrom(&mut cc)), |(vb, vc)| {
                Ok(expect!(
                    dev.sgemm(&G, va, vb, vc),
                    Error::InvalidArgument { .. },
                    format!("operand 0 (A): a view of 16 elements on device {o}")
                ))
            })
        });
        ok(r)?
    }));
    v.push(case("sgemm: on the initial device", |c: &Ctx<'_>| {
        let (a, b, mut cc) = ([1f32; 16], [1f32; 16], [0f32; 16]);
        let dev = ok(c.rt.device(c.init()))?;
        ok(dev.data((map::to(&a), map::to(&b), map::tofrom(&mut cc)), |(va, vb, vc)| {
            Ok(expect!(
                dev.sgemm(&G, va, vb, vc),
                Error::InvalidArgument { .. },
                "the initial device has no gemm"
            ))
        }))?
    }));

    // ---- pipeline, partitions, nowait --------------------------------------------------
    v.push(case("Pipeline::new: no devices", |c: &Ctx<'_>| {
        expect!(
            Pipeline::new(c.rt, &[], 2).map(drop),
            Error::InvalidArgument { routine: "Pipeline::new", .. },
            "got 0 devices"
        )
    }));
    v.push(case("Pipeline::new: one slot", |c: &Ctx<'_>| {
        expect!(Pipeline::new(c.rt, &[c.dev], 1).map(drop), Error::InvalidArgument { .. }, "1 slots")
    }));
    v.push(case("Pipeline::run: inputs and outputs differ in number", |c: &Ctx<'_>| {
        let inputs = vec![vec![1i32; 4]; 3];
        let mut outputs = vec![vec![0i32; 4]; 2];
        let p = ok(Pipeline::new(c.rt, &[c.dev], 2))?;
        expect!(
            p.run(&inputs, &mut outputs, |_, _, _, _: DeviceSlice<'_, i32>| Ok(())),
            Error::InvalidArgument { routine: "Pipeline::run", .. },
            "3 input batches but 2 output batches"
        )
    }));
    v.push(case("Pipeline::run_with: inputs and outputs differ in number", |c: &Ctx<'_>| {
        let inputs = vec![vec![1i32; 4]; 2];
        let mut outputs = vec![(vec![0i32; 4], vec![0u32; 4]); 3];
        let p = ok(Pipeline::new(c.rt, &[c.dev], 2))?;
        let no_state = |_: &offload::Device<'_>| Ok(());
        expect!(
            p.run_with(&inputs, &mut outputs, no_state, |_, _, _, _: DeviceSlice<'_, i32>, _| Ok(())),
            Error::InvalidArgument { routine: "Pipeline::run_with", .. },
            "2 input batches but 3 output batches"
        )
    }));
    v.push(case("Pipeline::run: a batch launches with a bad argument", |c: &Ctx<'_>| {
        let inputs = vec![vec![1i32; 4]; 4];
        let mut outputs = vec![vec![0i32; 4]; 4];
        let p = ok(Pipeline::new(c.rt, &[c.dev], 2))?;
        expect!(
            p.run(&inputs, &mut outputs, |dev, _, x, _: DeviceSlice<'_, i32>| dev.launch(&NO_IMPL, 4, (x,))),
            Error::Batch { .. },
            "batch",
            "no_impl"
        )
    }));
    v.push(case("RowPartition::new: too few rows", |_c: &Ctx<'_>| {
        expect!(
            RowPartition::new(4, 8, 3, 1),
            Error::InvalidArgument { routine: "RowPartition::new", .. },
            "4 rows with halo 1"
        )
    }));
    v.push(case("RowPartition::new: halo overflows", |_c: &Ctx<'_>| {
        expect!(
            RowPartition::new(10, 8, 2, usize::MAX),
            Error::InvalidArgument { .. },
            format!("halo {}", usize::MAX)
        )
    }));
    v.push(case("BlockPartition::new: zero parts", |_c: &Ctx<'_>| {
        expect!(
            BlockPartition::new(5, 0),
            Error::InvalidArgument { routine: "BlockPartition::new", .. },
            "zero parts"
        )
    }));
    v.push(case("DistributedArray::map: devices and parts differ", |c: &Ctx<'_>| {
        let mut grid = vec![0f32; 6 * 4];
        let part = ok(RowPartition::new(6, 4, 2, 1))?;
        expect!(
            DistributedArray::map(c.rt, &[c.dev], &mut grid, part, MapType::TO).map(drop),
            Error::InvalidArgument { routine: "DistributedArray::map", .. },
            "1 devices for 2 parts"
        )
    }));
    v.push(case("DistributedArray::map: grid of the wrong size", |c: &Ctx<'_>| {
        let mut grid = vec![0f32; 23];
        let part = ok(RowPartition::new(6, 4, 1, 1))?;
        expect!(
            DistributedArray::map(c.rt, &[c.dev], &mut grid, part, MapType::TO).map(drop),
            Error::InvalidArgument { .. },
            "a grid of 23 elements is not 6 x 4"
        )
    }));
    v.push(case("DistributedArray::map: rows x row length overflows", |c: &Ctx<'_>| {
        let mut grid = vec![0f32; 4];
        let part = ok(RowPartition::new(6, usize::MAX / 2, 1, 1))?;
        expect!(
            DistributedArray::map(c.rt, &[c.dev], &mut grid, part, MapType::TO).map(drop),
            Error::InvalidArgument { .. },
            "a grid of 4 elements"
        )
    }));
    v.push(case("DistributedArray::map: a device out of range, parts undone", |c: &Ctx<'_>| {
        let mut grid = vec![0f32; 6 * 4];
        let part = ok(RowPartition::new(6, 4, 2, 1))?;
        let b = c.bad();
        expect(
            DistributedArray::map(c.rt, &[c.dev, b], &mut grid, part, MapType::TO).map(drop),
            |e| no_such(e, b),
            &[&format!("device {b}")],
        )
    }));
    v.push(case("DistributedArray::row_addr: a row the part does not map", |c: &Ctx<'_>| {
        let mut grid = vec![0f32; 6 * 4];
        let part = ok(RowPartition::new(6, 4, 1, 1))?;
        let d = ok(DistributedArray::map(c.rt, &[c.dev], &mut grid, part, MapType::TO))?;
        let r = d.row_addr(0, usize::MAX).map(drop);
        expect!(
            r,
            Error::InvalidArgument { routine: "DistributedArray::row_addr", .. },
            format!("row {}", usize::MAX),
            c.me(),
            "expected one of the rows it maps, 0..6"
        )
    }));
    v.push(case("nowait: memcpy with a null pointer fails the scope", |c: &Ctx<'_>| {
        let h = [0u8; 16];
        let r = c.rt.nowait(|s| {
            // SAFETY: refused before anything is copied.
            unsafe { s.memcpy(0, h.as_ptr() as u64, 16, 0, 0, c.dev, c.init(), &[]) }.map(drop)
        });
        expect!(
            r.and_then(|r| r),
            Error::InvalidArgument { routine: "omp_target_memcpy", .. },
            c.me(),
            "destination pointer is null"
        )
    }));
    v.push(case("nowait: a launch with a view of an unmapped range", |c: &Ctx<'_>| {
        let mut x = [0i32; 4];
        let dev = ok(c.rt.device(c.dev))?;
        let v = ok(dev.data(map::tofrom(&mut x), Ok))?;
        let r = c.rt.nowait(|s| s.launch(c.dev, &FILL_I32, 4, (1i32, v), &[]).map(drop));
        expect!(r.and_then(|r| r), Error::KernelArgument { .. }, "is not mapped on", c.me())
    }));
    v.push(case("nowait: update of a range past the address space", |c: &Ctx<'_>| {
        // Through the runtime: a task's update is checked like any other.
        let r = c.rt.nowait(|s| {
            s.compute(c.dev, &[], |_| update(c.rt, c.dev, UpdateDirection::To, &[(PAST_THE_END, false)]))
                .map(drop)
        });
        expect!(r.and_then(|r| r), Error::Overflow { routine: "target update", .. }, PAST_THE_END_TEXT)
    }));
    v
}

/// Cases of `offload::omp`, on the process-wide runtime; each is given a device number.
fn omp_cases() -> Vec<Case<i32>> {
    use offload::omp::*;
    let mut v: Vec<Case<i32>> = Vec::new();
    fn vp<T>(p: *const T) -> *const c_void {
        p.cast()
    }
    fn init() -> i32 {
        omp_get_initial_device().expect("initial device")
    }
    /// A block of `bytes` on device `d`, freed after `f`.
    fn with_block(bytes: usize, d: i32, f: impl FnOnce(*mut c_void) -> Check) -> Check {
        let p = ok(omp_target_alloc(bytes, d))?;
        let r = f(p);
        // SAFETY: nothing uses `p` afterwards.
        ok(unsafe { omp_target_free(p, d) })?;
        r
    }
    fn no_such(e: &Error, device: i64) -> bool {
        matches!(e, Error::NoSuchDevice { device: d, .. } if *d == device)
    }
    fn null_rect(d: i32, num_dims: i32, which: usize) -> Result<i32> {
        let (vol, off, dims) = ([2usize, 2], [0usize, 0], [4usize, 4]);
        let h = [0u8; 64];
        let p = omp_target_alloc(64, d)?;
        let arrays: Vec<*const usize> = (0..5)
            .map(|i| match i {
                _ if i == which => null(),
                0 => vol.as_ptr(),
                1 | 2 => off.as_ptr(),
                _ => dims.as_ptr(),
            })
            .collect();
        // SAFETY: refused before the arrays or the memory are read.
        let r = unsafe {
            omp_target_memcpy_rect(
                p,
                vp(h.as_ptr()),
                4,
                num_dims,
                arrays[0],
                arrays[1],
                arrays[2],
                arrays[3],
                arrays[4],
                d,
                init(),
            )
        };
        // SAFETY: nothing uses `p` afterwards.
        unsafe { omp_target_free(p, d)? };
        r
    }

    // ---- negative and out-of-range device numbers ---------------------------------------
    // (-1 is omp_initial_device, the initial device, since OpenMP 5.1.)
    macro_rules! bad_num {
        ($name:expr, $num:expr, |$b:ident| $call:expr) => {
            v.push(case($name, |_d: &i32| {
                let $b: i32 = $num;
                let want = format!("device {} does not exist", $b);
                expect($call, |e| no_such(e, i64::from($b)), &[&want])
            }));
        };
    }
    bad_num!("omp_target_alloc: device -2 (omp_invalid_device)", -2, |b| omp_target_alloc(16, b));
    bad_num!("omp_target_alloc: device i32::MIN", i32::MIN, |b| omp_target_alloc(16, b));
    bad_num!("omp_target_alloc: device past the initial device", init() + 1, |b| omp_target_alloc(16, b));
    // SAFETY (each): refused before the pointer is used.
    // SAFETY: refused before any pointer is used.
    bad_num!("omp_target_free: device -2 (omp_invalid_device)", -2, |b| unsafe {
        omp_target_free(0x1000 as *mut c_void, b)
    });
    bad_num!("omp_target_is_present: device -2", -2, |b| omp_target_is_present(vp(&0u8), b));
    bad_num!("omp_get_mapped_ptr: device -5", -5, |b| omp_get_mapped_ptr(vp(&0u8), b));
    // SAFETY: refused before any pointer is used.
    bad_num!("omp_target_associate_ptr: device -2 (omp_invalid_device)", -2, |b| unsafe {
        omp_target_associate_ptr(vp(&0u8), 0x1000 as *const c_void, 1, 0, b)
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("omp_target_disassociate_ptr: device -2 (omp_invalid_device)", -2, |b| unsafe {
        omp_target_disassociate_ptr(vp(&0u8), b)
    });
    bad_num!("omp_target_memcpy: destination device -2 (omp_invalid_device)", -2, |b| {
        let h = [0u8; 4];
        // SAFETY: refused before any pointer is used.
        unsafe { omp_target_memcpy(0x1000 as *mut c_void, vp(h.as_ptr()), 4, 0, 0, b, init()) }
    });
    bad_num!("omp_target_memcpy: source device -2 (omp_invalid_device)", -2, |b| {
        let mut h = [0u8; 4];
        // SAFETY: refused before any pointer is used.
        unsafe { omp_target_memcpy(h.as_mut_ptr().cast(), 0x1000 as *const c_void, 4, 0, 0, init(), b) }
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("omp_target_memset: device -2 (omp_invalid_device)", -2, |b| unsafe {
        omp_target_memset(0x1000 as *mut c_void, 0, 4, b)
    });
    bad_num!("omp_target_memcpy_rect: destination device -2 (omp_invalid_device)", -2, |b| {
        let (vol, off, dims, h) = ([4usize], [0usize], [4usize], [0u8; 4]);
        // SAFETY: refused before any pointer is used.
        unsafe {
            omp_target_memcpy_rect(
                0x1000 as *mut c_void,
                vp(h.as_ptr()),
                1,
                1,
                vol.as_ptr(),
                off.as_ptr(),
                off.as_ptr(),
                dims.as_ptr(),
                dims.as_ptr(),
                b,
                init(),
            )
        }
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("target_data_begin: device -2 (omp_invalid_device)", -2, |b| unsafe {
        target_data_begin(b, &[])
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("target_data_end: device -2 (omp_invalid_device)", -2, |b| unsafe { target_data_end(b, &[]) });
    // SAFETY: refused before any pointer is used.
    bad_num!("target_enter_data: device -2 (omp_invalid_device)", -2, |b| unsafe {
        target_enter_data(b, &[])
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("target_exit_data: device -2 (omp_invalid_device)", -2, |b| unsafe { target_exit_data(b, &[]) });
    // SAFETY: refused before any pointer is used.
    bad_num!("target_update: device -2 (omp_invalid_device)", -2, |b| unsafe {
        target_update(b, UpdateDirection::To, &[])
    });
    // SAFETY: refused before any pointer is used.
    bad_num!("target: device -2 (omp_invalid_device)", -2, |b| unsafe { target(b, &NOTHING, 1, &[], &[]) });

    // ---- memcpy_rect arguments ------------------------------------------------------------
    v.push(case("omp_target_memcpy_rect: num_dims 0", |&d: &i32| {
        expect!(
            null_rect(d, 0, 9),
            Error::InvalidArgument { routine: "omp_target_memcpy_rect", .. },
            "num_dims 0 must be positive"
        )
    }));
    v.push(case("omp_target_memcpy_rect: num_dims -3", |&d: &i32| {
        expect!(null_rect(d, -3, 9), Error::InvalidArgument { .. }, "num_dims -3")
    }));
    v.push(case("omp_target_memcpy_rect: null volume", |&d: &i32| {
        expect!(null_rect(d, 2, 0), Error::InvalidArgument { .. }, "volume is null")
    }));
    v.push(case("omp_target_memcpy_rect: null dst_offsets", |&d: &i32| {
        expect!(null_rect(d, 2, 1), Error::InvalidArgument { .. }, "dst_offsets is null")
    }));
    v.push(case("omp_target_memcpy_rect: null src_offsets", |&d: &i32| {
        expect!(null_rect(d, 2, 2), Error::InvalidArgument { .. }, "src_offsets is null")
    }));
    v.push(case("omp_target_memcpy_rect: null dst_dimensions", |&d: &i32| {
        expect!(null_rect(d, 2, 3), Error::InvalidArgument { .. }, "dst_dimensions is null")
    }));
    v.push(case("omp_target_memcpy_rect: null src_dimensions", |&d: &i32| {
        expect!(null_rect(d, 2, 4), Error::InvalidArgument { .. }, "src_dimensions is null")
    }));
    v.push(case("omp_target_memcpy_rect: volume overflows", |&d: &i32| {
        let (vol, off, big, dims, h) = ([1usize], [0usize], [usize::MAX], [usize::MAX], [0u8; 4]);
        with_block(4, d, |p| {
            // SAFETY: refused before any byte moves.
            let r = unsafe {
                omp_target_memcpy_rect(
                    p,
                    vp(h.as_ptr()),
                    1,
                    1,
                    vol.as_ptr(),
                    off.as_ptr(),
                    big.as_ptr(),
                    dims.as_ptr(),
                    dims.as_ptr(),
                    d,
                    init(),
                )
            };
            expect!(r, Error::Overflow { .. }, format!("offset {} + volume 1", usize::MAX))
        })
    }));
    v.push(case("omp_target_memcpy_rect: past the block's end", |&d: &i32| {
        let (vol, off, dims, h) = ([8usize], [0usize], [8usize], [0u8; 8]);
        with_block(4, d, |p| {
            // SAFETY: refused before any byte moves.
            let r = unsafe {
                omp_target_memcpy_rect(
                    p,
                    vp(h.as_ptr()),
                    1,
                    1,
                    vol.as_ptr(),
                    off.as_ptr(),
                    off.as_ptr(),
                    dims.as_ptr(),
                    dims.as_ptr(),
                    d,
                    init(),
                )
            };
            expect!(r, Error::OutsideAllocation { .. }, format!("device {d}"), "ends 4 bytes short")
        })
    }));

    // ---- memcpy, memset, free -------------------------------------------------------------
    v.push(case("omp_target_memcpy: null destination", |&d: &i32| {
        with_block(16, d, |p| {
            // SAFETY: refused before any byte moves.
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_memcpy(null_mut(), p, 16, 0, 0, init(), d) },
                Error::InvalidArgument { .. },
                "destination pointer is null"
            )
        })
    }));
    v.push(case("omp_target_memcpy: past the block's end", |&d: &i32| {
        let h = [0u8; 32];
        // SAFETY: refused before any byte moves.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_memcpy(p, vp(h.as_ptr()), 32, 0, 0, d, init()) },
                Error::OutsideAllocation { .. },
                format!("device {d}"),
                "ends 16 bytes short"
            )
        })
    }));
    v.push(case("omp_target_memcpy: offset overflows", |&d: &i32| {
        let h = [0u8; 4];
        // SAFETY: refused before any byte moves.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_memcpy(p, vp(h.as_ptr()), 4, usize::MAX, 0, d, init()) },
                Error::Overflow { routine: "omp_target_memcpy", .. },
                format!("offset {}", usize::MAX)
            )
        })
    }));
    v.push(case("omp_target_memset: null pointer", |&d: &i32| {
        // SAFETY: refused before anything is written.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { omp_target_memset(null_mut(), 0, 4, d) },
            Error::InvalidArgument { routine: "omp_target_memset", .. },
            format!("device {d}"),
            "pointer is null"
        )
    }));
    v.push(case("omp_target_memset: past the block's end", |&d: &i32| {
        // SAFETY: refused before anything is written.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_memset(p, 0, 17, d) },
                Error::OutsideAllocation { .. },
                format!("device {d}"),
                "ends 1 bytes short"
            )
        })
    }));
    v.push(case("omp_target_memset: a freed block", |&d: &i32| {
        let p = ok(omp_target_alloc(16, d))?;
        // SAFETY: `p` is not used again but by the refused call.
        ok(unsafe { omp_target_free(p, d) })?;
        // SAFETY: refused before anything is written.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { omp_target_memset(p, 0, 16, d) },
            Error::OutsideAllocation { .. },
            "freed or never allocated"
        )
    }));
    v.push(case("omp_target_free: double free", |&d: &i32| {
        let p = ok(omp_target_alloc(16, d))?;
        // SAFETY: `p` is not used again but by the refused call.
        ok(unsafe { omp_target_free(p, d) })?;
        // SAFETY: refused.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { omp_target_free(p, d) },
            Error::UnknownDevicePointer { .. },
            format!("device {d}"),
            format!("{:#x}", p as usize)
        )
    }));

    // ---- maps, update, launch -------------------------------------------------------------
    v.push(case("target_enter_data: null host pointer", |&d: &i32| {
        // SAFETY: refused before anything is read.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_enter_data(d, &[MapItem::to(null::<i32>(), 16)]) },
            Error::InvalidArgument { .. },
            format!("device {d}"),
            "null host pointer"
        )
    }));
    v.push(case("target_enter_data: range past the address space", |&d: &i32| {
        // SAFETY: refused before anything is read.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_enter_data(d, &[raw(PAST_THE_END, MapType::TO)]) },
            Error::Overflow { .. },
            PAST_THE_END_TEXT
        )
    }));
    v.push(case("target_exit_data: map type to", |&d: &i32| {
        let x = [0i32; 4];
        // SAFETY: refused before anything is written.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_exit_data(d, &[MapItem::slice(&x, MapType::TO)]) },
            Error::InvalidArgument { routine: "target exit data", .. },
            HostRange::of(&x)
        )
    }));
    v.push(case("target_data_begin: map type delete", |&d: &i32| {
        let x = [0i32; 4];
        // SAFETY: refused before anything is read.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_data_begin(d, &[MapItem::slice(&x, MapType::DELETE)]) },
            Error::InvalidArgument { routine: "target data", .. },
            "is not allowed"
        )
    }));
    v.push(case("target_update: null host pointer", |&d: &i32| {
        // SAFETY: refused before anything is copied.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_update(d, UpdateDirection::From, &[UpdateItem::raw(null::<i32>(), 8)]) },
            Error::InvalidArgument { routine: "target update", .. },
            "null host pointer"
        )
    }));
    v.push(case("target_update: present, absent", |&d: &i32| {
        let x = [0i32; 4];
        // SAFETY: refused before anything is copied.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { target_update(d, UpdateDirection::To, &[UpdateItem::slice(&x).present()]) },
            Error::NotPresent { .. },
            format!("device {d}"),
            HostRange::of(&x)
        )
    }));
    v.push(case("target_data_begin: extends a mapped range", |&d: &i32| {
        let x = [0i32; 8];
        // SAFETY: `x` outlives the mapping, removed below.
        ok(unsafe { target_enter_data(d, &[MapItem::slice(&x[..4], MapType::TO)]) })?;
        // SAFETY: refused before anything is read.
        let r = expect!(
            unsafe { target_data_begin(d, &[MapItem::slice(&x[2..], MapType::TO)]) },
            Error::Extension { .. },
            HostRange::of(&x[..4]),
            HostRange::of(&x[2..])
        );
        // SAFETY: delete copies nothing.
        ok(unsafe { target_exit_data(d, &[MapItem::slice(&x[..4], MapType::DELETE)]) })?;
        r
    }));
    v.push(case("target: a freed device pointer argument", |&d: &i32| {
        let p = ok(omp_target_alloc(16, d))?;
        // SAFETY: `p` is only passed to the refused launch.
        ok(unsafe { omp_target_free(p, d) })?;
        // SAFETY: refused before the kernel runs.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe {
                target(d, &FILL_I32, 4, &[], &[LaunchArg::Value(Scalar::I32(0)), LaunchArg::Device(p as u64)])
            },
            Error::KernelArgument { .. },
            format!("device {:#x}", p as usize)
        )
    }));

    // ---- associate -------------------------------------------------------------------------
    v.push(case("omp_target_associate_ptr: past the block's end", |&d: &i32| {
        let x = [0i32; 8];
        // SAFETY: refused before anything is associated.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_associate_ptr(vp(x.as_ptr()), p, 32, 0, d) },
                Error::OutsideAllocation { .. },
                format!("device {d}"),
                "ends 16 bytes short"
            )
        })
    }));
    v.push(case("omp_target_associate_ptr: offset overflows", |&d: &i32| {
        let x = [0i32; 1];
        // SAFETY: refused before anything is associated.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_associate_ptr(vp(x.as_ptr()), p, 4, usize::MAX, d) },
                Error::Overflow { .. },
                format!("offset {}", usize::MAX)
            )
        })
    }));
    v.push(case("omp_target_associate_ptr: null host pointer", |&d: &i32| {
        // SAFETY: refused before anything is associated.
        with_block(16, d, |p| {
            expect!(
                // SAFETY: refused before any pointer is used.
                unsafe { omp_target_associate_ptr(null(), p, 16, 0, d) },
                Error::InvalidArgument { .. },
                format!("device {d}"),
                "host pointer is null"
            )
        })
    }));
    v.push(case("omp_target_disassociate_ptr: nothing associated", |&d: &i32| {
        let x = [0i32; 1];
        // SAFETY: refused.
        expect!(
            // SAFETY: refused before any pointer is used.
            unsafe { omp_target_disassociate_ptr(vp(x.as_ptr()), d) },
            Error::NotAssociated { .. },
            format!("device {d}")
        )
    }));
    v
}

/// Runs `cases`, each followed by the leak checks; returns how many were checked and the
/// failures.
fn run_cases<C>(rt: &Runtime, what: &str, ctx: &C, cases: &[Case<C>]) -> (usize, Vec<String>) {
    let usage = |rt: &Runtime| -> Vec<usize> {
        (0..rt.num_devices()).map(|d| rt.pool_usage(d).map_or(usize::MAX, |u| u.live_allocations)).collect()
    };
    let (mut checked, mut failures) = (0, Vec::new());
    for c in cases {
        let before = usage(rt);
        match (c.run)(ctx) {
            Ok(Outcome::Checked) => checked += 1,
            Ok(Outcome::NeedsTwoDevices | Outcome::HostKernelsOnly) => {}
            Err(why) => failures.push(format!("{what}: {}: {why}", c.name)),
        }
        let live = rt.live_mappings();
        if !live.is_empty() {
            failures.push(format!("{what}: {}: left mapped: {live:?}", c.name));
            for (d, e) in live {
                let _ = if e.associated {
                    disassociate(rt, e.range.begin, d)
                } else {
                    exit(rt, d, &[MapItem::new(e.range, MapType::DELETE)])
                };
            }
        }
        let after = usage(rt);
        if after != before {
            failures.push(format!("{what}: {}: live allocations per device {before:?} -> {after:?}", c.name));
        }
    }
    (checked, failures)
}

/// At least this many distinct bad inputs are tried.
const AT_LEAST: usize = 100;

#[test]
fn there_are_at_least_100_distinct_bad_inputs() {
    let (r, o) = (runtime_cases(), omp_cases());
    let names: std::collections::HashSet<&str> =
        r.iter().map(|c| c.name).chain(o.iter().map(|c| c.name)).collect();
    assert_eq!(names.len(), r.len() + o.len(), "case names must be distinct");
    assert!(names.len() >= AT_LEAST, "{} bad inputs, expected at least {AT_LEAST}", names.len());
    println!("{} runtime and safe-API bad inputs, {} omp bad inputs", r.len(), o.len());
}

#[test]
fn runtime_and_safe_api_refuse_bad_input() {
    on_every_device("bad input", |rt, dev| {
        let cases = runtime_cases();
        let n = rt.num_devices();
        let ctx = Ctx { rt, dev, other: (n > 1).then(|| (dev + 1) % n) };
        let (checked, failures) = run_cases(rt, &format!("device {dev}"), &ctx, &cases);
        check!(
            failures.is_empty(),
            "{} of {} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
        check!(
            !ctx.host() || checked == cases.len(),
            "on host devices every case runs: {checked} of {}",
            cases.len()
        );
        Ok(())
    });
}

#[test]
fn omp_api_refuses_bad_input() {
    use offload::omp::*;
    let rt = use_runtime(
        Runtime::builder()
            .env(|_| None)
            .host_devices(2)
            .synchronous(offload_tests::synchronous())
            .build()
            .unwrap(),
    )
    .unwrap();
    let cases = omp_cases();
    let mut all = Vec::new();
    for d in 0..omp_get_num_devices().unwrap() {
        let (checked, failures) = run_cases(rt, &format!("omp device {d}"), &d, &cases);
        assert!(failures.is_empty() || checked < cases.len());
        all.extend(failures);
    }
    assert!(all.is_empty(), "{} failures:\n{}", all.len(), all.join("\n"));
    assert!(rt.live_mappings().is_empty());
}

/// A part past the last is refused by a panic, as an index past a slice's end is, before
/// any address is formed from it; the array is still usable and unmaps cleanly.
#[test]
fn a_distributed_array_refuses_a_part_past_the_last() {
    fn panics<R>(f: impl FnOnce() -> R) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err()
    }
    on_every_device("a part past the last", |rt, dev| {
        let mut grid = vec![1f32; 6 * 4];
        let part = RowPartition::new(6, 4, 1, 1)?;
        let d = DistributedArray::map(rt, &[dev], &mut grid, part, MapType::TO)?;
        check!(panics(|| d.view(1)), "view(1) of 1 part");
        check!(panics(|| d.send_halos(1, true)), "send_halos(1) of 1 part");
        check!(panics(|| d.row_addr(1, 0)), "row_addr(1, ..) of 1 part");
        check!(panics(|| d.device(1)), "device(1) of 1 part");
        d.exchange_halos(true)?;
        d.gather()?;
        check!(grid.iter().all(|&v| v == 1.0));
        check!(rt.live_mappings().is_empty(), "left mapped: {:?}", rt.live_mappings());
        Ok(())
    });
}
