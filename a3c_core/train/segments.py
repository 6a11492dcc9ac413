"""A rollout's learning targets, segment by segment (the worker's loss inputs).

A :class:`~a3c_core.train.worker.Worker` cuts each env's rows of a rollout
into segments: the parts of an episode, each ending where the episode
ended (``ended``: the running return restarts after it) or where ``t_max``
or a failed step cut it, each with its bootstrap value.  A
:class:`SegmentTargets` turns the rollout's raw rewards and recorded values
into the update's returns and GAE advantages:

1. the rows are copied env-major (each env's segments contiguous);
2. the raw rewards are clipped and scaled: by a fixed ``reward_scale``, or
   by the shared return normalizer after merging each env's running
   discounted return into it (carried from rollout to rollout in
   :attr:`SegmentTargets.ret_acc`);
3. GAE(gamma, lambda) per segment from its bootstrap value, the advantages
   scaled by the shared advantage normalizer (``normalize_advantages``);
4. the results are copied back time-major.

Steps 2-3 are one compiled call (:func:`a3c_core.core.targets.rollout_targets`)
where the store exposes its normalizers' arrays (``store.target_stats()``),
else the same sequence through ``store.reward_scale`` and
``store.advantage_scale`` (the same values; tests/test_targets.py).
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from a3c_core.core import gae
from a3c_core.core.normalize import clip_into, running_returns, scale_clip_into
from a3c_core.core.targets import BAD_ADVANTAGES, BAD_RETURNS, rollout_targets
from a3c_core.train.store import NO_STATS

__all__ = ["SegmentTargets"]


class SegmentTargets:
    """Returns and advantages of one worker's rollouts (see the module docstring).

    Args:
        settings: the worker's :class:`~a3c_core.train.worker.RolloutSettings`.
        store: the worker's store (normalizers, ``targets_lock``).
        n_envs: K, the envs stepped in lockstep.
        fused: one compiled call where the store exposes its normalizers'
            arrays (the same results).
    """

    def __init__(self, settings, store, n_envs, fused=True):
        s = self.s = settings
        self.store = store
        self.n_envs = K = n_envs
        R = s.t_max * K
        self.raw_em = np.zeros(R, np.float64)
        self.val_em = np.zeros(R, np.float32)
        #: the learning rewards (clipped and scaled), env-major
        self.rewards = np.zeros(R, np.float32)
        self.clip_buf = np.zeros(R, np.float64)
        # per segment (at most one per row): end row, bootstrap, ended, running return
        self.seg_end = np.zeros(R, np.int64)
        self.seg_boot = np.zeros(R, np.float64)
        self.seg_ended = np.zeros(R, np.bool_)
        self.seg_acc = np.zeros(R, np.float64)
        self.seg_raw = np.zeros(R, np.float64)
        self.rets_buf = np.zeros(R, np.float64)
        self.adv64_buf = np.zeros(R, np.float64)
        self.ret = np.zeros(R, np.float32)
        self.adv = np.zeros(R, np.float32)
        self.ret_tm = np.zeros(R, np.float32)
        self.adv_tm = np.zeros(R, np.float32)
        #: each env's running discounted return (the return normalizer's input)
        self.ret_acc = [0.0] * K
        #: the normalizers' arrays for the compiled call, or None: the separate path
        self.stats = st = store.target_stats() if fused else None
        self.lock = getattr(store, "targets_lock", None) or nullcontext()
        if st is not None and (s.reward_scale is None) != (st[0].size > 0):
            self.stats = None           # settings and store disagree: the separate path's errors
        if self.stats is not None and s.normalize_advantages and st[2].size == 0:
            self.stats = None

    def __call__(self, raw, values, n, segs):
        """``(returns, advantages)`` float32, time-major ``(n*K,)`` views,
        of the rollout's ``n`` ticks: ``raw`` (float64) and ``values``
        (float32) time-major, ``segs[k]`` env k's segments in time order
        as ``(end tick, bootstrap, ended)``."""
        K = self.n_envs
        m = n * K
        if K == 1:
            raw_em, val_em = raw, values
        else:
            raw_em, val_em = self.raw_em, self.val_em
            raw_em[:m].reshape(K, n)[...] = raw[:m].reshape(n, K).T
            val_em[:m].reshape(K, n)[...] = values[:m].reshape(n, K).T
        j = 0
        last = []
        for k in range(K):
            first = True
            for end, boot, ended in segs[k]:
                self.seg_end[j] = k * n + end
                self.seg_boot[j] = boot
                self.seg_ended[j] = ended
                self.seg_acc[j] = self.ret_acc[k] if first else np.nan
                first = False
                j += 1
            last.append(j - 1)
        if self.stats is None:
            ret, adv = self._separate(raw_em, val_em, m, j)
        else:
            ret, adv = self._fused(raw_em, val_em, m, j)
        if self.s.reward_scale is None:
            for k in range(K):
                self.ret_acc[k] = self.seg_acc.item(last[k])
        if K == 1:
            return ret, adv
        self.ret_tm[:m].reshape(n, K)[...] = ret.reshape(K, n).T
        self.adv_tm[:m].reshape(n, K)[...] = adv.reshape(K, n).T
        return self.ret_tm[:m], self.adv_tm[:m]

    def _fused(self, raw, values, m, n_seg):
        """Steps 2-3 of the module docstring in one compiled call."""
        s = self.s
        rn_st, rn_prm, an_st, an_prm = self.stats
        fixed = np.nan if s.reward_scale is None else float(s.reward_scale)
        with self.lock:
            status = rollout_targets(
                raw, m, self.seg_end, self.seg_boot, self.seg_ended, self.seg_acc,
                self.seg_raw, n_seg, float(s.reward_clip), fixed, float(s.gamma),
                float(s.norm_clip), rn_st, rn_prm, values, float(s.gae_lambda),
                an_st if s.normalize_advantages else NO_STATS, an_prm,
                self.clip_buf, self.rets_buf, self.adv64_buf,
                self.rewards, self.ret, self.adv)
        if status == BAD_RETURNS:
            raise ValueError("ReturnNormalizer.update: returns contain NaN or inf")
        if status == BAD_ADVANTAGES:
            raise ValueError("AdvantageNormalizer.update: advantages contain NaN or inf")
        return self.ret[:m], self.adv[:m]

    def _separate(self, raw, values, m, n_seg):
        """:meth:`_fused` through the store's ``reward_scale`` and
        ``advantage_scale`` (a store without the normalizers' arrays)."""
        s = self.s
        segs = []
        a0 = 0
        for k in range(n_seg):
            b0 = int(self.seg_end[k])
            segs.append((a0, b0, float(self.seg_boot[k]), bool(self.seg_ended[k])))
            a0 = b0
        r = raw[:m]
        if s.reward_clip > 0:
            clip_into(r, -float(s.reward_clip), float(s.reward_clip), self.clip_buf[:m])
            r = self.clip_buf[:m]
        if s.reward_scale is not None:
            np.multiply(r, s.reward_scale, out=self.rewards[:m], casting="unsafe")
        else:
            rets = []
            acc = 0.0
            for k, (a0, b0, _, ended) in enumerate(segs):
                start = float(self.seg_acc[k])
                if start == start:
                    acc = start
                rr, acc = running_returns(r[a0:b0], s.gamma, acc)
                rets.append(rr)
                if ended:
                    acc = 0.0
                self.seg_acc[k] = acc
            scale = self.store.reward_scale(np.concatenate(rets))
            scale_clip_into(r, float(scale), float(s.norm_clip), self.rewards[:m])
        ret = np.empty(m, np.float32)
        adv = np.empty(m, np.float32)
        for a0, b0, boot, _ in segs:
            ret[a0:b0], adv[a0:b0] = gae(self.rewards[a0:b0], values[a0:b0], boot,
                                         s.gamma, s.gae_lambda)
        if s.normalize_advantages:
            adv = adv * np.float32(self.store.advantage_scale(adv))
        return ret, adv
