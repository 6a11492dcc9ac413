"""What a doom:basic policy does, by where the monster starts on screen.

    python bench/flat_policy.py RUN_DIR_OR_CHECKPOINT [--episodes 300] [--greedy] [--seed 123]

Plays ``--episodes`` episodes of doom:basic with the checkpoint (sampled
actions, as in training, unless ``--greedy``) and groups them by the
monster's horizontal screen position at the episode's start (ViZDoom's
labels buffer, turned on for this script only). Per group: episodes, the
share that timed out, the mean raw return and length, and the share of each
action. Last, ``state dependence``: the standard deviation of the policy's
action probabilities across every step played, beside their mean. A policy
whose probabilities barely move while the monster is anywhere on screen has
learned the actions' marginal, not where to go: that is what a doom:basic
run's flat phase looks like (bench/RESULTS.md, fourth session of 2026-11-26).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="run directory or .npz")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--seed", type=int, default=123)
    a = p.parse_args(argv)

    from a3c_core.envs import doom as D
    from a3c_core.policy import Policy

    pol = Policy.load(a.checkpoint)
    if pol.meta.get("env", {}).get("id") != "doom:basic":
        p.error(f"{a.checkpoint} was trained on {pol.meta.get('env', {}).get('id')!r}, not doom:basic")

    class LabelledDoom(D.DoomEnv):
        def _configure(self, vzd, game, *args, **kw):
            super()._configure(vzd, game, *args, **kw)
            game.set_labels_buffer_enabled(True)

    env = LabelledDoom("basic", seed=a.seed)
    rng = np.random.default_rng(a.seed)
    rows, probs = [], []
    try:
        for _ in range(a.episodes):
            obs = env.reset()
            st = env._game.get_state()
            xs = [lb.x + lb.width / 2 for lb in st.labels if lb.object_name != "DoomPlayer"]
            x0 = xs[0] if xs else np.nan
            state = pol.initial_state()
            ret, n, acts = 0.0, 0, np.zeros(pol.n_actions, int)
            while True:
                pr, _, _ = pol.probs(obs, state)
                probs.append(pr)
                act, state = pol.act(obs, state, greedy=a.greedy, rng=rng)
                acts[act] += 1
                obs, r, term, trunc = env.step(act)
                ret += r
                n += 1
                if term or trunc:
                    break
            rows.append((x0, ret, n, float(trunc), *acts))
    finally:
        env.close()
    R = np.array(rows, float)
    width = env.obs_shape[1]
    names = env.action_names
    print(f"{a.checkpoint}: {a.episodes} episodes ({'greedy' if a.greedy else 'sampled'}), "
          f"monster x at the start on a {width}-pixel-wide screen")
    print("| monster x | episodes | timed out | mean return | mean length | "
          + " | ".join(names) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(names))
    edges = np.linspace(0, width, 9)
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (R[:, 0] >= lo) & (R[:, 0] < hi)
        if not m.any():
            continue
        share = R[m, 4:].sum(0) / R[m, 4:].sum()
        print(f"| {lo:.0f}–{hi:.0f} | {m.sum()} | {R[m, 3].mean():.2f} | {R[m, 1].mean():.1f} | "
              f"{R[m, 2].mean():.1f} | " + " | ".join(f"{v:.2f}" for v in share) + " |")
    P = np.array(probs)
    print(f"all: timed out {R[:, 3].mean():.2f}, mean return {R[:, 1].mean():.1f}")
    print("state dependence: action probabilities mean "
          + ", ".join(f"{n_} {m_:.2f}" for n_, m_ in zip(names, P.mean(0)))
          + "; std across steps " + ", ".join(f"{s_:.3f}" for s_ in P.std(0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
