"""First-run Numba compile time of the trainer's warm-up, from an empty cache.

Each repetition runs, in a fresh process with ``NUMBA_CACHE_DIR`` pointing at
an empty directory, exactly what ``Trainer._warm_up`` runs for a spec
(``train.worker.warm_up_network``: a step, the sampler, a recorded 3-step
rollout and its backward-only update; on a cold cache with 2+ CPUs its helper
process compiles the update's kernels meanwhile, and the CPU time below
includes it), then the same again with the cache it just wrote; ``--policy``: what a :class:`~a3c_core.Policy` runs instead (one
unrecorded step with the plain kernel).  It reports the process
wall time and its CPU time (user + sys, which a busy machine disturbs less
than wall time), and with ``--events`` the kernels that took longest
(numba's compile events, inclusive of the kernels they inline).

    python bench/compile_time.py --repeats 2 [--spec doom-lstm] [--policy] [--events] [--tree DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
events = {}
if EVENTS:
    from numba.core import event as ev
    class L(ev.Listener):
        def on_start(self, e):
            if e.kind == "numba:compile":
                self.t = getattr(self, "t", {}); self.t[id(e.data["dispatcher"]), str(e.data["args"])] = time.perf_counter()
        def on_end(self, e):
            if e.kind == "numba:compile":
                d = e.data["dispatcher"]
                k = (id(d), str(e.data["args"]))
                name = d.py_func.__qualname__
                events[name] = events.get(name, 0.0) + time.perf_counter() - self.t.pop(k)
    ev.register("numba:compile", L())
import numpy as np
from a3c_core.nn.network import build_network
t_import = time.perf_counter() - t0
net = build_network(SPEC, tuple(SHAPE), 3, dtype=np.float32)
if PLAIN:
    net.step(np.zeros(net.obs_shape, np.float32), net.initial_state())   # what Policy runs
else:
    try:
        from a3c_core.train.worker import warm_up_network
    except ImportError:     # a tree before 2026-11-24 (--tree): its Trainer._warm_up, written out
        def warm_up_network(net):
            from a3c_core.sampling import sample_categorical
            obs = np.zeros((3,) + tuple(net.obs_shape), np.float32)
            probs, _, _ = net.step(obs[0], net.initial_state())
            sample_categorical(probs, 0.5)
            net.begin_rollout(3)
            s = net.initial_state()
            for t in range(3):
                _, _, s = net.step(obs[t], s, record=True)
            net.rollout_grad(np.zeros(3, np.int64), np.zeros(3, np.float32), np.zeros(3, np.float32))
    try:    # the trainer's default rollouts: with --min-rollout > 1 it also compiles the reset backward
        from a3c_core.train.config import Config
        reset = Config().runs_across_episodes()
    except (ImportError, AttributeError):
        reset = False
    if reset:
        warm_up_network(net, True)                                        # what Trainer runs
    else:
        warm_up_network(net)
print(json.dumps({"seconds": time.perf_counter() - t0, "import": t_import, "events": events}))
"""


def _run(spec, shape, cache, events, plain=False, tree=""):
    code = (CHILD.replace("EVENTS", repr(events)).replace("SPEC", repr(spec))
            .replace("SHAPE", repr(list(shape))).replace("PLAIN", repr(plain)))
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree) + os.pathsep + env.get("PYTHONPATH", "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.abspath(tree) if tree else None)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"compile_time: the child failed:\n{out.stderr}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="doom-lstm")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--events", action="store_true", help="per-kernel compile seconds (first repetition)")
    p.add_argument("--policy", action="store_true", help="the inference path (Policy) instead of the trainer's")
    p.add_argument("--tree", default="", help="import a3c_core from this source tree (e.g. a git "
                   "worktree of another commit, its extensions built) instead of the installed one")
    p.add_argument("--json", default="", help="also write the results here")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    shape = (4,) if a.spec.startswith("mlp") else ((1, 42, 42) if a.spec.startswith("atari") else (1, 84, 84))
    rows = []
    for r in range(a.repeats):
        cache = tempfile.mkdtemp(prefix="a3c_compile_")
        try:
            cold = _run(a.spec, shape, cache, a.events and r == 0, a.policy, a.tree)
            warm = _run(a.spec, shape, cache, False, a.policy, a.tree)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rows.append({"cold_s": cold["seconds"], "cold_cpu_s": cold["cpu"], "warm_s": warm["seconds"],
                     "warm_cpu_s": warm["cpu"], "import_s": cold["import"]})
        print(f"{a.spec} {'policy' if a.policy else 'trainer'} rep {r}: empty cache {cold['seconds']:.1f} s wall, {cold['cpu']:.1f} s CPU; "
              f"warm cache {warm['seconds']:.2f} s wall, {warm['cpu']:.2f} s CPU", flush=True)
        if cold["events"]:
            top = sorted(cold["events"].items(), key=lambda kv: -kv[1])[:12]
            for name, sec in top:
                print(f"    {sec:6.1f} s  {name}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"spec": a.spec, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
