"""Training throughput of N worker threads on a stand-in env (no ViZDoom).

    python bench/standin_scaling.py [--workers 1,2,4,8,16] [--seconds 8] [--step-us 250]
                                    [--mode threads,processes] [--env doom:basic]
                                    [--envs-per-worker K]

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

``--mode processes`` runs the same N workers as N forked processes, each
with its own GIL: the shared parameters and Adam's two moment arrays are
one ``MAP_SHARED`` mapping that every process updates in place (Hogwild
across processes, as threads do in one), while each process keeps its own
normalizers, counters and Adam step count (throughput only: these are not
what training would share).  Threads against processes at the same N is
what the GIL costs at N; what both lose against N times one worker is the
machine (memory traffic, shared cores).  ``--mode threads,processes``
alternates the two at each N.  ``--env doom:basic`` plays the real env
(one engine process per env, started on its worker's core) and
``--envs-per-worker K`` gives each worker K envs, as the trainer's option.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np


def _shared_state(net):
    from a3c_core import core
    return core.SharedState(net.params.copy(), core.Adam(net.n_params, lr=1e-4))


def _worker(i, shared, step_us, env_id=None, n_envs=1):
    """Worker ``i`` on ``n_envs`` stand-in envs (``env_id`` None) or real
    ones, on ``shared`` (None: its own)."""
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker
    from gil_parts import _NoGilEnv

    envs = []
    try:
        for j in range(n_envs):
            if env_id is None:
                envs.append(_NoGilEnv(step_us=step_us))
            else:
                from a3c_core.envs import make_env
                envs.append(make_env(env_id, seed=1000 * j + i))
    except BaseException:
        for e in envs:
            e.close()
        raise
    env = envs[0]
    pipe = ObsPipeline({"kind": "image", "out_shape": (84, 84)}, env.obs_shape)
    net = build_network("doom-lstm", pipe.net_obs_shape, env.n_actions)
    if shared is None:
        shared = _shared_state(net)
    store = getattr(shared, "_standin_store", None)
    if store is None:
        store = shared._standin_store = ThreadStore(shared, ReturnNormalizer(0.99), None,
                                                    AdvantageNormalizer())
    s = RolloutSettings(t_max=20, gamma=0.99, bootstrap_truncated=False, normalize_advantages=True)
    return Worker(i, envs if n_envs > 1 else env, net, pipe, store, s,
                  np.random.default_rng(i))


def _cores():
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


#: seconds every worker has to start (its env included) before the window
START_TIMEOUT = 180.0


def _play(i, shared, step_us, env_id, n_envs, cores, ready, stop, counts):
    """One worker's life in its thread or process: pinned to its core (an
    engine it starts inherits the core, as in the trainer), built, then
    rollouts from the moment every worker is ready until ``stop``."""
    if cores:
        os.sched_setaffinity(0, {cores[i % len(cores)]})
    try:
        w = _worker(i, shared, step_us, env_id, n_envs)
    except BaseException:
        ready.abort()            # the window never opens
        raise
    try:
        ready.wait(START_TIMEOUT)
        while not stop.is_set():
            counts[i] += w.rollout()[0]
    finally:
        for e in w.envs:
            if hasattr(e, "close"):
                e.close()


def _window(ready, seconds, warmup, counts):
    try:
        ready.wait(START_TIMEOUT)
    except threading.BrokenBarrierError:
        raise RuntimeError("standin_scaling: a worker failed to start (its error is "
                           "above)") from None
    time.sleep(warmup)
    c0, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    return (sum(counts) - c0) / (time.perf_counter() - t0)


def run(n, seconds, warmup, step_us, env_id=None, n_envs=1):
    shared = _shared_state(_worker(0, None, step_us).net)
    counts = [0] * n
    stop, ready = threading.Event(), threading.Barrier(n + 1)
    threads = [threading.Thread(target=_play, daemon=True,
                                args=(i, shared, step_us, env_id, n_envs, _cores(), ready, stop,
                                      counts))
               for i in range(n)]
    for t in threads:
        t.start()
    try:
        return _window(ready, seconds, warmup, counts)
    finally:
        stop.set()
        ready.abort()            # (a worker still starting gives up)
        for t in threads:
            t.join()


def _share(shared):
    """Point ``shared``'s params and Adam moments at one ``MAP_SHARED``
    anonymous mapping (same values), which forked children keep sharing;
    returns the mapping (kept alive by the caller)."""
    import mmap

    opt = shared.optimizer
    arrays = [("params", shared)] + [(a, opt) for a in opt._arrays]
    n = shared.params.shape[0]
    mm = mmap.mmap(-1, len(arrays) * n * 4, flags=mmap.MAP_SHARED)
    for k, (name, owner) in enumerate(arrays):
        view = np.frombuffer(mm, np.float32, n, k * n * 4)
        view[...] = getattr(owner, name)
        setattr(owner, name, view)
    return mm


def run_processes(n, seconds, warmup, step_us, env_id=None, n_envs=1):
    """:func:`run` with N forked processes (see the module docstring)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    shared = _shared_state(_worker(0, None, step_us).net)
    mm = _share(shared)
    counts = ctx.Array("q", n, lock=False)
    stop, ready = ctx.Event(), ctx.Barrier(n + 1)
    procs = [ctx.Process(target=_play, daemon=True,
                         args=(i, shared, step_us, env_id, n_envs, _cores(), ready, stop,
                               counts))
             for i in range(n)]
    try:
        for p in procs:
            p.start()
        rate = _window(ready, seconds, warmup, counts)
    finally:
        stop.set()
        ready.abort()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"standin_scaling: worker processes exited with {bad}")
    del mm                   # (the views keep the mapping until they go)
    return rate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--step-us", type=float, default=250.0, help="stand-in env step, us")
    ap.add_argument("--env", default=None,
                    help="play this env (e.g. doom:basic) instead of the stand-in")
    ap.add_argument("--envs-per-worker", type=int, default=1, metavar="K",
                    help="envs each worker plays in turn (one update over the K parts)")
    ap.add_argument("--mode", default="threads",
                    help="threads, processes, or both (comma-separated: alternated at each N)")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.mode.split(",") if m.strip()]
    if not modes or any(m not in ("threads", "processes") for m in modes):
        ap.error(f"--mode: threads and/or processes, got {a.mode!r}")
    try:
        ns = [int(x) for x in a.workers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workers: comma-separated integers, got {a.workers!r}")
    if not ns or min(ns) < 1:
        ap.error("--workers: at least one count, each >= 1")
    if a.envs_per_worker < 1:
        ap.error("--envs-per-worker must be >= 1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from a3c_core._blas import limit_blas_threads

    limit_blas_threads(1)
    run(1, 0.5, 0.5, a.step_us)          # compile before anything is timed
    base = {}
    print(f"{'mode':>9s} {'workers':>7s} {'steps/s':>9s} {'speed-up':>9s}")
    for n in ns:
        for m in modes:
            r = (run if m == "threads" else run_processes)(n, a.seconds, a.warmup, a.step_us,
                                                           a.env, a.envs_per_worker)
            if n == 1:
                base.setdefault(m, r)
            sp = f"{r / base[m]:8.2f}x" if m in base else "        -"
            print(f"{m:>9s} {n:7d} {r:9.0f} {sp}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
