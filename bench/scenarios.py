"""Scenario suite: train the shipped single-player ViZDoom scenarios with the
default settings, several seeds each, for a fixed wall-clock budget, and
tabulate what they reach beside random play and Sample Factory's published
models.

    python bench/scenarios.py --minutes 10 --seeds 0,1,2 --out bench/out/scenarios
    python bench/scenarios.py --minutes 30 --marks 10,30 --only my_way_home
    python bench/scenarios.py --out bench/out/scenarios --report

For each scenario: the random policy's average raw episode reward (uniform
actions, ``--random-episodes`` episodes); per seed one training run
(``<out>/<scenario>-s<seed>``; a run dir that already holds a finished run
is read, not retrained, so an interrupted suite goes on where it stopped,
and one that ended before ``--minutes`` is resumed to it with ``a3c train
--resume``, so a 10-minute suite's dir becomes a 30-minute one);
the avg100 at each ``--marks`` minute (the last 100 episodes finished by
then) as the median and range over the seeds; how those episodes ended at
the last mark (episodes.csv's ``end``: died, timed out, or ended alive,
which is the goal where a scenario has one; the seeds pooled); the runs
whose final avg100 is below random play (collapses); the exact commands;
one grid of learning curves (``curves.png``).  ``results.json`` and
``results.md`` (the table for docs/scenarios.md) go to ``--out``; a
scenario run again replaces its entry there, the others stay.

Runs are sequential (each uses every core: ``--workers 2`` on this machine);
never run anything else beside it.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

SCENARIOS = ("basic", "simpler_basic", "rocket_basic", "defend_the_center", "defend_the_line",
             "health_gathering", "health_gathering_supreme", "take_cover", "predict_position",
             "deadly_corridor", "my_way_home", "deathmatch")

#: Sample Factory 2's APPO models on the Hugging Face hub (edbeeching/doom_<scenario>_<seed>,
#: mean_reward as the model cards report it, in raw scenario units: SF's 0.01 reward
#: scale on basic and deadly_corridor undone) and the frames they trained for, read
#: off the checkpoint names on the hub (checkpoint_<version>_<env frames>.pth, frames
#: = agent steps x 4), where one was found.  The health scenarios are left out: SF
#: reports its own shaped reward there, not the scenario's time alive.
PUBLISHED = {"basic": "75–77 (3 seeds)",
             "defend_the_center": "24.0–25.0 (2 seeds)",
             "defend_the_line": "34.7–43.5 (3 seeds; 4.2–5.0B frames)",
             "deadly_corridor": "1,670–1,920 (4.0B frames)",
             "my_way_home": "0.98 ± 0.01 (4.4B frames)"}


def random_policy_average(scenario, episodes, seed=0):
    """Mean and std of raw episode rewards under uniform random actions, over
    the actions the defaults train with (deadly_corridor: the 54 combos)."""
    from a3c_core.envs import make_env
    from a3c_core.envs.families import family_of

    env_id = f"doom:{scenario}"
    rng = np.random.default_rng(seed)
    rets = []
    with make_env(env_id, seed=seed, action_set=family_of(env_id).defaults_for(env_id).action_set) as env:
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


def ends_by(run_dir, seconds, window=100):
    """How the last ``window`` episodes finished by ``seconds`` ended: a count
    per word of episodes.csv's ``end`` column (``died``, ``timed out``,
    ``ended alive``), most common first, as the training's final line has
    them; empty cells (episodes written before the column existed) are not
    counted, and a run without the column gives {}."""
    with open(os.path.join(run_dir, "episodes.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    k = int(np.searchsorted([float(r["wall_time"]) for r in rows], seconds, side="right"))
    return dict(collections.Counter(r["end"] for r in rows[max(0, k - window):k]
                                    if r.get("end")).most_common())


def _ends_cell(runs):
    """The seeds' avg100 windows at the last mark pooled: each end's share of
    the episodes whose end was recorded, most common first, e.g. ``died 71 %,
    ended alive 29 %``; ``–`` where no run recorded ends."""
    pooled = collections.Counter()
    for run in runs:
        pooled.update(run.get("ends") or {})
    total = sum(pooled.values())
    if not total:
        return "–"
    return ", ".join(f"{w} {100 * n / total:.0f} %" for w, n in pooled.most_common())


def avg_at(t, ret, seconds, window=100):
    """The average of the last ``window`` episodes finished by ``seconds`` (None: none yet)."""
    k = int(np.searchsorted(t, seconds, side="right"))
    return None if k == 0 else float(ret[max(0, k - window):k].mean())


def _a3c(*args):
    """Run ``a3c ARGS`` in this interpreter; returns (its stdout, wall
    seconds).  RuntimeError with its output when it fails."""
    cmd = [sys.executable, "-m", "a3c_core", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout, wall


def train(scenario, minutes, workers, seed, run_dir, extra=()):
    args = ["train", "--env", f"doom:{scenario}", "--workers", str(workers), "--seed", str(seed),
            "--total-steps", "0", "--total-seconds", str(minutes * 60), "--run-dir", run_dir,
            "--quiet", *extra]
    out, wall = _a3c(*args)
    return " ".join(["a3c", *args]), wall, out.strip().splitlines()[-1]


def plot(results, out_png):
    """One panel per scenario: each seed's avg100 over wall time, random play dashed."""
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
        for run in res["runs"]:
            t, ret = read_episodes(run["run_dir"])
            if ret.size:
                k = min(100, ret.size)
                ma = np.convolve(ret, np.ones(k) / k, mode="valid")
                ax.plot(t[k - 1:] / 60, ma, lw=1, label=f"seed {run['seed']}")
        ax.axhline(res["random_avg"], color="gray", ls="--", lw=1, label="random")
        ax.set_title(f"{res['scenario']} (avg100)", fontsize=9)
        ax.set_xlabel("wall time (min)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=5, loc="lower right")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"wrote {out_png}")


def _spread(values):
    """``median [min–max]`` of the values that are not None (a run that ended
    before the mark has None), ``(k of n seeds)`` after it when some are
    None, or n/a."""
    v = [x for x in values if x is not None]
    if not v:
        return "n/a"
    fmt = (lambda x: f"{x:,.2f}") if max(abs(x) for x in v) < 10 else (lambda x: f"{x:,.1f}")
    text = fmt(v[0]) if len(v) == 1 else f"{fmt(float(np.median(v)))} [{fmt(min(v))} – {fmt(max(v))}]"
    return text if len(v) == len(values) else f"{text} ({len(v)} of {len(values)} seeds)"


def markdown(results):
    """The scenario table (markdown) and the commands: per scenario the random
    policy's average, Sample Factory's published figure, the avg100 at each
    mark (median [range] over the seeds), how the last mark's windows ended,
    the runs that ended below random play, the seeds and the agent steps of
    the median run."""
    marks = sorted({m for r in results for m in r["marks"]})
    head = " | ".join(f"avg100 at {m:g} min" for m in marks)
    lines = [f"| scenario | random | Sample Factory 2 | {head} | how those episodes ended "
             f"(at {marks[-1]:g} min, seeds pooled) | below random at the end | seeds "
             f"| agent steps (median) |",
             "|---|---:|---:|" + "---:|" * len(marks) + "---|---:|---:|---:|"]
    for r in results:
        cells = [_spread([run["avg_at"].get(f"{m:g}") for run in r["runs"]]) for m in marks]
        below = sum(1 for run in r["runs"]
                    if run["final_avg100"] is not None and run["final_avg100"] < r["random_avg"])
        steps = int(np.median([run["steps"] for run in r["runs"]])) if r["runs"] else 0
        lines.append(f"| {r['scenario']} | {r['random_avg']:,.1f} | {PUBLISHED.get(r['scenario'], '–')} "
                     f"| {' | '.join(cells)} | {_ends_cell(r['runs'])} | {below} of {len(r['runs'])} "
                     f"| {','.join(str(run['seed']) for run in r['runs'])} | {steps:,} |")
    lines.append("")
    lines.append("Commands (each scenario's first seed; the others differ only in --seed "
                 "and --run-dir):")
    lines += [f"- `{run['command']}`" for r in results for run in r["runs"][:1]]
    return "\n".join(lines) + "\n"


def report(results, out):
    """Write ``results.md`` and ``curves.png`` to ``out`` and print the table."""
    table = markdown(results)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(table)
    if results:
        plot(results, os.path.join(out, "curves.png"))
    print(table)


def load(out):
    """The suite's results so far (``out``/results.json; [] when none)."""
    try:
        with open(os.path.join(out, "results.json")) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return []


def save(results, out):
    """Merge ``results`` into ``out``/results.json: a scenario measured now
    replaces its old entry, the others stay (a suite may be run one scenario,
    or one set of seeds, at a time); the file keeps :data:`SCENARIOS` order."""
    merged = {r["scenario"]: r for r in load(out)}
    merged.update({r["scenario"]: r for r in results})
    order = {name: i for i, name in enumerate(SCENARIOS)}
    rows = sorted(merged.values(), key=lambda r: order.get(r["scenario"], len(order)))
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(rows, fh, indent=1)
    os.replace(tmp, os.path.join(out, "results.json"))


def run_summary(run_dir, seed, marks, command, wall):
    """One seed's figures from its run dir (episodes.csv and summary.json)."""
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    t, ret = read_episodes(run_dir)
    with open(os.path.join(run_dir, "episodes.csv"), newline="") as fh:
        steps = np.array([int(r["step"]) for r in csv.DictReader(fh)])
    # the agent steps by the last mark (a longer run read at 10 minutes counts to there)
    k = int(np.searchsorted(t, max(marks) * 60, side="right"))
    return {"seed": seed, "run_dir": run_dir, "command": command, "wall_s": wall,
            "steps": int(steps[k - 1]) if k else 0, "episodes": k,
            "ends": ends_by(run_dir, max(marks) * 60),
            "final_avg100": summary.get("moving_avg"), "final_long": summary.get("long_avg"),
            # a mark past the run's end (a 10-minute run read at 30) has no figure
            "avg_at": {f"{m:g}": avg_at(t, ret, m * 60) if m * 60 <= summary.get("seconds", np.inf) + 1 else None
                       for m in marks}}


def short_of(run_dir, minutes):
    """The seconds a finished run in ``run_dir`` ended short of ``minutes``
    (0.0 when it reached them; its summary.json's ``seconds``, with a
    second's slack for the stop's granularity)."""
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    if not isinstance(summary, dict):
        raise ValueError(f"a JSON {type(summary).__name__}, not an object")
    seconds = float(summary.get("seconds", 0.0))
    short = minutes * 60 - seconds
    return short if short > 1.0 else 0.0


def budget_of(run_dir):
    """The ``total_seconds`` budget the run in ``run_dir`` was given (its
    config.toml, as ``a3c train --resume`` reads it; a resumed run's is its
    last budget), or None when the config cannot be read."""
    from a3c_core.train.config import Config, ConfigError

    try:
        return Config.from_toml(os.path.join(run_dir, "config.toml"), saved_run=True).total_seconds
    except ConfigError:
        return None


def extend(run_dir, minutes):
    """Resume the finished run in ``run_dir`` until ``minutes`` of training
    in all (its own config, seed and workers: ``a3c train --resume``).
    Returns (the command as shown, its wall seconds)."""
    args = ["train", "--resume", run_dir, "--total-seconds", f"{minutes * 60:g}"]
    _, wall = _a3c(*args, "--quiet")
    return " ".join(["a3c", *args]), wall


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per run")
    p.add_argument("--marks", default="",
                   help="comma-separated minutes at which to read the avg100 (default: --minutes)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    p.add_argument("--only", default="", help="comma-separated subset of scenarios")
    p.add_argument("--random-episodes", type=int, default=30)
    p.add_argument("--out", default="bench/out/scenarios")
    p.add_argument("--train-args", default="",
                   help="extra flags for every `a3c train`, one string, e.g. "
                        "--train-args='--self-imitation' (default: none, the defaults)")
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
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        marks = [float(x) for x in args.marks.split(",") if x.strip()] or [args.minutes]
    except ValueError as e:
        p.error(f"--seeds and --marks are comma-separated numbers: {e}")
    if not seeds or min(marks) <= 0 or max(marks) > args.minutes:
        p.error("need at least one seed, and marks in (0, --minutes]")
    os.makedirs(args.out, exist_ok=True)
    results, failed = [], []
    for name in names:
        rnd, rnd_std = random_policy_average(name, args.random_episodes, seeds[0])
        res = {"scenario": name, "random_avg": rnd, "random_std": rnd_std, "marks": marks,
               "runs": []}
        for seed in seeds:
            run_dir = os.path.join(args.out, f"{name}-s{seed}")
            cmd = ["a3c", "train", "--env", f"doom:{name}", "--workers", str(args.workers),
                   "--seed", str(seed), "--total-steps", "0",
                   "--total-seconds", f"{args.minutes * 60:g}", *shlex.split(args.train_args)]
            if os.path.exists(os.path.join(run_dir, "summary.json")):
                command, wall = " ".join(cmd), None
                try:
                    short = short_of(run_dir, args.minutes)
                except (OSError, ValueError, TypeError) as e:
                    p.error(f"{run_dir}/summary.json is not a run's summary ({e}); "
                            "restore it or remove the run dir")
                if short:
                    # the run as it was: its own budget, then the resume
                    before = args.minutes * 60 - short
                    command = command.replace(f"--total-seconds {args.minutes * 60:g}",
                                              f"--total-seconds {before:.0f}")
                    print(f"{name} seed {seed}: resuming the run in {run_dir}, {short:.0f} s "
                          f"short of {args.minutes:g} min", flush=True)
                    try:
                        resumed, wall = extend(run_dir, args.minutes)
                    except RuntimeError as e:
                        print(f"{name} seed {seed}: FAILED\n{e}", file=sys.stderr, flush=True)
                        failed.append(f"{name}-s{seed}")
                        continue
                    command = f"{command}; then {resumed}"
                else:
                    # a longer run read at earlier marks: the budget it ran, not --minutes
                    budget = budget_of(run_dir)
                    if budget and budget > args.minutes * 60:
                        command = command.replace(f"--total-seconds {args.minutes * 60:g}",
                                                  f"--total-seconds {budget:g}")
                    print(f"{name} seed {seed}: reading the finished run in {run_dir}", flush=True)
            elif os.path.exists(run_dir):
                p.error(f"{run_dir} exists without a finished run; remove it")
            else:
                try:
                    command, wall, final = train(name, args.minutes, args.workers, seed,
                                                 run_dir, shlex.split(args.train_args))
                except RuntimeError as e:  # one run's failure must not lose the others
                    print(f"{name} seed {seed}: FAILED\n{e}", file=sys.stderr, flush=True)
                    failed.append(f"{name}-s{seed}")
                    continue
                print(f"{name} seed {seed}: random {rnd:.1f}; {final}", flush=True)
            res["runs"].append(run_summary(run_dir, seed, marks, command, wall))
        results.append(res)
        save(results, args.out)
    report(load(args.out), args.out)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
