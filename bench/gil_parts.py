"""GIL-held time per call of each part of a worker's step, by ``a3c bench``'s probe.

    python bench/gil_parts.py [--seconds 3] [--parts env,pipe,step,sample,update6,update20,worker,doomworker]

Runs one part at a time in a loop on a background thread (one BLAS
thread) while the main thread runs :func:`a3c_core.bench.gil_waits`: the
share of the probe's GIL requests that found the GIL held
(``gil_held_share``) divided by the loop's calls per second is the GIL
time per call, as in the ``GIL us/step`` row of ``a3c bench``; ``-floor``
is the same less the share the probe reads alone (see
``bench/gil_calibrate.py``), and ``wait p50/p90`` are the waits of the
requests that found it held (the rest of a hold plus a thread wake-up).
Without a usable time-stamp counter the cycles probe
(:func:`a3c_core.bench.gil_probe`) runs instead.  Parts:

* ``env``: ``DoomEnv.step`` on doom:basic (random actions; resets in the loop);
* ``pipe``: the observation pipeline (uint8 120x160 -> float32 84x84);
* ``step``: ``Network.step(record=True)`` of doom-lstm (per step, in rollouts of 20);
* ``sample``: ``sample_categorical`` over 3 actions;
* ``updateN``: N recorded steps then ``rollout_grad`` (per update);
* ``worker``: the trainer's :class:`~a3c_core.train.worker.Worker` loop per
  agent step (step, sampling, pipeline, reward scaling, returns, the update
  with its norm/Adam/sync tail, episode bookkeeping) on a stand-in for
  doom:basic that holds no GIL: ``step`` spins ~250 us in a ``nogil`` kernel
  (about a ViZDoom step here) and returns a fixed 120x160 frame, 40-step
  episodes.  Its figure plus ``env``'s is what a real worker costs;
* ``doomworker``: the same Worker on doom:basic itself (the trainer's
  other threads, its logger and monitor, are not running).

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
    ap.add_argument("--parts", default="env,pipe,step,sample,update6,update20,worker,doomworker")
    a = ap.parse_args(argv)

    from a3c_core._blas import limit_blas_threads
    from a3c_core.bench import (GIL_WAIT_THRESHOLD_S, gil_blocked_fraction, gil_held_share,
                                gil_probe, gil_waits)
    from a3c_core.envs import make_env
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    from a3c_core.sampling import sample_categorical

    limit_blas_threads(1)
    env = make_env("doom:basic", seed=0)
    pipe = ObsPipeline(dict(env.preprocess_spec), env.obs_shape)
    first = env[0] if isinstance(env, list) else env
    net = build_network("doom-lstm", pipe.net_obs_shape, first.n_actions)
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

    def loop_worker(stop, cnt, real=False):
        w = _stand_in_worker(pipe, env if real else None)
        while not stop.is_set():
            n, _, _, _ = w.rollout()
            cnt[0] += n

    loops = {"env": loop_env, "pipe": loop_pipe, "step": loop_step, "sample": loop_sample,
             "worker": loop_worker,
             "doomworker": lambda stop, cnt: loop_worker(stop, cnt, real=True)}
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    for p in parts:
        if p not in loops and not (p.startswith("update") and p[6:].isdigit() and 1 <= int(p[6:]) <= 20):
            ap.error(f"unknown part {p!r}")
    timed = gil_waits(0.01) is not None
    if timed:
        floor = gil_held_share(gil_waits(1.0, seed=1))
    else:
        alone_cycles = gil_probe(1.0)
        base = float(np.median(alone_cycles))
        floor = gil_blocked_fraction(alone_cycles, base)   # the probe's own floor (jitter)
    print(f"probe: {'waits (share of GIL requests that waited > 2 us)' if timed else 'cycles'}; "
          f"alone {floor:.2%}")
    print(f"{'part':10s} {'calls/s alone':>14s} {'with probe':>11s} {'GIL share':>10s} "
          f"{'GIL us/call':>12s} {'-floor':>7s} {'wait p50/p90 us':>16s}")
    for p in parts:
        fn = loops.get(p) or loop_update(int(p[6:]))
        stop, cnt = threading.Event(), [0]
        th = threading.Thread(target=fn, args=(stop, cnt), daemon=True)
        th.start()
        # the first calls compile (a fresh Numba cache: seconds); time after them
        deadline = time.perf_counter() + 300
        while cnt[0] == 0 and th.is_alive() and time.perf_counter() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        c0, t0 = cnt[0], time.perf_counter()
        time.sleep(a.seconds / 2)
        alone = (cnt[0] - c0) / (time.perf_counter() - t0)
        c0, t0 = cnt[0], time.perf_counter()
        cycles = gil_waits(a.seconds, seed=2) if timed else gil_probe(a.seconds)
        rate = (cnt[0] - c0) / (time.perf_counter() - t0)
        stop.set()
        th.join()
        if timed:
            f = gil_held_share(cycles)
            held = cycles[cycles > GIL_WAIT_THRESHOLD_S] * 1e6
            waits = (f"{np.percentile(held, 50):.0f}/{np.percentile(held, 90):.0f}"
                     if held.size else "-")
        else:
            f = gil_blocked_fraction(cycles, base)
            waits = "-"
        if rate <= 0:
            print(f"{p:10s} made no calls while timed (thread alive: {th.is_alive()})")
            continue
        flag = "  PERTURBED (>10% slower with the probe)" if rate < 0.9 * alone else ""
        print(f"{p:10s} {alone:14.0f} {rate:11.0f} {f:10.1%} {f / rate * 1e6:12.1f} "
              f"{max(0.0, f - floor) / rate * 1e6:7.1f} {waits:>16s}{flag}")
    env.close()
    return 0


class _NoGilEnv:
    """doom:basic's shapes and rough timing, no GIL held while it "runs"
    (``step_us=0``: no work at all; ``hw``: another frame size)."""

    obs_dtype, obs_kind, n_actions = np.dtype(np.uint8), "image", 3

    def __init__(self, step_us=250.0, episode=40, hw=(120, 160)):
        self.obs_shape = tuple(hw)
        self._spin, self._n = None, 0
        if step_us > 0:
            from a3c_core.bench import _spin_kernel
            self._spin, per = _spin_kernel()
            self._n = max(1, int(step_us * 1e-6 / per))
        self._frame = np.random.default_rng(0).integers(0, 256, self.obs_shape, dtype=np.uint8)
        self._episode, self._t = episode, 0
        self.episode_over = False

    def reset(self):
        self._t = 0
        self.episode_over = False
        return self._frame

    def step(self, action):
        if self._n:
            self._spin(self._n)
        self._t += 1
        done = self._t >= self._episode
        self.episode_over = done
        return self._frame, -1.0, done, False


def _stand_in_worker(pipe, env=None):
    """A Worker with the trainer's default settings for doom:basic on ``env``
    (default: a :class:`_NoGilEnv`; a list: a worker with those envs)."""
    from a3c_core import core
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.nn.network import build_network
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

    env = _NoGilEnv() if env is None else env
    first = env[0] if isinstance(env, list) else env
    net = build_network("doom-lstm", pipe.net_obs_shape, first.n_actions)
    shared = core.SharedState(net.params.copy(), core.Adam(net.n_params, lr=1e-4))
    store = ThreadStore(shared, ReturnNormalizer(0.99), None, AdvantageNormalizer())
    s = RolloutSettings(t_max=20, gamma=0.99, bootstrap_truncated=False,
                        normalize_advantages=True)
    return Worker(0, env, net, pipe, store, s, np.random.default_rng(0))


if __name__ == "__main__":
    sys.exit(main())
