"""PyTorch eager beside examples/gpt.rs: the same GPT-2-shaped decoder
(tests/fixtures/make_gpt_reference.py's model), a prefill of BATCH prompts of PROMPT
tokens (the last positions' logits) and NEW greedy steps over the KV caches (argmax on the
device, fed back in), in float32 and bfloat16; medians of RUNS after a warm-up, wall clock
around each phase with the device synchronised (CUDA) at both ends.

  python3 benches/pytorch/gpt_bench.py cuda /tmp/gpt2s.safetensors [layers dim heads vocab ctx batch prompt new]

writes the model's f32 weights (PyTorch's default initialisation, seed 0) to the file
given, for `examples/gpt.rs -weights FILE -heads H -batch B -prompt P -new N` to run the
same model; the defaults are GPT-2 small's shape (12 x 768, 12 heads, 50257 tokens, 1024
positions) with 8 prompts of 128 tokens and 32 new."""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures"))
from make_gpt_reference import Gpt, save, weights_of  # noqa: E402

RUNS = 5


def main():
    device, path = sys.argv[1], sys.argv[2]
    layers, dim, heads, vocab, ctx, batch, prompt, new = (
        [int(a) for a in sys.argv[3:11]] or [12, 768, 12, 50257, 1024, 8, 128, 32])
    torch.manual_seed(0)
    with torch.inference_mode():
        model = Gpt(vocab, ctx, dim, heads, layers).eval()
        save(path, weights_of(model))
        prompts = (torch.arange(batch * prompt) * 7 + 3).remainder(vocab).view(batch, prompt).to(device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        print(f"torch {torch.__version__} on {device} ({torch.get_num_threads()} threads): {layers} blocks x {dim}, "
              f"{heads} heads, vocabulary {vocab}; {batch} prompts of {prompt} tokens, {new} new")
        print("| dtype | prefill ms | decoding tokens/s |\n| --- | --- | --- |")
        for dtype in (torch.float32, torch.bfloat16):
            m = model.to(device=device, dtype=dtype)
            pre, dec = [], []
            for run in range(RUNS + 1):
                caches = m.caches(batch, dtype, device)
                sync()
                t = time.perf_counter()
                last = m(prompts, caches, 0, last_only=True)[:, -1]
                sync()
                t1 = time.perf_counter()
                for s in range(new):
                    nxt = last.argmax(-1)
                    last = m(nxt[:, None], caches, prompt + s)[:, -1]
                sync()
                t2 = time.perf_counter()
                if run > 0:
                    pre.append(t1 - t)
                    dec.append(t2 - t1)
            p, d = statistics.median(pre), statistics.median(dec)
            print(f"| {str(dtype).replace('torch.', '')} | {p * 1e3:.2f} | {batch * new / d:.0f} |")


if __name__ == "__main__":
    main()
