//! Which devices a rank takes on its node.
//!
//! Every rank on a node says which GPUs it can see, by UUID (PCI bus id where the driver
//! gives none; MIG instances share a bus id), in the order of its own device numbers. Ranks that see the same set (whatever its order: a per-rank
//! `CUDA_VISIBLE_DEVICES` or `CUDA_DEVICE_ORDER` can renumber it) share it out by their
//! order on the node: with fewer ranks than GPUs each rank takes a contiguous block of
//! them, with more ranks than GPUs consecutive ranks share one. A rank that sees a set of
//! its own (one GPU, say, given to it alone) takes all of it; where sets overlap without
//! being equal, a GPU two sets would both take stays with the ranks that have no other.
//! GPUs are compared by id, never by device number, so that two ranks never take "device
//! 0" meaning two GPUs, or one GPU meaning two numbers.
//!
//! ```
//! use offload::cluster::placement::rank_devices;
//!
//! let all = vec!["0000:07:00.0".to_string(), "0000:0f:00.0".to_string()];
//! // Two ranks that both see both GPUs take one each.
//! let node = [all.clone(), all.clone()];
//! assert_eq!(rank_devices(&node, 0)?, [0]);
//! assert_eq!(rank_devices(&node, 1)?, [1]);
//! // A rank whose CUDA_VISIBLE_DEVICES lists them the other way round still takes its own.
//! let node = [all.clone(), vec![all[1].clone(), all[0].clone()]];
//! assert_eq!(rank_devices(&node, 1)?, [0]); // its device 0 is bus 0f, the second GPU
//! # Ok::<(), offload::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::partition::BlockPartition;

/// A PCI bus id in one form (`dddd:bb:dd.f`, lower case): CUDA and `nvidia-smi` give the
/// domain with eight digits, hwloc and sysfs with four.
pub fn normalize_bus_id(bus_id: &str) -> String {
    let b = bus_id.trim().to_ascii_lowercase();
    match b.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain.bytes().all(|c| c.is_ascii_hexdigit()) => {
            let short = u32::from_str_radix(domain, 16).map(|d| format!("{d:04x}"));
            short.map_or(b.clone(), |d| format!("{d}:{rest}"))
        }
        _ => b,
    }
}

/// The device numbers (positions in `node[me]`) that node rank `me` takes, given every
/// node rank's visible GPUs as ids (UUIDs, or PCI bus ids) in its own device order (see
/// the module documentation). Empty when the rank sees no GPU (it runs on host devices).
/// An error, the same on every rank, when `me` is not a rank of `node` or any rank lists
/// one id twice.
pub fn rank_devices(node: &[Vec<String>], me: usize) -> Result<Vec<usize>> {
    let bad = |what: String| Error::InvalidArgument { routine: "rank_devices", what };
    if me >= node.len() {
        return Err(bad(format!("node rank {me} of a node of {} ranks", node.len())));
    }
    // Every rank's set, sorted: the same on every rank, so every rank decides alike.
    let mut sets = Vec::with_capacity(node.len());
    for v in node {
        let mut s: Vec<String> = v.iter().map(|b| normalize_bus_id(b)).collect();
        s.sort();
        if let Some(w) = s.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("GPU {} is listed twice in {v:?}", w[0])));
        }
        sets.push(s);
    }
    // Each rank's share of its group's set (ranks that see the same set, in node order).
    let mut taken: Vec<Vec<String>> = Vec::with_capacity(node.len());
    let mut group_of = Vec::with_capacity(node.len());
    for (r, set) in sets.iter().enumerate() {
        let group: Vec<usize> = (0..sets.len()).filter(|&q| sets[q] == *set).collect();
        let (k, m) = (group.len(), set.len());
        let index = group.iter().position(|&q| q == r).unwrap_or(0);
        group_of.push(group[0]);
        taken.push(match m {
            0 => Vec::new(),
            _ if k <= m => set[BlockPartition::new(m, k)?.range(index)].to_vec(),
            _ => vec![set[index * m / k].clone()],
        });
    }
    // A GPU that ranks of different groups took (views that overlap without being equal)
    // stays with the holders that have no other, or else with the first holder only.
    let mut all: Vec<String> = sets.concat();
    all.sort();
    all.dedup();
    for gpu in &all {
        let holders: Vec<usize> = (0..taken.len()).filter(|&r| taken[r].contains(gpu)).collect();
        let groups = holders.iter().map(|&r| group_of[r]).collect::<std::collections::BTreeSet<_>>();
        if groups.len() < 2 {
            continue;
        }
        let alone: Vec<usize> = holders.iter().copied().filter(|&r| taken[r].len() == 1).collect();
        let keep = if alone.is_empty() { vec![holders[0]] } else { alone };
        for r in holders.into_iter().filter(|r| !keep.contains(r)) {
            taken[r].retain(|g| g != gpu);
        }
    }
    let normalized: Vec<String> = node[me].iter().map(|b| normalize_bus_id(b)).collect();
    let mut ordinals: Vec<usize> =
        taken[me].iter().filter_map(|b| normalized.iter().position(|n| n == b)).collect();
    ordinals.sort_unstable();
    Ok(ordinals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("0000:{:02x}:00.0", 0x10 + i)).collect()
    }

    #[test]
    fn bus_ids_compare_in_one_form() {
        assert_eq!(normalize_bus_id("00000000:07:00.0"), "0000:07:00.0");
        assert_eq!(normalize_bus_id("0000:0F:00.0"), "0000:0f:00.0");
        assert_eq!(normalize_bus_id("0001:07:00.0"), "0001:07:00.0");
    }

    #[test]
    fn ranks_split_gpus_or_share_them() {
        let four = ids(4);
        // 2 ranks over 4 GPUs: two each.
        let node = vec![four.clone(); 2];
        assert_eq!(rank_devices(&node, 0).unwrap(), [0, 1]);
        assert_eq!(rank_devices(&node, 1).unwrap(), [2, 3]);
        // 8 ranks over 4 GPUs: two per GPU, consecutive ranks together.
        let node = vec![four.clone(); 8];
        let took: Vec<Vec<usize>> = (0..8).map(|r| rank_devices(&node, r).unwrap()).collect();
        assert_eq!(took, [[0], [0], [1], [1], [2], [2], [3], [3]]);
        // 3 ranks over 4: blocks of 2, 1, 1.
        let node = vec![four.clone(); 3];
        assert_eq!(rank_devices(&node, 0).unwrap(), [0, 1]);
        assert_eq!(rank_devices(&node, 2).unwrap(), [3]);
        // No GPU: host devices.
        assert!(rank_devices(&[vec![], vec![]], 1).unwrap().is_empty());
    }

    #[test]
    fn renumbered_and_restricted_views_take_the_same_gpus() {
        let four = ids(4);
        // Each rank's CUDA_VISIBLE_DEVICES names one GPU: each takes its own device 0.
        let node: Vec<Vec<String>> = (0..4).map(|r| vec![four[3 - r].clone()]).collect();
        for r in 0..4 {
            assert_eq!(rank_devices(&node, r).unwrap(), [0]);
        }
        // All see all, rank 1 in reverse order: rank 1 still takes the second GPU by bus
        // id, which is its device 2.
        let mut rev = four.clone();
        rev.reverse();
        let node = vec![four.clone(), rev, four.clone(), four.clone()];
        assert_eq!(rank_devices(&node, 1).unwrap(), [2]);
        assert_eq!(rank_devices(&node, 2).unwrap(), [2]);
    }

    #[test]
    fn overlapping_views_do_not_double_book_a_gpu() {
        let two = ids(2);
        // Rank 0 sees both GPUs, rank 1 only the second: one each.
        let node = vec![two.clone(), vec![two[1].clone()]];
        assert_eq!(rank_devices(&node, 0).unwrap(), [0]);
        assert_eq!(rank_devices(&node, 1).unwrap(), [0]);
        // MIG instances share a bus id but not a UUID: ids are UUIDs where there are any.
        let mig = vec!["MIG-1111".to_string(), "MIG-2222".to_string()];
        let node = vec![mig.clone(), mig.clone()];
        assert_eq!((rank_devices(&node, 0).unwrap(), rank_devices(&node, 1).unwrap()), (vec![0], vec![1]));
    }

    #[test]
    fn bad_views_are_errors() {
        assert!(rank_devices(&[ids(2)], 1).is_err());
        let twice = vec!["0000:10:00.0".to_string(), "00000000:10:00.0".to_string()];
        assert!(rank_devices(std::slice::from_ref(&twice), 0).is_err());
        // The same error on every rank, whoever listed the id twice.
        assert!(rank_devices(&[ids(1), twice], 0).is_err());
    }
}
