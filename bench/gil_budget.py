"""An upper bound on the GIL a worker's own code holds per agent step, without a probe.

    python bench/gil_budget.py [--seconds 3] [--repeats 5] [--episode 40] [--json PATH]

The trainer's :class:`~a3c_core.train.worker.Worker` loop (recorded steps,
sampling, the observation pipeline, reward scaling, returns, the
backward-only update, the norm/Adam/sync tail, episode bookkeeping) runs
alone on one thread with the doom-lstm layer list shrunk until its
arithmetic is negligible (obs 1x20x20, fc 8, LSTM 8: ~9k MACs per step
against doom's 2.26M) and an env that does nothing (a fixed 20x20 frame,
``--episode``-step episodes).  What is left of each step's wall time is the
interpreter: the Python lines, the dispatch into each compiled call and
its return, all with the GIL held, plus the few remaining nogil
microseconds.  So µs per agent step here bounds from above the GIL that
a3c_core's worker code holds per step with the full network, since the
number and kind of calls do not depend on the layer sizes.  It leaves out
the env's own Python (``DoomEnv.step``'s wrapper and ViZDoom's GIL-held part;
see ``gil_parts.py``'s ``env`` row).

Unlike the probe of ``a3c bench`` and ``gil_parts.py``, this needs no
second thread and reads the same to a few percent run to run.  It times
both backward paths in alternation (``compiled``: one nogil call per layer,
``numpy``: ``np.dot`` and per-layer kernels, see ``a3c_core.nn.blas``),
with the paper's rollouts (up to 20 steps, cut at episode ends) and with
merged rollouts (``--min-rollout 10``, what the default switch does once
episodes are short).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def _stand_in_env(**kw):
    """``gil_parts._NoGilEnv`` (bench/gil_parts.py, beside this file), loaded
    by path so that neither script needs the other on ``sys.path``."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gil_parts.py")
    spec = importlib.util.spec_from_file_location("_a3c_bench_gil_parts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._NoGilEnv(**kw)


def make_worker(episode, min_steps=1, compiled=True):
    from a3c_core import core
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

    env = _stand_in_env(step_us=0.0, episode=episode, hw=(20, 20))   # no work at all
    pipe = ObsPipeline({"kind": "image", "out_shape": [20, 20]}, env.obs_shape)
    net = build_network("doom-lstm", pipe.net_obs_shape, env.n_actions, fc_size=8,
                        lstm_size=8)
    net.compiled_backward = compiled
    shared = core.SharedState(net.params.copy(), core.Adam(net.n_params, lr=1e-4))
    store = ThreadStore(shared, ReturnNormalizer(0.99), None, AdvantageNormalizer())
    s = RolloutSettings(t_max=20, gamma=0.99, bootstrap_truncated=False,
                        normalize_advantages=True, min_steps=min_steps)
    return Worker(0, env, net, pipe, store, s, np.random.default_rng(0))


def kernel_compute_us(worker, rollouts=40, target_s=0.02):
    """Per agent step: the compute of the Numba kernels that ``worker``'s
    loop calls, each timed from a compiled loop (no dispatch, no GIL).

    Every kernel call of ``rollouts`` rollouts is recorded (the module
    attributes the network, its layers and the worker call through are
    wrapped meanwhile, then restored), then each call is re-run from a
    ``njit`` loop over the same arguments.  Returns ``(us per step, {kernel:
    us per step})``."""
    from numba import njit
    from numba.core.dispatcher import Dispatcher

    import a3c_core.nn.kernels as K
    import a3c_core.train.worker as W

    calls, saved = [], []

    def wrap(mod, name, disp):
        def recording(*args):
            calls.append((name, disp, args))
            return disp(*args)
        saved.append((mod, name, disp))
        setattr(mod, name, recording)

    for mod in (K, W):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, Dispatcher):
                wrap(mod, name, obj)
    # the network keeps its backward's kernel calls once built: rebuilt now
    # they hold the recording wrappers, and afterwards the kernels again
    worker.net._bw_calls = {}
    try:
        steps = sum(worker.rollout()[0] for _ in range(rollouts))
    finally:
        for mod, name, disp in saved:
            setattr(mod, name, disp)
        worker.net._bw_calls = {}
    loops, per_call = {}, {}
    for name, disp, args in calls:
        key = (name, tuple(type(a).__name__ + str(getattr(a, "shape", "")) for a in args))
        if key in per_call:
            continue
        if disp not in loops:
            returns_number = isinstance(disp(*args), (bool, int, float, np.number))

            def make(f, acc):
                if acc:        # keep the results, so the calls cannot be optimized away
                    @njit(nogil=True)
                    def loop(n, args):
                        s = 0.0
                        for _ in range(n):
                            s += f(*args)
                        return s
                else:
                    @njit(nogil=True)
                    def loop(n, args):
                        for _ in range(n):
                            f(*args)
                        return 0.0
                return loop
            loops[disp] = make(disp, returns_number)
        loop = loops[disp]
        loop(1, args)
        n = 1
        while True:
            t0 = time.perf_counter()
            loop(n, args)
            dt = time.perf_counter() - t0
            if dt >= target_s or n >= 1 << 22:
                break
            n *= 4
        best = dt
        for _ in range(2):
            t0 = time.perf_counter()
            loop(n, args)
            best = min(best, time.perf_counter() - t0)
        per_call[key] = best / n * 1e6
    by_kernel = {}
    for name, disp, args in calls:
        key = (name, tuple(type(a).__name__ + str(getattr(a, "shape", "")) for a in args))
        by_kernel[name] = by_kernel.get(name, 0.0) + per_call[key] / steps
    return sum(by_kernel.values()), by_kernel


def us_per_step(worker, seconds):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        k, _, _, _ = worker.rollout()
        n += k
    return (time.perf_counter() - t0) * 1e6 / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per sample (default 3)")
    ap.add_argument("--repeats", type=int, default=5, help="samples per path (default 5)")
    ap.add_argument("--episode", type=int, default=40, help="episode length (default 40)")
    ap.add_argument("--json", default=None, help="also write the samples as JSON")
    a = ap.parse_args(argv)

    from a3c_core._blas import limit_blas_threads
    from a3c_core.nn import blas

    limit_blas_threads(1)
    paths = {}
    for rollouts, min_steps in (("paper", 1), ("merged", 10)):
        for bw in ("compiled", "numpy"):
            if bw == "compiled" and blas.gemm_handle() is None:
                continue
            paths[f"{bw}, {rollouts}"] = make_worker(a.episode, min_steps, bw == "compiled")
    for w in paths.values():          # compile / load, then settle
        us_per_step(w, 0.3)
    samples = {k: [] for k in paths}
    for _ in range(a.repeats):
        for k, w in paths.items():
            samples[k].append(us_per_step(w, a.seconds))
    print(f"episodes of {a.episode} steps; us per agent step, median (min-max) of "
          f"{a.repeats} x {a.seconds:g} s, interleaved")
    for k, v in samples.items():
        print(f"  {k:20s} {statistics.median(v):7.2f}  ({min(v):.2f}-{max(v):.2f})")
    for rollouts in ("paper", "merged"):
        c, n = samples.get(f"compiled, {rollouts}"), samples.get(f"numpy, {rollouts}")
        if c and n:
            ratio = statistics.median(b / x for x, b in zip(c, n))
            print(f"  numpy / compiled, {rollouts}: {ratio:.2f}x (median of interleaved pairs)")
    compute = {}
    for k, w in paths.items():
        compute[k], parts = kernel_compute_us(w)
    print("less the Numba kernels' own compute (each timed from a compiled loop):")
    est = {}
    for k, v in samples.items():
        est[k] = statistics.median(v) - compute[k]
        print(f"  {k:20s} {est[k]:7.2f}  (kernels {compute[k]:.2f} us per step)")
    print("  kernels, compiled paper path: " + ", ".join(
        f"{n} {u:.2f}" for n, u in sorted(kernel_compute_us(paths[next(iter(paths))])[1].items(),
                                           key=lambda kv: -kv[1])))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"episode": a.episode, "seconds": a.seconds, "samples": samples,
                       "kernel_compute_us": compute, "estimate_us": est}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
