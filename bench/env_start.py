"""How long a trainer's envs take to start, and what idle engines cost.

    python bench/env_start.py make [--n 8]                 # make_env("doom:basic") N times in a row
    python bench/env_start.py idle [--n 6] [--seconds 5]   # CPU of N engines while only the first steps
    python bench/env_start.py start --workers 2 --envs 4 [--cold] [--processes]

``start``: from the Trainer's construction to every worker's first update
(through ``a3c_core.bench._TrainerRun``, doom:basic, doom-lstm); ``--cold``
points ``NUMBA_CACHE_DIR`` at an empty folder first, so the warm-up
compiles (a first run); ``--processes`` with worker processes (each
starts its envs in parallel with the others: ViZDoom's init lock is per
process).  To compare two trees, run this script from a
directory that holds neither (e.g. ``cd /tmp``) with ``PYTHONPATH`` at
each: a compile helper started from inside a checkout once imported the
checkout (see bench/RESULTS.md, tenth session of 2026-11-26).
Linux only (``idle`` reads ``/proc``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def _children(pid):
    """Every descendant pid of ``pid`` (from /proc/*/stat)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])          # utime + stime


def _name(pid):
    with open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()


def cmd_make(a):
    from a3c_core.envs import make_env

    envs, ts = [], []
    for i in range(a.n):
        t = time.perf_counter()
        envs.append(make_env("doom:basic", seed=i))
        ts.append(time.perf_counter() - t)
    print("make_env('doom:basic') s: " + ", ".join(f"{t:.3f}" for t in ts)
          + f" (median {statistics.median(ts):.3f})")
    for e in envs:
        e.close()


def cmd_idle(a):
    from a3c_core.envs import make_env

    envs = [make_env("doom:basic", seed=i) for i in range(a.n)]
    for e in envs:
        e.reset()
    engines = [p for p in _children(os.getpid()) if _name(p) == "vizdoom"]
    before = {p: _cpu_ticks(p) for p in engines}
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < a.seconds:
        _, _, term, trunc = envs[0].step(0)
        steps += 1
        if term or trunc:
            envs[0].reset()
    dt = time.perf_counter() - t0
    hz = os.sysconf("SC_CLK_TCK")
    print(f"{steps} steps of engine 1 in {dt:.1f} s; CPU of each engine (pid order):")
    for p in engines:
        print(f"  pid {p}: {(_cpu_ticks(p) - before[p]) / hz / dt * 100:.1f} %")
    for e in envs:
        e.close()


def cmd_start(a):
    cold = tempfile.mkdtemp(prefix="a3c-cold-cache-") if a.cold else None
    if cold:
        os.environ["NUMBA_CACHE_DIR"] = cold
    try:
        _start(a)
    finally:
        if cold:
            shutil.rmtree(cold, ignore_errors=True)


def _start(a):
    import a3c_core
    from a3c_core import bench

    t1 = time.perf_counter()
    run = bench._TrainerRun("doom:basic", "doom-lstm", a.workers, envs_per_worker=a.envs,
                            processes=a.processes)
    t2 = time.perf_counter()
    run.start(0.0)
    t3 = time.perf_counter()
    run.stop()
    print(f"{os.path.dirname(os.path.dirname(a3c_core.__file__))} {a.workers} x {a.envs} envs"
          f"{' (empty cache)' if a.cold else ''}{', worker processes' if a.processes else ''}: "
          f"constructor {t2 - t1:.2f} s, then every worker "
          f"updating after {t3 - t2:.2f} s (the last {run.ramp_s:.2f} s after the first)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("--n", type=int, default=8)
    p = sub.add_parser("idle")
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--seconds", type=float, default=5.0)
    p = sub.add_parser("start")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs", type=int, default=1)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--processes", action="store_true")
    a = ap.parse_args(argv)
    if getattr(a, "n", 1) < 1 or getattr(a, "workers", 1) < 1 or not 1 <= getattr(a, "envs", 1) <= 64:
        ap.error("--n and --workers must be >= 1, --envs 1-64")
    {"make": cmd_make, "idle": cmd_idle, "start": cmd_start}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
