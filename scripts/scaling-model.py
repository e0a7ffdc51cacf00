#!/usr/bin/env python3
"""Scaling estimate for Jacobi and the 3-D stencil across MPI ranks, one rank per GPU.

Per step, on P GPUs in N nodes (1-D slabs, one rank per GPU: two neighbours each):
  compute   T_c = T_kernel / share + T_fixed + T_edges   (share = P for strong scaling, 1
            for weak; T_edges: the two extra launches of the edge rows, 2 x 5 us)
  exchange  T_x = 4 (a_copy + b / B_copy) + a_link + b / B_link   (device -> pinned and
            pinned -> device for each of the two ends, one after the other on the rank's
            one device; MPI for both ends at once; the link is the network for the ranks
            at a node's ends, which set the step's pace)
  hidden    H   = f * min(T_x, T_c)                 (f: share of the exchange hidden, measured)
  norm      T_r = ceil(log2 G) a_node + ceil(log2 N) a_net   (Jacobi's allreduce, G GPUs a node)
  step      T   = T_c + T_x - H + T_r
  efficiency E  = T_1 / T (weak), T_1 / (P T) (strong), T_1 the one-GPU step.

Measured inputs (nvidia-h200, 1 x H200, 2026-12-01; docs/PERFORMANCE.md, "MPI on the GPU machine"):
  Jacobi 16384^2 one-GPU step 716 us (median of three runs; 714 us in the final runs), of it the kernel 686 us (ncu);
  3-D stencil 512^3 one-GPU step 434 us; a synchronised small copy 8.2 us; pinned DMA
  37.9 GB/s at 1 MiB (docs/PERFORMANCE.md, transfers of 2026-11-29). The share of the exchange hidden behind the
  interior, Jacobi 0.55 and stencil 0.40, are medians of three 2-rank runs in which the
  two ranks took turns on one GPU: measured, but not on the machine modelled, so an
  assumption here.
Stated inputs (not measured here): one 400 Gb/s NIC per GPU at 40 GB/s effective and
3 us MPI latency between nodes; shared memory within a node at 20 GB/s and 1 us; the
stencil's fixed per-step cost taken as Jacobi's 30 us; 5 us per extra launch.

With the remedies (the second set of tables): a grid of parts over 1, 2 or 3 axes (the
most even split); the busiest part exchanges two faces along each split axis, each
`b` bytes; faces across any axis but the slowest are strided, so packed and unpacked on the
device (`2 (PACK_US + b / PACK_GBS)`, measured, and also every face on the direct path,
which hands MPI one contiguous buffer); staging `2 (a_copy + b / B_copy)` per face with
serial ends (each face its own copies), or `2 (a_copy + sum b / B_copy)` with concurrent
ends (all of a device's faces packed side by side and staged in one copy a direction, as
`cluster::GridRanks` does since issue 50); none on the direct path (a CUDA-aware MPI or
NCCL); the network carries every face but those to the part's neighbours on its node
(one per split axis its node's block of parts spans, through shared memory beside it).

`python3 scripts/scaling-model.py` prints the tables of docs/PERFORMANCE.md; `--help` for the
knobs; `--self-test` checks the model's arithmetic (CI runs it).
"""
import argparse
import math

# Packing a strided face on the device and unpacking it (the generated box kernel,
# offload::partition::halo), each `PACK_US + bytes / PACK_GBS`: fitted to
# benches/grid_faces.rs on an H100 80GB HBM3, 2026-12-07 (pack 7.5 / 31.6 us and unpack
# 7.5 / 54.3 us for a 1 MiB / 16 MiB face across the fastest axis: 5.2 us and 443 GB/s
# reproduce both sums within 1%). Measured.
PACK_US, PACK_GBS = 5.2, 443.0

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--net-gbs", type=float, default=40.0, help="network GB/s per GPU")
p.add_argument("--net-us", type=float, default=3.0, help="MPI latency between nodes, us")
p.add_argument("--node-gbs", type=float, default=20.0, help="shared-memory GB/s within a node")
p.add_argument("--node-us", type=float, default=1.0, help="MPI latency within a node, us")
p.add_argument("--copy-us", type=float, default=8.2, help="device<->pinned copy latency, us")
p.add_argument("--copy-gbs", type=float, default=37.9, help="device<->pinned copy GB/s")
p.add_argument("--launch-us", type=float, default=5.0, help="an extra kernel launch, us")
p.add_argument("--pack-us", type=float, default=PACK_US, help="packing (or unpacking) a face on the device, fixed us")
p.add_argument("--pack-gbs", type=float, default=PACK_GBS, help="packing (or unpacking) a face on the device, GB/s")
p.add_argument("--self-test", action="store_true", help="check the model's own arithmetic and exit")
a = p.parse_args()

GPUS = [8, 16, 32, 64, 128, 256, 512]


def nodes(gpus):
    """8 GPUs on 4 nodes up to 512 on 64: 2, 4, then 8 GPUs a node."""
    return max(4, gpus // 8)


def step(kernel_us, fixed_us, share, halo_bytes, hidden, gpus, norm_every):
    n = nodes(gpus)
    g = gpus // n
    compute = kernel_us / share + fixed_us + 2 * a.launch_us
    link_us, link_gbs = (a.net_us, a.net_gbs) if n > 1 else (a.node_us, a.node_gbs)
    exchange = 4 * (a.copy_us + halo_bytes / (a.copy_gbs * 1e3)) + link_us + halo_bytes / (link_gbs * 1e3)
    exposed = exchange - hidden * min(exchange, compute)
    reduce = 0.0
    if norm_every:
        reduce = (math.ceil(math.log2(g)) * a.node_us + math.ceil(math.log2(n)) * a.net_us) / norm_every
    return n, compute, exchange, exposed, reduce, compute + exposed + reduce


def table(title, kernel_us, fixed_us, halo_bytes, hidden, strong, norm_every):
    print(f"\n{title}\n")
    print("| GPUs | nodes | compute us | exchange us | exposed us | allreduce us | step us | efficiency | largest loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    one = kernel_us + fixed_us
    for gpus in GPUS:
        share = gpus if strong else 1
        hb = halo_bytes
        n, c, x, e, r, t = step(kernel_us, fixed_us, share, hb, hidden, gpus, norm_every)
        eff = one / (gpus * t) if strong else one / t
        losses = {"exposed halo": e, "allreduce": r}
        if strong:
            losses["fixed per-step cost"] = fixed_us * (1 - 1 / gpus)
        worst = max(losses, key=losses.get)
        print(f"| {gpus} | {n} | {c:.1f} | {x:.1f} | {e:.1f} | {r:.1f} | {t:.1f} | {eff * 100:.1f}% | {worst} |")


J_KERNEL, J_FIXED, S_STEP, FIXED = 686.0, 30.0, 434.0, 30.0


def baseline():
    """The 1-D model's tables: slabs, each end staged after the other."""
    table("Jacobi, weak: 16384 x 16384 per GPU (rows of 64 KiB), norm every step",
          J_KERNEL, J_FIXED, 16384 * 4, 0.55, False, 1)
    table("Jacobi, weak, norm every 100 steps", J_KERNEL, J_FIXED, 16384 * 4, 0.55, False, 100)
    table("Jacobi, strong: 65536 x 65536 in all (rows of 256 KiB), norm every step",
          J_KERNEL * 16, J_FIXED, 65536 * 4, 0.55, True, 1)
    table("3-D stencil, weak: 512^3 per GPU (planes of 1 MiB)",
          S_STEP - FIXED, FIXED, 512 * 512 * 4, 0.40, False, 0)
    table("3-D stencil, strong: 2048^3 in all (planes of 16 MiB)",
          (S_STEP - FIXED) * 64, FIXED, 2048 * 2048 * 4, 0.40, True, 0)


def grid_shape(gpus, axes):
    """The most even split of `gpus` parts over `axes` axes (largest counts first)."""
    best = None
    def rec(left, k, acc):
        nonlocal best
        if k == 1:
            shape = sorted(acc + [left], reverse=True)
            if best is None or shape[0] < best[0] or (shape[0] == best[0] and shape < best):
                best = shape
            return
        for f in range(1, left + 1):
            if left % f == 0:
                rec(left // f, k - 1, acc + [f])
    rec(gpus, axes, [])
    return best


def faces(extents, shape, periodic):
    """The faces the busiest part exchanges: (bytes, strided) for each neighbour along each
    split axis (two along an axis split in two or more, or that wraps), f32 points."""
    local = [e // s for e, s in zip(extents, shape)]
    out = []
    for axis, parts in enumerate(shape):
        if parts == 1:
            continue
        pts = 1
        for other, n in enumerate(local):
            if other != axis:
                pts *= n
        # A face across the slowest axis is contiguous; across any other it is strided.
        out += [(pts * 4, axis != 0)] * 2
    return out


def grid_step(kernel_us, fixed_us, gpus, extents, axes, ends, path, hidden, norm_every, periodic=False):
    """One step of a strong-scaled run on a grid of parts over `axes` axes (1: slabs):
    `ends` "serial" (each face's copies one after another) or "concurrent" (all faces
    staged in one copy a direction, as GridRanks' arenas do); `path` "staged" (device ->
    pinned -> network -> pinned -> device) or "direct" (device buffers to a CUDA-aware MPI
    or NCCL)."""
    n = nodes(gpus)
    g = gpus // n
    shape = grid_shape(gpus, axes) + [1] * (len(extents) - axes)
    fs = faces(extents, shape, periodic)
    total = sum(b for b, _ in fs)
    # The node's GPUs hold a compact block of parts: the busiest rank, at a corner of it,
    # has one neighbour on its node along each split axis the block spans, reached through
    # shared memory beside the network (taken as no slower); the rest cross the network.
    block = grid_shape(g, axes) + [1] * (len(extents) - axes)
    on_node = [i for i, (parts, span) in enumerate(zip(shape, block)) if parts > 1 and span > 1]
    per_axis = {}
    i = 0
    for axis, parts in enumerate(shape):
        if parts > 1:
            per_axis[axis] = fs[i][0]
            i += 2
    net_bytes = total - sum(per_axis[ax] for ax in on_node)
    packs = sum(2 * (a.pack_us + b / (a.pack_gbs * 1e3)) for b, strided in fs if strided or path == "direct")
    compute = kernel_us / gpus + fixed_us + 2 * a.launch_us
    link_us, link_gbs = (a.net_us, a.net_gbs) if n > 1 else (a.node_us, a.node_gbs)
    network = link_us + net_bytes / (link_gbs * 1e3)
    if path == "direct":
        staging = 0.0
    elif ends == "serial":
        staging = sum(2 * (a.copy_us + b / (a.copy_gbs * 1e3)) for b, _ in fs)
    else:
        staging = 2 * (a.copy_us + total / (a.copy_gbs * 1e3))
    exchange = packs + staging + network
    exposed = exchange - hidden * min(exchange, compute)
    reduce = 0.0
    if norm_every:
        reduce = (math.ceil(math.log2(g)) * a.node_us + math.ceil(math.log2(n)) * a.net_us) / norm_every
    step = compute + exposed + reduce
    return shape, exchange, exposed, step, (kernel_us + fixed_us) / (gpus * step)


def remedies(title, kernel_us, fixed_us, extents, hidden, norm_every, periodic, axes_list):
    print(f"\n{title}\n")
    print("| GPUs | decomposition | ends | path | exchange us | exposed us | step us | efficiency |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for gpus in [16, 64, 256]:
        for axes in axes_list:
            for ends, path in [("serial", "staged"), ("concurrent", "staged"), ("concurrent", "direct")]:
                if axes == 1 and path == "direct":
                    continue
                shape, x, e, t, eff = grid_step(kernel_us, fixed_us, gpus, extents, axes, ends, path, hidden, norm_every, periodic)
                dec = " x ".join(str(c) for c in shape[:axes]) if axes > 1 else f"{gpus} slabs"
                print(f"| {gpus} | {dec} | {ends} | {path} | {x:.1f} | {e:.1f} | {t:.1f} | {eff * 100:.1f}% |")


def self_test():
    """The model's arithmetic on cases worked by hand."""
    assert grid_shape(64, 3) == [4, 4, 4] and grid_shape(64, 2) == [8, 8] and grid_shape(12, 2) == [4, 3]
    assert grid_shape(8, 1) == [8]
    # 2048^3 on 4 x 4 x 4: six faces of 512^2 f32 (1 MiB), the z faces contiguous.
    fs = faces([2048] * 3, [4, 4, 4], False)
    assert len(fs) == 6 and all(b == 512 * 512 * 4 for b, _ in fs) and [s for _, s in fs] == [False] * 2 + [True] * 4
    # Slabs: two contiguous planes of 16 MiB, as the 1-D model's ends.
    assert faces([2048] * 3, [64, 1, 1], False) == [(2048 * 2048 * 4, False)] * 2
    # Serial staged slabs reproduce the 1-D model's exchange (4 copies + the link).
    _, x, _, _, _ = grid_step(686.0 * 16, 30.0, 64, [65536, 65536], 1, "serial", "staged", 0.55, 1)
    _, _, x1, _, _, _ = step(686.0 * 16, 30.0, 64, 65536 * 4, 0.55, 64, 1)
    assert abs(x - x1) < 1e-9, (x, x1)
    # Concurrent ends stage once per direction; direct stages never.
    _, xc, _, _, _ = grid_step(686.0 * 16, 30.0, 64, [65536, 65536], 1, "concurrent", "staged", 0.55, 1)
    assert xc < x
    _, xd, _, _, _ = grid_step(686.0 * 16, 30.0, 64, [65536, 65536], 2, "concurrent", "direct", 0.55, 1)
    assert xd < xc
    print("scaling-model self-test: ok")


if a.self_test:
    self_test()
else:
    baseline()
    print("\n## With the remedies (grids of parts, concurrent ends, direct paths)")
    remedies("Jacobi, strong: 65536 x 65536 in all, norm every step",
             J_KERNEL * 16, J_FIXED, [65536, 65536], 0.55, 1, True, [1, 2])
    remedies("3-D stencil, strong: 2048^3 in all",
             (S_STEP - FIXED) * 64, FIXED, [2048, 2048, 2048], 0.40, 0, False, [1, 2, 3])
