"""Reward scaling by the running spread of the discounted return.

Why: one fixed reward scale cannot fit every task.  Shipped ViZDoom scenarios
pay from about +-1 to +2,100 per episode; with a scale fitted to one of them
the value targets (and so the policy-gradient advantages) of another are
either lost under the entropy bonus or large enough to blow up the critic.
Dividing rewards by the running standard deviation of the *discounted
return* (the quantity the critic regresses on) puts every task's value
targets and advantages on a scale of about one, so one entropy coefficient
and one learning rate mean the same thing everywhere.  This is the reward
half of Stable-Baselines3's ``VecNormalize`` (``norm_reward``): rewards are
divided by ``sqrt(var(R) + eps)`` and NOT centred, so the sign of every reward,
and of a terminal state's zero value, is kept.

Each worker keeps the running discounted return of its own episode,
``R_t = gamma * R_{t-1} + r_t`` (reset at episode start), and after every
rollout merges the rollout's ``R_t`` values into the shared statistics
(count, mean, M2) with Chan et al.'s parallel update: once per rollout, in
one compiled call that holds the GIL (:func:`merge_stats`), so the merge is
atomic among the worker threads without a lock and costs Hogwild nothing.
Workers read the scale without a lock (a float; a stale read only delays
the scale by one rollout).  The statistics are saved in checkpoints and restored on resume.

Scaled rewards are clipped to ``[-clip, clip]`` (10 by default, as in
VecNormalize), which bounds what one outlier reward does to the critic.
"""
from __future__ import annotations

import math

import numpy as np

from a3c_core._jit import kernel

__all__ = ["ReturnNormalizer", "AdvantageNormalizer", "running_returns", "merge_stats"]


# The per-rollout statistics below run as compiled nogil kernels: as ~15
# numpy calls on arrays of ~20 values they held the GIL ~10 us per update
# (7.67 -> 7.16 us of GIL per agent step, 2-core VM, 2026-11-26; see
# docs/results.md, "The GIL").


@kernel(fastmath=False)          # the recurrence exactly as written, no FMA
def running_returns_into(r, gamma, acc, out):
    """``out[i] = R_i = gamma * R_{i-1} + r[i]`` from ``R_{-1} = acc`` (float64
    ``r``); returns the last ``R`` (the compiled core of :func:`running_returns`)."""
    for i in range(r.size):
        acc = gamma * acc + r[i]
        out[i] = acc
    return acc


@kernel
def _moments(x):
    """``(mean, sum (x - mean)^2, sum x^2, all finite)`` of float64 ``x`` (size >= 1)."""
    n = x.size
    s = 0.0
    finite = True
    for i in range(n):
        if not math.isfinite(x[i]):
            finite = False
        s += x[i]
    mean = s / n
    m2 = 0.0
    sq = 0.0
    for i in range(n):
        d = x[i] - mean
        m2 += d * d
        sq += x[i] * x[i]
    return mean, m2, sq, finite


@kernel
def clip_into(r, lo, hi, out):
    """``out[i] = min(max(r[i], lo), hi)`` (``np.clip`` of float64 ``r``, value for value)."""
    for i in range(r.size):
        out[i] = min(max(r[i], lo), hi)


@kernel
def scale_clip_into(r, scale, clip, out):
    """``out[i] = clip(r[i] * scale, -clip, clip)`` computed in float64 and
    stored in ``out``'s dtype: ``np.clip(r * scale, -clip, clip, out=out,
    casting="unsafe")`` of a float64 ``r``, value for value."""
    for i in range(r.size):
        out[i] = min(max(r[i] * scale, -clip), clip)


def running_returns(rewards, gamma, acc):
    """Discounted running returns of raw ``rewards`` (float, ``(n,)``) from the
    carried accumulator ``acc`` (float): ``R_t = gamma * R_{t-1} + r_t``.
    Returns ``(R (n,) float64, new acc)``."""
    r = np.asarray(rewards, dtype=np.float64).ravel()
    out = np.empty(r.size, np.float64)
    acc = running_returns_into(r, float(gamma), float(acc), out)
    return out, acc


# A normalizer's statistics live in one float64 array (``stats``) and are
# merged by one compiled call that holds the GIL (nogil=False): no other
# Python thread runs while it reads and writes them, so the merge is atomic
# among the worker threads without a lock, and a worker can merge from
# inside its own compiled code (``core.targets.rollout_targets``).
ST_COUNT, ST_MEAN, ST_M2, ST_SCALE, ST_MEAN_SQ = range(5)
# ``params`` (float64): kind (below), eps, min_count, horizon
P_KIND, P_EPS, P_MIN, P_HORIZON = range(4)
KIND_RETURN, KIND_RMS, KIND_EMA = 0, 1, 2


@kernel(nogil=False, fastmath=False)
def merge_stats(st, prm, x):
    """Merge the float64 batch ``x`` (size >= 1) into ``st``; returns the new
    scale, or -1.0 (``st`` unchanged) when ``x`` holds a NaN or inf.  The
    arithmetic is that of the Python merges it replaced, operation for
    operation (float64, no FMA)."""
    mean_b, m2_b, sq, finite = _moments(x)
    if not finite:
        return -1.0
    n_b = float(x.size)
    kind = prm[P_KIND]
    if kind == KIND_EMA:
        ms_b = sq / n_b
        keep = math.pow(1.0 - 1.0 / prm[P_HORIZON], n_b)   # weight left on the old average
        if st[ST_COUNT] == 0:
            st[ST_MEAN_SQ] = ms_b
        else:
            st[ST_MEAN_SQ] = keep * st[ST_MEAN_SQ] + (1.0 - keep) * ms_b
        st[ST_COUNT] += n_b
        if st[ST_COUNT] >= prm[P_MIN]:
            st[ST_SCALE] = 1.0 / math.sqrt(st[ST_MEAN_SQ] + prm[P_EPS])
        return st[ST_SCALE]
    n_a = st[ST_COUNT]
    n = n_a + n_b
    delta = mean_b - st[ST_MEAN]
    st[ST_MEAN] += delta * n_b / n
    st[ST_M2] += m2_b + delta * delta * n_a * n_b / n
    st[ST_COUNT] = n
    if n >= prm[P_MIN]:
        mean, m2 = st[ST_MEAN], st[ST_M2]
        if kind == KIND_RETURN:
            st[ST_SCALE] = 1.0 / math.sqrt(m2 / n + prm[P_EPS])
        else:
            st[ST_SCALE] = 1.0 / math.sqrt(m2 / n + mean * mean + prm[P_EPS])
    return st[ST_SCALE]


class ReturnNormalizer:
    """Shared running mean/variance of discounted returns -> reward scale.

    ``update(returns)`` merges a batch; ``scale`` is ``1 / sqrt(var + eps)``
    (1.0 until ``min_count`` returns have been seen).  The scale is unit-free
    from the first rollout on: rewards x100 give the same scaled rewards.
    ``count``, ``mean``, ``m2`` and ``scale`` read :attr:`stats`.
    """

    _kind = KIND_RETURN

    def __init__(self, gamma=0.99, *, clip=10.0, eps=1e-8, min_count=2):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        if not (clip > 0 and math.isfinite(clip)):
            raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.eps = float(eps)
        self.min_count = int(min_count)
        #: count, mean, m2, scale, mean_sq (see merge_stats); written only by
        #: merge_stats and by whole-array assignments, each atomic under the GIL
        self.stats = np.array([0.0, 0.0, 0.0, 1.0, 0.0])
        self.params = np.array([self._kind, self.eps, self.min_count, 0.0])

    count = property(lambda self: int(self.stats[ST_COUNT]))
    mean = property(lambda self: float(self.stats[ST_MEAN]))
    m2 = property(lambda self: float(self.stats[ST_M2]))
    scale = property(lambda self: float(self.stats[ST_SCALE]))

    @property
    def var(self) -> float:
        count, m2 = self.stats[ST_COUNT], self.stats[ST_M2]
        return float(m2 / count) if count else 0.0

    def update(self, returns) -> float:
        """Merge a batch of discounted returns; returns the new scale."""
        return self._merge(returns, "ReturnNormalizer.update: returns")

    def _merge(self, values, who):
        x = np.asarray(values, dtype=np.float64).ravel()
        if x.size == 0:
            return self.scale
        scale = merge_stats(self.stats, self.params, x)
        if scale < 0:
            raise ValueError(f"{who} contain NaN or inf")
        return scale

    def _scale_from(self, n, mean, m2):
        return 1.0 / math.sqrt(m2 / n + self.eps)

    def state_dict(self) -> dict:
        return self._state_of(self.stats.copy())     # one consistent snapshot

    def _state_of(self, st):
        return {"count": int(st[ST_COUNT]), "mean": float(st[ST_MEAN]),
                "m2": float(st[ST_M2]), "gamma": self.gamma, "clip": self.clip}

    def load_state_dict(self, d) -> None:
        try:
            count, mean, m2 = int(d["count"]), float(d["mean"]), float(d["m2"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"reward normalizer state must have count, mean, m2; got {d!r}") from None
        if count < 0 or m2 < 0 or not (math.isfinite(mean) and math.isfinite(m2)):
            raise ValueError(f"reward normalizer state is invalid: {d!r}")
        scale = self._scale_from(count, mean, m2) if count >= self.min_count else 1.0
        self.stats[:] = (count, mean, m2, scale, 0.0)


class AdvantageNormalizer(ReturnNormalizer):
    """Running root-mean-square of the advantages -> policy-gradient scale.

    Return normalization puts value targets on a unit scale, but the
    advantages (the policy-gradient weights) of a task can still be much
    smaller than its return spread: CartPole's per-step advantages are a few
    percent of its return std, so a fixed entropy bonus outweighs them and the
    policy stays random.  Dividing advantages by their RMS gives the policy
    term a unit scale in every task, so the entropy coefficient is one fixed
    trade-off.  ``horizon=None``: the RMS over the whole run (Welford, like the
    return statistics); ``horizon=H``: an exponential moving average of the
    squared advantages with a time constant of H samples, which follows the
    advantages as they shrink while the agent improves (a whole-run RMS stays
    dominated by the large advantages of early training).  Not per rollout,
    which is noisy at t_max = 20.  ``scale`` is ``1 / sqrt(mean(A^2) + eps)``;
    the advantages are not centred.
    """

    def __init__(self, *, eps=1e-8, min_count=2, horizon=None):
        super().__init__(1.0, eps=eps, min_count=min_count)
        if horizon is not None and not (horizon >= 1 and math.isfinite(horizon)):
            raise ValueError(f"horizon must be None or a finite number >= 1, got {horizon!r}")
        self.horizon = None if horizon is None else float(horizon)
        self.params[:] = (KIND_RMS if horizon is None else KIND_EMA, self.eps, self.min_count,
                          self.horizon or 0.0)

    mean_sq = property(lambda self: float(self.stats[ST_MEAN_SQ]))

    def _scale_from(self, n, mean, m2):
        return 1.0 / math.sqrt(m2 / n + mean * mean + self.eps)

    def update(self, advantages) -> float:
        return self._merge(advantages, "AdvantageNormalizer.update: advantages")

    def _state_of(self, st):
        d = super()._state_of(st)
        if self.horizon is not None:
            d.update(horizon=self.horizon, mean_sq=float(st[ST_MEAN_SQ]))
        return d

    def load_state_dict(self, d) -> None:
        if self.horizon is None:
            return super().load_state_dict(d)
        try:
            count = int(d["count"])
            ms = float(d["mean_sq"]) if "mean_sq" in d else \
                float(d["m2"]) / max(count, 1) + float(d["mean"]) ** 2   # a whole-run state
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"advantage normalizer state must have count and mean_sq "
                             f"(or mean, m2); got {d!r}") from None
        if count < 0 or ms < 0 or not math.isfinite(ms):
            raise ValueError(f"advantage normalizer state is invalid: {d!r}")
        scale = 1.0 / math.sqrt(ms + self.eps) if count >= self.min_count else 1.0
        self.stats[:] = (count, 0.0, 0.0, scale, ms)

