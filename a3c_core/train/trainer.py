"""A3C training: N worker threads, one shared parameter vector, Hogwild updates.

Each worker thread runs a :class:`~a3c_core.train.worker.Worker` (its own env,
RNG, local network and rollout buffers) against a
:class:`~a3c_core.train.worker.ThreadStore`: pull the shared parameters, play
up to ``t_max`` steps, bootstrap (not after a terminal state; after a time-limit
truncation only when ``truncation_bootstrap``, which is off for doom by
default), returns + GAE, ``loss_and_grad``, clip and apply to the shared
parameters and optimizer statistics without a lock (Hogwild).

The main thread only watches: progress lines, metrics, checkpoints, stop
conditions, signals (SIGINT and SIGTERM stop the run cleanly with a final
checkpoint) and worker failures.  With one worker and a fixed seed a run is
deterministic; with several, Hogwild makes it nondeterministic by design (see
:mod:`a3c_core.core.optim`).

The :class:`Trainer` holds the run loop; its parts are components it owns:
the workers' envs (:class:`~a3c_core.train.env_slots.EnvSlots`), what the
run reports (:class:`~a3c_core.train.run_report.RunReport`: logs, console
lines, errors, summary.json, the reward averages) and its checkpoints
(:class:`~a3c_core.train.run_checkpoints.RunCheckpoints`: latest.npz and
best.npz, write faults).  Its backend gets what it needs of the run as a
:class:`~a3c_core.train.backends.RunContext`.

Reward averages: avg100 (the last
:data:`~a3c_core.train.config.REWARD_WINDOW` episodes) drives the progress
line and ``target_reward``; the long average over 1,000 episodes is what a
run reports as its result; ``best.npz`` holds the parameters at the best
long average (see :mod:`a3c_core.train.run_report` and
:mod:`a3c_core.train.run_checkpoints`).
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time

import numpy as np

from a3c_core import checkpoint as ck
from a3c_core._blas import blas_threads
from a3c_core.obs import ObsPipeline
from a3c_core.train.affinity import allowed_cores
from a3c_core.train.backends import Backend, RunContext, ThreadBackend, TrainingError
from a3c_core.train.build import (build_parts, check_memory, new_network, plan_run,
                                   restore_checkpoint, worker_offset)
from a3c_core.train.config import (MAX_SKIPPED_UPDATES, REWARD_WINDOW, Config, ConfigError,
                                   backend_choice, rollout_defaults)
from a3c_core.train.env_slots import EnvSlots
from a3c_core.train.procs import ProcessBackend
from a3c_core.train.run_checkpoints import RunCheckpoints, prepare_run_dir
from a3c_core.train.run_report import RunClock, RunReport
from a3c_core.train.signals import SIGNAL_EXIT, SignalsAsExceptions, StopSignal
from a3c_core.train.store import ThreadStore
from a3c_core.train.worker import Worker
from a3c_core.warmup import warm_up_network

__all__ = ["Trainer", "TrainResult", "TrainingError", "StopSignal", "train"]


class TrainResult:
    """What a finished run reports (also written to ``summary.json``)."""

    def __init__(self, run_dir, status, steps, episodes, seconds, moving_avg, checkpoint, *,
                 long_avg=None, best_avg=None, best_step=None, best_checkpoint=None,
                 skipped_updates=0, signal=None, avg_window=100, long_window=0,
                 episode_ends=None, unwritten_rows=None, checkpoint_write_failures=0,
                 env_restarts=0, worker_restarts=0):
        self.run_dir = run_dir
        self.status = status  # "done", "interrupted" or "failed"
        self.steps = steps
        self.episodes = episodes
        self.seconds = seconds
        self.moving_avg = moving_avg        # short window (REWARD_WINDOW episodes)
        self.long_avg = long_avg            # long window (10 x REWARD_WINDOW)
        self.best_avg = best_avg            # best long average (held by best.npz)
        self.best_step = best_step
        self.checkpoint = checkpoint        # latest.npz: the final parameters
        self.best_checkpoint = best_checkpoint
        self.skipped_updates = skipped_updates
        self.signal = signal
        self.avg_window = avg_window        # episodes in moving_avg
        self.long_window = long_window      # episodes in long_avg
        #: how the moving_avg window's episodes ended: {"died": 69, "ended alive": 31}
        self.episode_ends = dict(episode_ends or {})
        #: rows (TensorBoard: points) the logs could not write, by file: {"metrics.csv": 412}
        self.unwritten_rows = dict(unwritten_rows or {})
        #: checkpoint writes the file system refused during the run (each one retried)
        self.checkpoint_write_failures = int(checkpoint_write_failures)
        #: envs rebuilt in place after a crash or a hang (errors.log has each traceback)
        self.env_restarts = int(env_restarts)
        #: worker processes forked again after theirs died (errors.log has each one)
        self.worker_restarts = int(worker_restarts)

    @property
    def exit_code(self) -> int:
        if self.status == "interrupted":
            return SIGNAL_EXIT.get(self.signal, 130)
        return 0 if self.status == "done" else 1

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    def __repr__(self):
        return (f"TrainResult(status={self.status!r}, steps={self.steps}, episodes={self.episodes}, "
                f"seconds={self.seconds:.1f}, moving_avg={self.moving_avg}, "
                f"long_avg={self.long_avg}, best_avg={self.best_avg}, run_dir={self.run_dir!r})")


def _default_run_dir(cfg: Config) -> str:
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.split("/")[-1].replace(":", "_"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    spec = "" if cfg.spec == "auto" else f"-{cfg.spec}"
    return os.path.join("runs", f"{env}{spec}-s{cfg.seed}-{stamp}")


class Trainer:
    """Runs one training run: its lifecycle and its monitor loop.

    The run's parts come from :func:`~a3c_core.train.build.plan_run` and
    :func:`~a3c_core.train.build.build_parts`; its components are
    :attr:`env_slots`, :attr:`report` and :attr:`checkpoints`; its workers
    run in ``backend`` (:class:`~a3c_core.train.backends.ThreadBackend`,
    :class:`~a3c_core.train.procs.ProcessBackend` or
    :class:`~a3c_core.distributed.driver.RayBackend`; default: threads or
    processes as :func:`~a3c_core.train.config.backend_choice` says), which
    is given a :class:`~a3c_core.train.backends.RunContext`.  Use as a
    context manager or call :meth:`close`; :func:`train` is the one-call
    version.  ``run()`` may be called once.
    """

    norm_seconds = None             # how long measuring the image normalization took (a new run)
    #: (steps, episodes) of the checkpoint a resumed run continues (None: a new run)
    resume_counters = None

    def __init__(self, cfg: Config, *, resume: str | None = None, out=None,
                 backend: Backend | None = None):
        self.out = out if out is not None else sys.stdout
        # envs per worker and t_max, where left to the defaults, are the
        # scenario's from here on (config.toml and the checkpoint record them)
        self.cfg = cfg = rollout_defaults(cfg.validate())
        if backend is None:
            processes, why = backend_choice(cfg)
            backend = ProcessBackend(why) if processes else ThreadBackend(why)
        self.backend = backend
        self.report = self.checkpoints = None     # once the run is built
        self.resume_note = None

        ckpt = None
        if resume is not None:
            if not os.path.isdir(resume):
                raise ck.no_run_dir(resume)
            ckpt = ck.find_resume_checkpoint(resume)  # validates before anything is written
            self.resume_note = f"resuming from {ckpt.path} (step {ckpt.meta.get('counters', {}).get('steps', 0):,})"
            for why in ckpt.skipped:    # e.g. a corrupt latest.npz: say why it was passed over
                self.resume_note += f"; skipped {why}"
            self.run_dir = resume
        meta = ckpt.meta if ckpt is not None else {}
        counters = meta.get("counters", {})
        self.n_workers = cfg.n_workers()
        self.resumes = int(counters.get("resumes", -1)) + 1 if ckpt else 0

        if resume is None:
            self.run_dir = cfg.run_dir or _default_run_dir(cfg)
            ck_dir = os.path.join(self.run_dir, "checkpoints")
            if any(os.path.exists(os.path.join(ck_dir, f"{w}.npz")) for w in ("latest", "best")):
                raise ConfigError(
                    f"config field 'run_dir' = {self.run_dir!r}: it already holds a run; "
                    "use --resume to continue it or choose another --run-dir"
                )
        self.stop_event = threading.Event()
        self.env_slots = EnvSlots(cfg, self.run_dir, self.n_workers, self.resumes, self.stop_event,
                                  allowed_cores() if cfg.pin_threads else [])
        try:
            env = self.env_slots.get(0, pin=True)  # unknown ids fail before any file is written
            self.plan = plan = plan_run(cfg, env, ckpt)
            check_memory(cfg, plan, env)        # before the other envs start
            self.parts = build_parts(plan)
            if ckpt is not None:
                restore_checkpoint(self.parts, ckpt)
                self.resume_counters = (int(counters.get("steps", 0)),
                                        int(counters.get("episodes", 0)))
            self.clock = RunClock(float(counters.get("wall_seconds", 0.0)) if ckpt else 0.0)
            self.norm_seconds = plan.norm_seconds
            for note in plan.notes:
                self.resume_note += f"; {note}"
            self.report = RunReport(cfg, self.run_dir, self.out, self.parts, self.clock,
                                    stamp=backend.episode_stamp, live_steps=backend.live_steps)
            self.store = ThreadStore(self.shared, self.normalizer, self.report.on_episode,
                                     self.adv_normalizer)
            self.checkpoints = RunCheckpoints(cfg, self.run_dir, plan, self.parts, self.store,
                                              self.report, resumes=self.resumes,
                                              before_save=backend.before_save, meta=meta)
            self.backend.bind(RunContext(
                cfg=cfg, n_workers=self.n_workers, run_dir=self.run_dir, resumes=self.resumes,
                plan=plan, parts=self.parts, store=self.store, stop_event=self.stop_event,
                clock=self.clock, env_slots=self.env_slots, report=self.report,
                # looked up at each call: a bench or test may wrap them on the trainer
                make_worker=lambda *a, **kw: self.make_worker(*a, **kw),
                warm_up=lambda: self.warm_up()))
            self.backend.prepare()
        except BaseException:
            self.close()  # no engine process left behind by a refused start
            raise

        try:    # a read-only or full file system: the CLI's clear error, no engine left
            # defaults as resolved now
            prepare_run_dir(self.run_dir, cfg.pinned(plan.resolved).to_toml())
        except OSError:
            self.close()
            raise
        self.backend.written()

        self._signals = SignalsAsExceptions()   # inert until run() enters one
        self.stop_reason = None
        self.target_reached = None

    # -- the run's parts (read by benchmarks and tests) ----------------------
    @property
    def shared(self):
        return self.parts.shared

    @property
    def normalizer(self):
        return self.parts.normalizer

    @property
    def adv_normalizer(self):
        return self.parts.adv_normalizer

    @property
    def spec_name(self) -> str:
        return self.plan.spec_name

    @property
    def net_spec(self) -> dict:
        return self.plan.net_spec

    @property
    def pipeline_spec(self) -> dict:
        return self.plan.pipeline_spec

    @property
    def env_spec(self) -> dict:
        return self.plan.env_spec

    @property
    def workers(self) -> list:
        """The workers built so far in this process (None for one not built yet)."""
        return self.backend.workers

    @property
    def envs(self) -> list:
        """The envs this process holds, by slot: env ``e`` is env ``e %
        envs_per_worker`` of worker ``e // envs_per_worker`` (None: not
        started yet, or closed)."""
        return self.env_slots.envs

    @property
    def errors(self) -> list:
        """``(worker id or what failed, text)`` of what failed the run."""
        return self.report.errors

    @property
    def stuck_workers(self) -> list:
        """Workers that did not stop, stuck in a call (the process should
        end with ``os._exit`` once the run is written: see :mod:`a3c_core.cli`)."""
        return list(getattr(self.backend, "stuck", ()) or ())

    def live_steps(self) -> int:
        """The agent steps so far, as the workers count them (for a bench)."""
        return self.backend.live_steps()

    def worker_updates(self) -> list:
        """Updates applied or skipped by each worker so far (0 for one not built yet)."""
        return self.backend.worker_updates()

    # -- what the backend calls ---------------------------------------------------
    def make_worker(self, wid, store=None, on_env_restart=None) -> Worker:
        """Worker ``wid`` with its envs, a local network and its own RNG, on
        ``store`` (default: the run's in-process store); an env that fails
        is rebuilt (:meth:`EnvSlots.remake`) and reported to
        ``on_env_restart`` (default :meth:`RunReport.env_restarted`)."""
        slots, K = self.env_slots, self.cfg.envs_per_worker
        envs = slots.worker_envs(wid)
        env = envs[0]
        pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
        gen = slots.generation[wid]     # > 0: a restarted worker process
        rng = np.random.default_rng([self.cfg.seed, wid, self.resumes] + ([gen] if gen else []))
        return Worker(wid, envs if K > 1 else env, new_network(self.plan), pipe,
                      store if store is not None else self.store, self.plan.settings, rng,
                      offset=worker_offset(wid, self.n_workers, self.shared.n_params),
                      remake_env=lambda k: slots.remake(wid * K + k),
                      env_restarts=self.cfg.env_restarts,
                      on_env_restart=on_env_restart or self.report.env_restarted)

    def warm_up(self):
        """Compile (first run) or load (cached) the Numba kernels before the clock starts."""
        notice = threading.Timer(
            1.5, lambda: print("compiling Numba kernels (first run only; cached afterwards)...",
                               file=self.out, flush=True))
        if not self.cfg.quiet:
            notice.start()
        try:
            with self._signals.deferred():  # a Ctrl-C lands between compiles
                warm_up_network(new_network(self.plan), self.plan.resolved.records_resets,
                                n_envs=self.cfg.envs_per_worker)
        finally:
            notice.cancel()

    # -- the run ------------------------------------------------------------
    def run(self, announce=None, *, exiting=False) -> TrainResult:
        """Train until a stop condition, a signal or a failure; always leaves a
        loadable checkpoint, ``summary.json`` and closed envs behind.
        ``announce()`` (the CLI's "run directory" line) is called once the
        signal handlers are in place, so a Ctrl-C right after it is the run's.
        ``exiting`` (the CLI: the process ends after the run): once a signal
        stopped the run, later SIGINTs and SIGTERMs stay ignored, so a second
        Ctrl-C cannot end the process by the signal instead of its exit status."""
        # the handlers go in first, deferred: threadpoolctl's scan (a ctypes
        # callback) would swallow a KeyboardInterrupt; _run raises it
        with SignalsAsExceptions(defer=True, keep_ignoring=exiting) as self._signals:
            try:
                if announce is not None:
                    announce()
                with blas_threads(1):
                    return self._run()
            finally:
                self.close()

    def _run(self) -> TrainResult:
        cfg, report = self.cfg, self.report
        status, sig = "done", None
        handles = None
        path = None
        try:
            self._signals.resume()
            report.open_logger(resume_at=self.resume_counters)
            handles = self.backend.start()
            self._monitor(handles)
        except KeyboardInterrupt as e:  # SIGINT, or SIGTERM via StopSignal
            self._signals.caught()
            status, sig = "interrupted", getattr(e, "name", "SIGINT")
            self.stop_event.set()
            if not cfg.quiet:
                what = "writing a checkpoint" if self.clock.started else "nothing trained yet"
                print(f"\n{sig}: stopping ({what})...", file=self.out, flush=True)
        finally:
            self.stop_event.set()
            self.backend.stop(handles)
            if self.clock.started:
                path, save_error = self.checkpoints.final()
                if save_error:
                    report.errors.append(save_error)
        if report.errors:
            status = "failed"
        result = self._result(status, sig, path)
        self.backend.extend_result(result)
        report.write_summary(result, self.stop_reason, self.target_reached)
        report.report_unwritten(result)
        if report.errors:
            who, text = report.errors[0]
            if who == "final checkpoint":   # the whole story is its one line
                raise TrainingError(text, report.errors)
            raise self.backend.failure(path)
        return result

    def _stop(self, reason):
        self.stop_reason = reason
        self.stop_event.set()

    def _monitor(self, handles):
        """The main thread's loop while the workers run: the stop conditions,
        the scalar logs and progress lines, the checkpoints."""
        cfg, backend, report, ckpts = self.cfg, self.backend, self.report, self.checkpoints
        now = time.perf_counter()
        last_ckpt = last_log = last_line = now
        first_ckpt_done = False
        last_steps = int(self.shared.steps)
        prev = backend.loss_totals()
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        line_every = cfg.log_interval if tty else max(10.0, cfg.log_interval)
        while backend.running(handles):
            self.stop_event.wait(min(backend.tick_seconds, cfg.log_interval))
            self._signals.check()   # a signal whose raise C code swallowed
            backend.before_tick()
            now = time.perf_counter()
            steps = int(self.shared.steps)
            short, _, n_eps = report.rewards.averages()
            if cfg.total_steps and steps >= cfg.total_steps:
                self._stop("total_steps")
            if cfg.total_seconds and self.clock.elapsed() >= cfg.total_seconds:
                self._stop("total_seconds")
            if (cfg.target_reward is not None and short is not None
                    and n_eps >= REWARD_WINDOW and short >= cfg.target_reward):
                if self.target_reached is None:
                    # the average that met the target: episodes still in flight when the
                    # workers stop (a Ray node's last batch) move the final window after it
                    self.target_reached = {"moving_avg": float(short), "steps": steps,
                                           "episodes": int(self.shared.episodes),
                                           "seconds": round(self.clock.elapsed(), 3)}
                self._stop("target_reward")
            skips = backend.consecutive_skips()
            if skips >= MAX_SKIPPED_UPDATES:
                report.errors.append(("divergence", (
                    f"{skips} updates in a row were skipped for non-finite gradients (NaN/inf); "
                    "stopping. Lower lr, reward_scale or max_grad_norm")))
                self._stop("diverged")
            if now - last_log >= cfg.log_interval:
                sps = (steps - last_steps) / (now - last_log)
                tot = backend.loss_totals()
                d = tot - prev
                prev = tot
                # how many workers' rollouts run on into the next episode (merge_below)
                merging = backend.merging_workers() if self.plan.resolved.merge_below > 0 else None
                report.log_scalars(steps, sps, d, tot, merging=merging,
                                   live_optimizer=backend.live_optimizer)
                backend.after_log(steps, now - last_log)
                backend.guard(ckpts.maybe_save_best)
                if not cfg.quiet and now - last_line >= line_every:
                    report.progress(steps, sps, d, tty)
                    last_line = now
                last_log, last_steps = now, steps
            # the first 'latest' as soon as one update is in, then every interval
            if cfg.checkpoint_interval and (
                    (not first_ckpt_done and self.shared.updates > 0)
                    or now - last_ckpt >= cfg.checkpoint_interval):
                backend.guard(ckpts.save_or_warn, "latest")
                first_ckpt_done, last_ckpt = True, now

    def _result(self, status, sig, path):
        report, ckpts = self.report, self.checkpoints
        short, long_avg, n_eps = report.rewards.averages()
        return TrainResult(
            self.run_dir, status, int(self.shared.steps), int(self.shared.episodes),
            self.clock.elapsed(), short, path, long_avg=long_avg,
            best_avg=ckpts.best_long_avg(), best_step=ckpts.best_step,
            best_checkpoint=ckpts.best_on_disk(),
            skipped_updates=int(self.shared.skipped_updates), signal=sig,
            avg_window=min(n_eps, REWARD_WINDOW), long_window=n_eps,
            episode_ends=report.rewards.ends(),
            unwritten_rows=report.logger.unwritten if report.logger is not None else None,
            checkpoint_write_failures=ckpts.write_failures, env_restarts=report.env_restarts,
            worker_restarts=report.worker_restarts)

    # -- resources ----------------------------------------------------------
    def close(self):
        """Stop the backend's workers and close the logger and every env
        (engines, child processes). Idempotent."""
        self.backend.close()
        self.env_slots.stop_starter()     # no env may start after the close below
        first_error = self.report.close_logger() if self.report is not None else None
        first_error = self.env_slots.close(getattr(self.backend, "stuck", ())) or first_error
        try:  # the envs remove their runtime files; drop the emptied folder too
            os.rmdir(os.path.join(self.run_dir, "vizdoom"))
        except (OSError, AttributeError):
            pass
        self.backend.closed()
        if first_error is not None:
            print(f"warning: while closing: {first_error}", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def train(cfg: Config | None = None, *, resume: str | None = None, out=None,
          backend: Backend | None = None, **overrides) -> TrainResult:
    """Train with ``cfg`` (a :class:`Config`; keyword overrides allowed)."""
    cfg = cfg or Config()
    if overrides:
        cfg = cfg.replace(**overrides)
    return Trainer(cfg, resume=resume, out=out, backend=backend).run()
