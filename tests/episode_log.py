"""One worker, a fixed seed: the episodes it plays and the parameters it ends with.

Runs ``a3c train`` through its command line (the one interface every version
of the package keeps) with one worker thread, seed 0 and a small step budget,
and prints (or writes) a JSON log: every episode's step, return and length,
and a summary of the final flat parameters (their norm and 16 projections on
fixed random directions).  One worker with a fixed seed is
deterministic on one machine, so two trees that train identically give
identical episodes and parameters there.  Across CPUs the parameters are not
bit-identical (Numba's and OpenBLAS's vector code differ per CPU), so the
summary is compared with a tolerance, :data:`PARAMS_RTOL`.

    python tests/episode_log.py --env doom:basic --steps 4000 --out log.json
    python tests/episode_log.py --compare tests/data/episode_log_doom_basic.json

``tests/test_episode_log.py`` compares today's tree with the stored logs.
Their episodes were written at f1741f7, before the run-assembly redesign;
their parameter summaries by the tree of 2026-11-28 (on a Xeon, that tree's
parameters had the same SHA-256 as f1741f7's).  The batched worker's log
(``episode_log_doom_basic_batched.json``, 8 envs per worker, doom:basic's
default) was written on 2026-12-05, when it became the default.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

#: relative tolerance of the parameter summary.  Measured on doom:basic, 4,000
#: steps: another CPU's kernels (OPENBLAS_CORETYPE=Haswell on an AVX-512 EPYC)
#: move it by 4e-7, a 1 % change of the learning rate by 9e-4.
PARAMS_RTOL = 1e-5


def params_summary(params: np.ndarray) -> dict:
    """The norm and 16 projections of the flat parameters, in float64, on
    seeded standard normal directions (not unit vectors: each projection is
    of the norm's size, so a turn of the parameters weighs as much as a
    change of their length)."""
    p = np.asarray(params, dtype=np.float64)
    dirs = np.random.default_rng(0).standard_normal((16, p.size))
    return {"params_norm": float(np.linalg.norm(p)), "params_proj": (dirs @ p).tolist()}


def same_params(got: dict, want: dict, rtol: float = PARAMS_RTOL) -> bool:
    """Whether two logs' parameter summaries agree within ``rtol``."""
    g = np.array([got["params_norm"], *got["params_proj"]])
    w = np.array([want["params_norm"], *want["params_proj"]])
    return bool(np.linalg.norm(g - w) <= rtol * np.linalg.norm(w))


def episode_log(env: str, steps: int, seed: int = 0, extra=()) -> dict:
    """Train ``steps`` agent steps with one worker thread; return the log."""
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        cmd = [sys.executable, "-m", "a3c_core", "train", "--env", env, "--workers", "1",
               "--seed", str(seed), "--total-steps", str(steps), "--total-seconds", "0",
               "--run-dir", run, "--quiet", "--no-tensorboard", "--no-worker-processes", *extra]
        subprocess.run(cmd, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
        with open(os.path.join(run, "episodes.csv")) as fh:
            episodes = [[int(r["step"]), float(r["return"]), int(r["length"])]
                        for r in csv.DictReader(fh)]
        with np.load(os.path.join(run, "checkpoints", "latest.npz")) as z:
            params = np.array(z["params"], dtype=np.float32)
    return {"env": env, "steps": steps, "seed": seed, "episodes": episodes,
            **params_summary(params)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="doom:basic")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the log here (default: print it)")
    ap.add_argument("--compare", help="a stored log: train with its env, steps and seed, "
                    "exit 1 where the episodes or parameters differ")
    a = ap.parse_args(argv)
    if a.compare:
        with open(a.compare) as fh:
            want = json.load(fh)
        got = episode_log(want["env"], want["steps"], want["seed"], want.get("extra", ()))
        same = got["episodes"] == want["episodes"] and same_params(got, want)
        print(f"{a.compare}: {'the same' if same else 'DIFFERENT'} "
              f"({len(got['episodes'])} episodes against {len(want['episodes'])})")
        return 0 if same else 1
    log = episode_log(a.env, a.steps, a.seed)
    text = json.dumps(log, indent=None, separators=(",", ":"))
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
