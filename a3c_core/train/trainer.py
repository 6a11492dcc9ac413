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

Reward averages: ``avg<reward_window>`` (default 100 episodes) drives the
progress line and ``target_reward``; the long average over ``10 x
reward_window`` episodes (1,000 by default) is what a run reports as its
result.  At hundreds of episodes per second a 100-episode average spans less
than a second of training; 1,000 episodes is a window that means something.
``best.npz`` holds the parameters at the best long average, considered only
once ``reward_window`` episodes have finished (the long average then covers
every episode so far, up to its full window).
"""
from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
import threading
import time

import numpy as np

from a3c_core import checkpoint as ck
from a3c_core._blas import blas_threads
from a3c_core.checkpoint import CheckpointError, CheckpointWriteError, save_checkpoint
from a3c_core.envs import make_env
from a3c_core.obs import ObsPipeline
from a3c_core.train.affinity import allowed_cores, pin_thread
from a3c_core.train.backends import Backend, ThreadBackend, TrainingError
from a3c_core.train.build import (build_parts, check_memory, new_network, plan_run,
                                   restore_checkpoint, seed_of, worker_offset)
from a3c_core.train.config import (Config, ConfigError, backend_choice, env_args,
                                    rollout_defaults)
from a3c_core.train.logger import MetricsLogger
from a3c_core.train.procs import ProcessBackend
from a3c_core.train.signals import SIGNAL_EXIT, SignalsAsExceptions, StopSignal
from a3c_core.train.watchdog import kill_engine
from a3c_core.train.store import ThreadStore
from a3c_core.train.worker import Worker
from a3c_core.warmup import warm_up_network

__all__ = ["Trainer", "TrainResult", "TrainingError", "StopSignal", "train"]

#: the long reward average covers this many times ``reward_window`` episodes
LONG_WINDOW_FACTOR = 10


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
        self.moving_avg = moving_avg        # short window (reward_window episodes)
        self.long_avg = long_avg            # long window (10 x reward_window)
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


class RewardWindows:
    """Raw episode returns: short and long moving averages, and how the
    episodes of the short window ended (thread-safe)."""

    def __init__(self, short, long):
        self.short = int(short)
        self._ret = collections.deque(maxlen=int(long))
        self._ends = collections.deque(maxlen=self.short)
        self._lock = threading.Lock()

    def add(self, ret, end=None):
        with self._lock:
            self._ret.append(float(ret))
            self._ends.append(end)

    def ends(self) -> dict:
        """How the short window's episodes ended (the env's
        :attr:`~a3c_core.envs.base.Env.episode_end`), most common first;
        episodes whose env does not tell are left out."""
        with self._lock:
            counts = collections.Counter(e for e in self._ends if e)
        return dict(counts.most_common())

    def __len__(self):
        return len(self._ret)

    def averages(self):
        """``(short avg or None, long avg or None, episodes in the window)``."""
        with self._lock:
            if not self._ret:
                return None, None, 0
            arr = np.fromiter(self._ret, np.float64, len(self._ret))
        return float(arr[-self.short:].mean()), float(arr.mean()), arr.size


def _rms_diff(a, b) -> float:
    """RMS of ``a - b`` over two flat float32 arrays, in float64 (chunked, no
    full-size temporary)."""
    n = a.shape[0]
    acc = 0.0
    for lo in range(0, n, 1 << 16):
        d = a[lo:lo + (1 << 16)].astype(np.float64) - b[lo:lo + (1 << 16)]
        acc += float(np.dot(d, d))
    return math.sqrt(acc / n) if n else 0.0


class Trainer:
    """Runs one training run: lifecycle, monitor, checkpoints.

    The run's parts come from :func:`~a3c_core.train.build.plan_run` and
    :func:`~a3c_core.train.build.build_parts`; its workers run in ``backend``
    (:class:`~a3c_core.train.backends.ThreadBackend`,
    :class:`~a3c_core.train.procs.ProcessBackend` or
    :class:`~a3c_core.distributed.driver.RayBackend`; default: threads or
    processes as :func:`~a3c_core.train.config.backend_choice` says).  Use as
    a context manager or call :meth:`close`; :func:`train` is the one-call
    version.  ``run()`` may be called once.
    """

    _param_snapshot = None          # shared params at the last log (optim/param_change_*)
    _param_snapshot_updates = 0
    norm_seconds = None             # how long measuring the image normalization took (a new run)
    _resume_counters = None

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
        self._envs = []
        self._starter = None      # the thread that starts the workers' envs (start_envs)
        self.logger = None
        self.t_start = None
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
        self.n_workers = cfg.n_workers()
        #: times each worker's process was restarted (a new seed stream each time)
        self.worker_generation = [0] * self.n_workers
        self.resumes = int(ckpt.meta.get("counters", {}).get("resumes", -1)) + 1 if ckpt else 0

        if resume is None:
            self.run_dir = cfg.run_dir or _default_run_dir(cfg)
            ck_dir = os.path.join(self.run_dir, "checkpoints")
            if any(os.path.exists(os.path.join(ck_dir, f"{w}.npz")) for w in ("latest", "best")):
                raise ConfigError(
                    f"config field 'run_dir' = {self.run_dir!r}: it already holds a run; "
                    "use --resume to continue it or choose another --run-dir"
                )
        # Worker i and the engine process its env spawns (which inherits the
        # spawning thread's affinity) share core i mod cores: the worker blocks
        # while the engine renders, so the core never idles and its caches stay
        # warm (measured: 1 worker on 2 cores 1,040 -> 1,476 steps/s).
        self._cores = allowed_cores() if cfg.pin_threads else []
        self.new_env_slots()
        self.stop_event = threading.Event()
        self.errors = []  # (worker id or what failed, traceback text)
        self._restart_lock = threading.Lock()     # env restarts: errors.log, the count
        self.rewards = RewardWindows(cfg.reward_window, LONG_WINDOW_FACTOR * cfg.reward_window)
        try:
            env = self._env(0, pin=True)  # unknown ids fail before any file is written
            self.plan = plan = plan_run(cfg, env, ckpt)
            check_memory(cfg, plan, env)        # before the other envs start
            self.parts = build_parts(plan)
            if ckpt is not None:
                restore_checkpoint(self.parts, ckpt)
                counters = ckpt.meta.get("counters", {})
                self._resume_counters = (int(counters.get("steps", 0)),
                                         int(counters.get("episodes", 0)))
            self.wall_offset = float(ckpt.meta.get("counters", {}).get("wall_seconds", 0.0)) if ckpt else 0.0
            self.norm_seconds = plan.norm_seconds
            for note in plan.notes:
                self.resume_note += f"; {note}"
            self.store = ThreadStore(self.shared, self.normalizer, self.on_episode,
                                     self.adv_normalizer)
            self.backend.bind(self)
            self.backend.prepare()
        except BaseException:
            self.close()  # no engine process left behind by a refused start
            raise

        try:    # a read-only or full file system: the CLI's clear error, no engine left
            os.makedirs(os.path.join(self.run_dir, "checkpoints"), exist_ok=True)
            _remove_partial_checkpoints(os.path.join(self.run_dir, "checkpoints"))
            # defaults as resolved now; replaced whole (a resume on a full disk
            # keeps the config.toml it had)
            conf = os.path.join(self.run_dir, "config.toml")
            try:
                with open(conf + ".tmp", "w") as fh:
                    fh.write(cfg.pinned(plan.resolved).to_toml())
                os.replace(conf + ".tmp", conf)
            except OSError as e:
                try:
                    os.unlink(conf + ".tmp")
                except OSError:
                    pass
                raise OSError(e.errno, f"cannot write {conf}: {e.strerror}") from None
        except OSError:
            self.close()
            raise
        self.backend.written()

        self._signals = SignalsAsExceptions()   # inert until run() enters one
        meta = ckpt.meta if ckpt is not None else {}
        self.best_avg = meta.get("best_long_avg")
        self.best_avg = -np.inf if self.best_avg is None else float(self.best_avg)
        self.best_step = meta.get("best_step")
        self.stop_reason = None
        self.target_reached = None

    # -- the run's parts (read by backends, benchmarks and tests) --------------
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

    # -- the workers' envs (started once each, pinned to their worker's core) ---
    @property
    def envs(self) -> list:
        """The envs this process holds, by slot: env ``e`` is env ``e %
        envs_per_worker`` of worker ``e // envs_per_worker`` (None: not
        started yet, or closed)."""
        return self._envs

    def new_env_slots(self):
        """Env ``e`` is started once, by the first thread to claim it
        (:meth:`_env`): the env starter beside the warm-up, or the worker
        that needs it first."""
        self._envs = [None] * (self.n_workers * self.cfg.envs_per_worker)
        self._env_lock = threading.Lock()
        self._env_claimed = [False] * len(self._envs)
        self._env_ready = [threading.Event() for _ in self._envs]
        self._env_error = [None] * len(self._envs)

    def _env_seed(self, wid, j=0):
        """Env ``j`` of worker ``wid`` (``j`` > 0 with envs_per_worker > 1);
        a restarted worker process's envs get a new seed stream."""
        gen = self.worker_generation[wid]
        if gen:
            return seed_of(self.cfg.seed, wid, self.resumes, j, gen)
        if j:
            return seed_of(self.cfg.seed, wid, self.resumes, j)
        return seed_of(self.cfg.seed, wid, self.resumes)

    def _new_env(self, e, pin=False):
        """Env ``e`` of ``_envs``: env ``e % envs_per_worker`` of worker
        ``e // envs_per_worker``.  ``pin`` (a thread other than that
        worker's): pinned to the worker's core meanwhile, so that the engine
        process, which inherits the spawning thread's affinity, shares it."""
        cfg = self.cfg
        wid, j = divmod(e, cfg.envs_per_worker)
        if pin and self._cores:
            mask = set(self._cores)
            pin_thread({self._cores[wid % len(self._cores)]})
        try:
            return make_env(cfg.env, seed=self._env_seed(wid, j),
                            runtime_dir=os.path.join(self.run_dir, "vizdoom"), **env_args(cfg))
        finally:
            if pin and self._cores:
                pin_thread(mask)

    def _env(self, e, pin=False):
        """Env ``e``, started here unless another thread claimed it first
        (then this waits for that start, and raises its error)."""
        with self._env_lock:
            mine = not self._env_claimed[e]
            self._env_claimed[e] = True
        if mine:
            try:
                self._envs[e] = self._new_env(e, pin)
            except BaseException as exc:
                self._env_error[e] = exc
                raise
            finally:
                self._env_ready[e].set()
            return self._envs[e]
        self._env_ready[e].wait()
        if self._envs[e] is None:
            wid, j = divmod(e, self.cfg.envs_per_worker)
            exc = self._env_error[e]
            what = f"{type(exc).__name__}: {exc}" if exc is not None else "closed before use"
            raise RuntimeError(f"env {j} of worker {wid} ({self.cfg.env}) did not start: {what}") from exc
        return self._envs[e]

    def _start_envs(self):
        """Start the workers' envs, in order, on a thread beside the warm-up
        (each ViZDoom start holds a module lock, so they start one at a
        time; begun here, they no longer hold back the workers that start
        after the warm-up).  Stops at the first failure: the worker that
        needs that env raises it."""
        for e in range(len(self._envs)):
            if self.stop_event.is_set():
                return
            try:
                self._env(e, pin=True)
            except BaseException:  # noqa: BLE001 - raised again by the worker that needs it
                return

    def start_envs_beside(self):
        """Begin :meth:`_start_envs` on a thread (when there is more than one env)."""
        if len(self._envs) > 1:
            self._starter = threading.Thread(target=self._start_envs, daemon=True,
                                             name="a3c-env-starter")
            self._starter.start()

    def close_envs(self):
        """Close every env this process holds (an env that fails to close is
        reported by :meth:`close`).  The envs of a worker thread that did
        not stop (:attr:`Backend.stuck`) are not closed under it: their
        engines are killed and the rest is left to the process's exit."""
        first_error = None
        K = self.cfg.envs_per_worker
        stuck = set(getattr(self.backend, "stuck", ()) or ())
        for i, env in enumerate(self._envs):
            if env is not None:
                if i // K in stuck:
                    kill_engine(env)
                    continue
                try:
                    env.close()
                except Exception as e:  # noqa: BLE001 - keep closing the rest
                    first_error = first_error or e
                self._envs[i] = None
        return first_error

    @property
    def stuck_workers(self) -> list:
        """Workers that did not stop, stuck in a call (the process should
        end with ``os._exit`` once the run is written: see :mod:`a3c_core.cli`)."""
        return list(getattr(self.backend, "stuck", ()) or ())

    def pin_worker(self, wid):
        """Pin the calling thread (or process) to worker ``wid``'s core."""
        if self._cores:
            pin_thread({self._cores[wid % len(self._cores)]})

    def make_worker(self, wid, store=None, on_env_restart=None) -> Worker:
        """Worker ``wid`` with its envs, a local network and its own RNG, on
        ``store`` (default: the run's in-process store); an env that fails
        is rebuilt (:meth:`remake_env`) and reported to ``on_env_restart``
        (default :meth:`env_restarted`)."""
        K = self.cfg.envs_per_worker
        envs = [self._env(e) for e in range(wid * K, (wid + 1) * K)]
        env = envs[0]
        pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
        gen = self.worker_generation[wid]     # > 0: a restarted worker process
        rng = np.random.default_rng([self.cfg.seed, wid, self.resumes] + ([gen] if gen else []))
        return Worker(wid, envs if K > 1 else env, new_network(self.plan), pipe,
                      store if store is not None else self.store, self.plan.settings, rng,
                      offset=worker_offset(wid, self.n_workers, self.shared.n_params),
                      remake_env=lambda k: self.remake_env(wid * K + k),
                      env_restarts=self.cfg.env_restarts,
                      on_env_restart=on_env_restart or self.env_restarted)

    def remake_env(self, e):
        """A new env ``e`` (the same id, options and seed) in place of one
        that failed: built by the calling thread (its worker's, pinned to
        the worker's core), kept where :meth:`close_envs` finds it."""
        env = self._new_env(e)
        self._envs[e] = env
        return env

    # -- env restarts ---------------------------------------------------------
    env_restarts = 0            # envs rebuilt in this run so far (summary.json)

    def env_restarted(self, wid, k, summary, text, count, limit):
        """Worker ``wid`` rebuilt its env ``k``: one warning line, the
        traceback appended to errors.log and the run's count so far as the
        ``charts/env_restarts`` scalar (the run goes on)."""
        log = self._count_restart("env_restarts", f"worker {wid} env {k} restarted", text)
        left = ("the next failure within the hour stops the run" if count >= limit
                else f"{count} of {limit} allowed per worker per hour")
        print(f"warning: worker {wid}: env {k} ({self.cfg.env}) failed and was rebuilt, its "
              f"episode dropped: {summary}; restart {left} (--env-restarts); traceback in {log}",
              file=sys.stderr, flush=True)

    # -- worker process restarts ---------------------------------------------
    worker_restarts = 0         # worker processes forked again in this run (summary.json)

    def worker_restarted(self, wid, pid, how, new_pid, count, limit, reaped=0):
        """Worker ``wid``'s process ``pid`` died (``how``) and was forked
        again as ``new_pid``: one warning line, an errors.log entry and the
        run's count so far as the ``charts/worker_restarts`` scalar."""
        left = ("the next death stops the run" if count >= limit
                else f"{count} of {limit} allowed per run")
        engines = (f"; {reaped} of its engine or env processes killed" if reaped else "")
        what = (f"worker process {wid} (pid {pid}) died: {how}; restarted from the shared "
                f"parameters as pid {new_pid}, with new envs{engines}; restart {left} "
                f"(--worker-restarts)")
        log = self._count_restart("worker_restarts", f"worker process {wid} restarted", what)
        print(f"warning: {what}; see {log}", file=sys.stderr, flush=True)

    def _count_restart(self, counter, title, text):
        """One more ``counter`` (``env_restarts`` or ``worker_restarts``): the
        errors.log entry and the ``charts/<counter>`` scalar; returns the log path."""
        with self._restart_lock:
            n = getattr(self, counter) + 1
            setattr(self, counter, n)
            log = self.append_error_log(title, text)
            if self.logger is not None:
                self.logger.scalar(f"charts/{counter}", n, self.backend.live_steps(),
                                   self.elapsed())
        return log

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

    # -- checkpoints ---------------------------------------------------
    def _counters(self):
        c = self.shared.counters()
        c.update(wall_seconds=self.elapsed(), resumes=self.resumes)
        return c

    def save(self, which="latest"):
        """Write ``checkpoints/<which>.npz`` atomically; returns its path.

        Raises :class:`CheckpointError` (and writes nothing) when the
        parameters are no longer finite: the previous checkpoint stays.
        """
        self.backend.before_save(which)
        # the counters, and every episode row they count flushed to episodes.csv
        # before the checkpoint exists: a run killed right after it resumes
        # with no gap in the episode indices (the rows past it are truncated)
        with self.store.episode_lock:
            counters = self._counters()
            if self.logger is not None:
                self.logger.flush()
        st = self.shared.state_dict()  # a snapshot copy; workers keep writing (Hogwild)
        opt = st["optimizer"]
        arrays = {k: v for k, v in opt.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in opt.items() if not isinstance(v, np.ndarray)}
        short, long_avg, n_eps = self.rewards.averages()
        meta = {
            "network": self.net_spec,
            "layout": self.plan.layout,
            "env": self.plan.env_spec,
            "preprocess": self.pipeline_spec,
            "optimizer": self.cfg.optimizer,
            "optimizer_scalars": scalars,
            "counters": counters,
            "config": self.cfg.to_dict(),
            "moving_avg": short,
            "long_avg": long_avg,
            "avg_window": self.rewards.short,
            "long_window": n_eps,
            "best_long_avg": None if not np.isfinite(self.best_avg) else float(self.best_avg),
            "best_step": self.best_step,
            "reward_normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
            "advantage_normalizer": (None if self.adv_normalizer is None
                                     else self.adv_normalizer.state_dict()),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if not np.all(np.isfinite(st["params"])):
            raise CheckpointError(
                f"parameters are no longer finite (the run diverged); {which}.npz not written, "
                "the previous checkpoint is kept")
        path = os.path.join(self.run_dir, "checkpoints", f"{which}.npz")
        return save_checkpoint(path, st["params"], meta, arrays)

    # -- monitoring --------------------------------------------------------
    def elapsed(self):
        return self.wall_offset + (0.0 if self.t_start is None else time.perf_counter() - self.t_start)

    def moving_avg(self):
        return self.rewards.averages()[0]

    def on_episode(self, wid, ret, length, index, end=None):
        """Worker ``wid`` finished an episode (the ``index``-th of the run):
        its raw return, length and how it ended, stamped with the backend's
        step and wall time and logged (:meth:`log_episode`)."""
        step, wall = self.backend.episode_stamp()
        self.log_episode(wid, ret, length, index, step, wall, end)

    def log_episode(self, wid, ret, length, index, step, wall, end=None):
        self.rewards.add(ret, end)
        if self.logger is not None:
            self.logger.episode(index, wall, step, wid, ret, length, end)

    def _maybe_save_best(self, final=False):
        """best.npz: the best long average, once ``reward_window`` episodes have finished."""
        _, long_avg, n = self.rewards.averages()
        if long_avg is None or n < self.cfg.reward_window or not long_avg > self.best_avg:
            return
        prev = (self.best_avg, self.best_step)
        self.best_avg, self.best_step = long_avg, int(self.shared.steps)
        try:
            self.save("best")
        except CheckpointWriteError as e:   # a full disk: tried again at the next log
            self.best_avg, self.best_step = prev
            self._write_failed(e, final)
            if final:
                print(f"warning: {e}; the previous best.npz is kept", file=sys.stderr, flush=True)
        except CheckpointError:
            self.best_avg, self.best_step = prev
            raise

    def live_steps(self) -> int:
        """The agent steps so far, as the workers count them (for a bench)."""
        return self.backend.live_steps()

    def worker_updates(self) -> list:
        """Updates applied or skipped by each worker so far (0 for one not built yet)."""
        return self.backend.worker_updates()

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
        cfg = self.cfg
        status, sig = "done", None
        handles = None
        path = None
        try:
            self._signals.resume()
            self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.tensorboard,
                                        resume_at=self._resume_counters)
            handles = self.backend.start()
            self._monitor(handles)
        except KeyboardInterrupt as e:  # SIGINT, or SIGTERM via StopSignal
            self._signals.caught()
            status, sig = "interrupted", getattr(e, "name", "SIGINT")
            self.stop_event.set()
            if not cfg.quiet:
                what = "writing a checkpoint" if self.t_start is not None else "nothing trained yet"
                print(f"\n{sig}: stopping ({what})...", file=self.out, flush=True)
        finally:
            self.stop_event.set()
            self.backend.stop(handles)
            if self.t_start is not None:
                path, save_error = self._final_checkpoints()
                if save_error:
                    self.errors.append(save_error)
        if self.errors:
            status = "failed"
        result = self._result(status, sig, path)
        self.backend.extend_result(result)
        self._write_summary(result)
        self._report_unwritten(result)
        if self.errors:
            who, text = self.errors[0]
            if who == "final checkpoint":   # the whole story is its one line
                raise TrainingError(text, self.errors)
            raise self.backend.failure(path)
        return result

    def write_error_log(self):
        path = os.path.join(self.run_dir, "errors.log")
        try:
            with open(path, "a") as fh:
                for who, text in self.errors:
                    fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {who} ---\n{text.rstrip()}\n")
        except OSError as e:
            return f"{path}, which could not be written: [Errno {e.errno}] {e.strerror}"
        return path

    def append_error_log(self, who, text):
        """One entry in errors.log (what a run survived); returns the path, or
        says why it could not be written."""
        path = os.path.join(self.run_dir, "errors.log")
        try:
            with open(path, "a") as fh:
                fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {who} ---\n{text.rstrip()}\n")
        except OSError as e:
            return f"{path}, which could not be written: [Errno {e.errno}] {e.strerror}"
        return path

    def _monitor(self, handles):
        cfg, backend = self.cfg, self.backend
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
            short, _, n_eps = self.rewards.averages()
            if cfg.total_steps and steps >= cfg.total_steps:
                self.stop_reason = "total_steps"
                self.stop_event.set()
            if cfg.total_seconds and self.elapsed() >= cfg.total_seconds:
                self.stop_reason = "total_seconds"
                self.stop_event.set()
            if (cfg.target_reward is not None and short is not None
                    and n_eps >= cfg.reward_window and short >= cfg.target_reward):
                if self.target_reached is None:
                    # the average that met the target: episodes still in flight when the
                    # workers stop (a Ray node's last batch) move the final window after it
                    self.target_reached = {"moving_avg": float(short), "steps": steps,
                                           "episodes": int(self.shared.episodes),
                                           "seconds": round(self.elapsed(), 3)}
                self.stop_reason = "target_reward"
                self.stop_event.set()
            skips = backend.consecutive_skips()
            if cfg.max_skipped_updates and skips >= cfg.max_skipped_updates:
                self.errors.append(("divergence", (
                    f"{skips} updates in a row were skipped for non-finite gradients (NaN/inf); "
                    "stopping. Lower lr, reward_scale or max_grad_norm")))
                self.stop_reason = "diverged"
                self.stop_event.set()
            if now - last_log >= cfg.log_interval:
                sps = (steps - last_steps) / (now - last_log)
                tot = backend.loss_totals()
                d = tot - prev
                prev = tot
                self._log_scalars(steps, sps, d, tot)
                backend.after_log(steps, now - last_log)
                backend.guard(self._maybe_save_best)
                if not cfg.quiet and now - last_line >= line_every:
                    self._progress(steps, sps, d, tty)
                    last_line = now
                last_log, last_steps = now, steps
            # the first 'latest' as soon as one update is in, then every interval
            if cfg.checkpoint_interval and (
                    (not first_ckpt_done and self.shared.updates > 0)
                    or now - last_ckpt >= cfg.checkpoint_interval):
                backend.guard(self._save_or_warn, "latest")
                first_ckpt_done, last_ckpt = True, now

    def _log_scalars(self, steps, sps, d, tot=None):
        el = self.elapsed()
        log = self.logger
        short, long_avg, _ = self.rewards.averages()
        log.scalar("charts/sps", sps, steps, el)
        log.scalar("charts/learning_rate", self.shared.optimizer.lr_at(steps), steps, el)
        if short is not None:
            log.scalar("charts/moving_avg_return", short, steps, el)
            log.scalar("charts/long_avg_return", long_avg, steps, el)
        if self.normalizer is not None:
            log.scalar("charts/reward_scale", self.normalizer.scale, steps, el)
        if self.adv_normalizer is not None:
            log.scalar("charts/advantage_scale", self.adv_normalizer.scale, steps, el)
        if self.plan.resolved.merge_below > 0:
            # how many workers' rollouts run on into the next episode (merge_below)
            merging = self.backend.merging_workers()
            if merging is not None:
                log.scalar("charts/merging_workers", merging, steps, el)
        n_upd = d[4]
        if n_upd > 0:
            for i, name in enumerate(("policy_loss", "value_loss", "entropy", "grad_norm")):
                log.scalar(f"losses/{name}", d[i] / n_upd, steps, el)
        if d[5] > 0:
            log.scalar("losses/skipped_updates", d[5], steps, el)
        if d[6] > 0:
            # self-imitation: episodes replayed since the last log, and the
            # run's share of replays that beat the value somewhere (over the
            # totals: an interval can hold an update whose replay the one
            # before counted)
            log.scalar("charts/sil_replays", d[6], steps, el)
            if tot is not None:
                log.scalar("charts/sil_update_share", tot[7] / tot[6], steps, el)
        stats = getattr(self.shared.optimizer, "moment_stats", None)
        if stats is not None and self.backend.live_optimizer and self.shared.updates > 0:
            den_rms, upd_rms = stats()
            log.scalar("optim/adam_denominator_rms", den_rms, steps, el)
            log.scalar("optim/adam_update_rms", upd_rms, steps, el)
            # how far the shared parameters moved since the last log, RMS per
            # element in units of lr, and per apply: Adam's step does not shrink
            # with the gradient, so after convergence the weights keep moving
            # at this rate whatever the gradients say (docs/results.md: hence
            # the anneal)
            opt = self.shared.optimizer
            upd_now = int(self.shared.updates)
            snap = self._param_snapshot
            if snap is not None and upd_now > self._param_snapshot_updates and opt.lr > 0:
                change = _rms_diff(self.shared.params, snap) / opt.lr
                log.scalar("optim/param_change_rms", change, steps, el)
                log.scalar("optim/param_change_per_apply",
                           change / (upd_now - self._param_snapshot_updates), steps, el)
            if snap is None:
                snap = self._param_snapshot = np.empty_like(self.shared.params)
            np.copyto(snap, self.shared.params)
            self._param_snapshot_updates = upd_now
            if n_upd > 0 and den_rms > 0:
                # mean gradient norm over the interval / the norm Adam expects
                log.scalar("optim/grad_to_adam_ratio",
                           d[3] / n_upd / (den_rms * math.sqrt(self.shared.optimizer.n_params)),
                           steps, el)
        log.flush()

    # -- write faults (a full disk, a file-size limit, an I/O error) -------------
    _write_failures = 0     # checkpoint writes the file system refused
    _write_error = None     # the last one (CheckpointWriteError)
    _failing = None         # path -> failed writes in a row

    def _write_failed(self, e: CheckpointWriteError, final=False):
        """Count a refused checkpoint write; one line for the first failure of
        a file in a row (none for the final write: the run's error says it)."""
        if self._failing is None:
            self._failing = {}
        self._write_failures += 1
        self._write_error = e
        if not final and e.path not in self._failing:
            name = os.path.basename(e.path)
            kept = (f"the previous {name} is kept" if os.path.exists(e.path)
                    else f"no {name} is on disk yet")
            if name != "latest.npz":
                when = "tried again at the next log"
            elif self.cfg.checkpoint_interval:
                when = f"tried again in {self.cfg.checkpoint_interval:g} s"
            else:
                when = "tried again at the end"
            print(f"warning: {e}; training goes on, {kept}, {when}", file=sys.stderr, flush=True)
        self._failing[e.path] = self._failing.get(e.path, 0) + 1

    def _save_or_warn(self, which, final=False):
        """Write a checkpoint; a write the file system refuses is a warning
        (returns None), tried again at the next interval."""
        try:
            path = self.save(which)
        except CheckpointWriteError as e:
            self._write_failed(e, final)
            return None
        failed = (self._failing or {}).pop(path, 0)
        if failed:
            print(f"note: {path} written again after {failed} failed "
                  f"attempt{'s' * (failed > 1)}", file=sys.stderr, flush=True)
        return path

    def _newest_valid(self):
        """The newest checkpoint on disk that loads (None if none does)."""
        try:
            return ck.find_resume_checkpoint(self.run_dir)
        except CheckpointError:
            return None

    def _final_checkpoints(self):
        """latest (+ best) at the end; returns (the final checkpoint's path, or
        the newest valid one on disk, or None; ``(who, error text)`` or None).
        A best.npz that cannot be written is only a warning: latest.npz holds
        the final parameters."""
        try:
            path = self._save_or_warn("latest", final=True)
        except (CheckpointError, OSError) as e:     # the parameters are not finite
            newest = self._newest_valid()
            return (newest.path if newest else None), ("checkpoint", str(e))
        if path is None:
            newest = self._newest_valid()
            where = (f"the newest valid checkpoint on disk is {newest.path}"
                     + (f" (step {newest.steps:,})" if newest.steps is not None else "")
                     if newest else "no valid checkpoint is on disk")
            e = self._write_error
            return (newest.path if newest else None), (
                "final checkpoint", f"cannot write the final checkpoint {e.path}: {e.why}; {where}")
        try:
            self._maybe_save_best(final=True)
        except CheckpointError as e:
            print(f"warning: {e}", file=sys.stderr, flush=True)
        return path, None

    def _report_unwritten(self, result):
        """One line at the end if the logs lost rows (summary.json has the counts)."""
        if result.unwritten_rows:
            parts = [f"{n:,} of {name}" for name, n in result.unwritten_rows.items()]
            print(f"warning: rows not written (the file system refused them): "
                  f"{', '.join(parts)}; see summary.json 'unwritten_rows'",
                  file=sys.stderr, flush=True)

    def _result(self, status, sig, path):
        short, long_avg, n_eps = self.rewards.averages()
        best = os.path.join(self.run_dir, "checkpoints", "best.npz")
        return TrainResult(
            self.run_dir, status, int(self.shared.steps), int(self.shared.episodes), self.elapsed(),
            short, path, long_avg=long_avg,
            best_avg=None if not np.isfinite(self.best_avg) else float(self.best_avg),
            best_step=self.best_step, best_checkpoint=best if os.path.exists(best) else None,
            skipped_updates=int(self.shared.skipped_updates), signal=sig,
            avg_window=min(n_eps, self.cfg.reward_window), long_window=n_eps,
            episode_ends=self.rewards.ends(),
            unwritten_rows=self.logger.unwritten if self.logger is not None else None,
            checkpoint_write_failures=self._write_failures, env_restarts=self.env_restarts,
            worker_restarts=self.worker_restarts)

    def _write_summary(self, result):
        d = result.to_dict()
        d.update(stop_reason=self.stop_reason, target_reached=self.target_reached,
                 updates=int(self.shared.updates),
                 errors=[f"{w}: {t.strip().splitlines()[-1]}" for w, t in self.errors])
        tmp = os.path.join(self.run_dir, ".summary.json.tmp")
        try:
            with open(tmp, "w") as fh:
                json.dump(d, fh, indent=1)
            os.replace(tmp, os.path.join(self.run_dir, "summary.json"))
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            print(f"warning: cannot write {os.path.join(self.run_dir, 'summary.json')}: "
                  f"[Errno {e.errno}] {e.strerror}", file=sys.stderr, flush=True)

    def _progress(self, steps, sps, d, tty):
        el = self.elapsed()
        losses = ""
        if d[4] > 0:
            losses = (f" | pi {d[0] / d[4]:+.3f} v {d[1] / d[4]:.3f} H {d[2] / d[4]:.3f}"
                      f" |g| {d[3] / d[4]:.2f}")
        skipped = int(self.shared.skipped_updates)
        if skipped:
            losses += f" skipped {skipped}"
        short, long_avg, n = self.rewards.averages()
        w = self.cfg.reward_window
        avg_s = "   n/a" if short is None else f"{short:7.2f}"
        long_s = "" if long_avg is None or n <= w else f" avg{n} {long_avg:7.2f}"
        line = (f"[{el:7.1f}s] steps {steps:>9,d}  {sps:7.0f} steps/s  episodes "
                f"{int(self.shared.episodes):>6d}  avg{w} {avg_s}{long_s}{losses}")
        if tty:
            print("\r" + line + "\x1b[K", end="", file=self.out, flush=True)
        else:
            print(line, file=self.out, flush=True)

    # -- resources ----------------------------------------------------------
    def close(self):
        """Stop the backend's workers and close the logger and every env
        (engines, child processes). Idempotent."""
        self.backend.close()
        first_error = None
        if self._starter is not None:     # no env may start after the loop below
            self.stop_event.set()
            self._starter.join(60)
        if self.logger is not None:
            try:
                self.logger.close()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                first_error = first_error or e
        first_error = self.close_envs() or first_error
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


def _remove_partial_checkpoints(ck_dir):
    """Delete the temporary files of checkpoint writes that a kill interrupted
    (``.tmp-<name>.npz-*``; the checkpoint they were replacing is intact)."""
    for name in os.listdir(ck_dir):
        if name.startswith(".tmp-") and ".npz-" in name:
            try:
                os.unlink(os.path.join(ck_dir, name))
            except OSError:
                pass


def train(cfg: Config | None = None, *, resume: str | None = None, out=None,
          backend: Backend | None = None, **overrides) -> TrainResult:
    """Train with ``cfg`` (a :class:`Config`; keyword overrides allowed)."""
    cfg = cfg or Config()
    if overrides:
        cfg = cfg.replace(**overrides)
    return Trainer(cfg, resume=resume, out=out, backend=backend).run()
