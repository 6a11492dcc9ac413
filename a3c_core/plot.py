"""``a3c plot``: learning curves of one or more run directories as one PNG.

Reads a run directory's ``episodes.csv`` (``episode,wall_time,step,worker,
return,length,end``; raw returns) and ``metrics.csv`` (``wall_time,step,name,
value``) and draws, against agent steps (left) and wall-clock seconds (right):
the episode returns (dots) with their moving average (line), then one row per
loss term (``losses/*``). Several runs are overlaid, one colour each. Reading
needs only numpy; drawing needs matplotlib (``pip install 'a3c_core[plot]'``).
"""
from __future__ import annotations

import csv
import os
import sys

import numpy as np

EPISODE_COLUMNS = ("episode", "wall_time", "step", "worker", "return", "length")
METRIC_COLUMNS = ("wall_time", "step", "name", "value")


class PlotError(Exception):
    """A run directory that cannot be plotted (missing or malformed CSV)."""


def _read_csv(path, needed):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise PlotError(f"{path}: missing column(s) {missing}; expected {','.join(needed)}")
        rows = []
        for row in reader:
            try:
                rows.append({c: (row[c] if c == "name" else float(row[c])) for c in needed})
            except (TypeError, ValueError):  # a torn last line of a killed run
                continue
    return rows


def read_run(run_dir) -> dict:
    """``{"episodes": {col: array}, "metrics": {name: (step, wall_time, value)}}`` of one run.

    Episodes are sorted by wall time (workers finish them interleaved).
    Raises :class:`PlotError` if the directory has neither CSV file.
    """
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise PlotError(f"run directory not found: {run_dir}")
    ep_path, m_path = os.path.join(run_dir, "episodes.csv"), os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(ep_path) and not os.path.exists(m_path):
        raise PlotError(f"{run_dir} is not a run directory (no episodes.csv or metrics.csv)")
    episodes = {c: np.zeros(0) for c in ("wall_time", "step", "return")}
    if os.path.exists(ep_path):
        rows = _read_csv(ep_path, ("wall_time", "step", "return"))
        episodes = {c: np.array([r[c] for r in rows], np.float64) for c in ("wall_time", "step", "return")}
        order = np.argsort(episodes["wall_time"], kind="stable")
        episodes = {k: v[order] for k, v in episodes.items()}
    metrics = {}
    if os.path.exists(m_path):
        for r in _read_csv(m_path, METRIC_COLUMNS):
            metrics.setdefault(r["name"], []).append((r["step"], r["wall_time"], r["value"]))
    metrics = {k: tuple(np.array(c, np.float64) for c in zip(*v)) for k, v in metrics.items()}
    return {"episodes": episodes, "metrics": metrics}


def moving_average(x, window):
    """Trailing mean over up to ``window`` values (fewer at the start); float64 ``(N,)``."""
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return x
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def add_arguments(p):
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories to overlay")
    p.add_argument("-o", "--out", default=None,
                   help="output PNG (default: RUN_DIR/learning_curve.png for one run, "
                        "learning_curve.png for several)")
    p.add_argument("--window", type=int, default=100,
                   help="moving-average window in episodes (default: 100)")
    p.add_argument("--labels", default=None, help="comma-separated legend labels (default: run directory names)")
    p.add_argument("--target", type=float, default=None,
                   help="draw a target reward line and report when the full-window average first reached it "
                        "(e.g. 75 for doom:basic; default: none)")
    p.add_argument("--title", default=None, help="figure title (default: 'A3C learning curves')")


def plot_runs(runs, out, *, window=100, labels=None, title=None, target=None):
    """Draw ``runs`` (list of :func:`read_run` results) into the PNG ``out``; returns ``out``."""
    # lazy: matplotlib is an optional extra ('a3c_core[plot]'), needed only to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or [f"run {i}" for i in range(len(runs))]
    loss_names = sorted({n for r in runs for n in r["metrics"] if n.startswith("losses/")})
    n_rows = 1 + len(loss_names)
    fig, axes = plt.subplots(n_rows, 2, figsize=(12, 3.2 * n_rows), squeeze=False, constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for k, (run, label) in enumerate(zip(runs, labels)):
        color = colors[k % len(colors)]
        ep = run["episodes"]
        ma = moving_average(ep["return"], window)
        for col, x in enumerate((ep["step"], ep["wall_time"])):
            ax = axes[0, col]
            ax.scatter(x, ep["return"], s=4, alpha=0.25, color=color, linewidths=0)
            ax.plot(x, ma, color=color, lw=1.5, label=f"{label} ({window}-episode avg)")
        for row, name in enumerate(loss_names, start=1):
            if name not in run["metrics"]:
                continue
            step, wall, value = run["metrics"][name]
            axes[row, 0].plot(step, value, color=color, lw=1.2, label=label)
            axes[row, 1].plot(wall, value, color=color, lw=1.2, label=label)
    for row in range(n_rows):
        for col, xl in enumerate(("agent steps", "wall-clock seconds")):
            ax = axes[row, col]
            ax.set_xlabel(xl)
            ax.set_ylabel("raw episode return" if row == 0 else loss_names[row - 1])
            ax.grid(alpha=0.3)
    if target is not None:
        for ax in axes[0]:
            ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
    axes[0, 0].legend(loc="best", fontsize="small")
    fig.suptitle(title or "A3C learning curves")
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run_plot(args) -> int:
    if args.window < 1:
        print("a3c plot: error: --window must be >= 1", file=sys.stderr)
        return 2
    names = [os.path.basename(os.path.normpath(r)) for r in args.runs]
    labels = args.labels.split(",") if args.labels else names
    if len(labels) != len(args.runs):
        print(f"a3c plot: error: --labels has {len(labels)} names for {len(args.runs)} runs", file=sys.stderr)
        return 2
    runs = []
    for path, label in zip(args.runs, labels):
        try:
            run = read_run(path)
        except (PlotError, OSError) as e:
            print(f"a3c plot: error: {e}", file=sys.stderr)
            return 2
        n = run["episodes"]["return"].size
        msg = f"{label}: {n} episodes"
        if n:
            ma = moving_average(run["episodes"]["return"], args.window)
            msg += f", final {min(args.window, n)}-episode average {ma[-1]:.2f}"
            if args.target is not None:
                ok = np.flatnonzero((ma >= args.target) & (np.arange(n) >= args.window - 1))
                msg += (f", reached {args.target:g} at {run['episodes']['wall_time'][ok[0]]:.0f} s / "
                        f"{run['episodes']['step'][ok[0]]:,.0f} steps" if ok.size
                        else f", did not reach {args.target:g}")
        print(msg)
        runs.append(run)
    try:
        import matplotlib  # noqa: F401  (lazy: an optional extra; checked before drawing)
    except ImportError:
        print("a3c plot: error: matplotlib is not installed; it is optional: "
              "pip install 'a3c_core[plot]'", file=sys.stderr)
        return 2
    out = args.out or (os.path.join(args.runs[0], "learning_curve.png") if len(args.runs) == 1
                       else "learning_curve.png")
    plot_runs(runs, out, window=args.window, labels=labels, title=args.title, target=args.target)
    print(f"wrote {out}")
    return 0
