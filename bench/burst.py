"""What a burst of large gradients does to a converged agent, with and without
Adam's relative clip (``--adam-clip-relative``).

    python bench/burst.py RUN_DIR [--clip 0,4] [--bursts 1,5,20] [--norm 40]
                          [--episodes 300] [--repeats 3] [--json out.json]

RUN_DIR is a converged run (e.g. ``a3c train --total-steps 1000000``) whose
latest checkpoint holds the parameters AND Adam's moments as they were after
convergence (the run is copied, not changed).  For every clip setting and
burst length K, in turn, from the same saved state each time:

1. K rollouts of the converged policy (one worker, nothing applied) give K
   real gradients (``--source long``: only rollouts cut by ``t_max``, from
   episodes that last longer than ``t_max`` steps, the failures a collapse
   starts with in bench/RESULTS.md); each is rescaled to ``--norm`` (40 =
   what the default norm clip lets through; the collapse had a gradient norm
   of 76-91 before the clip; 0 = keep the gradient's own norm);
2. the K gradients are applied through ``SharedState.apply`` (norm clip,
   then the relative clip when it is on), exactly as a worker's update;
3. the agent plays ``--episodes`` episodes with the new parameters, nothing
   applied: their mean return, and the mean |change| of the weights in units
   of lr per update.

K = 0 is the converged agent itself.  One process, one worker thread; a
measurement of learning state, not of speed, but it still needs the cores:
do not run it beside a training run.
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

import numpy as np


def _load(run_dir, tmp):
    from a3c_core.checkpoint import find_resume_checkpoint
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    ckpt = find_resume_checkpoint(run_dir)
    if ckpt.meta.get("optimizer") != "adam":
        raise SystemExit(f"{run_dir}: trained with {ckpt.meta.get('optimizer')!r}; "
                         "the relative clip is Adam's")
    dst = os.path.join(tmp, "run")
    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("tb", "*.png", "errors.log"))
    saved = dict(ckpt.meta.get("config") or {})
    fields = {k: v for k, v in saved.items() if k in Config.__dataclass_fields__}
    fields.update(workers=1, total_steps=0, total_seconds=0.0, run_dir=dst, quiet=True,
                  tensorboard=False, checkpoint_interval=0.0, target_reward=None)
    return Trainer(Config(**fields), resume=dst, out=io.StringIO())


class _Capture:
    """Wraps the trainer's store: ``apply`` keeps a copy of the gradient (or
    nothing) instead of applying it; episodes are collected."""

    syncs_on_apply = False

    def __init__(self, inner):
        self.inner, self.grads, self.returns, self.keep = inner, [], [], False

    steps = property(lambda self: self.inner.steps)

    def pull(self, local):
        self.inner.pull(local)

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        if self.keep:
            self.grads.append(np.array(grads, np.float32))
        return float(np.linalg.norm(grads)), False

    def add_steps(self, n):
        return self.inner.steps

    def record_episode(self, wid, raw_return, length):
        self.returns.append(float(raw_return))

    def reward_scale(self, returns):
        return self.inner.reward_scale(returns)

    def advantage_scale(self, advantages):
        return self.inner.advantage_scale(advantages)


def run(args):
    with tempfile.TemporaryDirectory(prefix="a3c-burst-") as tmp:
        tr = _load(args.run_dir, tmp)
        try:
            return _trials(tr, args)
        finally:
            tr.close()


def _trials(tr, args):
    shared, opt = tr.shared, tr.shared.optimizer
    state0 = shared.state_dict()
    norms0 = [(n, n.state_dict()) for n in (tr.normalizer, tr.adv_normalizer) if n is not None]
    tr._warm_up()
    w = tr._make_worker(0)
    cap = _Capture(w.store)
    w.store = cap
    cfg = tr.cfg
    rows = []

    def play(episodes):
        cap.keep, cap.returns = False, []
        w.start_episode()
        w.ep_return, w.ep_length = 0.0, 0
        while len(cap.returns) < episodes:
            w.rollout()
        return float(np.mean(cap.returns[:episodes]))

    for rep in range(args.repeats):
        for clip in args.clip:
            for k in args.bursts:
                shared.load_state_dict(state0)
                for n, st in norms0:
                    n.load_state_dict(st)
                opt.clip_relative = clip
                opt.relative_clips = opt.relative_checks = 0
                before = shared.params.copy()
                norms = []
                if k:
                    grads = []
                    w.start_episode()
                    while len(grads) < k:
                        cap.keep, cap.grads = True, []
                        n, term, trunc, _ = w.rollout()
                        # "long": only rollouts cut by t_max, i.e. inside an episode that
                        # already lasts longer than t_max steps (a converged basic agent
                        # needs ~6: these are the episodes it is failing)
                        if cap.grads and (args.source == "any" or (n == cfg.t_max and not term)):
                            grads.append(cap.grads[0])
                    cap.keep = False
                    for g in grads:
                        gn = float(np.linalg.norm(g.astype(np.float64)))
                        norms.append(gn)
                        if args.norm > 0:
                            g *= np.float32(args.norm / gn)
                        shared.apply(g, cfg.max_grad_norm)
                move = float(np.abs(shared.params - before).mean() / opt.lr / max(k, 1))
                ret = play(args.episodes)
                row = dict(repeat=rep, clip=clip, bursts=k, mean_return=ret,
                           move_per_update_lr=move, relative_clips=opt.relative_clips,
                           expected_norm=opt.expected_grad_norm(),
                           real_grad_norm=(statistics.median(norms) if norms else None))
                rows.append(row)
                print(f"repeat {rep} clip {clip:g} bursts {k:3d}: return {ret:7.1f}  "
                      f"|dw| {move:.3f} lr/update  relative clips {opt.relative_clips}  "
                      f"(real |g| median {row['real_grad_norm'] or 0:.2f}, "
                      f"Adam expects {row['expected_norm']:.2f})", flush=True)
    return rows


def table(rows, clips, bursts):
    out = ["| bursts K | " + " | ".join(f"clip {c:g}: return (median)" for c in clips)
           + " | " + " | ".join(f"clip {c:g}: \\|Δw\\|/lr per update" for c in clips) + " |",
           "|---:|" + "---:|" * (2 * len(clips))]
    for k in bursts:
        cells = []
        for key in ("mean_return", "move_per_update_lr"):
            for c in clips:
                v = [r[key] for r in rows if r["clip"] == c and r["bursts"] == k]
                lo, hi = min(v), max(v)
                cells.append(f"{statistics.median(v):.1f} ({lo:.1f}–{hi:.1f})" if key == "mean_return"
                             else f"{statistics.median(v):.3f}")
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--clip", default="0,4", help="comma-separated clip_relative values (0 = off)")
    p.add_argument("--bursts", default="0,1,5,20", help="comma-separated burst lengths K")
    p.add_argument("--norm", type=float, default=40.0,
                   help="rescale each burst gradient to this norm (0 = keep its own)")
    p.add_argument("--source", choices=("any", "long"), default="any",
                   help="burst gradients from any rollout, or only from rollouts cut by "
                        "t_max (episodes longer than t_max steps: a converged agent failing)")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    try:
        args.clip = [float(x) for x in args.clip.split(",") if x]
        args.bursts = [int(x) for x in args.bursts.split(",") if x]
    except ValueError as e:
        p.error(f"--clip/--bursts: {e}")
    if any(c < 0 for c in args.clip) or any(k < 0 for k in args.bursts) or not args.norm >= 0:
        p.error("--clip, --bursts and --norm must be >= 0")
    if not os.path.isdir(args.run_dir):
        p.error(f"run directory not found: {args.run_dir}")
    rows = run(args)
    print(table(rows, args.clip, args.bursts))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
