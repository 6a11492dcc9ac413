"""Plot learning curves of one or more training runs.

Reads each run directory's ``episodes.csv`` (columns
``episode,wall_time,step,worker,return,length``; raw, unscaled returns) and
writes one PNG with two panels: the moving average (default 100 episodes) of
the raw episode reward versus wall-clock seconds, and versus agent steps.
Episodes are ordered by wall time (workers finish them interleaved).

Usage::

    python bench/plot_learning_curve.py RUN_DIR [RUN_DIR ...] [-o curve.png]
        [--window 100] [--target 75] [--labels w1,w2]

e.g. ``python bench/plot_learning_curve.py runs/doom_basic-* -o basic.png
--target 75``.  A run directory or the ``episodes.csv`` path itself may be
given.  Needs matplotlib (optional: ``pip install matplotlib``); without it
the script says so and exits with status 2.  The summary printed per run
(episodes, final moving average, first time/step the average reached
``--target``) needs only numpy.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

COLUMNS = ("episode", "wall_time", "step", "worker", "return", "length")


def read_episodes(path):
    """``{column: array}`` from a run dir or an ``episodes.csv``, sorted by wall time."""
    if os.path.isdir(path):
        path = os.path.join(path, "episodes.csv")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no episodes.csv at {path}")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("wall_time", "step", "return") if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected {','.join(COLUMNS)}")
        rows = list(reader)
    data = {c: np.array([float(r[c]) for r in rows]) for c in ("wall_time", "step", "return")}
    order = np.argsort(data["wall_time"], kind="stable")
    return {k: v[order] for k, v in data.items()}


def moving_average(x, window):
    """Trailing mean over up to ``window`` values (shorter at the start)."""
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return x
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def first_reach(ma, xs, target, window):
    """x at which a full-window moving average first reaches ``target`` (or None)."""
    ok = np.nonzero((ma >= target) & (np.arange(ma.size) >= window - 1))[0]
    return None if ok.size == 0 else float(xs[ok[0]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Plot the moving-average raw reward of runs vs "
                                             "wall-clock seconds and vs agent steps.")
    ap.add_argument("runs", nargs="+", help="run directories (or episodes.csv files)")
    ap.add_argument("-o", "--out", default="learning_curve.png", help="output PNG (default learning_curve.png)")
    ap.add_argument("--window", type=int, default=100, help="moving-average window in episodes (default 100)")
    ap.add_argument("--target", type=float, default=None, help="draw a target line (e.g. 75 for doom:basic)")
    ap.add_argument("--labels", default=None, help="comma-separated legend labels (default: run dir names)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if args.window < 1:
        ap.error("--window must be >= 1")
    labels = args.labels.split(",") if args.labels else [
        os.path.basename(os.path.normpath(r if os.path.isdir(r) else os.path.dirname(r) or r)) for r in args.runs]
    if len(labels) != len(args.runs):
        ap.error(f"--labels has {len(labels)} names for {len(args.runs)} runs")

    curves = []
    for run, label in zip(args.runs, labels):
        try:
            d = read_episodes(run)
        except (OSError, ValueError) as e:
            print(f"plot_learning_curve: error: {e}", file=sys.stderr)
            return 1
        ma = moving_average(d["return"], args.window)
        curves.append((label, d, ma))
        msg = f"{label}: {ma.size} episodes"
        if ma.size:
            msg += f", final {min(args.window, ma.size)}-episode average {ma[-1]:.2f}"
        if args.target is not None and ma.size:
            t = first_reach(ma, d["wall_time"], args.target, args.window)
            s = first_reach(ma, d["step"], args.target, args.window)
            msg += (f", reached {args.target:g} at {t:.0f} s / {s:,.0f} steps" if t is not None
                    else f", did not reach {args.target:g}")
        print(msg)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_learning_curve: matplotlib is not installed (optional); "
              "pip install matplotlib  to write the PNG", file=sys.stderr)
        return 2

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for label, d, ma in curves:
        ax_t.plot(d["wall_time"], ma, label=label, lw=1.5)
        ax_s.plot(d["step"], ma, label=label, lw=1.5)
    for ax, xl in ((ax_t, "wall-clock seconds"), (ax_s, "agent steps")):
        if args.target is not None:
            ax.axhline(args.target, color="gray", ls="--", lw=1, label=f"target {args.target:g}")
        ax.set_xlabel(xl)
        ax.set_ylabel(f"{args.window}-episode moving average of raw reward")
        ax.grid(alpha=0.3)
    ax_s.legend(loc="lower right", fontsize="small")
    fig.suptitle(args.title or "A3C learning curve")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    plt.close(fig)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
