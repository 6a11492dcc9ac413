"""The step watchdog: an env call that hangs is treated as a crash.

One thread per process that runs workers (the trainer's, a worker
process's, a Ray node's), not one per step: every ``period`` seconds it
reads each worker's env guard (``worker.guard``, an
:class:`~a3c_core.train.env_guard.EnvGuard`, which times every ``step`` and
``reset``): ``step_began`` (``perf_counter()`` when the current env call
began, 0.0 when there is none) and ``step_env``.  A call
older than its bound, ``max(timeout, factor x the worker's median step)``,
is a hang: the watchdog kills that env's engine (:func:`kill_engine`: a
ViZDoom engine process, an env's child process), so that the call raises,
and the worker rebuilds the env as it rebuilds a crashed one (its restart
report says the watchdog did it).  A call is killed once; an env that has
no engine to kill (a Python env stepped in this process) is only reported.

:func:`kill_engines` is also what a stopping run uses on the envs of a
worker that did not stop in time (a thread stuck in a C call cannot be
joined): their calls raise and the worker, which is stopping, ends.
"""
from __future__ import annotations

import threading
import time
from time import perf_counter

__all__ = ["StepWatchdog", "kill_engine", "kill_engines", "STEP_FACTOR"]

#: the bound is at least this many times the env's own median step
STEP_FACTOR = 50.0


def kill_engine(env) -> bool:
    """Kill ``env``'s engine (SIGKILL), from any thread; True if it had one to kill."""
    kill = getattr(env, "kill_engine", None)
    if kill is None:
        return False
    try:
        return bool(kill())
    except Exception:  # noqa: BLE001 - best effort: the engine may be gone already
        return False


def kill_engines(envs) -> int:
    """:func:`kill_engine` on each of ``envs`` (None skipped); how many were killed."""
    return sum(kill_engine(e) for e in envs if e is not None)


class StepWatchdog:
    """Watches the env calls of ``workers()`` (a callable returning the
    workers, None for one not built yet) from one daemon thread.

    Args:
        workers: callable -> iterable of workers.
        timeout: the bound's floor in seconds (``env_step_timeout``); 0: off.
        report: ``report(line)`` for what the watchdog did (a warning line).
        factor: the bound is at least ``factor`` x the worker's median step.
        period: seconds between checks (default: timeout / 4, at most 1 s).
    """

    def __init__(self, workers, timeout, report=None, *, factor=STEP_FACTOR, period=None):
        self.workers = workers
        self.timeout = float(timeout)
        self.report = report
        self.factor = float(factor)
        self.period = float(period) if period else min(1.0, max(self.timeout / 4.0, 0.05))
        self.kills = 0
        self._done = set()      # (worker id, call start) already handled
        self._stop = threading.Event()
        self._thread = None

    def bound(self, w) -> float:
        """The seconds an env call of worker ``w`` may take."""
        med = w.guard.step_median()
        return max(self.timeout, self.factor * med) if med else self.timeout

    def check(self, now=None) -> list:
        """One pass; returns ``[(worker, env index, seconds, bound, killed)]``
        for the calls it found hung."""
        now = perf_counter() if now is None else now
        found = []
        for w in list(self.workers() or ()):
            if w is None:
                continue
            g = w.guard
            began = g.step_began
            if not began or now - began <= self.timeout:
                continue
            k = g.step_env
            if g.step_began != began:       # the call ended meanwhile
                continue
            key = (id(w), began)
            if key in self._done:
                continue
            bound = self.bound(w)
            took = now - began
            if took <= bound:
                continue
            self._done.add(key)
            env = g.envs[k] if k < len(g.envs) else None
            g.hang_notes[k] = (f"the step watchdog killed its engine: an env call had taken "
                               f"{took:.1f} s (bound {bound:.1f} s)")
            killed = env is not None and kill_engine(env)
            if killed:
                self.kills += 1
            else:
                g.hang_notes.pop(k, None)
                if self.report is not None:
                    self.report(f"warning: worker {w.wid}: env {k}'s call has taken {took:.0f} s "
                                f"(bound {bound:.1f} s, --env-step-timeout) and the env has no "
                                "engine process to kill; it cannot be interrupted")
            found.append((w, k, took, bound, killed))
        if len(self._done) > 10_000:
            self._done.clear()
        return found

    def _main(self):
        while not self._stop.wait(self.period):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must not die of a race
                time.sleep(self.period)

    def start(self):
        """Start the thread (nothing when the timeout is 0)."""
        if self.timeout > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._main, daemon=True, name="a3c-step-watchdog")
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
