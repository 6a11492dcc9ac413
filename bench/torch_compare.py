"""Optional PyTorch cross-check and speed comparison of the ``doom-lstm`` network.

The same network written in PyTorch (conv1 1->16 8x8/4, ELU, conv2 16->32
4x4/2, ELU, fc 2592->256, ELU, LSTMCell 256, policy 256->A + softmax, value
256->1) with the module names of our layout, so

    model.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})

copies our weights in.  Two things are done:

1. **agreement**: batch-1 ``step`` outputs (probs, value, h, c over several
   carried steps) and the ``loss_and_grad`` loss and every gradient over a
   20-step rollout match, float64 tightly (rel. 1e-9) and float32 loosely
   (rel. 1e-3 of each tensor's largest magnitude);
2. **timing** (float32, one thread each: ``torch.set_num_threads(1)`` and
   one BLAS thread for numpy): batch-1 step and 20-step forward+backward,
   side by side in one process, with the ratio torch / a3c_core.

PyTorch is NOT a dependency of a3c_core; this script is skipped cleanly when
torch is not importable.  Install the CPU wheel only:
``pip install torch==2.13.0`` (never plain ``torch``: it pulls CUDA).

Usage::

    python bench/torch_compare.py                # agreement + timing table
    python bench/torch_compare.py --check-only   # agreement only
    python bench/torch_compare.py --repeat 11 --json torch.json
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
    nn = None

TOL = {"float64": 1e-9, "float32": 1e-3}


def require_torch():
    if torch is None:
        raise SystemExit("torch_compare: PyTorch is not installed (optional): "
                         "pip install torch==2.13.0  # the CPU wheel")


if torch is not None:

    class TorchDoomLSTM(nn.Module):
        """doom-lstm in PyTorch; parameter names match ``Network.state_dict()``."""

        def __init__(self, n_actions=3, in_ch=1, fc_in=2592, hidden=256):
            super().__init__()
            self.conv1 = nn.Conv2d(in_ch, 16, 8, stride=4)
            self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
            self.fc = nn.Linear(fc_in, 256)
            self.lstm = nn.LSTMCell(256, hidden)
            self.policy = nn.Linear(hidden, n_actions)
            self.value = nn.Linear(hidden, 1)

        def features(self, x):
            """x (T, C, H, W) -> (T, 256) after conv, conv, fc (all ELU)."""
            f = nn.functional
            x = f.elu(self.conv1(x))
            x = f.elu(self.conv2(x))
            return f.elu(self.fc(x.flatten(1)))

        def forward(self, x, state):
            """Unroll over T: x (T, C, H, W), state (h, c) each (1, H) ->
            (logits (T, A), values (T,), (h, c))."""
            feats = self.features(x)
            h, c = state
            hs = []
            for t in range(feats.shape[0]):
                h, c = self.lstm(feats[t:t + 1], (h, c))
                hs.append(h)
            hs = torch.cat(hs, 0)
            return self.policy(hs), self.value(hs)[:, 0], (h, c)


def build_pair(n_actions=3, dtype=np.float32, seed=0):
    """``(net, model)``: our doom-lstm and the PyTorch twin with the same weights."""
    require_torch()
    from a3c_core.nn.network import build_network

    net = build_network("doom-lstm", (1, 84, 84), n_actions, dtype=dtype, seed=seed)
    model = TorchDoomLSTM(n_actions)
    model.to(torch.float64 if np.dtype(dtype) == np.float64 else torch.float32)
    missing = model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    return net, model


def torch_state(state, like):
    h, c = state
    return (torch.from_numpy(np.array(h)).reshape(1, -1).to(like.dtype),
            torch.from_numpy(np.array(c)).reshape(1, -1).to(like.dtype))


def torch_loss_and_grad(model, obs, actions, returns, adv, state, value_coef=0.5, entropy_beta=0.01):
    """The A3C loss of ``Network.loss_and_grad`` (sums over T) and its grads."""
    p0 = next(model.parameters())
    x = torch.from_numpy(obs).to(p0.dtype)
    logits, values, _ = model(x, torch_state(state, p0))
    logp = torch.log_softmax(logits, 1)
    a = torch.from_numpy(actions).long()
    R = torch.from_numpy(returns).to(p0.dtype)
    A = torch.from_numpy(adv).to(p0.dtype)
    policy_loss = -(logp.gather(1, a[:, None])[:, 0] * A).sum()
    value_loss = 0.5 * ((R - values) ** 2).sum()
    entropy = -(logp.exp() * logp).sum()
    loss = policy_loss + value_coef * value_loss - entropy_beta * entropy
    model.zero_grad(set_to_none=False)
    loss.backward()
    return float(loss.detach()), {k: p.grad.detach().numpy() for k, p in model.named_parameters()}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def rollout(T, n_actions, dtype, seed=1):
    rng = np.random.default_rng(seed)
    obs = rng.random((T, 1, 84, 84)).astype(dtype)
    actions = rng.integers(0, n_actions, T).astype(np.int64)
    returns = rng.standard_normal(T).astype(dtype)
    adv = rng.standard_normal(T).astype(dtype)
    return obs, actions, returns, adv


def check_agreement(dtype=np.float64, T=20, n_actions=3, seed=0, steps=5) -> dict:
    """Max relative errors (ours vs torch) of step outputs, loss and each grad.

    Raises ``AssertionError`` when any exceeds ``TOL[dtype]``.
    """
    require_torch()
    dtype = np.dtype(dtype)
    net, model = build_pair(n_actions, dtype, seed)
    obs, actions, returns, adv = rollout(T, n_actions, dtype)
    rng = np.random.default_rng(2)
    errs = {}
    # step: carry the state over a few frames, from a non-zero initial state
    h0 = (rng.standard_normal(256) * 0.5).astype(dtype)
    c0 = (rng.standard_normal(256) * 0.5).astype(dtype)
    st, tst = (h0, c0), torch_state((h0, c0), next(model.parameters()))
    with torch.no_grad():
        for t in range(steps):
            probs, v, st = net.step(obs[t], st)
            logits, tv, tst = model(torch.from_numpy(obs[t:t + 1]), tst)
            tp = torch.softmax(logits, 1)[0].numpy()
            for key, (a, b) in {"step.probs": (probs, tp), "step.value": (v, tv.numpy()),
                                "step.h": (st[0], tst[0][0].numpy()),
                                "step.c": (st[1], tst[1][0].numpy())}.items():
                errs[key] = max(errs.get(key, 0.0), _rel(a, b))
    # loss_and_grad from a non-zero initial state (BPTT into it)
    stats, grads = net.loss_and_grad(obs, actions, returns, adv, (h0, c0), value_coef=0.5, entropy_beta=0.01)
    tloss, tgrads = torch_loss_and_grad(model, obs, actions, returns, adv, (h0, c0))
    errs["loss"] = _rel(stats["loss"], tloss)
    for k, g in tgrads.items():
        errs[f"grad.{k}"] = _rel(grads[k], g)
    tol = TOL[dtype.name]
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{dtype.name}: a3c_core and torch disagree beyond {tol:g}: {bad}"
    return errs


def time_side_by_side(T=20, repeat=7, min_time=0.1, n_actions=3) -> list[dict]:
    """Median us of batch-1 step and T-step fwd+bwd: ours vs torch (1 thread each)."""
    require_torch()
    from a3c_core._blas import limit_blas_threads
    from a3c_core.bench import time_call

    limit_blas_threads(1)
    torch.set_num_threads(1)
    net, model = build_pair(n_actions, np.float32)
    obs, actions, returns, adv = rollout(T, n_actions, np.float32)
    hold = [net.initial_state()]
    thold = [(torch.zeros(1, 256), torch.zeros(1, 256))]
    x1 = torch.from_numpy(obs[:1])

    def ours_step():
        _, _, hold[0] = net.step(obs[0], hold[0])

    def torch_step():
        with torch.inference_mode():
            logits, v, thold[0] = model(x1, thold[0])
            torch.softmax(logits, 1)

    s0 = net.initial_state()

    def ours_update():
        net.loss_and_grad(obs, actions, returns, adv, s0, value_coef=0.5, entropy_beta=0.01)

    def torch_update():
        torch_loss_and_grad(model, obs, actions, returns, adv, s0)

    rows = []
    for name, ours, theirs in (("step (batch 1)", ours_step, torch_step),
                               (f"forward+backward T={T}", ours_update, torch_update)):
        a = float(np.median(time_call(ours, repeat=repeat, min_time=min_time))) * 1e6
        b = float(np.median(time_call(theirs, repeat=repeat, min_time=min_time))) * 1e6
        rows.append({"name": name, "a3c_core_us": a, "torch_us": b, "torch_over_ours": b / a})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-only", action="store_true", help="agreement check only, no timing")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if torch is None:
        print("torch_compare: PyTorch is not installed; skipping (optional: pip install torch==2.13.0)")
        return 0
    out = {"torch": torch.__version__}
    for dt in (np.float64, np.float32):
        errs = check_agreement(dt)
        worst = max(errs, key=errs.get)
        print(f"agreement {np.dtype(dt).name}: OK, worst relative error {errs[worst]:.2e} ({worst}), "
              f"tolerance {TOL[np.dtype(dt).name]:g}")
        out[f"agreement_{np.dtype(dt).name}"] = errs
    if not args.check_only:
        rows = time_side_by_side(repeat=args.repeat)
        print(f"\n{'float32, 1 thread':<24}{'a3c_core us':>12}{'torch us':>12}{'torch/ours':>12}")
        for r in rows:
            print(f"{r['name']:<24}{r['a3c_core_us']:>12.1f}{r['torch_us']:>12.1f}{r['torch_over_ours']:>12.2f}")
        out["timing"] = rows
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
