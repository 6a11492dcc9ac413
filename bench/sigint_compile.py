"""Ctrl-C during a first run's compile: how often it ends as it should.

    python bench/sigint_compile.py [--starts 30] [--max-delay 3] [--seed 0]

Starts ``a3c train --env CartPole-v1`` (1 worker, 120 s budget) N times,
each with an empty Numba cache of its own, and sends SIGINT to its process
group a random 0..``--max-delay`` s after the "run directory" line, i.e.
while its kernels compile.  Counts the exit codes, the runs whose output has
a traceback or an "Exception ignored" (a KeyboardInterrupt lost inside a
ctypes callback), and the seconds from the signal to the exit (median,
max).  Expected: every run exits 130, cleanly, within a few seconds.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def one_start(delay):
    tmp = tempfile.mkdtemp(prefix="a3c-sigint-")
    try:
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, "numba-cache"))
        p = subprocess.Popen(
            [sys.executable, "-m", "a3c_core", "train", "--env", "CartPole-v1", "--workers", "1",
             "--total-steps", "0", "--total-seconds", "120", "--no-tensorboard",
             "--checkpoint-interval", "1", "--log-interval", "0.5", "--run-dir",
             os.path.join(tmp, "run")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env=env, cwd=tmp)
        first = p.stdout.readline()
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        t = time.monotonic()
        out = first + p.stdout.read()
        p.wait()
        return p.returncode, time.monotonic() - t, out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=30)
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true", help="print the output of bad runs")
    args = ap.parse_args(argv)
    rnd = random.Random(args.seed)
    codes, unclean, waits = collections.Counter(), 0, []
    for i in range(args.starts):
        delay = rnd.uniform(0.0, args.max_delay)
        rc, wait, out = one_start(delay)
        codes[rc] += 1
        waits.append(wait)
        bad = "Traceback" in out or "Exception ignored" in out
        unclean += bad
        if args.verbose and (bad or rc != 130):
            print(f"--- start {i}, SIGINT {delay:.2f} s after the run line: rc {rc}\n{out[-3000:]}")
    print(f"{args.starts} starts, SIGINT 0-{args.max_delay:g} s after the run line: exit codes "
          f"{dict(sorted(codes.items()))}; with a traceback or a lost interrupt: {unclean}; "
          f"signal to exit: median {statistics.median(waits):.2f} s, max {max(waits):.2f} s")
    return 0 if codes == {130: args.starts} and not unclean else 1


if __name__ == "__main__":
    sys.exit(main())
