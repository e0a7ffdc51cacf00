#!/usr/bin/env python3
"""The table of one program of the ports bench (scripts/gpu/ports.sh): reads the logs of its
CUDA, OpenMP and port runs, prints time per iteration (or per run) of each (median of the
runs, and the spread), port / CUDA, OpenMP / port, and the outputs compared.

    ports_table.py NAME LOGS WORK RUNS
"""
import re
import statistics
import sys

name, logs, work, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
VERSIONS = ("cuda", "omp", "port")
LABEL = {"cuda": "CUDA by hand", "omp": "OpenMP (clang-22, libomptarget 22)", "port": "Rust port"}
FLOAT = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"


def read(v, r):
    try:
        return open(f"{logs}/{name}-{v}-{r}.log", errors="replace").read()
    except OSError:
        return ""


def timing(text):
    """Seconds per iteration (jacobi, laplace) or per run (ace), and what the output says."""
    if name == "jacobi":
        m = re.search(r"Average execution time per iteration: " + FLOAT, text)
        t = float(m.group(1)) if m else None
        lines = {int(k): float(x) for k, x in re.findall(r"Error after iteration (\d+) = " + FLOAT, text)}
        return t, {"lines": lines, "pass": "PASS" if "PASS" in text else "FAIL"}
    if name == "laplace":
        m = re.search(r"Total time for (\d+) iterations: " + FLOAT + " s", text)
        t = float(m.group(2)) / int(m.group(1)) if m else None
        lines = {int(k): float(x) for k, x in re.findall(r"^\s*(\d+), " + FLOAT + r"\s*$", text, re.M)}
        verdict = "PASS" if "PASS" in text else "not run" if "reference not run" in text else "FAIL"
        return t, {"iterations": int(m.group(1)) if m else None, "lines": lines, "pass": verdict}
    if name == "ace":
        m = re.search(r"Total kernel execution time: " + FLOAT + r" \(ms\)", text)
        c = re.search(r"checksum: phi " + FLOAT + " u " + FLOAT, text)
        return (float(m.group(1)) / 1e3 if m else None), {
            "phi": float(c.group(1)) if c else None,
            "u": float(c.group(2)) if c else None,
        }
    raise SystemExit(f"unknown program {name}")


times, outs = {}, {}
for v in VERSIONS:
    ts = []
    for r in range(1, runs + 1):
        t, o = timing(read(v, r))
        if t is not None:
            ts.append(t)
            outs[v] = o
    times[v] = ts

unit, scale = ("ms per run", 1e3) if name == "ace" else ("us per iteration", 1e6)


def cell(v):
    ts = times[v]
    if not ts:
        return "failed (see its log)"
    med = statistics.median(ts) * scale
    return f"{med:.1f} ({min(ts) * scale:.1f}-{max(ts) * scale:.1f})"


def ratio(a, b):
    if not times[a] or not times[b]:
        return "-"
    return f"{statistics.median(times[a]) / statistics.median(times[b]):.2f}x"


def close(a, b, rel):
    return a is not None and b is not None and abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def compare():
    """One line per comparison of the port's and the OpenMP original's output with CUDA's."""
    res = []
    base = outs.get("cuda")
    if base is None:
        return ["no CUDA output to compare with"]
    for v in ("omp", "port"):
        o = outs.get(v)
        if o is None:
            res.append(f"{v}: no output")
            continue
        if name in ("jacobi", "laplace"):
            keys = sorted(set(base["lines"]) | set(o["lines"]))
            worst = max((abs(base["lines"].get(k, float("inf")) - o["lines"].get(k, float("-inf")))
                         / max(abs(base["lines"].get(k, 0.0)), 1e-30) for k in keys), default=0.0)
            same = set(base["lines"]) == set(o["lines"])
            res.append(f"{v} vs cuda: progress lines {'same iterations' if same else 'DIFFERENT iterations'} "
                       f"({len(o['lines'])}), largest relative difference {worst:.2e}; its check {o['pass']} (cuda's {base['pass']})")
            if name == "laplace":
                res.append(f"{v} vs cuda: iterations {o['iterations']} vs {base['iterations']}; "
                           f"temperature.dat {datfile(v)}")
        else:
            ok = close(base["phi"], o["phi"], 1e-9) and close(base["u"], o["u"], 1e-9)
            res.append(f"{v} vs cuda: phi sum {o['phi']:.9e} vs {base['phi']:.9e}, u sum {o['u']:.9e} vs "
                       f"{base['u']:.9e}: {'same within 1e-9' if ok else 'DIFFERENT'}")
    return res


def datfile(v):
    def load(p):
        try:
            with open(p) as f:
                return [float(l.split()[2]) for l in f if l.strip() and not l.startswith("#")]
        except OSError:
            return None
    a, b = load(f"{work}/{name}-cuda.dat"), load(f"{work}/{name}-{v}.dat")
    if a is None or b is None:
        return "missing"
    if len(a) != len(b):
        return f"DIFFERENT sizes ({len(b)} vs {len(a)} cells)"
    d = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    return f"max |difference| {d:.2e} over {len(a)} cells ({'within 1e-4' if d <= 1e-4 else 'OVER 1e-4'})"


print(f"\n### {name}: {unit}, median of {runs} runs (min-max)\n")
print("| CUDA by hand | OpenMP original (libomptarget 22) | Rust port | port / CUDA | OpenMP / port |")
print("| --- | --- | --- | --- | --- |")
print(f"| {cell('cuda')} | {cell('omp')} | {cell('port')} | {ratio('port', 'cuda')} | {ratio('omp', 'port')} |\n")
for line in compare():
    print(f"- {line}")
print()
