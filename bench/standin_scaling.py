"""Training throughput of N worker threads on a stand-in env (no ViZDoom).

    python bench/standin_scaling.py [--workers 1,2,4,8,16] [--seconds 8] [--step-us 250]

Each thread runs the trainer's :class:`~a3c_core.train.worker.Worker` (doom-lstm,
the default rollout settings) against ``gil_parts._NoGilEnv``: a stand-in for
doom:basic that spins ``--step-us`` in a ``nogil`` kernel per step and returns a
fixed frame, so there is no env process and no env GIL time.  All workers share
one :class:`~a3c_core.core.SharedState` (Adam, Hogwild) and one store, as in
training; worker i is pinned to core i mod cores, as the trainer pins it.

Beside ``a3c bench``'s end-to-end rows (real ViZDoom) this separates what
happens inside the process (the GIL, the shared parameters' cache and memory
traffic) from the env processes: if the stand-in's steps/s also fall past
some N, the decline is in-process.  Prints steps/s and the speed-up over one
worker per N.  Never run it beside a training run.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np


def run(n, seconds, warmup, step_us):
    from a3c_core import core
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker
    from gil_parts import _NoGilEnv

    envs = [_NoGilEnv(step_us=step_us) for _ in range(n)]
    pipes = [ObsPipeline({"kind": "image", "out_shape": (84, 84)}, envs[0].obs_shape) for _ in range(n)]
    nets = [build_network("doom-lstm", pipes[0].net_obs_shape, envs[0].n_actions) for _ in range(n)]
    shared = core.SharedState(nets[0].params.copy(), core.Adam(nets[0].n_params, lr=1e-4))
    store = ThreadStore(shared, ReturnNormalizer(0.99), None, AdvantageNormalizer())
    s = RolloutSettings(t_max=20, gamma=0.99, bootstrap_truncated=False, normalize_advantages=True)
    workers = [Worker(i, envs[i], nets[i], pipes[i], store, s, np.random.default_rng(i))
               for i in range(n)]
    counts = [0] * n
    stop = threading.Event()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def loop(i):
        if cores:
            os.sched_setaffinity(0, {cores[i % len(cores)]})
        w = workers[i]
        while not stop.is_set():
            counts[i] += w.rollout()[0]

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    c0, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    rate = (sum(counts) - c0) / (time.perf_counter() - t0)
    stop.set()
    for t in threads:
        t.join()
    return rate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--step-us", type=float, default=250.0, help="stand-in env step, us")
    a = ap.parse_args(argv)
    try:
        ns = [int(x) for x in a.workers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workers: comma-separated integers, got {a.workers!r}")
    if not ns or min(ns) < 1:
        ap.error("--workers: at least one count, each >= 1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from a3c_core._blas import limit_blas_threads

    limit_blas_threads(1)
    run(1, 0.5, 0.5, a.step_us)          # compile before anything is timed
    base = None
    print(f"{'workers':>7s} {'steps/s':>9s} {'speed-up':>9s}")
    for n in ns:
        r = run(n, a.seconds, a.warmup, a.step_us)
        base = base or (r if n == 1 else None)
        sp = f"{r / base:8.2f}x" if base else "        -"
        print(f"{n:7d} {r:9.0f} {sp}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
