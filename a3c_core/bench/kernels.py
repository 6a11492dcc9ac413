"""The FLOP counter and the flat-buffer kernel rows of ``a3c bench``.

* :func:`flops`: multiply-adds of the network's layer list
  (``layer.flop_rows()``) x 2 for the forward, x 2 again for the backward
  (input grads + weight grads; the first layer needs no input grad).
  Elementwise work (activations, softmax, LSTM gates) is not counted, so the
  figure is a slight under-count of the work actually done.  The
  ``step`` and ``loss_and_grad`` rows (:mod:`a3c_core.bench.network`) give
  their GFLOP/s from it, and ``--json`` records it.
* ``rmsprop apply``, ``adam apply``, ``adam apply (amsgrad)``,
  ``clip_grad_norm``, ``gae``: the flat-buffer kernels (the optimizers over
  all the network's parameters, in place), us.
"""
from __future__ import annotations

import numpy as np

from a3c_core import core
from a3c_core.bench.machine import Row, us
from a3c_core.nn.network import build_network
from a3c_core.timing import time_call


def layer_table(net) -> list[dict]:
    """The compute ops of ``net`` as dicts ``{kind, name, macs, ...}`` (per step),
    from its layer list (``layer.flop_rows()``, in layout order).

    ``kind`` is ``conv`` (``in_shape``, ``out_shape``, ``k``, ``stride``,
    ``pad``), ``dense`` (``n_in``, ``n_out``; the heads give ``policy`` and
    ``value``) or ``lstm`` (``n_in``, ``hidden``).
    """
    return [row for layer in net.layers for row in layer.flop_rows()]


def flops(net_or_spec="doom-lstm", obs_shape=(1, 84, 84), n_actions=3, *, T=1, **spec_kwargs) -> dict:
    """FLOPs of ``T`` steps of a network: ``{forward, backward, total, per_step, layers}``.

    ``net_or_spec`` is a built network or a spec name (built with
    ``obs_shape``, ``n_actions``).  forward = 2 x multiply-adds of every
    conv/dense/LSTM layer; backward = 2 x forward minus the first layer's
    input-gradient GEMM (the observation needs no gradient).  Elementwise
    operations are not counted.
    """
    if isinstance(net_or_spec, str):
        net = build_network(net_or_spec, obs_shape, n_actions, **spec_kwargs)
    else:
        net = net_or_spec
    return flops_of_layers(layer_table(net), T=T)


def flops_of_layers(layers, *, T=1) -> dict:
    """See :func:`flops`; ``layers`` as returned by :func:`layer_table`."""
    fwd = sum(2 * L["macs"] for L in layers)
    first = 2 * layers[0]["macs"] if layers else 0
    bwd = 2 * fwd - first
    return {"forward": fwd * T, "backward": bwd * T, "total": (fwd + bwd) * T,
            "per_step": {"forward": fwd, "backward": bwd},
            "layers": [dict(L, forward_flops=2 * L["macs"]) for L in layers], "T": T}


def bench_kernels(net, T, repeat, min_time) -> list[Row]:
    """The optimizer applies, the norm pass and GAE over ``net``'s
    parameter count and a ``T``-step rollout."""
    rows = []
    rng = np.random.default_rng(0)
    grads = (rng.standard_normal(net.n_params) * 1e-3).astype(net.params.dtype)
    params = net.params.copy()
    n = net.n_params
    for name, opt in (("rmsprop apply", core.RMSProp(n, lr=7e-4, alpha=0.99, eps=0.1)),
                      ("adam apply", core.Adam(n, lr=1e-4)),
                      ("adam apply (amsgrad)", core.Adam(n, lr=3e-4, amsgrad=True))):
        s = time_call(lambda: opt.apply(params, grads, 0), repeat=repeat, min_time=min_time)
        rows.append(Row(name, us(s), "us", f"{n:,} float32 params, in place"))
    g2 = grads.copy()
    s = time_call(lambda: core.clip_grad_norm(g2, 1e9), repeat=repeat, min_time=min_time)
    rows.append(Row("clip_grad_norm", us(s), "us", f"{n:,} params (no rescale)"))
    r = rng.standard_normal(T).astype(np.float32)
    v = rng.standard_normal(T).astype(np.float32)
    s = time_call(lambda: core.gae(r, v, 0.5, 0.99, 1.0), repeat=repeat, min_time=min_time)
    rows.append(Row(f"gae T={T}", us(s), "us", "returns + advantages"))
    return rows
