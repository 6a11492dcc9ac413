"""Self-imitation learning (Oh et al. 2018) as a worker component.

A :class:`SelfImitation` keeps each of a worker's envs' open episode (the
network's input rows, the actions, the raw rewards, copied after each
update), offers every finished episode to the worker's best
:attr:`SelfImitation.EPISODES` by return, and replays them: a replayed
episode runs from the zero LSTM state through a fork of the worker's
network; where its return R beats the value V, the A3C loss with returns
max(R, V), advantages max(R - V, 0) (scaled as the rollout's are) and no
entropy term, applied through the worker's store like a rollout's update.
The worker calls :meth:`record_envs` after each update and :meth:`replay`
with the rows it played.
"""
from __future__ import annotations

import numpy as np

from a3c_core.core import discounted_returns
from a3c_core.core.normalize import ST_SCALE

__all__ = ["SelfImitation"]


class SelfImitation:
    """Self-imitation buffers and replays of one worker.

    Args:
        net: the worker's network (replays run through a fork of it: the
            same parameters, its own gradients and scratch).
        settings: the worker's :class:`~a3c_core.train.worker.RolloutSettings`.
        scales: the store's ``target_stats()`` (the reward and advantage
            normalizers' arrays; their current scales apply to the replays).
        n_envs: the worker's envs (one open episode each).
        rng: the worker's ``numpy.random.Generator`` (picks the replays).
        stats: the worker's LossStats (``sil_replays``, ``sil_updates``).
    """

    #: whole episodes a worker keeps (its best by return)
    EPISODES = 16
    #: the most observation rows they may hold together (memory: rows x obs size)
    ROWS = 2048
    #: value-loss weight of a self-imitation update (Oh et al. 2018's beta_sil)
    VALUE_COEF = 0.01

    def __init__(self, net, settings, scales, n_envs, rng, stats):
        if scales is None:
            raise ValueError("Worker: self_imitation needs a store that exposes its "
                             "normalizers' arrays (store.target_stats())")
        self.s = settings
        self.scales = scales
        self.rng = rng
        self.stats = stats
        self.net = net.fork()
        self.row_shape = tuple(net.obs_shape)
        self.dtype = net.dtype
        self.n_actions = net.n_actions
        self.open = [[] for _ in range(n_envs)]      # chunks (obs, actions, raw rewards)
        self.open_rows = [0] * n_envs                # -1: too long to keep
        self.buf = []          # (return, obs, actions, raw rewards), best first
        self.credit = 0.0

    def record(self, k, obs, actions, raw, ends, dropped=()):
        """Env ``k``'s rows of one rollout, in time order (``obs`` ``(n,
        *obs_shape)``, ``actions`` ``(n,)``, ``raw`` ``(n,)``) and the rows
        after which its episodes ended (``ends``, increasing): copied into
        its open episode; each ended episode is offered to the buffer, but
        one whose end is in ``dropped`` (its env failed and was rebuilt) is
        discarded."""
        a0 = 0
        for b0 in list(ends) + [len(actions)]:
            rows = self.open_rows[k]
            if rows >= 0 and b0 > a0:
                if rows + b0 - a0 > self.ROWS:
                    self.open[k] = []
                    self.open_rows[k] = -1
                else:
                    self.open[k].append((np.array(obs[a0:b0]), np.array(actions[a0:b0]),
                                         np.array(raw[a0:b0], np.float64)))
                    self.open_rows[k] = rows + b0 - a0
            if b0 in dropped:
                self.open[k] = []
                self.open_rows[k] = 0
            elif b0 in ends:
                self._close(k)
            a0 = b0

    def record_envs(self, obs, actions, raw, n, segs, dropped):
        """A rollout of ``n`` ticks to :meth:`record`, env by env: ``obs``
        (the network's recorded input rows), ``actions`` and ``raw`` (the raw
        rewards) time-major (row ``t*K + k``); ``segs[k]`` env k's segments
        ``(end tick, bootstrap, ended)``, ``dropped[k]`` the ends of its
        episodes that a failed step dropped."""
        K = len(self.open)
        rows = obs.reshape((n, K) + obs.shape[1:])
        acts = actions[:n * K].reshape(n, K)
        raw = raw[:n * K].reshape(n, K)
        for k in range(K):
            ends = [end for end, _, ended in segs[k] if ended]
            self.record(k, rows[:, k], acts[:, k], raw[:, k], ends, dropped[k])

    def _close(self, k):
        chunks = self.open[k]
        self.open[k] = []
        self.open_rows[k] = 0
        if chunks:
            self.keep(np.concatenate([c[0] for c in chunks]),
                      np.concatenate([c[1] for c in chunks]),
                      np.concatenate([c[2] for c in chunks]))

    def keep(self, obs, actions, raw_rewards) -> bool:
        """Offer one finished episode (the network's input rows, the actions
        taken, the raw rewards); it is kept if its return is among the best
        :attr:`EPISODES` and it fits :attr:`ROWS`.  The arrays are kept as
        given, not copied.  True if kept; ValueError for rows the replay
        could not use."""
        raw = np.asarray(raw_rewards)
        if not (len(obs) == len(actions) == raw.size):
            raise ValueError(f"Worker.sil_keep: {len(obs)} observation rows, {len(actions)} "
                             f"actions and {raw.size} rewards; they must match")
        row = self.row_shape
        if not isinstance(obs, np.ndarray) or obs.shape[1:] != row or obs.dtype != self.dtype:
            got = (f"{obs.shape[1:]} {obs.dtype}" if isinstance(obs, np.ndarray)
                   else type(obs).__name__)
            raise ValueError(f"Worker.sil_keep: observation rows must be a {row} "
                             f"{self.dtype} array (the network's input rows); got {got}")
        acts = np.asarray(actions)
        n_act = self.n_actions
        if acts.size and (acts.dtype.kind not in "iu" or acts.min() < 0 or acts.max() >= n_act):
            span = f" in [{acts.min()}, {acts.max()}]" if acts.dtype.kind in "biuf" else ""
            raise ValueError(f"Worker.sil_keep: actions must be integers in [0, {n_act}); got "
                             f"{acts.dtype}{span}")
        if not np.isfinite(raw).all():
            raise ValueError("Worker.sil_keep: the rewards hold a NaN or an infinity")
        ret = float(raw.sum())
        buf = self.buf
        if raw.size > self.ROWS or (len(buf) >= self.EPISODES and ret <= buf[-1][0]):
            return False
        ep = (ret, obs, actions, raw)
        i = len(buf)
        while i and buf[i - 1][0] < ret:
            i -= 1
        buf.insert(i, ep)
        rows = sum(len(e[2]) for e in buf)
        while len(buf) > self.EPISODES or rows > self.ROWS:
            rows -= len(buf.pop()[2])
        return any(e is ep for e in buf)

    def targets(self, raw):
        """An episode's discounted returns in the learning rewards' current scale."""
        s = self.s
        r = raw
        if s.reward_clip > 0:
            r = np.clip(r, -s.reward_clip, s.reward_clip)
        if s.reward_scale is not None:
            r = r * s.reward_scale
        else:
            st = self.scales[0]
            scale = float(st[ST_SCALE]) if st.size else 1.0
            r = np.clip(r * scale, -s.norm_clip, s.norm_clip)
        # float32, as a rollout's targets (the recursion runs in float64)
        return discounted_returns(r.astype(np.float32), 0.0, float(s.gamma)).astype(np.float64)

    def replay(self, n_played, apply):
        """Updates worth ``n_played`` replayed rows (see the module
        docstring); ``apply(grads) -> applied`` sends a gradient to the
        store.  Returns True if any update was applied."""
        buf = self.buf
        applied_any = False
        if not buf:
            return applied_any
        s, net = self.s, self.net
        self.credit += n_played
        while self.credit > 0:
            _, obs, acts, raw = buf[int(self.rng.integers(len(buf)))]
            self.credit -= len(acts)
            self.stats.sil_replays += 1
            R = self.targets(raw)
            net.record_rollout(obs, None)        # one batched forward
            v = net.recorded_values().astype(np.float64)
            adv = np.maximum(R - v, 0.0)
            if not adv.any():
                continue
            if s.normalize_advantages:
                st = self.scales[2]
                if st.size:
                    adv *= float(st[ST_SCALE])
            net.rollout_grad(acts, np.maximum(R, v), adv, value_coef=self.VALUE_COEF,
                             entropy_beta=0.0)
            applied_any = apply(net.grads) or applied_any
            self.stats.sil_updates += 1
        return applied_any
