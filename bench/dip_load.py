"""dip_load.py RUN_DIR... : is a post-convergence dip preceded by a loaded machine?

For each run (its episodes.csv): the first 100-episode average >= 75, then every
dip (avg100 < 60 after it; onset = the last episode with avg100 >= 75 before
it), and the agent-step throughput over the 10 s before each onset as a multiple
of the run's median throughput over 10-s windows after convergence. A machine
shared with other jobs (CI, a benchmark) shows as windows well below the median."""
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stay_check import trailing_mean  # noqa: E402  (a sibling script)


def load(run):
    with open(os.path.join(run, "episodes.csv")) as fh:
        rows = list(csv.DictReader(fh))
    t = np.array([float(r["wall_time"]) for r in rows]); st = np.array([int(r["step"]) for r in rows])
    ret = np.array([float(r["return"]) for r in rows])
    return t, st, ret


if len(sys.argv) < 2:
    sys.exit(__doc__.split("\n")[0])
for run in sys.argv[1:]:
    if not os.path.isfile(os.path.join(run, "episodes.csv")):
        sys.exit(f"dip_load.py: no episodes.csv in {run}")
    t, st, ret = load(run)
    a = trailing_mean(ret, 100)
    idx = np.where((np.arange(len(ret)) >= 99) & (a >= 75))[0]
    if not len(idx): continue
    i0 = idx[0]; tc = t[i0]
    # throughput in 10 s windows after convergence (+30 s)
    edges = np.arange(tc + 30, t[-1], 10.0)
    sps = np.diff(np.interp(edges, t, st)) / 10.0
    med = np.median(sps)
    # dips: onset = last episode with avg100 >= 75 before avg100 < 60
    dips = []; k = i0
    while True:
        below = np.where(a[k:] < 60)[0]
        if not len(below): break
        j = k + below[0]
        on = j - 1
        while on > k and a[on] < 75: on -= 1
        tdip = t[on]
        if tdip > tc + 40:
            w = (np.interp(tdip, t, st) - np.interp(tdip - 10, t, st)) / 10.0
            dips.append((tdip, st[on], a[j:j+3000].min(), w / med))
        rec = np.where(a[j:] >= 75)[0]
        if not len(rec): break
        k = j + rec[0]
    frac_low = np.mean(sps / med < 0.75)
    print(f"{run}: conv {tc:.0f}s, median {med:.0f} steps/s, windows <0.75x median: {frac_low:.1%}")
    for d in dips:
        print(f"   dip at {d[0]:.0f}s step {d[1]} min avg100 {d[2]:.0f}: throughput 10s before = {d[3]:.2f}x median")
