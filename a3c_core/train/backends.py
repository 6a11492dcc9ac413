"""Where a run's workers run: the backend object a :class:`~a3c_core.train.trainer.Trainer`
is given, and the :class:`RunContext` the trainer gives it.

The trainer owns the run (its parts, envs, report and checkpoints) and
calls its backend at fixed points: :meth:`Backend.start` the workers, ask
whether they are :meth:`~Backend.running`, :meth:`~Backend.stop` them, and
read their counters.  What a backend needs of the run is passed to it in
:meth:`Backend.bind` as a :class:`RunContext`; a backend reads nothing else
of its trainer.  :class:`ThreadBackend` runs the workers as threads of this
process (Hogwild on the shared arrays); :class:`~a3c_core.train.procs.ProcessBackend`
as forked processes on shared memory; :class:`~a3c_core.distributed.driver.RayBackend`
in Ray node actors.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback

import numpy as np

from a3c_core.train.watchdog import kill_engines
from a3c_core.train.store import LossStats

__all__ = ["Backend", "RunContext", "ThreadBackend", "TrainingError"]


class TrainingError(RuntimeError):
    """A worker failed (or the run diverged); ``worker_tracebacks`` holds what was raised."""

    def __init__(self, msg, worker_tracebacks=()):
        super().__init__(msg)
        self.worker_tracebacks = list(worker_tracebacks)


#: seconds stopping workers get to end their rollout before the engines of
#: those still running are killed (a thread stuck in a C call cannot be joined)
STOP_GRACE = 3.0
#: seconds they then get to end once their engines are gone; a thread still
#: alive after that is left behind (:attr:`Backend.stuck`)
KILL_GRACE = 3.0


def join_all(threads, timeout=None):
    """Join ``threads``, for at most ``timeout`` seconds in all (None: no
    limit); a second Ctrl-C meanwhile keeps waiting (data first).  Returns
    the threads still alive."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for th in threads:
        while th.is_alive():
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                break
            try:
                th.join(left)
            except KeyboardInterrupt:
                pass
    return [th for th in threads if th.is_alive()]


@dataclasses.dataclass
class RunContext:
    """What a backend is given of its run (:meth:`Backend.bind`), and all it
    reads of it.

    ``cfg``: the run's :class:`~a3c_core.train.config.Config` (envs per
    worker and t_max resolved); ``n_workers``; ``run_dir``; ``resumes``
    (how many times the run was resumed: a Ray node's seeds);
    ``plan``/``parts``: the run's :class:`~a3c_core.train.build.RunPlan`
    and :class:`~a3c_core.train.build.RunParts` (the shared state, the
    normalizers); ``store``: the in-process
    :class:`~a3c_core.train.store.ThreadStore` (its ``record_episode``
    counts and logs an episode); ``stop_event``: set when the run stops;
    ``clock``: the :class:`~a3c_core.train.run_report.RunClock` (a backend
    starts it as its workers start); ``env_slots``: this process's
    :class:`~a3c_core.train.env_slots.EnvSlots`; ``report``: the
    :class:`~a3c_core.train.run_report.RunReport` (``errors``, ``logger``,
    ``out``, ``on_episode``, ``env_restarted``, ``worker_restarted``,
    ``write_error_log``); ``make_worker(wid, store=None,
    on_env_restart=None)`` and ``warm_up()``: the trainer's
    :meth:`~a3c_core.train.trainer.Trainer.make_worker` and
    :meth:`~a3c_core.train.trainer.Trainer.warm_up`.
    """

    cfg: object
    n_workers: int
    run_dir: str
    resumes: int
    plan: object
    parts: object
    store: object
    stop_event: threading.Event
    clock: object
    env_slots: object
    report: object
    make_worker: object
    warm_up: object

    @property
    def shared(self):
        """The run's :class:`~a3c_core.core.SharedState` (``parts.shared``)."""
        return self.parts.shared


class Backend:
    """The hooks a trainer calls; :meth:`bind` gives the backend its
    :class:`RunContext` (:attr:`ctx`), which is all a backend reads of the
    run.  Of the :class:`~a3c_core.train.trainer.Trainer` a backend uses no
    attribute: only its ``make_worker`` and ``warm_up`` methods, passed in
    the context.  What each backend reads of the context:

    * this class: ``n_workers``, ``shared``, ``store``, ``clock``,
      ``report.errors`` and ``report.write_error_log``;
    * :class:`ThreadBackend`: also ``cfg``, ``stop_event``, ``env_slots``,
      ``make_worker`` and ``warm_up``;
    * :class:`~a3c_core.train.procs.ProcessBackend`: also ``cfg``,
      ``stop_event``, ``env_slots``, ``make_worker``, ``warm_up``,
      ``parts``, ``run_dir`` and ``report``'s ``logger``, ``out``,
      ``env_restarted`` and ``worker_restarted``;
    * :class:`~a3c_core.distributed.driver.RayBackend`: ``cfg``,
      ``n_workers``, ``run_dir``, ``resumes``, ``plan``, ``parts``,
      ``shared``, ``stop_event``, ``clock``, ``env_slots`` (to close env 0)
      and ``report``'s ``errors``, ``logger``, ``out``, ``on_episode`` and
      ``env_restarted`` (its nodes build their own workers).
    """

    #: the run line's name of the backend
    name = "workers"
    #: the trainer's optimizer is the one the workers apply to (its moments are
    #: live and logged as ``optim/*``); a Ray driver's copy is only refreshed at
    #: checkpoints
    live_optimizer = True
    #: seconds between the trainer's monitor ticks
    tick_seconds = 0.2

    def __init__(self, why: str = ""):
        self.why = why          #: why this backend was chosen (the run line)
        self.ctx = None         #: the run's RunContext (from bind)
        self.workers = []
        #: workers that did not stop (stuck in a call even after their engines
        #: were killed): their envs are left to the process's exit
        self.stuck = []

    def bind(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.workers = [None] * ctx.n_workers

    def describe(self) -> str:
        """``"2 worker threads (2 workers < 8: threads start faster)"``."""
        n = self.ctx.n_workers if self.ctx is not None else 0
        return f"{n} {self.name}" + (f" ({self.why})" if self.why else "")

    # -- life cycle ---------------------------------------------------------
    def prepare(self) -> None:
        """The run is built (env 0 started): set up what the backend needs."""

    def written(self) -> None:
        """The run directory and its config.toml exist."""

    def start(self):
        """Start the workers and the run's clock; returns what :meth:`running` takes."""
        raise NotImplementedError

    def running(self, handles) -> bool:
        raise NotImplementedError

    def stop(self, handles) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`start` made (before the trainer closes its envs)."""

    def closed(self) -> None:
        """After the trainer closed its logger and envs."""

    # -- the monitor's hooks -----------------------------------------------------
    def before_tick(self) -> None:
        """At every monitor tick, before the stop conditions are checked."""

    def after_log(self, steps, dt) -> None:
        """After each scalar log (every ``log_interval``)."""

    def guard(self, fn, *args):
        """Run a checkpoint write from the monitor (a backend may trap its errors)."""
        return fn(*args)

    def before_save(self, which) -> None:
        """Bring this process's copy of the global state up to date for a checkpoint."""

    def extend_result(self, result) -> None:
        """Add backend-specific fields to the result before ``summary.json``."""

    def failure(self, path) -> TrainingError:
        """The run's error: one line naming what failed and why; worker tracebacks
        go to ``RUN_DIR/errors.log`` (the line says so)."""
        report = self.ctx.report
        who, text = report.errors[0]
        last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        if isinstance(who, int):
            log = report.write_error_log()
            what = f"worker {who} failed: {last} (traceback in {log})"
        else:
            what = f"{who}: {last}"
        return TrainingError(f"{what}; last checkpoint: {path or 'none written'}", report.errors)

    def episode_stamp(self) -> tuple:
        """``(global step, wall seconds)`` of the episode being recorded."""
        return int(self.ctx.shared.steps), self.ctx.clock.elapsed()

    # -- counters ---------------------------------------------------------------
    def live_steps(self) -> int:
        return int(self.ctx.shared.steps)

    def consecutive_skips(self) -> int:
        return self.ctx.store.consecutive_skips

    def worker_updates(self) -> list:
        """Updates applied or skipped by each worker so far (0 for one not built yet)."""
        return [0 if w is None else int(w.stats.updates + w.stats.skipped) for w in self.workers]

    def merging_workers(self):
        """How many workers' rollouts run on into the next episode (None: no worker yet)."""
        ws = [w for w in self.workers if w is not None]
        return sum(bool(getattr(w, "merging", False)) for w in ws) if ws else None

    def loss_totals(self) -> np.ndarray:
        """Sum of every worker's :class:`~a3c_core.train.worker.LossStats` (as a float array)."""
        arrs = [w.stats.as_array() for w in self.workers if w is not None]
        return np.sum(arrs, axis=0) if arrs else np.zeros(len(LossStats.FIELDS))


def step_watchdog(timeout, workers):
    """A :class:`~a3c_core.train.watchdog.StepWatchdog` over ``workers()``
    with the run's ``env_step_timeout`` (started; inert with 0)."""
    from a3c_core.train.watchdog import StepWatchdog

    def report(line):
        print(line, file=sys.stderr, flush=True)

    return StepWatchdog(workers, timeout, report).start()


class ThreadBackend(Backend):
    """Workers as threads of this process, Hogwild on the trainer's shared arrays.

    A step watchdog thread (:mod:`a3c_core.train.watchdog`) watches their
    env calls.  Stopping is bounded: workers get :data:`STOP_GRACE` seconds
    to end their rollout; then the engines of those still running are
    killed (their env calls raise and, stopping, they end) and they get
    :data:`KILL_GRACE` more; a thread still alive is left behind in
    :attr:`stuck` (its envs are not closed under it; the CLI ends the
    process with ``os._exit`` once the final checkpoint is written)."""

    name = "worker threads"
    _watchdog = None

    def start(self):
        ctx = self.ctx
        ctx.env_slots.start_beside()
        ctx.warm_up()
        threads = [threading.Thread(target=self._worker_main, args=(i,), daemon=True,
                                    name=f"a3c-worker-{i}") for i in range(ctx.n_workers)]
        ctx.clock.start()
        for th in threads:
            th.start()
        self._watchdog = step_watchdog(ctx.cfg.env_step_timeout, lambda: self.workers)
        return threads

    def _worker_main(self, wid):
        ctx = self.ctx
        try:
            ctx.env_slots.pin_worker(wid)
            w = self.workers[wid] = ctx.make_worker(wid)
            w.run(ctx.stop_event, ctx.cfg.total_steps)
        except BaseException:  # noqa: BLE001 - surfaced by the main thread
            ctx.report.errors.append((wid, traceback.format_exc()))
            ctx.stop_event.set()

    def running(self, threads) -> bool:
        # once the run stops, the monitor hands over to stop(): its wait is
        # bounded, a worker stuck in an env call would hold this loop forever
        return not self.ctx.stop_event.is_set() and any(th.is_alive() for th in threads)

    def stop(self, threads) -> None:
        threads = threads or []
        left = join_all(threads, STOP_GRACE)
        if left:
            K = self.ctx.cfg.envs_per_worker
            for i, th in enumerate(threads):
                if th.is_alive():
                    w = self.workers[i]
                    envs = w.envs if w is not None else self.ctx.env_slots.envs[i * K:(i + 1) * K]
                    killed = kill_engines(envs)
                    print(f"worker {i} did not stop within {STOP_GRACE:g} s (stuck in an env "
                          f"call?): {killed} engine{'s' * (killed != 1)} killed", file=sys.stderr,
                          flush=True)
            left = join_all(threads, KILL_GRACE)
        self.stuck = [i for i, th in enumerate(threads) if th.is_alive()]
        if self.stuck:
            print(f"worker{'s' * (len(self.stuck) > 1)} {', '.join(map(str, self.stuck))} still "
                  "stuck: left to the process's exit", file=sys.stderr, flush=True)
        if self._watchdog is not None:
            self._watchdog.stop()
