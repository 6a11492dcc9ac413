"""Embedding API: a trained policy in a lightweight deployment.

    from a3c_core import Policy
    policy = Policy.load("runs/doom_basic-s0-.../checkpoints/latest.npz")
    state = policy.initial_state()
    action, state = policy.act(raw_frame, state)        # raw env observation

    states = policy.initial_state(64)                   # 64 agents, one call
    actions, states = policy.act_batch(frames, states, done=episode_over)

Only numpy and numba (plus a3c_core's own compiled preprocessing) are needed
at run time: no torch, TF, vizdoom or gymnasium.  ``act`` applies the
preprocessing the agent was trained with (stored in the checkpoint) and runs
the batch-1 forward step; ``act_batch``/``probs_batch`` do the same for N
agents at once, each row with its own recurrent state (see
:meth:`~a3c_core.nn.network.Network.step_batch`).

Observations: the raw env observation (uint8 ``(H, W)``/``(H, W, 3)`` frames,
or a real vector); lists are accepted.  A wrong type, shape or dtype, or a
NaN/inf value, raises :class:`~a3c_core.obs.ObservationError` (a
``ValueError`` and a ``TypeError``) naming what was expected.

Threads: one ``Policy`` may be used from several threads at once.  Each
thread gets its own scratch buffers (``Network.fork()`` where the network
offers it, otherwise calls are serialized by a lock) and its own random
generator; the recurrent state is the caller's, passed in and returned.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from a3c_core.checkpoint import CheckpointError, check_layout, layout_of, load_checkpoint, save_checkpoint
from a3c_core.nn.network import network_from_spec
from a3c_core.obs import ObservationError, ObsPipeline  # noqa: F401 (re-exported)
from a3c_core.sampling import greedy as greedy_action
from a3c_core.sampling import sample_categorical, sample_rows


class Policy:
    """A trained actor-critic: raw observation + recurrent state -> action."""

    def __init__(self, net, pipeline: ObsPipeline, action_names=None, meta=None, path=None):
        self.net = net
        self.pipeline = pipeline
        self.action_names = list(action_names or [])
        self.meta = dict(meta or {})
        self.path = path
        self._local = threading.local()
        self._step_lock = threading.Lock()
        self._forks = hasattr(net, "fork")

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, path, which="latest"):
        """Load a checkpoint file, or a run directory's ``which`` checkpoint.

        For a run directory, ``which`` is ``"latest"`` (default) or ``"best"``;
        if that file is missing the other one is used.  :attr:`path` says which
        file was loaded.  Raises :class:`CheckpointError` for a missing, corrupt,
        non-finite or mismatched checkpoint.
        """
        path = os.fspath(path)
        if os.path.isdir(path):
            other = {"latest": "best", "best": "latest"}.get(which)
            if other is None:
                raise ValueError(f"which must be 'latest' or 'best', got {which!r}")
            cand = os.path.join(path, "checkpoints", f"{which}.npz")
            if not os.path.exists(cand):
                cand = os.path.join(path, "checkpoints", f"{other}.npz")
                if not os.path.exists(cand):
                    raise CheckpointError(f"{path} has no checkpoints/latest.npz or checkpoints/best.npz "
                                          f"(not a run directory, or the run saved nothing yet)")
            path = cand
        ckpt = load_checkpoint(path)
        try:
            net = network_from_spec(ckpt.network_spec)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint {ckpt.path} has an unusable network spec: {e}") from None
        check_layout(ckpt, net)
        net.params[:] = ckpt.params
        env = ckpt.env_spec
        raw_shape = env.get("obs_shape")
        if raw_shape is None:
            raise CheckpointError(f"checkpoint {ckpt.path} does not record the observation shape")
        try:
            pipeline = ObsPipeline(ckpt.preprocess_spec, raw_shape)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {ckpt.path} has an unusable preprocess spec: {e}") from None
        if tuple(pipeline.net_obs_shape) != tuple(net.obs_shape):
            raise CheckpointError(
                f"checkpoint {ckpt.path}: preprocessing gives {pipeline.net_obs_shape} but the "
                f"network expects {tuple(net.obs_shape)}"
            )
        policy = cls(net, pipeline, env.get("action_names"), ckpt.meta, path=ckpt.path)
        policy.checkpoint = ckpt
        return policy

    @classmethod
    def from_network(cls, net, raw_obs_shape, preprocess_spec=None, *, env_id=None, action_names=None):
        """A policy around an in-memory network (e.g. to :meth:`save` one for deployment).

        ``preprocess_spec`` defaults to ``{"kind": "vector"}`` for 1-D ``net.obs_shape``
        and to 84x84 image preprocessing otherwise.
        """
        if preprocess_spec is None:
            preprocess_spec = ({"kind": "vector"} if len(net.obs_shape) == 1 else
                               {"kind": "image", "out_shape": list(net.obs_shape[1:]), "crop": None})
        pipeline = ObsPipeline(preprocess_spec, raw_obs_shape)
        if tuple(pipeline.net_obs_shape) != tuple(net.obs_shape):
            raise ValueError(f"preprocessing gives {pipeline.net_obs_shape} but the network "
                             f"expects {tuple(net.obs_shape)}")
        names = list(action_names or [str(i) for i in range(net.n_actions)])
        meta = {"env": {"id": env_id, "n_actions": int(net.n_actions), "action_names": names,
                        "obs_shape": [int(s) for s in raw_obs_shape],
                        "obs_kind": pipeline.kind, "preprocess": dict(pipeline.spec)},
                "network": net.spec, "layout": layout_of(net), "preprocess": dict(pipeline.spec)}
        return cls(net, pipeline, names, meta)

    def save(self, path):
        """Write this policy as a checkpoint ``Policy.load`` reads (no optimizer state)."""
        meta = {k: v for k, v in self.meta.items() if k not in ("n_params", "format", "format_version")}
        meta.update(network=self.net.spec, layout=layout_of(self.net), preprocess=dict(self.pipeline.spec))
        return save_checkpoint(path, self.net.params, meta)

    # ------------------------------------------------------------ acting
    @property
    def n_actions(self) -> int:
        return self.net.n_actions

    def initial_state(self, n=None):
        """Recurrent state for the start of an episode (None for feed-forward
        nets): ``(h, c)`` of shape ``(H,)`` for :meth:`act`, or with ``n``,
        ``(n, H)`` rows for :meth:`act_batch`."""
        if n is None:
            return self.net.initial_state()
        return self.net.initial_batch_state(n)

    def _scratch(self):
        """This thread's (network, input buffer, rng)."""
        loc = self._local
        try:
            return loc.net, loc.obs
        except AttributeError:
            loc.net = self.net.fork() if self._forks else self.net
            loc.obs = np.empty(self.pipeline.net_obs_shape, dtype=self.net.dtype)
            return loc.net, loc.obs

    def probs(self, obs, state=None):
        """(action probabilities ``(A,)`` float32, value float, new state) for one raw observation."""
        net, buf = self._scratch()
        if state is None:
            state = net.initial_state()
        x = self.pipeline(obs, buf)
        if self._forks:
            probs, value, new_state = net.step(x, state)
        else:  # one shared set of scratch buffers: one thread at a time
            with self._step_lock:
                probs, value, new_state = net.step(x, state)
        return probs, float(value), new_state

    def batch_input(self, obs):
        """The network input rows ``(N, *net_obs_shape)`` for N raw
        observations (an ``(N, *raw_shape)`` array or a sequence of N), in
        this thread's buffer (overwritten by the thread's next call: copy it
        to keep it); an ObservationError names the bad row.  What
        :meth:`act_batch` feeds the network (a twin fed the same rows
        compares networks alone)."""
        raw_shape = self.pipeline.raw_shape
        if isinstance(obs, np.ndarray) and obs.ndim == len(raw_shape) + 1:
            n = obs.shape[0]
        elif isinstance(obs, np.ndarray) or not isinstance(obs, (list, tuple)):
            raise ObservationError(
                f"act_batch/probs_batch take N raw observations: an array of shape "
                f"(N, {', '.join(map(str, raw_shape))}) or a list of N, got "
                f"{type(obs).__name__}{' of shape ' + str(obs.shape) if hasattr(obs, 'shape') else ''}")
        else:
            n = len(obs)
        if n < 1:
            raise ObservationError("act_batch/probs_batch need at least one observation")
        loc = self._local
        buf = getattr(loc, "batch_obs", None)
        if buf is None or buf.shape[0] < n:
            buf = loc.batch_obs = np.empty((n,) + tuple(self.pipeline.net_obs_shape),
                                           dtype=self.net.dtype)
        rows = buf[:n]
        for i in range(n):
            try:
                self.pipeline(obs[i], rows[i])
            except ObservationError as e:
                raise ObservationError(f"observation row {i}: {e}") from None
        return rows

    def probs_batch(self, obs, states=None, done=None):
        """N agents at once: ``(probs (N, A), values (N,), new_states)``.

        ``obs``: N raw observations (an ``(N, *raw_shape)`` array or a list);
        ``states``: ``(h, c)`` of ``(N, H)`` rows (:meth:`initial_state` with
        ``n``), None for zeros; ``done``: optional bool ``(N,)`` (0/1
        integers are taken too; floats are a ValueError), rows that
        start a new episode (their state is reset first).  The states passed
        in are never modified.  A bad row (wrong shape or dtype, NaN/inf) is
        an :class:`ObservationError` naming it, raised before any row is
        stepped; states that do not match the batch are a ``ValueError``.
        """
        net, _ = self._scratch()
        x = self.batch_input(obs)       # rows checked and preprocessed
        if self._forks:
            return net.step_batch(x, states, done)
        with self._step_lock:
            return net.step_batch(x, states, done)

    def act_batch(self, obs, states=None, done=None, *, greedy=False, rng=None):
        """N agents at once: ``(actions int64 (N,), new_states)``; see
        :meth:`probs_batch`.  Row ``i`` is :meth:`act` on ``obs[i]`` with
        ``(h[i], c[i])`` (to float32 rounding of the probabilities; sampled
        with the same inverse CDF, one uniform per row from ``rng``)."""
        probs, _, new_states = self.probs_batch(obs, states, done)
        if greedy:
            return probs.argmax(axis=1).astype(np.int64), new_states
        if rng is None:
            rng = getattr(self._local, "rng", None)
            if rng is None:
                rng = self._local.rng = np.random.default_rng()
        actions = np.empty(probs.shape[0], np.int64)
        sample_rows(probs, rng.random(probs.shape[0]), actions)
        return actions, new_states

    def act(self, obs, state=None, *, greedy=False, rng=None):
        """Pick an action for one raw observation: ``(action, new_state)``.

        ``greedy=True`` takes the most probable action; otherwise it samples
        with ``rng`` (a ``numpy.random.Generator``; if None, this thread's own
        generator, created on first use).
        """
        probs, _, new_state = self.probs(obs, state)
        if greedy:
            return greedy_action(probs), new_state
        if rng is None:
            rng = getattr(self._local, "rng", None)
            if rng is None:
                rng = self._local.rng = np.random.default_rng()
        return int(sample_categorical(probs, rng.random())), new_state
