"""A3C training: N worker threads, one shared parameter vector, Hogwild updates.

Each worker owns its environment, RNG, local network (parameters + gradient
buffer + LSTM state) and rollout buffers.  Per rollout it

1. copies the shared parameters into its local ones (``sync_params``, no GIL);
2. plays up to ``t_max`` steps: preprocess (Cython) -> ``net.step`` (Numba)
   -> sample -> ``env.step`` (ViZDoom releases the GIL);
3. bootstraps from V(s_T) unless the episode terminated (a time-limit
   truncation *is* bootstrapped), computes returns and GAE advantages (Cython);
4. ``net.loss_and_grad`` over the rollout (BPTT from the rollout's initial LSTM
   state), then clips and applies the gradient to the *shared* parameters and
   optimizer statistics without a lock (Hogwild).

The main thread only watches: progress line, metrics, checkpoints, stop
conditions, Ctrl-C and worker failures.  With one worker and a fixed seed a
run is deterministic; with several, Hogwild makes it nondeterministic by
design (see :mod:`a3c_core.core.optim`).
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import threading
import time
import traceback

import numpy as np

from a3c_core.checkpoint import (
    CheckpointError,
    check_layout,
    layout_of,
    load_checkpoint,
    save_checkpoint,
)
from a3c_core.obs import ObsPipeline
from a3c_core.sampling import sample_categorical
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.logger import MetricsLogger


class TrainingError(RuntimeError):
    """A worker failed; ``worker_tracebacks`` holds what it raised."""

    def __init__(self, msg, worker_tracebacks=()):
        super().__init__(msg)
        self.worker_tracebacks = list(worker_tracebacks)


class TrainResult:
    def __init__(self, run_dir, status, steps, episodes, seconds, moving_avg, checkpoint):
        self.run_dir = run_dir
        self.status = status  # "done", "interrupted" or "failed"
        self.steps = steps
        self.episodes = episodes
        self.seconds = seconds
        self.moving_avg = moving_avg
        self.checkpoint = checkpoint

    def __repr__(self):
        return (
            f"TrainResult(status={self.status!r}, steps={self.steps}, episodes={self.episodes}, "
            f"seconds={self.seconds:.1f}, moving_avg={self.moving_avg}, run_dir={self.run_dir!r})"
        )


def network_spec_for(cfg: Config, env) -> str:
    if cfg.spec != "auto":
        return cfg.spec
    return env.default_network


def _net_kwargs(cfg: Config, spec: str) -> dict:
    if spec.startswith("mlp"):
        kw = {"hidden": cfg.hidden_sizes()}
        if spec == "mlp-lstm":
            kw["lstm_size"] = cfg.lstm_size
        return kw
    return {}


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


class Trainer:
    """Owns one training run. Use :func:`train` for the one-call version."""

    def __init__(self, cfg: Config, *, resume: str | None = None, out=None):
        from a3c_core._blas import limit_blas_threads
        from a3c_core.core import SharedState, make_optimizer
        from a3c_core.envs import make_env
        from a3c_core.nn.network import build_network

        self.out = out if out is not None else sys.stdout
        self.cfg = cfg.validate()
        self._make_env = make_env
        self._build_network = build_network
        limit_blas_threads(1)

        ckpt = None
        if resume is not None:
            if not os.path.isdir(resume):
                raise CheckpointError(f"--resume: run directory not found: {resume}")
            ckpt = load_checkpoint(resume, "latest")  # validates before anything is written
            self.run_dir = resume
        self.n_workers = cfg.n_workers()
        self.resumes = int(ckpt.meta.get("counters", {}).get("resumes", -1)) + 1 if ckpt else 0

        if resume is None:
            self.run_dir = cfg.run_dir or _default_run_dir(cfg)
            if os.path.exists(os.path.join(self.run_dir, "checkpoints", "latest.npz")):
                raise ConfigError(
                    f"config field 'run_dir' = {self.run_dir!r}: it already holds a run; "
                    "use --resume to continue it or choose another --run-dir"
                )
        # Worker i and the engine process its env spawns (which inherits the
        # spawning thread's affinity) share core i mod cores: the worker blocks
        # while the engine renders, so the core never idles and its caches stay
        # warm (measured: 1 worker on 2 cores 1,040 -> 1,476 steps/s).
        self._cores = _allowed_cores() if cfg.pin_threads else []
        # Build worker 0's env here so an unknown env id fails before any file is written.
        self._envs = [None] * self.n_workers
        main_mask = self._cores and set(self._cores)
        if self._cores:
            _pin_thread({self._cores[0]})
        try:
            first_env = make_env(
                cfg.env,
                seed=self._env_seed(0),
                frame_skip=cfg.frame_skip,
                runtime_dir=os.path.join(self.run_dir, "vizdoom"),
                **self._env_kwargs(),
            )
        finally:
            if self._cores:
                _pin_thread(main_mask)
        try:
            self._envs[0] = first_env
            self.spec_name = network_spec_for(cfg, first_env)
            self.pipeline_spec = dict(first_env.preprocess_spec)
            if self.pipeline_spec.get("kind") == "image":
                self.pipeline_spec["out_shape"] = [cfg.frame_size, cfg.frame_size]
            pipe = ObsPipeline(self.pipeline_spec, first_env.obs_shape)
            self.net_kwargs = _net_kwargs(cfg, self.spec_name)
            net = build_network(
                self.spec_name, pipe.net_obs_shape, first_env.n_actions, seed=cfg.seed, **self.net_kwargs
            )
            self.net_spec = net.spec
            self.layout = layout_of(net)
            self.env_spec = first_env.spec()
            opt = make_optimizer(cfg.optimizer, net.n_params, **self._opt_kwargs())
            self.shared = SharedState(net.params, opt)
            self.wall_offset = 0.0
            if ckpt is not None:
                check_layout(ckpt, net)
                if ckpt.env_spec.get("id", cfg.env) != first_env.spec().get("id"):
                    raise CheckpointError(
                        f"checkpoint {ckpt.path} was trained on {ckpt.env_spec.get('id')!r}, "
                        f"not {first_env.spec().get('id')!r}"
                    )
                self._restore(ckpt)
        except BaseException:
            first_env.close()  # no engine process left behind by a refused start
            raise

        os.makedirs(os.path.join(self.run_dir, "checkpoints"), exist_ok=True)
        with open(os.path.join(self.run_dir, "config.toml"), "w") as fh:
            fh.write(cfg.to_toml())

        self.stop_event = threading.Event()
        self.errors = []  # (worker id, traceback text)
        self.episodes = collections.deque(maxlen=cfg.reward_window)
        self._episode_lock = threading.Lock()
        self.worker_stats = [None] * self.n_workers
        self.best_avg = -np.inf if ckpt is None else ckpt.meta.get("best_moving_avg", -np.inf)
        if self.best_avg is None:
            self.best_avg = -np.inf
        self.logger = None
        self.t_start = None

    # -- setup helpers ---------------------------------------------------
    def _env_seed(self, wid):
        return self.cfg.seed + wid + 7919 * self.resumes

    def _env_kwargs(self):
        return {}

    def _opt_kwargs(self):
        c = self.cfg
        lr = c.learning_rate()
        if c.optimizer == "rmsprop":
            return dict(lr=lr, alpha=c.rmsprop_alpha, eps=c.rmsprop_eps,
                        anneal_steps=c.total_steps if c.lr_anneal else 0)
        if c.optimizer == "adam":
            return dict(lr=lr, beta1=c.adam_beta1, beta2=c.adam_beta2, eps=c.adam_eps)
        return dict(lr=lr)

    def _restore(self, ckpt):
        if ckpt.meta.get("optimizer") != self.cfg.optimizer:
            raise CheckpointError(
                f"checkpoint {ckpt.path} used optimizer {ckpt.meta.get('optimizer')!r}, "
                f"the config asks for {self.cfg.optimizer!r}"
            )
        # statistics and step counts come from the checkpoint; hyperparameters
        # (lr, alpha, eps, betas) from the config, so a resume may change them
        opt = self.shared.optimizer
        opt_state = {k: v for k, v in ckpt.meta.get("optimizer_scalars", {}).items()
                     if k not in getattr(opt, "_hyper", ())}
        opt_state.update(ckpt.opt_arrays)
        counters = ckpt.meta.get("counters", {})
        try:
            self.shared.load_state_dict({
                "params": ckpt.params,
                "optimizer": opt_state,
                "counters": {k: counters.get(k, 0) for k in type(self.shared)._COUNTERS},
            })
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"checkpoint {ckpt.path} cannot be resumed: {e}") from None
        self.wall_offset = float(counters.get("wall_seconds", 0.0))

    # -- checkpoints ---------------------------------------------------
    def _counters(self):
        s = self.shared
        return {
            "steps": int(s.steps),
            "updates": int(s.updates),
            "episodes": int(s.episodes),
            "skipped_updates": int(s.skipped_updates),
            "wall_seconds": self.elapsed(),
            "resumes": self.resumes,
        }

    def save(self, which="latest"):
        st = self.shared.state_dict()  # a snapshot copy; workers keep writing (Hogwild)
        opt = st["optimizer"]
        arrays = {k: v for k, v in opt.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in opt.items() if not isinstance(v, np.ndarray)}
        meta = {
            "network": self.net_spec,
            "layout": self.layout,
            "env": self.env_spec,
            "preprocess": self.pipeline_spec,
            "optimizer": self.cfg.optimizer,
            "optimizer_scalars": scalars,
            "counters": self._counters(),
            "config": self.cfg.to_dict(),
            "moving_avg": self.moving_avg(),
            "best_moving_avg": None if not np.isfinite(self.best_avg) else float(self.best_avg),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        path = os.path.join(self.run_dir, "checkpoints", f"{which}.npz")
        return save_checkpoint(path, st["params"], meta, arrays)

    # -- monitoring --------------------------------------------------------
    def elapsed(self):
        return self.wall_offset + (0.0 if self.t_start is None else time.perf_counter() - self.t_start)

    def moving_avg(self):
        with self._episode_lock:
            if not self.episodes:
                return None
            return float(np.mean(self.episodes))

    def _record_episode(self, wid, ret, length):
        idx = self.shared.add_episodes(1)
        with self._episode_lock:
            self.episodes.append(ret)
        if self.logger is not None:
            self.logger.episode(idx, self.elapsed(), int(self.shared.steps), wid, ret, length)

    # -- the worker -------------------------------------------------------
    def _worker(self, wid):
        try:
            self._worker_loop(wid)
        except BaseException:  # noqa: BLE001 - surfaced by the main thread
            self.errors.append((wid, traceback.format_exc()))
            self.stop_event.set()

    def _worker_loop(self, wid):
        from a3c_core.core import gae, sync_params

        cfg = self.cfg
        shared = self.shared
        if self._cores:
            _pin_thread({self._cores[wid % len(self._cores)]})
        env = self._envs[wid]
        if env is None:
            env = self._make_env(
                cfg.env, seed=self._env_seed(wid), frame_skip=cfg.frame_skip,
                runtime_dir=os.path.join(self.run_dir, "vizdoom"), **self._env_kwargs(),
            )
            self._envs[wid] = env
        pipe = ObsPipeline(self.pipeline_spec, env.obs_shape)
        net = self._build_network(
            self.spec_name, pipe.net_obs_shape, env.n_actions, seed=cfg.seed, **self.net_kwargs
        )
        T = cfg.t_max
        obs_buf = np.zeros((T + 1,) + pipe.net_obs_shape, np.float32)
        actions = np.zeros(T, np.int64)
        rewards = np.zeros(T, np.float32)
        values = np.zeros(T, np.float32)
        rng = np.random.default_rng([cfg.seed, wid, self.resumes])
        scale = cfg.effective_reward_scale()
        gamma, lam = cfg.gamma, cfg.gae_lambda
        vcoef, beta, clip = cfg.value_coef, cfg.effective_entropy_beta(), cfg.max_grad_norm
        total = cfg.total_steps
        trunc_boot = cfg.bootstrap_truncated()
        stop = self.stop_event
        stats_acc = np.zeros(5)  # policy, value, entropy, grad_norm, count
        # staggered start of this worker's optimizer sweep (see core.optim)
        offset = (wid * shared.n_params // self.n_workers) // 16 * 16

        pipe(env.reset(), obs_buf[0])
        state = net.initial_state()
        ep_ret, ep_len = 0.0, 0
        while not stop.is_set():
            if total and shared.steps >= total:
                break
            sync_params(shared.params, net.params)
            state0 = state
            u = rng.random(T)
            term = trunc = False
            n = T
            for t in range(T):
                probs, v, state = net.step(obs_buf[t], state)
                a = sample_categorical(probs, u[t])
                raw, r, term, trunc = env.step(a)
                actions[t] = a
                rewards[t] = r * scale
                values[t] = v
                ep_ret += r
                ep_len += 1
                pipe(raw, obs_buf[t + 1])
                if term or trunc:
                    n = t + 1
                    break
            if term or (trunc and not trunc_boot):
                boot = 0.0
            else:  # cut by t_max or truncated by a time limit: bootstrap from V(s_n)
                _, boot, _ = net.step(obs_buf[n], state)
            ret, adv = gae(rewards[:n], values[:n], float(boot), gamma, lam)
            stats, _ = net.loss_and_grad(
                obs_buf[:n], actions[:n], ret, adv, state0, value_coef=vcoef, entropy_beta=beta
            )
            norm, _applied = shared.apply(net.grads, clip, global_step=shared.steps, offset=offset)
            shared.add_steps(n)
            stats_acc += (stats["policy_loss"] / n, stats["value_loss"] / n,
                          stats["entropy"] / n, norm, 1.0)
            self.worker_stats[wid] = stats_acc
            if term or trunc:
                self._record_episode(wid, ep_ret, ep_len)
                ep_ret, ep_len = 0.0, 0
                pipe(env.reset(), obs_buf[0])
                state = net.initial_state()
            else:
                obs_buf[0] = obs_buf[n]

    # -- the run ------------------------------------------------------------
    def _warm_up(self):
        """Compile (first run) or load (cached) the Numba kernels before the clock starts."""
        notice = threading.Timer(
            1.5, lambda: print("compiling Numba kernels (first run only; cached afterwards)...",
                               file=self.out, flush=True))
        if not self.cfg.quiet:
            notice.start()
        try:
            obs_shape = tuple(self.net_spec["obs_shape"])
            net = self._build_network(self.spec_name, obs_shape, self.net_spec["n_actions"],
                                      seed=self.cfg.seed, **self.net_kwargs)
            obs = np.zeros((2,) + obs_shape, np.float32)
            probs, _, _ = net.step(obs[0], net.initial_state())
            sample_categorical(probs, 0.5)
            zeros = np.zeros(2, np.float32)
            net.loss_and_grad(obs, np.zeros(2, np.int64), zeros, zeros, net.initial_state())
        finally:
            notice.cancel()

    def run(self) -> TrainResult:
        cfg = self.cfg
        self._warm_up()
        self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.tensorboard)
        threads = [
            threading.Thread(target=self._worker, args=(i,), name=f"a3c-worker-{i}", daemon=True)
            for i in range(self.n_workers)
        ]
        self.t_start = time.perf_counter()
        status = "done"
        last_ckpt = last_log = last_line = time.perf_counter()
        last_steps = int(self.shared.steps)
        prev_stats = np.zeros(5)
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        sps = 0.0
        try:
            for th in threads:
                th.start()
            while any(th.is_alive() for th in threads):
                self.stop_event.wait(min(0.2, cfg.log_interval))
                now = time.perf_counter()
                steps = int(self.shared.steps)
                avg = self.moving_avg()
                if cfg.total_seconds and self.elapsed() >= cfg.total_seconds:
                    self.stop_event.set()
                if (cfg.target_reward is not None and avg is not None
                        and len(self.episodes) >= cfg.reward_window and avg >= cfg.target_reward):
                    self.stop_event.set()
                if now - last_log >= cfg.log_interval:
                    sps = (steps - last_steps) / (now - last_log)
                    acc = sum(s for s in self.worker_stats if s is not None) if any(
                        s is not None for s in self.worker_stats) else np.zeros(5)
                    d = acc - prev_stats
                    prev_stats = np.array(acc, copy=True)
                    el = self.elapsed()
                    self.logger.scalar("charts/sps", sps, steps, el)
                    if avg is not None:
                        self.logger.scalar("charts/moving_avg_return", avg, steps, el)
                    if d[4] > 0:
                        for i, name in enumerate(("policy_loss", "value_loss", "entropy", "grad_norm")):
                            self.logger.scalar(f"losses/{name}", d[i] / d[4], steps, el)
                    self.logger.flush()
                    if avg is not None and len(self.episodes) >= min(10, cfg.reward_window) and avg > self.best_avg:
                        self.best_avg = avg
                        self.save("best")
                    if not cfg.quiet and (tty or now - last_line >= max(10.0, cfg.log_interval)):
                        self._progress(steps, sps, avg, d, tty)
                        last_line = now
                    last_log, last_steps = now, steps
                if cfg.checkpoint_interval and now - last_ckpt >= cfg.checkpoint_interval:
                    self.save("latest")
                    last_ckpt = now
        except KeyboardInterrupt:
            status = "interrupted"
            self.stop_event.set()
            print("\ninterrupted: stopping workers and writing a checkpoint...", file=self.out)
        finally:
            self.stop_event.set()
            for th in threads:
                while th.is_alive():
                    try:
                        th.join(0.5)
                    except KeyboardInterrupt:  # a second Ctrl-C: keep waiting, data first
                        pass
            path = self.save("latest")
            avg = self.moving_avg()
            if avg is not None and len(self.episodes) >= min(10, cfg.reward_window) and avg > self.best_avg:
                self.best_avg = avg
                self.save("best")
            self.logger.close()
            for env in self._envs:
                if env is not None:
                    env.close()
            try:  # the envs remove their runtime files; drop the emptied folder too
                os.rmdir(os.path.join(self.run_dir, "vizdoom"))
            except OSError:
                pass
            if not cfg.quiet and tty:
                print(file=self.out)
        if self.errors:
            status = "failed"
        result = TrainResult(self.run_dir, status, int(self.shared.steps), int(self.shared.episodes),
                             self.elapsed(), self.moving_avg(), path)
        with open(os.path.join(self.run_dir, "summary.json"), "w") as fh:
            json.dump({"status": status, "steps": result.steps, "episodes": result.episodes,
                       "seconds": result.seconds, "moving_avg": result.moving_avg,
                       "best_moving_avg": None if not np.isfinite(self.best_avg) else self.best_avg},
                      fh, indent=1)
        if self.errors:
            raise TrainingError(
                f"worker {self.errors[0][0]} failed; checkpoint written to {path}",
                self.errors,
            )
        return result

    def _progress(self, steps, sps, avg, d, tty):
        el = self.elapsed()
        losses = ""
        if d[4] > 0:
            losses = f" | pi {d[0] / d[4]:+.3f} v {d[1] / d[4]:.3f} H {d[2] / d[4]:.3f} |g| {d[3] / d[4]:.2f}"
        avg_s = "   n/a" if avg is None else f"{avg:7.2f}"
        line = (f"[{el:7.1f}s] steps {steps:>9,d}  {sps:7.0f} steps/s  episodes {int(self.shared.episodes):>6d}"
                f"  avg{self.cfg.reward_window} {avg_s}{losses}")
        if tty:
            print("\r" + line, end="", file=self.out, flush=True)
        else:
            print(line, file=self.out, flush=True)


def train(cfg: Config | None = None, *, resume: str | None = None, out=None, **overrides) -> TrainResult:
    """Train with ``cfg`` (a :class:`Config`; keyword overrides allowed)."""
    cfg = cfg or Config()
    if overrides:
        cfg = cfg.replace(**overrides)
    return Trainer(cfg, resume=resume, out=out).run()
