"""The env rows of ``a3c bench``.

* ``env step``: one ``env.step(a)`` of the env (ViZDoom: frame skip 4; the
  episode resets are not timed), us.  ``a3c bench`` makes the env and times
  it on one pinned core (``machine.one_core``), so a ViZDoom engine shares
  its core with the stepping thread, as in training.
* ``env reset``: one ``env.reset()``, us.

Skipped when the env cannot be made (:func:`make_bench_env` says why) or
with ``--skip-env``.
"""
from __future__ import annotations

import time

import numpy as np

from a3c_core.bench.machine import Row, us
from a3c_core.envs import make_env


def make_bench_env(env_id, runtime_dir):
    """``(env, None)`` or ``(None, reason)``: the env gives the network's input
    shape.  ViZDoom writes its runtime files under ``runtime_dir``."""
    try:
        try:
            env = make_env(env_id, seed=0, runtime_dir=runtime_dir)
        except TypeError:  # an adapter without runtime_dir
            env = make_env(env_id, seed=0)
    except Exception as e:  # noqa: BLE001 - env row and e2e are skipped with a note
        return None, f"{type(e).__name__}: {e}"
    return env, None


def bench_env(env, repeat, min_time) -> list[Row]:
    """env.step(a) of random actions; resets are done outside the timed region."""
    rng = np.random.default_rng(0)
    env.reset()
    acts = rng.integers(0, env.n_actions, 4096)
    pos = [0]

    def batch(n):
        t = 0.0
        for _ in range(n):
            a = int(acts[pos[0] & 4095])
            pos[0] += 1
            t0 = time.perf_counter()
            _, _, term, trunc = env.step(a)
            t += time.perf_counter() - t0
            if term or trunc:
                env.reset()
        return t

    batch(20)
    t0 = time.perf_counter()
    batch(10)
    per = max((time.perf_counter() - t0) / 10, 1e-6)
    n = max(10, int(min_time / per))
    samples = [batch(n) / n for _ in range(repeat)]
    spec = env.spec() if callable(getattr(env, "spec", None)) else {}
    fs = spec.get("frame_skip", "?") if isinstance(spec, dict) else "?"
    resets = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(5):
            env.reset()
        resets.append((time.perf_counter() - t0) / 5)
    return [Row("env step", us(samples), "us", f"{spec.get('id', '?') if isinstance(spec, dict) else ''}"
                f" frame skip {fs}; random actions; resets untimed"),
            Row("env reset", us(resets), "us",
                "env.reset() (a new episode; paid once per episode, so per agent step it "
                "weighs 1/episode length: a trained doom:basic agent's episodes are ~6 steps)")]
