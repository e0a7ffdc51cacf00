# Kernel time per device in an OFFLOAD_TRACE file, and how long two devices ran kernels at
# once: python3 scripts/gpu/kernel_overlap.py run.json (issue 45: two host devices in lockstep).
import json, sys
d = json.load(open(sys.argv[1]))
ev = [e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
by = {}
for e in ev:
    by.setdefault(e["pid"], []).append((e["ts"], e["ts"] + e["dur"]))
def union(s):
    s = sorted(s); out = []
    for a, b in s:
        if out and a <= out[-1][1]: out[-1][1] = max(out[-1][1], b)
        else: out.append([a, b])
    return out
def total(u): return sum(b - a for a, b in u)
us = {p: union(s) for p, s in by.items()}
for p, u in us.items(): print("pid", p, "kernels", len(by[p]), "busy us", round(total(u)), "median kernel us", sorted(b-a for a,b in by[p])[len(by[p])//2])
ps = list(us)
if len(ps) == 2:
    a, b = us[ps[0]], us[ps[1]]
    inter = 0; i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0]); hi = min(a[i][1], b[j][1])
        if hi > lo: inter += hi - lo
        if a[i][1] < b[j][1]: i += 1
        else: j += 1
    allu = union(a + b)
    print("both busy us", round(inter), "either busy us", round(total(allu)), "span us", round(allu[-1][1] - allu[0][0]))
