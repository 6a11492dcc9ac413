"""How long ViZDoom's get_state holds the worker's thread in training.

Trains doom:basic (2 worker threads, K envs per worker, 20 s) with each
DoomEnv's get_state wrapped in a timer, then prints the wall and thread-CPU
time per call (one call per agent step), skipping the first 2,000 calls.
Usage: python bench/get_state_cpu.py K
"""
import sys
import tempfile
import time

import numpy as np

import a3c_core.envs.doom as doom
from a3c_core.cli import main

WALL, CPU = [], []


class _Timed:
    """A DoomGame whose get_state is timed; everything else passes through."""

    def __init__(self, game):
        self._game = game

    def __getattr__(self, name):
        return getattr(self._game, name)

    def get_state(self):
        t0, c0 = time.perf_counter(), time.thread_time()
        state = self._game.get_state()
        WALL.append(time.perf_counter() - t0)
        CPU.append(time.thread_time() - c0)
        return state


_step = doom.DoomEnv.step


def _timed_step(self, action):
    game = self._game
    self._game = _Timed(game)
    try:
        return _step(self, action)
    finally:
        self._game = game


if __name__ == "__main__":
    k = sys.argv[1] if len(sys.argv) > 1 else "8"
    doom.DoomEnv.step = _timed_step
    with tempfile.TemporaryDirectory() as run_dir:
        main(["train", "--env", "doom:basic", "--workers", "2", "--envs-per-worker", k,
              "--no-worker-processes", "--total-steps", "0", "--total-seconds", "20",
              "--run-dir", run_dir + "/run", "--no-tensorboard", "--quiet"])
    wall, cpu = np.array(WALL[2000:]) * 1e6, np.array(CPU[2000:]) * 1e6
    print(f"K = {k}: {wall.size} calls; get_state wall us median {np.median(wall):.1f}, "
          f"mean {wall.mean():.1f}, p99 {np.percentile(wall, 99):.1f}; thread CPU mean {cpu.mean():.1f}")
