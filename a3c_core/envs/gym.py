"""Gymnasium adapter: :class:`GymEnv` wraps any registered id with a
``Discrete`` action space.

Observations:

* ``Box`` of any other shape/dtype -> ``'vector'``: float32, flattened ``(D,)``;
* ``Box`` uint8 ``(H, W)`` or ``(H, W, 3)`` -> ``'image'`` (raw uint8, the
  trainer resizes to 84x84 per :attr:`preprocess_spec`);
* ``Discrete(n)`` -> ``'vector'``: one-hot float32 ``(n,)``.

Anything else (Dict/Tuple observations, non-Discrete actions) is rejected with
a ValueError that says what was found.
"""
from __future__ import annotations

import numpy as np

from .base import (IMAGE_PREPROCESS, VECTOR_PREPROCESS, Env,
                   check_frame_skip)

GYM_EXTRA = "pip install 'a3c_core[gym]'"


def import_gymnasium():
    """``import gymnasium`` or an ImportError that names the extra to install."""
    try:
        import gymnasium
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"Gymnasium envs ('gym:<id>') need the gymnasium package: {GYM_EXTRA}"
        ) from exc
    return gymnasium


def registered_gym_ids():
    """All ids in the Gymnasium registry (after its own registration)."""
    gym = import_gymnasium()
    return sorted(gym.envs.registration.registry.keys())


def close_gym_ids(env_id, n=3):
    """Registered ids that look like ``env_id`` (for error messages)."""
    import difflib

    ids = registered_gym_ids()
    by_lower = {i.lower(): i for i in ids}
    matches = difflib.get_close_matches(env_id.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[m] for m in matches]


def split_module_id(gym_id):
    """``'module:Env-v0'`` -> ``('module', 'Env-v0')``; a plain id -> ``(None, id)``."""
    module, sep, name = gym_id.rpartition(":")
    return (module, name) if sep else (None, gym_id)


def import_env_module(gym_id):
    """Import the module of a ``'module:Env-v0'`` id (it registers its envs, as
    ``gymnasium.make`` does); returns the bare id. ValueError names a missing module."""
    import importlib

    module, name = split_module_id(gym_id)
    if module is None:
        return gym_id
    if not module or not name:
        raise ValueError(f"Malformed Gymnasium id {gym_id!r}: expected 'module:Env-v0'")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"Gymnasium id {gym_id!r}: cannot import module {module!r} ({exc})"
        ) from exc
    return name


def check_gym_id(gym_id):
    """ValueError (with close matches) unless ``gym_id`` is a valid registered
    id; ``'module:Env-v0'`` ids import their module first, as in gymnasium."""
    gym = import_gymnasium()
    name = import_env_module(gym_id)
    try:
        gym.spec(name)
    except gym.error.DependencyNotInstalled as exc:
        raise ImportError(f"gym:{gym_id}: {exc}") from exc
    except (gym.error.Error, ModuleNotFoundError) as exc:  # NameNotFound, Malformed, ...
        close = close_gym_ids(name)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown Gymnasium id {gym_id!r}: {exc}{hint}") from exc


def _is_image_box(space):
    shape = space.shape
    return space.dtype == np.uint8 and (
        len(shape) == 2 or (len(shape) == 3 and shape[-1] == 3)
    )


class GymEnv(Env):
    """One Gymnasium env as an :class:`~a3c_core.envs.base.Env`.

    Args:
        gym_id: a registered Gymnasium id (``'CartPole-v1'``).
        seed: passed as ``reset(seed=seed)`` on the first reset (and to the
            action space), so a fixed seed and fixed actions repeat exactly.
        frame_skip: repeat each action this many times, summing rewards
            (stops early at episode end); default 1.
        render: create with ``render_mode='rgb_array'`` for :meth:`render_frame`.
        runtime_dir: unused (Gymnasium envs write no runtime files).
        **make_kwargs: passed to ``gymnasium.make``.
    """

    def __init__(self, gym_id, *, seed=0, frame_skip=None, runtime_dir=None,
                 render=False, **make_kwargs):
        gym = import_gymnasium()
        self.env_id = f"gym:{gym_id}"
        self.frame_skip = check_frame_skip(frame_skip, 1)
        self.seed = None if seed is None else int(seed)
        self.render = bool(render)
        if render:
            make_kwargs.setdefault("render_mode", "rgb_array")
        check_gym_id(gym_id)
        try:
            env = gym.make(gym_id, **make_kwargs)
        except gym.error.DependencyNotInstalled as exc:
            raise ImportError(f"{self.env_id}: {exc}") from exc
        self._env = env
        try:
            self._describe(gym, env)
        except Exception:
            env.close()
            raise
        if self.seed is not None:
            env.action_space.seed(self.seed)
        self._needs_seed = self.seed is not None

    def _describe(self, gym, env):
        spaces = gym.spaces
        act = env.action_space
        if not isinstance(act, spaces.Discrete):
            raise ValueError(
                f"{self.env_id}: only Discrete action spaces are supported, found "
                f"{act!r} ({type(act).__name__})"
            )
        self.n_actions = int(act.n)
        self._action_start = int(act.start)
        names = None
        try:
            names = env.unwrapped.get_action_meanings()  # Atari
        except Exception:
            pass
        if not names or len(names) != self.n_actions:
            names = [str(i) for i in range(self.n_actions)]
        self.action_names = [str(n) for n in names]

        obs = env.observation_space
        self._one_hot = None
        if isinstance(obs, spaces.Box) and _is_image_box(obs):
            kind, shape, dtype = "image", tuple(obs.shape), np.dtype(np.uint8)
        elif isinstance(obs, spaces.Box):
            kind, shape, dtype = "vector", (int(np.prod(obs.shape)),), np.dtype(np.float32)
        elif isinstance(obs, spaces.Discrete):
            kind, shape, dtype = "vector", (int(obs.n),), np.dtype(np.float32)
            self._one_hot = np.eye(int(obs.n), dtype=np.float32)
            self._one_hot.flags.writeable = False
            self._obs_start = int(obs.start)
        else:
            raise ValueError(
                f"{self.env_id}: unsupported observation space {obs!r} "
                f"({type(obs).__name__}); supported: Box vectors, uint8 Box images "
                f"(H, W) or (H, W, 3), Discrete"
            )
        self.obs_kind, self.obs_shape, self.obs_dtype = kind, shape, dtype
        self.preprocess_spec = dict(IMAGE_PREPROCESS if kind == "image" else VECTOR_PREPROCESS)

    def _convert(self, obs):
        if self._one_hot is not None:
            return self._one_hot[int(obs) - self._obs_start]
        if self.obs_kind == "image":
            return np.asarray(obs, dtype=np.uint8)
        return np.asarray(obs, dtype=np.float32).reshape(-1)

    def reset(self):
        self.episode_over = False
        self.episode_end = None
        if self._needs_seed:
            self._needs_seed = False
            obs, _ = self._env.reset(seed=self.seed)
        else:
            obs, _ = self._env.reset()
        return self._convert(obs)

    def step(self, action):
        if not 0 <= action < self.n_actions:
            self._raise_bad_action(action)
        a = int(action) + self._action_start
        total = 0.0
        for _ in range(self.frame_skip):
            obs, reward, terminated, truncated, _ = self._env.step(a)
            total += float(reward)
            if terminated or truncated:
                self.episode_over = True
                self.episode_end = "terminated" if terminated else "truncated"
                break
        return self._convert(obs), total, bool(terminated), bool(truncated)

    def render_frame(self):
        """RGB uint8 ``(H, W, 3)`` from ``env.render()`` (``render=True``)."""
        if not self.render:
            raise RuntimeError(f"{self.env_id}: create the env with render=True to render frames")
        frame = np.asarray(self._env.render(), dtype=np.uint8)
        if frame.ndim == 2:
            frame = np.repeat(frame[:, :, None], 3, axis=2)
        return frame

    def spec(self):
        d = super().spec()
        d["kind"] = "gym"
        return d

    def frame_rate(self):
        try:
            fps = self._env.metadata.get("render_fps")
        except AttributeError:
            fps = None
        return (fps, f"the env's render_fps {fps}") if fps else (None, "")

    def close(self):
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
