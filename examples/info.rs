//! What the runtime sees: devices, PCI bus ids, UUIDs, memory, NUMA placement, worker
//! bindings as read back, staging set-up, the peer-access matrix and the settings in force, in the manner of `nvidia-smi topo -m` and
//! `omp_display_env`.
//!
//! `cargo run --release -p offload-examples --example info`

use offload::Runtime;

fn main() -> Result<(), offload::Error> {
    let rt = Runtime::new()?;
    println!("OMP_TARGET_OFFLOAD = {}", rt.policy());
    println!(
        "devices = {}, initial device = {}, default device = {}",
        rt.num_devices(),
        rt.initial_device(),
        rt.default_device()
    );
    print!("{}", rt.device_report());
    println!(
        "\n{:>3}  {:<6} {:<24} {:<14} {:<42} {:>12}",
        "dev", "kind", "name", "pci bus id", "uuid", "memory"
    );
    for d in 0..rt.num_devices() {
        let desc = rt.describe(d)?;
        let mem = rt.mem_info(d)?;
        println!(
            "{d:>3}  {:<6} {:<24} {:<14} {:<42} {:>9} MiB",
            desc.kind.name(),
            desc.name,
            desc.pci_bus_id.as_deref().unwrap_or("-"),
            desc.uuid.as_deref().unwrap_or("-"),
            mem.total >> 20
        );
    }
    println!("\nplacement ({})", rt.topology().description());
    for d in 0..rt.num_devices() {
        let binding = match rt.worker_binding(d)? {
            Ok(b) if b.is_empty() => "not applied (topology is not this machine's)".to_string(),
            Ok(b) => format!("cpus {}", offload::topology::ranges(&b)),
            Err(e) => format!("failed: {e}"),
        };
        println!("  device {d}: {}", rt.placement(d)?);
        println!("           worker bound to {binding} (read back)");
        if let Some(s) = rt.staging_report(d)? {
            println!("           {s}");
            if let Ok(nodes) = rt.staging_location(d) {
                println!("           staging pages on NUMA node(s) {}", offload::topology::ranges(&nodes));
            }
        }
    }
    if rt.num_devices() > 1 {
        println!("\npeer access (row copies from column directly: P, through the host: -)");
        print!("      ");
        (0..rt.num_devices()).for_each(|s| print!("{s:>4}"));
        println!();
        for dst in 0..rt.num_devices() {
            print!("  {dst:>3} ");
            for src in 0..rt.num_devices() {
                let c = if dst == src {
                    "X"
                } else if rt.can_access_peer(dst, src)? {
                    "P"
                } else {
                    "-"
                };
                print!("{c:>4}");
            }
            println!();
        }
    }
    Ok(())
}
