"""Plain-numpy reference layers (the oracle every fast kernel is tested against).

cs231n style: ``<op>_forward(...) -> (out, cache)`` and
``<op>_backward(dout, cache) -> grads``.  Everything works for float32 and
float64; gradient checks run these in float64 against centred differences.

Layouts follow PyTorch so weights move both ways:

* conv2d: x ``(N, C, H, W)``, weight ``(O, C, kh, kw)``, bias ``(O,)``,
  stride and zero padding (PyTorch ``Conv2d(stride=s, padding=pad)``);
* dense: x ``(N, in)``, weight ``(out, in)``, bias ``(out,)``;
* LSTM: weight_ih ``(4H, in)``, weight_hh ``(4H, H)``, bias_ih/bias_hh
  ``(4H,)``, gate order i, f, g, o.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# ---------------------------------------------------------------------------
# conv2d (stride s, zero padding ``pad`` on every side; pad 0 = VALID)


def conv_out_size(n: int, k: int, stride: int, pad: int = 0) -> int:
    """Output length of a convolution (0 or less: input too small)."""
    n = n + 2 * pad
    return (n - k) // stride + 1 if n >= k else 0


def im2col(x, kh, kw, stride, pad=0):
    """x ``(N, C, H, W)`` -> cols ``(N*OH*OW, C*kh*kw)``, column order (c, i, j)."""
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, w = x.shape
    oh, ow = conv_out_size(h, kh, stride), conv_out_size(w, kw, stride)
    win = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    win = win[:, :, :oh, :ow]                      # (N, C, OH, OW, kh, kw)
    return np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(
        n * oh * ow, c * kh * kw)


def col2im(dcols, x_shape, kh, kw, stride, pad=0):
    """Adjoint of :func:`im2col`: scatter-add ``(N*OH*OW, C*kh*kw)`` into x."""
    n, c, h, w = x_shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = conv_out_size(hp, kh, stride), conv_out_size(wp, kw, stride)
    d = dcols.reshape(n, oh, ow, c, kh, kw)
    dx = np.zeros((n, c, hp, wp), dtype=dcols.dtype)
    for i in range(kh):
        for j in range(kw):
            dx[:, :, i:i + stride * (oh - 1) + 1:stride,
               j:j + stride * (ow - 1) + 1:stride] += d[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return dx[:, :, pad:pad + h, pad:pad + w]


def conv2d_forward(x, w, b, stride=1, pad=0):
    """Conv with zero padding.  x ``(N,C,H,W)``, w ``(O,C,kh,kw)``, b ``(O,)``
    -> ``(N,O,OH,OW)``, ``OH = (H + 2 pad - kh) // stride + 1``."""
    n, c, h, wd = x.shape
    o, c2, kh, kw = w.shape
    if c != c2:
        raise ValueError(f"conv2d: input has {c} channels, weight expects {c2}")
    oh, ow = conv_out_size(h, kh, stride, pad), conv_out_size(wd, kw, stride, pad)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"conv2d: input {h}x{wd} (pad {pad}) smaller than kernel {kh}x{kw}")
    cols = im2col(x, kh, kw, stride, pad)
    out = cols @ w.reshape(o, -1).T + b
    out = out.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out), (cols, x.shape, w, stride, pad)


def conv2d_backward(dout, cache):
    """-> ``(dx, dw, db)`` for :func:`conv2d_forward`."""
    cols, x_shape, w, stride, pad = cache
    o, c, kh, kw = w.shape
    dmat = dout.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (dmat.T @ cols).reshape(w.shape)
    db = dmat.sum(axis=0)
    dx = col2im(dmat @ w.reshape(o, -1), x_shape, kh, kw, stride, pad)
    return dx, dw, db


# ---------------------------------------------------------------------------
# dense


def dense_forward(x, w, b):
    """x ``(N, in)``, w ``(out, in)``, b ``(out,)`` -> ``(N, out)``."""
    return x @ w.T + b, (x, w)


def dense_backward(dout, cache):
    """-> ``(dx, dw, db)``."""
    x, w = cache
    return dout @ w, dout.T @ x, dout.sum(axis=0)


# ---------------------------------------------------------------------------
# activations


def elu_forward(x):
    """ELU with alpha 1: ``x`` if ``x > 0`` else ``expm1(x)``."""
    out = np.where(x > 0, x, np.expm1(np.minimum(x, 0)))
    return out, x


def elu_backward(dout, cache):
    x = cache
    return dout * np.where(x > 0, 1, np.exp(np.minimum(x, 0))).astype(dout.dtype)


def relu_forward(x):
    return np.maximum(x, 0), x


def relu_backward(dout, cache):
    x = cache
    return dout * (x > 0)


ACTIVATIONS = {"elu": (elu_forward, elu_backward),
               "relu": (relu_forward, relu_backward)}


def sigmoid(x):
    """Overflow-free logistic function."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def softmax(z, axis=-1):
    """Stable softmax: finite for any finite logits (e.g. +-1e30)."""
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(z, axis=-1):
    """Stable log-softmax: finite for any finite logits."""
    z = z - z.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


# ---------------------------------------------------------------------------
# LSTM (PyTorch layout, gate order i, f, g, o)


def lstm_step_forward(x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh):
    """One LSTM step.  x ``(N, in)`` or ``(in,)``; h/c ``(N, H)`` or ``(H,)``.

    Returns ``(h, c, cache)``.
    """
    hd = w_hh.shape[1]
    a = x @ w_ih.T + b_ih + h_prev @ w_hh.T + b_hh
    i = sigmoid(a[..., :hd])
    f = sigmoid(a[..., hd:2 * hd])
    g = np.tanh(a[..., 2 * hd:3 * hd])
    o = sigmoid(a[..., 3 * hd:])
    c = f * c_prev + i * g
    tc = np.tanh(c)
    h = o * tc
    return h, c, (x, h_prev, c_prev, i, f, g, o, tc, w_ih, w_hh)


def lstm_step_backward(dh, dc, cache):
    """-> ``(dx, dh_prev, dc_prev, dw_ih, dw_hh, db_ih, db_hh)``."""
    x, h_prev, c_prev, i, f, g, o, tc, w_ih, w_hh = cache
    dct = dc + dh * o * (1 - tc * tc)
    da = np.concatenate([dct * g * i * (1 - i),
                         dct * c_prev * f * (1 - f),
                         dct * i * (1 - g * g),
                         dh * tc * o * (1 - o)], axis=-1)
    da2 = da.reshape(-1, da.shape[-1])
    dw_ih = da2.T @ x.reshape(-1, x.shape[-1])
    dw_hh = da2.T @ h_prev.reshape(-1, h_prev.shape[-1])
    db = da2.sum(axis=0)
    return da @ w_ih, da @ w_hh, dct * f, dw_ih, dw_hh, db, db.copy()


def lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """LSTM over a sequence.  x ``(T, [N,] in)``, h0/c0 ``([N,] H)``.

    Returns ``(hs, (hT, cT), cache)`` with hs ``(T, [N,] H)``.
    """
    h, c = h0, c0
    hs, caches = [], []
    for t in range(x.shape[0]):
        h, c, cache = lstm_step_forward(x[t], h, c, w_ih, w_hh, b_ih, b_hh)
        hs.append(h)
        caches.append(cache)
    return np.stack(hs), (h, c), caches


def lstm_backward(dhs, cache, dhT=None, dcT=None):
    """BPTT.  dhs ``(T, [N,] H)`` (loss grads wrt every h_t), optional dhT/dcT
    (grads wrt the final state).

    Returns ``(dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh)``.
    """
    caches = cache
    dh_next = np.zeros_like(dhs[0]) if dhT is None else dhT.copy()
    dc_next = np.zeros_like(dhs[0]) if dcT is None else dcT.copy()
    dxs = [None] * len(caches)
    dw_ih = dw_hh = db_ih = db_hh = 0
    for t in range(len(caches) - 1, -1, -1):
        dx, dh_next, dc_next, dwi, dwh, dbi, dbh = lstm_step_backward(
            dhs[t] + dh_next, dc_next, caches[t])
        dxs[t] = dx
        dw_ih = dw_ih + dwi
        dw_hh = dw_hh + dwh
        db_ih = db_ih + dbi
        db_hh = db_hh + dbh
    return np.stack(dxs), dh_next, dc_next, dw_ih, dw_hh, db_ih, db_hh


# ---------------------------------------------------------------------------
# A3C loss


def a3c_loss(logits, values, actions, returns, advantages,
             value_coef=0.5, entropy_beta=0.01):
    """A3C loss on a rollout, with its gradient.

    logits ``(T, A)``, values/returns/advantages ``(T,)``, actions int ``(T,)``.
    ``loss = -sum log pi(a_t) A_t + value_coef * 0.5 sum (R_t - V_t)^2
    - entropy_beta * sum H(pi_t)`` (advantages are constants).

    Returns ``(stats, dlogits, dvalues)``; stats has float ``policy_loss``,
    ``value_loss`` (the ``0.5 sum (R - V)^2`` term), ``entropy`` (sum H),
    ``loss``.
    """
    t_idx = np.arange(logits.shape[0])
    logp = log_softmax(logits)
    p = np.exp(logp)
    ent_t = -(p * logp).sum(axis=-1)
    adv = advantages.astype(logits.dtype)
    policy_loss = -(logp[t_idx, actions] * adv).sum()
    diff = returns.astype(values.dtype) - values
    value_loss = 0.5 * (diff * diff).sum()
    entropy = ent_t.sum()
    loss = policy_loss + value_coef * value_loss - entropy_beta * entropy
    # d(-logp_a A)/dz = -A (onehot - p);  d(-beta H)/dz = beta p (logp + H)
    dlogits = p * adv[:, None]
    dlogits[t_idx, actions] -= adv
    dlogits += entropy_beta * p * (logp + ent_t[:, None])
    dvalues = -value_coef * diff
    stats = {"policy_loss": float(policy_loss), "value_loss": float(value_loss),
             "entropy": float(entropy), "loss": float(loss)}
    return stats, dlogits, dvalues
