"""One A3C worker: rollout collection and update, behind a small shared-state seam.

A :class:`Worker` owns one env or several (``envs_per_worker``), a local
network (params, grads, an LSTM state per env), its preprocessing, its RNG
and its rollout buffers.  Everything it shares with
other workers goes through a :class:`Store` with these operations:

* ``pull(local_params)`` - copy the global parameters into the local ones;
* ``apply(grads, max_grad_norm, offset) -> (norm, applied)`` - clip and apply
  a gradient to the global parameters and optimizer statistics; a store whose
  ``syncs_on_apply`` is True also takes ``local=`` (the worker's params) and
  refreshes it with the new global values in the same pass, and the worker
  then skips the next ``pull`` (one sweep over the arrays instead of two);
* ``add_steps(n) -> total`` - count agent steps; ``steps`` reads the total;
* ``record_episode(wid, raw_return, length, intrinsic=None, end=None)`` -
  report a finished episode (``end``: the env's
  :attr:`~a3c_core.envs.base.Env.episode_end`, how it ended);
* ``reward_scale(returns) -> scale`` - merge the rollout's discounted returns
  into the running statistics and return the current reward scale (only
  called when rewards are normalized, see :mod:`a3c_core.core.normalize`);
* ``advantage_scale(advantages) -> scale`` - the same for the advantages
  (only called when ``normalize_advantages`` is set);

:class:`ThreadStore` implements it in-process for worker threads (Hogwild on
one :class:`~a3c_core.core.SharedState`); another backend (a process, a Ray
node) provides its own, and the rollout code stays the same.

One rollout (:meth:`Worker.rollout`):

1. pull the global parameters (the rollout acts with fixed local params),
   unless the previous update already refreshed them (``syncs_on_apply``);
2. play up to ``t_max`` steps: ``net.step`` -> sample -> ``env.step`` (with
   the network's :class:`~a3c_core.nn.network.Actor`, where it has one: the
   frame's preprocessing, the recorded step and the sampling in one compiled
   call, bit for bit the same); an
   episode that ends before the rollout holds ``min_steps`` steps is followed
   by the next one in the same rollout (LSTM state reset; the trainer's
   default, 0, gives the A3C paper's rollouts, which end with their
   episode; ``cross_episode``: always ``t_max`` steps; ``merge_below``:
   ``t_max // 2`` while the worker's recent episodes are short, see
   :meth:`Worker._track_length`);
3. bootstrap from ``V(s_n)`` when the rollout (or an episode's part of it)
   was cut by ``t_max``, or by a time limit and ``bootstrap_truncated`` is
   set; 0 after a terminal state;
4. returns and GAE advantages, ``net.rollout_grad`` (the backward pass only,
   BPTT from the rollout's first LSTM state, over the activations the steps
   recorded with ``record=True``: the gradient of ``loss_and_grad`` without
   recomputing the forward), ``store.apply``.

The rollout keeps ``obs_buf[n]`` (the observation after the last step) and
moves it to ``obs_buf[0]`` for the next rollout of the same episode.

A worker with K envs plays steps 2-3 for each env in turn, with the same
local parameters: env k's part is recorded from the row where env k-1's
ended, from env k's own LSTM state (a new segment: no gradient flows between
envs), and bootstraps on its own.  Step 4 then runs once over all the rows:
the returns per segment (each env's running return for the normalizer its
own), one backward, one ``store.apply``.  The update is the sum of the K
parts' gradients (tests/test_envs_per_worker.py), and its fixed costs (the
Python between the kernels, the clip and apply passes over the flat arrays)
are paid once per K rollouts' steps.  Each env's fields (``env``,
``state``, ``obs_buf``, ``ep_return``... :attr:`Worker.ENV_FIELDS`) are the
worker's own while it plays that env (:meth:`Worker._use`).

Exploration bonus (``RolloutSettings.exploration = "rnd"``, off by default;
:mod:`a3c_core.nn.rnd`): between steps 3 and 4 the worker runs the RND
target and its local copy of the predictor over the rollout's recorded
observation rows (and the observation each cut part bootstraps from), pays
each step the normalized novelty of its next observation
(:func:`~a3c_core.nn.rnd.rollout_bonus`; the running intrinsic return per
env is non-episodic) and adds it to the learning reward after the
extrinsic reward's clip and scale, before GAE (the targets then take the
separate calls, :meth:`Worker._targets_separate`).  After the policy's
``store.apply``, ``store.explore_apply`` applies the predictor's gradient
to the shared predictor the same way (Hogwild, clipped, the local copy
refreshed in the sweep).  Finished episodes are reported with their mean
bonus per step (``record_episode(..., intrinsic=)``).

Self-imitation (``RolloutSettings.self_imitation``, off by default; Oh et
al. 2018): after the update the rollout's rows (input, action, raw reward)
join each env's open episode; a finished one joins the worker's best
``SIL_EPISODES`` by return, and the worker replays a row of them per row
played (:meth:`Worker.sil_replay`), each through ``store.apply`` as well.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from a3c_core._fpenv import flush_denormals
from a3c_core.core import discounted_returns, gae
from a3c_core.core.normalize import ST_SCALE, clip_into, running_returns, scale_clip_into
from a3c_core.core.targets import BAD_ADVANTAGES, BAD_RETURNS, rollout_targets
from a3c_core.nn.rnd import rollout_bonus
from a3c_core.sampling import sample_categorical

__all__ = ["RolloutSettings", "LossStats", "ExploreStats", "Store", "ThreadStore", "Worker"]


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
    bootstrap_truncated: bool = True
    #: divide advantages by their running RMS (see core.normalize.AdvantageNormalizer)
    normalize_advantages: bool = False
    #: > 0: a rollout that reaches an episode's end with fewer than this many
    #: steps runs on into the next episode (LSTM state reset, no gradient
    #: across) and ends at the first episode end from this many steps on (or
    #: at t_max; min_steps = t_max: every rollout has t_max steps); 0: every
    #: rollout ends with its episode.
    min_steps: int = 0
    #: > 0 with min_steps 0: while the worker's last
    #: ``merge_window`` episodes average fewer than this many steps, its
    #: rollouts run on into the next episode as with min_steps = t_max // 2,
    #: and end with their episode again once those episodes average more
    #: than t_max steps (see Worker.merging); 0 = off
    merge_below: float = 0.0
    merge_window: int = 1000
    #: "rnd": add the Random Network Distillation bonus to the learning
    #: rewards (the store's ``explore``, see a3c_core.nn.rnd); "none": off
    exploration: str = "none"
    #: the bonus's weight (it is normalized by the intrinsic return's std)
    exploration_scale: float = 0.5
    #: self-imitation learning (Oh et al. 2018): each worker keeps its best
    #: whole episodes and replays them through the policy where their return
    #: beats the value (see Worker.sil_replay); False = off
    self_imitation: bool = False


class LossStats:
    """Running sums of one worker's update statistics (read by the monitor).

    Fields are plain floats written by the worker thread only; the monitor
    reads them without a lock (a torn *set* of fields only mixes two adjacent
    updates, which is fine for a progress line).
    """

    FIELDS = ("policy_loss", "value_loss", "entropy", "grad_norm", "updates", "skipped",
              "sil_replays", "sil_updates")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, 0.0)

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in self.FIELDS], np.float64)


class ExploreStats(LossStats):
    """Running sums of one worker's exploration bonus (RND): the predictor's
    loss, the mean bonus per step added to the rewards and the mean raw
    novelty, per update; ``updates`` counts them."""

    FIELDS = ("rnd_loss", "intrinsic", "novelty", "updates")


class Store:
    """The shared-state seam a :class:`Worker` talks to (see the module docstring)."""

    steps: int
    #: apply(..., local=params) also refreshes the worker's params (see above)
    syncs_on_apply = False
    #: the shared RND state (a3c_core.nn.rnd.RNDShared) with exploration "rnd", else None
    explore = None

    def pull(self, local_params) -> None:
        raise NotImplementedError

    def apply(self, grads, max_grad_norm, offset=0):
        raise NotImplementedError

    def add_steps(self, n) -> int:
        raise NotImplementedError

    def record_episode(self, wid, raw_return, length, intrinsic=None, end=None) -> None:
        raise NotImplementedError

    def reward_scale(self, returns) -> float:
        raise NotImplementedError

    def advantage_scale(self, advantages) -> float:
        raise NotImplementedError

    def explore_apply(self, grads, max_grad_norm, offset=0, local=None):
        """:meth:`apply` for the RND predictor's gradient (``explore.shared``)."""
        raise NotImplementedError

    def intrinsic_scale(self, returns) -> float:
        """:meth:`reward_scale` for the intrinsic returns (``explore.normalizer``)."""
        raise NotImplementedError

    def target_stats(self):
        """``(reward stats, reward params, advantage stats, advantage
        params)``: the shared normalizers' arrays, which a worker merges into
        from its own compiled call (``core.targets.rollout_targets``); an
        absent normalizer gives two empty arrays.  None (the default): the
        worker goes through :meth:`reward_scale` and :meth:`advantage_scale`."""
        return None


class ThreadStore(Store):
    """In-process store: Hogwild on a :class:`~a3c_core.core.SharedState`.

    ``normalizer`` (a :class:`~a3c_core.core.normalize.ReturnNormalizer` or
    None) provides the reward scale; ``on_episode(wid, ret, length, index,
    intrinsic=, end=)`` is called for every finished episode.
    ``consecutive_skips`` counts non-finite updates in a row (reset by an
    applied one).
    """

    syncs_on_apply = True

    def __init__(self, shared, normalizer=None, on_episode=None, adv_normalizer=None,
                 explore=None):
        self.shared = shared
        self.normalizer = normalizer
        self.adv_normalizer = adv_normalizer
        self.explore = explore
        self.on_episode = on_episode
        self.consecutive_skips = 0
        self._lock = threading.Lock()
        #: held while an episode is counted and reported (``on_episode``): a
        #: checkpoint that reads the counters under it never counts an episode
        #: whose log row is not written yet
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

    def record_episode(self, wid, raw_return, length, intrinsic=None, end=None):
        with self.episode_lock:
            idx = self.shared.add_episodes(1)
            if self.on_episode is not None:
                # intrinsic: with exploration on, the episode's mean bonus per step
                self.on_episode(wid, raw_return, length, idx, intrinsic=intrinsic, end=end)

    def reward_scale(self, returns):
        return self.normalizer.update(returns)

    def advantage_scale(self, advantages):
        return self.adv_normalizer.update(advantages)

    def explore_apply(self, grads, max_grad_norm, offset=0, local=None):
        return self.explore.shared.apply(grads, max_grad_norm, offset=offset, sync_to=local)

    def intrinsic_scale(self, returns):
        return self.explore.normalizer.update(returns)

    def target_stats(self):
        out = []
        for norm in (self.normalizer, self.adv_normalizer):
            if norm is None:
                out += [_NO_STATS, _NO_STATS]
            elif isinstance(getattr(norm, "stats", None), np.ndarray):
                out += [norm.stats, norm.params]
            else:                       # a normalizer of another kind: its update()
                return None
        return tuple(out)


_NO_STATS = np.zeros(0)


class Worker:
    """Rollouts and updates of one A3C worker (see the module docstring).

    Args:
        wid: worker index (for episode records and the sweep offset).
        env: an :class:`~a3c_core.envs.Env`, or a list of them: each
            rollout plays each env in turn and one update covers them all
            (see the module docstring).
        net: this worker's own :class:`~a3c_core.nn.network.Network`.
        pipeline: :class:`~a3c_core.obs.ObsPipeline` raw obs -> net input.
        store: the shared-state seam.
        settings: :class:`RolloutSettings`.
        rng: ``numpy.random.Generator`` for action sampling.
        offset: start index of this worker's optimizer sweep (see core.optim).
        fused_act: step through the network's :class:`~a3c_core.nn.network.Actor`
            where it has one (the same results; False: the separate calls).
        fused_targets: compute an update's rewards, returns and advantages in
            one compiled call (:func:`~a3c_core.core.targets.rollout_targets`)
            where the store exposes its normalizers' arrays (the same
            results; False: the separate calls).
    """

    def __init__(self, wid, env, net, pipeline, store, settings, rng, *, offset=0,
                 fused_act=True, fused_targets=True):
        self.wid = wid
        envs = list(env) if isinstance(env, (list, tuple)) else [env]
        if not envs:
            raise ValueError("Worker: needs at least one env")
        #: the worker's envs; each rollout plays each of them in turn (one
        #: part of up to t_max steps each) and one update covers all the parts
        self.envs = envs
        self.n_envs = len(envs)
        self.env = envs[0]
        self.net = net
        if hasattr(net, "single_step_kernel"):
            net.single_step_kernel = True     # one compiled step kernel (nn.network)
        self.pipe = pipeline
        self.store = store
        self.s = settings
        self.rng = rng
        self.offset = int(offset)
        self.stats = LossStats()
        #: rows of one rollout: t_max per env
        self._rows = T = settings.t_max * self.n_envs
        self.obs_buf = np.zeros((settings.t_max + 1,) + tuple(pipeline.net_obs_shape), net.dtype)
        # obs_buf's rows as views made once (the fused step takes row t each step)
        self._obs_rows = list(self.obs_buf)
        self.actions = np.zeros(T, np.int64)
        self.rewards = np.zeros(T, np.float32)   # rewards used for learning
        self.raw_rewards = np.zeros(T, np.float64)
        self._clip_buf = np.zeros(T, np.float64)       # raw rewards clipped to reward_clip
        self.values = np.zeros(T, np.float32)
        # the update's targets (core.targets.rollout_targets): segments
        # (end, bootstrap value, episode ended), float64 scratch, float32 results
        self._seg_end = np.zeros(T, np.int64)
        self._seg_boot = np.zeros(T, np.float64)
        self._seg_ended = np.zeros(T, np.bool_)
        self._seg_acc = np.zeros(T, np.float64)    # running return in (NaN: continue) / out
        self._seg_raw = np.zeros(T, np.float64)    # raw reward sum per segment
        self._last_seg = [0] * self.n_envs          # each env's last segment in a rollout
        self._rets_buf = np.zeros(T, np.float64)
        self._adv64_buf = np.zeros(T, np.float64)
        self._ret = np.zeros(T, np.float32)
        self._adv = np.zeros(T, np.float32)
        #: the store's normalizer arrays for the one-call targets, or None
        #: (the separate calls through the store; fused_targets=False)
        self._stats = store.target_stats() if fused_targets else None
        #: held around the one-call targets: a store whose normalizers other
        #: processes merge into too (train.procs) gives its lock; threads need
        #: none (the call holds the GIL)
        self._targets_lock = getattr(store, "targets_lock", None) or contextlib.nullcontext()
        if self._stats is not None and (settings.reward_scale is None) != (self._stats[0].size > 0):
            self._stats = None          # settings and store disagree: the separate path's errors
        if self._stats is not None and settings.normalize_advantages and self._stats[2].size == 0:
            self._stats = None
        #: each agent step in one compiled call (preprocess, recorded step,
        #: sampling: Network.actor), or None (that network or pipeline has none)
        self.actor = (net.actor(pipeline, self.actions, self.values)
                      if fused_act and hasattr(net, "actor") else None)
        # the rollouts' uniforms, drawn UNIFORM_BLOCK rollouts at a time: the
        # same stream as one rng.random(t_max) per rollout, one call instead of many
        self._u_buf = np.empty(0)
        self._u_pos = 0
        self._u_rng = None
        self.state = None
        self._frame = None        # (actor) a raw frame the next step preprocesses into obs_buf[0]
        self.ep_return = 0.0
        self.ep_length = 0
        self._ret_acc = 0.0       # running discounted (clipped) return, for the normalizer
        self._started = False
        self._fused_sync = bool(getattr(store, "syncs_on_apply", False))
        self._fresh = False       # net.params already hold the global params (set by apply)
        self._init_explore()
        self._init_sil()
        # the lengths of this worker's last merge_window episodes (merge_below)
        self._lengths = np.zeros(max(int(settings.merge_window), 1), np.int64)
        self._n_lengths = 0
        self._len_sum = 0
        #: rollouts run on into the next episode (merge_below's switch is on)
        self.merging = False
        # env k's own fields (ENV_FIELDS) while another env is the current one
        # (_use); env 0 starts as the current one
        self._cur = 0
        self._slots = [None] + [self._fresh_slot(e) for e in envs[1:]]

    #: the per-env fields of a worker: the env, its LSTM state, the frame or
    #: obs a rollout carries to the next, its episode's running figures
    ENV_FIELDS = ("env", "state", "_frame", "ep_return", "ep_length", "_ret_acc", "_started",
                  "obs_buf", "_obs_rows", "ep_intrinsic")

    def _fresh_slot(self, env):
        obs_buf = np.zeros_like(self.obs_buf)
        return {"env": env, "state": None, "_frame": None, "ep_return": 0.0, "ep_length": 0,
                "_ret_acc": 0.0, "_started": False, "obs_buf": obs_buf,
                "_obs_rows": list(obs_buf), "ep_intrinsic": 0.0}

    # -- exploration bonus (RND) -------------------------------------------------
    def _init_explore(self):
        """With ``exploration = "rnd"``: this worker's RND compute (the shared
        target, a local copy of the predictor; :mod:`a3c_core.nn.rnd`) and
        its per-rollout buffers.  Each env keeps a running NON-episodic
        intrinsic return (``_int_acc[k]``: the paper's intrinsic stream
        ignores episode ends) and the bonus of its episode so far
        (``ep_intrinsic``, reported with the episode as its mean per step)."""
        self.ep_intrinsic = 0.0
        self.rnd = None
        self.explore_stats = None
        if self.s.exploration == "none":
            return
        ex = getattr(self.store, "explore", None)
        if self.s.exploration != "rnd" or ex is None:
            raise ValueError(f"Worker: exploration {self.s.exploration!r} needs a store with "
                             "the shared RND state (store.explore)")
        self.rnd = ex.new_net()
        self.rnd.reserve(self._rows + self.n_envs)
        n_net = max(int(getattr(self.net, "n_params", 0) or 0), 1)
        # the predictor's sweep starts where the policy's does, proportionally
        self._rnd_offset = (self.offset * self.rnd.n_params // n_net) // 16 * 16
        self._rnd_fresh = False
        self._bonus = np.zeros(self._rows, np.float64)
        self._int_acc = [0.0] * self.n_envs
        self._next_obs = np.zeros((self.n_envs,) + self.obs_buf.shape[1:], self.obs_buf.dtype)
        self._rnd_parts = []        # (env k, start row, rows, cut by t_max) of this rollout
        self.explore_stats = ExploreStats()

    def _rnd_part(self, k, off, n, ended):
        """After env ``k``'s part of a rollout (rows ``off .. off+n-1``): where
        its last segment was cut, not ended, ``obs_buf[0]`` holds the
        observation after it (its bootstrap input): keep a copy."""
        if not ended:
            self._next_obs[k] = self.obs_buf[0]
        self._rnd_parts.append((k, off, n, not ended))

    def _rnd_bonus(self, n, n_seg, across):
        """The rollout's bonus per step into ``_bonus[:n]`` (see
        :func:`a3c_core.nn.rnd.rollout_bonus`) and the predictor's gradient;
        each env's current episode is credited with its part's bonus."""
        s = self.s
        seg_ends = self._seg_end[:n_seg].tolist()
        seg_next = [False] * n_seg
        nxt = {}
        spans = []
        accs = []
        last = self._last_seg
        for k, off, m, cut in self._rnd_parts:
            spans.append((off, off + m))
            accs.append(self._int_acc[k])
            if cut:
                j = last[k]
                seg_next[j] = True
                nxt[seg_ends[j]] = self._next_obs[k:k + 1]
        loss = rollout_bonus(self.rnd, self.store.intrinsic_scale, self.net.recorded_obs[:n],
                             nxt, seg_ends, seg_next, spans, accs, float(s.gamma),
                             float(s.exploration_scale), float(s.norm_clip), self._bonus)
        bonus = self._bonus
        # each env's episode so far gets its part's bonus; a part that holds
        # episode ends (rollouts across episodes) credits only its last segment,
        # the running one: the others' episodes were reported while it played
        a0s = [0] + seg_ends[:-1]
        for (k, off, m, cut), acc in zip(self._rnd_parts, accs):
            self._int_acc[k] = acc
            j = last[k]
            part = float(bonus[a0s[j]:seg_ends[j]].sum()) if cut or not across else 0.0
            if k == self._cur:
                self.ep_intrinsic += part
            else:
                self._slots[k]["ep_intrinsic"] += part
        self._rnd_parts.clear()
        st = self.explore_stats
        st.rnd_loss += loss
        st.intrinsic += float(bonus[:n].mean())
        st.novelty += self.rnd.last_novelty
        st.updates += 1

    # -- self-imitation (SIL) ------------------------------------------------
    #: whole episodes a worker keeps for self-imitation (its best by return)
    SIL_EPISODES = 16
    #: the most observation rows they may hold together (memory: rows x obs size)
    SIL_ROWS = 2048
    #: value-loss weight of a self-imitation update (Oh et al. 2018's beta_sil)
    SIL_VALUE_COEF = 0.01

    def _init_sil(self):
        """With ``self_imitation``: the buffers of self-imitation learning
        (Oh et al. 2018).  Every env's rows (the network's input, the action,
        the raw reward) are copied out after each update until its episode
        ends; a finished episode joins the worker's best ``SIL_EPISODES`` by
        return (``SIL_ROWS`` rows at most).  :meth:`sil_replay` replays them
        through a fork of the local network (the same parameters, its own
        gradients and scratch)."""
        self._sil_parts = None
        self.sil_net = None
        if not self.s.self_imitation:
            return
        stats = self.store.target_stats()
        if stats is None:
            raise ValueError("Worker: self_imitation needs a store that exposes its normalizers' "
                             "arrays (store.target_stats())")
        self._sil_scales = stats
        self.sil_net = self.net.fork()
        self._sil_parts = []
        self._sil_open = [[] for _ in range(self.n_envs)]   # chunks (obs, actions, rewards)
        self._sil_open_rows = [0] * self.n_envs             # -1: too long to keep
        self._sil_buf = []          # (return, obs, actions, raw rewards), best first
        self._sil_credit = 0.0

    def _sil_record(self, across):
        """Copy this rollout's rows into each env's open episode; close the
        episodes that ended."""
        obs = self.net.recorded_obs
        ends, ended = self._seg_end, self._seg_ended
        for k, off, j0, j1, part_ended in self._sil_parts:
            a0 = off
            for j in range(j0, j1):
                b0 = int(ends[j])
                rows = self._sil_open_rows[k]
                if rows >= 0 and b0 > a0:
                    if rows + b0 - a0 > self.SIL_ROWS:
                        self._sil_open[k] = []
                        self._sil_open_rows[k] = -1
                    else:
                        self._sil_open[k].append((obs[a0:b0].copy(), self.actions[a0:b0].copy(),
                                                  self.raw_rewards[a0:b0].copy()))
                        self._sil_open_rows[k] = rows + b0 - a0
                if (across and ended[j]) or (part_ended and j == j1 - 1):
                    self._sil_close(k)
                a0 = b0
        self._sil_parts.clear()

    def _sil_close(self, k):
        """Env ``k``'s episode ended: keep it if it is among the best."""
        chunks = self._sil_open[k]
        self._sil_open[k] = []
        self._sil_open_rows[k] = 0
        if chunks:
            self.sil_keep(np.concatenate([c[0] for c in chunks]),
                          np.concatenate([c[1] for c in chunks]),
                          np.concatenate([c[2] for c in chunks]))

    def sil_keep(self, obs, actions, raw_rewards) -> bool:
        """Offer one finished episode (the network's input rows, the actions
        taken, the raw rewards) to the self-imitation buffer; it is kept if
        its return is among the worker's best ``SIL_EPISODES`` and it fits
        ``SIL_ROWS``.  The arrays are kept as given, not copied: the caller
        must not write to them afterwards.  True if kept."""
        if self._sil_parts is None:
            raise RuntimeError("Worker.sil_keep: self_imitation is off for this worker")
        raw = np.asarray(raw_rewards)
        if not (len(obs) == len(actions) == raw.size):
            raise ValueError(f"Worker.sil_keep: {len(obs)} observation rows, {len(actions)} "
                             f"actions and {raw.size} rewards; they must match")
        row = self.obs_buf.shape[1:]
        if not isinstance(obs, np.ndarray) or obs.shape[1:] != row or obs.dtype != self.obs_buf.dtype:
            got = (f"{obs.shape[1:]} {obs.dtype}" if isinstance(obs, np.ndarray)
                   else type(obs).__name__)
            raise ValueError(f"Worker.sil_keep: observation rows must be a {row} "
                             f"{self.obs_buf.dtype} array (the network's input rows); got {got}")
        acts = np.asarray(actions)
        n_act = self.net.n_actions
        if acts.size and (acts.dtype.kind not in "iu" or acts.min() < 0 or acts.max() >= n_act):
            span = f" in [{acts.min()}, {acts.max()}]" if acts.dtype.kind in "biuf" else ""
            raise ValueError(f"Worker.sil_keep: actions must be integers in [0, {n_act}); got "
                             f"{acts.dtype}{span}")
        if not np.isfinite(raw).all():
            raise ValueError("Worker.sil_keep: the rewards hold a NaN or an infinity")
        ret = float(raw.sum())
        buf = self._sil_buf
        if raw.size > self.SIL_ROWS or (len(buf) >= self.SIL_EPISODES and ret <= buf[-1][0]):
            return False
        ep = (ret, obs, actions, raw)
        i = len(buf)
        while i and buf[i - 1][0] < ret:
            i -= 1
        buf.insert(i, ep)
        rows = sum(len(e[2]) for e in buf)
        while len(buf) > self.SIL_EPISODES or rows > self.SIL_ROWS:
            rows -= len(buf.pop()[2])
        return any(e is ep for e in buf)

    def _sil_targets(self, raw):
        """An episode's discounted returns in the learning rewards' current scale."""
        s = self.s
        r = raw
        if s.reward_clip > 0:
            r = np.clip(r, -s.reward_clip, s.reward_clip)
        if s.reward_scale is not None:
            r = r * s.reward_scale
        else:
            st = self._sil_scales[0]
            scale = float(st[ST_SCALE]) if st.size else 1.0
            r = np.clip(r * scale, -s.norm_clip, s.norm_clip)
        # float32, as a rollout's targets (the recursion runs in float64)
        return discounted_returns(r.astype(np.float32), 0.0, float(s.gamma)).astype(np.float64)

    def sil_replay(self, n_played):
        """Self-imitation updates worth ``n_played`` replayed rows: each
        replays one kept episode (picked uniformly) from the zero LSTM state;
        where its return R beats the value V, the A3C loss with returns
        max(R, V), advantages max(R - V, 0) (scaled as the rollout's are)
        and no entropy term; the gradient goes through ``store.apply`` like
        the rollout's."""
        buf = self._sil_buf
        if not buf:
            return
        s, net = self.s, self.sil_net
        self._sil_credit += n_played
        while self._sil_credit > 0:
            _, obs, acts, raw = buf[int(self.rng.integers(len(buf)))]
            self._sil_credit -= len(acts)
            self.stats.sil_replays += 1
            R = self._sil_targets(raw)
            # one batched forward; the backward runs over its rows
            net.record_rollout(obs, None)
            v = net.recorded_values().astype(np.float64)
            adv = np.maximum(R - v, 0.0)
            if not adv.any():
                continue
            if s.normalize_advantages:
                st = self._sil_scales[2]
                if st.size:
                    adv *= float(st[ST_SCALE])
            net.rollout_grad(acts, np.maximum(R, v), adv, value_coef=self.SIL_VALUE_COEF,
                             entropy_beta=0.0)
            if self._fused_sync:
                _, applied = self.store.apply(net.grads, s.max_grad_norm, self.offset,
                                              local=self.net.params)
                self._fresh = self._fresh or applied
            else:
                self.store.apply(net.grads, s.max_grad_norm, self.offset)
            self.stats.sil_updates += 1

    def _use(self, k):
        """Make env ``k`` the current one: its fields become the worker's
        ``env``, ``state``, ``obs_buf``... (the current env's are kept aside)."""
        if k == self._cur:
            return
        slot = self._slots[k]
        old = {}
        for f in self.ENV_FIELDS:
            old[f] = getattr(self, f)
            setattr(self, f, slot[f])
        self._slots[self._cur] = old
        self._slots[k] = None
        self._cur = k

    #: rollouts' worth of uniforms drawn per rng call (see _uniforms)
    UNIFORM_BLOCK = 64

    def _uniforms(self):
        """This rollout's ``t_max`` uniforms per env for the sampler: the
        next ``t_max * n_envs`` values of one ``rng.random`` stream (as a
        call of ``rng.random(t_max * n_envs)`` per rollout would draw them)."""
        T = self._rows
        pos = self._u_pos
        if pos + T > self._u_buf.shape[0] or self._u_rng is not self.rng:
            self._u_rng = self.rng           # (a new rng starts a new block)
            self._u_buf = self.rng.random(T * self.UNIFORM_BLOCK)
            pos = 0
        self._u_pos = pos + T
        return self._u_buf[pos:pos + T]

    # -- episodes -----------------------------------------------------------
    def start_episode(self, slot=0, defer=False):
        """Reset the env and the LSTM state; ``obs_buf[slot]`` = first observation.
        ``defer`` (with an :attr:`actor`): return the raw first frame instead,
        for the next agent step to preprocess inside its own compiled call."""
        frame = self.env.reset()
        self.state = self.net.initial_state()
        self._started = True
        if defer:
            return frame
        self.pipe(frame, self.obs_buf[slot])
        self._frame = None
        return None

    def _end_of_life(self, slot=0, defer=False):
        """After a terminal/truncated step: report the whole game when it is over
        (an env that treats a life loss as terminal keeps ``episode_over``
        False until the game ends), then start the next episode (``defer``:
        see :meth:`start_episode`; returns its frame or None)."""
        if getattr(self.env, "episode_over", True):
            # the score is the task's own: without the env's reward shaping
            # (a shaped Doom env's health_reward or ammo_reward), which only the learning sees
            score = self.ep_return - getattr(self.env, "episode_shaping", 0.0)
            intrinsic = None
            if self.rnd is not None:
                intrinsic = self.ep_intrinsic / max(self.ep_length, 1)
                self.ep_intrinsic = 0.0
            self.store.record_episode(self.wid, score, self.ep_length, intrinsic=intrinsic,
                                      end=getattr(self.env, "episode_end", None))
            if self.s.merge_below > 0:
                self._track_length(self.ep_length)
            self.ep_return, self.ep_length = 0.0, 0
        self._ret_acc = 0.0
        return self.start_episode(slot, defer)

    def _track_length(self, length):
        """``merge_below``'s switch: the mean length of the last ``merge_window``
        episodes turns merging on below ``merge_below`` and off above ``t_max``
        (between the two it stays as it is; nothing changes before the window
        is full)."""
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

    # -- one rollout + update ------------------------------------------------
    def rollout(self):
        """Collect up to ``t_max`` steps from each env and apply one update.

        Returns ``(n, terminated, truncated, applied)``: n the rollout's steps
        over all its envs (with ``cross_episode``: ``t_max`` each); the flags
        are those of the last env's last step.
        """
        if not self._fresh:
            self.store.pull(self.net.params)
        self._fresh = False
        rnd = self.rnd
        if rnd is not None and not self._rnd_fresh:
            self.store.explore.shared.sync_to(rnd.params)
        across = self.s.min_steps > 1 or self.merging
        T = self.s.t_max
        # the steps record their activations (fixed local params during the
        # rollout), so the update runs only the backward pass
        self.net.begin_rollout(self._rows)
        u = self._uniforms()
        K = self.n_envs
        off = n_seg = 0
        ended = []                  # (paper rollouts) envs whose episode ends after the update
        last_seg = self._last_seg
        parts = self._sil_parts
        for k in range(K):
            if K > 1:
                self._use(k)
            uk = u if K == 1 else u[k * T:(k + 1) * T]
            j0 = n_seg
            if across:
                n, term, trunc, n_seg = self._collect_across(off, uk, n_seg)
            else:
                n, term, trunc, n_seg = self._collect(off, uk, n_seg)
                if term or trunc:
                    ended.append(k)
            last_seg[k] = n_seg - 1
            if rnd is not None:
                self._rnd_part(k, off, n, term or trunc)
            if parts is not None:
                parts.append((k, off, j0, n_seg, not across and (term or trunc)))
            off += n
        if rnd is not None:
            self._rnd_bonus(off, n_seg, across)
        ret, adv = self._targets(off, n_seg)
        # each env's running return (normalized rewards) and, for the paper's
        # rollouts, its episode return (across: added per step)
        seg_acc, seg_raw = self._seg_acc, self._seg_raw
        normalized = self.s.reward_scale is None
        for k in range(K):
            j = last_seg[k]
            if k == self._cur:
                if normalized:
                    self._ret_acc = seg_acc.item(j)
                if not across:
                    self.ep_return += seg_raw.item(j)
            else:
                slot = self._slots[k]
                if normalized:
                    slot["_ret_acc"] = seg_acc.item(j)
                if not across:
                    slot["ep_return"] += seg_raw.item(j)
        applied = self._apply_update(off, ret, adv)
        if parts is not None:
            self._sil_record(across)
            self.sil_replay(off)
        self.store.add_steps(off)
        for k in ended:
            if K > 1:
                self._use(k)
            self._frame = self._end_of_life(defer=self.actor is not None)
        return off, term, trunc, applied

    def _collect(self, off, u, j):
        """The current env's part of a rollout, as in the A3C paper: up to
        ``t_max`` steps, ending with its episode, recorded from row ``off``;
        segment ``j``.  Returns ``(n, terminated, truncated, j + 1)``."""
        act = self.actor
        if not self._started:
            self._frame = self.start_episode(defer=act is not None)
        s, net, env, pipe = self.s, self.net, self.env, self.pipe
        obs_buf, actions, raw, values = self.obs_buf, self.actions, self.raw_rewards, self.values
        state = self.state
        self._seg_acc[j] = self._ret_acc
        term = trunc = False
        n = s.t_max
        if act is not None:
            # one compiled call per step: the previous step's frame goes in raw
            # (preprocessed into obs_buf[t] there), the action comes out; a
            # rollout's first frame (an episode's first, or the one the last
            # rollout bootstrapped from) may wait in self._frame.  The env's
            # first row is a new segment when off > 0 (its own state).
            frame, self._frame = self._frame, None
            rows, step = self._obs_rows, act.step_row     # (rows of the input shape)
            for t in range(s.t_max):
                a = step(off + t, rows[t], u[t], frame, state if t == 0 else None)
                frame, r, term, trunc = env.step(a)
                raw[off + t] = r
                if term or trunc:
                    n = t + 1
                    break
            state = net.recorded_state()
        else:
            for t in range(s.t_max):
                probs, v, state = net.step(obs_buf[t], state, record=True)
                a = sample_categorical(probs, u[t])
                obs, r, term, trunc = env.step(a)
                actions[off + t] = a
                raw[off + t] = r
                values[off + t] = v
                pipe(obs, obs_buf[t + 1])
                if term or trunc:
                    n = t + 1
                    break
        self.state = state
        self.ep_length += n
        if term or (trunc and not s.bootstrap_truncated):
            boot = 0.0
        elif act is not None:
            # s_n preprocessed into obs_buf[0] (the recorded rows hold the
            # rollout's inputs), where the next rollout starts from it
            boot = act.value(obs_buf[0], state, frame)
        else:  # cut by t_max, or by a time limit that is bootstrapped (not recorded)
            _, boot, _ = net.step(obs_buf[n], state)
        if not (term or trunc) and act is None:
            obs_buf[0] = obs_buf[n]
        self._seg_end[j] = off + n
        self._seg_boot[j] = boot
        self._seg_ended[j] = False     # (the running return restarts in _end_of_life)
        return n, term, trunc, j + 1

    def _collect_across(self, off, u, j):
        """:meth:`_collect` with ``cross_episode`` (always ``t_max`` steps) or
        ``min_steps`` (at least ``min_steps``, then up to the next episode
        end, at most ``t_max``); segments from ``j`` on.

        An episode that ends at step t is reported and, while the env's part
        holds fewer than ``min_steps`` steps, the next one starts in the same
        rollout (its first observation in ``obs_buf[t + 1]``, the LSTM state
        reset: the network records the reset and its backward lets no
        gradient across it).  Each segment gets its own bootstrap value (0
        after a terminal step) and its own returns and advantages; one update
        covers them all, so an update's fixed costs (the norm and apply
        passes over the flat arrays) are paid once per ``min_steps`` or more
        steps even when episodes are short.
        """
        act = self.actor
        if not self._started:
            self._frame = self.start_episode(defer=act is not None)
        s, net, env, pipe = self.s, self.net, self.env, self.pipe
        obs_buf, actions, raw, values = self.obs_buf, self.actions, self.raw_rewards, self.values
        T = s.t_max
        if s.min_steps > 1:
            k_min = min(s.min_steps, T)
        else:          # merge_below's switch is on
            k_min = max(T // 2, 1)
        state = self.state
        acc0 = self._ret_acc      # (an episode that ends below restarts it)
        segs = []             # (start, end, bootstrap value, episode ended)
        start = 0
        n = T
        term = trunc = False
        frame, self._frame = self._frame, None   # (fused act) the frame obs_buf[t] waits for
        given = state           # (fused act) the state a step starts from, None: the last row's
        rows = self._obs_rows
        for t in range(T):
            if act is not None:
                a = act.step_row(off + t, rows[t], u[t], frame, given)
                given = None
            else:
                probs, v, state = net.step(obs_buf[t], state, record=True)
                a = sample_categorical(probs, u[t])
                actions[off + t] = a
                values[off + t] = v
            obs, r, term, trunc = env.step(a)
            raw[off + t] = r
            self.ep_return += float(r)
            self.ep_length += 1
            if term or trunc:
                boot = 0.0
                if trunc and not term and s.bootstrap_truncated:
                    if act is not None:
                        boot = act.value(obs_buf[t + 1], net.recorded_state(), obs)
                    else:
                        pipe(obs, obs_buf[t + 1])
                        _, boot, _ = net.step(obs_buf[t + 1], state)
                segs.append((start, t + 1, float(boot), True))
                start = t + 1
                # next episode: obs_buf[t + 1] (or, deferred, its frame), new state
                frame = self._end_of_life(slot=t + 1, defer=act is not None)
                state = given = self.state
                if t + 1 >= k_min:
                    n = t + 1
                    break
            elif act is not None:
                frame = obs
            else:
                pipe(obs, obs_buf[t + 1])
        if start < n:
            if act is not None:
                # s_n preprocessed into obs_buf[0], where the next rollout starts
                state = net.recorded_state()
                boot = act.value(obs_buf[0], state, frame)
                frame = None
            else:
                _, boot, _ = net.step(obs_buf[n], state)
            segs.append((start, n, float(boot), False))
        self.state = state
        self._seg_acc[j] = acc0
        for k, (_, b0, boot, ended) in enumerate(segs):
            self._seg_end[j + k] = off + b0
            self._seg_boot[j + k] = boot
            self._seg_ended[j + k] = ended
            if k:
                self._seg_acc[j + k] = np.nan     # (continues the segment before)
        if act is not None:
            self._frame = frame          # an episode's first frame, not preprocessed yet
        else:
            obs_buf[0] = obs_buf[n]
        return n, term, trunc, j + len(segs)

    def _scale_segments(self, segs):
        """Raw rewards -> learning rewards over a rollout's segments (clip,
        then the fixed scale, or the running returns, each segment from its
        ``_seg_acc`` or the one before's, restarting after each episode end,
        merged into the normalizer once, and their scale; ``_seg_acc`` gets
        the running return after each segment)."""
        s = self.s
        T = segs[-1][1]
        r = self._clipped_rewards(T)
        if s.reward_scale is not None:
            np.multiply(r, s.reward_scale, out=self.rewards[:T], casting="unsafe")
            return
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
        scale = self.store.reward_scale(np.concatenate(rets) if len(rets) > 1 else rets[0])
        scale_clip_into(r, float(scale), float(s.norm_clip), self.rewards[:T])

    def _clipped_rewards(self, n):
        """The rollout's raw rewards, clipped to ``reward_clip`` (when > 0)."""
        r = self.raw_rewards[:n]
        c = self.s.reward_clip
        if c > 0:
            out = self._clip_buf[:n]
            clip_into(r, -float(c), float(c), out)
            return out
        return r

    def _targets(self, n, n_seg):
        """``(returns, advantages)`` (float32 ``(n,)`` each) of the rollout's
        first ``n`` steps in ``n_seg`` segments (``_seg_end``/``_seg_boot``/
        ``_seg_ended``, the running returns they start from in ``_seg_acc``):
        rewards clipped and scaled (into :attr:`rewards`; the normalizer
        merged), GAE per segment, advantages normalized.  Afterwards ``_seg_acc[k]`` holds the running
        return after segment k (with normalized rewards) and ``_seg_raw[k]``
        the sum of its raw rewards in time order.  One compiled call
        (core.targets) or, without the store's arrays, the separate calls;
        the same values."""
        s = self.s
        if self._stats is None or self.rnd is not None:
            # (with the bonus: the separate calls, the bonus added to the
            # learning rewards between their scaling and the GAE)
            return self._targets_separate(n, n_seg)
        rn_st, rn_prm, an_st, an_prm = self._stats
        fixed = np.nan if s.reward_scale is None else float(s.reward_scale)
        with self._targets_lock:
            status = rollout_targets(
                self.raw_rewards, n, self._seg_end, self._seg_boot, self._seg_ended, self._seg_acc,
                self._seg_raw, n_seg, float(s.reward_clip), fixed, float(s.gamma),
                float(s.norm_clip), rn_st, rn_prm, self.values, float(s.gae_lambda),
                an_st if s.normalize_advantages else _NO_STATS, an_prm,
                self._clip_buf, self._rets_buf, self._adv64_buf,
                self.rewards, self._ret, self._adv)
        if status == BAD_RETURNS:
            raise ValueError("ReturnNormalizer.update: returns contain NaN or inf")
        if status == BAD_ADVANTAGES:
            raise ValueError("AdvantageNormalizer.update: advantages contain NaN or inf")
        return self._ret[:n], self._adv[:n]

    def _targets_separate(self, n, n_seg):
        """:meth:`_targets` as separate calls (the store's reward_scale and
        advantage_scale)."""
        s = self.s
        segs = []
        a0 = 0
        for k in range(n_seg):
            b0 = int(self._seg_end[k])
            segs.append((a0, b0, float(self._seg_boot[k]), bool(self._seg_ended[k])))
            raw_sum = 0.0
            for x in self.raw_rewards[a0:b0].tolist():   # in time order, as the kernel adds
                raw_sum += x
            self._seg_raw[k] = raw_sum
            a0 = b0
        self._scale_segments(segs)
        if self.rnd is not None:
            # the exploration bonus (normalized, scaled: _rnd_bonus) joins the
            # learning reward before the returns and advantages
            r = self.rewards[:n]
            np.add(r, self._bonus[:n], out=r, casting="unsafe")
        ret = np.empty(n, np.float32)
        adv = np.empty(n, np.float32)
        for a0, b0, boot, _ in segs:
            ret[a0:b0], adv[a0:b0] = gae(self.rewards[a0:b0], self.values[a0:b0], boot,
                                         s.gamma, s.gae_lambda)
        if s.normalize_advantages:
            adv = adv * np.float32(self.store.advantage_scale(adv))
        return ret, adv

    def _apply_update(self, n, ret, adv):
        s, st = self.s, self.stats
        # backward only over the rows the rollout's steps recorded; the same
        # gradient as loss_and_grad(obs_buf[:n], actions[:n], ret, adv, <rollout's first
        # LSTM state>), up to summation order (tests/test_nn_rollout_grad.py)
        loss = self.net.rollout_grad(self.actions[:n], ret, adv, value_coef=s.value_coef,
                                     entropy_beta=s.entropy_beta)
        if self._fused_sync:
            norm, applied = self.store.apply(self.net.grads, s.max_grad_norm, self.offset,
                                             local=self.net.params)
            self._fresh = applied     # a skipped update left net.params as they were
        else:
            norm, applied = self.store.apply(self.net.grads, s.max_grad_norm, self.offset)
        if self.rnd is not None:
            self._rnd_apply()
        if applied:
            st.policy_loss += loss["policy_loss"] / n
            st.value_loss += loss["value_loss"] / n
            st.entropy += loss["entropy"] / n
            st.grad_norm += norm
            st.updates += 1
        else:
            st.skipped += 1
        return applied

    def _rnd_apply(self):
        """The predictor's gradient to the shared predictor (Hogwild, clipped
        like the policy's), refreshing the local copy in the same sweep."""
        rnd, s = self.rnd, self.s
        if self._fused_sync:
            _, applied = self.store.explore_apply(rnd.grads, s.max_grad_norm, self._rnd_offset,
                                                  local=rnd.params)
            self._rnd_fresh = applied
        else:
            self.store.explore_apply(rnd.grads, s.max_grad_norm, self._rnd_offset)

    def run(self, stop: threading.Event, total_steps=0):
        """Rollouts until ``stop`` is set or ``total_steps`` (0 = no limit) is
        reached, with subnormal floats flushed to zero in this thread
        (:func:`a3c_core._fpenv.flush_denormals`; the thread's mode is
        restored on return)."""
        store = self.store
        with flush_denormals():
            while not stop.is_set():
                if total_steps and store.steps >= total_steps:
                    break
                self.rollout()
