//! CUDA paths side by side, one run: pool allocation vs raw `cuMemAlloc`/`cuMemFree`,
//! GPU0->GPU1 peer copies, host<->device copies from runtime-owned pinned memory, and a
//! kernel launch through the target API vs a raw cudarc launch of the same kernel.
//!
//! `cargo bench -p offload-benches --bench cuda_paths` (prints a table; needs a GPU, says
//! so and exits 0 without one).

use cudarc::driver::{result, sys, CudaContext, LaunchConfig, PushKernelArg};
use offload::{map, HostBuffer, Kernel, MapType};
use offload_benches::{Bench, Budget};

const GIB: usize = 1 << 30;

const TRIAD_SRC: &str = r#"extern "C" __global__ void triad(float* a, const float* b, const float* c, float s,
                                 unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) a[i] = b[i] + s * c[i];
}"#;

/// `a = b + s * c`: three mapped arguments and a scalar.
static TRIAD: Kernel = Kernel::new("triad").with_cuda(TRIAD_SRC);

fn row(what: &str, ours: String, reference: String, note: &str) {
    println!("| {what:<46} | {ours:>14} | {reference:>14} | {note} |");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(rt) = offload_benches::gpu_bench("cuda_paths")? else { return Ok(()) };
    let mut bench = Bench::new("cuda_paths");
    println!("\n| path | offload | raw cudarc | note |\n|---|---|---|---|");

    // 1. Allocation of a reused size.
    let bytes = 4 << 20;
    let ours = bench.wall("alloc_free_4MiB/offload", Budget::FAST, || {
        let p = rt.target_alloc(bytes, 0).expect("alloc");
        // SAFETY: just allocated, unused.
        unsafe { rt.target_free(p, 0) }.expect("free");
    });
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let raw = bench.wall("alloc_free_4MiB/raw", Budget::FAST, || {
        // SAFETY: a plain allocation freed at once.
        unsafe {
            let p = result::malloc_sync(bytes).expect("cuMemAlloc");
            result::free_sync(p).expect("cuMemFree");
        }
    });
    row(
        "alloc+free 4 MiB (median)",
        format!("{:.2} us", ours * 1e6),
        format!("{:.2} us", raw * 1e6),
        "pool vs cuMemAlloc/cuMemFree",
    );
    // A size above the exact classes: 129 MiB takes (and reuses) a 144 MiB block.
    let big = 129 << 20;
    let cached = rt.pool_usage(0)?.cached_bytes;
    let ours = bench.wall("alloc_free_129MiB/offload", Budget::FAST, || {
        let p = rt.target_alloc(big, 0).expect("alloc");
        // SAFETY: just allocated, unused.
        unsafe { rt.target_free(p, 0) }.expect("free");
    });
    let block = rt.pool_usage(0)?.cached_bytes - cached;
    let raw = bench.wall("alloc_free_129MiB/raw", Budget::SLOW, || {
        // SAFETY: a plain allocation freed at once.
        unsafe {
            let p = result::malloc_sync(big).expect("cuMemAlloc");
            result::free_sync(p).expect("cuMemFree");
        }
    });
    row(
        "alloc+free 129 MiB (median)",
        format!("{:.2} us", ours * 1e6),
        format!("{:.2} us", raw * 1e6),
        &format!("pool block {} MiB", block >> 20),
    );

    // 2. Peer copy GPU0 -> GPU1.
    if rt.num_devices() >= 2 {
        let (src, dst) = (rt.target_alloc(GIB, 0)?, rt.target_alloc(GIB, 1)?);
        let ours = bench.wall("peer_1GiB/offload", Budget::SLOW, || {
            // SAFETY: both are 1 GiB allocations of their devices.
            unsafe { rt.target_memcpy(dst, src, GIB, 0, 0, 1, 0) }.expect("peer copy")
        });
        let (c0, c1) = (CudaContext::new(0)?, CudaContext::new(1)?);
        let s1 = c1.new_stream()?;
        let raw = bench.wall("peer_1GiB/raw", Budget::SLOW, || {
            // SAFETY: as above.
            unsafe { result::memcpy_peer_async(c1.cu_ctx(), dst, c0.cu_ctx(), src, GIB, s1.cu_stream()) }
                .expect("cuMemcpyPeerAsync");
            s1.synchronize().expect("sync");
        });
        row(
            "1 GiB GPU0->GPU1 copy",
            format!("{:.1} GB/s", GIB as f64 / ours / 1e9),
            format!("{:.1} GB/s", GIB as f64 / raw / 1e9),
            "target_memcpy (peer) vs cuMemcpyPeerAsync",
        );
        // SAFETY: no longer used.
        unsafe {
            rt.target_free(src, 0)?;
            rt.target_free(dst, 1)?;
        }
    } else {
        println!("| 1 GiB GPU0->GPU1 copy | skipped: one GPU | | |");
    }

    // 3. Host <-> device from runtime-owned pinned memory, and from pageable memory.
    let mut buf = HostBuffer::<u8>::new(&rt, GIB)?;
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    buf.enter(0, MapType::ALLOC)?;
    let h2d = bench.wall("pinned_h2d_1GiB/offload", Budget::SLOW, || buf.update_to(0).expect("update to"));
    let d2h =
        bench.wall("pinned_d2h_1GiB/offload", Budget::SLOW, || buf.update_from(0).expect("update from"));
    let stream = ctx.new_stream()?;
    // SAFETY: page-locked, not write-combined, sized 1 GiB.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(GIB, sys::CU_MEMHOSTALLOC_PORTABLE) }?;
    // SAFETY: a 1 GiB device buffer for the reference copies.
    let dev = unsafe { result::malloc_sync(GIB) }?;
    let raw_h2d = bench.wall("pinned_h2d_1GiB/raw", Budget::SLOW, || {
        // SAFETY: both buffers are 1 GiB; the stream is synchronised before reuse.
        unsafe { result::memcpy_htod_async(dev, pinned.as_slice().expect("pinned"), stream.cu_stream()) }
            .expect("htod");
        stream.synchronize().expect("sync");
    });
    let raw_d2h = bench.wall("pinned_d2h_1GiB/raw", Budget::SLOW, || {
        // SAFETY: as above.
        unsafe { result::memcpy_dtoh_async(pinned.as_mut_slice().expect("pinned"), dev, stream.cu_stream()) }
            .expect("dtoh");
        stream.synchronize().expect("sync");
    });
    let gbs = |t: f64| format!("{:.1} GB/s", GIB as f64 / t / 1e9);
    row(
        "1 GiB host->device, pinned (HostBuffer)",
        gbs(h2d),
        gbs(raw_h2d),
        &format!("pinned: {}", buf.is_pinned()),
    );
    row(
        "1 GiB device->host, pinned (HostBuffer)",
        gbs(d2h),
        gbs(raw_d2h),
        "update from vs cuMemcpyDtoHAsync",
    );
    buf.exit(0, MapType::DELETE)?;
    let mut pageable = vec![1u8; GIB];
    let dev2 = rt.device(0)?;
    let page_h2d = bench.wall("pageable_map_to_1GiB", Budget::SLOW, || {
        dev2.data(map::to(&pageable), |_| Ok(())).expect("map to")
    });
    let page_d2h = bench.wall("pageable_map_from_1GiB", Budget::SLOW, || {
        dev2.data(map::from(&mut pageable), |_| Ok(())).expect("map from")
    });
    row("1 GiB map(to) from a pageable Vec", gbs(page_h2d), "-".into(), "includes alloc (pooled) + copy");
    row(
        "1 GiB map(from) into a pageable Vec",
        gbs(page_d2h),
        "-".into(),
        "driver's pageable path (no staging yet)",
    );
    // SAFETY: no longer used.
    unsafe { result::free_sync(dev) }?;

    // 4. Kernel launch with 3 mapped arguments vs raw cudarc.
    let n = 1024;
    let (mut a, b, c) = (vec![0f32; n], vec![1f32; n], vec![2f32; n]);
    let gpu = rt.device(0)?;
    let ours = gpu.data((map::tofrom(&mut a), map::to(&b), map::to(&c)), |(a, b, c)| {
        Ok(bench.wall("launch_3_args/offload", Budget::FAST, || {
            gpu.launch(&TRIAD, n, (a, b, c, 3.0f32)).expect("launch")
        }))
    })?;
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(TRIAD_SRC, Default::default())?;
    let f = ctx.load_module(ptx)?.load_function("triad")?;
    let s = ctx.new_stream()?;
    let (mut da, db, dc) = (s.alloc_zeros::<f32>(n)?, s.clone_htod(&b)?, s.clone_htod(&c)?);
    let (scale, len) = (3.0f32, n as u64);
    let raw = bench.wall("launch_3_args/raw", Budget::FAST, || {
        let mut l = s.launch_builder(&f);
        l.arg(&mut da).arg(&db).arg(&dc).arg(&scale).arg(&len);
        // SAFETY: arguments match the kernel's signature.
        unsafe { l.launch(LaunchConfig::for_num_elems(n as u32)) }.expect("launch");
        s.synchronize().expect("sync");
    });
    row(
        "launch + sync, 3 mapped args, n=1024 (median)",
        format!("{:.2} us", ours * 1e6),
        format!("{:.2} us", raw * 1e6),
        &format!("extra {:.2} us", (ours - raw) * 1e6),
    );
    if a.iter().any(|&v| v != 7.0) {
        return Err("triad result wrong".into());
    }
    Ok(())
}
