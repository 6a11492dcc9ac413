"""Serve many agents from one trained policy: one ``act_batch`` call per tick.

    python examples/serve_many.py runs/doom_basic-s0-.../checkpoints/latest.npz --agents 64

A game server or simulator holds N agents; each tick it has one raw frame per
agent and wants one action per agent.  This script plays that role with
stand-in frames (random pixels of the policy's raw frame shape; a real
server passes its renderer's frames, the shape the env gave in training) and
random episode ends, and prints the per-agent cost of a tick next to the
batch-1 ``Policy.act`` call.  Only numpy, numba and a3c_core are needed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from a3c_core import Policy
from a3c_core.checkpoint import CheckpointError


def stand_in_frames(policy, n, rng):
    """N raw observations of the shape (and dtype) the policy was trained on."""
    shape = (n,) + tuple(policy.pipeline.raw_shape)
    if policy.pipeline.kind == "image":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("policy", help="checkpoint (.npz, e.g. from a3c export --npz-only) or run directory")
    p.add_argument("--agents", type=int, default=64, help="agents served per call (default 64)")
    p.add_argument("--ticks", type=int, default=50, help="ticks to time (default 50)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.agents < 1 or args.ticks < 1:
        p.error("--agents and --ticks must be >= 1")

    try:
        policy = Policy.load(args.policy)
    except CheckpointError as e:            # missing, corrupt or mismatched: say which
        print(f"serve_many: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    n = args.agents
    states = policy.initial_state(n)        # (h, c) of (n, H) rows; None without an LSTM
    done = np.zeros(n, dtype=bool)          # rows that start a new episode this tick
    counts = np.zeros(policy.n_actions, dtype=np.int64)

    frames = stand_in_frames(policy, n, rng)
    policy.act_batch(frames, states)        # the first call loads the compiled kernels
    policy.act(frames[0], policy.initial_state())

    tick_s = []
    for _ in range(args.ticks):
        frames = stand_in_frames(policy, n, rng)
        t0 = time.perf_counter()
        actions, states = policy.act_batch(frames, states, done=done, rng=rng)
        tick_s.append(time.perf_counter() - t0)
        counts += np.bincount(actions, minlength=policy.n_actions)
        done = rng.random(n) < 0.02         # some episodes end; their rows reset next tick

    one = policy.initial_state()
    single_s = []
    for i in range(min(args.ticks, 50)):
        t0 = time.perf_counter()
        _, one = policy.act(frames[i % n], one, rng=rng)
        single_s.append(time.perf_counter() - t0)

    per_agent = statistics.median(tick_s) / n * 1e6
    single = statistics.median(single_s) * 1e6
    names = policy.action_names or [str(a) for a in range(policy.n_actions)]
    print(f"{policy.path}: {policy.net.spec['name']}, raw frames {policy.pipeline.raw_shape}")
    print(f"{n} agents x {args.ticks} ticks: {per_agent:.1f} us per agent per tick "
          f"(median tick {statistics.median(tick_s) * 1e3:.2f} ms); batch-1 act {single:.1f} us "
          f"({per_agent / single:.2f}x)")
    print("actions: " + ", ".join(f"{nm} {c}" for nm, c in zip(names, counts.tolist())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
