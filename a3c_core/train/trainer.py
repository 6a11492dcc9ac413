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
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback

import numpy as np

from a3c_core.checkpoint import (
    CheckpointError,
    check_layout,
    layout_of,
    save_checkpoint,
)
from a3c_core.obs import ObsPipeline
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.logger import MetricsLogger
from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

#: the long reward average covers this many times ``reward_window`` episodes
LONG_WINDOW_FACTOR = 10
#: exit status of a run stopped by a signal: 128 + signal number (shell convention)
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


class TrainingError(RuntimeError):
    """A worker failed (or the run diverged); ``worker_tracebacks`` holds what was raised."""

    def __init__(self, msg, worker_tracebacks=()):
        super().__init__(msg)
        self.worker_tracebacks = list(worker_tracebacks)


class StopSignal(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM (SIGINT raises KeyboardInterrupt)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class TrainResult:
    """What a finished run reports (also written to ``summary.json``)."""

    def __init__(self, run_dir, status, steps, episodes, seconds, moving_avg, checkpoint, *,
                 long_avg=None, best_avg=None, best_step=None, best_checkpoint=None,
                 skipped_updates=0, signal=None, avg_window=100, long_window=0):
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


def network_spec_for(cfg: Config, env) -> str:
    if cfg.spec != "auto":
        return cfg.spec
    return env.default_network


def _allowed_cores():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return []


def _pin_thread(cores) -> bool:
    """Pin the calling thread (Linux: pid 0 = this thread) to ``cores``."""
    try:
        os.sched_setaffinity(0, cores)
        return True
    except (AttributeError, OSError, ValueError):
        return False


def _default_run_dir(cfg: Config) -> str:
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.split("/")[-1].replace(":", "_"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    spec = "" if cfg.spec == "auto" else f"-{cfg.spec}"
    return os.path.join("runs", f"{env}{spec}-s{cfg.seed}-{stamp}")


def _seed_of(*keys) -> int:
    """A 31-bit seed derived from ``keys`` (no arithmetic collisions between runs)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0] & 0x7FFFFFFF)


class RewardWindows:
    """Raw episode returns: short and long moving averages (thread-safe)."""

    def __init__(self, short, long):
        self.short = int(short)
        self._ret = collections.deque(maxlen=int(long))
        self._lock = threading.Lock()

    def add(self, ret):
        with self._lock:
            self._ret.append(float(ret))

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
    """Owns one training run; use as a context manager or call :meth:`close`.

    :func:`train` is the one-call version.  ``run()`` may be called once.
    """

    #: ``shared.optimizer`` is the one the workers apply to (its moments are
    #: live and logged as ``optim/*``); a Ray driver's copy is only refreshed
    #: at checkpoints, so it says False
    _live_optimizer = True
    _relative_clips_logged = (0, 0)
    _param_snapshot = None          # shared params at the last log (optim/param_change_*)
    _param_snapshot_updates = 0

    def __init__(self, cfg: Config, *, resume: str | None = None, out=None):
        from a3c_core import checkpoint as _ck
        from a3c_core.core import SharedState, make_optimizer
        from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
        from a3c_core.envs import make_env
        from a3c_core.nn.network import build_network

        self.out = out if out is not None else sys.stdout
        self.cfg = cfg = cfg.validate()
        self._make_env = make_env
        self._build_network = build_network
        self._envs = []
        self._starter = None      # the thread that starts the workers' envs (_start_envs)
        self.logger = None
        self.t_start = None
        self.resume_note = None

        ckpt = None
        if resume is not None:
            if not os.path.isdir(resume):
                raise CheckpointError(f"--resume: run directory not found: {resume}")
            ckpt = _ck.find_resume_checkpoint(resume)  # validates before anything is written
            self.resume_note = f"resuming from {ckpt.path} (step {ckpt.meta.get('counters', {}).get('steps', 0):,})"
            self.run_dir = resume
        self.n_workers = cfg.n_workers()
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
        self._cores = _allowed_cores() if cfg.pin_threads else []
        self._envs = [None] * (self.n_workers * cfg.envs_per_worker)
        # env e is started once, by the first thread to claim it (_env): the
        # env starter beside the warm-up, or the worker that needs it first
        self._env_lock = threading.Lock()
        self._env_claimed = [False] * len(self._envs)
        self._env_ready = [threading.Event() for _ in self._envs]
        self._env_error = [None] * len(self._envs)
        try:
            self._env(0, pin=True)  # unknown ids fail before any file is written
            self._setup(ckpt, SharedState, make_optimizer, ReturnNormalizer, AdvantageNormalizer)
        except BaseException:
            self.close()  # no engine process left behind by a refused start
            raise

        os.makedirs(os.path.join(self.run_dir, "checkpoints"), exist_ok=True)
        _remove_partial_checkpoints(os.path.join(self.run_dir, "checkpoints"))
        with open(os.path.join(self.run_dir, "config.toml"), "w") as fh:
            fh.write(cfg.to_toml())

        self.stop_event = threading.Event()
        self._signals = _signals_as_exceptions()   # inert until run() enters one
        self.errors = []  # (worker id, traceback text)
        self.rewards = RewardWindows(cfg.reward_window, LONG_WINDOW_FACTOR * cfg.reward_window)
        self.workers = [None] * self.n_workers
        meta = ckpt.meta if ckpt is not None else {}
        self.best_avg = meta.get("best_long_avg")
        self.best_avg = -np.inf if self.best_avg is None else float(self.best_avg)
        self.best_step = meta.get("best_step")
        self.stop_reason = None

    # -- setup helpers ---------------------------------------------------
    def _env_seed(self, wid, j=0):
        """Env ``j`` of worker ``wid`` (``j`` > 0 with envs_per_worker > 1)."""
        if j:
            return _seed_of(self.cfg.seed, wid, self.resumes, j)
        return _seed_of(self.cfg.seed, wid, self.resumes)

    def _new_env(self, e, pin=False):
        """Env ``e`` of ``_envs``: env ``e % envs_per_worker`` of worker
        ``e // envs_per_worker``.  ``pin`` (a thread other than that
        worker's): pinned to the worker's core meanwhile, so that the engine
        process, which inherits the spawning thread's affinity, shares it."""
        cfg = self.cfg
        wid, j = divmod(e, cfg.envs_per_worker)
        if pin and self._cores:
            mask = set(self._cores)
            _pin_thread({self._cores[wid % len(self._cores)]})
        try:
            return self._make_env(cfg.env, seed=self._env_seed(wid, j), frame_skip=cfg.frame_skip,
                                  runtime_dir=os.path.join(self.run_dir, "vizdoom"),
                                  **cfg.env_kwargs())
        finally:
            if pin and self._cores:
                _pin_thread(mask)

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

    def _setup(self, ckpt, SharedState, make_optimizer, ReturnNormalizer, AdvantageNormalizer):
        cfg = self.cfg
        env = self._envs[0]
        if ckpt is not None and ckpt.env_spec.get("id", env.env_id) != env.env_id:
            raise CheckpointError(
                f"checkpoint {ckpt.path} was trained on env {ckpt.env_spec.get('id')!r}, not "
                f"{env.env_id!r}; resume with --env {ckpt.env_spec.get('id')} or start a new run")
        self.spec_name = network_spec_for(cfg, env)
        self.pipeline_spec = dict(env.preprocess_spec)
        if self.pipeline_spec.get("kind") == "image" and cfg.frame_size is not None:
            self.pipeline_spec["out_shape"] = [cfg.frame_size, cfg.frame_size]
        pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
        if self.pipeline_spec.get("kind") == "image":
            self._set_image_norm(ckpt, env, pipe)
            try:
                pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
            except ValueError as e:      # a checkpoint's malformed "norm"
                raise CheckpointError(f"checkpoint {getattr(ckpt, 'path', '?')} has an unusable "
                                      f"preprocess spec: {e}") from None
        self.net_kwargs = cfg.net_kwargs(self.spec_name)
        try:
            net = self._build_network(self.spec_name, pipe.net_obs_shape, env.n_actions,
                                      seed=cfg.seed, **self.net_kwargs)
        except ValueError as e:
            field = "frame_size" if self.pipeline_spec.get("kind") == "image" else "spec"
            raise ConfigError(f"config field '{field}' = {getattr(cfg, field)!r}: {e}") from None
        self.net_spec = net.spec
        self.layout = layout_of(net)
        # one preprocessing spec, stored once: the env spec records the pipeline used
        self.env_spec = dict(env.spec(), preprocess=dict(self.pipeline_spec))
        # a resumed run keeps the learning rate it trained with unless the config
        # names one (lr 0 = the default, which a newer version may have changed)
        self._saved_lr = None
        if ckpt is not None and cfg.lr == 0 and ckpt.meta.get("optimizer") == cfg.optimizer:
            lr = (ckpt.meta.get("optimizer_scalars") or {}).get("lr")
            # a value the config could not hold (corrupt) falls back to the default
            if isinstance(lr, (int, float)) and 0.0 < lr <= 1.0:
                self._saved_lr = float(lr)
                self.resume_note += f"; lr {lr:g} as trained (--lr to change it)"
        opt = make_optimizer(cfg.optimizer, net.n_params, **self._opt_kwargs())
        self.shared = SharedState(net.params, opt)
        self.normalizer = None if cfg.reward_scale is not None else ReturnNormalizer(cfg.gamma)
        self.adv_normalizer = (AdvantageNormalizer(horizon=cfg.advantage_horizon or None,
                                                   max_scale=cfg.advantage_scale_max or None)
                               if cfg.advantages_normalized() else None)
        from a3c_core.core.normalize import EntropyController

        self.n_actions = int(env.n_actions)
        target = cfg.entropy_target_nats(self.n_actions)
        self.entropy_ctl = EntropyController(target, cfg.entropy_beta) if target > 0 else None
        self.store = ThreadStore(self.shared, self.normalizer, self._on_episode, self.adv_normalizer,
                                 self.entropy_ctl)
        self.wall_offset = 0.0
        if ckpt is not None:
            check_layout(ckpt, net)
            self._restore(ckpt)

    norm_seconds = None      # how long measuring the image normalization took (a new run)

    def _set_image_norm(self, ckpt, env, pipe):
        """The image normalization (obs.ObsPipeline's ``"norm"``): a resumed run
        keeps the one it trained with (none, if it had none); a new run with
        ``obs_norm`` measures it on ``obs_norm_frames`` frames of random play
        in worker 0's env (seeded from the run's seed; the workers reset it)."""
        cfg = self.cfg
        if ckpt is not None:
            norm = (ckpt.preprocess_spec or {}).get("norm")
            if norm is not None:
                self.pipeline_spec["norm"] = norm
            elif cfg.obs_norm:
                self.resume_note += "; frames not normalized (the run trained without obs_norm)"
            return
        if not cfg.obs_normalized():
            return
        from a3c_core.obs import estimate_image_norm

        rng = np.random.default_rng((cfg.seed, 0x0B5))
        n_act = int(env.n_actions)

        def frames():
            obs = env.reset()
            for _ in range(cfg.obs_norm_frames):
                yield pipe(obs)
                obs, _, term, trunc = env.step(int(rng.integers(n_act)))
                if term or trunc:
                    obs = env.reset()

        t0 = time.perf_counter()
        self.pipeline_spec["norm"] = estimate_image_norm(frames())
        self.norm_seconds = time.perf_counter() - t0

    def _opt_kwargs(self):
        c = self.cfg
        lr = getattr(self, "_saved_lr", None) or c.learning_rate(self.spec_name)
        anneal = dict(anneal_steps=c.anneal_horizon(self.spec_name),
                      anneal_floor=c.lr_anneal_floor)
        if c.optimizer == "rmsprop":
            return dict(lr=lr, alpha=c.rmsprop_alpha, eps=c.rmsprop_eps, **anneal)
        if c.optimizer == "adam":
            return dict(lr=lr, beta1=c.adam_beta1, beta2=c.adam_beta2, eps=c.adam_eps,
                        clip_relative=c.adam_clip_relative, amsgrad=c.amsgrad(self.spec_name),
                        **anneal)
        return dict(lr=lr)

    def _settings(self) -> RolloutSettings:
        c = self.cfg
        return RolloutSettings(
            t_max=c.t_max, gamma=c.gamma, gae_lambda=c.gae_lambda, value_coef=c.value_coef,
            entropy_beta=c.entropy_beta, entropy_target=c.entropy_target_nats(self.n_actions),
            uniform_kl=c.uniform_kl, policy_epsilon=c.policy_epsilon,
            max_grad_norm=c.max_grad_norm,
            reward_scale=c.reward_scale, reward_clip=c.effective_reward_clip(),
            bootstrap_truncated=c.bootstrap_truncated(),
            normalize_advantages=c.advantages_normalized(), cross_episode=c.cross_episode,
            min_steps=c.effective_min_rollout(), merge_below=c.effective_merge_below())

    def _restore(self, ckpt):
        if ckpt.meta.get("optimizer") != self.cfg.optimizer:
            raise CheckpointError(
                f"checkpoint {ckpt.path} used optimizer {ckpt.meta.get('optimizer')!r}, "
                f"the config asks for {self.cfg.optimizer!r}"
            )
        # statistics and step counts come from the checkpoint; hyperparameters
        # (lr, alpha, eps, betas) from the config, so a resume may change them.
        # So do the anneal's horizon and floor (anneal_floor is a hyper): with
        # --lr-anneal-steps 0 the anneal runs over the config's total_steps,
        # and a run resumed with a larger --total-steps anneals over the new
        # budget instead of sitting at lr 0 past the old one
        opt = self.shared.optimizer
        owned = set(getattr(opt, "_hyper", ())) | {"anneal_steps"}
        opt_state = {k: v for k, v in ckpt.meta.get("optimizer_scalars", {}).items()
                     if k not in owned}
        opt_state.update(ckpt.opt_arrays)
        counters = ckpt.meta.get("counters", {})
        try:
            self.shared.load_state_dict({
                "params": ckpt.params,
                "optimizer": opt_state,
                "counters": {k: counters.get(k, 0) for k in type(self.shared)._COUNTERS},
            })
            for norm, key in ((self.normalizer, "reward_normalizer"),
                              (self.adv_normalizer, "advantage_normalizer"),
                              (self.entropy_ctl, "entropy_controller")):
                if norm is not None and ckpt.meta.get(key) is not None:
                    norm.load_state_dict(ckpt.meta[key])
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"checkpoint {ckpt.path} cannot be resumed: {e}") from None
        self.wall_offset = float(counters.get("wall_seconds", 0.0))
        self._resume_counters = (int(counters.get("steps", 0)), int(counters.get("episodes", 0)))

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
        # the counters, and every episode row they count flushed to episodes.csv
        # before the checkpoint exists: a run killed right after it resumes
        # with no gap in the episode indices (the rows past it are truncated)
        lock = getattr(self.store, "episode_lock", None)      # ThreadStore's
        with lock if lock is not None else contextlib.nullcontext():
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
            "layout": self.layout,
            "env": self.env_spec,
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
            "entropy_controller": (None if self.entropy_ctl is None
                                   else self.entropy_ctl.state_dict()),
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

    def _on_episode(self, wid, ret, length, index):
        self._log_episode(wid, ret, length, index, int(self.shared.steps), self.elapsed())

    def _log_episode(self, wid, ret, length, index, step, wall):
        self.rewards.add(ret)
        if self.logger is not None:
            self.logger.episode(index, wall, step, wid, ret, length)

    def _maybe_save_best(self):
        """best.npz: the best long average, once ``reward_window`` episodes have finished."""
        _, long_avg, n = self.rewards.averages()
        if long_avg is None or n < self.cfg.reward_window or not long_avg > self.best_avg:
            return
        prev = (self.best_avg, self.best_step)
        self.best_avg, self.best_step = long_avg, int(self.shared.steps)
        try:
            self.save("best")
        except CheckpointError:
            self.best_avg, self.best_step = prev
            raise

    # -- the workers -------------------------------------------------------
    def _make_worker(self, wid):
        from a3c_core.nn.network import build_network

        K = self.cfg.envs_per_worker
        envs = []
        for e in range(wid * K, (wid + 1) * K):
            envs.append(self._env(e))
        env = envs[0]
        pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
        net = build_network(self.spec_name, pipe.net_obs_shape, env.n_actions,
                            seed=self.cfg.seed, **self.net_kwargs)
        rng = np.random.default_rng([self.cfg.seed, wid, self.resumes])
        # staggered start of this worker's optimizer sweep (see core.optim)
        offset = (wid * self.shared.n_params // self.n_workers) // 16 * 16
        return Worker(wid, envs if K > 1 else env, net, pipe, self.store, self._settings(), rng,
                      offset=offset)

    def _worker_main(self, wid):
        try:
            if self._cores:
                _pin_thread({self._cores[wid % len(self._cores)]})
            w = self.workers[wid] = self._make_worker(wid)
            w.run(self.stop_event, self.cfg.total_steps)
        except BaseException:  # noqa: BLE001 - surfaced by the main thread
            self.errors.append((wid, traceback.format_exc()))
            self.stop_event.set()

    def live_steps(self) -> int:
        """The agent steps so far, as the workers count them (for a bench)."""
        return int(self.shared.steps)

    def worker_updates(self) -> list:
        """Updates applied or skipped by each worker so far (0 for one not built yet)."""
        return [0 if w is None else int(w.stats.updates + w.stats.skipped) for w in self.workers]

    def _merging_workers(self):
        """How many workers' rollouts run on into the next episode (None: no worker yet)."""
        ws = [w for w in getattr(self, "workers", ()) if w is not None]
        return sum(bool(getattr(w, "merging", False)) for w in ws) if ws else None

    def _loss_totals(self):
        """Sum of every worker's :class:`LossStats` (fields as a float array)."""
        arrs = [w.stats.as_array() for w in self.workers if w is not None]
        return np.sum(arrs, axis=0) if arrs else np.zeros(6)

    # -- the run ------------------------------------------------------------
    def _warm_up(self):
        """Compile (first run) or load (cached) the Numba kernels before the clock starts."""
        from a3c_core.train.worker import warm_up_network

        notice = threading.Timer(
            1.5, lambda: print("compiling Numba kernels (first run only; cached afterwards)...",
                               file=self.out, flush=True))
        if not self.cfg.quiet:
            notice.start()
        try:
            obs_shape = tuple(self.net_spec["obs_shape"])
            net = self._build_network(self.spec_name, obs_shape, self.net_spec["n_actions"],
                                      seed=self.cfg.seed, **self.net_kwargs)
            with self._signals.deferred():  # a Ctrl-C lands between compiles
                warm_up_network(net, self.cfg.records_resets(),
                                mixed=self.cfg.policy_epsilon > 0)
        finally:
            notice.cancel()

    def run(self, announce=None) -> TrainResult:
        """Train until a stop condition, a signal or a failure; always leaves a
        loadable checkpoint, ``summary.json`` and closed envs behind.
        ``announce()`` (the CLI's "run directory" line) is called once the
        signal handlers are in place, so a Ctrl-C right after it is the run's."""
        from a3c_core._blas import blas_threads

        # the handlers go in first, deferred: threadpoolctl's scan (a ctypes
        # callback) would swallow a KeyboardInterrupt; _run raises it
        with _signals_as_exceptions(defer=True) as self._signals:
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
                                        resume_at=getattr(self, "_resume_counters", None))
            handles = self._start_workers()
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
            self._stop_workers(handles)
            if self.t_start is not None:
                path, save_error = self._final_checkpoints()
                if save_error:
                    self.errors.append(("checkpoint", save_error))
        if self.errors:
            status = "failed"
        result = self._result(status, sig, path)
        self._extend_result(result)
        self._write_summary(result)
        if self.errors:
            raise self._failure(path)
        return result

    # -- backend hooks (threads here; a distributed backend overrides them) ---
    def _start_workers(self):
        """Start the workers and the clock; returns what ``_workers_running`` takes."""
        if len(self._envs) > 1:
            self._starter = threading.Thread(target=self._start_envs, daemon=True,
                                             name="a3c-env-starter")
            self._starter.start()
        self._warm_up()
        threads = [threading.Thread(target=self._worker_main, args=(i,), daemon=True,
                                    name=f"a3c-worker-{i}") for i in range(self.n_workers)]
        self.t_start = time.perf_counter()
        for th in threads:
            th.start()
        return threads

    def _workers_running(self, threads) -> bool:
        return any(th.is_alive() for th in threads)

    def _stop_workers(self, threads):
        _join_all(threads or [])

    #: seconds between monitor ticks
    _tick_seconds = 0.2

    def _before_tick(self):
        """Called at every monitor tick before the stop conditions are checked."""

    def _consecutive_skips(self) -> int:
        return self.store.consecutive_skips

    def _after_log(self, steps, dt):
        """Called after each scalar log (every ``log_interval``)."""

    def _checkpoint(self, fn, *args):
        """Run a checkpoint write from the monitor (a backend may trap its errors)."""
        fn(*args)

    def _extend_result(self, result):
        """Add backend-specific fields to the result before ``summary.json``."""

    def _failure(self, path) -> TrainingError:
        """The run's error: one line naming what failed and why; worker tracebacks
        go to ``RUN_DIR/errors.log`` (the line says so)."""
        who, text = self.errors[0]
        last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        if isinstance(who, int):
            log = self._write_error_log()
            what = f"worker {who} failed: {last} (traceback in {log})"
        else:
            what = f"{who}: {last}"
        return TrainingError(f"{what}; last checkpoint: {path or 'none written'}", self.errors)

    def _write_error_log(self):
        path = os.path.join(self.run_dir, "errors.log")
        with open(path, "a") as fh:
            for who, text in self.errors:
                fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {who} ---\n{text.rstrip()}\n")
        return path

    def _monitor(self, handles):
        cfg = self.cfg
        now = time.perf_counter()
        last_ckpt = last_log = last_line = now
        first_ckpt_done = False
        last_steps = int(self.shared.steps)
        prev = self._loss_totals()
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        line_every = cfg.log_interval if tty else max(10.0, cfg.log_interval)
        while self._workers_running(handles):
            self.stop_event.wait(min(self._tick_seconds, cfg.log_interval))
            self._signals.check()   # a signal whose raise C code swallowed
            self._before_tick()
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
                self.stop_reason = "target_reward"
                self.stop_event.set()
            skips = self._consecutive_skips()
            if cfg.max_skipped_updates and skips >= cfg.max_skipped_updates:
                self.errors.append(("divergence", (
                    f"{skips} updates in a row were skipped for non-finite gradients (NaN/inf); "
                    "stopping. Lower lr, reward_scale or max_grad_norm")))
                self.stop_reason = "diverged"
                self.stop_event.set()
            if now - last_log >= cfg.log_interval:
                sps = (steps - last_steps) / (now - last_log)
                tot = self._loss_totals()
                d = tot - prev
                prev = tot
                self._log_scalars(steps, sps, d)
                self._after_log(steps, now - last_log)
                self._checkpoint(self._maybe_save_best)
                if not cfg.quiet and now - last_line >= line_every:
                    self._progress(steps, sps, d, tty)
                    last_line = now
                last_log, last_steps = now, steps
            # the first 'latest' as soon as one update is in, then every interval
            if cfg.checkpoint_interval and (
                    (not first_ckpt_done and self.shared.updates > 0)
                    or now - last_ckpt >= cfg.checkpoint_interval):
                self._checkpoint(self.save, "latest")
                first_ckpt_done, last_ckpt = True, now

    def _log_scalars(self, steps, sps, d):
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
        if self.entropy_ctl is not None:
            log.scalar("charts/entropy_beta", self.entropy_ctl.beta_now, steps, el)
        if self.cfg.effective_merge_below() > 0:
            # how many workers' rollouts run on into the next episode (merge_below)
            merging = self._merging_workers()
            if merging is not None:
                log.scalar("charts/merging_workers", merging, steps, el)
        n_upd = d[4]
        if n_upd > 0:
            for i, name in enumerate(("policy_loss", "value_loss", "entropy", "grad_norm")):
                log.scalar(f"losses/{name}", d[i] / n_upd, steps, el)
        if d[5] > 0:
            log.scalar("losses/skipped_updates", d[5], steps, el)
        stats = getattr(self.shared.optimizer, "moment_stats", None)
        if stats is not None and self._live_optimizer and self.shared.updates > 0:
            den_rms, upd_rms = stats()
            log.scalar("optim/adam_denominator_rms", den_rms, steps, el)
            log.scalar("optim/adam_update_rms", upd_rms, steps, el)
            # how far the shared parameters moved since the last log, RMS per
            # element in units of lr, and per apply: Adam's step does not shrink
            # with the gradient, so after convergence the weights keep moving
            # at this rate whatever the gradients say (bench/RESULTS.md)
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
            if self.shared.optimizer.clip_relative > 0:
                # both counts from the optimizer under one lock: the workers'
                # interval stats (n_upd) are tallied after the apply, so a ratio
                # against them could pass 1 when an update straddles the read
                clips, checks = self.shared.optimizer.relative_clip_counts()
                c0, k0 = self._relative_clips_logged
                if checks > k0:
                    log.scalar("optim/relative_clip_fraction",
                               (clips - c0) / (checks - k0), steps, el)
                self._relative_clips_logged = (clips, checks)
        log.flush()

    def _final_checkpoints(self):
        """latest (+ best) at the end; returns (latest path or None, error text or None)."""
        try:
            path = self.save("latest")
            self._maybe_save_best()
            return path, None
        except (CheckpointError, OSError) as e:
            latest = os.path.join(self.run_dir, "checkpoints", "latest.npz")
            return (latest if os.path.exists(latest) else None), str(e)

    def _result(self, status, sig, path):
        short, long_avg, n_eps = self.rewards.averages()
        best = os.path.join(self.run_dir, "checkpoints", "best.npz")
        return TrainResult(
            self.run_dir, status, int(self.shared.steps), int(self.shared.episodes), self.elapsed(),
            short, path, long_avg=long_avg,
            best_avg=None if not np.isfinite(self.best_avg) else float(self.best_avg),
            best_step=self.best_step, best_checkpoint=best if os.path.exists(best) else None,
            skipped_updates=int(self.shared.skipped_updates), signal=sig,
            avg_window=min(n_eps, self.cfg.reward_window), long_window=n_eps)

    def _write_summary(self, result):
        d = result.to_dict()
        d.update(stop_reason=self.stop_reason, updates=int(self.shared.updates),
                 errors=[f"{w}: {t.strip().splitlines()[-1]}" for w, t in self.errors])
        tmp = os.path.join(self.run_dir, ".summary.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(d, fh, indent=1)
        os.replace(tmp, os.path.join(self.run_dir, "summary.json"))

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
        """Close the logger and every env (engines, child processes). Idempotent."""
        first_error = None
        if self._starter is not None:     # no env may start after the loop below
            self.stop_event.set()
            self._starter.join(60)
        if self.logger is not None:
            try:
                self.logger.close()
            except Exception as e:  # noqa: BLE001 - keep closing the rest
                first_error = first_error or e
        for i, env in enumerate(self._envs):
            if env is not None:
                try:
                    env.close()
                except Exception as e:  # noqa: BLE001
                    first_error = first_error or e
                self._envs[i] = None
        try:  # the envs remove their runtime files; drop the emptied folder too
            os.rmdir(os.path.join(self.run_dir, "vizdoom"))
        except (OSError, AttributeError):
            pass
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


def _join_all(threads):
    for th in threads:
        while th.is_alive():
            try:
                th.join(0.5)
            except KeyboardInterrupt:  # a second Ctrl-C: keep waiting, data first
                pass


class _signals_as_exceptions:
    """While a run is in progress (main thread only): SIGINT raises
    KeyboardInterrupt and SIGTERM :class:`StopSignal`, once; both stop the
    workers and write the final checkpoint.  Later signals are ignored with a
    note, so a second Ctrl-C cannot tear the final checkpoint.  The previous
    handlers are restored afterwards.

    It starts *deferred* (``defer=True``): a signal is recorded and raised
    later by :meth:`check`, at a point known to be safe (see
    :mod:`a3c_core._safepoint`); :meth:`resume` ends that first deferral and
    :meth:`deferred` opens another, around the kernel warm-up.  Outside a
    deferral the handler raises at once; a raise that C code swallowed (a
    ctypes callback prints it and goes on) is raised again by the next
    :meth:`check`, which the monitor calls every tick."""

    def __init__(self, defer=False):
        self._defer = 1 if defer else 0
        self._fired = None          # the first signal, once one came
        self._delivered = False     # raised where the run caught it
        self._installed = False

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is not threading.main_thread():
            return self

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self._fired is not None:
                print(f"\n{name}: already stopping, "
                      "writing the final checkpoint...", file=sys.stderr, flush=True)
                return
            self._fired = signum
            if self._defer:
                print(f"\n{name}: stopping once the kernel being compiled is done...",
                      file=sys.stderr, flush=True)
                return
            raise self._exception()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, handler)
        self._installed = True
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._installed = False
        return False

    def _exception(self):
        if self._fired == signal.SIGINT:
            return KeyboardInterrupt()
        return StopSignal(signal.Signals(self._fired).name)

    def check(self):
        """Raise the signal that came, unless the run has caught it already."""
        if self._fired is not None and not self._delivered:
            self._delivered = True
            raise self._exception()

    def caught(self):
        """The run caught the signal's exception (raised here or by the handler)."""
        self._delivered = True

    def resume(self):
        """End the deferral the object started with; raise what came meanwhile."""
        self._defer = max(0, self._defer - 1)
        self.check()

    @contextlib.contextmanager
    def deferred(self):
        """Record signals inside the block; raise them at its safe points
        (:func:`a3c_core._safepoint.safe_point`, the start of each Numba
        compile) or at its end."""
        if not self._installed:
            yield
            return
        from a3c_core._safepoint import safe_points

        self._defer += 1
        try:
            with safe_points(self.check):
                yield
        finally:
            self._defer -= 1
        self.check()


def train(cfg: Config | None = None, *, resume: str | None = None, out=None, **overrides) -> TrainResult:
    """Train with ``cfg`` (a :class:`Config`; keyword overrides allowed)."""
    cfg = cfg or Config()
    if overrides:
        cfg = cfg.replace(**overrides)
    return make_trainer(cfg, resume=resume, out=out).run()


def make_trainer(cfg: Config, *, resume: str | None = None, out=None) -> Trainer:
    """A :class:`Trainer`, or with ``worker_processes`` a
    :class:`~a3c_core.train.procs.ProcessTrainer`."""
    if cfg.worker_processes:
        from a3c_core.train.procs import ProcessTrainer
        return ProcessTrainer(cfg, resume=resume, out=out)
    return Trainer(cfg, resume=resume, out=out)
