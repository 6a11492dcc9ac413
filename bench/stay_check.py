"""Does a trained run stay learned?  Reads a run's ``episodes.csv``.

    python bench/stay_check.py RUN_DIR [--threshold 75] [--floor 70]

Prints where the 100-episode average first reaches ``--threshold`` (wall
time, agent step, episode), the lowest 1,000-episode average after that
(over windows that still hold episodes from before the crossing, and over
windows that lie entirely after it), the lowest 100-episode average after
it, the final and best 1,000-episode averages, and how many episodes after
the crossing end with the 1,000-episode average below ``--floor``, and the
dips: separate stretches after the crossing in which the 100-episode average
is below ``--dip`` (how many, their lowest points and agent steps).  These
are the figures of bench/RESULTS.md's "stay learned" tables.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np


def trailing_mean(x, n):
    """Mean of the last ``n`` values at each index (fewer at the start)."""
    c = np.concatenate(([0.0], np.cumsum(x)))
    k = np.arange(len(x))
    lo = np.maximum(0, k + 1 - n)
    return (c[k + 1] - c[lo]) / (k + 1 - lo)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--threshold", type=float, default=75.0)
    p.add_argument("--floor", type=float, default=70.0)
    p.add_argument("--dip", type=float, default=50.0,
                   help="a dip: a stretch after the crossing with avg100 below this (default 50)")
    a = p.parse_args(argv)
    path = os.path.join(a.run_dir, "episodes.csv")
    if not os.path.isfile(path):
        p.error(f"no episodes.csv in {a.run_dir}")
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        p.error(f"{path} holds no episodes")
    t = np.array([float(r["wall_time"]) for r in rows])
    step = np.array([int(r["step"]) for r in rows])
    ret = np.array([float(r["return"]) for r in rows])
    a100, a1000 = trailing_mean(ret, 100), trailing_mean(ret, 1000)
    print(f"{a.run_dir}: {len(ret)} episodes, {step[-1]} steps, {t[-1]:.1f} s")
    hit = np.flatnonzero((np.arange(len(ret)) >= 99) & (a100 >= a.threshold))
    if hit.size == 0:
        print(f"  avg100 never reached {a.threshold}; final avg100 {a100[-1]:.2f}, "
              f"avg1000 {a1000[-1]:.2f}")
        return 0
    i = int(hit[0])
    print(f"  avg100 >= {a.threshold} first at {t[i]:.1f} s, step {step[i]}, episode {i + 1}")
    j = i + int(np.argmin(a1000[i:]))
    after = a1000[i + 1000:]
    full = f"{after.min():.2f}" if after.size else "n/a (fewer than 1,000 episodes after it)"
    print(f"  min avg1000 from the crossing: {a1000[j]:.2f} at {t[j]:.1f} s (step {step[j]}); "
          f"over windows entirely after it: {full}")
    k = i + int(np.argmin(a100[i:]))
    print(f"  min avg100 after the crossing: {a100[k]:.2f} at {t[k]:.1f} s")
    best = f"{a1000[999:].max():.2f}" if len(ret) >= 1000 else "n/a"
    print(f"  final avg100 {a100[-1]:.2f}, avg1000 {a1000[-1]:.2f}; best avg1000 {best}")
    below = np.flatnonzero(a1000[i:] < a.floor)
    first = f", the first at {t[i + below[0]]:.1f} s" if below.size else ""
    print(f"  episodes after the crossing with avg1000 < {a.floor}: {below.size}{first}")
    dips = dip_stretches(a100[i:], a.dip)
    post = step[-1] - step[i]
    desc = "; ".join(f"{a100[i + lo:i + hi].min():.1f} at step {step[i + lo + int(np.argmin(a100[i + lo:i + hi]))]}"
                     for lo, hi in dips)
    print(f"  dips (avg100 < {a.dip}) after the crossing: {len(dips)} in {post} steps"
          + (f": {desc}" if dips else ""))
    return 0


def dip_stretches(x, level, merge=100):
    """``[(lo, hi), ...]``: the maximal index runs with ``x < level``, runs
    fewer than ``merge`` indices apart joined into one (an average that
    wavers around ``level`` is one dip, not several)."""
    below = np.concatenate(([False], np.asarray(x) < level, [False]))
    edges = np.flatnonzero(np.diff(below.astype(np.int8)))
    out = []
    for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist()):
        if out and lo - out[-1][1] < merge:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


if __name__ == "__main__":
    sys.exit(main())
