//! Ranks of an MPI job (feature `mpi`): run as one process (MPI's singleton) by
//! `cargo test --features mpi`, and by `scripts/mpi.sh` under `mpirun -np 3`, where every
//! rank runs the one test below and its collectives meet the other ranks'. Halo exchange
//! (of row slabs and of grids split in 2-D) runs on every backend present.

use offload::backend::{FaultKind, FaultPlan};
use offload::cluster::{Cluster, Edge, GridRanks, HaloEngine, RankHalos};
use offload::partition::{DistributedArray, DistributedGrid, GridPartition, Reach, RowPartition};
use offload::{Error, MapType, Runtime};
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
        grids_across_ranks(&cluster, &rt, &devices, backend.name);
    }
    a_failing_grid_exchange_names_the_rank_part_and_region(&cluster);
}

/// Each rank's share of a grid split in 2-D (its parts on `devices` of `rt`):
/// [`GridRanks::exchange`] brings every held part exactly what the partition says, faces,
/// edges and corners, across the ranks and the periodic rows; a grid placed otherwise is
/// refused.
fn grids_across_ranks(cluster: &Cluster, rt: &Runtime, devices: &[usize], backend: &str) {
    let (r, n) = (cluster.rank(), cluster.size());
    // Two bands of columns, a band of rows per rank and one more: parts on every rank,
    // some ranks with two.
    let g = GridPartition::new(&[2 + 3 * (n + 1), 9], &[n + 1, 2], 1)
        .and_then(|g| g.with_periodic(&[true, false]))
        .expect("partition");
    let parts = g.parts();
    let owners: Vec<usize> = (0..parts).map(|p| p * n / parts).collect();
    let mut k = 0;
    let placement: Vec<Option<usize>> = owners
        .iter()
        .map(|&o| {
            (o == r).then(|| {
                k += 1;
                devices[(k - 1) % devices.len()]
            })
        })
        .collect();
    let whole = g.whole();
    let start: Vec<f32> = (0..whole.len()).map(|i| i as f32).collect();
    let mut host = start.clone();
    let ranks = GridRanks::new(cluster, rt, &g, Reach::Corners, &owners, &placement).expect("crossings");
    // This MPI reports no CUDA support (and host devices are no GPUs): staged, saying why.
    let (engine, why) = ranks.engine();
    if !cluster.cuda_aware() {
        assert!(engine == HaloEngine::Staged && why.contains("does not report CUDA support"), "{why}");
    }
    let grid = DistributedGrid::map_held(rt, &placement, &mut host, g.clone(), Reach::Corners, MapType::TO)
        .expect("map");
    ranks.exchange(&grid).expect("exchange");
    for p in grid.held() {
        let mapped = g.mapped(p);
        let mut want = vec![0f32; mapped.len()];
        mapped.pack(&whole, &start, &mut want);
        for e in g.exchanges(p, Reach::Corners) {
            let mut buf = vec![0f32; e.send.len()];
            e.send.pack(&whole, &start, &mut buf);
            e.recv.unpack(&mapped, &buf, &mut want);
        }
        assert_eq!(grid.to_vec(p).expect("read back"), want, "[{backend}] rank {r} part {p}");
    }
    assert!(
        grid.held().all(|p| owners[p] == r)
            && grid.held().count() == owners.iter().filter(|&&o| o == r).count()
    );
    // The same grid reaching only across faces is not what the crossings were made for.
    let mut h2 = start.clone();
    let faces = DistributedGrid::map_held(rt, &placement, &mut h2, g.clone(), Reach::Faces, MapType::TO)
        .expect("map");
    assert!(matches!(
        ranks.exchange(&faces),
        Err(Error::InvalidArgument { routine: "GridRanks::exchange", .. })
    ));
    drop(faces);
    grid.gather().expect("gather");
    cluster.barrier();
}

/// Rank 0's first launch fails (packing its first region): its exchange fails with an
/// error naming its rank, the part, its device and the region, while it still sends and
/// receives, so the other ranks' exchanges complete; the next exchange works on every
/// rank. And a rank that refuses its crossings (a placement that is not its parts) makes
/// every rank's `GridRanks::new` fail, not wait.
fn a_failing_grid_exchange_names_the_rank_part_and_region(cluster: &Cluster) {
    let (r, n) = (cluster.rank(), cluster.size());
    let fail_first =
        if r == 0 { FaultPlan::default().fail_nth(FaultKind::Launch, 1) } else { FaultPlan::default() };
    let rt = offload_tests::faulty_runtime(fail_first, true).expect("runtime");
    let g = GridPartition::new(&[2 + 2 * n, 6], &[n, 1], 1).expect("partition");
    let owners: Vec<usize> = (0..n).collect();
    let placement: Vec<Option<usize>> = (0..n).map(|p| (p == r).then_some(0)).collect();
    let mut host = vec![1f32; g.whole().len()];
    let ranks = GridRanks::new(cluster, &rt, &g, Reach::Faces, &owners, &placement).expect("crossings");
    let grid = DistributedGrid::map_held(&rt, &placement, &mut host, g.clone(), Reach::Faces, MapType::TO)
        .expect("map");
    match ranks.exchange(&grid) {
        // Alone, the part sends to nobody (the fault waits for the next launch); the other
        // ranks' launches do not fail.
        Ok(()) if n == 1 || r > 0 => {}
        Err(Error::Exchange { rank, part, device: 0, region, .. }) if r == 0 => {
            assert!(rank == Some(0) && part == 0, "rank {rank:?} part {part}");
            assert!(region.starts_with("sending the face") && region.contains("(rank 1)"), "{region}");
        }
        other => panic!("rank {r}: unexpected {other:?}"),
    }
    cluster.barrier();
    ranks.exchange(&grid).expect("the next exchange");
    grid.gather().expect("gather");
    assert!(host.iter().all(|&v| v == 1.0));
    cluster.barrier();
    // The last rank claims no part: every rank's crossings fail, the last one's saying why.
    let wrong: Vec<Option<usize>> = if r + 1 == n { vec![None; n] } else { placement };
    match GridRanks::<f32>::new(cluster, &rt, &g, Reach::Faces, &owners, &wrong) {
        Err(Error::InvalidArgument { routine: "GridRanks::new", what }) => {
            let mine = r + 1 == n;
            assert!(
                what.contains(if mine { "expected a rank of the world" } else { "other rank(s)" }),
                "{what}"
            );
        }
        other => panic!("rank {r}: expected a refusal, got {other:?}"),
    }
    cluster.barrier();
}
