# The trial's MLP service in PyTorch, as an ML engineer writes it: a 512 -> 1024 -> 1024 -> 16
# MLP (GELU) from a safetensors file, in bf16, served from a bounded queue by a batcher
# (64 rows or a 5 ms deadline, a request never split), each request answered with its
# rows' softmax and argmax; 500 requests of 1-8 rows from 4 client threads; prints the
# latency median and p99 and the batches' fill. The line count beside
# offload_examples::mlp_service is docs/INFERENCE.md's.
#   python3 mlp_service.py MODEL.safetensors [cpu|cuda]   (writes MODEL if it is missing)
import os, queue, random, sys, threading, time
from concurrent.futures import Future
import torch
from torch import nn
from safetensors.torch import load_file, save_file

path, device = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "cpu")
model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 16))
if not os.path.exists(path):
    save_file(model.state_dict(), path)
model.load_state_dict(load_file(path))
model = model.to(device, torch.bfloat16).eval()
inbox, MAX_ROWS, DEADLINE = queue.Queue(maxsize=256), 64, 0.005
fills, latencies = [], []

def batcher():
    held = None
    while True:
        first = held or inbox.get()
        if first is None:
            return
        batch, held, end = [first], None, time.monotonic() + DEADLINE
        while sum(len(x) for x, _, _ in batch) < MAX_ROWS:
            try:
                r = inbox.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if r is None:  # the last request: back for the outer loop to stop at
                inbox.put(None)
                break
            if sum(len(x) for x, _, _ in batch) + len(r[0]) > MAX_ROWS:
                held = r  # never split: it starts the next batch
                break
            batch.append(r)
        x = torch.cat([x for x, _, _ in batch]).to(device, torch.bfloat16)
        with torch.no_grad():
            logits = model(x)
        probs, classes = logits.softmax(-1).cpu(), logits.argmax(-1).cpu()
        fills.append(len(x) / MAX_ROWS)
        start = 0
        for x, submitted, answer in batch:
            answer.set_result((probs[start : start + len(x)], classes[start : start + len(x)]))
            latencies.append(time.monotonic() - submitted)
            start += len(x)

def client(seed, n):
    rng = random.Random(seed)
    for _ in range(n):
        answer = Future()
        inbox.put((torch.rand(rng.randint(1, 8), 512), time.monotonic(), answer))
        answer.result()

serving = threading.Thread(target=batcher)
serving.start()
clients = [threading.Thread(target=client, args=(c, 125)) for c in range(4)]
[c.start() for c in clients]
[c.join() for c in clients]
inbox.put(None)
serving.join()
latencies.sort()
print(f"{len(latencies)} requests, p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms, "
      f"p99 {latencies[len(latencies) * 99 // 100] * 1e3:.2f} ms, fill {sum(fills) / len(fills):.2f}")
