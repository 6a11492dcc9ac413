"""Probes of the Python API for the reliability suite (``python -m reliability_probe``),
answering as the CLI does: rc 0 on success, or one ``a3c probe: error: ...`` line and
rc 2 for a ValueError, so that ``reliability_cases`` judges them like CLI commands
(an unexpected exception still ends in a traceback).

    python -m reliability_probe act-batch RUN_DIR --done 0.5

``act-batch``: ``Policy.load(RUN_DIR).act_batch`` on 4 observations of zeros with
``done`` = 4 copies of the given value (a float mask, issue 73).
"""
import argparse
import sys

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(prog="reliability_probe")
    sub = p.add_subparsers(dest="probe", required=True)
    a = sub.add_parser("act-batch")
    a.add_argument("run")
    a.add_argument("--done", type=float, required=True)
    a.add_argument("-n", type=int, default=4)
    args = p.parse_args(argv)

    from a3c_core import Policy

    policy = Policy.load(args.run)
    obs = np.zeros((args.n,) + tuple(policy.pipeline.raw_shape), np.float32)
    done = np.full(args.n, args.done)
    try:
        actions, _ = policy.act_batch(obs, policy.initial_state(args.n), done=done)
    except ValueError as e:
        print(f"a3c probe: error: {e}", file=sys.stderr)
        return 2
    print(f"accepted done={done.tolist()}: actions {actions.tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
