"""PyTorch cross-check and speed comparison of a network (thin CLI over
:mod:`a3c_core.nn.torch_twin`, which builds the torch model from the same
layer list).

PyTorch is NOT a dependency of a3c_core; without it this script says so and
exits 0.  Install the CPU wheel only: ``pip install torch==2.13.0``.

Usage::

    python bench/torch_compare.py                       # doom-lstm: agreement + timing
    python bench/torch_compare.py --spec atari-lstm     # any spec
    python bench/torch_compare.py --check-only          # agreement only
    python bench/torch_compare.py --repeat 11 --json torch.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from a3c_core.nn.network import SPECS
from a3c_core.nn.torch_twin import TOL, check_agreement, import_torch, time_side_by_side


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="doom-lstm", choices=SPECS)
    ap.add_argument("--check-only", action="store_true", help="agreement check only, no timing")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    try:
        torch = import_torch()
    except ImportError as e:
        print(f"torch_compare: {e}; skipping")
        return 0
    out = {"torch": torch.__version__, "spec": args.spec}
    for dt in (np.float64, np.float32):
        name = np.dtype(dt).name
        errs = check_agreement(args.spec, dt)
        worst = max(errs, key=errs.get)
        print(f"agreement {args.spec} {name}: OK, worst relative error {errs[worst]:.2e} "
              f"({worst}), tolerance {TOL[name]:g}")
        out[f"agreement_{name}"] = errs
    if not args.check_only:
        rows = time_side_by_side(args.spec, repeat=args.repeat)
        print(f"\n{args.spec + ', float32, 1 thread':<34}{'a3c_core us':>12}{'torch us':>12}"
              f"{'torch/ours':>12}")
        for r in rows:
            print(f"{r['name']:<34}{r['a3c_core_us']:>12.1f}{r['torch_us']:>12.1f}"
                  f"{r['torch_over_ours']:>12.2f}")
        out["timing"] = rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
