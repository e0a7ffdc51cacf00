//! Where each device sits: its PCI bus id -> the nearest CPUs and NUMA nodes.
//!
//! Through hwloc (cargo feature `hwloc`, on by default): the GPU's PCI object, its first
//! non-I/O ancestor, and that ancestor's cpuset and nodeset. Without hwloc, or when hwloc
//! has no I/O information, `/sys/bus/pci/devices/<bus id>/numa_node` and `local_cpulist`.
//! A `numa_node` of -1 (firmware that hides it, as on the lent GPU machines) means unknown:
//! the device is given the whole machine, and the report says so. Devices are matched by
//! the bus id the driver reports, so `CUDA_VISIBLE_DEVICES` remapping cannot mislead it.
//!
//! A topology can be loaded from an hwloc XML file (`OFFLOAD_TOPOLOGY_XML`, or
//! [`crate::RuntimeBuilder::topology_xml`]) to test placement for machines we do not have;
//! binding then does nothing (hwloc's rule for foreign topologies), which the report shows.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// How a placement was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementSource {
    /// hwloc matched the device's PCI bus id.
    Hwloc,
    /// The kernel's sysfs entry for the PCI device.
    Sysfs,
    /// Nothing says where the device is: the whole machine, with the reason.
    Unknown(String),
}

/// A GPU a topology holds (an NVIDIA or AMD PCI display, 3D or other display controller),
/// whether or not any backend can use it: what `info` lists on a machine, or a recorded
/// topology, without a usable device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyGpu {
    /// PCI bus id, `dddd:bb:dd.f`.
    pub bus_id: String,
    /// `NVIDIA` or `AMD`.
    pub vendor: String,
    /// PCI device id.
    pub device_id: u16,
    /// The CPUs and NUMA nodes nearest to it.
    pub placement: Placement,
}

/// NUMA distances as the topology gives them: node OS indices and the row-major matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaDistances {
    /// The nodes, in matrix order.
    pub nodes: Vec<usize>,
    /// `nodes.len()` rows of `nodes.len()` relative distances (10: local).
    pub matrix: Vec<u64>,
}

/// The CPUs and NUMA nodes nearest to a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// OS indices of the CPUs (processing units).
    pub cpus: Vec<usize>,
    /// OS indices of the NUMA nodes.
    pub numa_nodes: Vec<usize>,
    /// How it was found.
    pub source: PlacementSource,
}

impl Placement {
    /// Whether the device's own NUMA node is known (not the whole-machine fallback).
    pub fn is_known(&self) -> bool {
        !matches!(self.source, PlacementSource::Unknown(_))
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpus {} numa {}", ranges(&self.cpus), ranges(&self.numa_nodes))?;
        match &self.source {
            PlacementSource::Hwloc => f.write_str(" (hwloc)"),
            PlacementSource::Sysfs => f.write_str(" (sysfs)"),
            PlacementSource::Unknown(why) => write!(f, " (unknown: {why}; using the whole machine)"),
        }
    }
}

/// `0-3,8,10-11` for a sorted list of indices.
pub fn ranges(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

/// Parses a kernel cpu list such as `0-15,32-47`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse::<usize>().ok()?),
            None => v.push(part.trim().parse().ok()?),
        }
    }
    v.sort_unstable();
    v.dedup();
    Some(v)
}

/// The machine's topology, or one loaded from an hwloc XML file.
pub struct Topology {
    #[cfg(feature = "hwloc")]
    hw: Option<hwlocality::Topology>,
    this_system: bool,
    description: String,
    all_cpus: Vec<usize>,
    all_nodes: Vec<usize>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology").field("description", &self.description).finish_non_exhaustive()
    }
}

fn online_cpus() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .unwrap_or_else(|| (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect())
}

fn online_nodes() -> Vec<usize> {
    std::fs::read_to_string("/sys/devices/system/node/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .unwrap_or_else(|| vec![0])
}

impl Topology {
    /// This machine's topology (hwloc with I/O devices kept; sysfs when hwloc fails),
    /// discovered once a process and shared: hwloc's discovery reads thousands of files
    /// (every CPU's caches, every PCI device), which a program making many runtimes (a
    /// test suite) would otherwise pay for each one.
    pub fn system() -> Arc<Self> {
        static SYSTEM: OnceLock<Arc<Topology>> = OnceLock::new();
        Arc::clone(SYSTEM.get_or_init(|| Arc::new(Self::discover())))
    }

    /// This machine's topology, discovered now.
    fn discover() -> Self {
        #[cfg(feature = "hwloc")]
        {
            use hwlocality::topology::builder::TypeFilter;
            let built = hwlocality::Topology::builder()
                .with_io_type_filter(TypeFilter::KeepAll)
                .map_err(|e| e.to_string())
                .and_then(|b| b.build().map_err(|e| e.to_string()));
            match built {
                Ok(t) => return Self::from_hwloc(t, "this machine (hwloc)".into()),
                Err(e) => {
                    let mut s = Self::sysfs();
                    s.description = format!("this machine (sysfs; hwloc failed: {e})");
                    return s;
                }
            }
        }
        #[allow(unreachable_code)]
        Self::sysfs()
    }

    fn sysfs() -> Self {
        Self {
            #[cfg(feature = "hwloc")]
            hw: None,
            this_system: true,
            description: "this machine (sysfs)".into(),
            all_cpus: online_cpus(),
            all_nodes: online_nodes(),
        }
    }

    /// A topology from an hwloc (v2) XML file, for placement on machines we do not have.
    pub fn from_xml_file(path: &Path) -> Result<Self> {
        // Read here: hwlocality panics on a missing file.
        let xml = std::fs::read_to_string(path).map_err(|e| Error::InvalidSetting {
            var: "OFFLOAD_TOPOLOGY_XML",
            value: path.display().to_string(),
            expected: Box::leak(format!("a readable hwloc v2 XML file ({e})").into_boxed_str()),
        })?;
        Self::from_xml(&xml, &path.display().to_string())
    }

    /// A topology from hwloc (v2) XML text, named `name` in reports.
    pub fn from_xml(xml: &str, name: &str) -> Result<Self> {
        let bad = |what: String| Error::InvalidSetting {
            var: "topology XML",
            value: name.to_string(),
            expected: Box::leak(what.into_boxed_str()),
        };
        #[cfg(feature = "hwloc")]
        {
            use hwlocality::topology::builder::TypeFilter;
            let t = hwlocality::Topology::builder()
                .from_xml(xml)
                .map_err(|e| bad(format!("hwloc v2 XML ({e})")))?
                .with_io_type_filter(TypeFilter::KeepAll)
                .map_err(|e| bad(format!("an XML topology hwloc accepts ({e})")))?
                .build()
                .map_err(|e| bad(format!("an XML topology hwloc can build ({e})")))?;
            Ok(Self::from_hwloc(t, format!("{name} (hwloc XML)")))
        }
        #[cfg(not(feature = "hwloc"))]
        {
            let _ = xml;
            Err(bad("a build with the `hwloc` feature to read XML topologies".into()))
        }
    }

    #[cfg(feature = "hwloc")]
    fn from_hwloc(t: hwlocality::Topology, description: String) -> Self {
        let all_cpus = t.cpuset().iter_set().map(usize::from).collect();
        let all_nodes = t.nodeset().iter_set().map(usize::from).collect();
        Self { this_system: t.is_this_system(), hw: Some(t), description, all_cpus, all_nodes }
    }

    /// What the topology describes and where it came from.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Whether it is this machine (binding works) rather than a loaded file.
    pub fn is_this_system(&self) -> bool {
        self.this_system
    }

    /// Every CPU and node: where a device of unknown placement (or a host device) goes.
    pub fn whole_machine(&self, why: &str) -> Placement {
        Placement {
            cpus: self.all_cpus.clone(),
            numa_nodes: self.all_nodes.clone(),
            source: PlacementSource::Unknown(why.into()),
        }
    }

    /// NUMA nodes of the machine.
    pub fn numa_nodes(&self) -> &[usize] {
        &self.all_nodes
    }

    /// The placement of the PCI device `bus_id` (`dddd:bb:dd.f`, any case).
    pub fn place_pci(&self, bus_id: &str) -> Placement {
        #[cfg(feature = "hwloc")]
        if let Some(p) = self.place_pci_hwloc(bus_id) {
            return p;
        }
        if self.this_system {
            if let Some(p) = place_pci_sysfs(bus_id) {
                return p;
            }
        }
        self.whole_machine(&format!("PCI device {bus_id} reports no NUMA node"))
    }

    #[cfg(feature = "hwloc")]
    fn place_pci_hwloc(&self, bus_id: &str) -> Option<Placement> {
        let t = self.hw.as_ref()?;
        let pci = t.pci_device_by_bus_id_string(bus_id).ok()??;
        let near = pci.first_non_io_ancestor()?;
        let cpus: Vec<usize> = near.cpuset()?.iter_set().map(usize::from).collect();
        let nodes: Vec<usize> = near.nodeset()?.iter_set().map(usize::from).collect();
        // Attached to the root object: hwloc knows no locality for the device (sysfs may
        // know, or say -1, which the report must show).
        if cpus.is_empty() || near.parent().is_none() {
            return None;
        }
        Some(Placement { cpus, numa_nodes: nodes, source: PlacementSource::Hwloc })
    }

    /// The GPUs the topology holds, in PCI order (empty without hwloc: sysfs alone does not
    /// say which PCI devices are GPUs here).
    pub fn gpus(&self) -> Vec<TopologyGpu> {
        #[cfg(feature = "hwloc")]
        if let Some(t) = self.hw.as_ref() {
            use hwlocality::object::{attributes::ObjectAttributes, types::ObjectType};
            let mut found: Vec<TopologyGpu> = t
                .objects_with_type(ObjectType::PCIDevice)
                .filter_map(|o| match o.attributes() {
                    // Display controllers (0x0300 VGA, 0x0302 3D: NVIDIA's compute GPUs,
                    // 0x0380 other: AMD Instinct) of the GPU vendors: not a server's
                    // management-chip VGA.
                    Some(ObjectAttributes::PCIDevice(p))
                        if matches!(p.class_id(), 0x0300 | 0x0302 | 0x0380)
                            && matches!(p.vendor_id(), 0x10de | 0x1002) =>
                    {
                        let bus_id = format!(
                            "{:04x}:{:02x}:{:02x}.{:x}",
                            p.domain(),
                            p.bus_id(),
                            p.bus_device(),
                            p.function()
                        );
                        let vendor = if p.vendor_id() == 0x10de { "NVIDIA" } else { "AMD" }.to_string();
                        let placement = self.place_pci(&bus_id);
                        Some(TopologyGpu { bus_id, vendor, device_id: p.device_id(), placement })
                    }
                    _ => None,
                })
                .collect();
            found.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
            return found;
        }
        Vec::new()
    }

    /// The NUMA distance matrix, when the topology has one.
    pub fn numa_distances(&self) -> Option<NumaDistances> {
        #[cfg(feature = "hwloc")]
        if let Some(t) = self.hw.as_ref() {
            use hwlocality::object::types::ObjectType;
            let all = t.distances(None).ok()?;
            let d = all.iter().find(|d| {
                d.num_objects() > 0
                    && d.objects().all(|o| o.is_some_and(|o| o.object_type() == ObjectType::NUMANode))
            })?;
            let nodes = d.objects().map(|o| o.and_then(|o| o.os_index()).unwrap_or(usize::MAX)).collect();
            return Some(NumaDistances { nodes, matrix: d.distances().to_vec() });
        }
        None
    }

    /// Binds the calling thread to `cpus`; returns the binding as read back.
    pub fn bind_current_thread(&self, cpus: &[usize]) -> Result<Vec<usize>> {
        #[cfg(feature = "hwloc")]
        if self.this_system {
            if let Some(t) = self.hw.as_ref() {
                use hwlocality::cpu::{binding::CpuBindingFlags, cpuset::CpuSet};
                let mut set = CpuSet::new();
                cpus.iter().for_each(|&c| set.set(c));
                let fail = |e: String| Error::Driver { device: 0, call: "hwloc_set_cpubind", message: e };
                t.bind_cpu(&set, CpuBindingFlags::THREAD).map_err(|e| fail(e.to_string()))?;
                let back = t.cpu_binding(CpuBindingFlags::THREAD).map_err(|e| fail(e.to_string()))?;
                return Ok(back.iter_set().map(usize::from).collect());
            }
        }
        let _ = cpus;
        Ok(Vec::new())
    }

    /// The NUMA nodes holding the pages of `area` (this machine only).
    pub fn memory_location(&self, area: &[u8]) -> Result<Vec<usize>> {
        #[cfg(feature = "hwloc")]
        if let (true, Some(t)) = (self.this_system, self.hw.as_ref()) {
            use hwlocality::memory::{binding::MemoryBindingFlags, nodeset::NodeSet};
            let set: NodeSet = t.area_memory_location(area, MemoryBindingFlags::empty()).map_err(|e| {
                Error::Driver { device: 0, call: "hwloc_get_area_memlocation", message: e.to_string() }
            })?;
            return Ok(set.iter_set().map(usize::from).collect());
        }
        let _ = area;
        Err(Error::InvalidArgument {
            routine: "Topology::memory_location",
            what: format!("needs hwloc and this machine's topology ({})", self.description),
        })
    }

    /// Binds the pages of `area` to `nodes` before they are first touched (best effort:
    /// containers may forbid it; returns whether it worked). Only the area's address and
    /// size are read, so it may be memory not yet written (`[MaybeUninit<u8>]`).
    pub fn bind_area<T>(&self, area: &[T], nodes: &[usize]) -> bool {
        #[cfg(feature = "hwloc")]
        if let (true, Some(t)) = (self.this_system, self.hw.as_ref()) {
            use hwlocality::memory::{
                binding::{MemoryBindingFlags, MemoryBindingPolicy},
                nodeset::NodeSet,
            };
            let mut set = NodeSet::new();
            nodes.iter().for_each(|&n| set.set(n));
            return t
                .bind_memory_area(area, &set, MemoryBindingPolicy::Bind, MemoryBindingFlags::empty())
                .is_ok();
        }
        let _ = (area, nodes);
        false
    }
}

fn place_pci_sysfs(bus_id: &str) -> Option<Placement> {
    let dir = Path::new("/sys/bus/pci/devices").join(bus_id.to_lowercase());
    let node: i64 = std::fs::read_to_string(dir.join("numa_node")).ok()?.trim().parse().ok()?;
    if node < 0 {
        return None;
    }
    let cpus = parse_cpu_list(&std::fs::read_to_string(dir.join("local_cpulist")).ok()?)?;
    Some(Placement { cpus, numa_nodes: vec![node as usize], source: PlacementSource::Sysfs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(ranges(&[]), "none");
    }

    #[test]
    fn the_system_topology_has_cpus_and_nodes() {
        let t = Topology::system();
        assert!(!t.whole_machine("test").cpus.is_empty());
        assert!(!t.numa_nodes().is_empty());
        let p = t.place_pci("ffff:ff:1f.7");
        assert!(!p.is_known(), "a device that does not exist has no known place: {p}");
    }
}
