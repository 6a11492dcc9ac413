"""Atari (ALE) adapter: :class:`AtariEnv` drives ``ale_py.ALEInterface`` directly.

Id forms (all the same game, they differ only in the defaults the id defines):

* ``ALE/Pong-v5``: sticky actions 0.25 (ALE's v5 default);
* ``PongNoFrameskip-v4`` (and other ``*-v4``/``*-v0`` ALE ids): sticky 0.0
  (``-v0``: 0.25);
* ``atari:Pong`` (or ``atari:pong``): the game with the v5 defaults.

Standard preprocessing (Mnih et al. 2015 / baselines), each a keyword:

* grayscale frames from ALE, raw ``uint8 (210, 160)`` observations;
* ``frame_skip=4``: each action is repeated for 4 frames, rewards are summed,
  and the observation is the pixel-wise max of the step's last two frames
  (removes Atari sprite flicker). A step cut short by the end of the game
  returns its last frame;
* ``noop_max=30``: after each real reset, a uniformly drawn 1..30 no-op
  frames (0 disables);
* ``terminal_on_life_loss=False``: when True, losing a life returns
  ``terminated=True`` while :attr:`episode_over` stays False until the game
  is over; the next :meth:`reset` then continues the same game with one
  no-op step instead of restarting it;
* ``repeat_action_probability``: sticky actions, default from the id;
* ``max_episode_frames``: 108,000 frames (30 min of play) -> ``truncated``.

Raw rewards (clipping is the trainer's job). The network sees the frame
cropped by :data:`ATARI_CROP` (top, bottom, left, right) = (34, 16, 0, 0),
i.e. rows 34..193: the score bar and the bottom border are dropped, leaving a
square 160x160 play field, area-resized to 42x42 (the universe-starter-agent
A3C pipeline) by the trainer's image pipeline.

ALE's step holds the GIL, so :func:`~a3c_core.envs.make_env` runs Atari ids
in a child process (:class:`~a3c_core.envs.proc.ProcEnv`) by default.
"""
from __future__ import annotations

import numpy as np

from .base import Env, check_frame_skip

ATARI_EXTRA = "pip install 'a3c_core[atari]'"
DEFAULT_FRAME_SKIP = 4
DEFAULT_NOOP_MAX = 30
DEFAULT_MAX_EPISODE_FRAMES = 108_000
#: (top, bottom, left, right) margins cut before the resize (see module doc).
ATARI_CROP = (34, 16, 0, 0)
ATARI_PREPROCESS = {"kind": "image", "out_shape": [42, 42], "crop": list(ATARI_CROP)}


def import_ale():
    """``import ale_py`` (registers the ALE Gymnasium ids) or an ImportError
    naming the extra."""
    try:
        import ale_py
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(f"Atari envs need the ale-py package: {ATARI_EXTRA}") from exc
    return ale_py


def is_atari_id(env_id):
    """True for ids built as Atari envs (``ALE/...``, ``*NoFrameskip-v4``,
    ``atari:<game>``, ...) when ale-py is installed; ``ALE/`` and ``atari:``
    ids always (building them then names what is missing)."""
    try:
        return atari_id_defaults(env_id) is not None
    except (ImportError, ValueError):
        return isinstance(env_id, str) and env_id.startswith(("ALE/", "atari:"))


def _looks_atari(env_id):
    return (env_id.startswith(("ALE/", "atari:")) or "NoFrameskip" in env_id
            or "Deterministic" in env_id or env_id.endswith(("-v0", "-v4")))


def atari_id_defaults(env_id):
    """``(game, defaults)`` for an Atari id, or None for other ids.

    ``defaults``: ``repeat_action_probability``, ``full_action_space``,
    ``max_episode_frames`` as the id defines them (from its Gymnasium spec).
    Raises ValueError for an ``atari:<game>`` whose ROM is not shipped.
    """
    if not isinstance(env_id, str) or not _looks_atari(env_id):
        return None
    try:
        ale_py = import_ale()
        import gymnasium as gym
    except ImportError:
        if env_id.startswith(("ALE/", "atari:")):
            raise
        return None
    if env_id.startswith("atari:"):
        game = env_id[len("atari:"):]
        gym_id = _v5_id(gym, game)
        if gym_id is None:
            import difflib

            games = _games(gym)
            close = difflib.get_close_matches(game.lower(), games, n=3, cutoff=0.6)
            hint = f" Did you mean: {', '.join('atari:' + c for c in close)}?" if close else ""
            raise ValueError(f"Unknown Atari game {game!r}.{hint} ({len(games)} games "
                             f"shipped with ale-py {ale_py.__version__})")
    else:
        gym_id = env_id
    try:
        spec = gym.spec(gym_id)
    except gym.error.Error:
        return None
    if "ale_py" not in str(spec.entry_point):
        return None
    kw = spec.kwargs
    frames = kw.get("max_num_frames_per_episode") or DEFAULT_MAX_EPISODE_FRAMES
    return kw["game"], {
        "repeat_action_probability": float(kw.get("repeat_action_probability", 0.25)),
        "full_action_space": bool(kw.get("full_action_space", False)),
        "max_episode_frames": int(frames),
    }


def _games(gym):
    return sorted({s.kwargs["game"] for s in gym.registry.values()
                   if "ale_py" in str(s.entry_point) and "game" in s.kwargs})


def _v5_id(gym, game):
    want = game.replace("_", "").lower()
    for name, s in gym.registry.items():
        if name.startswith("ALE/") and name.endswith("-v5") and "ale_py" in str(s.entry_point):
            if s.kwargs.get("game", "").replace("_", "").lower() == want:
                return name
    return None


def _ale_seed(seed):
    """An int32 ALE seed from any int (ALE wants a non-negative int32)."""
    return int(np.random.SeedSequence(int(seed)).generate_state(1)[0] & 0x7FFFFFFF)


class AtariEnv(Env):
    """One ALE game as an :class:`~a3c_core.envs.base.Env` (runs in this
    thread and holds the GIL; see :class:`~a3c_core.envs.proc.ProcEnv`).

    Args:
        env_id: ``'ALE/Pong-v5'``, ``'PongNoFrameskip-v4'`` or ``'atari:Pong'``.
        seed: seeds ALE (sticky actions) and the no-op draws; same seed and
            actions -> same frames and rewards.
        frame_skip: frames per step (max over the last two); default 4.
        noop_max: up to this many no-op frames after a real reset (0: none).
        terminal_on_life_loss: report a lost life as ``terminated`` (the game
            goes on; :attr:`episode_over` marks the real end).
        repeat_action_probability: sticky actions; ``None`` -> the id's value.
        full_action_space: all 18 actions instead of the game's minimal set;
            ``None`` -> the id's value (False).
        max_episode_frames: frames before ``truncated``; ``None`` -> the id's
            value (108,000).
        render: accepted for symmetry; :meth:`render_frame` always works.
        runtime_dir: unused.

    Observations: uint8 ``(210, 160)``, read-only views of two preallocated
    buffers used in turn (the previous observation stays valid for one step).
    """

    def __init__(self, env_id="ALE/Pong-v5", *, seed=0, frame_skip=None, noop_max=DEFAULT_NOOP_MAX,
                 terminal_on_life_loss=False, repeat_action_probability=None,
                 full_action_space=None, max_episode_frames=None, render=False,
                 runtime_dir=None):
        resolved = atari_id_defaults(env_id)
        if resolved is None:
            raise ValueError(f"{env_id!r} is not an Atari id ('ALE/Pong-v5', "
                             f"'PongNoFrameskip-v4', 'atari:Pong')")
        self.game, defaults = resolved
        ale_py = import_ale()
        self.env_id = env_id
        self.frame_skip = check_frame_skip(frame_skip, DEFAULT_FRAME_SKIP)
        if isinstance(noop_max, bool) or int(noop_max) != noop_max or noop_max < 0:
            raise ValueError(f"noop_max must be an int >= 0, got {noop_max!r}")
        self.noop_max = int(noop_max)
        self.terminal_on_life_loss = bool(terminal_on_life_loss)
        p = defaults["repeat_action_probability"] if repeat_action_probability is None \
            else float(repeat_action_probability)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"repeat_action_probability must be in [0, 1], got {p!r}")
        self.repeat_action_probability = p
        full = (defaults["full_action_space"] if full_action_space is None
                else bool(full_action_space))
        frames = (defaults["max_episode_frames"] if max_episode_frames is None
                  else int(max_episode_frames))
        if frames < 0:
            raise ValueError(f"max_episode_frames must be >= 0, got {max_episode_frames!r}")
        self.max_episode_frames = frames
        self.seed = int(seed)
        self.render = bool(render)

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner
        ale = ale_py.ALEInterface()
        ale.setInt("random_seed", _ale_seed(self.seed))
        ale.setFloat("repeat_action_probability", p)
        ale.setInt("max_num_frames_per_episode", frames)
        ale.loadROM(ale_py.roms.get_rom_path(self.game))
        self._ale = ale
        actions = ale.getLegalActionSet() if full else ale.getMinimalActionSet()
        self._actions = list(actions)
        self._noop = ale_py.Action.NOOP
        self.n_actions = len(self._actions)
        self.action_names = [a.name for a in self._actions]
        h, w = ale.getScreenDims()
        self.obs_shape = (int(h), int(w))
        self.obs_dtype = np.dtype(np.uint8)
        self.obs_kind = "image"
        self.preprocess_spec = {k: (list(v) if isinstance(v, list) else v)
                                for k, v in ATARI_PREPROCESS.items()}
        self._rng = np.random.default_rng(self.seed)
        # frame buffers: the step's second-to-last and last frame, and two outputs
        self._prev = np.zeros(self.obs_shape, np.uint8)
        self._last = np.zeros(self.obs_shape, np.uint8)
        self._out = [np.zeros(self.obs_shape, np.uint8) for _ in range(2)]
        self._out_ro = []
        for buf in self._out:
            v = buf.view()
            v.flags.writeable = False
            self._out_ro.append(v)
        self._k = 0
        self._lives = 0
        self._continue = False  # next reset continues the game (after a life loss)
        self.episode_over = True

    # -- hot loop --------------------------------------------------------------
    def _skip(self, action):
        """Repeat ``action`` for frame_skip frames -> (obs view, reward, game_over)."""
        ale, skip = self._ale, self.frame_skip
        self._k ^= 1
        out = self._out[self._k]
        reward = 0
        for i in range(skip):
            reward += ale.act(action)
            if ale.game_over():
                if i == skip - 1 and skip > 1:
                    ale.getScreenGrayscale(self._last)
                    np.maximum(self._prev, self._last, out=out)
                else:
                    ale.getScreenGrayscale(out)  # cut short: its last frame
                return self._out_ro[self._k], reward, True
            if i == skip - 2:
                ale.getScreenGrayscale(self._prev)
        if skip == 1:
            ale.getScreenGrayscale(out)
        else:
            ale.getScreenGrayscale(self._last)
            np.maximum(self._prev, self._last, out=out)
        return self._out_ro[self._k], reward, False

    def step(self, action):
        if not 0 <= action < self.n_actions:
            self._raise_bad_action(action)
        obs, reward, over = self._skip(self._actions[action])
        ale = self._ale
        if over:
            terminated = ale.game_over(with_truncation=False)
            self.episode_over = True
            self.episode_end = "terminated" if terminated else "truncated"
            return obs, float(reward), terminated, not terminated
        if self.terminal_on_life_loss:
            lives = ale.lives()
            if lives < self._lives:
                self._lives = lives
                self._continue = True
                return obs, float(reward), True, False
        return obs, float(reward), False, False

    def reset(self):
        """New game (with 1..noop_max no-op frames), or after a life-loss
        terminal the same game continued by one no-op step."""
        self.episode_over = False
        self.episode_end = None
        if self._continue:
            self._continue = False
            obs, _, over = self._skip(self._noop)
            if not over:
                self._lives = self._ale.lives()
                return obs
        return self._new_game()

    def _new_game(self):
        ale = self._ale
        ale.reset_game()
        if self.noop_max:
            for _ in range(int(self._rng.integers(1, self.noop_max + 1))):
                ale.act(self._noop)
                if ale.game_over():
                    ale.reset_game()
        self._lives = ale.lives()
        self._k ^= 1
        ale.getScreenGrayscale(self._out[self._k])
        return self._out_ro[self._k]

    # -- extras ----------------------------------------------------------------
    def lives(self):
        """Lives left (ALE's count)."""
        return int(self._ale.lives())

    def render_frame(self):
        """RGB uint8 ``(210, 160, 3)`` of the current screen."""
        return self._ale.getScreenRGB()

    def spec(self):
        d = super().spec()
        d.update(kind="atari", game=self.game, noop_max=self.noop_max,
                 terminal_on_life_loss=self.terminal_on_life_loss,
                 repeat_action_probability=self.repeat_action_probability,
                 max_episode_frames=self.max_episode_frames)
        return d

    def close(self):
        self._ale = None
