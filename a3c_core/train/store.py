"""The shared-state seam a :class:`~a3c_core.train.worker.Worker` talks to.

* ``pull(local_params)`` - copy the global parameters into the local ones;
* ``apply(grads, max_grad_norm, offset) -> (norm, applied)`` - clip and apply
  a gradient to the global parameters and optimizer statistics (Hogwild); a
  store whose ``syncs_on_apply`` is True also takes ``local=`` and refreshes
  the worker's params in the same pass (the next ``pull`` is skipped);
* ``add_steps(n) -> total``; ``steps`` reads the total;
* ``record_episode(wid, raw_return, length, end=None)`` - a finished episode;
* ``reward_scale(returns)`` / ``advantage_scale(advantages)`` - merge into
  the running normalizers and return the scale, or ``target_stats()``: their
  arrays, for the one compiled targets call.

:class:`ThreadStore` implements it for worker threads; worker processes
(:mod:`a3c_core.train.procs`) and Ray nodes bring their own.
:class:`LossStats` is a worker's running update statistics and timers.
"""
from __future__ import annotations

import threading

import numpy as np

__all__ = ["LossStats", "Store", "ThreadStore", "NO_STATS"]


class LossStats:
    """Running sums of one worker's update statistics (read by the monitor
    without a lock: a torn set of fields only mixes two adjacent updates)."""

    FIELDS = ("policy_loss", "value_loss", "entropy", "grad_norm", "updates", "skipped",
              "sil_replays", "sil_updates",
              # where the rollouts' wall time went, in seconds (``a3c bench``
              # prints it per agent step): the env's steps and resets, the
              # forward passes (with the preprocessing), the backward, the
              # apply, and the whole rollout (the rest is Python glue and
              # the targets); ``agent_steps`` counts the rows they played
              "t_env", "t_forward", "t_backward", "t_apply", "t_rollout", "agent_steps",
              # envs rebuilt after their step or reset raised (or the step
              # watchdog killed a hung one), summed over the workers
              "env_restarts")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0.0)

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in self.FIELDS], np.float64)


class Store:
    """The shared-state seam a :class:`Worker` talks to (see the module docstring)."""

    steps: int
    syncs_on_apply = False

    def pull(self, local_params) -> None:
        raise NotImplementedError

    def apply(self, grads, max_grad_norm, offset=0):
        raise NotImplementedError

    def add_steps(self, n) -> int:
        raise NotImplementedError

    def record_episode(self, wid, raw_return, length, end=None) -> None:
        raise NotImplementedError

    def reward_scale(self, returns) -> float:
        raise NotImplementedError

    def advantage_scale(self, advantages) -> float:
        raise NotImplementedError

    def target_stats(self):
        """``(reward stats, reward params, advantage stats, advantage
        params)``: the shared normalizers' arrays (an absent one: two empty
        arrays), or None: the worker calls :meth:`reward_scale` and
        :meth:`advantage_scale`."""
        return None


class ThreadStore(Store):
    """In-process store: Hogwild on a :class:`~a3c_core.core.SharedState`.
    ``on_episode(wid, ret, length, index, end=)`` is called for every
    finished episode; ``consecutive_skips`` counts non-finite updates in a row."""

    syncs_on_apply = True

    def __init__(self, shared, normalizer=None, on_episode=None, adv_normalizer=None):
        self.shared = shared
        self.normalizer = normalizer
        self.adv_normalizer = adv_normalizer
        self.on_episode = on_episode
        self.consecutive_skips = 0
        self._lock = threading.Lock()
        #: held while an episode is counted and reported: a checkpoint that
        #: reads the counters under it never counts an unwritten episode
        self.episode_lock = threading.Lock()

    @property
    def steps(self) -> int:
        return self.shared.steps

    def pull(self, local_params):
        self.shared.sync_to(local_params)

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        norm, applied = self.shared.apply(grads, max_grad_norm, offset=offset, sync_to=local)
        with self._lock:
            self.consecutive_skips = 0 if applied else self.consecutive_skips + 1
        return norm, applied

    def add_steps(self, n):
        return self.shared.add_steps(n)

    def record_episode(self, wid, raw_return, length, end=None):
        with self.episode_lock:
            idx = self.shared.add_episodes(1)
            if self.on_episode is not None:
                self.on_episode(wid, raw_return, length, idx, end=end)

    def reward_scale(self, returns):
        return self.normalizer.update(returns)

    def advantage_scale(self, advantages):
        return self.adv_normalizer.update(advantages)

    def target_stats(self):
        out = []
        for norm in (self.normalizer, self.adv_normalizer):
            if norm is None:
                out += [NO_STATS, NO_STATS]
            elif isinstance(getattr(norm, "stats", None), np.ndarray):
                out += [norm.stats, norm.params]
            else:                       # a normalizer of another kind: its update()
                return None
        return tuple(out)


NO_STATS = np.zeros(0)
