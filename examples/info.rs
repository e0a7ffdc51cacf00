//! What the runtime sees: devices, PCI bus ids, UUIDs, memory, NUMA placement, worker
//! bindings as read back, staging set-up, the peer-access matrix and the settings in force, in the manner of `nvidia-smi topo -m` and
//! `omp_display_env`.
//!
//! `cargo run --release -p offload-examples --example info`
//!
//! Built with `--features mpi` and started by `mpirun -np N`, each rank takes its GPUs
//! (`offload::cluster::Cluster::runtime`) and rank 0 prints one placement line per rank.

use offload::Runtime;

fn main() -> Result<(), offload::Error> {
    #[cfg(feature = "mpi")]
    if offload_examples::ranks::run_across_ranks(ranks)? {
        return Ok(());
    }
    let rt = Runtime::new()?;
    print!("{}", report(&rt)?);
    Ok(())
}

/// Under `mpirun`: each rank takes its GPUs (or host devices), and rank 0 prints one
/// placement line per rank, then its own report.
#[cfg(feature = "mpi")]
fn ranks(cluster: &offload::cluster::Cluster) -> Result<(), offload::Error> {
    let ranked = cluster.runtime(Runtime::builder())?;
    if let Some(lines) = cluster.gather_to_root(&ranked.placement)? {
        println!("{} ({} ranks; CUDA-aware: {})", cluster.library(), cluster.size(), cluster.cuda_aware());
        lines.iter().for_each(|l| println!("{l}"));
        print!("{}", report(&ranked.runtime)?);
    }
    Ok(())
}

/// Appends a line to the report.
macro_rules! say {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($t)*);
    }};
}

/// Everything the example prints.
fn report(rt: &Runtime) -> Result<String, offload::Error> {
    let mut out = String::new();
    say!(out, "OMP_TARGET_OFFLOAD = {}", rt.policy());
    say!(
        out,
        "devices = {}, initial device = {}, default device = {}",
        rt.num_devices(),
        rt.initial_device(),
        rt.default_device()
    );
    out.push_str(rt.device_report());
    say!(
        out,
        "\n{:>3}  {:<6} {:<24} {:<14} {:<42} {:>12}",
        "dev",
        "kind",
        "name",
        "pci bus id",
        "uuid",
        "memory"
    );
    for d in 0..rt.num_devices() {
        let desc = rt.describe(d)?;
        let mem = rt.mem_info(d)?;
        say!(
            out,
            "{d:>3}  {:<6} {:<24} {:<14} {:<42} {:>9} MiB",
            desc.kind.name(),
            desc.name,
            desc.pci_bus_id.as_deref().unwrap_or("-"),
            desc.uuid.as_deref().unwrap_or("-"),
            mem.total >> 20
        );
    }
    say!(out, "\nplacement ({})", rt.topology().description());
    for d in 0..rt.num_devices() {
        let binding = match rt.worker_binding(d)? {
            Ok(b) if b.is_empty() => "not applied (topology is not this machine's)".to_string(),
            Ok(b) => format!("cpus {}", offload::topology::ranges(&b)),
            Err(e) => format!("failed: {e}"),
        };
        say!(out, "  device {d}: {}", rt.placement(d)?);
        say!(out, "           worker bound to {binding} (read back)");
        if let Some(s) = rt.staging_report(d)? {
            say!(out, "           {s}");
            if let Ok(nodes) = rt.staging_location(d) {
                say!(out, "           staging pages on NUMA node(s) {}", offload::topology::ranges(&nodes));
            }
        }
    }
    if rt.num_devices() > 1 {
        say!(out, "\npeer access (row copies from column directly: P, through the host: -)");
        out.push_str("      ");
        (0..rt.num_devices()).for_each(|s| out.push_str(&format!("{s:>4}")));
        say!(out);
        for dst in 0..rt.num_devices() {
            out.push_str(&format!("  {dst:>3} "));
            for src in 0..rt.num_devices() {
                let c = if dst == src {
                    "X"
                } else if rt.can_access_peer(dst, src)? {
                    "P"
                } else {
                    "-"
                };
                out.push_str(&format!("{c:>4}"));
            }
            say!(out);
        }
    }
    // The GPUs the topology holds, used or not, like `nvidia-smi topo -m`: on a machine
    // whose GPUs no backend can drive (or a recorded topology), this says what is there.
    let gpus = rt.topology().gpus();
    say!(out, "\nGPUs in the topology ({}): {}", rt.topology().description(), gpus.len());
    if !gpus.is_empty() {
        say!(
            out,
            "  {:<14} {:<8} {:<8} {:<10} {:<24} in use",
            "pci bus id",
            "vendor",
            "device",
            "numa",
            "cpus"
        );
    }
    for g in &gpus {
        let used = (0..rt.num_devices()).find(|&d| {
            rt.describe(d)
                .is_ok_and(|x| x.pci_bus_id.as_deref().is_some_and(|b| b.eq_ignore_ascii_case(&g.bus_id)))
        });
        say!(
            out,
            "  {:<14} {:<8} {:<8} {:<10} {:<24} {}",
            g.bus_id,
            g.vendor,
            format!("{:#06x}", g.device_id),
            offload::topology::ranges(&g.placement.numa_nodes),
            offload::topology::ranges(&g.placement.cpus),
            used.map_or("no".to_string(), |d| format!("device {d}"))
        );
    }
    if let Some(d) = rt.topology().numa_distances() {
        say!(out, "\nNUMA distances (10: local)");
        out.push_str("      ");
        d.nodes.iter().for_each(|n| out.push_str(&format!("{n:>5}")));
        say!(out);
        for (i, n) in d.nodes.iter().enumerate() {
            out.push_str(&format!("  {n:>3} "));
            d.matrix[i * d.nodes.len()..(i + 1) * d.nodes.len()]
                .iter()
                .for_each(|v| out.push_str(&format!("{v:>5}")));
            say!(out);
        }
    }
    if gpus.iter().any(|g| g.vendor == "NVIDIA" || g.vendor == "AMD")
        && !(0..rt.num_devices()).any(|d| rt.describe(d).is_ok_and(|x| x.pci_bus_id.is_some()))
    {
        let why: Vec<&str> =
            rt.device_report().lines().filter(|l| l.starts_with("cuda") || l.starts_with("hip")).collect();
        say!(
            out,
            "\nno GPU of the topology runs here: {}",
            if why.is_empty() {
                "no GPU backend found one (see the device report above)".to_string()
            } else {
                why.join("; ")
            }
        );
        if !rt.topology().is_this_system() {
            say!(out, "(the topology is a recorded one, not this machine's: its GPUs are not here)");
        }
    }
    match offload::collective::NcclComm::available() {
        Ok(version) => say!(out, "\nNCCL: {version} (OFFLOAD_HALO=nccl moves grid halos with it)"),
        Err(why) => say!(out, "\nNCCL: not available: {why}"),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// On a recorded eight-GPU topology with no GPU to run, the report lists every GPU with
    /// its bus id, NUMA node and CPUs, the NUMA distances, and why none runs.
    #[test]
    fn a_recorded_topology_without_devices_is_explained() {
        // Embedded, so that the test binary runs from any folder (the GPU machine's bundle).
        let xml = std::env::temp_dir().join(format!("offload-info-test-{}.xml", std::process::id()));
        std::fs::write(&xml, include_str!("../tests/fixtures/8gpu-2socket.xml")).expect("a temporary file");
        let rt =
            offload::Runtime::builder().env(|_| None).gpus(false).host_devices(0).topology_xml(&xml).build();
        let _ = std::fs::remove_file(&xml);
        let out = super::report(&rt.expect("runtime")).expect("report");
        println!("{out}");
        assert!(out.contains("GPUs in the topology") && out.contains(": 8"), "{out}");
        for (bus, numa) in [("0000:07:00.0", "0"), ("0000:bd:00.0", "1")] {
            let line =
                out.lines().find(|l| l.contains(bus)).unwrap_or_else(|| panic!("{bus} missing: {out}"));
            assert!(
                line.contains("NVIDIA")
                    && line.split_whitespace().nth(3) == Some(numa)
                    && line.ends_with("no"),
                "{line}"
            );
        }
        assert!(out.contains("no GPU of the topology runs here"), "{out}");
    }
}
