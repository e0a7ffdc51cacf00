# PyTorch beside benches/host_gemm.rs's layer table: torch.addmm(bias, x, w.t()) on the same
# (out, rows, in) shapes, float32 and bfloat16, the median of 101 products after 20,
# GFLOP/s.   python3 layer_gemm.py
import time
import torch

shapes = [(1024, 64, 512), (1024, 64, 1024), (768, 256, 256), (1024, 256, 256), (256, 256, 1024), (4096, 4, 256)]
print(f"torch {torch.__version__} on cpu ({torch.get_num_threads()} threads)")
print("| layer (out x rows x in) | float32 | bfloat16 |\n| --- | --- | --- |")
with torch.inference_mode():
    for m, n, k in shapes:
        rates = []
        for dtype in (torch.float32, torch.bfloat16):
            x, w, bias = torch.rand(n, k, dtype=dtype), torch.rand(m, k, dtype=dtype), torch.rand(m, dtype=dtype)
            for _ in range(20):
                torch.addmm(bias, x, w.t())
            ts = []
            for _ in range(101):
                t = time.perf_counter()
                torch.addmm(bias, x, w.t())
                ts.append(time.perf_counter() - t)
            rates.append(2 * m * n * k / sorted(ts)[50] / 1e9)
        print(f"| {m} x {n} x {k} | {rates[0]:.1f} GFLOP/s | {rates[1]:.1f} GFLOP/s |")
