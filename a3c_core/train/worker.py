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
   (``merge_below``, :mod:`a3c_core.train.merge`: then it runs on into the
   next episode up to ``t_max // 2`` steps);
3. each segment (a part of an env's episode) bootstraps from V(s) of its
   last observation when it was cut by ``t_max`` (or by a time limit with
   ``truncation_bootstrap``), from 0 after a terminal state;
4. returns and GAE advantages per segment (:mod:`a3c_core.train.segments`:
   the rewards clipped and scaled, one compiled ``core.targets`` call),
   then ONE backward over the ``T x K`` rows (``Network.rollout_grad``,
   BPTT per env, GEMMs over all rows), then one clipped Hogwild
   ``store.apply`` (:meth:`Worker._apply_update`).

The update is the sum of the K envs' rollout gradients
(tests/test_batched_rollout.py, tests/test_envs_per_worker.py).
Self-imitation (``self_imitation``) is a component
(:mod:`a3c_core.train.sil`) fed after each update.

The env calls go through an :class:`~a3c_core.train.env_guard.EnvGuard`
(:mod:`a3c_core.train.env_guard`, ``worker.guard``): it times them for the
step watchdog (:mod:`a3c_core.train.watchdog`) and owns the restart policy
(``remake_env``): an env whose ``step`` or ``reset`` raises (a crashed
ViZDoom engine, a dead env process, any exception) is rebuilt in place, up
to ``env_restarts`` times in any hour, after which the exception
propagates as it does without a factory.  What a failure does to the
rollout is the worker's: the row's episode is dropped (not reported), that
row's LSTM state restarts at zeros and the other K - 1 rows are not
touched.  The rows it played in this rollout still count: the ones before
the failed step form a segment cut as ``t_max`` cuts one, bootstrapped from
V(s_t) (the value the tick's forward recorded for the observation the
failed step was given); the failed step's own row, which has no outcome,
is a one-row segment whose return is its own value (reward 0, bootstrap
V(s_t) / gamma): no advantage and no value error, so it adds no gradient
beyond its entropy term.
"""
from __future__ import annotations

import threading
from time import perf_counter
from dataclasses import dataclass

import numpy as np

from a3c_core._fpenv import flush_denormals
from a3c_core.sampling import UniformBlocks, sample_categorical, sample_rows
from a3c_core.train.env_guard import RESTART_WINDOW, EnvGuard, RolloutAborted
from a3c_core.train.merge import MergeSwitch
from a3c_core.train.segments import SegmentTargets
from a3c_core.train.sil import SelfImitation
from a3c_core.train.store import LossStats, Store, ThreadStore

__all__ = ["RolloutSettings", "LossStats", "Store", "ThreadStore", "Worker", "RolloutAborted",
           "RESTART_WINDOW"]


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
        remake_env, env_restarts, on_env_restart: the restart policy, the
            :class:`~a3c_core.train.env_guard.EnvGuard`'s ``remake_env``,
            ``limit`` (per :data:`RESTART_WINDOW` seconds) and ``on_restart``.
    """

    #: rollouts' worth of uniforms drawn per rng call (:class:`~a3c_core.sampling.UniformBlocks`)
    UNIFORM_BLOCK = 64

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
        #: the envs' calls and restarts (``guard.envs`` is ``self.envs``)
        self.guard = EnvGuard(wid, envs, self.stats, remake_env, env_restarts, on_env_restart)
        T = s.t_max
        R = T * K
        obs_shape = tuple(pipeline.net_obs_shape)
        # rollout rows, time-major (row t*K + k: tick t of env k)
        self.actions = np.zeros(R, np.int64)
        self.values = np.zeros(R, np.float32)
        self.raw_rewards = np.zeros(R, np.float64)
        #: returns and advantages per segment, the learning rewards, the running returns
        self.targets = SegmentTargets(s, store, K, fused_targets)
        # K = 1: one compiled call per step (Network.actor) where the network has one
        self.actor = (net.actor(pipeline, self.actions, self.values)
                      if K == 1 and fused_act and hasattr(net, "actor") else None)
        #: the rollouts' uniforms for the sampler: ``uniforms.take(rng)``
        self.uniforms = UniformBlocks(R, self.UNIFORM_BLOCK)
        # per env: the raw frame the next tick preprocesses (None: its input
        # is already in obs_buf[0] / _next_obs[k]), the episode's figures
        self._frames = [None] * K
        self._started = [False] * K
        self.ep_returns = [0.0] * K
        self.ep_lengths = [0] * K
        #: K = 1: the LSTM state (h, c) the next rollout starts from; K > 1:
        #: ``(h, c)`` of ``(K, H)`` rows
        self.state = None
        self.obs_buf = np.zeros((T + 1,) + obs_shape, net.dtype)   # K = 1's inputs
        self._obs_rows = list(self.obs_buf)
        self._next_obs = np.zeros((K,) + obs_shape, net.dtype)     # K > 1: bootstrap inputs
        self._has_next = False
        self._reset = np.zeros(K, np.bool_)
        self._a_tick = np.zeros(K, np.int64)
        self._fused_sync = bool(getattr(store, "syncs_on_apply", False))
        self._fresh = False
        self.sil = (SelfImitation(net, s, store.target_stats(), K, rng, self.stats)
                    if s.self_imitation else None)
        #: K = 1: rollouts run on into the next episode (merge_below's switch)
        self.merging = False
        self.switch = MergeSwitch(s.merge_below, s.t_max, s.merge_window)

    @property
    def env(self):
        """Env 0 (K = 1: the worker's env)."""
        return self.envs[0]

    @property
    def stopping(self):
        """The stop event while the worker stops (:attr:`EnvGuard.stopping`)."""
        return self.guard.stopping

    @stopping.setter
    def stopping(self, event):
        self.guard.stopping = event

    def sil_keep(self, obs, actions, raw_rewards) -> bool:
        """Offer a finished episode to self-imitation (:meth:`SelfImitation.keep`)."""
        if self.sil is None:
            raise RuntimeError("Worker.sil_keep: self_imitation is off for this worker")
        return self.sil.keep(obs, actions, raw_rewards)

    def sil_replay(self, n_played):
        """Self-imitation updates worth ``n_played`` rows (:meth:`SelfImitation.replay`)."""
        if self.sil is not None:
            self.sil.replay(n_played, self._apply_grads)

    # -- episodes and env failures ----------------------------------------------
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
                self.merging = self.switch.update(self.ep_lengths[k], self.merging)
            self.ep_returns[k], self.ep_lengths[k] = 0.0, 0
        return self._reset_env(k)

    def mean_episode_length(self):
        """Mean length of the episodes in the switch's window (None before one ended)."""
        return self.switch.mean()

    def _reset_env(self, k):
        """``envs[k].reset()``; an env whose reset raises is rebuilt."""
        try:
            return self.guard.reset(k)
        except Exception as exc:  # noqa: BLE001 - any failure of the env: rebuilt or raised
            return self._rebuild(k, exc, "reset")

    def _rebuild(self, k, exc, during):
        """Env ``k`` failed: a new env (:meth:`EnvGuard.restart`), its first
        frame returned; the dropped episode's figures restart at zero."""
        frame = self.guard.restart(k, exc, during)
        self.ep_returns[k], self.ep_lengths[k] = 0.0, 0
        return frame

    def _step_failed(self, k, t, exc, segs, dropped):
        """Env ``k``'s step at tick ``t`` raised ``exc``: close its segment
        (module docstring: the rows before it bootstrap from V(s_t); the
        failed row is a one-row segment whose return is its own value), drop
        its episode and rebuild the env; returns the new env's first frame."""
        i = t * self.n_envs + k
        self.raw_rewards[i] = 0.0
        v = float(self.values[i])
        start = segs[k][-1][0] if segs[k] else 0
        if t > start:
            segs[k].append((t, v, False))
        gamma = float(self.s.gamma)
        segs[k].append((t + 1, v / gamma if gamma > 0 else 0.0, True))
        dropped[k].append(t + 1)
        return self._rebuild(k, exc, "step")

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

    def _bootstrap(self, n, segs, ended_last):
        """Step 3 for the segments still open after ``n`` ticks: each
        bootstraps from V(s_n) of its env's pending observation (K > 1:
        preprocessed into ``_next_obs``, where the next rollout's first tick
        takes it from); keeps the state the next rollout starts from."""
        K, net, frames, reset = self.n_envs, self.net, self._frames, self._reset
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
            return
        st = net.recorded_state()
        for k in range(K):
            self.pipe(frames[k], self._next_obs[k])
            frames[k] = None
        self._has_next = True
        _, boots, _ = net.step_batch(self._next_obs, st)
        if st is not None:
            st[0][reset] = 0
            st[1][reset] = 0
        self.state = st
        for k in range(K):
            if not reset[k]:
                segs[k].append((n, float(boots[k]), False))

    def _truncated_value(self, k, frame):
        """V of the last observation of env ``k``'s episode that a time
        limit cut at this tick (``truncation_bootstrap``), unrecorded."""
        obs = np.empty(self.net.obs_shape, self.net.dtype)
        self.pipe(frame, obs)
        st = self.net.recorded_state()
        if self.n_envs > 1:
            st = None if st is None else (st[0][k], st[1][k])
        elif self.actor is not None:
            return self.actor.value(obs, st)
        return self.net.step(obs, st)[1]

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
        u = self.uniforms.take(self.rng)    # t_max * K uniforms, one rng stream
        frames, raw, step = self._frames, self.raw_rewards, self.guard.step
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
        segs = [[] for _ in range(K)]       # per env: (end tick, bootstrap, ended)
        dropped = [[] for _ in range(K)]    # per env: ends of episodes a failed step dropped
        reset = self._reset
        reset[:] = False
        n = T
        term = trunc = False
        ended_last = []                     # paper rollouts: envs reset after the update
        st_ = self.stats
        self.guard.t_env = 0.0
        t_rollout = perf_counter()
        t_fwd = 0.0
        for t in range(T):
            c0 = perf_counter()
            acts = self._forward(t, u, state, reset if K > 1 else None)
            t_fwd += perf_counter() - c0
            state = None
            reset[:] = False
            r0 = t * K
            for k in range(K):
                try:
                    frame, r, term_k, trunc_k = step(k, acts if K == 1 else int(acts[k]))
                except Exception as exc:  # noqa: BLE001 - rebuilt in place, or raised
                    frames[k] = self._step_failed(k, t, exc, segs, dropped)
                    reset[k] = True
                    if K == 1:
                        state = net.initial_state()
                    if k == 0:
                        term = trunc = False
                    continue
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
                frames[k] = self._episode_over(k)
                reset[k] = True
                if K == 1:
                    state = net.initial_state()
            # (a paper rollout, not across episodes, ends with a failed step too)
            if K == 1 and (ended_last or (reset[0] and (t + 1 >= k_min or not across))):
                n = t + 1
                break
        # bootstrap each env's open segment from V(s_n)
        c0 = perf_counter()
        self._bootstrap(n, segs, ended_last)
        t_fwd += perf_counter() - c0
        # the loss: returns and advantages per segment, one backward, one apply
        ret, adv = self.targets(raw, self.values, n, segs)
        applied = self._apply_update(n * K, ret, adv)
        if self.sil is not None:
            self.sil.record_envs(net.recorded_obs, self.actions, raw, n, segs, dropped)
            self.sil.replay(n * K, self._apply_grads)
        self.store.add_steps(n * K)
        for k in ended_last:
            frames[k] = self._episode_over(k)
            self._started[k] = True
            self.state = net.initial_state()
        end = perf_counter()
        st_.t_env += self.guard.t_env
        st_.t_forward += t_fwd
        st_.t_rollout += end - t_rollout
        st_.agent_steps += n * K
        return n * K, term, trunc, applied

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
        """The A3C update of the rollout's ``m`` recorded rows: the backward
        of the policy, value and entropy loss, then one clipped apply."""
        s, st = self.s, self.stats
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
