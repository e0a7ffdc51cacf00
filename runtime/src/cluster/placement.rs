//! Which devices a rank takes on its node.
//!
//! Every rank on a node says which GPUs it can see, by PCI bus id, in the order of its own
//! device numbers. Ranks that see the same set (whatever its order: a per-rank
//! `CUDA_VISIBLE_DEVICES` or `CUDA_DEVICE_ORDER` can renumber it) share it out by their
//! order on the node: with fewer ranks than GPUs each rank takes a contiguous block of
//! them, with more ranks than GPUs consecutive ranks share one. A rank that sees a set of
//! its own (one GPU, say, given to it alone) takes all of it. GPUs are compared by bus id,
//! never by device number, so that two ranks never take "device 0" meaning two GPUs, or
//! one GPU meaning two numbers.
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
/// node rank's visible GPUs as bus ids in its own device order (see the module
/// documentation). Empty when the rank sees no GPU (it runs on host devices). An error
/// when `me` is not a rank of `node` or a rank lists one bus id twice.
pub fn rank_devices(node: &[Vec<String>], me: usize) -> Result<Vec<usize>> {
    let bad = |what: String| Error::InvalidArgument { routine: "rank_devices", what };
    let Some(mine) = node.get(me) else {
        return Err(bad(format!("node rank {me} of a node of {} ranks", node.len())));
    };
    let set = |v: &[String]| -> Result<Vec<String>> {
        let mut s: Vec<String> = v.iter().map(|b| normalize_bus_id(b)).collect();
        s.sort();
        if let Some(w) = s.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("bus id {} is listed twice in {v:?}", w[0])));
        }
        Ok(s)
    };
    let my_set = set(mine)?;
    if my_set.is_empty() {
        return Ok(Vec::new());
    }
    // The ranks that see the same GPUs, in node order, and my place among them.
    let mut group = 0;
    let mut index = 0;
    for (r, v) in node.iter().enumerate() {
        if set(v)? == my_set {
            if r == me {
                index = group;
            }
            group += 1;
        }
    }
    let m = my_set.len();
    let taken: Vec<&String> = if group <= m {
        let blocks = BlockPartition::new(m, group)?;
        my_set[blocks.range(index)].iter().collect()
    } else {
        vec![&my_set[index * m / group]]
    };
    let normalized: Vec<String> = mine.iter().map(|b| normalize_bus_id(b)).collect();
    let mut ordinals: Vec<usize> =
        taken.iter().filter_map(|b| normalized.iter().position(|n| n == *b)).collect();
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
    fn bad_views_are_errors() {
        assert!(rank_devices(&[ids(2)], 1).is_err());
        let twice = vec!["0000:10:00.0".to_string(), "00000000:10:00.0".to_string()];
        assert!(rank_devices(&[twice], 0).is_err());
    }
}
