"""GIL-held time per call of each part of a worker's step, by ``a3c bench``'s probe.

    python bench/gil_parts.py [--seconds 3] [--parts env,pipe,step,sample,update6,update20]

Runs one part at a time in a loop on a background thread (one BLAS
thread) while the main thread runs :func:`a3c_core.bench.gil_probe`: the
probe's lost share of time (``gil_blocked_fraction``) divided by the
loop's calls per second is the GIL time per call, hand-off latency
included, as in the ``GIL us/step`` row of ``a3c bench``.  Parts:

* ``env``: ``DoomEnv.step`` on doom:basic (random actions; resets in the loop);
* ``pipe``: the observation pipeline (uint8 120x160 -> float32 84x84);
* ``step``: ``Network.step(record=True)`` of doom-lstm (per step, in rollouts of 20);
* ``sample``: ``sample_categorical`` over 3 actions;
* ``updateN``: N recorded steps then ``rollout_grad`` (per update).

Needs a free core for the probe: never run it beside a training run.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--parts", default="env,pipe,step,sample,update6,update20")
    a = ap.parse_args(argv)

    from a3c_core._blas import limit_blas_threads
    from a3c_core.bench import gil_blocked_fraction, gil_probe
    from a3c_core.envs import make_env
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    from a3c_core.sampling import sample_categorical

    limit_blas_threads(1)
    env = make_env("doom:basic", seed=0)
    pipe = ObsPipeline(dict(env.preprocess_spec), env.obs_shape)
    net = build_network("doom-lstm", pipe.net_obs_shape, env.n_actions)
    net.single_step_kernel = True
    obs_buf = np.zeros((21,) + pipe.net_obs_shape, np.float32)
    raw = env.reset()
    rng = np.random.default_rng(0)
    acts, ret, adv = np.zeros(20, np.int64), np.ones(20, np.float32), np.ones(20, np.float32)

    def loop_env(stop, cnt):
        while not stop.is_set():
            _, _, te, tr = env.step(int(rng.integers(env.n_actions)))
            if te or tr:
                env.reset()
            cnt[0] += 1

    def loop_pipe(stop, cnt):
        while not stop.is_set():
            pipe(raw, obs_buf[1])
            cnt[0] += 1

    def loop_step(stop, cnt):
        while not stop.is_set():
            net.begin_rollout(20)
            st = net.initial_state()
            for t in range(20):
                _, _, st = net.step(obs_buf[t], st, record=True)
            cnt[0] += 20

    def loop_sample(stop, cnt):
        p = np.array([0.2, 0.3, 0.5], np.float32)
        u = rng.random(20)
        while not stop.is_set():
            for t in range(20):
                sample_categorical(p, u[t])
            cnt[0] += 20

    def loop_update(n):
        def run(stop, cnt):
            while not stop.is_set():
                net.begin_rollout(20)
                st = net.initial_state()
                for t in range(n):
                    _, _, st = net.step(obs_buf[t], st, record=True)
                net.rollout_grad(acts[:n], ret[:n], adv[:n])
                cnt[0] += 1
        return run

    loops = {"env": loop_env, "pipe": loop_pipe, "step": loop_step, "sample": loop_sample}
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    for p in parts:
        if p not in loops and not (p.startswith("update") and p[6:].isdigit() and 1 <= int(p[6:]) <= 20):
            ap.error(f"unknown part {p!r}")
    base = float(np.median(gil_probe(1.0)))
    print(f"{'part':10s} {'calls/s alone':>14s} {'with probe':>11s} {'GIL share':>10s} {'GIL us/call':>12s}")
    for p in parts:
        fn = loops.get(p) or loop_update(int(p[6:]))
        stop, cnt = threading.Event(), [0]
        th = threading.Thread(target=fn, args=(stop, cnt), daemon=True)
        th.start()
        time.sleep(0.5)
        c0, t0 = cnt[0], time.perf_counter()
        time.sleep(a.seconds / 2)
        alone = (cnt[0] - c0) / (time.perf_counter() - t0)
        c0, t0 = cnt[0], time.perf_counter()
        cycles = gil_probe(a.seconds)
        rate = (cnt[0] - c0) / (time.perf_counter() - t0)
        stop.set()
        th.join()
        f = gil_blocked_fraction(cycles, base)
        flag = "  PERTURBED (>10% slower with the probe)" if rate < 0.9 * alone else ""
        print(f"{p:10s} {alone:14.0f} {rate:11.0f} {f:10.1%} {f / rate * 1e6:12.1f}{flag}")
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
