//! Mapping costs on every device present (host devices and GPUs), beside libomptarget 22's
//! figures on the 1 x H200 machine (DESIGN.md): present-table lookups at 1, 1 000 and
//! 100 000 live entries with random probes, enter + exit of a present 4 KiB range,
//! enter(to) + exit(from) of a new 4 KiB range, and on GPUs a target region with one
//! present argument against a raw cudarc launch + synchronize of the same kernel.
//!
//! `cargo bench -p offload-benches --bench mapping` (prints the table of docs/PERFORMANCE.md; criterion's
//! own report for each measurement comes with it).

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use offload::{BackendKind, Kernel, LaunchArg, MapItem, MapType, Runtime};
use offload_benches::{Bench, Budget};
use std::hint::black_box;

/// Bytes per mapped chunk when filling the table.
const CHUNK: usize = 64;

const INC_SRC: &str = r#"extern "C" __global__ void inc(float* x, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}"#;

/// `x[i] += 1`: a kernel with one mapped argument.
static INC: Kernel = Kernel::new("inc").with_cuda(INC_SRC);

/// A small xorshift generator: probes that are random over the table, not a short cycle.
struct Probe(u64);

impl Probe {
    fn next_below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn row(what: &str, device: &str, ours: f64, libomptarget: &str) {
    println!("| {what} | {device} | {} | {libomptarget} |", fmt(ours));
}

fn fmt(secs: f64) -> String {
    if secs < 1e-6 {
        format!("{:.1} ns", secs * 1e9)
    } else {
        format!("{:.2} us", secs * 1e6)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !offload_benches::measuring() {
        return Ok(());
    }
    let rt = Runtime::builder().gpus(true).host_devices(1).build()?;
    print!("{}", rt.device_report());
    let mut b = Bench::new("mapping");
    let mut table = Vec::new();
    for d in 0..rt.num_devices() {
        let desc = rt.describe(d)?;
        let label = format!("{d} ({})", desc.name);
        let gpu = desc.kind != BackendKind::Host;
        for &entries in &[1usize, 1_000, 100_000] {
            let host = vec![0u8; entries * CHUNK];
            let items: Vec<MapItem> = host.chunks(CHUNK).map(|c| MapItem::slice(c, MapType::ALLOC)).collect();
            // SAFETY: `host` outlives the mappings (released below).
            unsafe { rt.enter_data(d, &items) }?;
            let base = host.as_ptr() as usize;
            let mut p = Probe(0x9e37_79b9_7f4a_7c15);
            let t = b.wall(&format!("is_present/{d}/{entries}"), Budget::FAST, || {
                let at = base + p.next_below(entries) * CHUNK + 7;
                assert!(black_box(rt.is_present(black_box(at), d).expect("lookup")));
            });
            let lib = match entries {
                1 => "127-150 ns",
                1_000 => "202-279 ns",
                _ => "1238-1354 ns",
            };
            table.push((format!("is_present, {entries} live entries, random probes"), label.clone(), t, lib));
            let release: Vec<MapItem> =
                host.chunks(CHUNK).map(|c| MapItem::slice(c, MapType::RELEASE)).collect();
            // SAFETY: as above.
            unsafe { rt.exit_data(d, &release) }?;
        }

        let mut x = vec![1f32; 1024];
        // Every item from one pointer that may write (the `from` copies write through it).
        let xp = x.as_mut_ptr();
        let bytes = x.len() * 4;
        let to = [MapItem::to(xp, bytes)];
        let from = [MapItem::from(xp, bytes)];
        // SAFETY: `x` outlives every mapping of it below and is not touched meanwhile.
        unsafe { rt.enter_data(d, &to) }?;
        let t = b.wall(&format!("enter_exit_present_4KiB/{d}"), Budget::FAST, || {
            // SAFETY: as above.
            unsafe {
                rt.enter_data(d, black_box(&to)).expect("enter");
                rt.exit_data(d, black_box(&from)).expect("exit");
            }
        });
        table.push(("enter + exit of a present 4 KiB range".into(), label.clone(), t, "2.7-3.6 us"));
        if gpu {
            // `n` follows the arguments by the Kernel convention.
            let args = [LaunchArg::mapped(xp)];
            let tofrom = [MapItem::tofrom(xp, bytes)];
            rt.device(d)?.prepare(&INC)?;
            let t = b.wall(&format!("target_1_present_arg/{d}"), Budget::FAST, || {
                // SAFETY: `x` is mapped (entered above), the kernel touches its 1024 floats.
                unsafe { rt.target_launch(d, &INC, 1024, black_box(&tofrom), &args) }.expect("launch");
                // The launch is queued (docs/SEMANTICS.md R11): the row keeps its wait.
                rt.synchronize(d).expect("sync");
            });
            table.push((
                "target region, 1 present argument (launch + sync)".into(),
                label.clone(),
                t,
                "52-72 us",
            ));
        }
        // SAFETY: as above.
        unsafe { rt.exit_data(d, &from) }?;

        let t = b.wall(&format!("enter_exit_new_4KiB/{d}"), Budget::FAST, || {
            // SAFETY: as above; each iteration allocates, copies in, copies back and frees.
            unsafe {
                rt.enter_data(d, black_box(&to)).expect("enter");
                rt.exit_data(d, black_box(&from)).expect("exit");
            }
        });
        table.push(("enter(to) + exit(from) of a new 4 KiB range".into(), label.clone(), t, "102-150 us"));
        if gpu {
            table.push(raw_launch(&mut b, d, &label)?);
        }
    }
    table.push(btree_floor(&mut b));
    traced_rows(&mut b, &rt, &mut table)?;
    println!("\n| operation | device | offload | libomptarget 22 (1 x H200, DESIGN.md) |\n|---|---|---|---|");
    for (what, dev, t, lib) in &table {
        row(what, dev, *t, lib);
    }
    Ok(())
}

/// What bounds `is_present` among 100 000 entries: the bare search it makes, a floor
/// lookup in the standard B-tree of 100 000 `begin -> end` pairs, random probes, no lock.
fn btree_floor(b: &mut Bench) -> (String, String, f64, &'static str) {
    // Inserted one by one in address order, as the table's entries are (half-full nodes).
    let mut ends = std::collections::BTreeMap::new();
    for i in 0..100_000usize {
        ends.insert(0x10_0000 + i * CHUNK, 0x10_0000 + (i + 1) * CHUNK);
    }
    let mut p = Probe(0x9e37_79b9_7f4a_7c15);
    let t = b.wall("btree_floor/100000", Budget::FAST, || {
        let at = 0x10_0000 + p.next_below(100_000) * CHUNK + 7;
        let hit = ends.range(..=black_box(at)).next_back().is_some_and(|(_, &end)| at < end);
        assert!(black_box(hit));
    });
    ("reference: std BTreeMap floor search, 100 000 keys, random probes".into(), "-".into(), t, "-")
}

/// A raw cudarc launch + synchronize of the same kernel on GPU `d` (CUDA ordinal `d`: the
/// runtime lists GPUs first, in the driver's order).
fn raw_launch(
    b: &mut Bench,
    d: usize,
    label: &str,
) -> Result<(String, String, f64, &'static str), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(d)?;
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(INC_SRC, Default::default())?;
    let f = ctx.load_module(ptx)?.load_function("inc")?;
    let s = ctx.default_stream();
    let mut x = s.alloc_zeros::<f32>(1024)?;
    let n = 1024u64;
    let t = b.wall(&format!("raw_cudarc_launch_sync/{d}"), Budget::FAST, || {
        let mut l = s.launch_builder(&f);
        l.arg(&mut x).arg(&n);
        // SAFETY: the arguments match the kernel's signature; `x` holds 1024 floats.
        unsafe { l.launch(LaunchConfig::for_num_elems(1024)) }.expect("launch");
        s.synchronize().expect("sync");
    });
    Ok(("raw cudarc launch + synchronize, same kernel".into(), label.to_string(), t, "-"))
}

/// The timeline's cost: the same constructs on each device with a trace written to a file
/// (`OFFLOAD_TRACE`), by a second runtime, beside the rows above of the first (no trace).
/// A shorter budget: every construct writes its events to the file.
fn traced_rows(
    b: &mut Bench,
    untraced: &Runtime,
    table: &mut Vec<(String, String, f64, &'static str)>,
) -> Result<(), Box<dyn std::error::Error>> {
    let budget = Budget { samples: 10, warm_up: std::time::Duration::from_millis(200), ..Budget::FAST };
    let path = std::env::temp_dir().join(format!("offload-mapping-bench-{}.json", std::process::id()));
    let rt = Runtime::builder().gpus(true).host_devices(1).trace_file(&path).build()?;
    let mut x = vec![1f32; 1024];
    let xp = x.as_mut_ptr();
    let (to, from) = ([MapItem::to(xp, 4096)], [MapItem::from(xp, 4096)]);
    for d in 0..rt.num_devices() {
        let label = format!("{d} ({})", rt.describe(d)?.name);
        for (name, traced) in [("off", untraced), ("to a file", &rt)] {
            let t =
                b.wall(&format!("enter_exit_new_4KiB_trace_{}/{d}", name.replace(' ', "_")), budget, || {
                    // SAFETY: `x` outlives the mappings, each ended in the same iteration.
                    unsafe {
                        traced.enter_data(d, black_box(&to)).expect("enter");
                        traced.exit_data(d, black_box(&from)).expect("exit");
                    }
                });
            table.push((
                format!("enter(to) + exit(from) of a new 4 KiB range, OFFLOAD_TRACE {name}"),
                label.clone(),
                t,
                "-",
            ));
        }
    }
    rt.flush_trace()?;
    drop(rt);
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("trace file: {:.1} MiB", bytes as f64 / (1 << 20) as f64);
    let _ = std::fs::remove_file(&path);
    let _ = &mut x;
    Ok(())
}
