"""A rollout's learning targets in one compiled call (the worker's update glue).

Between its last agent step and its backward pass, a worker turns the
rollout's raw rewards into the update's inputs:

1. clip the raw rewards to ``reward_clip`` (when > 0);
2. scale them: by a fixed ``reward_scale``, or by the shared
   :class:`~a3c_core.core.normalize.ReturnNormalizer`, after merging the
   rollout's running discounted returns into it (the running return
   restarts after each episode that ends in the rollout), then clip them to
   ``norm_clip``;
3. GAE(gamma, lambda) per episode segment, each with its own bootstrap value;
4. scale the advantages by the shared
   :class:`~a3c_core.core.normalize.AdvantageNormalizer`, after merging
   them into it (when it is given).

As some fifteen numpy, Numba and Cython calls with their Python between
them, this held the GIL ~40-60 µs per update on a 2-core VM (a worker's
caches are cold after its network step; docs/results.md, "The GIL").
:func:`rollout_targets` is the same sequence as one call, value for value:
it calls the very kernels the separate path calls (``clip_into``,
``running_returns_into``, ``merge_stats``, ``scale_clip_into``), and
:func:`gae_into` is the Cython ``gae``'s recursion (float64, no FMA, float32
stores).  tests/test_targets.py checks it bit for bit against the separate
calls.

It holds the GIL (``nogil=False``), as ``merge_stats`` must: the merges into
the shared statistics are atomic among the worker threads because no other
Python thread runs during the call.  The call takes a few µs.
"""
from __future__ import annotations

import numpy as np

from a3c_core._jit import kernel
from a3c_core.core.normalize import (AdvantageNormalizer, ReturnNormalizer, running_returns_into,
                                     clip_into, merge_stats, scale_clip_into)

__all__ = ["rollout_targets", "gae_into", "warm_up", "TARGETS_OK", "BAD_RETURNS", "BAD_ADVANTAGES"]

TARGETS_OK, BAD_RETURNS, BAD_ADVANTAGES = 0, 1, 2


@kernel(fastmath=False)
def gae_into(r, v, boot, gamma, lam, ret, adv):
    """GAE over float32 ``r``/``v`` into float32 ``ret``/``adv``: the
    recursion of ``a3c_core.core.returns.gae`` (ext/_returns.pyx), in float64
    without fused multiply-adds, so the same values bit for bit."""
    a = 0.0
    next_v = boot
    gl = gamma * lam
    for t in range(r.size - 1, -1, -1):
        vt = float(v[t])
        delta = float(r[t]) + gamma * next_v - vt
        a = delta + gl * a
        adv[t] = a
        ret[t] = a + vt
        next_v = vt


@kernel(nogil=False, fastmath=False)
def rollout_targets(raw, n, seg_end, seg_boot, seg_ended, seg_acc, seg_raw, n_seg, reward_clip,
                    fixed_scale, gamma, norm_clip, rn_stats, rn_params, values, lam, an_stats,
                    an_params, clip_buf, rets_buf, adv64_buf, rewards, ret, adv):
    """Steps 1-4 of the module docstring for the first ``n`` steps.

    ``raw`` (float64), ``values`` (float32): the rollout's arrays.
    Segment k covers ``[seg_end[k-1], seg_end[k])`` (from 0), bootstraps
    from ``seg_boot[k]`` and, when ``seg_ended[k]``, ends its episode (the
    running return restarts after it).  ``seg_acc[k]`` (float64, in and
    out): in, the running discounted return segment k starts from, or NaN
    to continue from the segment before (segment 0 must give one; a worker
    with several envs gives each env's first segment that env's); out, the
    running return after segment k (0 after an ended one), which is left as
    it was with a fixed scale.  ``seg_raw[k]`` (float64, out): the sum of
    segment k's raw rewards in time order.  ``fixed_scale``: NaN to
    normalize with ``rn_stats``/``rn_params`` (a ReturnNormalizer's
    ``stats`` and ``params``), else the fixed reward scale.  ``an_stats``
    of size 0: no advantage normalization.  ``clip_buf``, ``rets_buf``,
    ``adv64_buf`` (float64) are scratch of at least ``n``; ``rewards``,
    ``ret``, ``adv`` (float32) receive the results.  Returns ``status``:
    BAD_RETURNS or BAD_ADVANTAGES when a merge met a NaN or inf (that
    normalizer unchanged, the outputs incomplete).
    """
    a0 = 0
    for k in range(n_seg):
        b0 = seg_end[k]
        s = 0.0
        for i in range(a0, b0):
            s += raw[i]
        seg_raw[k] = s
        a0 = b0
    r = raw[:n]
    if reward_clip > 0:
        clip_into(r, -reward_clip, reward_clip, clip_buf[:n])
        r = clip_buf[:n]
    if fixed_scale == fixed_scale:
        for i in range(n):
            rewards[i] = r[i] * fixed_scale
    else:
        a0 = 0
        acc = 0.0
        for k in range(n_seg):
            b0 = seg_end[k]
            if seg_acc[k] == seg_acc[k]:
                acc = seg_acc[k]
            acc = running_returns_into(r[a0:b0], gamma, acc, rets_buf[a0:b0])
            if seg_ended[k]:
                acc = 0.0
            seg_acc[k] = acc
            a0 = b0
        scale = merge_stats(rn_stats, rn_params, rets_buf[:n])
        if scale < 0:
            return BAD_RETURNS
        scale_clip_into(r, scale, norm_clip, rewards[:n])
    a0 = 0
    for k in range(n_seg):
        b0 = seg_end[k]
        gae_into(rewards[a0:b0], values[a0:b0], seg_boot[k], gamma, lam, ret[a0:b0], adv[a0:b0])
        a0 = b0
    if an_stats.size > 0:
        for i in range(n):
            adv64_buf[i] = adv[i]
        scale = merge_stats(an_stats, an_params, adv64_buf[:n])
        if scale < 0:
            return BAD_ADVANTAGES
        s32 = np.float32(scale)
        for i in range(n):
            adv[i] = adv[i] * s32
    return TARGETS_OK


def warm_up():
    """Compile (or load) :func:`rollout_targets` for the argument types a
    :class:`~a3c_core.train.worker.Worker` passes, on a 3-step rollout with
    private statistics (the shared normalizers are not touched)."""
    n = 3
    f64, f32 = np.zeros(n), np.zeros(n, np.float32)
    seg_end = np.zeros(n, np.int64)
    seg_end[0] = n
    rn, an = ReturnNormalizer(), AdvantageNormalizer()
    return rollout_targets(np.zeros(n), n, seg_end, f64.copy(), np.zeros(n, np.bool_),
                           f64.copy(), f64.copy(), 1, 0.0, float("nan"), 0.99, 10.0, rn.stats,
                           rn.params, f32.copy(), 1.0, an.stats, an.params,
                           f64.copy(), f64.copy(), f64.copy(), f32.copy(), f32.copy(), f32.copy())
