"""One-question probe (kept in git history only): does random play on
doom:deathmatch score more when the actions are pruned or attack-heavy?

    python bench/deathmatch_probe.py 60     # episodes per distribution, seed 0
"""
import sys, time, numpy as np
from a3c_core.envs import make_env

EPIS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
with make_env("doom:deathmatch", seed=0, action_set="buttons") as env:
    names = env.action_names
    idx = {n: i for i, n in enumerate(names)}
    move = ["MOVE_RIGHT", "MOVE_LEFT", "MOVE_BACKWARD", "MOVE_FORWARD", "TURN_RIGHT", "TURN_LEFT",
            "TURN_LEFT_RIGHT_DELTA+", "TURN_LEFT_RIGHT_DELTA-"]
    pruned = ["ATTACK"] + move
    policies = {
        "uniform 23": np.ones(len(names)),
        "uniform pruned 9": np.array([1.0 if n in pruned else 0 for n in names]),
        "attack 0.5 + pruned": np.array([8.0 if n == "ATTACK" else 1.0 if n in move else 0 for n in names]),
        "attack 0.5 + turn/fwd": np.array([4.0 if n == "ATTACK" else 1.0 if n in ("TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_BACKWARD") else 0 for n in names]),
    }
    rng = np.random.default_rng(0)
    for name, w in policies.items():
        p = w / w.sum()
        rets, lens, t0 = [], [], time.time()
        for _ in range(EPIS):
            env.reset(); total, done, n = 0.0, False, 0
            while not done:
                _, r, term, trunc = env.step(int(rng.choice(len(p), p=p)))
                total += r; n += 1; done = term or trunc
            rets.append(total); lens.append(n)
        print(f"{name:26s} mean {np.mean(rets):5.2f} std {np.std(rets):4.2f} len {np.mean(lens):6.0f} ({time.time()-t0:.0f} s)", flush=True)
