"""Scenario suite: train every shipped single-player ViZDoom scenario with the
default settings for a fixed wall-clock budget and record what it reaches.

    python bench/scenarios.py --minutes 10 --out bench/out/scenarios
    python bench/scenarios.py --minutes 10 --only basic,take_cover

For each scenario it records: the random policy's average raw episode reward
(uniform actions, ``--random-episodes`` episodes), the training run's final
averages (last 100 and last 1,000 episodes, or all when fewer), the best long
average, the steps and episodes done, the exact command, and a learning curve
(one grid PNG, ``curves.png``).  ``results.json`` and ``results.md`` (a
markdown table for docs/results.md) go to ``--out``.

Runs are sequential (each uses every core: ``--workers 2`` on this machine);
never run anything else beside it.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

SCENARIOS = ("basic", "simpler_basic", "rocket_basic", "defend_the_line", "health_gathering",
             "health_gathering_supreme", "take_cover", "predict_position", "deadly_corridor",
             "my_way_home")


def random_policy_average(scenario, episodes, seed=0):
    """Mean and std of raw episode rewards under uniform random actions."""
    from a3c_core.envs import make_env

    rng = np.random.default_rng(seed)
    rets = []
    with make_env(f"doom:{scenario}", seed=seed) as env:
        for _ in range(episodes):
            env.reset()
            total, done = 0.0, False
            while not done:
                _, r, term, trunc = env.step(int(rng.integers(env.n_actions)))
                total += r
                done = term or trunc
            rets.append(total)
    return float(np.mean(rets)), float(np.std(rets))


def read_episodes(run_dir):
    with open(os.path.join(run_dir, "episodes.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    t = np.array([float(r["wall_time"]) for r in rows])
    ret = np.array([float(r["return"]) for r in rows])
    return t, ret


def train(scenario, minutes, workers, seed, run_dir, extra=()):
    cmd = [sys.executable, "-m", "a3c_core", "train", "--env", f"doom:{scenario}",
           "--workers", str(workers), "--seed", str(seed), "--total-steps", "0",
           "--total-seconds", str(minutes * 60), "--run-dir", run_dir, "--quiet", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    shown = ["a3c", *cmd[3:]]
    return " ".join(shown), wall, proc.stdout.strip().splitlines()[-1]


def plot(results, out_png):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curves.png (pip install 'a3c_core[plot]')")
        return
    n = len(results)
    cols = min(5, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax, res in zip(axes.flat, results):
        t, ret = read_episodes(res["run_dir"])
        ax.plot(t, ret, ".", ms=1, alpha=0.25, color="tab:blue")
        if ret.size:
            k = min(100, ret.size)
            ma = np.convolve(ret, np.ones(k) / k, mode="valid")
            ax.plot(t[k - 1:], ma, color="tab:red", lw=1.2, label=f"avg{k}")
        ax.axhline(res["random_avg"], color="gray", ls="--", lw=1, label="random")
        ax.set_title(res["scenario"], fontsize=9)
        ax.set_xlabel("wall time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"wrote {out_png}")


def markdown(results):
    """The results table (markdown) and the commands.  ``× random`` is the final
    long average over the random policy's where the latter is positive;
    ``gain`` is their difference (every scenario)."""
    lines = ["| scenario | random avg | final avg100 | final avg1000 | best long avg | gain | × random "
             "| steps | episodes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        def f(x):
            return "n/a" if x is None else f"{x:.1f}"
        final = r["final_long"] if r["final_long"] is not None else r["final_avg100"]
        gain = None if final is None else final - r["random_avg"]
        ratio = f"{final / r['random_avg']:.2f}" if final is not None and r["random_avg"] > 0 else "–"
        lines.append(f"| {r['scenario']} | {r['random_avg']:.1f} ± {r['random_std']:.1f} | "
                     f"{f(r['final_avg100'])} | {f(r['final_long'])} | {f(r['best_long'])} | "
                     f"{f(gain)} | {ratio} | {r['steps']:,} | {r['episodes']:,} |")
    lines.append("")
    lines.append("Commands:")
    lines += [f"- `{r['command']}`" for r in results]
    return "\n".join(lines) + "\n"


def report(results, out):
    """Write ``results.md`` and ``curves.png`` to ``out`` and print the table."""
    table = markdown(results)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(table)
    if results:
        plot(results, os.path.join(out, "curves.png"))
    print(table)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per scenario")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="", help="comma-separated subset of scenarios")
    p.add_argument("--random-episodes", type=int, default=30)
    p.add_argument("--out", default="bench/out/scenarios")
    p.add_argument("--train-args", default="",
                   help="extra flags for every `a3c train`, one string, e.g. "
                        "--train-args='--normalize-advantages' (default: none, the defaults)")
    p.add_argument("--report", action="store_true",
                   help="only rewrite results.md and curves.png from --out's results.json")
    args = p.parse_args(argv)
    if args.report:
        path = os.path.join(args.out, "results.json")
        try:
            with open(path) as fh:
                results = json.load(fh)
        except (OSError, ValueError) as e:
            p.error(f"--report needs a suite's {path}: {e}")
        report(results, args.out)
        return 0
    names = [s for s in args.only.split(",") if s] or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        p.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    os.makedirs(args.out, exist_ok=True)
    results, failed = [], []
    for name in names:
        run_dir = os.path.join(args.out, f"{name}-s{args.seed}")
        if os.path.exists(run_dir):
            p.error(f"{run_dir} exists; remove it or choose another --out")
        rnd, rnd_std = random_policy_average(name, args.random_episodes, args.seed)
        try:
            command, wall, final = train(name, args.minutes, args.workers, args.seed, run_dir,
                                         shlex.split(args.train_args))
        except RuntimeError as e:   # one scenario's failure must not lose the others
            print(f"{name}: FAILED\n{e}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        summary = json.load(open(os.path.join(run_dir, "summary.json")))
        res = {"scenario": name, "random_avg": rnd, "random_std": rnd_std,
               "final_avg100": summary.get("moving_avg"), "final_long": summary.get("long_avg"),
               "best_long": summary.get("best_avg"), "steps": summary["steps"],
               "episodes": summary["episodes"], "wall_s": wall, "command": command,
               "final_line": final, "run_dir": run_dir}
        results.append(res)
        print(f"{name}: random {rnd:.1f}; {final}", flush=True)
        with open(os.path.join(args.out, "results.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    report(results, args.out)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
