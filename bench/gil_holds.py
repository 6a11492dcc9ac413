"""Where a worker holds the GIL, by timestamps in the worker's own thread.

    python bench/gil_holds.py [--rollouts 300] [--repeats 3] [--short-us 40] [--episode 40]
                              [--envs 1] [--doom [--engine-core C]] [--worker-core C] [--calls]

The trainer's :class:`~a3c_core.train.worker.Worker` (doom-lstm, the
default settings for doom:basic) runs on a stand-in env that spins ~250 µs
in a ``nogil`` kernel per step, as a ViZDoom step takes here
(``gil_parts._NoGilEnv``).  Every compiled call it makes (the agent step,
the env's spin, the update's kernels, the Cython reward/optimizer calls,
the preprocessing) is wrapped to record when it starts and ends.  A thread
waiting for the GIL can only take it during a long call: a short one ends
before the waiter has woken (wake-ups take tens of µs in this VM, see
``gil_parts.py``'s waits).  So the GIL counts as held from the end of one
long call (``--short-us`` or more) to the start of the next, short calls
included, and the table gives these stretches per agent step, grouped by
the long calls around them, with the median stretch.

Unlike the probe (``a3c bench``'s GIL rows, ``gil_parts.py``), this needs
no second thread and no wake-up, so it reads the same to a few percent run
to run; it reads the worker's own time, not what a second thread loses.
The wrappers add ~0.3 µs of Python per call (counted as held), and a
call's dispatch into compiled code (~1 µs, GIL held) counts as part of the
call: the two roughly cancel.  Compare with the interpreter-only bound of
``gil_budget.py`` (tiny network, hot caches) to see what the full
network's kernels, which evict the interpreter's data, add.

``--doom`` plays doom:basic instead: ViZDoom's ``make_action`` and
``new_episode`` (which release the GIL while the engine runs) are the long
calls, and ``get_state``/``is_episode_finished`` (GIL held) are recorded
too; the env's own Python and the engine's effect on this thread's caches
are then in the figure, as they are in the probe's.  ``--calls`` prints
each recorded call's duration.

Never run it beside a training run: it measures time on a busy core.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import statistics
import sys
import time

import numpy as np


def _gil_parts():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gil_parts.py")
    spec = importlib.util.spec_from_file_location("_a3c_bench_gil_parts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Recorder:
    """Wraps callables so that each call appends ``(name, start_ns, end_ns)``."""

    def __init__(self):
        self.events = []
        self.saved = []        # (owner, attribute, original) to put back

    def wrap(self, name, fn):
        events, clock = self.events, time.perf_counter_ns

        def timed(*args, **kw):
            t0 = clock()
            try:
                return fn(*args, **kw)
            finally:
                events.append((name, t0, clock()))
        timed.__wrapped__ = fn
        return timed

    def patch(self, owner, attr, name=None):
        fn = getattr(owner, attr)
        self.saved.append((owner, attr, fn))
        setattr(owner, attr, self.wrap(name or attr, fn))

    def restore(self):
        for owner, attr, fn in reversed(self.saved):
            setattr(owner, attr, fn)
        self.saved.clear()


class _Module:
    """A module stand-in whose callables are recorded (for ``_hogwild``)."""

    def __init__(self, mod, rec, prefix):
        self._mod, self._rec, self._prefix = mod, rec, prefix

    def __getattr__(self, name):
        f = getattr(self._mod, name)
        return self._rec.wrap(self._prefix + name, f) if callable(f) else f


def instrument(worker, rec):
    """Wrap every compiled call the worker makes (see the module docstring)."""
    from numba.core.dispatcher import Dispatcher

    import a3c_core.core.normalize as NZ
    import a3c_core.core.optim as OP
    import a3c_core.core.shared as SH
    import a3c_core.nn.kernels as K
    import a3c_core.train.worker as W

    for mod in (K, W, NZ):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, Dispatcher):
                rec.patch(mod, name)
    for name in ("gae",):
        rec.patch(W, name)
    for mod in (SH, OP):
        rec.saved.append((mod, "_hogwild", mod._hogwild))
        mod._hogwild = _Module(mod._hogwild, rec, "")
    for env in worker.envs:
        if hasattr(env, "_game"):            # ViZDoom (--doom)
            rec.saved.append((env, "_game", env._game))
            env._game = _Game(env._game, rec)
        else:
            rec.patch(env, "_spin", "env step (nogil spin)")
    rec.patch(worker.pipe, "_prep", "preprocess")
    worker.net._bw_calls = {}        # the update's plan is rebuilt with the wrappers


def stretches(events, short_ns):
    """``[(from long call, to long call, held ns, short calls inside)]``."""
    out = []
    prev, held_from, shorts = None, None, 0
    for name, t0, t1 in sorted(events, key=lambda e: e[1]):
        if t1 - t0 < short_ns:
            shorts += 1
            continue
        if prev is not None:
            out.append((prev, name, t0 - held_from, shorts))
        prev, held_from, shorts = name, t1, 0
    return out


class _Game:
    """A ViZDoom game whose calls are the game's own bound methods (no
    ``__getattr__`` in the hot loop), ``make_action`` and ``new_episode``
    (which release the GIL) recorded as long calls."""

    def __init__(self, game, rec):
        for name in dir(game):
            if not name.startswith("_"):
                setattr(self, name, getattr(game, name))
        self.make_action = rec.wrap("doom make_action", game.make_action)
        self.new_episode = rec.wrap("doom new_episode", game.new_episode)
        # short calls (held): timed for the table of calls, not stretch ends
        self.get_state = rec.wrap("doom get_state", game.get_state)
        self.is_episode_finished = rec.wrap("doom is_episode_finished",
                                            game.is_episode_finished)


def _doom_envs(n_envs, engine_core=None):
    """doom:basic envs; ``engine_core``: their engine processes pinned to that
    core (they inherit the affinity of the thread that starts them)."""
    from a3c_core.envs import make_env
    mask = os.sched_getaffinity(0) if engine_core is not None else None
    try:
        if mask is not None:
            os.sched_setaffinity(0, {engine_core})
        return [make_env("doom:basic", seed=i) for i in range(n_envs)]
    finally:
        if mask is not None:
            os.sched_setaffinity(0, mask)


def run_once(rollouts, short_us, episode, n_envs=1, doom=None):
    from a3c_core._blas import limit_blas_threads
    from a3c_core.obs import ObsPipeline

    limit_blas_threads(1)
    gp = _gil_parts()
    envs = doom if doom is not None else [gp._NoGilEnv(episode=episode) for _ in range(n_envs)]
    pipe = ObsPipeline({"kind": "image", "out_shape": [84, 84]}, envs[0].obs_shape)
    w = gp._stand_in_worker(pipe, envs if n_envs > 1 else envs[0])
    for _ in range(30):                    # compile / load, fill the normalizers
        w.rollout()
    rec = _Recorder()
    instrument(w, rec)
    try:
        w.rollout()                        # rebuild the plan under the wrappers
        rec.events.clear()
        t0 = time.perf_counter_ns()
        steps = sum(w.rollout()[0] for _ in range(rollouts))
        wall = time.perf_counter_ns() - t0
    finally:
        rec.restore()
        w.net._bw_calls = {}
    st = stretches(rec.events, short_us * 1e3)
    groups = collections.defaultdict(list)
    for a, b, held, n_short in st:
        groups[(a, b)].append((held, n_short))
    total = sum(h for _, _, h, _ in st)
    calls = collections.defaultdict(list)
    for name, t0, t1 in rec.events:
        calls[name].append((t1 - t0) / 1e3)
    return {"steps": steps, "wall_us_step": wall / steps / 1e3,
            "held_us_step": total / steps / 1e3, "groups": groups, "calls": calls}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--short-us", type=float, default=40.0,
                    help="calls shorter than this count as held (a waiter cannot wake in time)")
    ap.add_argument("--episode", type=int, default=40, help="stand-in episode length (steps)")
    ap.add_argument("--envs", type=int, default=1,
                    help="envs per worker (a rollout plays each; one update covers them)")
    ap.add_argument("--doom", action="store_true",
                    help="play doom:basic (ViZDoom's make_action/new_episode as the long "
                         "calls) instead of the stand-in env")
    ap.add_argument("--worker-core", type=int, default=None,
                    help="pin this (the worker's) thread to that core")
    ap.add_argument("--engine-core", type=int, default=None,
                    help="(--doom) pin the engine processes to that core")
    ap.add_argument("--calls", action="store_true",
                    help="also print each recorded call's count and median/mean duration")
    a = ap.parse_args(argv)
    if a.rollouts < 1 or a.repeats < 1 or a.short_us <= 0 or a.episode < 1 or a.envs < 1:
        ap.error("--rollouts, --repeats, --episode, --envs must be >= 1 and --short-us > 0")
    if a.engine_core is not None and not a.doom:
        ap.error("--engine-core needs --doom")
    doom = _doom_envs(a.envs, a.engine_core) if a.doom else None
    if a.worker_core is not None:
        os.sched_setaffinity(0, {a.worker_core})
    try:
        runs = [run_once(a.rollouts, a.short_us, a.episode, a.envs, doom)
                for _ in range(a.repeats)]
    finally:
        for env in doom or ():
            env.close()
    held = [r["held_us_step"] for r in runs]
    print(f"GIL held per agent step (stretches between calls of >= {a.short_us:g} us): "
          + ", ".join(f"{h:.1f}" for h in held) + f" us (median {statistics.median(held):.1f}); "
          f"wall {statistics.median(r['wall_us_step'] for r in runs):.0f} us per step")
    last = runs[-1]
    rows = sorted(last["groups"].items(), key=lambda kv: -sum(h for h, _ in kv[1]))
    print(f"{'from long call':>26} -> {'to long call':<26} {'per step':>8} {'median us':>10} "
          f"{'us/step':>8} {'short calls':>11}")
    for (src, dst), v in rows:
        hs = [h / 1e3 for h, _ in v]
        print(f"{src[:26]:>26} -> {dst[:26]:<26} {len(v) / last['steps']:8.3f} "
              f"{statistics.median(hs):10.1f} {sum(hs) / last['steps']:8.2f} "
              f"{statistics.median(n for _, n in v):11.0f}")
    if a.calls:
        print(f"\n{'call':>30} {'per step':>8} {'median us':>10} {'mean us':>8}")
        for name, d in sorted(last["calls"].items(), key=lambda kv: -sum(kv[1])):
            print(f"{name[:30]:>30} {len(d) / last['steps']:8.3f} {statistics.median(d):10.2f} "
                  f"{statistics.mean(d):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
