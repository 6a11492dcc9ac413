"""A worker's envs behind one guard: env calls timed and watched, failed envs rebuilt.

An :class:`EnvGuard` holds the K envs of one
:class:`~a3c_core.train.worker.Worker` and every env call the worker makes:

* :meth:`EnvGuard.step` and :meth:`EnvGuard.reset` are the env's own
  calls, timed.  While one runs, ``step_began`` holds when it began
  (``perf_counter``; 0.0 otherwise) and ``step_env`` which env it is; the
  step durations go into a ring of :data:`STEP_RING` for
  :meth:`EnvGuard.step_median`.  The step watchdog
  (:mod:`a3c_core.train.watchdog`) reads these (``worker.guard``) and
  leaves its reason for a kill in ``hang_notes``.  An exception the env
  raises propagates unchanged: the worker decides what the failure does to
  its rollout.
* :meth:`EnvGuard.restart` is the restart policy (``remake_env``): the
  failed env is closed and rebuilt in place by ``remake_env(k)`` (the
  same id, options and seed), then reset; up to ``limit`` times in any
  :data:`RESTART_WINDOW` (a sliding window), after which the env's
  exception propagates as it does without a factory, and while the worker
  stops (``stopping`` set) it raises :class:`RolloutAborted` instead.
  Each restart is counted (``LossStats.env_restarts``) and reported to
  ``on_restart``.

``t_env`` sums the seconds spent in these calls (the worker's
``LossStats.t_env``; the worker zeroes it at the start of each rollout).
"""
from __future__ import annotations

import collections
import time
import traceback
from time import perf_counter

import numpy as np

__all__ = ["EnvGuard", "RolloutAborted", "RESTART_WINDOW", "STEP_RING"]

#: seconds of the sliding window ``env_restarts`` counts in (one hour)
RESTART_WINDOW = 3600.0

#: step durations kept per worker for the watchdog's median (a ring; a power of 2)
STEP_RING = 256


class RolloutAborted(Exception):
    """An env call failed while the worker is stopping (the run's shutdown
    killed a stuck engine): :meth:`~a3c_core.train.worker.Worker.run` returns quietly."""


class EnvGuard:
    """The env calls and restarts of one worker's envs (see the module docstring).

    Args:
        wid: the worker's index (reports).
        envs: the worker's list of K envs; a rebuilt env replaces its entry
            in this very list.
        stats: the worker's :class:`~a3c_core.train.store.LossStats`
            (``env_restarts``).
        remake_env: ``remake_env(k) -> Env``, a new env ``k``; None: a
            failure propagates.
        limit: the restarts allowed per :data:`RESTART_WINDOW` seconds.
        on_restart: ``on_restart(wid, k, summary, text, count, limit)``
            after each restart: a one-line summary, the traceback, the
            restarts in the window so far and the limit.
    """

    def __init__(self, wid, envs, stats, remake_env=None, limit=3, on_restart=None):
        self.wid = wid
        self.envs = envs
        self.stats = stats
        self.remake_env = remake_env
        self.limit = int(limit)
        self.on_restart = on_restart
        #: ``time.monotonic()`` of the restarts in the current window, oldest first
        self.restart_times = collections.deque()
        #: set while the worker is stopping (an Event, or None): an env that
        #: fails then is not rebuilt (:class:`RolloutAborted`)
        self.stopping = None
        #: ``perf_counter()`` when the current env call began (0.0: none)
        self.step_began = 0.0
        #: the env of that call
        self.step_env = 0
        #: recent step durations (a ring of STEP_RING), for the watchdog's median
        self.step_times = [0.0] * STEP_RING
        self.n_step_times = 0
        #: why the watchdog killed env k's engine, for the restart's report
        self.hang_notes = {}
        #: seconds in env calls since the worker last zeroed it
        self.t_env = 0.0

    def step(self, k, action):
        """``envs[k].step(action)``, timed; its exception propagates."""
        self.step_env = k
        self.step_began = c0 = perf_counter()
        try:
            out = self.envs[k].step(action)
        except BaseException:
            self.step_began = 0.0
            self.t_env += perf_counter() - c0
            raise
        dt = perf_counter() - c0
        self.step_began = 0.0
        self.t_env += dt
        self.step_times[self.n_step_times & (STEP_RING - 1)] = dt
        self.n_step_times += 1
        return out

    def reset(self, k):
        """``envs[k].reset()``, timed; its exception propagates."""
        self.step_env = k
        self.step_began = c0 = perf_counter()
        try:
            return self.envs[k].reset()
        finally:
            self.step_began = 0.0
            self.t_env += perf_counter() - c0

    def step_median(self):
        """The median of the recent env step durations (None before 16)."""
        n = min(self.n_step_times, STEP_RING)
        if n < 16:
            return None
        return float(np.median(np.asarray(self.step_times[:n])))

    def restart(self, k, exc, during):
        """Env ``k``'s ``step`` or ``reset`` (``during``) raised ``exc``:
        count the restart, close the env (best effort), build a new one with
        ``remake_env(k)`` and reset it; returns its first frame.  A failure
        while rebuilding counts as another restart.  Raises instead (module
        docstring) without a factory, past the limit or while stopping."""
        c0 = perf_counter()
        try:
            while True:
                self._count(k, exc, during)
                try:
                    self.envs[k].close()
                except Exception:  # noqa: BLE001 - a crashed engine may not close cleanly
                    pass
                try:
                    env = self.remake_env(k)
                    self.envs[k] = env
                    return env.reset()
                except Exception as e:  # noqa: BLE001 - counted as one more restart
                    exc, during = e, "restart"
        finally:
            self.t_env += perf_counter() - c0

    def _count(self, k, exc, during):
        """Count one restart of env ``k`` and report it, or raise: ``exc``
        itself without a factory or past the limit, :class:`RolloutAborted`
        while the worker stops."""
        if self.stopping is not None and self.stopping.is_set():
            raise RolloutAborted(f"env {k} of worker {self.wid} failed while stopping") from exc
        if self.remake_env is None:
            raise exc
        now = time.monotonic()
        window = self.restart_times
        while window and now - window[0] > RESTART_WINDOW:
            window.popleft()
        if len(window) >= self.limit:
            raise exc
        window.append(now)
        self.stats.env_restarts += 1
        hang = self.hang_notes.pop(k, None)
        what = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        summary = f"its {during} raised {what}"
        if hang:
            summary = f"{hang}; {summary}"
        if self.on_restart is not None:
            text = "".join(traceback.format_exception(exc))
            if hang:
                text = f"{hang}\n{text}"
            self.on_restart(self.wid, k, summary, text, len(window), self.limit)
