"""Plain-numpy reference twins of every Cython kernel in ``a3c_core.core``.

Slow, obvious, and used by the parity tests (and as a fallback to read when
in doubt).  Each twin takes the same arguments as its kernel and returns new
arrays instead of updating in place.  Arithmetic is float32 in the same
expression order as the kernels (returns/GAE accumulate in float64), so the
comparison tolerances can be tight.
"""
import numpy as np

import functools

from a3c_core._preprocess import LUMA

__all__ = ["ref_rmsprop", "ref_adam", "ref_amsgrad", "ref_clip", "ref_returns",
           "ref_gae", "ref_preprocess"]

_f32 = np.float32


def ref_rmsprop(params, grads, square_avg, lr, alpha=0.99, eps=0.1, grad_scale=1.0):
    """-> (params, square_avg): s = a*s + (1-a)*d^2; p -= lr*d/sqrt(s+eps)."""
    d = grads * _f32(grad_scale)
    s = _f32(alpha) * square_avg + _f32(1.0 - alpha) * (d * d)
    p = params - (_f32(lr) * d) / np.sqrt(s + _f32(eps))
    return p, s


def ref_adam(params, grads, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, step,
             grad_scale=1.0):
    """-> (params, m, v) after Adam step number ``step`` (>= 1), bias-corrected."""
    d = grads * _f32(grad_scale)
    m = _f32(beta1) * exp_avg + _f32(1.0 - beta1) * d
    v = _f32(beta2) * exp_avg_sq + _f32(1.0 - beta2) * (d * d)
    bc1 = _f32(1.0 / (1.0 - beta1 ** step))
    bc2 = _f32(1.0 / (1.0 - beta2 ** step))
    p = params - (_f32(lr) * (m * bc1)) / (np.sqrt(v * bc2) + _f32(eps))
    return p, m, v


def ref_amsgrad(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps,
                step, grad_scale=1.0):
    """-> (params, m, v, vmax) after AMSGrad step number ``step`` (>= 1): Adam whose
    denominator uses the running maximum of v (PyTorch's ``amsgrad=True``)."""
    d = grads * _f32(grad_scale)
    m = _f32(beta1) * exp_avg + _f32(1.0 - beta1) * d
    v = _f32(beta2) * exp_avg_sq + _f32(1.0 - beta2) * (d * d)
    w = np.maximum(max_exp_avg_sq, v)
    bc1 = _f32(1.0 / (1.0 - beta1 ** step))
    bc2 = _f32(1.0 / (1.0 - beta2 ** step))
    p = params - (_f32(lr) * (m * bc1)) / (np.sqrt(w * bc2) + _f32(eps))
    return p, m, v, w


def ref_clip(grads, max_norm):
    """-> (clipped grads copy, norm, finite), global L2 norm in float64."""
    norm = float(np.sqrt(np.sum(grads.astype(np.float64) ** 2)))
    finite = bool(np.isfinite(norm))
    out = grads.copy()
    if finite and max_norm is not None and max_norm > 0 and norm > max_norm:
        out *= _f32(max_norm / norm)
    return out, norm, finite


def ref_returns(rewards, bootstrap_value, gamma):
    """-> R (float32): R_t = r_t + gamma*R_{t+1}, R_T = bootstrap_value."""
    out = np.empty(len(rewards), np.float32)
    acc = float(bootstrap_value)
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out


def ref_gae(rewards, values, bootstrap_value, gamma, lam):
    """-> (returns, advantages) float32, GAE(gamma, lam) with V_T = bootstrap."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    v_next = np.append(v[1:], float(bootstrap_value))
    delta = r + gamma * v_next - v
    adv = np.empty(len(r), np.float64)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = delta[t] + gamma * lam * acc
        adv[t] = acc
    return (adv + v).astype(np.float32), adv.astype(np.float32)


def ref_preprocess(frame, out_shape=(84, 84), crop=None):
    """-> float32 (Ho, Wo) in [0,1]: luma (RGB), crop, exact area resize, /255.

    Built independently of the kernel's tables: the resize is two dense
    averaging matrices computed from the definition (``ref_area_weights``,
    cached per size) applied in float64.
    """
    f = np.asarray(frame, np.float64)
    if f.ndim == 3:
        f = f[..., 0] if f.shape[2] == 1 else f @ np.asarray(LUMA)
    if crop is not None:
        t, b, l, r = crop
        f = f[t:f.shape[0] - b, l:f.shape[1] - r]
    Ho, Wo = out_shape
    y = ref_area_weights(f.shape[0], Ho) @ f @ ref_area_weights(f.shape[1], Wo).T
    return np.minimum(y / 255.0, 1.0).astype(np.float32)


@functools.lru_cache(maxsize=64)
def ref_area_weights(n_in, n_out):
    """Dense (n_out, n_in) area-average matrix computed from the definition.

    Output pixel o covers [o*s, (o+1)*s) with s = n_in/n_out; source pixel i
    gets weight |[i, i+1) intersect that interval| / s.  Read-only, cached.
    """
    M = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for o in range(n_out):
        lo, hi = o * scale, (o + 1) * scale
        for i in range(n_in):
            M[o, i] = max(0.0, min(hi, i + 1) - max(lo, i)) / scale
    M.setflags(write=False)
    return M
