"""Training throughput once the agent is good (short episodes), per rollout mode.

    python bench/converged_throughput.py RUN_DIR [--workers 2] [--seconds 10] [--repeats 3]
        [--modes paper,auto]

RUN_DIR is a trained run (e.g. ``a3c train --target-reward 75 --run-dir runs/basic``):
each measurement copies it to a temporary directory and resumes from its
latest checkpoint (the run itself is not changed), so the workers play the
trained policy and its short episodes.  Modes, measured in turn (``paper``,
``auto``, ``paper``, ``auto``, ... so that machine load hits them alike):

* ``paper`` (older name: ``default``): ``--merge-below 0``, a rollout ends
  with its episode (the A3C paper's worker);
* ``auto``: the trainer's default, ``--merge-below`` at its default: the
  paper's rollouts until a worker's last 1,000 episodes average under
  ``merge_below`` steps, then ``t_max // 2`` across episodes.  The
  measurement starts once every worker has switched (the window has to
  fill first: ~10 s on a trained doom:basic agent).

A mode may end in ``@K``: the same with ``--envs-per-worker K`` (e.g.
``paper@4``; without it, 1); and in ``+p``: the same with worker processes
(``--worker-processes``, e.g. ``auto+p``, ``auto@4+p``).

Every mode sets ``merge_below``, whatever the run was trained with.

Each measurement: start, wait ``--warmup`` s, then count agent steps and
episodes over ``--seconds``.  Prints one line per measurement and a table of
medians with the per-pair ratio of each mode to paper; ``--json`` writes everything.
Never run it beside a training run: it needs every core.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time


def _split(mode):
    """``(base mode, envs per worker, worker processes)`` of ``paper``,
    ``auto@4``, ``auto+p``..."""
    procs = mode.endswith("+p")
    base, _, k = mode[:-2 if procs else None].partition("@")
    return base, int(k) if k else 1, procs


def measure(run_dir, mode, workers, seconds, warmup):
    from a3c_core.checkpoint import find_resume_checkpoint
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    full = mode
    mode, n_envs, procs = _split(mode)
    ckpt = find_resume_checkpoint(run_dir)
    saved = dict(ckpt.meta.get("config") or {})
    with tempfile.TemporaryDirectory(prefix="a3c-conv-") as tmp:
        dst = os.path.join(tmp, "run")
        shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("tb", "*.png", "errors.log"))
        fields = {k: v for k, v in saved.items() if k in Config.__dataclass_fields__}
        # no step or time limit: a resumed run's clock includes its earlier wall
        # time; the measurement stops it through stop_event
        fields.update(workers=workers, envs_per_worker=n_envs, total_steps=0, total_seconds=0.0,
                      run_dir=dst, quiet=True, tensorboard=False, checkpoint_interval=0.0,
                      target_reward=None,
                      merge_below=Config().merge_below if mode == "auto" else 0.0,
                      worker_processes=procs)
        cfg = Config(**fields)
        tr = Trainer(cfg, resume=dst, out=io.StringIO())
        err = []

        def run():
            try:
                tr.run()
            except BaseException as e:  # noqa: BLE001 - reported below
                err.append(e)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        t_end = time.perf_counter() + 120
        def started():
            return tr.live_steps() > (tr.resume_counters or (0, 0))[0]

        while not started():
            if err or time.perf_counter() > t_end:
                raise RuntimeError(f"no training steps ({err[0] if err else 'timeout'})")
            time.sleep(0.05)
        time.sleep(warmup)
        switched = None
        if mode == "auto":      # until every worker's window is full and has switched
            t_sw = time.perf_counter()
            while time.perf_counter() - t_sw < 120 and not err:
                if tr.backend.merging_workers() == workers:
                    break
                time.sleep(0.1)
            switched = time.perf_counter() - t_sw
            if tr.backend.merging_workers() != workers:
                raise RuntimeError("auto: the workers had not switched after 120 s; is the "
                                   "run's agent trained (short episodes)?")
        s0, e0, t0 = tr.live_steps(), tr.shared.episodes, time.perf_counter()
        time.sleep(seconds)
        s1, e1, t1 = tr.live_steps(), tr.shared.episodes, time.perf_counter()
        tr.stop_event.set()
        th.join(120)
        if err:
            raise err[0]
    steps, eps = s1 - s0, e1 - e0
    return {"mode": full, "steps_per_s": steps / (t1 - t0), "episodes": eps,
            "mean_episode_steps": steps / eps if eps else float("nan"),
            "seconds_to_switch": switched}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="paper,auto")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not os.path.isdir(a.run_dir):
        p.error(f"run directory not found: {a.run_dir}")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    modes = ["paper" if m == "default" else m for m in modes]    # the older name
    def known(m):
        base, _, k = m[:-2 if m.endswith("+p") else None].partition("@")
        return base in ("paper", "auto") and (not _ or (k.isdigit() and 1 <= int(k) <= 64))

    bad = [m for m in modes if not known(m)]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from paper and auto, each optionally "
                f"@E (E envs per worker, 1-64) and +p (worker processes)")
    rows = []
    for rep in range(a.repeats):
        for m in modes:
            r = measure(a.run_dir, m, a.workers, a.seconds, a.warmup)
            r["repeat"] = rep
            rows.append(r)
            print(f"repeat {rep} {m:8s} {r['steps_per_s']:8.0f} steps/s  "
                  f"{r['episodes']:6d} episodes  {r['mean_episode_steps']:.1f} steps/episode",
                  flush=True)
    print(f"\n| mode | steps/s (median of {a.repeats}) | min | max | steps/episode |")
    print("|---|---:|---:|---:|---:|")
    for m in modes:
        v = [r["steps_per_s"] for r in rows if r["mode"] == m]
        le = statistics.median(r["mean_episode_steps"] for r in rows if r["mode"] == m)
        print(f"| {m} | {statistics.median(v):,.0f} | {min(v):,.0f} | {max(v):,.0f} | {le:.1f} |")
    if "paper" in modes:
        base = [r for r in rows if r["mode"] == "paper"]
        for m in modes:
            if m == "paper":
                continue
            ratios = [c["steps_per_s"] / d["steps_per_s"]
                      for d, c in zip(base, [r for r in rows if r["mode"] == m])]
            print(f"\n{m}/paper per pair: {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"median {statistics.median(ratios):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workers": a.workers, "seconds": a.seconds, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
