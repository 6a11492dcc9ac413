"""What K envs per worker could save in compute: the batched forward over K
rows against K batch-1 steps, per agent step.

    python bench/batched_forward.py [--ks 1,2,4,8] [--reps 7] [--min-time 0.05]

The proxy is ``Network.record_rollout`` on K rows (doom-lstm, one BLAS
thread): conv and fc batched over the K rows, the LSTM still K steps, so it
overstates what a K-env batch would cost. The step row is ``net.step``
(the worker's single fused kernel). Each figure is the median of ``--reps``
timings (``a3c_core.bench.time_call``: after warm-up calls, each timing a
batch of calls lasting ``--min-time`` s or more). Never run it beside a
training run.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def _median_us(fn, reps, min_time):
    from a3c_core.bench import time_call

    return statistics.median(time_call(fn, repeat=reps, min_time=min_time)) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.05)
    a = ap.parse_args(argv)
    try:
        ks = [int(k) for k in a.ks.split(",")]
    except ValueError:
        ap.error(f"--ks must be comma-separated integers, got {a.ks!r}")
    if not ks or min(ks) < 1 or a.reps < 1 or not a.min_time > 0:
        ap.error("--ks values and --reps must be >= 1, --min-time > 0")

    from a3c_core._blas import limit_blas_threads
    from a3c_core.nn.network import build_network

    limit_blas_threads(1)
    net = build_network("doom-lstm", (1, 84, 84), 3)
    net.single_step_kernel = True
    obs = np.random.default_rng(0).standard_normal((max(ks), 1, 84, 84)).astype(np.float32)
    st = net.initial_state()
    step = _median_us(lambda: net.step(obs[0], st), a.reps, a.min_time)
    print(f"batch-1 step: {step:.1f} us")
    print(f"{'K':>3} {'batched us':>11} {'us/agent step':>14} {'vs step':>8}")
    for k in ks:
        def rec(k=k):
            net.begin_rollout(k)
            net.record_rollout(obs[:k], st)
        t = _median_us(rec, a.reps, a.min_time)
        print(f"{k:3d} {t:11.1f} {t / k:14.1f} {t / k / step:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
