"""Env steps/second from 1 and 2 threads: does a worker thread wait GIL-free?

    python bench/env_threads.py                 # ALE/Pong-v5, ~20 s
    python bench/env_threads.py --env CartPole-v1 --seconds 1

Options compared (each thread steps its own env, random actions, reset at
episode end; 1- and 2-thread trials interleaved, median of ``--repeats``):

* ``in-thread``: the env in the stepping thread (``env_process=False``);
* ``process``: the env in a child process (:class:`a3c_core.envs.proc.ProcEnv`);
* ``ale-vector``: for Atari ids, ale-py's C++ ``AtariVectorEnv(num_envs=1)``
  per thread (same preprocessing: gray 210x160, skip 4, max-pool, no-ops).

Also printed, from the 1-thread trials: the stepping thread's own CPU time per
step (``time.thread_time``), an upper bound on the time it holds the GIL, and
the total CPU time per step (this process plus the env's child process). On
a busy machine the wall-clock rates and ratios are noisy; the CPU columns are
not: 2 workers on 2 free cores scale by about ``2 / (1 + gil / total)`` at
worst, and ``in-thread`` holds the GIL for the whole step (gil = total).
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from a3c_core.envs import is_atari_id, make_env


def _env_stepper(env):
    acts = np.random.default_rng(0).integers(0, env.n_actions, 4096).tolist()
    env.reset()
    i = 0

    def step():
        nonlocal i
        _, _, term, trunc = env.step(acts[i & 4095])
        i += 1
        if term or trunc:
            env.reset()
    return step


def _vector_env(env_id):
    import ale_py

    from a3c_core.envs.atari import atari_id_defaults

    game, _ = atari_id_defaults(env_id)
    v = ale_py.AtariVectorEnv(game, num_envs=1, num_threads=1, img_height=210, img_width=160,
                              stack_num=1, grayscale=True, frameskip=4, maxpool=True,
                              noop_max=30, repeat_action_probability=0.0)
    v.reset(seed=0)
    v.close_env = getattr(v, "close", lambda: None)
    return v


def _vector_stepper(v):
    acts = np.random.default_rng(0).integers(0, 4, (4096, 1))
    i = 0

    def step():
        nonlocal i
        v.step(acts[i & 4095])
        i += 1
    return step


def _child_cpu(pids):
    """Seconds of CPU used so far by processes ``pids`` (utime + stime)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def trial(steppers, seconds, pids=()):
    """(steps/s summed over threads, mean thread CPU us/step, total CPU us/step)."""
    n = len(steppers)
    counts, cpu, stop = [0] * n, [0.0] * n, threading.Event()
    go = threading.Barrier(n + 1)

    def run(k):
        step = steppers[k]
        go.wait()
        c0 = time.thread_time()
        while not stop.is_set():
            step()
            counts[k] += 1
        cpu[k] = (time.thread_time() - c0) / max(counts[k], 1)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    go.wait()
    t0, p0, c0 = time.perf_counter(), time.process_time(), _child_cpu(pids)
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = time.process_time() - p0 + _child_cpu(pids) - c0
    return sum(counts) / wall, 1e6 * sum(cpu) / n, 1e6 * total / max(sum(counts), 1)


def measure(make, stepper, seconds, repeats):
    objs = [make() for _ in range(2)]
    steppers = [stepper(o) for o in objs]
    for s in steppers:  # warm-up
        for _ in range(50):
            s()
    pid0 = [objs[0].pid] if getattr(objs[0], "pid", None) else []
    one, two, cpu, tot = [], [], [], []
    for _ in range(repeats):
        r1, c1, t1 = trial(steppers[:1], seconds, pid0)
        r2, _, _ = trial(steppers, seconds)
        one.append(r1)
        two.append(r2)
        cpu.append(c1)
        tot.append(t1)
    for o in objs:
        (getattr(o, "close_env", None) or o.close)()
    ratios = [b / a for a, b in zip(one, two)]
    return (statistics.median(one), statistics.median(two), statistics.median(ratios),
            statistics.median(cpu), statistics.median(tot))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--seconds", type=float, default=1.0, help="per trial")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    kw = {"repeat_action_probability": 0.0} if is_atari_id(args.env) else {}
    options = [
        ("in-thread", lambda: make_env(args.env, env_process=False, **kw), _env_stepper),
        ("process", lambda: make_env(args.env, env_process=True, **kw), _env_stepper),
    ]
    if is_atari_id(args.env):
        options.append(("ale-vector", lambda: _vector_env(args.env), _vector_stepper))
    print(f"{args.env}: median of {args.repeats} interleaved {args.seconds:g} s trials")
    print(f"{'option':12s} {'1 thread':>18s} {'2 threads':>12s} {'ratio':>6s} "
          f"{'thread CPU/step':>16s} {'total CPU/step':>15s}")
    for name, make, stepper in options:
        r1, r2, ratio, cpu, tot = measure(make, stepper, args.seconds, args.repeats)
        print(f"{name:12s} {r1:7.0f} st/s {1e6 / r1:5.0f} us {r2:7.0f} st/s {ratio:6.2f} "
              f"{cpu:13.0f} us {tot:12.0f} us", flush=True)


if __name__ == "__main__":
    main()
