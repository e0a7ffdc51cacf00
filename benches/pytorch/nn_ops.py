"""PyTorch's eager ops beside benches/nn.rs (offload_kernels::nn): 8192 x 768 in float32
and bfloat16, us per op, the median of 20 samples of 20 back-to-back calls (CUDA: events
around each sample after a warm-up; CPU: wall clock, torch's threads = the machine's
cores). `python3 benches/pytorch/nn_ops.py [cuda|cpu]`."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROWS, COLS, BATCH, SAMPLES = 8192, 768, 20, 20


def timed(device, fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(SAMPLES):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(BATCH):
                fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / BATCH)
        else:
            t = time.perf_counter()
            for _ in range(BATCH):
                fn()
            times.append((time.perf_counter() - t) * 1e6 / BATCH)
    return statistics.median(times)


def main():
    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"torch {torch.__version__}, {device}, threads {torch.get_num_threads()}")
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(ROWS, COLS, generator=g) * 8 - 4).to(device=device, dtype=dtype)
        w = torch.ones(COLS, device=device, dtype=dtype)
        ops = {
            "softmax": lambda: torch.softmax(x, -1),
            "layer_norm": lambda: F.layer_norm(x, (COLS,), w, w, 1e-5),
            "rms_norm": lambda: F.rms_norm(x, (COLS,), w, 1e-6),
            "gelu": lambda: F.gelu(x),
            "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
            "silu": lambda: F.silu(x),
            "add": lambda: x + x,
        }
        with torch.inference_mode():
            for name, fn in ops.items():
                rows.setdefault(name, []).append(timed(device, fn))
    print(f"\n{ROWS} x {COLS}, PyTorch eager on {device}, us per op (median)\n")
    print("| op | f32 | bf16 |\n| --- | --- | --- |")
    for name, (a, b) in rows.items():
        print(f"| {name} | {a:.1f} | {b:.1f} |")


if __name__ == "__main__":
    main()
