//! `OFFLOAD_INFO` for learners (issue 28, item 5): maps named in the trace (`a[0:1024]`,
//! element sections), lines that say why a map copied nothing, refused constructs'
//! lines, the device memory routines' lines, hex in `live_mappings`, and the warning of
//! two devices copying back over the same host memory. Two host devices, nothing from the
//! process environment but `OFFLOAD_SYNC`.

use offload::{map, DeviceBuffer, InfoFlags, MapItem, MapType, Result, Runtime, UpdateDirection};
use offload_tests::synchronous;

/// Two host devices tracing `flags` into a capture.
fn runtime(flags: InfoFlags) -> Result<Runtime> {
    let b = Runtime::builder().env(|_| None).gpus(false).host_devices(2).synchronous(synchronous());
    b.info(flags).capture_info().build()
}

/// The lines that contain every one of `needles`.
fn with<'a>(lines: &'a [String], needles: &[&str]) -> Vec<&'a String> {
    lines.iter().filter(|l| needles.iter().all(|n| l.contains(n))).collect()
}

#[test]
fn a_named_map_is_named_in_every_line_with_element_offsets() -> Result<()> {
    let rt = runtime(InfoFlags::ALL)?;
    let a = vec![1.0f32; 1024];
    let at = |line: u32| format!("at {}:{line}", file!());
    let line = line!() + 3;
    // SAFETY: `a` outlives its mapping; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), 4096).named("a")])?;
        rt.update(0, UpdateDirection::To, &[(offload::HostRange::of(&a[256..384]), false)])?;
        rt.exit_data(0, &[MapItem::release(a.as_ptr(), 4096)])?;
    }
    let lines = rt.take_info();
    let expect = [
        format!("device 0: target enter data {} with 1 maps: to(a[0:1024])", at(line)),
        format!("device 0: target update to {} with 1 ranges: a[256:128]", at(line + 1)),
        // The exit's item is unnamed: the entry it lies in names it.
        format!("device 0: target exit data {} with 1 maps: release(a[0:1024])", at(line + 2)),
    ];
    for e in &expect {
        assert_eq!(with(&lines, &[e]).len(), 1, "{e}\n{lines:#?}");
    }
    assert_eq!(with(&lines, &["device 0: entry created a[0:1024] -> device 0x", "ref count 1"]).len(), 1);
    assert_eq!(with(&lines, &["device 0: copy host->device 4096 bytes, a[0:1024] -> device 0x"]).len(), 1);
    assert_eq!(with(&lines, &["device 0: copy host->device 512 bytes, a[256:128] -> device 0x"]).len(), 1);
    assert_eq!(with(&lines, &["device 0: entry removed a[0:1024] -> device 0x"]).len(), 1);
    // The dump after the enter names the row.
    assert_eq!(with(&lines, &["after target enter data", " a[0:1024]\n"]).len(), 1, "{lines:#?}");

    // Unnamed, ranges are given by their bytes, as before.
    let b = [0u8; 8];
    // SAFETY: as above.
    unsafe { rt.enter_data(1, &[MapItem::slice(&b, MapType::TO)])? };
    let lines = rt.take_info();
    let r = offload::HostRange::of(&b).to_string();
    assert_eq!(with(&lines, &[&format!("to(host {:#x}, 8 bytes)", b.as_ptr() as usize)]).len(), 1);
    assert_eq!(with(&lines, &["device 1: entry created", &r]).len(), 1, "{lines:#?}");
    // SAFETY: as above.
    unsafe { rt.exit_data(1, &[MapItem::slice(&b, MapType::DELETE)])? };
    Ok(())
}

#[test]
fn the_safe_api_names_maps_by_method_and_by_macro_and_dumps_show_the_names() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS)?;
    let gpu = rt.device(0)?;
    let (a, mut grid) = (vec![1i32; 64], vec![0f64; 32]);
    let line = line!() + 1;
    gpu.data((map::to(&a).named("a"), map::tofrom!(grid[8..16]), map::alloc!(a[4..8])), |_| {
        let dump = rt.dump_present_table(0)?;
        assert!(dump.lines().any(|l| l.ends_with(" a[0:64]")), "{dump}");
        assert!(dump.lines().any(|l| l.ends_with(" grid[8:8]")), "{dump}");
        let live = rt.live_mappings();
        let shown: Vec<String> = live.iter().map(|(d, e)| format!("device {d}: {e}")).collect();
        assert!(shown.iter().any(|s| s.starts_with("device 0: a[0:64] host 0x")), "{shown:#?}");
        Ok(())
    })?;
    let lines = rt.take_info();
    let at = format!("at {}:{line} with 3 maps: to(a[0:64]) tofrom(grid[8:8]) alloc(a[4:4])", file!());
    assert_eq!(with(&lines, &["device 0: entering target data", &at]).len(), 1, "{lines:#?}");
    assert_eq!(with(&lines, &["device 0: exiting target data", &at]).len(), 1, "{lines:#?}");

    // `named_at`: a part of a split array, given as it is in the whole.
    let mut whole = [0u16; 100];
    rt.device(1)?.data(map::tofrom(&mut whole[50..]).named_at("whole", 50), |_| Ok(()))?;
    let lines = rt.take_info();
    assert_eq!(with(&lines, &["device 1: entering target data", "tofrom(whole[50:50])"]).len(), 1);
    Ok(())
}

#[test]
fn live_mappings_give_addresses_in_hex() -> Result<()> {
    let rt = runtime(InfoFlags::NONE)?;
    let x = [0u32; 4];
    let _m = rt.device(0)?.enter_data(map::to!(x))?;
    let live = rt.live_mappings();
    let (_, e) = &live[0];
    let debug = format!("{live:?}");
    assert!(debug.contains(&format!("device_addr: {:#x}", e.device_addr)), "{debug}");
    assert!(!debug.contains(&format!("device_addr: {}", e.device_addr)), "{debug}");
    assert!(debug.contains(&format!("base: {:#x}", e.base)) && debug.contains("name: x[0:4]"), "{debug}");
    let shown = e.to_string();
    assert!(shown.contains(&format!("-> device {:#x}, ref count 1 hold count 0", e.device_addr)), "{shown}");
    Ok(())
}

#[test]
fn lines_say_why_a_map_copied_nothing() -> Result<()> {
    let rt = runtime(InfoFlags::MAPPING_EXISTS)?;
    let mut a = [0i32; 10];
    let ap = a.as_mut_ptr();
    // SAFETY: `a` outlives its mappings; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[MapItem::to(ap, 40).named("a")])?;
        rt.enter_data(0, &[MapItem::to(ap, 40)])?;
        rt.enter_data(0, &[MapItem::to(ap, 40).always()])?;
        rt.exit_data(0, &[MapItem::from(ap, 40)])?;
        rt.exit_data(0, &[MapItem::from(ap, 40)])?;
    }
    let lines = rt.take_info();
    let not_copied: Vec<&String> = lines.iter().filter(|l| l.contains("not copied")).collect();
    assert_eq!(
        not_copied,
        [
            "device 0: to(a[0:10]) not copied: already present, ref count 1 -> 2 (copies only on creation, or with always)",
            "device 0: from(a[0:10]) not copied: ref count 3 -> 2 (copies when it reaches 0, or with always)",
            "device 0: from(a[0:10]) not copied: ref count 2 -> 1 (copies when it reaches 0, or with always)",
        ],
        "{lines:#?}"
    );
    // The last exit copies: nothing to explain.
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &[MapItem::from(ap, 40)])? };
    assert!(with(&rt.take_info(), &["not copied"]).is_empty());

    // A hold keeps the entry: both counts are given.
    let region = [MapItem::tofrom(ap, 40).hold().named("a")];
    // SAFETY: as above.
    unsafe {
        rt.target_data_begin(0, &region)?;
        rt.enter_data(0, &[MapItem::to(ap, 40)])?;
        rt.exit_data(0, &[MapItem::from(ap, 40)])?;
        rt.target_data_end(0, &region)?;
    }
    let lines = rt.take_info();
    assert_eq!(
        with(
            &lines,
            &["from(a[0:10]) not copied: ref count 1 -> 0, hold count 1 (copies when both counts reach 0"]
        )
        .len(),
        1,
        "{lines:#?}"
    );
    Ok(())
}

#[test]
fn a_range_half_inside_an_entry_is_reported_as_such() -> Result<()> {
    let rt = runtime(InfoFlags::ABSENT)?;
    let mut a = [0i32; 20];
    let ap = a.as_mut_ptr();
    // SAFETY: `a` outlives its mapping; nothing is copied back into its second half.
    unsafe {
        rt.enter_data(0, &[MapItem::to(ap, 40).named("a")])?;
        rt.exit_data(0, &[MapItem::from(ap.add(5), 40)])?;
        rt.update(0, UpdateDirection::From, &[(offload::HostRange::new(ap.add(5) as usize, 40), false)])?;
        rt.exit_data(0, &[MapItem::from(ap.add(12), 8)])?;
    }
    let lines = rt.take_info();
    assert_eq!(
        lines,
        [
            "device 0: target exit data: a[5:10] is not wholly inside mapped a[0:10]; skipped".to_string(),
            "device 0: target update: a[5:10] is not wholly inside mapped a[0:10]; skipped".to_string(),
            format!(
                "device 0: target exit data: {} has no device counterpart; skipped",
                offload::HostRange::new(ap.wrapping_add(12) as usize, 8)
            ),
        ]
    );
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &[MapItem::delete(ap, 40)])? };
    Ok(())
}

#[test]
fn a_refused_construct_still_gets_its_line_then_why() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS)?;
    let a = [0i32; 4];
    let line = line!() + 2;
    // SAFETY: refused before anything is mapped.
    let r = unsafe { rt.enter_data(0, &[MapItem::to(a.as_ptr(), 16).hold().named("a")]) };
    let e = r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(!e.is_empty(), "`hold` on `enter data` must be refused");
    let at = format!("at {}:{line}", file!());
    assert_eq!(
        rt.take_info(),
        [
            format!("device 0: target enter data {at} with 1 maps: hold, to(a[0:4])"),
            format!("device 0: target enter data {at} refused: {e}"),
        ]
    );
    // A device that does not exist: the same two lines.
    let line = line!() + 2;
    // SAFETY: as above.
    let r = unsafe { rt.update(7, UpdateDirection::To, &[(offload::HostRange::of(&a), false)]) };
    let e = r.err().map(|e| e.to_string()).unwrap_or_default();
    let lines = rt.take_info();
    let at = format!("at {}:{line}", file!());
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[0].starts_with(&format!("device 7: target update to {at} with 1 ranges: host 0x")));
    assert_eq!(lines[1], format!("device 7: target update to {at} refused: {e}"));
    Ok(())
}

#[test]
fn device_memory_routines_are_traced_with_the_callers_line() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS)?;
    let mut h = [0i32; 4];
    let hp = h.as_mut_ptr() as usize;
    let line = line!() + 1;
    let p = rt.target_alloc(64, 1)?;
    // SAFETY: `p` is 64 bytes of device 1's memory; `h` outlives the association.
    unsafe {
        rt.associate_ptr(hp, p, 16, 16, 1)?;
        rt.disassociate_ptr(hp, 1)?;
        rt.target_free(p, 1)?;
    }
    let at = |n: u32| format!("at {}:{}", file!(), line + n);
    assert_eq!(
        rt.take_info(),
        [
            format!("device 1: omp_target_alloc {}: 64 bytes -> device {p:#x}", at(0)),
            format!(
                "device 1: omp_target_associate_ptr {}: {} -> device {:#x}",
                at(3),
                offload::HostRange::new(hp, 16),
                p + 16
            ),
            format!("device 1: omp_target_disassociate_ptr {}: host {hp:#x}", at(4)),
            format!("device 1: omp_target_free {}: device {p:#x}", at(5)),
        ]
    );
    // A failure says so.
    // SAFETY: nothing is freed: the address is unknown.
    let r = unsafe { rt.target_free(0x10, 1) };
    let lines = rt.take_info();
    assert!(r.is_err() && lines.len() == 1 && lines[0].contains(": failed: "), "{lines:#?}");

    // A device buffer: made where the program made it, freed at its drop, named so.
    let line = line!() + 2;
    {
        let buf = DeviceBuffer::<i32>::new(&rt.device(0)?, 8)?;
        let _assoc = buf.associate(&mut h, 0)?;
    }
    let lines = rt.take_info();
    let made = format!("at {}:{line}", file!());
    let assoc = format!("at {}:{}", file!(), line + 1);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[0].starts_with(&format!("device 0: DeviceBuffer::new {made}: 32 bytes -> device 0x")));
    assert!(lines[1].starts_with(&format!("device 0: DeviceBuffer::associate {assoc}: ")));
    assert_eq!(
        lines[2],
        format!("device 0: omp_target_disassociate_ptr of the Association made {assoc}: host {hp:#x}")
    );
    assert!(lines[3]
        .starts_with(&format!("device 0: omp_target_free of the DeviceBuffer made {made}: device 0x")));
    Ok(())
}

#[test]
fn two_devices_copying_back_overlapping_ranges_are_warned_of() -> Result<()> {
    let rt = runtime(InfoFlags::RACE)?;
    let mut a = vec![0i32; 10];
    let ap = a.as_mut_ptr();
    // Device 0 maps a[0:6], device 1 a[4:6] (two rows of halo each side of 5).
    let left = MapItem::tofrom(ap, 24).named("a");
    // SAFETY: `a` outlives the mappings; the host does not touch it during the calls.
    let right = MapItem::tofrom(unsafe { ap.add(4) }, 24).named_at("a", 4);
    // SAFETY: as above.
    unsafe {
        rt.enter_data(0, &[left])?;
        rt.enter_data(1, &[right])?;
        rt.exit_data(0, &[left])?;
    }
    let lines = rt.take_info();
    assert_eq!(
        lines,
        ["device 0: race: the copy back of a[0:6] writes host memory that device 1 has mapped with from as a[4:6]: \
          whichever copies back last wins; copy back only the part each device owns"]
    );
    // `update from` of the part device 1 owns alone: no warning; of its halo: one.
    // SAFETY: as above.
    unsafe {
        rt.update(1, UpdateDirection::From, &[(offload::HostRange::new(ap.add(6) as usize, 16), false)])?;
        assert!(rt.take_info().is_empty());
        rt.enter_data(0, &[left])?;
        rt.update(1, UpdateDirection::From, &[(offload::HostRange::new(ap.add(4) as usize, 8), false)])?;
        assert_eq!(with(&rt.take_info(), &["device 1: race: the copy back of a[4:2]", "device 0"]).len(), 1);
        rt.exit_data(1, &[MapItem::release(ap.add(4), 24)])?;
        rt.exit_data(0, &[MapItem::release(ap, 24)])?;
    }

    // The other device maps only `to`: it will never copy back, so no warning.
    // SAFETY: as above.
    unsafe {
        rt.enter_data(0, &[left])?;
        rt.enter_data(1, &[MapItem::to(ap.add(4), 24)])?;
        rt.exit_data(0, &[left])?;
        rt.exit_data(1, &[MapItem::release(ap.add(4), 24)])?;
    }
    assert!(rt.take_info().is_empty());
    Ok(())
}

/// The usual C halo pattern: both devices enter their overlapping halves with `to` and
/// exit them with `from`. At the first exit nothing says the other will copy back; the
/// second copy back lands over the first one's, and is warned of. Devices that map the
/// same memory one after the other (the second maps it after the first copied back) do
/// not race, and are not warned of.
#[test]
fn devices_that_enter_with_to_and_exit_with_from_over_one_range_are_warned_of() -> Result<()> {
    let rt = runtime(InfoFlags::RACE)?;
    let mut a = vec![0i32; 10];
    let ap = a.as_mut_ptr();
    // SAFETY: `a` outlives the mappings; the host does not touch it during the calls.
    unsafe {
        let (left, right) = (MapItem::to(ap, 24).named("a"), MapItem::to(ap.add(4), 24).named_at("a", 4));
        rt.enter_data(0, &[left])?;
        rt.enter_data(1, &[right])?;
        rt.exit_data(0, &[MapItem::from(ap, 24)])?;
        assert!(rt.take_info().is_empty(), "device 1 may still release its part");
        rt.exit_data(1, &[MapItem::from(ap.add(4), 24)])?;
        assert_eq!(
            rt.take_info(),
            ["device 1: race: the copy back of a[4:6] writes host memory that device 0 copied back as a[0:6] \
              while device 1 had it mapped: whichever copies back last wins; copy back only the part each device owns"]
        );
        // One after the other: device 1 maps the memory after device 0 copied it back.
        rt.enter_data(0, &[MapItem::to(ap, 24)])?;
        rt.exit_data(0, &[MapItem::from(ap, 24)])?;
        rt.enter_data(1, &[MapItem::to(ap.add(4), 24)])?;
        rt.exit_data(1, &[MapItem::from(ap.add(4), 24)])?;
    }
    assert!(rt.take_info().is_empty());
    Ok(())
}

/// A `release` that leaves its entry mapped says which count it moved (it printed nothing:
/// a learner could not see the count go down).
#[test]
fn a_release_that_keeps_its_entry_says_what_it_moved() -> Result<()> {
    let rt = runtime(InfoFlags::MAPPING_EXISTS)?;
    let a = vec![1.0f32; 1024];
    let item = MapItem::to(a.as_ptr(), 4096).named("a");
    // SAFETY: `a` outlives its mapping; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[item])?;
        rt.enter_data(0, &[item])?;
        rt.exit_data(0, &[MapItem::release(a.as_ptr(), 4096)])?;
        assert_eq!(
            with(&rt.take_info(), &["release(a[0:1024])"]),
            [&"device 0: release(a[0:1024]): ref count 2 -> 1; the entry stays until it reaches 0"
                .to_string()]
        );
        // The last one removes the entry: the removal is the line (ENTRIES), not this one.
        rt.exit_data(0, &[MapItem::release(a.as_ptr(), 4096)])?;
    }
    assert!(with(&rt.take_info(), &["release("]).is_empty());
    Ok(())
}

#[test]
fn the_race_check_is_off_without_its_bit() -> Result<()> {
    let rt = runtime(InfoFlags::from_bits(!InfoFlags::RACE.bits()))?;
    let mut a = vec![0i32; 10];
    let ap = a.as_mut_ptr();
    let item = MapItem::tofrom(ap, 40);
    // SAFETY: `a` outlives the mappings; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[item])?;
        rt.enter_data(1, &[item])?;
        rt.exit_data(0, &[item])?;
        rt.exit_data(1, &[item])?;
    }
    assert!(with(&rt.take_info(), &["race"]).is_empty());
    Ok(())
}

/// The warning is a `tracing` event at `WARN`: a program's subscriber gets it with
/// `OFFLOAD_INFO` off.
#[test]
fn a_programs_subscriber_gets_the_race_warning_at_warn() -> Result<()> {
    use std::sync::{Arc, Mutex};
    type Seen = Arc<Mutex<Vec<(tracing::Level, String)>>>;
    struct Warnings(Seen);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut m = Message(String::new());
            e.record(&mut m);
            if m.0.contains("race") {
                self.0.lock().map(|mut s| s.push((*e.metadata().level(), m.0))).unwrap_or(());
            }
        }
    }
    use tracing_subscriber::layer::SubscriberExt;
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(Warnings(Arc::clone(&seen)));
    let rt = runtime(InfoFlags::NONE)?;
    let mut a = vec![0i32; 10];
    let item = MapItem::tofrom(a.as_mut_ptr(), 40).named("a");
    tracing::subscriber::with_default(subscriber, || -> Result<()> {
        // SAFETY: `a` outlives the mappings; the host does not touch it during the calls.
        unsafe {
            rt.enter_data(0, &[item])?;
            rt.enter_data(1, &[item])?;
            rt.exit_data(0, &[item])?;
            rt.exit_data(1, &[item])
        }
    })?;
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].0, tracing::Level::WARN);
    assert!(seen[0].1.starts_with("device 0: race: the copy back of a[0:10]"), "{seen:#?}");
    assert!(rt.take_info().is_empty(), "OFFLOAD_INFO is off");
    Ok(())
}

/// A copy queued behind a kernel gives its own time and, apart, how long it waited for the
/// kernel (the time used to include the wait: a 4 MiB copy behind a long kernel read as
/// tens of milliseconds).
#[test]
fn a_copy_behind_a_kernel_tells_its_wait_apart_from_its_time() -> Result<()> {
    let rt = runtime(InfoFlags::TRANSFERS)?;
    let dev = rt.device(0)?;
    let mut a = vec![1u8; 4 << 20];
    // The kernel is queued (unless OFFLOAD_SYNC makes launches wait): the copy waits for
    // what is left of its two seconds (over 400 ms unless this thread stalls for 1.6 s
    // between the launch and the copy), far beyond any copy of 4 MiB.
    dev.launch(&offload_tests::NAP, 1, (2000u64,))?;
    // SAFETY: `a` outlives its mapping and is not touched meanwhile.
    unsafe {
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), a.len()).named("a")])?;
        rt.exit_data(0, &[MapItem::from(a.as_mut_ptr(), a.len())])?;
    }
    let lines = rt.take_info();
    let to = with(&lines, &["copy host->device 4194304 bytes, a[0:4194304]"]);
    let back = with(&lines, &["copy device->host 4194304 bytes"]);
    assert_eq!((to.len(), back.len()), (1, 1), "{lines:#?}");
    let waited = |l: &str| {
        let (_, rest) = l.split_once(" us after ")?;
        rest.split_once(" us waiting for the work queued before")?.0.parse::<f64>().ok()
    };
    // (With OFFLOAD_SYNC the launch waited, and the copy had nothing to wait for; a wait
    // too short to matter is not asserted absent: a loaded machine makes one.)
    if !synchronous() {
        let w = waited(to[0]).unwrap_or_else(|| panic!("no wait in {}", to[0]));
        assert!(w >= 400_000.0, "{}", to[0]);
    }
    Ok(())
}

/// Zero-length exits say what they did (issue 48, item 4): they copy nothing and move the
/// count of the entry their address lies in, whether the entry stays or leaves; one whose
/// entry is gone is skipped, named by the array that was mapped there.
#[test]
fn zero_length_exits_say_what_they_did() -> Result<()> {
    let rt = runtime(InfoFlags::MAPPING_EXISTS | InfoFlags::ABSENT)?;
    let mut a = vec![1.0f32; 16];
    let ap = a.as_mut_ptr();
    let item = MapItem::to(ap, 64).named("a");
    // SAFETY: `a` outlives its mapping; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[item])?;
        rt.enter_data(0, &[item])?;
        let _ = rt.take_info();
        rt.exit_data(0, &[MapItem::from(ap.add(4), 0).named_at("a", 4)])?;
        assert_eq!(
            rt.take_info(),
            ["device 0: from(a[4:0]): a zero-length section copies nothing; ref count 2 -> 1; the entry stays until it reaches 0"]
        );
        rt.exit_data(0, &[MapItem::from(ap, 0)])?;
        assert_eq!(
            rt.take_info(),
            ["device 0: from(a[0:0]): a zero-length section copies nothing; ref count 1 -> 0; the entry is removed"]
        );
        assert!(rt.entry(ap as usize, 0)?.is_none(), "the zero-length exit removed the entry");
        // A held zero-length section at a region's end moves the hold count, and says so.
        rt.enter_data(0, &[item])?;
        let held = [MapItem::to(ap.add(2), 0).hold().named_at("a", 2)];
        rt.target_data_begin(0, &held)?;
        let _ = rt.take_info();
        rt.target_data_end(0, &held)?;
        assert_eq!(
            rt.take_info(),
            ["device 0: hold, to(a[2:0]): a zero-length section copies nothing; ref count 1, hold count 1 -> 0; the entry stays until it reaches 0"]
        );
        rt.exit_data(0, &[MapItem::from(ap, 0)])?;
        let _ = rt.take_info();
        // Nothing is mapped there now: skipped, still named as the program named it.
        rt.exit_data(0, &[MapItem::from(ap, 0)])?;
    }
    assert_eq!(rt.take_info(), ["device 0: target exit data: a[0:0] has no device counterpart; skipped"]);
    Ok(())
}

/// Once a named entry is gone, later lines about its bytes still give its name (issue 48,
/// item 4), until another mapping is made over them.
#[test]
fn lines_name_a_range_after_its_entry_is_gone() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS | InfoFlags::ABSENT)?;
    let mut a = vec![1.0f32; 16];
    let line = line!() + 5;
    // SAFETY: `a` outlives its mappings; the host does not touch it during the calls.
    unsafe {
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), 64).named("a")])?;
        rt.exit_data(0, &[MapItem::delete(a.as_ptr(), 64)])?;
        rt.update(0, UpdateDirection::From, &[(offload::HostRange::of(&a[4..8]), false)])?;
    }
    let at = format!("at {}:{line}", file!());
    assert_eq!(
        rt.take_info(),
        [
            format!("device 0: target enter data at {}:{} with 1 maps: to(a[0:16])", file!(), line - 2),
            format!("device 0: target exit data at {}:{} with 1 maps: delete(a[0:16])", file!(), line - 1),
            format!("device 0: target update from {at} with 1 ranges: a[4:4]"),
            "device 0: target update: a[4:4] has no device counterpart; skipped".to_string(),
        ]
    );
    // An unnamed mapping over those bytes: the old name no longer applies.
    // SAFETY: as above.
    unsafe {
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), 64)])?;
        rt.exit_data(0, &[MapItem::delete(a.as_ptr(), 64)])?;
        let _ = rt.take_info();
        rt.exit_data(0, &[MapItem::from(a.as_mut_ptr(), 64)])?;
    }
    let lines = rt.take_info();
    assert!(lines.iter().all(|l| !l.contains("a[")), "{lines:#?}");
    assert_eq!(with(&lines, &["has no device counterpart", "host 0x"]).len(), 1, "{lines:#?}");
    Ok(())
}

/// A `present` map that finds nothing names the map in its error and in the failed
/// construct's line (issue 48, items 4 and 7), on entry and on exit.
#[test]
fn present_failures_name_the_map() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS)?;
    let y = [0f32; 4];
    // SAFETY: refused before anything is mapped.
    let on_entry = unsafe { rt.enter_data(0, &[MapItem::to(y.as_ptr(), 16).present().named("y")]) };
    // SAFETY: as above.
    let on_exit =
        unsafe { rt.exit_data(0, &[MapItem::from(y.as_ptr().cast_mut(), 16).present().named("y")]) };
    let r = offload::HostRange::of(&y);
    for (e, what) in [(on_entry, "entry"), (on_exit, "exit")] {
        let e = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            e,
            format!("device 0: y[0:4] at {r} is not present (required by a `present` map on {what})")
        );
    }
    let lines = rt.take_info();
    assert_eq!(with(&lines, &["failed: device 0: y[0:4] at host 0x"]).len(), 2, "{lines:#?}");
    Ok(())
}

/// A sum kernel for the launch below.
#[offload::kernel]
fn bump(i: usize, y: &mut [f32]) {
    y[i] += 1.0;
}

/// A target region refused because an argument is not mapped prints its construct line,
/// then the refusal, and with tables the region's entry and exit halves around it (issue
/// 48, items 4 and 7): nothing reads as if the kernel had run.
#[test]
fn a_launch_with_an_unmapped_argument_says_it_was_refused() -> Result<()> {
    let rt = runtime(InfoFlags::KERNEL_ARGS | InfoFlags::DUMP_TABLE)?;
    let y = [0f32; 4];
    let line = line!() + 2;
    // SAFETY: the argument is refused before any kernel runs.
    let r = unsafe { rt.target_launch(0, &bump::KERNEL, 4, &[], &[offload::LaunchArg::mapped(y.as_ptr())]) };
    let e = r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("is not mapped on device 0"), "{e}");
    let lines = rt.take_info();
    let at = format!("at {}:{line}", file!());
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert_eq!(
        lines[0],
        format!("device 0: entering target (kernel `bump`, n=4) {at} with 0 maps; 1 arguments")
    );
    assert!(lines[1].starts_with("after target (entry half): device 0 present table"), "{lines:#?}");
    assert_eq!(lines[2], format!("device 0: target {at} refused: {e}"));
    assert!(lines[3].starts_with("after target (exit half): device 0 present table"), "{lines:#?}");
    assert_eq!(y, [0.0; 4], "no kernel ran");
    Ok(())
}

/// `OFFLOAD_INFO`'s every-table bit (0x100, on in -1) prints every device's table after
/// each construct, as libomptarget does, not only the construct's own (issue 48, item 5).
#[test]
fn every_devices_table_after_each_construct() -> Result<()> {
    let a = [1f32; 8];
    let b = [2i32; 4];
    let rt = runtime(InfoFlags::EVERY_TABLE)?;
    // SAFETY: `a` and `b` outlive their mappings; the host does not touch them meanwhile.
    unsafe {
        rt.enter_data(1, &[MapItem::to(b.as_ptr(), 16).named("b")])?;
        let _ = rt.take_info();
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), 32).named("a")])?;
    }
    let lines = rt.take_info();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with("after target enter data: device 0 present table (1 entries)"),
        "{lines:#?}"
    );
    assert!(lines[0].ends_with(" a[0:8]\n"), "{lines:#?}");
    assert!(
        lines[1].starts_with("after target enter data on device 0: device 1 present table (1 entries)"),
        "{lines:#?}"
    );
    assert!(lines[1].ends_with(" b[0:4]\n"), "{lines:#?}");
    // A launch: the other tables once the region has run.
    let launch = [offload::LaunchArg::mapped(a.as_ptr())];
    // SAFETY: `a` is mapped on device 0 for the launch.
    unsafe { rt.target_launch(0, &bump::KERNEL, 1, &[], &launch)? };
    let lines = rt.take_info();
    assert_eq!(
        with(&lines, &["after target (kernel `bump`) on device 0: device 1 present table (1 entries)"]).len(),
        1,
        "{lines:#?}"
    );
    // A device that holds nothing is left out.
    // SAFETY: as above.
    unsafe { rt.exit_data(1, &[MapItem::delete(b.as_ptr(), 16)])? };
    let _ = rt.take_info();
    // SAFETY: as above.
    unsafe { rt.exit_data(0, &[MapItem::release(a.as_ptr(), 32)])? };
    let lines = rt.take_info();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].starts_with("after target exit data: device 0 present table (0 entries)"), "{lines:#?}");
    // Without the bit, only the construct's own device (0x04), as before.
    let rt = runtime(InfoFlags::DUMP_TABLE)?;
    // SAFETY: as above.
    unsafe {
        rt.enter_data(1, &[MapItem::to(b.as_ptr(), 16).named("b")])?;
        rt.enter_data(0, &[MapItem::to(a.as_ptr(), 32).named("a")])?;
    }
    let lines = rt.take_info();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains(" on device ")), "{lines:#?}");
    // SAFETY: as above.
    unsafe {
        rt.exit_data(0, &[MapItem::delete(a.as_ptr(), 32)])?;
        rt.exit_data(1, &[MapItem::delete(b.as_ptr(), 16)])?;
    }
    Ok(())
}
