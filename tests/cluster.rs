//! Ranks of an MPI job (feature `mpi`): run as one process (MPI's singleton) by
//! `cargo test --features mpi`, and by `scripts/mpi.sh` under `mpirun -np 3`, where every
//! rank runs the one test below and its collectives meet the other ranks'. Halo exchange
//! runs on every backend present.

use offload::cluster::{Cluster, Edge, RankHalos};
use offload::partition::{DistributedArray, RowPartition};
use offload::{MapType, Runtime};
use offload_tests::backends;

const LEN: usize = 5;

/// Global row `g`'s values.
fn row(g: usize) -> Vec<f32> {
    (0..LEN).map(|c| (g * 100 + c) as f32).collect()
}

/// Reads global row `g` of part `p`'s device copy back (halo rows included).
fn device_row(rt: &Runtime, a: &DistributedArray<'_, f32>, p: usize, local: usize) -> Vec<f32> {
    let mut out = vec![0f32; LEN];
    let src = a.row_addr(p, local).expect("a mapped row");
    // SAFETY: one row of part p's mapped copy into `out`, which is LEN floats.
    unsafe {
        rt.target_memcpy(out.as_mut_ptr() as u64, src, LEN * 4, 0, 0, rt.initial_device(), a.device(p))
            .expect("copy back")
    };
    out
}

#[test]
fn a_job_of_any_size_reduces_gathers_places_and_exchanges_halos() {
    let cluster = Cluster::init().expect("MPI starts (as a singleton without mpirun)");
    assert!(Cluster::init().is_err(), "MPI initializes once per process");
    let (r, n) = (cluster.rank(), cluster.size());
    assert!(r < n && cluster.node_rank() < cluster.node_size());
    assert_eq!(cluster.sum(r as f64), (n * (n - 1) / 2) as f64);
    assert_eq!(cluster.max(r as f64), (n - 1) as f64);
    let lines = cluster.gather_to_root(&format!("rank {r}")).expect("gather");
    assert_eq!(lines.is_some(), cluster.is_root());
    if let Some(l) = lines {
        assert_eq!(l, (0..n).map(|q| format!("rank {q}")).collect::<Vec<_>>());
    }
    // Host devices only: the rank's runtime is the builder's, with a line saying where.
    let ranked =
        cluster.runtime(Runtime::builder().env(|_| None).gpus(false).host_devices(2)).expect("runtime");
    assert!(ranked.gpus.is_empty());
    assert!(ranked.placement.starts_with(&format!("rank {r} of {n} on ")), "{}", ranked.placement);
    assert!(ranked.placement.contains("device 1 host device 1"), "{}", ranked.placement);
    drop(ranked);
    // With GPUs (every rank of this node sees the same ones, so each takes its share: all of
    // them shared by the ranks when there are fewer GPUs than ranks).
    if backends().iter().any(|b| b.name == "gpu") {
        let ranked = cluster.runtime(Runtime::builder().env(|_| None).host_devices(2)).expect("runtime");
        let took = ranked.gpus.len();
        assert!(took >= 1 && ranked.runtime.num_devices() == took, "{}", ranked.placement);
        assert!(ranked.placement.contains(" bus "), "{}", ranked.placement);
    }

    for backend in backends() {
        let rt = backend.runtime();
        if rt.num_devices() == 0 {
            continue;
        }
        let devices: Vec<usize> = (0..rt.num_devices().min(2)).collect();
        // Four owned rows per device per rank, one global halo row at each end.
        let rows = 2 + 4 * devices.len() * n;
        let ranks = RowPartition::new(rows, LEN, n, 1).expect("rank partition");
        let mine = ranks.mapped(r);
        let slab = RowPartition::new(mine.len(), LEN, devices.len(), 1).expect("slab partition");
        for periodic in [true, false] {
            let mut host: Vec<f32> = mine.clone().flat_map(row).collect();
            // The halo rows start wrong, so that only the exchange can make them right.
            host[..LEN].fill(-1.0);
            let last = host.len() - LEN;
            host[last..].fill(-1.0);
            let halos = RankHalos::new(&cluster, &rt, &devices, &slab, periodic).expect("halos");
            let parts = devices.len();
            assert_eq!(halos.edges_of(0).contains(&Edge::Top), periodic || r > 0, "[{}]", backend.name);
            assert_eq!(halos.edges_of(parts - 1).contains(&Edge::Bottom), periodic || r + 1 < n);
            let a = DistributedArray::map(&rt, &devices, &mut host, slab, MapType::TO).expect("map");
            let want_top = match (r, periodic) {
                (0, true) => row(rows - 2),
                (0, false) => vec![-1.0; LEN],
                _ => row(mine.start),
            };
            let want_bottom = match (r + 1 == n, periodic) {
                (true, true) => row(1),
                (true, false) => vec![-1.0; LEN],
                _ => row(mine.end - 1),
            };
            let check = |how: &str| {
                let got = (device_row(&rt, &a, 0, 0), device_row(&rt, &a, parts - 1, mine.len() - 1));
                assert_eq!(
                    got,
                    (want_top.clone(), want_bottom.clone()),
                    "[{}] rank {r} periodic {periodic}, {how}",
                    backend.name
                );
            };
            // The edge parts at once, each from its own thread; then again, both from one.
            std::thread::scope(|s| {
                for p in 0..parts {
                    let (a, halos) = (&a, &halos);
                    s.spawn(move || halos.exchange(a, p).expect("exchange"));
                }
            });
            check("exchange from each part's thread");
            // exchange_all must write the halos again: spoil the exchanged ones on the device
            // first (the checks below then see exchange_all's rows).
            let ends = [(0, 0, Edge::Top), (parts - 1, mine.len() - 1, Edge::Bottom)];
            for (p, local, edge) in ends {
                if !halos.edges_of(p).contains(&edge) {
                    continue;
                }
                let spoil = [-2f32; LEN];
                let dst = a.row_addr(p, local).expect("a mapped row");
                // SAFETY: one row of part p's mapped copy from `spoil`, LEN floats.
                unsafe {
                    rt.target_memcpy(
                        dst,
                        spoil.as_ptr() as u64,
                        LEN * 4,
                        0,
                        0,
                        a.device(p),
                        rt.initial_device(),
                    )
                    .expect("spoil")
                };
            }
            halos.exchange_all(&a).expect("exchange_all");
            check("exchange_all");
            assert!(halos.exchange(&a, parts).is_err(), "a part past the last is refused");

            // An array split another way is refused, not exchanged.
            let other = RowPartition::new(mine.len(), LEN, 1, 2).expect("partition");
            let mut h2 = vec![0f32; mine.len() * LEN];
            let b = DistributedArray::map(&rt, &devices[..1], &mut h2, other, MapType::TO).expect("map");
            assert!(halos.exchange(&b, 0).is_err());
            drop(b);
            // So is one split alike but mapped by another runtime.
            let rt2 = backend.runtime();
            let mut h3 = vec![0f32; mine.len() * LEN];
            let c = DistributedArray::map(&rt2, &devices, &mut h3, slab, MapType::TO).expect("map");
            assert!(halos.exchange(&c, 0).is_err() && halos.exchange_all(&c).is_err());
            drop(c);
            a.gather().expect("gather");
        }
        assert!(rt.live_mappings().is_empty());
        cluster.barrier();
    }
}
