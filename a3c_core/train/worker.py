"""One A3C worker: K envs in lockstep, one forward per tick, one update per rollout.

A :class:`Worker` owns K envs (``envs_per_worker``; K = 1 is the A3C
paper's worker), a local network, its preprocessing, its RNG and its
rollout buffers.  Everything it shares with other workers goes through a
:class:`~a3c_core.train.store.Store` (:mod:`a3c_core.train.store`: pull,
apply, add_steps, record_episode and the normalizers); threads, worker
processes and Ray nodes each bring one, and the rollout code stays the same.

One rollout (:meth:`Worker.rollout`), the algorithm in one place:

1. pull the global parameters unless the last apply refreshed them;
2. ``t_max`` ticks; each tick runs ONE forward over the K envs' rows
   (``Network.record_tick``: the convs, fc, LSTM rows and heads as GEMMs
   over K rows, recorded for the backward), samples K actions and steps the
   K envs.  An episode that ends at tick t is reported and its env reset at
   once; that row's LSTM state restarts at zeros at tick t + 1 and no
   gradient flows across the reset (a per-row mask).  With K = 1 the step
   is one compiled call (``Network.actor``), and a rollout ends with its
   episode as in the paper, unless the worker's episodes are short
   (``merge_below``: then it runs on into the next episode up to
   ``t_max // 2`` steps);
3. each segment (a part of an env's episode) bootstraps from V(s) of its
   last observation when it was cut by ``t_max`` (or by a time limit with
   ``truncation_bootstrap``), from 0 after a terminal state;
4. returns and GAE advantages per segment (``core.targets``, one compiled
   call), then ONE backward over the ``T x K`` rows (``Network.rollout_grad``,
   BPTT per env, GEMMs over all rows), then one clipped Hogwild
   ``store.apply``.

The update is the sum of the K envs' rollout gradients
(tests/test_batched_rollout.py, tests/test_envs_per_worker.py).
Self-imitation (``self_imitation``) is a component
(:mod:`a3c_core.train.sil`) fed after each update.

Env restarts (``remake_env``): an env whose ``step`` or ``reset`` raises
(a crashed ViZDoom engine, a dead env process, any exception) is closed
and rebuilt in place by ``remake_env(k)`` (the same id, options and seed),
then reset; up to ``env_restarts`` times in any hour (a sliding window),
after which the exception propagates as it does without a factory.  The
row's episode is dropped (not reported), that row's LSTM state restarts at
zeros and the other K - 1 rows are not touched.  The rows it played in this
rollout still count: the ones before the failed step form a segment cut as
``t_max`` cuts one, bootstrapped from V(s_t) (the value the tick's forward
recorded for the observation the failed step was given); the failed step's
own row, which has no outcome, is a one-row segment whose return is its own
value (reward 0, bootstrap V(s_t) / gamma): no advantage and no value
error, so it adds no gradient beyond its entropy term.  Each restart is
counted (``LossStats.env_restarts``) and reported to ``on_env_restart``.
While a worker is inside an env call, ``step_began`` holds when the call
began (``perf_counter``; 0 otherwise) and ``step_env`` which env it is:
the step watchdog (:mod:`a3c_core.train.watchdog`) reads them.
"""
from __future__ import annotations

import collections
import threading
import time
import traceback
from contextlib import nullcontext
from time import perf_counter
from dataclasses import dataclass

import numpy as np

from a3c_core._fpenv import flush_denormals
from a3c_core.core import gae
from a3c_core.core.normalize import clip_into, running_returns, scale_clip_into
from a3c_core.core.targets import BAD_ADVANTAGES, BAD_RETURNS, rollout_targets
from a3c_core.sampling import sample_categorical, sample_rows
from a3c_core.train.sil import SelfImitation
from a3c_core.train.store import NO_STATS, LossStats, Store, ThreadStore

__all__ = ["RolloutSettings", "LossStats", "Store", "ThreadStore", "Worker", "RolloutAborted",
           "RESTART_WINDOW"]

#: seconds of the sliding window ``env_restarts`` counts in (one hour)
RESTART_WINDOW = 3600.0

#: step durations kept per worker for the watchdog's median (a ring)
STEP_RING = 256


class RolloutAborted(Exception):
    """An env call failed while the worker is stopping (the run's shutdown
    killed a stuck engine): :meth:`Worker.run` returns quietly."""


@dataclass(frozen=True)
class RolloutSettings:
    """The per-rollout hyperparameters a worker needs (from :class:`Config`)."""

    t_max: int = 20
    gamma: float = 0.99
    gae_lambda: float = 1.0
    value_coef: float = 0.5
    entropy_beta: float = 0.01
    max_grad_norm: float = 40.0
    #: fixed reward multiplier, or None: divide by the running return std
    reward_scale: float | None = None
    #: clip raw rewards to [-reward_clip, reward_clip] before scaling (0 = off)
    reward_clip: float = 0.0
    #: normalized rewards are clipped to [-norm_clip, norm_clip]
    norm_clip: float = 10.0
    #: bootstrap from V(s) when a time limit cuts an episode
    truncation_bootstrap: bool = True
    #: divide advantages by their running RMS (core.normalize.AdvantageNormalizer)
    normalize_advantages: bool = False
    #: K = 1 only: while the worker's last ``merge_window`` episodes average
    #: fewer steps than this, its rollouts run on into the next episode (up
    #: to t_max // 2 steps), and end with their episode again once those
    #: episodes average more than t_max steps (0 = off).  K > 1 always
    #: runs t_max ticks (lockstep).
    merge_below: float = 0.0
    merge_window: int = 1000
    #: self-imitation learning (Oh et al. 2018; a3c_core.train.sil)
    self_imitation: bool = False


class Worker:
    """Rollouts and updates of one A3C worker (see the module docstring).

    Args:
        wid: worker index (episode records, the optimizer sweep's offset).
        env: an :class:`~a3c_core.envs.Env`, or a list of K of them, stepped
            in lockstep.
        net: this worker's own :class:`~a3c_core.nn.network.Network`.
        pipeline: :class:`~a3c_core.obs.ObsPipeline` raw obs -> net input.
        store: the shared-state seam.
        settings: :class:`RolloutSettings`.
        rng: ``numpy.random.Generator`` for action sampling.
        offset: start index of this worker's optimizer sweep.
        fused_act: K = 1: each step in the network's compiled
            :class:`~a3c_core.nn.network.Actor` where it has one (False:
            ``net.step``; the same results).
        fused_targets: the targets in one compiled call where the store
            exposes its normalizers' arrays (the same results).
        remake_env: ``remake_env(k) -> Env``, a new env ``k`` (the same id,
            options and seed) for one whose ``step`` or ``reset`` raised
            (see the module docstring); None: the exception propagates.
        env_restarts: the restarts allowed per :data:`RESTART_WINDOW`
            seconds; the next failure propagates.
        on_env_restart: ``on_env_restart(wid, k, summary, text, count,
            limit)`` after each restart: a one-line summary, the
            traceback, the restarts in the window so far and the limit.
    """

    def __init__(self, wid, env, net, pipeline, store, settings, rng, *, offset=0,
                 fused_act=True, fused_targets=True, remake_env=None, env_restarts=3,
                 on_env_restart=None):
        self.wid = wid
        envs = list(env) if isinstance(env, (list, tuple)) else [env]
        if not envs:
            raise ValueError("Worker: needs at least one env")
        self.envs = envs
        self.n_envs = K = len(envs)
        self.net = net
        if hasattr(net, "single_step_kernel"):
            net.single_step_kernel = True     # one compiled step kernel (nn.network)
        self.pipe = pipeline
        self.store = store
        self.s = s = settings
        self.rng = rng
        self.offset = int(offset)
        self.stats = LossStats()
        T = s.t_max
        self._rows = R = T * K
        obs_shape = tuple(pipeline.net_obs_shape)
        # rollout rows, time-major (row t*K + k: tick t of env k)
        self.actions = np.zeros(R, np.int64)
        self.values = np.zeros(R, np.float32)
        self.raw_rewards = np.zeros(R, np.float64)
        # env-major copies for the targets (segments are contiguous there)
        self._raw_em = np.zeros(R, np.float64)
        self._val_em = np.zeros(R, np.float32)
        self.rewards = np.zeros(R, np.float32)     # learning rewards, env-major
        self._clip_buf = np.zeros(R, np.float64)
        self._seg_end = np.zeros(R, np.int64)
        self._seg_boot = np.zeros(R, np.float64)
        self._seg_ended = np.zeros(R, np.bool_)
        self._seg_acc = np.zeros(R, np.float64)
        self._seg_raw = np.zeros(R, np.float64)
        self._rets_buf = np.zeros(R, np.float64)
        self._adv64_buf = np.zeros(R, np.float64)
        self._ret = np.zeros(R, np.float32)
        self._adv = np.zeros(R, np.float32)
        self._ret_tm = np.zeros(R, np.float32)
        self._adv_tm = np.zeros(R, np.float32)
        self._stats = store.target_stats() if fused_targets else None
        self._targets_lock = getattr(store, "targets_lock", None) or nullcontext()
        if self._stats is not None and (s.reward_scale is None) != (self._stats[0].size > 0):
            self._stats = None          # settings and store disagree: the separate path's errors
        if self._stats is not None and s.normalize_advantages and self._stats[2].size == 0:
            self._stats = None
        # K = 1: one compiled call per step (Network.actor) where the network has one
        self.actor = (net.actor(pipeline, self.actions, self.values)
                      if K == 1 and fused_act and hasattr(net, "actor") else None)
        self._u_buf = np.empty(0)
        self._u_pos = 0
        self._u_rng = None
        # per env: the raw frame the next tick preprocesses (None: its input
        # is already in obs_buf[0] / _next_obs[k]), the episode's figures
        self._frames = [None] * K
        self._started = [False] * K
        self.ep_returns = [0.0] * K
        self.ep_lengths = [0] * K
        self._ret_acc = [0.0] * K          # running discounted return (normalizer)
        #: K = 1: the LSTM state (h, c) the next rollout starts from; K > 1:
        #: ``(h, c)`` of ``(K, H)`` rows
        self.state = None
        self.obs_buf = np.zeros((T + 1,) + obs_shape, net.dtype)   # K = 1's inputs
        self._obs_rows = list(self.obs_buf)
        self._next_obs = np.zeros((K,) + obs_shape, net.dtype)     # K > 1: bootstrap inputs
        self._has_next = False
        self._reset = np.zeros(K, np.bool_)
        self._u_tick = np.zeros(K, np.float64)
        self._a_tick = np.zeros(K, np.int64)
        self._fused_sync = bool(getattr(store, "syncs_on_apply", False))
        self._fresh = False
        self.sil = (SelfImitation(net, s, store.target_stats(), K, rng, self.stats)
                    if s.self_imitation else None)
        self._lengths = np.zeros(max(int(s.merge_window), 1), np.int64)
        self._n_lengths = 0
        self._len_sum = 0
        #: K = 1: rollouts run on into the next episode (merge_below's switch)
        self.merging = False
        # -- env restarts and the step watchdog's view -------------------------
        self.remake_env = remake_env
        self.env_restarts = int(env_restarts)
        self.on_env_restart = on_env_restart
        self._restart_times = collections.deque()
        #: set while the worker is stopping (``run``'s event, or the caller's):
        #: an env that fails then is not rebuilt (:class:`RolloutAborted`)
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

    # -- compatibility views (K = 1) ----------------------------------------
    @property
    def env(self):
        return self.envs[0]

    @property
    def ep_return(self):
        return self.ep_returns[0]

    @property
    def ep_length(self):
        return self.ep_lengths[0]

    def sil_keep(self, obs, actions, raw_rewards) -> bool:
        """Offer a finished episode to self-imitation (:meth:`SelfImitation.keep`)."""
        if self.sil is None:
            raise RuntimeError("Worker.sil_keep: self_imitation is off for this worker")
        return self.sil.keep(obs, actions, raw_rewards)

    def sil_replay(self, n_played):
        """Self-imitation updates worth ``n_played`` rows (:meth:`SelfImitation.replay`)."""
        if self.sil is not None:
            self.sil.replay(n_played, self._apply_grads)

    #: rollouts' worth of uniforms drawn per rng call
    UNIFORM_BLOCK = 64

    def _uniforms(self):
        """The rollout's ``t_max * K`` uniforms (row order): the next values
        of one ``rng.random`` stream, drawn UNIFORM_BLOCK rollouts at a time."""
        R = self._rows
        pos = self._u_pos
        if pos + R > self._u_buf.shape[0] or self._u_rng is not self.rng:
            self._u_rng = self.rng
            self._u_buf = self.rng.random(R * self.UNIFORM_BLOCK)
            pos = 0
        self._u_pos = pos + R
        return self._u_buf[pos:pos + R]

    # -- episodes -----------------------------------------------------------
    def _episode_over(self, k):
        """Env ``k``'s step ended its episode: report the whole game when it
        is over (a life loss that ends the learning episode keeps
        ``episode_over`` False), then reset the env; returns its first frame."""
        env = self.envs[k]
        if getattr(env, "episode_over", True):
            # the task's own score, without the env's reward shaping
            score = self.ep_returns[k] - getattr(env, "episode_shaping", 0.0)
            self.store.record_episode(self.wid, score, self.ep_lengths[k],
                                      end=getattr(env, "episode_end", None))
            if self.s.merge_below > 0:
                self._track_length(self.ep_lengths[k])
            self.ep_returns[k], self.ep_lengths[k] = 0.0, 0
        self._ret_acc[k] = 0.0
        return self._reset_env(k)

    # -- env restarts -------------------------------------------------------
    def _reset_env(self, k):
        """``envs[k].reset()``, watched; an env whose reset raises is rebuilt
        (:meth:`_restart`) and the new one's first frame returned."""
        self.step_env = k
        self.step_began = perf_counter()
        try:
            frame = self.envs[k].reset()
        except Exception as exc:  # noqa: BLE001 - any failure of the env: rebuilt or raised
            self.step_began = 0.0
            return self._restart(k, exc, "reset")
        self.step_began = 0.0
        return frame

    def _count_restart(self, k, exc, during):
        """Count one restart of env ``k`` and report it, or raise: ``exc``
        itself without a factory or past the limit, :class:`RolloutAborted`
        while the worker stops."""
        if self.stopping is not None and self.stopping.is_set():
            raise RolloutAborted(f"env {k} of worker {self.wid} failed while stopping") from exc
        if self.remake_env is None:
            raise exc
        now = time.monotonic()
        window = self._restart_times
        while window and now - window[0] > RESTART_WINDOW:
            window.popleft()
        if len(window) >= self.env_restarts:
            raise exc
        window.append(now)
        self.stats.env_restarts += 1
        hang = self.hang_notes.pop(k, None)
        what = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        summary = f"its {during} raised {what}"
        if hang:
            summary = f"{hang}; {summary}"
        if self.on_env_restart is not None:
            text = "".join(traceback.format_exception(exc))
            if hang:
                text = f"{hang}\n{text}"
            self.on_env_restart(self.wid, k, summary, text, len(window), self.env_restarts)

    def _restart(self, k, exc, during):
        """Env ``k``'s ``step`` or ``reset`` raised ``exc``: close it (best
        effort), build a new one with ``remake_env(k)`` and reset it; returns
        its first frame.  A failure while rebuilding counts as another
        restart.  The episode's figures restart at zero (it is not reported)."""
        while True:
            self._count_restart(k, exc, during)
            try:
                self.envs[k].close()
            except Exception:  # noqa: BLE001 - a crashed engine may not close cleanly
                pass
            try:
                env = self.remake_env(k)
                self.envs[k] = env
                frame = env.reset()
            except Exception as e:  # noqa: BLE001 - counted as one more restart
                exc, during = e, "restart"
                continue
            break
        self.ep_returns[k], self.ep_lengths[k] = 0.0, 0
        self._ret_acc[k] = 0.0
        return frame

    def _step_failed(self, k, t, exc, segs, dropped):
        """Env ``k``'s step at tick ``t`` raised ``exc``: close its segment
        (module docstring: the rows before it bootstrap from V(s_t); the
        failed row is a one-row segment whose return is its own value), drop
        its episode and rebuild the env; returns the new env's first frame."""
        v = float(self.values[t * self.n_envs + k])
        start = segs[k][-1][0] if segs[k] else 0
        if t > start:
            segs[k].append((t, v, False))
        gamma = float(self.s.gamma)
        segs[k].append((t + 1, v / gamma if gamma > 0 else 0.0, True))
        dropped[k].append(t + 1)
        return self._restart(k, exc, "step")

    def step_median(self):
        """The median of the worker's recent env step durations (None before 16)."""
        n = min(self.n_step_times, STEP_RING)
        if n < 16:
            return None
        return float(np.median(np.asarray(self.step_times[:n])))

    def _track_length(self, length):
        """``merge_below``'s switch: the mean length of the last ``merge_window``
        episodes turns merging on below ``merge_below`` and off above ``t_max``."""
        buf = self._lengths
        i = self._n_lengths % len(buf)
        self._len_sum += int(length) - int(buf[i])
        buf[i] = length
        self._n_lengths += 1
        if self._n_lengths < len(buf):
            return
        mean = self._len_sum / len(buf)
        if mean < self.s.merge_below:
            self.merging = True
        elif mean > self.s.t_max:
            self.merging = False

    def mean_episode_length(self):
        """Mean length of the episodes in the switch's window (None before one ended)."""
        k = min(self._n_lengths, len(self._lengths))
        return self._len_sum / k if k else None

    # -- one tick's forward ---------------------------------------------------
    def _forward(self, t, u, state, reset):
        """Tick ``t``'s forward over the K envs and their K actions (into
        ``actions[t*K:]``/``values[t*K:]``); the pending raw frames are
        preprocessed into the tick's input rows first.  ``state``: the
        input state at t = 0 or, K = 1, a new episode's (else None);
        ``reset``: K > 1, the rows that start an episode."""
        K, net, frames = self.n_envs, self.net, self._frames
        if K == 1:
            act = self.actor
            if act is not None:
                frame, frames[0] = frames[0], None
                return act.step_row(t, self._obs_rows[t], u[t], frame, state)
            obs = self.obs_buf[t]
            if frames[0] is not None:
                self.pipe(frames[0], obs)
                frames[0] = None
            probs, v, self._state1 = net.step(obs, state if state is not None else self._state1,
                                              record=True)
            a = sample_categorical(probs, u[t])
            self.actions[t] = a
            self.values[t] = v
            return a
        rows = net.tick_inputs(t)
        if t == 0 and self._has_next:
            rows[...] = self._next_obs
            self._has_next = False
        for k in range(K):
            if frames[k] is not None:
                self.pipe(frames[k], rows[k])
                frames[k] = None
        probs, values = net.record_tick(t, state, reset)
        r0 = t * K
        self.values[r0:r0 + K] = values
        acts = self._a_tick
        sample_rows(probs, u[r0:r0 + K], acts)
        self.actions[r0:r0 + K] = acts
        return acts

    def _bootstrap_values(self, state):
        """V(s) of every env's pending observation from ``state`` (K > 1):
        the frames are preprocessed into ``_next_obs``, where the next
        rollout's first tick takes them from."""
        for k in range(self.n_envs):
            self.pipe(self._frames[k], self._next_obs[k])
            self._frames[k] = None
        self._has_next = True
        _, values, _ = self.net.step_batch(self._next_obs, state)
        return values

    def _truncated_value(self, k, frame):
        """V of the last observation of env ``k``'s episode that a time
        limit cut at this tick (``truncation_bootstrap``), unrecorded."""
        obs = np.empty(self.net.obs_shape, self.net.dtype)
        self.pipe(frame, obs)
        if self.n_envs == 1:
            state = self.net.recorded_state()
            if self.actor is not None:
                return self.actor.value(obs, state)
            return self.net.step(obs, state)[1]
        st = self.net.recorded_state()
        return self.net.step(obs, None if st is None else (st[0][k], st[1][k]))[1]

    # -- one rollout + update ------------------------------------------------
    def rollout(self):
        """Collect one rollout from the K envs and apply one update.

        Returns ``(n, terminated, truncated, applied)``: n the agent steps
        (ticks x K); the flags are those of env 0's last step."""
        if not self._fresh:
            self.store.pull(self.net.params)
        self._fresh = False
        s, net, K = self.s, self.net, self.n_envs
        T = s.t_max
        across = K > 1 or self.merging
        k_min = max(T // 2, 1) if K == 1 else T
        u = self._uniforms()
        envs, frames, raw = self.envs, self._frames, self.raw_rewards
        if K == 1:
            net.begin_rollout(T)
        else:
            net.begin_batch_rollout(T, K)
        # the input state of tick 0: each env's carried state, zeros for a new episode
        for k in range(K):
            if not self._started[k]:
                frames[k] = self._reset_env(k)
                self._started[k] = True
                if K == 1:
                    self.state = net.initial_state()
                elif self.state is not None:
                    self.state[0][k] = 0
                    self.state[1][k] = 0
        state = self.state
        self._state1 = None
        acc0 = list(self._ret_acc)          # each env's running return at the rollout's start
        segs = [[] for _ in range(K)]       # per env: (end tick, bootstrap, ended)
        dropped = [[] for _ in range(K)]    # per env: ends of episodes a failed step dropped
        ring, n_ring = self.step_times, self.n_step_times
        reset = self._reset
        reset[:] = False
        n = T
        term = trunc = False
        ended_last = []                     # paper rollouts: envs reset after the update
        st_ = self.stats
        t_rollout = perf_counter()
        t_env = 0.0
        t_fwd = 0.0
        for t in range(T):
            c0 = perf_counter()
            acts = self._forward(t, u, state, reset if K > 1 else None)
            t_fwd += perf_counter() - c0
            state = None
            reset[:] = False
            r0 = t * K
            for k in range(K):
                a = acts if K == 1 else int(acts[k])
                self.step_env = k
                self.step_began = c0 = perf_counter()
                try:
                    frame, r, term_k, trunc_k = envs[k].step(a)
                except Exception as exc:  # noqa: BLE001 - rebuilt in place, or raised
                    self.step_began = 0.0
                    raw[r0 + k] = 0.0
                    frames[k] = self._step_failed(k, t, exc, segs, dropped)
                    t_env += perf_counter() - c0
                    reset[k] = True
                    if K == 1:
                        state = net.initial_state()
                    if k == 0:
                        term = trunc = False
                    continue
                dt = perf_counter() - c0
                self.step_began = 0.0
                t_env += dt
                ring[n_ring & (STEP_RING - 1)] = dt
                n_ring += 1
                raw[r0 + k] = r
                self.ep_returns[k] += float(r)
                self.ep_lengths[k] += 1
                if k == 0:
                    term, trunc = term_k, trunc_k
                if not (term_k or trunc_k):
                    frames[k] = frame
                    continue
                boot = 0.0
                if trunc_k and not term_k and s.truncation_bootstrap:
                    boot = self._truncated_value(k, frame)
                segs[k].append((t + 1, float(boot), True))
                if not across:
                    ended_last.append(k)
                    continue
                c0 = perf_counter()
                frames[k] = self._episode_over(k)
                t_env += perf_counter() - c0
                reset[k] = True
                if K == 1:
                    state = net.initial_state()
            # (a paper rollout, not across episodes, ends with a failed step too)
            if K == 1 and (ended_last or (reset[0] and (t + 1 >= k_min or not across))):
                n = t + 1
                break
        self.n_step_times = n_ring
        # bootstrap each env's open segment from V(s_n)
        c0 = perf_counter()
        if K == 1:
            if not ended_last and not reset[0]:
                st = self.state = net.recorded_state()
                if self.actor is not None:
                    frame, frames[0] = frames[0], None
                    boot = self.actor.value(self.obs_buf[0], st, frame)
                else:
                    obs0 = self.obs_buf[0]
                    self.pipe(frames[0], obs0)
                    frames[0] = None
                    boot = net.step(obs0, st)[1]
                segs[0].append((n, float(boot), False))
            elif reset[0]:
                self.state = net.initial_state()
        else:
            st = net.recorded_state()
            boots = self._bootstrap_values(st)
            if st is not None:
                st[0][reset] = 0
                st[1][reset] = 0
            self.state = st
            for k in range(K):
                if not reset[k]:
                    segs[k].append((n, float(boots[k]), False))
        t_fwd += perf_counter() - c0
        ret, adv = self._targets(n, segs, acc0)
        applied = self._apply_update(n * K, ret, adv)
        if self.sil is not None:
            self._sil_record(n, segs, dropped)
            self.sil.replay(n * K, self._apply_grads)
        self.store.add_steps(n * K)
        c0 = perf_counter()
        for k in ended_last:
            frames[k] = self._episode_over(k)
            self._started[k] = True
            self.state = net.initial_state()
        end = perf_counter()
        st_.t_env += t_env + (end - c0)
        st_.t_forward += t_fwd
        st_.t_rollout += end - t_rollout
        st_.agent_steps += n * K
        return n * K, term, trunc, applied

    def _targets(self, n, segs, acc0):
        """``(returns, advantages)`` float32, time-major ``(n*K,)``: the
        rollout's rewards clipped and scaled (the normalizer merged), GAE
        per segment, advantages normalized, over env-major copies of the
        rows (each env's segments contiguous)."""
        K = self.n_envs
        m = n * K
        if K == 1:
            raw_em, val_em = self.raw_rewards, self.values
        else:
            raw_em, val_em = self._raw_em, self._val_em
            raw_em[:m].reshape(K, n)[...] = self.raw_rewards[:m].reshape(n, K).T
            val_em[:m].reshape(K, n)[...] = self.values[:m].reshape(n, K).T
        j = 0
        last = []
        for k in range(K):
            first = True
            for end, boot, ended in segs[k]:
                self._seg_end[j] = k * n + end
                self._seg_boot[j] = boot
                self._seg_ended[j] = ended
                self._seg_acc[j] = acc0[k] if first else np.nan
                first = False
                j += 1
            last.append(j - 1)
        n_seg = j
        ret, adv = self._segment_targets(raw_em, val_em, m, n_seg)
        if self.s.reward_scale is None:
            for k in range(K):
                self._ret_acc[k] = self._seg_acc.item(last[k])
        if K == 1:
            return ret, adv
        self._ret_tm[:m].reshape(n, K)[...] = ret.reshape(K, n).T
        self._adv_tm[:m].reshape(n, K)[...] = adv.reshape(K, n).T
        return self._ret_tm[:m], self._adv_tm[:m]

    def _segment_targets(self, raw, values, m, n_seg):
        s = self.s
        if self._stats is None:
            return self._targets_separate(raw, values, m, n_seg)
        rn_st, rn_prm, an_st, an_prm = self._stats
        fixed = np.nan if s.reward_scale is None else float(s.reward_scale)
        with self._targets_lock:
            status = rollout_targets(
                raw, m, self._seg_end, self._seg_boot, self._seg_ended, self._seg_acc,
                self._seg_raw, n_seg, float(s.reward_clip), fixed, float(s.gamma),
                float(s.norm_clip), rn_st, rn_prm, values, float(s.gae_lambda),
                an_st if s.normalize_advantages else NO_STATS, an_prm,
                self._clip_buf, self._rets_buf, self._adv64_buf,
                self.rewards, self._ret, self._adv)
        if status == BAD_RETURNS:
            raise ValueError("ReturnNormalizer.update: returns contain NaN or inf")
        if status == BAD_ADVANTAGES:
            raise ValueError("AdvantageNormalizer.update: advantages contain NaN or inf")
        return self._ret[:m], self._adv[:m]

    def _targets_separate(self, raw, values, m, n_seg):
        """:meth:`_segment_targets` through the store's ``reward_scale`` and
        ``advantage_scale`` (a store without the normalizers' arrays)."""
        s = self.s
        segs = []
        a0 = 0
        for k in range(n_seg):
            b0 = int(self._seg_end[k])
            segs.append((a0, b0, float(self._seg_boot[k]), bool(self._seg_ended[k])))
            a0 = b0
        r = raw[:m]
        if s.reward_clip > 0:
            clip_into(r, -float(s.reward_clip), float(s.reward_clip), self._clip_buf[:m])
            r = self._clip_buf[:m]
        if s.reward_scale is not None:
            np.multiply(r, s.reward_scale, out=self.rewards[:m], casting="unsafe")
        else:
            rets = []
            acc = 0.0
            for k, (a0, b0, _, ended) in enumerate(segs):
                start = float(self._seg_acc[k])
                if start == start:
                    acc = start
                rr, acc = running_returns(r[a0:b0], s.gamma, acc)
                rets.append(rr)
                if ended:
                    acc = 0.0
                self._seg_acc[k] = acc
            scale = self.store.reward_scale(np.concatenate(rets))
            scale_clip_into(r, float(scale), float(s.norm_clip), self.rewards[:m])
        ret = np.empty(m, np.float32)
        adv = np.empty(m, np.float32)
        for a0, b0, boot, _ in segs:
            ret[a0:b0], adv[a0:b0] = gae(self.rewards[a0:b0], values[a0:b0], boot,
                                         s.gamma, s.gae_lambda)
        if s.normalize_advantages:
            adv = adv * np.float32(self.store.advantage_scale(adv))
        return ret, adv

    def _apply_grads(self, grads):
        """One gradient to the store (clipped Hogwild apply); refreshes the
        local params in the same pass where the store can.  Returns applied."""
        s = self.s
        if self._fused_sync:
            norm, applied = self.store.apply(grads, s.max_grad_norm, self.offset,
                                             local=self.net.params)
            self._fresh = self._fresh or applied
        else:
            norm, applied = self.store.apply(grads, s.max_grad_norm, self.offset)
        self._last_norm = norm
        return applied

    def _apply_update(self, m, ret, adv):
        s, st = self.s, self.stats
        # the backward only, over the rows the ticks recorded
        c0 = perf_counter()
        loss = self.net.rollout_grad(self.actions[:m], ret, adv, value_coef=s.value_coef,
                                     entropy_beta=s.entropy_beta)
        c1 = perf_counter()
        applied = self._apply_grads(self.net.grads)
        st.t_backward += c1 - c0
        st.t_apply += perf_counter() - c1
        if applied:
            st.policy_loss += loss["policy_loss"] / m
            st.value_loss += loss["value_loss"] / m
            st.entropy += loss["entropy"] / m
            st.grad_norm += self._last_norm
            st.updates += 1
        else:
            st.skipped += 1
        return applied

    def _sil_record(self, n, segs, dropped=None):
        """Each env's rows of this rollout (time order) to self-imitation;
        an episode a failed step dropped is discarded, not offered."""
        K = self.n_envs
        obs = self.net.recorded_obs
        rows = obs.reshape((n, K) + obs.shape[1:])
        acts = self.actions[:n * K].reshape(n, K)
        raw = self.raw_rewards[:n * K].reshape(n, K)
        for k in range(K):
            ends = [end for end, _, ended in segs[k] if ended]
            self.sil.record(k, rows[:, k], acts[:, k], raw[:, k], ends,
                            dropped[k] if dropped is not None else ())

    def run(self, stop: threading.Event, total_steps=0):
        """Rollouts until ``stop`` is set or ``total_steps`` (0 = no limit) is
        reached, subnormal floats flushed to zero in this thread.  An env
        that fails once ``stop`` is set (the run's shutdown killed a stuck
        engine) ends it quietly."""
        store = self.store
        self.stopping = stop
        with flush_denormals():
            while not stop.is_set():
                if total_steps and store.steps >= total_steps:
                    break
                try:
                    self.rollout()
                except RolloutAborted:  # the run stopped while an env was failing
                    return
