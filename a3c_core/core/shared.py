"""Shared A3C state: flat params + shared optimizer + global counters.

``sync_params`` copies shared -> local params without the GIL;
``clip_grad_norm`` is the global-norm clip with non-finite detection;
:class:`SharedState` bundles what every worker thread shares.  See
``a3c_core.core.optim`` for what lock-free (Hogwild) updates can and cannot
do.
"""
import math
import threading

import numpy as np

from a3c_core import _hogwild, _hugepages
from a3c_core.core.optim import Optimizer, make_optimizer

__all__ = ["sync_params", "clip_grad_norm", "SharedState"]


def sync_params(src, dst):
    """dst[:] = src for 1-D float32 C-contiguous arrays of equal length.

    The copy runs without the GIL; a concurrent Hogwild writer may leave
    ``dst`` with a mix of old and new elements (never a torn float).
    """
    _hogwild.copy_f32(src, dst)


def _norm_and_scale(grads, max_norm):
    """One pass over grads -> (norm, finite, scale to apply (1.0 = none))."""
    sumsq, finite = _hogwild.sumsq_f32(grads)
    norm = math.sqrt(sumsq) if finite else float("nan") if math.isnan(sumsq) else float("inf")
    scale = 1.0
    if finite and max_norm is not None and max_norm > 0 and norm > max_norm:
        scale = max_norm / norm
    return norm, finite, scale


def clip_grad_norm(grads, max_norm):
    """Clip the flat float32 ``grads`` in place to global L2 norm ``max_norm``.

    Returns ``(norm, finite)``: ``norm`` is the L2 norm before clipping
    (accumulated in float64); ``finite`` is False when any gradient is NaN or
    inf, in which case ``grads`` is left untouched (the caller should skip the
    update).  ``max_norm`` None or <= 0 disables the scaling, the norm and
    finiteness are still computed.  Below ``max_norm`` grads are unchanged.
    """
    norm, finite, scale = _norm_and_scale(grads, max_norm)
    if scale != 1.0:
        _hogwild.scale_f32(grads, scale)
    return norm, finite


class SharedState:
    """What all workers share: params, optimizer statistics, global counters.

    ``params`` is a private float32 C-contiguous copy of the given array.
    Counters ``steps`` (agent steps), ``updates`` (applied updates),
    ``episodes`` and ``skipped_updates`` (non-finite gradients) change only
    through the ``add_*`` methods, which hold a small lock (they run once per
    rollout).  :meth:`apply` counts ``updates``/``skipped_updates`` itself.
    """

    #: the global counters' names (``counters()``'s and ``state_dict()``'s keys)
    COUNTERS = ("steps", "updates", "episodes", "skipped_updates")

    def __init__(self, params, optimizer):
        p = np.asarray(params)
        if p.ndim != 1:
            raise ValueError(f"params must be a 1-D flat buffer, got shape {p.shape}")
        if not np.issubdtype(p.dtype, np.floating):
            raise TypeError(f"params must be floating point, got dtype {p.dtype}")
        if not np.all(np.isfinite(p)):
            raise ValueError("params contain non-finite values")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an a3c_core.core Optimizer, "
                            f"got {type(optimizer).__name__}")
        if optimizer.n_params != p.shape[0]:
            raise ValueError(f"optimizer is for {optimizer.n_params} params, "
                             f"params has {p.shape[0]}")
        self.params = _hugepages.zeros(p.shape[0], np.float32)
        self.params[...] = p
        self.optimizer = optimizer
        self._lock = threading.Lock()
        self.steps = self.updates = self.episodes = self.skipped_updates = 0

    @property
    def n_params(self):
        return self.params.shape[0]

    # -- counters ---------------------------------------------------------
    def _add(self, name, n):
        with self._lock:
            v = getattr(self, name) + int(n)
            setattr(self, name, v)
            return v

    def add_steps(self, n=1):
        """steps += n; returns the new total."""
        return self._add("steps", n)

    def add_updates(self, n=1):
        return self._add("updates", n)

    def add_episodes(self, n=1):
        return self._add("episodes", n)

    def add_skipped_updates(self, n=1):
        return self._add("skipped_updates", n)

    def counters(self):
        with self._lock:
            return {k: getattr(self, k) for k in self.COUNTERS}

    # -- hot path ---------------------------------------------------------
    def sync_to(self, local_params):
        """Copy the shared params into a worker's local float32 buffer (nogil)."""
        _hogwild.copy_f32(self.params, local_params)

    def apply(self, grads, max_grad_norm=None, global_step=None, offset=0, sync_to=None):
        """Clip by global norm and apply the optimizer to the shared params.

        Returns ``(norm, applied)``.  Non-finite gradients are not applied
        (params and statistics untouched) and increment ``skipped_updates``;
        otherwise ``updates`` is incremented.  The clip factor is folded into
        the optimizer loop, so ``grads`` itself is NOT modified.
        ``global_step`` (for learning-rate annealing) defaults to ``steps``.
        ``offset``: start the sweep there and wrap (same result; see
        :mod:`a3c_core.core.optim`: staggered workers contend less).
        ``sync_to``: a worker's local params, refreshed with the new shared
        values in the same sweep (apply + :meth:`sync_to` in one pass); left
        untouched when the update is skipped.
        """
        norm, finite, scale = _norm_and_scale(grads, max_grad_norm)
        if not finite:
            self.add_skipped_updates(1)
            return norm, False
        self.optimizer.apply(self.params, grads,
                             self.steps if global_step is None else global_step,
                             grad_scale=scale, offset=offset, out=sync_to)
        self.add_updates(1)
        return norm, True

    # -- checkpoints ------------------------------------------------------
    def state_dict(self):
        """{'params': copy, 'optimizer': optimizer.state_dict(), 'counters': {...}}."""
        return {"params": self.params.copy(), "optimizer": self.optimizer.state_dict(),
                "counters": self.counters()}

    def load_state_dict(self, d):
        if not isinstance(d, dict) or "params" not in d:
            raise ValueError("state must be a dict with 'params', 'optimizer', 'counters'")
        p = np.asarray(d["params"])
        if p.shape != self.params.shape:
            raise ValueError(f"checkpoint params have shape {p.shape}, expected {self.params.shape}")
        if not np.all(np.isfinite(p)):
            raise ValueError("checkpoint params contain non-finite values")
        counters = d.get("counters", {})
        bad = [k for k in counters if k not in self.COUNTERS]
        if bad:
            raise ValueError(f"unknown counters {bad}; expected {list(self.COUNTERS)}")
        if "optimizer" in d:
            self.optimizer.load_state_dict(d["optimizer"])
        self.params[...] = p
        with self._lock:
            for k in self.COUNTERS:
                setattr(self, k, int(counters.get(k, 0)))

    @classmethod
    def from_state_dict(cls, d):
        """Rebuild params, optimizer (by its saved name) and counters."""
        opt_state = d["optimizer"]
        opt = make_optimizer(opt_state["name"], int(np.asarray(d["params"]).shape[0]))
        s = cls(d["params"], opt)
        s.load_state_dict(d)
        return s
