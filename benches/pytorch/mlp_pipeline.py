#!/usr/bin/env python3
"""PyTorch's expert version of the inference example's workload, the anchor its figures
are compared with: a 4-layer MLP (nn.Linear 4096 -> 4096, ReLU between layers, none after
the last), 48 batches of 4096 x 4096 from pageable host memory into fresh pageable outputs,
on one GPU, with pinned staging buffers, three streams (copy in, compute, copy out) and
double buffering. Precisions: fp32 (no TF32), tf32 (allow_tf32), fp16 and bf16 (model,
inputs and outputs in that type). Prints, per precision, each run's time, the median, and
the compute alone (the 48 forward passes on device-resident data, timed with events).
`--reuse-outputs` writes every run into the first run's outputs (faulted in by then), as
the inference example's `-reuse-outputs 1` does, to take the fresh pages out of the time.
`--threads N` sets PyTorch's CPU threads (`torch.set_num_threads`; its host copies are cut
over them), all the machine's by default.

    python3 benches/pytorch/mlp_pipeline.py --precision fp32 tf32 bf16 --repeat 3
"""
import argparse
import statistics
import time

import torch

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def model_in(precision, width, layers, dev):
    torch.manual_seed(0)
    mods = []
    for l in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if l + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).to(device=dev, dtype=DTYPES[precision]).eval()


def expert(model, inputs, outputs, dev):
    """Pinned staging, three streams, two batches in flight (double buffering)."""
    rows, width = inputs[0].shape
    dtype = inputs[0].dtype
    h2d, comp, d2h = (torch.cuda.Stream(dev) for _ in range(3))
    pin_in = [torch.empty(rows, width, dtype=dtype, pin_memory=True) for _ in range(2)]
    pin_out = [torch.empty(rows, width, dtype=dtype, pin_memory=True) for _ in range(2)]
    dev_in = [torch.empty(rows, width, dtype=dtype, device=dev) for _ in range(2)]
    in_done = [torch.cuda.Event() for _ in range(2)]  # h2d of the slot's batch finished
    comp_done = [torch.cuda.Event() for _ in range(2)]  # its forward finished
    out_done = [torch.cuda.Event() for _ in range(2)]  # its d2h finished
    for e in in_done + comp_done + out_done:
        e.record(torch.cuda.current_stream(dev))
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    for i, x in enumerate(inputs):
        s = i % 2
        in_done[s].synchronize()  # pin_in[s] free again
        pin_in[s].copy_(x)
        with torch.cuda.stream(h2d):
            h2d.wait_event(comp_done[s])  # dev_in[s] no longer read
            dev_in[s].copy_(pin_in[s], non_blocking=True)
            in_done[s].record(h2d)
        with torch.cuda.stream(comp):
            comp.wait_event(in_done[s])
            with torch.no_grad():
                y = model(dev_in[s])
            comp_done[s].record(comp)
        with torch.cuda.stream(d2h):
            d2h.wait_event(comp_done[s])
            y.record_stream(d2h)
            pin_out[s].copy_(y, non_blocking=True)
            out_done[s].record(d2h)
        if i > 0:
            p = (i - 1) % 2
            out_done[p].synchronize()
            outputs[i - 1].copy_(pin_out[p])
    last = (len(inputs) - 1) % 2
    out_done[last].synchronize()
    outputs[-1].copy_(pin_out[last])
    return time.perf_counter() - start


def compute_only(model, rows, width, dtype, batches, dev):
    x = torch.rand(rows, width, dtype=dtype, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.no_grad():
        model(x)
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(batches):
            model(x)
        end.record()
    torch.cuda.synchronize(dev)
    return start.elapsed_time(end) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", nargs="+", default=["fp32", "tf32", "bf16"], choices=list(DTYPES))
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reuse-outputs", action="store_true", help="later runs into the first run's outputs")
    ap.add_argument("--threads", type=int, default=0, help="PyTorch's CPU threads (0: its default)")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device("cuda:0")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, {torch.get_num_threads()} CPU threads")
    for p in a.precision:
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        dtype = DTYPES[p]
        model = model_in(p, a.width, a.layers, dev)
        inputs = [torch.rand(a.rows, a.width).to(dtype) for _ in range(a.batches)]
        with torch.no_grad():  # warm-up: cuBLAS handles, the allocator's pools
            model(inputs[0].to(dev))
        times = []
        outputs = None
        for _ in range(a.repeat):
            if outputs is None or not a.reuse_outputs:
                outputs = [torch.empty(a.rows, a.width, dtype=dtype) for _ in range(a.batches)]  # fresh pages
            times.append(expert(model, inputs, outputs, dev))
            print(f"  {p}: {times[-1]:.3f} s")
        comp = compute_only(model, a.rows, a.width, dtype, a.batches, dev)
        print(
            f"pytorch expert {p}{' (outputs reused)' if a.reuse_outputs else ''}: median {statistics.median(times):.3f} s of {a.repeat} "
            f"(runs {', '.join(f'{t:.3f}' for t in times)}); compute alone {comp:.3f} s "
            f"({comp / a.batches * 1e3:.2f} ms per batch)"
        )
        del model, inputs


if __name__ == "__main__":
    main()
