"""Whole-A3C-loss gradient check against centred finite differences (float64).

Python: ``gradcheck('doom-lstm', steps=3)`` -> ``{tensor: max_rel_err}``.
CLI (wired as ``a3c gradcheck``)::

    a3c gradcheck [--spec doom-lstm|doom-ff|atari-lstm|mlp-lstm|mlp|all] [--steps T]
                  [--seed S] [--tol 1e-6] [--eps 1e-4] [--max-entries N]
                  [--directions K]

The analytic gradient is the engine's own (``net.loss_and_grad``: the fast
Numba/BLAS path), the numeric one uses the engine's forward.  The rollout is
random with a NON-ZERO initial LSTM state, so BPTT through the carried state
is exercised; the gradient wrt that initial state (``state.h0``/``state.c0``)
is checked too.

How each tensor is checked: ``directions`` times, a random unit direction
``v`` supported on up to ``max_entries`` random entries of the tensor (all
entries when the tensor is that small) is drawn, and the analytic directional
derivative ``a = g . v`` is compared with the centred difference
``n = (L(theta + eps v) - L(theta - eps v)) / (2 eps)``; the tensor's error is
the max over its directions of ``|a - n| / max(|a| + |n|, tiny)``.

Why directions, not single entries: in float64 the loss of the 84x84 net
carries ~1e-15 of roundoff, while single-entry gradients go down to ~1e-7,
so per-entry centred differences have a noise floor of ~1e-4 relative error
on the smallest entries whatever ``eps`` is (measured: 1e-3 at eps 1e-6,
7e-6 at eps 1e-4).  A random direction over a subset weighs every chosen
entry (a wrong entry shifts ``g . v`` by its error times ``v_i``) while its
derivative has the magnitude of a typical entry.  With ``eps = 1e-4`` the
max error over the doom and mlp specs, 3 seeds and all tensors measured 2.2e-7
(1e-6 is the default tolerance; a wrong backward gives >1e-3).  atari-lstm
(seeds 0-4, T=3): <= 3.8e-7 except seed 2, where ``conv3.bias`` reads 1.8e-6:
an ELU pre-activation near 0 (the error scales with ``eps``: 6.8e-7 at 3e-5,
4.9e-6 at 3e-4), i.e. finite-difference truncation at the kink, not the
backward.  ``eps``
1e-6 is roundoff-bound here (~3e-5) and 1e-3 is truncation-bound (ELU's
second derivative jumps at 0).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .network import SPECS, Network, build_network, network_from_spec

DEFAULT_OBS = {"doom-lstm": (1, 84, 84), "doom-ff": (1, 84, 84), "atari-lstm": (1, 42, 42),
               "mlp-lstm": (6,), "mlp": (6,)}
TINY = 1e-10


def _rel_err(a, n, tiny=TINY):
    return np.abs(a - n) / np.maximum(np.abs(a) + np.abs(n), tiny)


def random_rollout(net, steps, rng):
    """A random rollout ``(obs, actions, returns, advantages, state)`` for ``net``."""
    dt = net.dtype
    obs = rng.random((steps, *net.obs_shape)).astype(dt)
    actions = rng.integers(0, net.n_actions, steps)
    returns = rng.standard_normal(steps).astype(dt)
    advantages = rng.standard_normal(steps).astype(dt)
    state = None
    if net.recurrent:
        state = (0.5 * rng.standard_normal(net.lstm_size).astype(dt),
                 0.5 * rng.standard_normal(net.lstm_size).astype(dt))
    return obs, actions, returns, advantages, state


def gradcheck(spec_or_net="doom-lstm", *, steps=3, seed=0, eps=1e-4, obs_shape=None,
              n_actions=3, max_entries=20, directions=3, value_coef=0.5, entropy_beta=0.01,
              return_details=False):
    """Check the analytic A3C-loss gradient of a network in float64.

    ``spec_or_net``: a spec name or a :class:`Network` (copied to float64).
    Returns ``{name: max_rel_err}`` in layout order (plus ``state.h0`` and
    ``state.c0`` for LSTM nets); with ``return_details=True`` returns
    ``(errors, net)`` so callers can print shapes.
    """
    if isinstance(spec_or_net, Network):
        net = network_from_spec(spec_or_net.spec, dtype=np.float64)
        net.load_state_dict(spec_or_net.state_dict())
    else:
        if obs_shape is None:
            obs_shape = DEFAULT_OBS.get(spec_or_net, (1, 84, 84))
        net = build_network(spec_or_net, obs_shape, n_actions, dtype=np.float64, seed=seed)
    rng = np.random.default_rng(seed)
    obs, actions, returns, advantages, state = random_rollout(net, steps, rng)
    kw = {"value_coef": value_coef, "entropy_beta": entropy_beta}

    _, grads = net.loss_and_grad(obs, actions, returns, advantages, state, **kw)
    analytic = {k: v.copy() for k, v in grads.items()}
    if net.recurrent:
        analytic["state.h0"] = net.last_dstate[0].copy()
        analytic["state.c0"] = net.last_dstate[1].copy()

    def loss_at():
        return net.loss(obs, actions, returns, advantages, state, **kw)["loss"]

    targets = dict(net.state_dict())
    if net.recurrent:
        state = (state[0].copy(), state[1].copy())
        targets["state.h0"], targets["state.c0"] = state
    errors = {}
    for name, arr in targets.items():
        flat = arr.reshape(-1)
        base = flat.copy()
        g = analytic[name].reshape(-1)
        worst = 0.0
        for _ in range(directions):
            idx = np.arange(flat.size)
            if flat.size > max_entries:
                idx = rng.choice(flat.size, max_entries, replace=False)
            v = rng.standard_normal(idx.size)
            v /= np.linalg.norm(v)
            a = float(g[idx] @ v)
            flat[idx] = base[idx] + eps * v
            lp = loss_at()
            flat[idx] = base[idx] - eps * v
            lm = loss_at()
            flat[:] = base
            n = (lp - lm) / (2 * eps)
            worst = max(worst, float(_rel_err(a, n)))
        errors[name] = worst
    return (errors, net) if return_details else errors


def main(argv=None) -> int:
    """``a3c gradcheck``: print ``name shape max_rel_err ok/FAIL``; 0 if all pass."""
    ap = argparse.ArgumentParser(
        prog="a3c gradcheck",
        description="Check the A3C loss gradient of a network against centred finite "
                    "differences in float64.")
    ap.add_argument("--spec", default="doom-lstm", choices=list(SPECS) + ["all"],
                    help="network spec to check (default doom-lstm)")
    ap.add_argument("--steps", type=int, default=3, help="rollout length T (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights and rollout")
    ap.add_argument("--tol", type=float, default=1e-6, help="max relative error (1e-6)")
    ap.add_argument("--eps", type=float, default=1e-4,
                    help="finite-difference step along a unit direction (default 1e-4)")
    ap.add_argument("--max-entries", type=int, default=20,
                    help="entries per random direction (random subset; default 20)")
    ap.add_argument("--directions", type=int, default=3,
                    help="random directions per tensor (default 3)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    specs = list(SPECS) if args.spec == "all" else [args.spec]
    ok_all = True
    for spec in specs:
        errors, net = gradcheck(spec, steps=args.steps, seed=args.seed, eps=args.eps,
                                max_entries=args.max_entries, directions=args.directions,
                                return_details=True)
        print(f"# {spec} obs_shape={net.obs_shape} n_params={net.n_params} "
              f"steps={args.steps} eps={args.eps:g} tol={args.tol:g}")
        for name, err in errors.items():
            shape = net.layout.shape(name) if name in net.layout else (net.lstm_size,)
            ok = err <= args.tol
            ok_all &= ok
            print(f"{name:<18} {str(shape):<16} {err:.3e}  {'ok' if ok else 'FAIL'}")
    return 0 if ok_all else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
