"""Optional PyTorch twin of a network, built from the same layer list.

:func:`torch_model` turns ``net.layers`` into a ``torch.nn.Module`` with the
module names of our layout (``conv1``.., ``fc``, ``lstm`` an ``LSTMCell``,
``policy``, ``value``) and copies the weights in, so any spec (doom-lstm,
atari-lstm, mlp ...) is cross-checked without a hand-written torch model.
:func:`check_agreement` compares batch-1 ``step`` outputs over carried
steps and the ``loss_and_grad`` loss and every gradient; float64 tightly
(rel. 1e-9), float32 loosely (rel. 1e-3 of each tensor's largest magnitude).
:func:`time_side_by_side` times batch-1 step and a T-step forward+backward
(float32, one thread each).

PyTorch is NOT a dependency of a3c_core: it is imported lazily, only by
these functions (``pip install torch==2.13.0``, the CPU wheel).  The CLI is
``python bench/torch_compare.py``.
"""
from __future__ import annotations

import numpy as np

from a3c_core._blas import limit_blas_threads
from a3c_core.nn.gradcheck import DEFAULT_OBS
from a3c_core.nn.network import build_network
from a3c_core.timing import time_call

TOL = {"float64": 1e-9, "float32": 1e-3}


def import_torch():
    """``torch``, or ``ImportError`` saying how to get the (optional) CPU wheel."""
    try:
        import torch  # lazy: PyTorch is an optional extra, only the twin's checks need it
    except ImportError:
        raise ImportError("a3c_core.nn.torch_twin needs PyTorch, an optional extra: "
                          "pip install torch==2.13.0  # the CPU wheel") from None
    return torch


def torch_model(net):
    """A ``torch.nn.Module`` computing ``net`` with ``net``'s weights (same dtype).

    ``model(x, state) -> (logits (T, A), values (T,), state)`` unrolls over
    ``x`` ``(T, *obs_shape)``; ``state`` is ``(h, c)`` each ``(1, H)`` or None.
    """
    torch = import_torch()
    nn, fn = torch.nn, torch.nn.functional
    acts = {"elu": fn.elu, "relu": fn.relu}

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.plan = []
            for layer in net.encoder:
                if layer.kind == "conv":
                    mod = nn.Conv2d(layer.in_shape[0], layer.out_ch, layer.k,
                                    stride=layer.stride, padding=layer.pad)
                elif layer.kind == "dense":
                    mod = nn.Linear(layer.n_in, layer.n_out)
                else:  # pragma: no cover - a new layer kind needs a twin here
                    raise NotImplementedError(f"no torch twin for layer kind {layer.kind!r}")
                self.add_module(layer.name, mod)
                self.plan.append((mod, acts[layer.act], getattr(layer, "flatten_out", False)))
            if net.core is not None:
                self.add_module(net.core.name, nn.LSTMCell(net.core.n_in, net.core.hidden))
            self.policy = nn.Linear(net.heads.n_in, net.n_actions)
            self.value = nn.Linear(net.heads.n_in, 1)

        def features(self, x):
            """x ``(T, *obs_shape)`` -> encoder output ``(T, F)``."""
            for mod, act, flatten in self.plan:
                x = act(mod(x))
                if flatten:
                    x = x.flatten(1)
            return x

        def forward(self, x, state=None):
            top = self.features(x)
            if net.core is not None:
                cell = getattr(self, net.core.name)
                h, c = state
                hs = []
                for t in range(top.shape[0]):
                    h, c = cell(top[t:t + 1], (h, c))
                    hs.append(h)
                top, state = torch.cat(hs, 0), (h, c)
            return self.policy(top), self.value(top)[:, 0], state

        def step_batch(self, x, state=None):
            """N agents, one step each (``Network.step_batch``): x ``(N, *obs_shape)``,
            state ``(h, c)`` of ``(N, H)`` -> ``(probs (N, A), values (N,), state)``."""
            top = self.features(x)
            if net.core is not None:
                state = getattr(self, net.core.name)(top, state)
                top = state[0]
            return torch.softmax(self.policy(top), 1), self.value(top)[:, 0], state

    model = Twin().to(torch.float64 if net.dtype == np.float64 else torch.float32)
    res = model.load_state_dict({k: torch.from_numpy(np.array(v))
                                 for k, v in net.state_dict().items()})
    if res.missing_keys or res.unexpected_keys:  # pragma: no cover - a naming bug
        raise RuntimeError(f"torch twin names differ from the layout: {res}")
    return model


def torch_state(state, model):
    """Our ``(h, c)`` ``(H,)`` arrays -> torch ``(1, H)`` tensors (None stays None)."""
    if state is None:
        return None
    torch = import_torch()
    dt = next(model.parameters()).dtype
    return tuple(torch.from_numpy(np.array(a)).reshape(1, -1).to(dt) for a in state)


def torch_loss_and_grad(model, obs, actions, returns, adv, state, value_coef=0.5,
                        entropy_beta=0.01):
    """The A3C loss of ``Network.loss_and_grad`` (sums over T) and its grads."""
    torch = import_torch()
    dt = next(model.parameters()).dtype
    logits, values, _ = model(torch.from_numpy(obs).to(dt), torch_state(state, model))
    logp = torch.log_softmax(logits, 1)
    a = torch.from_numpy(actions).long()
    ret = torch.from_numpy(returns).to(dt)
    adv_t = torch.from_numpy(adv).to(dt)
    policy_loss = -(logp.gather(1, a[:, None])[:, 0] * adv_t).sum()
    value_loss = 0.5 * ((ret - values) ** 2).sum()
    entropy = -(logp.exp() * logp).sum()
    loss = policy_loss + value_coef * value_loss - entropy_beta * entropy
    model.zero_grad(set_to_none=False)
    loss.backward()
    return float(loss.detach()), {k: p.grad.detach().numpy() for k, p in model.named_parameters()}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def build_pair(spec="doom-lstm", obs_shape=None, n_actions=3, dtype=np.float32, seed=0):
    """``(net, model)``: our network and its torch twin with the same weights."""
    net = build_network(spec, obs_shape or DEFAULT_OBS[spec], n_actions, dtype=dtype, seed=seed)
    return net, torch_model(net)


def random_rollout(net, T, seed=1):
    """``(obs, actions, returns, advantages)`` of ``T`` random steps for ``net``."""
    rng = np.random.default_rng(seed)
    dt = net.dtype
    return (rng.random((T, *net.obs_shape)).astype(dt), rng.integers(0, net.n_actions, T),
            rng.standard_normal(T).astype(dt), rng.standard_normal(T).astype(dt))


def check_agreement(spec="doom-lstm", dtype=np.float64, T=20, n_actions=3, seed=0, steps=5,
                    obs_shape=None) -> dict:
    """Max relative errors (ours vs torch) of step outputs, loss and each grad.

    Raises ``AssertionError`` when any exceeds ``TOL[dtype]``.
    """
    torch = import_torch()
    dtype = np.dtype(dtype)
    net, model = build_pair(spec, obs_shape, n_actions, dtype, seed)
    obs, actions, returns, adv = random_rollout(net, T)
    rng = np.random.default_rng(2)
    state0 = None
    if net.recurrent:   # a non-zero initial state: BPTT into it is exercised
        state0 = tuple((rng.standard_normal(net.lstm_size) * 0.5).astype(dtype)
                       for _ in range(2))
    errs = {}
    st, tst = state0, torch_state(state0, model)
    with torch.no_grad():
        for t in range(min(steps, T)):
            probs, v, st = net.step(obs[t], st)
            logits, tv, tst = model(torch.from_numpy(obs[t:t + 1]), tst)
            pairs = {"step.probs": (probs, torch.softmax(logits, 1)[0].numpy()),
                     "step.value": (v, tv.numpy())}
            if net.recurrent:
                pairs["step.h"] = (st[0], tst[0][0].numpy())
                pairs["step.c"] = (st[1], tst[1][0].numpy())
            for key, (a, b) in pairs.items():
                errs[key] = max(errs.get(key, 0.0), _rel(a, b))
    stats, grads = net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5,
                                     entropy_beta=0.01)
    tloss, tgrads = torch_loss_and_grad(model, obs, actions, returns, adv, state0)
    errs["loss"] = _rel(stats["loss"], tloss)
    for k, g in tgrads.items():
        errs[f"grad.{k}"] = _rel(grads[k], g)
    tol = TOL[dtype.name]
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{spec} {dtype.name}: a3c_core and torch disagree beyond {tol:g}: {bad}"
    return errs


def time_side_by_side(spec="doom-lstm", T=20, repeat=7, min_time=0.1, n_actions=3) -> list[dict]:
    """Median us of batch-1 step and T-step fwd+bwd: ours vs torch (1 thread each)."""
    torch = import_torch()
    limit_blas_threads(1)
    torch.set_num_threads(1)
    net, model = build_pair(spec, None, n_actions, np.float32)
    obs, actions, returns, adv = random_rollout(net, T)
    s0 = net.initial_state()
    hold, thold = [s0], [torch_state(s0, model)]
    x1 = torch.from_numpy(obs[:1])

    def ours_step():
        _, _, hold[0] = net.step(obs[0], hold[0])

    def torch_step():
        with torch.inference_mode():
            logits, _, thold[0] = model(x1, thold[0])
            torch.softmax(logits, 1)

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
