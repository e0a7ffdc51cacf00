# PyTorch beside benches/mlp_batch.rs: the trial's MLP (512 -> 1024 -> 1024 -> 16, tanh
# GELU after the first two layers, softmax and argmax) on one batch of 64 rows, float32
# and bfloat16; the median of 7 rounds of 50 batches after a warm-up, ms per batch.
#   python3 mlp_batch.py [cpu|cuda]
import statistics, sys, time
import torch
from torch import nn

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(approximate="tanh"), nn.Linear(1024, 1024),
                      nn.GELU(approximate="tanh"), nn.Linear(1024, 16))
print(f"torch {torch.__version__} on {device} ({torch.get_num_threads()} threads)")
print("| 64 rows | ms per batch |\n| --- | --- |")
with torch.inference_mode():
    for dtype in (torch.float32, torch.bfloat16):
        m = model.to(device, dtype).eval()
        x = torch.rand(64, 512, device=device, dtype=dtype)
        def batch():
            logits = m(x)
            return logits.softmax(-1), logits.argmax(-1)
        for _ in range(20):
            batch()
        rounds = []
        for _ in range(7):
            sync()
            t = time.perf_counter()
            for _ in range(50):
                batch()
            sync()
            rounds.append((time.perf_counter() - t) / 50)
        print(f"| {str(dtype).replace('torch.', '')} | {statistics.median(rounds) * 1e3:.3f} |")
