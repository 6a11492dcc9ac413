"""Tiny Gymnasium envs for the reliability suite, used as ``crash_envs:<Name>-v0``.

Importing this module registers them (that is what the ``module:Env-v0`` id
form relies on), so the directory holding it must be on ``PYTHONPATH``:

* ``Tiny-v0`` - a valid env: Box(4,) float32 observations, Discrete(2)
  actions, 25-step episodes, reward 1 per step (same shapes as CartPole-v1);
* ``RaiseInStep-v0`` - raises :class:`EnvCrash` from ``step`` after
  ``CRASH_AFTER`` steps (a worker exception);
* ``BoxAction-v0`` - a continuous ``Box(2,)`` action space (unsupported);
* ``NaNObs-v0`` - from step ``NAN_AFTER`` on, observations contain NaN;
* ``SlowInit-v0`` - its constructor writes the file named by the
  ``CRASH_ENVS_MARKER`` environment variable and then sleeps 60 s, so a test
  can signal the trainer while it is provably still starting up;
* ``HangInStep-v0`` - from step ``HANG_AFTER`` on, ``step`` blocks (until
  :data:`HANG_RELEASE` is set, at most 120 s) and then raises
  :class:`EnvCrash`: a hung engine.
"""
import os
import threading
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

CRASH_AFTER = 30
HANG_AFTER = 40
#: set to let a blocked HangInStep step return (in this process)
HANG_RELEASE = threading.Event()
NAN_AFTER = 5
CRASH_MESSAGE = "crash_envs: step failed on purpose"


class EnvCrash(RuntimeError):
    """The deliberate failure of :class:`RaiseInStep`."""


class Tiny(gym.Env):
    """Observations float32 (4,), 2 actions, 25 steps per episode, reward 1."""

    metadata = {"render_modes": []}
    episode_len = 25

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0
        self._rng = np.random.default_rng(0)

    def _obs(self):
        return self._rng.uniform(-1, 1, size=4).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, self._t >= self.episode_len, False, {}


class RaiseInStep(Tiny):
    """Raises :class:`EnvCrash` on step ``CRASH_AFTER + 1`` (counted over episodes)."""

    def __init__(self):
        super().__init__()
        self._total = 0

    def step(self, action):
        self._total += 1
        if self._total > CRASH_AFTER:
            raise EnvCrash(f"{CRASH_MESSAGE} (step {self._total})")
        return super().step(action)


class BoxAction(Tiny):
    """Continuous actions: ``Box(-1, 1, (2,))``."""

    def __init__(self):
        super().__init__()
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


class NaNObs(Tiny):
    """Observations hold NaN from step ``NAN_AFTER`` on."""

    def __init__(self):
        super().__init__()
        self._total = 0

    def step(self, action):
        self._total += 1
        obs, r, term, trunc, info = super().step(action)
        if self._total >= NAN_AFTER:
            obs = obs.copy()
            obs[1] = np.nan
        return obs, r, term, trunc, info


class SlowInit(Tiny):
    """Writes ``$CRASH_ENVS_MARKER`` (if set), then sleeps 60 s in the constructor."""

    def __init__(self):
        super().__init__()
        marker = os.environ.get("CRASH_ENVS_MARKER")
        if marker:
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
        time.sleep(60)


class HangInStep(Tiny):
    """Blocks in ``step`` from step ``HANG_AFTER`` on (counted over episodes)."""

    def __init__(self):
        super().__init__()
        self._total = 0

    def step(self, action):
        self._total += 1
        if self._total >= HANG_AFTER:
            HANG_RELEASE.wait(25)
            raise EnvCrash(f"crash_envs: released after hanging at step {self._total}")
        return super().step(action)


_ENVS = {"Tiny-v0": Tiny, "HangInStep-v0": HangInStep, "RaiseInStep-v0": RaiseInStep, "BoxAction-v0": BoxAction,
         "NaNObs-v0": NaNObs, "SlowInit-v0": SlowInit}

for _name, _cls in _ENVS.items():
    if _name not in gym.envs.registration.registry:
        gym.register(id=_name, entry_point=_cls, disable_env_checker=True)
