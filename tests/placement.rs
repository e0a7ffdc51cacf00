//! Placement on recorded and authored topologies: each GPU's worker CPUs and staging node
//! come from the NUMA node its PCI bus id sits on. Fixtures are hwloc v2 XML (the hwloc
//! project's test topologies, BSD-3-Clause, see fixtures/HWLOC-COPYING; and
//! fixtures/8gpu-2socket.xml, authored by fixtures/make_8gpu_2socket.py).

use offload::{BackendKind, PlacementSource, Runtime, Topology};

const EIGHT_GPU: &str = include_str!("fixtures/8gpu-2socket.xml");
const POWER8: &str = include_str!("fixtures/power8gpudistances.xml");
const XEON_K40: &str = include_str!("fixtures/32em64t-2n8c2t-pci-normalio.xml");

fn topo(xml: &str, name: &str) -> Topology {
    Topology::from_xml(xml, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn eight_gpus_on_two_sockets_go_to_their_own_node() {
    let t = topo(EIGHT_GPU, "8gpu-2socket");
    assert!(!t.is_this_system());
    assert_eq!(t.numa_nodes(), &[0, 1]);
    let gpus = [
        "0000:07:00.0",
        "0000:0f:00.0",
        "0000:47:00.0",
        "0000:4e:00.0",
        "0000:87:00.0",
        "0000:90:00.0",
        "0000:b7:00.0",
        "0000:bd:00.0",
    ];
    for (i, bus) in gpus.iter().enumerate() {
        let p = t.place_pci(bus);
        let node = i / 4;
        assert_eq!(p.source, PlacementSource::Hwloc, "GPU {i}: {p}");
        assert_eq!(p.numa_nodes, vec![node], "GPU {i} ({bus}): {p}");
        assert_eq!(p.cpus, (16 * node..16 * node + 16).collect::<Vec<_>>(), "GPU {i}: {p}");
        // nvidia-smi's 8-hex-digit domain form finds the same device.
        assert_eq!(t.place_pci(&format!("0000{bus}")).numa_nodes, vec![node]);
    }
}

#[test]
fn power8_gpus_sit_two_per_socket() {
    let t = topo(POWER8, "power8");
    for (bus, node) in [("0002:01:00.0", 0), ("0003:01:00.0", 0), ("000a:01:00.0", 1), ("000b:01:00.0", 1)] {
        let p = t.place_pci(bus);
        assert_eq!(p.numa_nodes, vec![node], "{bus}: {p}");
        assert!(p.is_known() && !p.cpus.is_empty());
    }
}

#[test]
fn xeon_k40_is_on_node_one() {
    let t = topo(XEON_K40, "32em64t");
    let p = t.place_pci("0000:84:00.0");
    assert_eq!(p.numa_nodes, vec![1], "{p}");
    let p = t.place_pci("0000:03:00.0");
    assert_eq!(p.numa_nodes, vec![0], "{p}");
}

#[test]
fn an_unknown_device_gets_the_whole_machine_and_says_so() {
    let t = topo(EIGHT_GPU, "8gpu-2socket");
    let p = t.place_pci("0000:aa:00.0");
    assert!(!p.is_known());
    assert_eq!(p.numa_nodes, vec![0, 1]);
    assert_eq!(p.cpus.len(), 32);
    assert!(p.to_string().contains("unknown") && p.to_string().contains("whole machine"), "{p}");
}

#[test]
fn a_runtime_on_an_xml_topology_places_host_devices_on_the_whole_machine() {
    let dir = std::env::temp_dir().join(format!("offload-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("8gpu.xml");
    std::fs::write(&path, EIGHT_GPU).unwrap();
    let rt =
        Runtime::builder().env(|_| None).gpus(false).host_devices(2).topology_xml(&path).build().unwrap();
    assert!(rt.device_report().contains("8gpu.xml (hwloc XML)"), "{}", rt.device_report());
    for d in 0..2 {
        let p = rt.placement(d).unwrap();
        assert_eq!(p.cpus.len(), 32, "{p}");
        // Binding to a foreign topology does nothing, and that is what the runtime reports.
        assert_eq!(rt.worker_binding(d).unwrap(), Ok(vec![]));
    }
    let e = Runtime::builder()
        .env(|_| None)
        .gpus(false)
        .topology_xml(dir.join("missing.xml"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("missing.xml"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn workers_are_bound_on_this_machine_and_staging_lands_on_the_device_node() {
    let rt = Runtime::builder().env(|_| None).host_devices(1).build().unwrap();
    let gpus = (0..rt.num_devices()).filter(|&d| rt.describe(d).unwrap().kind != BackendKind::Host).count();
    if gpus == 0 {
        offload_tests::skip_for_devices(
            "gpu",
            0,
            "staging location: no GPU here, and host devices do not stage",
        );
    }
    for d in 0..rt.num_devices() {
        let binding = rt.worker_binding(d).unwrap();
        let want = &rt.placement(d).unwrap().cpus;
        match binding {
            Ok(b) if !b.is_empty() => {
                assert!(b.iter().all(|c| want.contains(c)), "device {d}: bound {b:?}, placed {want:?}")
            }
            other => println!("device {d}: worker binding not applied here: {other:?}"),
        }
        let nodes = rt.topology().numa_nodes().len();
        match rt.staging_report(d).unwrap() {
            None => println!("SKIP staging location on device {d}: this device does not stage (host device)"),
            Some(report) if nodes < 2 => {
                println!("SKIP staging location on device {d}: one NUMA node on this machine ({report})")
            }
            Some(report) => {
                let p = rt.placement(d).unwrap();
                let loc = rt.staging_location(d).unwrap();
                if p.is_known() {
                    assert_eq!(loc, p.numa_nodes[..1].to_vec(), "{report}");
                } else {
                    println!("device {d}: placement unknown, staging on {loc:?} ({report})");
                }
            }
        }
    }
}

/// A recorded topology's GPUs are listed with their bus ids and placement even though no
/// backend can use them (what `info` shows on a machine without a usable GPU).
#[test]
fn a_topology_lists_its_gpus_and_numa_distances() {
    for (xml, name) in [(EIGHT_GPU, "8gpu-2socket"), (POWER8, "power8"), (XEON_K40, "xeon-k40")] {
        let t = Topology::from_xml(xml, name).expect("topology");
        let gpus = t.gpus();
        for g in &gpus {
            println!("{name}: {} {} {:#06x} -> {}", g.bus_id, g.vendor, g.device_id, g.placement);
        }
        assert!(!gpus.is_empty(), "{name}: no GPU found");
        assert!(
            gpus.iter().all(|g| g.bus_id.len() == 12 && g.bus_id.as_bytes()[4] == b':'),
            "{name}: {gpus:?}"
        );
        if let Some(d) = t.numa_distances() {
            println!("{name}: numa distances {:?} {:?}", d.nodes, d.matrix);
            assert_eq!(d.matrix.len(), d.nodes.len() * d.nodes.len());
        }
    }
    let eight = Topology::from_xml(EIGHT_GPU, "8gpu-2socket").expect("topology").gpus();
    assert_eq!(eight.len(), 8);
    assert!(eight.iter().all(|g| g.vendor == "NVIDIA" && g.placement.is_known()), "{eight:?}");
}

/// Ranks of an MPI job on the recorded 8-GPU machine share its GPUs by bus id: one each
/// with 8 ranks (ranks 0-3 on socket 0's GPUs, 4-7 on socket 1's), two each with 4, two
/// ranks per GPU with 16; and a rank whose `CUDA_VISIBLE_DEVICES` gives it one GPU, or
/// lists them in another order, still takes its own and is placed on that GPU's node.
#[test]
fn ranks_take_gpus_by_bus_id_and_land_on_their_sockets() {
    use offload::cluster::placement::rank_devices;
    let t = topo(EIGHT_GPU, "8gpu-2socket");
    let all: Vec<String> = t.gpus().into_iter().map(|g| g.bus_id).collect();
    assert_eq!(all.len(), 8);
    let node_of = |bus: &str| t.place_pci(bus).numa_nodes;
    // Eight ranks, each sees all eight (nvidia-smi's 8-digit domain form for some).
    let view: Vec<String> = all.iter().map(|b| format!("0000{b}")).collect();
    let node = vec![view.clone(); 8];
    for r in 0..8 {
        let took = rank_devices(&node, r).unwrap();
        assert_eq!(took, [r]);
        assert_eq!(node_of(&all[took[0]]), vec![r / 4], "rank {r}");
    }
    // Four ranks: two GPUs each, both on the rank's socket.
    let node = vec![all.clone(); 4];
    for r in 0..4 {
        let took = rank_devices(&node, r).unwrap();
        assert_eq!(took, [2 * r, 2 * r + 1]);
        assert!(took.iter().all(|&g| node_of(&all[g]) == vec![r / 2]));
    }
    // Sixteen ranks: two per GPU.
    let node = vec![all.clone(); 16];
    let took: Vec<usize> = (0..16).map(|r| rank_devices(&node, r).unwrap()[0]).collect();
    assert_eq!(took, (0..16).map(|r| r / 2).collect::<Vec<_>>());
    // A launcher's per-rank CUDA_VISIBLE_DEVICES: rank r sees only GPU 7 - r, as its device 0.
    let node: Vec<Vec<String>> = (0..8).map(|r| vec![all[7 - r].clone()]).collect();
    for r in 0..8 {
        assert_eq!(rank_devices(&node, r).unwrap(), [0]);
        assert_eq!(node_of(&node[r][0]), vec![(7 - r) / 4]);
    }
    // Every rank sees all eight, but rank 3 through CUDA_DEVICE_ORDER=FASTEST_FIRST-like
    // numbering (reversed): it takes the fourth GPU by bus id, which is its device 4.
    let mut reversed = all.clone();
    reversed.reverse();
    let mut node = vec![all.clone(); 8];
    node[3] = reversed.clone();
    let took = rank_devices(&node, 3).unwrap();
    assert_eq!(took, [4]);
    assert_eq!(reversed[4], all[3]);
    assert_eq!(node_of(&reversed[4]), vec![0]);
}
