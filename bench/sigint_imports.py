"""Ctrl-C while a fresh ``a3c`` command imports numpy's (or numba's) C core, N times.

    python bench/sigint_imports.py [--starts 40] [--command train|eval|compile]

Each start runs ``python -m a3c_core train --env CartPole-v1 ...`` in a new
session, polls its ``/proc/PID/maps`` until numpy's ``_multiarray_umath`` is
mapped (polling 0-3 ms apart, varied per start, so the signal lands at
different points of the import), sends SIGINT to the process group and
counts the outcomes by (exit code, traceback in the output).  ``--command
eval`` (a checkpoint path that does not exist: the command would exit 2
once its imports are done) and ``--command compile`` wait instead for
llvmlite's ``libllvmlite`` to be mapped, i.e. signal while numba loads.  Every start
should give ``(130, False)``: before ``_safepoint.held_sigint`` about 1 start in 40
died with numpy's ImportError ('PyCapsule_Import could not import module
"datetime"'), the KeyboardInterrupt raised inside its module init.  Linux
only (``/proc``).
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time


COMMANDS = {
    "train": (["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "300",
               "--no-tensorboard", "--quiet", "--run-dir", "run"], "_multiarray_umath"),
    "eval": (["eval", "no-such-checkpoint.npz", "--episodes", "1"], "libllvmlite"),
    "compile": (["compile", "--spec", "mlp"], "libllvmlite"),
}


def one_start(i, command="train"):
    args, marker = COMMANDS[command]
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([sys.executable, "-m", "a3c_core", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=d)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            try:
                with open(f"/proc/{p.pid}/maps") as fh:
                    if marker in fh.read():
                        os.killpg(p.pid, signal.SIGINT)
                        break
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.0005 * (i % 7))
        out = p.communicate(timeout=60)[0].decode(errors="replace")
    return (p.returncode, "Traceback" in out), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=40)
    ap.add_argument("--command", choices=sorted(COMMANDS), default="train")
    a = ap.parse_args(argv)
    counts = collections.Counter()
    for i in range(a.starts):
        key, out = one_start(i, a.command)
        counts[key] += 1
        if key != (130, False):
            print(f"start {i}: exit {key[0]}, traceback {key[1]}\n{out[-800:]}")
    for (rc, tb), n in sorted(counts.items()):
        print(f"exit {rc}, traceback {tb}: {n} of {a.starts}")
    return 0 if set(counts) == {(130, False)} else 1


if __name__ == "__main__":
    sys.exit(main())
