"""A bare ViZDoom loop on doom:basic: what a reset and a step cost, wall and
Python-thread CPU.

    python bench/doom_reset.py [--episodes 300] [--steps 5]

Plays ``--episodes`` episodes of ``--steps`` ``make_action(a, frame_skip)``
+ ``get_state()`` each on the engine of :class:`a3c_core.envs.doom.DoomEnv`
(no network), and prints the median ``new_episode()`` time with
basic.cfg's ``episode_start_time`` (14 tics) and with 0, and the mean
wall and ``time.thread_time()`` per ``new_episode`` and per step (the
thread time is what the Python side spends on the engine's message queue).
Run it under ``strace -f -c`` to count the syscalls.  Never beside a
training run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    from a3c_core.envs.doom import DoomEnv

    env = DoomEnv("basic", seed=1)
    g, fs = env._game, env.frame_skip
    try:
        for start in (g.get_episode_start_time(), 0):
            g.set_episode_start_time(start)
            ts = []
            for _ in range(a.episodes):
                t0 = time.perf_counter()
                g.new_episode()
                ts.append(time.perf_counter() - t0)
            print(f"new_episode, episode_start_time {start}: median {statistics.median(ts) * 1e6:.0f} us")
        g.set_episode_start_time(14)
        w = c = w2 = c2 = 0.0
        n2 = 0
        for _ in range(a.episodes):
            t0, c0 = time.perf_counter(), time.thread_time()
            g.new_episode()
            w += time.perf_counter() - t0
            c += time.thread_time() - c0
            for k in range(a.steps):
                if g.is_episode_finished():
                    break
                t0, c0 = time.perf_counter(), time.thread_time()
                g.make_action(env._actions[k % env.n_actions], fs)
                g.get_state()
                w2 += time.perf_counter() - t0
                c2 += time.thread_time() - c0
                n2 += 1
        print(f"new_episode: wall {w / a.episodes * 1e6:.0f} us, Python-thread CPU {c / a.episodes * 1e6:.0f} us")
        print(f"step (make_action + get_state): wall {w2 / max(n2, 1) * 1e6:.0f} us, "
              f"Python-thread CPU {c2 / max(n2, 1) * 1e6:.0f} us")
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
