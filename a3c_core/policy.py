"""Embedding API: a trained policy in a lightweight deployment.

    from a3c_core import Policy
    policy = Policy.load("runs/doom_basic-doom-lstm-s0-.../checkpoints/best.npz")
    state = policy.initial_state()
    action, state = policy.act(raw_frame, state)        # raw env observation

Only numpy and numba (plus a3c_core's own compiled preprocessing) are needed
at run time: no torch, TF, vizdoom or gymnasium.  ``act`` applies the
preprocessing the agent was trained with (stored in the checkpoint) and runs
the batch-1 forward step.
"""
from __future__ import annotations

import numpy as np

from a3c_core.checkpoint import CheckpointError, check_layout, load_checkpoint
from a3c_core.obs import ObsPipeline
from a3c_core.sampling import sample_categorical


class Policy:
    """A trained actor-critic: raw observation + recurrent state -> action."""

    def __init__(self, net, pipeline: ObsPipeline, action_names=None, meta=None):
        self.net = net
        self.pipeline = pipeline
        self.action_names = list(action_names or [])
        self.meta = dict(meta or {})
        self._obs = np.empty(pipeline.net_obs_shape, dtype=net.dtype)

    @classmethod
    def load(cls, path, which="best"):
        """Load a checkpoint file, or a run directory's ``best`` (else ``latest``) checkpoint."""
        import os

        from a3c_core.nn.network import network_from_spec

        if os.path.isdir(path):
            cand = os.path.join(path, "checkpoints", f"{which}.npz")
            path = cand if os.path.exists(cand) else os.path.join(path, "checkpoints", "latest.npz")
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
        pipeline = ObsPipeline(ckpt.preprocess_spec, raw_shape)
        if tuple(pipeline.net_obs_shape) != tuple(net.obs_shape):
            raise CheckpointError(
                f"checkpoint {ckpt.path}: preprocessing gives {pipeline.net_obs_shape} but the "
                f"network expects {tuple(net.obs_shape)}"
            )
        return cls(net, pipeline, env.get("action_names"), ckpt.meta)

    @property
    def n_actions(self) -> int:
        return self.net.n_actions

    def initial_state(self):
        """Recurrent state for the start of an episode (None for feed-forward nets)."""
        return self.net.initial_state()

    def probs(self, obs, state=None):
        """(action probabilities, value, new state) for one raw observation."""
        if state is None:
            state = self.net.initial_state()
        x = self.pipeline(obs, self._obs)
        probs, value, new_state = self.net.step(x, state)
        return probs, float(value), new_state

    def act(self, obs, state=None, *, greedy=False, rng=None):
        """Pick an action for one raw observation: ``(action, new_state)``.

        ``greedy=True`` takes the most probable action; otherwise it samples
        with ``rng`` (a ``numpy.random.Generator``; a fresh default one if None).
        """
        probs, _, new_state = self.probs(obs, state)
        if greedy:
            return int(np.argmax(probs)), new_state
        if rng is None:
            rng = self._rng = getattr(self, "_rng", None) or np.random.default_rng()
        return int(sample_categorical(probs, rng.random())), new_state
