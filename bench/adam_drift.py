"""Does Adam keep moving the weights after the agent has converged?

    python bench/adam_drift.py RUN_DIR [--threshold 75] [CHECKPOINT.npz ...]

Adam's step is ``lr * m_hat / (sqrt(v_hat) + eps)``: it does not shrink with
the gradient.  Once a policy has converged its gradients are mostly noise and
``sqrt(v_hat)`` follows them down, so with a small ``eps`` the weights keep
random-walking at a rate set by ``lr`` alone.  This prints, from the run's
``metrics.csv`` (``optim/param_change_rms`` and friends, logged every
second), the medians of each phase: before the 100-episode average first
reaches ``--threshold`` and after it.  ``walk`` is the parameter change over
one log interval divided by sqrt(applies in it), in units of lr: about 1 for
an Adam random walk on pure noise whatever the gradient's size, and falling
with the gradient for a step that scales with it (SGD, or Adam once ``eps``
dominates ``sqrt(v_hat)``).

Given checkpoints (``.npz`` with the optimizer's moments), it also prints the
quantiles of the per-element ``sqrt(v_hat)`` of each tensor: where ``eps``
stands against them says which weights Adam treats as scale-free.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stay_check import trailing_mean  # noqa: E402  (a sibling script)


def read_metrics(path):
    rows = collections.defaultdict(list)        # name -> [(wall, step, value)]
    with open(path) as fh:
        for r in csv.DictReader(fh):
            rows[r["name"]].append((float(r["wall_time"]), int(r["step"]), float(r["value"])))
    return rows


def crossing_time(run_dir, threshold):
    """Wall time at which the 100-episode average of raw returns first reaches
    ``threshold`` (over full windows, as bench/stay_check.py counts it)."""
    with open(os.path.join(run_dir, "episodes.csv")) as fh:
        rows = list(csv.DictReader(fh))
    t = np.array([float(r["wall_time"]) for r in rows])
    ret = np.array([float(r["return"]) for r in rows])
    hit = np.flatnonzero((np.arange(len(ret)) >= 99) & (trailing_mean(ret, 100) >= threshold))
    return float(t[hit[0]]) if hit.size else None


def phase_table(rows, t_cross):
    change = {w: v for w, _, v in rows.get("optim/param_change_rms", [])}
    per_apply = {w: v for w, _, v in rows.get("optim/param_change_per_apply", [])}
    walk = {}
    for w, c in change.items():
        p = per_apply.get(w)
        if p and p > 0:
            n = c / p                                   # applies in the interval
            walk[w] = c / math.sqrt(n)
    series = {
        "grad_norm": {w: v for w, _, v in rows.get("losses/grad_norm", [])},
        "sqrt(mean v_hat)": {w: v for w, _, v in rows.get("optim/adam_denominator_rms", [])},
        "update_rms (lr)": {w: v for w, _, v in rows.get("optim/adam_update_rms", [])},
        "change/s (lr)": change,
        "walk (lr)": walk,
        "entropy": {w: v for w, _, v in rows.get("losses/entropy", [])},
    }
    out = []
    for name, s in series.items():
        if not s:
            continue
        ws = np.array(sorted(s))
        vs = np.array([s[w] for w in ws])
        if t_cross is None:
            out.append((name, float(np.median(vs)), None))
        else:
            before, after = vs[ws < t_cross], vs[ws >= t_cross + 30]   # 30 s to settle
            out.append((name, float(np.median(before)) if before.size else None,
                        float(np.median(after)) if after.size else None))
    return out


def vhat_quantiles(path):
    z = np.load(path)
    meta = json.loads(bytes(z["meta"]).decode())
    sc = meta["optimizer_scalars"]
    t = max(int(sc["step"]), 1)
    bc2 = 1.0 / (1.0 - float(sc["beta2"]) ** t)
    v = np.sqrt(z["opt/exp_avg_sq"].astype(np.float64) * bc2)
    out, lo = [], 0
    for name, shape in meta["layout"]:
        n = int(np.prod(shape))
        q = np.quantile(v[lo:lo + n], [0.1, 0.5, 0.9])
        out.append((name, n, *q))
        lo += n
    return meta["counters"]["steps"], float(sc["eps"]), out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("checkpoints", nargs="*")
    p.add_argument("--threshold", type=float, default=75.0)
    a = p.parse_args(argv)
    path = os.path.join(a.run_dir, "metrics.csv")
    if not os.path.isfile(path):
        p.error(f"no metrics.csv in {a.run_dir}")
    rows = read_metrics(path)
    t_cross = crossing_time(a.run_dir, a.threshold)
    print(f"{a.run_dir}: avg100 first >= {a.threshold:g} at "
          + ("never" if t_cross is None else f"{t_cross:.0f} s"))
    print(f"| {'median per second':<18} | {'before':>10} | {'after (+30 s)':>13} |")
    print(f"|{'-' * 20}|{'-' * 12}:|{'-' * 15}:|")
    fmt = lambda x: "" if x is None else f"{x:.4g}"           # noqa: E731
    for name, b, af in phase_table(rows, t_cross):
        print(f"| {name:<18} | {fmt(b):>10} | {fmt(af):>13} |")
    for ck in a.checkpoints:
        steps, eps, q = vhat_quantiles(ck)
        print(f"\n{os.path.basename(ck)}: step {steps:,}, eps {eps:g}; sqrt(v_hat) quantiles 10/50/90 %")
        for name, n, q10, q50, q90 in q:
            print(f"  {name:<16} {n:>9,}  {q10:.2e}  {q50:.2e}  {q90:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
