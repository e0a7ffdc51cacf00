//! Grids split in one, two and three dimensions and held part by part on devices
//! (`DistributedGrid`), on every backend present: what an exchange brings each part (faces,
//! edges and corners, across periodic ends too), what a gather brings back, refused shapes,
//! and a failing exchange's error.

use offload::backend::{FaultKind, FaultPlan};
use offload::partition::{halo, DistributedGrid, GridBox, GridPartition, Reach};
use offload::{Error, MapType, Runtime};
use offload_tests::{assert_clean, check, check_eq, faulty_runtime, on_every_backend};

/// What part `p` holds after one exchange, worked out on the host: its mapped box of
/// `host`, each received region replaced by the points its neighbour sends.
fn expected<T: Copy + Default>(g: &GridPartition, reach: Reach, host: &[T], p: usize) -> Vec<T> {
    let (whole, mapped) = (g.whole(), g.mapped(p));
    let mut local = vec![T::default(); mapped.len()];
    mapped.pack(&whole, host, &mut local);
    for e in g.exchanges(p, reach) {
        let mut buf = vec![T::default(); e.send.len()];
        e.send.pack(&whole, host, &mut buf);
        e.recv.unpack(&mapped, &buf, &mut local);
    }
    local
}

/// Distinct values for every point, negated in the boundary, so that a point from the
/// wrong place shows.
fn numbered(g: &GridPartition) -> Vec<f64> {
    let (whole, interior) = (g.whole(), g.interior());
    let mut v = vec![0f64; whole.len()];
    let mut i = 0;
    // Row-major order: the box's points in turn.
    fn each(b: &GridBox, at: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
        if at.len() == b.ranges().len() {
            return f(at);
        }
        for c in b.ranges()[at.len()].clone() {
            at.push(c);
            each(b, at, f);
            at.pop();
        }
    }
    each(&whole, &mut Vec::new(), &mut |pt| {
        v[i] = if interior.contains(pt) { i as f64 + 1.0 } else { -(i as f64) - 1.0 };
        i += 1;
    });
    v
}

/// Odd and uneven 1-, 2- and 3-D splits, halos 1 and 2, faces or corners, periodic or not,
/// parts sharing devices (more parts than devices): after one exchange every part holds
/// exactly what the partition says, and a gather after the parts change their owned points
/// brings each point back from its owner.
#[test]
fn exchanges_bring_every_face_edge_and_corner_and_gathers_bring_owned_points_back() {
    /// Extents, parts per axis, halo, periodic axes, reach.
    type Case = (&'static [usize], &'static [usize], usize, &'static [bool], Reach);
    let cases: &[Case] = &[
        (&[11], &[3], 1, &[true], Reach::Faces),
        (&[9, 11], &[2, 2], 1, &[true, false], Reach::Faces),
        (&[10, 13], &[3, 2], 2, &[false, false], Reach::Corners),
        (&[8, 7], &[1, 2], 1, &[true, true], Reach::Corners),
        (&[7, 8, 9], &[2, 2, 2], 1, &[false, false, false], Reach::Faces),
        (&[9, 7, 8], &[3, 1, 2], 1, &[true, false, true], Reach::Corners),
        (&[10, 9, 11], &[2, 2, 1], 2, &[false, true, false], Reach::Corners),
    ];
    on_every_backend(
        "distributed grids",
        2,
        |b| b,
        |rt| {
            let n = rt.num_devices();
            for &(extents, shape, halo, periodic, reach) in cases {
                let g = GridPartition::new(extents, shape, halo)?.with_periodic(periodic)?;
                let devices: Vec<usize> = (0..g.parts()).map(|p| p % n).collect();
                let start = numbered(&g);
                let mut host = start.clone();
                let d = DistributedGrid::map(rt, &devices, &mut host, g.clone(), reach, MapType::TO)?;
                // Before an exchange each part holds its mapped box as the host had it.
                for p in 0..g.parts() {
                    let mut want = vec![0f64; g.mapped(p).len()];
                    g.mapped(p).pack(&g.whole(), &start, &mut want);
                    check_eq!(d.to_vec(p)?, want);
                }
                d.exchange_halos()?;
                for p in 0..g.parts() {
                    check_eq!(d.to_vec(p)?, expected(&g, reach, &start, p));
                }
                // Each part doubles its whole box (halos too); only owned points come back.
                for (p, &device) in devices.iter().enumerate() {
                    let doubled: Vec<f64> = d.to_vec(p)?.iter().map(|v| v * 2.0).collect();
                    let dev = rt.device(device)?;
                    let b = offload::DeviceBuffer::from_slice(&dev, &doubled)?;
                    halo::unpack(&dev, &g.mapped(p), &g.mapped(p), b.view(), d.view(p))?;
                }
                d.gather()?;
                // Owned points (the interior's, numbered positive) doubled; the boundary as it was.
                for (i, (&got, &was)) in host.iter().zip(&start).enumerate() {
                    let want = if was > 0.0 { was * 2.0 } else { was };
                    check!(got == want, "{extents:?}/{shape:?}: point {i}: {got} (was {was})");
                }
                for dev in 0..n {
                    assert_clean(rt, dev)?;
                }
            }
            Ok(())
        },
    );
}

/// Shapes and arguments a grid cannot be mapped with are refused before anything is
/// allocated, each error saying what was expected.
#[test]
fn grids_mapped_wrongly_are_refused() -> offload::Result<()> {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    let g = GridPartition::new(&[6, 6], &[2, 1], 1)?;
    let refused = |r: offload::Result<DistributedGrid<'_, f32>>, what: &str| match r {
        Err(Error::InvalidArgument { routine: "DistributedGrid::map", what: w }) if w.contains(what) => {
            Ok(())
        }
        other => {
            Err(Error::InvalidArgument { routine: "test", what: format!("expected {what:?}, got {other:?}") })
        }
    };
    let mut host = vec![0f32; 36];
    refused(
        DistributedGrid::map(&rt, &[0], &mut host, g.clone(), Reach::Faces, MapType::TO),
        "1 devices for 2 parts",
    )?;
    let mut short = vec![0f32; 35];
    refused(
        DistributedGrid::map(&rt, &[0, 1], &mut short, g.clone(), Reach::Faces, MapType::TO),
        "35 elements",
    )?;
    refused(
        DistributedGrid::map(&rt, &[0, 1], &mut host, g.clone(), Reach::Faces, MapType::FROM),
        "expected TO or ALLOC",
    )?;
    let initial = rt.initial_device();
    refused(
        DistributedGrid::map(&rt, &[0, initial], &mut host, g.clone(), Reach::Faces, MapType::TO),
        "initial device",
    )?;
    match DistributedGrid::map(&rt, &[0, 7], &mut host, g, Reach::Faces, MapType::TO) {
        Err(Error::NoSuchDevice { .. }) => {}
        other => check!(false, "device 7: {other:?}"),
    }
    for d in 0..2 {
        assert_clean(&rt, d)?;
    }
    Ok(())
}

/// A launch that fails while a part sends its face fails the exchange with an error naming
/// the part, its device and the region; the grid stays usable: the next exchange brings
/// every halo, and the gather every owned point.
#[test]
fn a_failing_exchange_names_the_part_device_and_region() -> offload::Result<()> {
    let rt = faulty_runtime(FaultPlan::default().fail_nth(FaultKind::Launch, 1), true)?;
    let g = GridPartition::new(&[6, 5], &[2, 1], 1)?;
    let start: Vec<f32> = (0..30).map(|i| i as f32).collect();
    let mut host = start.clone();
    let d = DistributedGrid::map(&rt, &[0, 0], &mut host, g.clone(), Reach::Faces, MapType::TO)?;
    match d.exchange_halos() {
        Err(Error::Exchange { rank: None, part: 0, device: 0, region, .. }) => check!(
            region.contains("face") && region.contains("to part 1") && region.contains("[2..3, 1..4]"),
            "{region}"
        ),
        other => check!(false, "expected an exchange error, got {other:?}"),
    }
    d.exchange_halos()?;
    let widened = start.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    for p in 0..2 {
        let want: Vec<f32> = expected(&g, Reach::Faces, &widened, p).iter().map(|&v| v as f32).collect();
        check_eq!(d.to_vec(p)?, want);
    }
    d.gather()?;
    check_eq!(host, start);
    assert_clean(&rt, 0)
}

/// A process holding only some parts (the others another rank's): it allocates, fills,
/// exchanges and gathers those alone; the others have no device, no view and no points.
#[test]
fn a_process_holds_only_its_parts() -> offload::Result<()> {
    let rt = Runtime::builder().env(|_| None).gpus(false).host_devices(2).build()?;
    let g = GridPartition::new(&[8, 6], &[3, 1], 1)?.with_periodic(&[true, false])?;
    let start: Vec<f32> = (0..48).map(|i| i as f32).collect();
    let mut host = start.clone();
    let placement = [Some(0), None, Some(1)];
    let d = DistributedGrid::map_held(&rt, &placement, &mut host, g.clone(), Reach::Faces, MapType::TO)?;
    check_eq!(d.held().collect::<Vec<_>>(), vec![0, 2]);
    check_eq!((d.device(1), d.device(2)), (None, Some(1)));
    check!(
        matches!(d.to_vec(1), Err(Error::InvalidArgument { routine: "DistributedGrid::to_vec", .. })),
        "part 1"
    );
    d.exchange_halos()?;
    // Parts 0 and 2 meet across the periodic ends: each has the other's face, and part
    // 1's faces are not theirs to bring.
    let widened: Vec<f64> = start.iter().map(|&v| f64::from(v)).collect();
    let (p0, p2) = (d.to_vec(0)?, d.to_vec(2)?);
    let want = |p: usize| -> Vec<f32> {
        expected(&g, Reach::Faces, &widened, p).iter().map(|&v| v as f32).collect()
    };
    let (w0, w2) = (want(0), want(2));
    // Rows of part 0's box: its top halo row (from part 2) is exchanged, its bottom halo
    // row (part 1's) is as mapped.
    check_eq!(p0[..6], w0[..6]);
    check_eq!(p2[p2.len() - 6..], w2[w2.len() - 6..]);
    d.gather()?;
    check_eq!(host, start);
    for dev in 0..2 {
        assert_clean(&rt, dev)?;
    }
    Ok(())
}

/// NCCL moving a grid's halos (`exchange_halos_over`): on CUDA GPUs with NCCL loadable,
/// every part of 2-D and 3-D splits, periodic or not, all parts on one GPU (each region a
/// send of the GPU's rank to itself) or spread over several, holds exactly what the
/// device-to-device exchange brings, and a sum over the communicator's ranks adds each
/// rank's values. Elsewhere the communicator is refused with the reason: host devices are
/// not CUDA GPUs; a GPU without NCCL says where the library is looked for.
#[test]
fn nccl_moves_every_region_as_the_device_copies_do() {
    use offload::collective::NcclComm;
    type Case = (&'static [usize], &'static [usize], &'static [bool], Reach);
    let cases: &[Case] = &[
        (&[9, 11], &[2, 2], &[true, false], Reach::Faces),
        (&[10, 13], &[3, 2], &[false, false], Reach::Corners),
        (&[7, 8, 9], &[2, 2, 2], &[true, false, true], Reach::Corners),
    ];
    on_every_backend(
        "grids over NCCL",
        1,
        |b| b,
        |rt| {
            let n = rt.num_devices();
            let all: Vec<usize> = (0..n).collect();
            let comm = match NcclComm::of_devices(rt, &all) {
                Ok(c) => c,
                Err(e) => {
                    let gpu = rt.describe(0)?.kind == offload::BackendKind::Cuda;
                    let why = e.to_string();
                    if !gpu {
                        check!(why.contains("not a CUDA GPU"), "{why}");
                    } else {
                        check!(
                            why.contains("NCCL cannot run here") && NcclComm::available().is_err(),
                            "{why}"
                        );
                    }
                    println!("SKIP grids over NCCL on {}: {why}", rt.describe(0)?.kind.name());
                    return Ok(());
                }
            };
            check_eq!(comm.ranks(), n);
            for &(extents, shape, periodic, reach) in cases {
                let g = GridPartition::new(extents, shape, 1)?.with_periodic(periodic)?;
                let start = numbered(&g);
                for spread in [1, n] {
                    let devices: Vec<usize> = (0..g.parts()).map(|p| p % spread).collect();
                    let mut host = start.clone();
                    let d = DistributedGrid::map(rt, &devices, &mut host, g.clone(), reach, MapType::TO)?;
                    d.exchange_halos_over(&comm)?;
                    for p in 0..g.parts() {
                        check_eq!(d.to_vec(p)?, expected(&g, reach, &start, p));
                    }
                }
            }
            // The sum over the ranks: each rank holds (rank + 1) * [1, 2, 3].
            let bufs = all
                .iter()
                .map(|&d| {
                    let k = (d + 1) as f64;
                    offload::DeviceBuffer::from_slice(&rt.device(d)?, &[k, 2.0 * k, 3.0 * k])
                })
                .collect::<offload::Result<Vec<_>>>()?;
            let refs: Vec<_> = bufs.iter().collect();
            comm.sum(&refs, 0..3)?;
            let total = (n * (n + 1) / 2) as f64;
            for b in &bufs {
                check_eq!(b.to_vec()?, vec![total, 2.0 * total, 3.0 * total]);
            }
            // Part of a buffer, in f32 and in i64: only the range changes.
            let (fl, int) = (
                all.iter()
                    .map(|&d| offload::DeviceBuffer::from_slice(&rt.device(d)?, &[1f32, 2.0, 3.0]))
                    .collect::<offload::Result<Vec<_>>>()?,
                all.iter()
                    .map(|&d| offload::DeviceBuffer::from_slice(&rt.device(d)?, &[d as i64, -1, 7]))
                    .collect::<offload::Result<Vec<_>>>()?,
            );
            comm.sum(&fl.iter().collect::<Vec<_>>(), 1..2)?;
            comm.sum(&int.iter().collect::<Vec<_>>(), 0..1)?;
            for (f, i) in fl.iter().zip(&int) {
                check_eq!(f.to_vec()?, vec![1.0, 2.0 * n as f32, 3.0]);
                check_eq!(i.to_vec()?, vec![(n * (n - 1) / 2) as i64, -1, 7]);
            }
            // Ranges outside the buffers and a buffer too few are refused.
            let err = comm.sum(&refs, 2..4).unwrap_err().to_string();
            check!(err.contains("elements 2..4 of buffers of 3"), "{err}");
            let err = comm.sum(&refs[1..], 0..1).unwrap_err().to_string();
            check!(err.contains(&format!("{} buffers for {n} ranks", n - 1)), "{err}");
            // A communicator without a rank on a part's device is refused.
            if n > 1 {
                let one = NcclComm::of_devices(rt, &[0])?;
                let mut host = start_of(&[6, 6]);
                let g = GridPartition::new(&[6, 6], &[1, 2], 1)?;
                let d = DistributedGrid::map(rt, &[0, 1], &mut host, g, Reach::Faces, MapType::TO)?;
                let err = d.exchange_halos_over(&one).unwrap_err().to_string();
                check!(err.contains("device 1 holds a part but has no rank"), "{err}");
            }
            Ok(())
        },
    );
}

fn start_of(extents: &[usize]) -> Vec<f64> {
    (0..extents.iter().product::<usize>()).map(|i| i as f64).collect()
}
