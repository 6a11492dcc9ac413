"""The environment interface every trainer, policy and benchmark talks to.

An :class:`Env` is a thin adapter over one simulator instance (a native
``vizdoom.DoomGame`` or a Gymnasium env). It hands out *raw* observations and
*raw* rewards; preprocessing (resize, scale to [0, 1]) and reward scaling are
the trainer's job, described by :attr:`Env.preprocess_spec`.

Protocol, per worker thread::

    obs = env.reset()
    while True:
        obs, reward, terminated, truncated = env.step(action)
        if terminated or truncated:     # truncated: cut by a time limit
            obs = env.reset()

After ``terminated``/``truncated`` the caller must call :meth:`Env.reset`
before stepping again. One env is driven by one thread; different envs may be
stepped from different threads at the same time.
"""
from __future__ import annotations

import contextlib
import signal

IMAGE_PREPROCESS = {"kind": "image", "out_shape": [84, 84], "crop": None}
VECTOR_PREPROCESS = {"kind": "vector"}

#: the words :attr:`Env.episode_end` takes: a Doom env's three, then the
#: ``terminated``/``truncated`` of envs that cannot tell more (a worker
#: process sends the index, training logs the word in episodes.csv)
EPISODE_ENDS = ("died", "timed out", "ended alive", "terminated", "truncated")


class Env:
    """Base class of the env adapters (:class:`~a3c_core.envs.doom.DoomEnv`,
    :class:`~a3c_core.envs.gym.GymEnv`).

    Attributes (set by the adapter's constructor):

    * ``env_id`` (str): canonical id, accepted again by :func:`make_env`
      (``"doom:basic"``, ``"doom:/path/x.cfg"``, ``"gym:CartPole-v1"``);
    * ``n_actions`` (int): actions are ints in ``range(n_actions)``;
    * ``action_names`` (list[str]): one readable name per action;
    * ``obs_shape`` (tuple[int, ...]) and ``obs_dtype`` (numpy dtype) of the
      raw observation; ``obs_kind``: ``'image'`` (uint8 ``(H, W)`` or
      ``(H, W, 3)``) or ``'vector'`` (float32 ``(D,)``);
    * ``frame_skip`` (int): simulator frames per :meth:`step` (the action is
      repeated, rewards are summed);
    * ``preprocess_spec`` (dict, JSON-able): how the trainer turns a raw
      observation into network input: ``{"kind": "image", "out_shape": [84,
      84], "crop": None}`` or ``{"kind": "vector"}``;
    * ``episode_over`` (bool): True when the *whole* episode (the real game)
      has ended. It differs from ``terminated`` only for envs that report a
      life loss as terminal (Atari ``terminal_on_life_loss=True``): there
      ``terminated`` is True on every lost life and ``episode_over`` only at
      game over, so callers report whole-game scores. Default: True after any
      terminated/truncated step, False after :meth:`reset`.
    * ``episode_shaping`` (float): the part of this episode's summed rewards
      that is shaping added for learning (a Doom env's ``health_reward`` and ``ammo_reward``),
      not the task's own reward; callers that report scores subtract it.
      Default 0.
    * ``episode_end`` (str or None): how the last whole episode ended, one
      of :data:`EPISODE_ENDS`: a Doom env tells ``"died"``, ``"timed out"``
      or ``"ended alive"`` (the last is the goal in every shipped scenario
      that has one); Gymnasium and Atari envs tell ``"terminated"`` or
      ``"truncated"`` (a time limit). None while an episode runs.
    """

    env_id: str
    n_actions: int
    action_names: list
    obs_shape: tuple
    obs_dtype: object
    obs_kind: str
    frame_skip: int
    preprocess_spec: dict
    render: bool = False
    episode_over: bool = True
    episode_shaping: float = 0.0
    episode_end = None
    #: the env's private runtime dir on disk (a ViZDoom env's), or None
    work_dir = None

    # -- the protocol ------------------------------------------------------
    def reset(self):
        """Start a new episode; return its first raw observation (numpy)."""
        raise NotImplementedError

    def step(self, action):
        """Apply ``action`` (int in ``range(n_actions)``) for ``frame_skip``
        frames. Returns ``(obs, reward, terminated, truncated)``:

        * ``obs``: raw observation after the step (for Doom a zero frame once
          the episode has ended); treat it as read-only;
        * ``reward`` (float): raw reward summed over the skipped frames;
        * ``terminated`` (bool): the episode ended by itself (death, goal);
        * ``truncated`` (bool): the episode was cut by a time limit; the
          trainer bootstraps from the value of the last observation when
          ``truncation_bootstrap`` is on (default: on for Gymnasium and
          Atari, off for doom, whose scenario timeout is part of the task).
        """
        raise NotImplementedError

    def render_frame(self):
        """RGB uint8 ``(H, W, 3)`` picture of the current state (for GIFs).
        Only available for envs made with ``render=True``."""
        raise NotImplementedError(f"{type(self).__name__} cannot render frames")

    def close(self):
        """Release the simulator and remove runtime files. Idempotent."""

    def kill_engine(self) -> bool:
        """SIGKILL the process this env's simulator runs in (a ViZDoom
        engine, an env's child process), from any thread, so that a call
        stuck in it raises; True if there was one to kill.  The env is
        unusable afterwards (close it).  Default: False, an env stepped in
        this process has no engine to kill (the step watchdog,
        :mod:`a3c_core.train.watchdog`, can then only report the hang)."""
        return False

    def seconds_per_step(self) -> tuple:
        """Game time one :meth:`step` covers, and how it was derived (a GIF's
        frame duration): ``frame_skip`` frames at the simulator's rate
        (:meth:`frame_rate`), or at an assumed 30 frames/s."""
        skip = int(getattr(self, "frame_skip", 1) or 1)
        rate, source = self.frame_rate()
        if rate:
            return skip / float(rate), f"frame skip {skip} at {source}"
        return skip / 30.0, f"frame skip {skip} at an assumed 30 frames/s (the env gives no render_fps)"

    def frame_rate(self) -> tuple:
        """``(frames per second, where it comes from)``, or ``(None, "")`` when unknown."""
        return None, ""

    # -- description -------------------------------------------------------
    def spec(self):
        """JSON-able description stored in checkpoints (``make_env(spec["id"],
        frame_skip=spec["frame_skip"])`` rebuilds an equivalent env)."""
        return {
            "id": self.env_id,
            "frame_skip": int(self.frame_skip),
            "n_actions": int(self.n_actions),
            "action_names": [str(n) for n in self.action_names],
            "obs_shape": [int(d) for d in self.obs_shape],
            "obs_dtype": str(self.obs_dtype),
            "obs_kind": self.obs_kind,
            "preprocess": dict(self.preprocess_spec),
        }

    def _raise_bad_action(self, action):
        raise ValueError(
            f"{self.env_id}: action must be an int in range({self.n_actions}), "
            f"got {action!r}"
        )

    # -- context manager ---------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (
            f"<{type(self).__name__} {self.env_id} actions={self.n_actions} "
            f"obs={self.obs_kind}{tuple(self.obs_shape)} skip={self.frame_skip}>"
        )


def check_frame_skip(frame_skip, default):
    """``None`` -> ``default``; otherwise an int >= 1 or ValueError."""
    if frame_skip is None:
        return default
    if isinstance(frame_skip, bool) or int(frame_skip) != frame_skip or frame_skip < 1:
        raise ValueError(f"frame_skip must be an int >= 1, got {frame_skip!r}")
    return int(frame_skip)


@contextlib.contextmanager
def sigint_blocked():
    """Block SIGINT in the calling thread while it starts a child process.

    A terminal's Ctrl-C goes to the whole foreground process group, and a
    freshly forked engine or env child is still in it until it calls
    ``setsid``; a SIGINT in that window killed the ViZDoom engine mid-launch
    (and ViZDoom then crashed the trainer).  A blocked signal stays blocked
    across fork and exec, so the child never sees it; this thread gets a
    pending SIGINT delivered when the block ends.
    """
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
