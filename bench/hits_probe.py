"""Whose kills does random play score?  Uniform random actions on a Doom
scenario; per episode the return and the change in ViZDoom's HITCOUNT
(the player's hits), DAMAGECOUNT and KILLCOUNT.  One-off check for
docs/scenarios.md#deathmatch.

    python bench/hits_probe.py deathmatch 20 --seed 1
    python bench/hits_probe.py defend_the_center 3 --seed 0
"""
import argparse

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario")
    p.add_argument("episodes", type=int)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import vizdoom as vzd

    from a3c_core.envs import make_env

    rng = np.random.default_rng(args.seed)
    names = ("HITCOUNT", "DAMAGECOUNT", "KILLCOUNT")
    gvars = [getattr(vzd.GameVariable, n) for n in names]
    rows = []
    with make_env(f"doom:{args.scenario}", seed=args.seed) as env:
        game = env._game
        for _ in range(args.episodes):
            env.reset()
            start = [game.get_game_variable(v) for v in gvars]
            last, ret = start, 0.0
            while True:
                _, r, term, trunc = env.step(int(rng.integers(env.n_actions)))
                ret += r
                if term or trunc:     # the engine has no variables once it is over
                    break
                last = [game.get_game_variable(v) for v in gvars]
            rows.append([ret] + [b - a for a, b in zip(start, last)])
    a = np.array(rows)
    print("return, " + ", ".join(names) + " per episode:", a.tolist())
    print(f"mean return {a[:, 0].mean():.2f}, kills {a[:, 3].mean():.2f}, hits {a[:, 1].mean():.2f}; "
          f"episodes with a hit {(a[:, 1] > 0).sum()}/{len(a)}; "
          f"with a positive return and no hit {((a[:, 0] > 0) & (a[:, 1] == 0)).sum()}")


if __name__ == "__main__":
    main()
