# Where a host device's time between kernels goes, from a lab build's log of its worker's
# jobs (lines "LAB <thread> <quick> <start ns> <end ns> <involuntary switches> <voluntary>
# <kind>" on stderr when OFFLOAD_LAB is set; see scripts/gpu/memcheck-and-bound.sh), for
# the demo's one-device phase and its multi-device phase:
#   python3 scripts/gpu/job_gaps.py run.log
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 8 and p[0] == "LAB":
        rows.setdefault(p[1], []).append((p[2] == "1", int(p[3]) / 1e3, int(p[4]) / 1e3, int(p[5]), p[7]))
if len(rows) < 2:
    sys.exit("no multi-device phase in the log")
# The multi-device phase starts with the second device's first kernel.
second = sorted(rows)[1]
start = min(j[1] for j in rows[second] if j[4] == "kernel") - 100
def phase(jobs, label):
    ks = [i for i, j in enumerate(jobs) if j[4] == "kernel"]
    if len(ks) < 3:
        return
    gaps = [jobs[ks[i + 1]][1] - jobs[ks[i]][2] for i in range(len(ks) - 1)]
    kern = [jobs[k][2] - jobs[k][1] for k in ks]
    kinds = {}
    for i in range(len(ks) - 1):
        for k in range(ks[i] + 1, ks[i + 1]):
            kinds.setdefault(jobs[k][4], []).append(jobs[k][2] - jobs[k][1])
    per = ", ".join(f"{k} {len(v) / (len(ks) - 1):.1f} x {st.median(v):.1f} us" for k, v in sorted(kinds.items()))
    print(f"{label}: {len(ks)} kernels, kernel median {st.median(kern):.0f} us, gap median {st.median(gaps):.0f} us "
          f"(mean {st.mean(gaps):.0f}); between kernels: {per}")
for name in sorted(rows):
    jobs = rows[name]
    phase([j for j in jobs if j[1] < start], f"{name}, alone")
    phase([j for j in jobs if j[1] >= start], f"{name}, beside the others")
