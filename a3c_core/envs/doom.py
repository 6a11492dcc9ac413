"""Native ViZDoom adapter: :class:`DoomEnv` drives ``vizdoom.DoomGame`` directly.

The standard workload (README.md, Quick start): GRAY8 frames at 160x120 (obs ``(120, 160)``
uint8), window hidden, sound off, synchronous PLAYER mode, one one-hot action
per available button (a delta button such as LOOK_UP_DOWN_DELTA: one action
each way, +1 and -1), ``make_action(onehot, frame_skip=4)``, raw rewards.

ViZDoom's start-up quirks are all handled here:

* ``DoomGame.init()`` is not thread-safe: every init (and close) holds the
  module-level :data:`INIT_LOCK`. Stepping needs no lock (``make_action``
  releases the GIL), so workers in different threads step in parallel.
* Runtime files: the engine writes ``_vizdoom.ini`` (path settable with
  ``set_doom_config_path``) and a ``./_vizdoom/`` folder whose path is
  compiled into the engine *relative to its working directory*. The engine is
  a child process that inherits our cwd, and changing the process cwd is not
  an option (threads share it). So each env gets a private directory (under
  ``runtime_dir/vizdoom/`` or the system temp dir) holding the ini and a tiny
  launcher script, set with ``set_vizdoom_path``, that ``cd``s there and
  ``exec``s the real engine. The directory is removed by :meth:`DoomEnv.close`.
* Some shipped configs need help to start: multiplayer maps (``cig``,
  ``multi_duel``) crash in single-player mode unless hosted as a one-player
  deathmatch; Doom-1 IWADs (``freedoom1``) have no ``MAP01`` (use ``E1M1``);
  configs for commercial IWADs (``doom``, ``doom2``) are only listed when the
  IWAD is present. See :data:`SCENARIO_QUIRKS`.
"""
from __future__ import annotations

import itertools
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import warnings
import weakref

import numpy as np

from .base import IMAGE_PREPROCESS, Env, check_frame_skip, sigint_blocked

#: Serializes ``DoomGame.init()``/``close()`` across threads (not thread-safe).
INIT_LOCK = threading.Lock()

DEFAULT_FRAME_SKIP = 4
DOOM_TICRATE = 35  # ViZDoom's default engine tics per second
DOOM_EXTRA = "pip install 'a3c_core[doom]'"

#: Per-scenario start-up fixes: game args to add and/or the map to load.
SCENARIO_QUIRKS = {
    "cig": {"game_args": "-host 1 -deathmatch"},
    "multi_duel": {"game_args": "-host 1 -deathmatch"},
}
_DOOM1_IWADS = ("doom.wad", "doom1.wad", "freedoom1.wad")

#: An env replaces its engine at the start of every this-many-th episode on it
#: (:meth:`DoomEnv._recycle`): a ViZDoom engine's resident memory grows by
#: about 270 bytes per episode (doom:basic, 2026-12-05), whatever its length
#: (docs/reliability.md, "Memory over a long run").
ENGINE_RECYCLE_EPISODES = 10_000


def import_vizdoom():
    """``import vizdoom`` or an ImportError that names the extra to install."""
    try:
        import vizdoom
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"ViZDoom envs ('doom:...') need the vizdoom package: {DOOM_EXTRA}"
        ) from exc
    return vizdoom


def _cfg_value(cfg_path, key):
    """Value of ``key`` in a ViZDoom .cfg (keys are case/underscore-insensitive)."""
    want = key.replace("_", "").lower()
    try:
        with open(cfg_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.split("#", 1)[0]
                if "=" not in line:
                    continue
                k, v = line.split("=", 1)
                if k.strip().replace("_", "").lower() == want:
                    return v.strip()
    except OSError:
        return None
    return None


def _iwad_available(vizdoom, cfg_path):
    """False when the cfg names a game IWAD that is not installed."""
    iwad = _cfg_value(cfg_path, "doom_game_path")
    if not iwad:
        return True  # the engine falls back to the bundled freedoom2.wad
    candidates = [
        iwad,
        os.path.join(os.path.dirname(cfg_path), iwad),
        os.path.join(os.path.dirname(vizdoom.__file__), os.path.basename(iwad)),
    ]
    return any(os.path.isfile(p) for p in candidates)


def list_doom_scenarios():
    """Sorted names of the scenarios shipped with vizdoom (``doom:<name>``):
    every ``.cfg`` in ``vizdoom.scenarios_path`` whose game IWAD is present."""
    vizdoom = import_vizdoom()
    root = vizdoom.scenarios_path
    names = []
    for fname in sorted(os.listdir(root)):
        if fname.endswith(".cfg") and _iwad_available(vizdoom, os.path.join(root, fname)):
            names.append(fname[: -len(".cfg")])
    return names


def resolve_scenario(name_or_path):
    """``'basic'`` or a path to a .cfg -> ``(canonical env_id, abs cfg path)``.

    Raises FileNotFoundError for a missing .cfg path and ValueError for an
    unknown scenario name (listing the available ones).
    """
    vizdoom = import_vizdoom()
    s = str(name_or_path)
    looks_like_path = s.endswith(".cfg") or os.sep in s or "/" in s
    if looks_like_path:
        path = os.path.abspath(os.path.expanduser(s))
        if os.path.isfile(path):
            return f"doom:{s}", path
        shipped = os.path.join(vizdoom.scenarios_path, os.path.basename(s))
        if os.sep not in s and "/" not in s and os.path.isfile(shipped):
            return f"doom:{s[:-4]}", shipped  # 'doom:basic.cfg'
        raise FileNotFoundError(
            f"ViZDoom config not found: {s!r} (resolved to {path}). Pass an "
            f"existing .cfg path or a shipped scenario name: "
            f"{', '.join(list_doom_scenarios())}"
        )
    available = list_doom_scenarios()
    if s in available:
        return f"doom:{s}", os.path.join(vizdoom.scenarios_path, s + ".cfg")
    import difflib

    close = difflib.get_close_matches(s, available, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join('doom:' + c for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown ViZDoom scenario {s!r}.{hint} Available scenarios "
        f"(doom:<name>): {', '.join(available)}; or doom:<path to a .cfg file>."
    )


#: :class:`DoomEnv`'s action sets
ACTION_SETS = ("buttons", "combos")

#: :class:`DoomEnv`'s views: what part of the 120x160 frame the network sees, as
#: (top, bottom, left, right) margins cut off, and the size it is resized to
VIEWS = {"full": ((0, 0, 0, 0), (84, 84)),
         "band": ((30, 30, 0, 0), (42, 160))}

#: buttons that exclude each other in a combination (the others are on/off alone)
_EXCLUSIVE = (("TURN_LEFT", "TURN_RIGHT"), ("MOVE_FORWARD", "MOVE_BACKWARD"),
              ("MOVE_LEFT", "MOVE_RIGHT"))


def _presses(button) -> tuple:
    """The ways one button can be pressed, as press names: a binary button
    has one (its name); a delta button (``*_DELTA``: an axis such as
    LOOK_UP_DOWN_DELTA, whose value is how far it moves per tic) has two,
    ``NAME+`` and ``NAME-`` (+1 and -1), so the axis can be moved back:
    pressed only at +1 the view would tilt one way for good."""
    return (button + "+", button + "-") if button.endswith("_DELTA") else (button,)


def button_vector(buttons, pressed) -> list:
    """``make_action``'s value per button of ``buttons`` for the press names
    ``pressed`` (see :func:`_presses`): 1.0 for a binary button named there,
    +1.0 / -1.0 for a delta button's ``+`` / ``-`` press, else 0.0."""
    return [1.0 if b in pressed or b + "+" in pressed else -1.0 if b + "-" in pressed else 0.0
            for b in buttons]


def button_presses(buttons) -> list:
    """The ``"buttons"`` action set: one press at a time, in the cfg's order
    (a delta button gives two actions, see :func:`_presses`)."""
    return [p for b in buttons for p in _presses(b)]


def button_combos(buttons) -> list:
    """The ``"combos"`` action set of a button list: the product of its groups
    (turn left/right, forward/backward, strafe left/right, each delta button's
    two directions, and each other button alone), each group contributing
    none or one of its presses; the first combination is the no-op.  A tuple
    of press names (:func:`_presses`) per action."""
    groups, seen = [], set()
    for b in buttons:
        if b in seen:
            continue
        group = next((g for g in _EXCLUSIVE if b in g), (b,))
        members = tuple(x for x in group if x in buttons)
        seen.update(members)
        groups.append(((),) + tuple((p,) for m in members for p in _presses(m)))
    return [sum(parts, ()) for parts in itertools.product(*groups)]


def _finite(name, value) -> float:
    """``value`` as a float; ValueError naming ``name`` unless it is a finite number."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _check_wad_paths(game, env_id, cfg_path):
    """FileNotFoundError naming the .wad when the cfg's ``doom_scenario_path``
    (resolved by ViZDoom relative to the cfg) does not exist; the engine
    itself would only fail later with an unclear RuntimeError."""
    wad = game.get_doom_scenario_path()
    if wad and not os.path.isfile(wad):
        raw = _cfg_value(cfg_path, "doom_scenario_path") or wad
        raise FileNotFoundError(
            f"{env_id}: the scenario .wad {raw!r} named by doom_scenario_path in "
            f"{cfg_path} does not exist (looked for {wad})"
        )


# -- runtime directory ---------------------------------------------------------
def _engine_path(vizdoom):
    exe = "vizdoom.exe" if sys.platform == "win32" else "vizdoom"
    return os.path.join(os.path.dirname(os.path.abspath(vizdoom.__file__)), exe)


def _make_private_dir(parent):
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="doom-", dir=parent)


#: Standalone script (run with ``python -I -S``) that puts the engine in its own
#: session and starts its watchdog before ``exec``-ing it (see ``_engine_guard``).
ENGINE_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_engine_guard.py")


#: the file in an env's runtime dir where its launcher writes the engine's pid
ENGINE_PID_FILE = "engine.pid"


def _engine_pid(work_dir):
    """The pid of the engine started from ``work_dir``, or None: the one its
    launcher wrote (checked to be a child of this process), else a child of
    this process whose command line names ``work_dir`` (the engine's
    ``_vizdoom.ini`` is there)."""
    me = os.getpid()
    try:
        with open(os.path.join(work_dir, ENGINE_PID_FILE)) as fh:
            pid = int(fh.read().strip())
        if _parent_of(pid) == me:
            return pid
    except (OSError, ValueError):
        pass
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for d in names:
        if d.isdigit() and _parent_of(int(d)) == me:
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    if os.fsencode(work_dir) in fh.read():
                        return int(d)
            except OSError:
                continue
    return None


def _parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _write_launcher(work_dir, engine):
    """Shell launcher that runs the engine with ``work_dir`` as its cwd, in its
    own session (a terminal's Ctrl-C does not reach it) and with a watchdog
    that SIGKILLs it as soon as this Python process is gone (SIGKILL
    included; the engine ignores SIGTERM). Returns its path, or None where it
    cannot be executed (noexec mount)."""
    path = os.path.join(work_dir, "vizdoom-launcher.sh")
    guard = ""
    if os.path.isfile(ENGINE_GUARD) and sys.executable:
        guard = f"{shlex.quote(sys.executable)} -I -S {shlex.quote(ENGINE_GUARD)} {os.getpid()} "
    with open(path, "w") as f:
        f.write(
            "#!/bin/sh\n"
            "# a3c_core: run ViZDoom from its private runtime dir (_vizdoom/ goes here)\n"
            "# a terminal's Ctrl-C must not reach the engine before the guard's setsid:\n"
            "# SIGINT stays ignored across exec (the engine is stopped by close/SIGKILL)\n"
            "trap '' INT\n"
            f"cd {shlex.quote(work_dir)} || exit 1\n"
            "# the engine keeps this pid through both execs (DoomEnv.kill_engine)\n"
            f"echo $$ > {ENGINE_PID_FILE}\n"
            f'exec {guard}{shlex.quote(engine)} "$@"\n'
        )
    os.chmod(path, 0o700)
    return path if os.access(path, os.X_OK) else None


def _setup_runtime_dir(vizdoom, runtime_dir):
    """Create the env's private runtime dir; returns ``(dir, launcher|None)``."""
    parents = []
    if runtime_dir is not None:
        parents.append(os.path.join(os.path.abspath(os.fspath(runtime_dir)), "vizdoom"))
    parents.append(None)  # system temp dir, also the fallback for noexec run dirs
    engine = _engine_path(vizdoom)
    work_dir = None
    for parent in parents:
        work_dir = _make_private_dir(parent)
        if sys.platform == "win32" or not os.path.isfile(engine):
            return work_dir, None
        launcher = _write_launcher(work_dir, engine)
        if launcher is not None:
            return work_dir, launcher
        remove_runtime_dir(work_dir, runtime_dir)
    work_dir = _make_private_dir(parents[0])
    return work_dir, None


def remove_runtime_dir(work_dir, runtime_dir):
    """Remove an env's private runtime dir ``work_dir`` (:attr:`DoomEnv.work_dir`),
    then its ``vizdoom`` parent under ``runtime_dir`` once that is empty."""
    shutil.rmtree(work_dir, ignore_errors=True)
    parent = os.path.dirname(work_dir)
    if runtime_dir is not None and os.path.basename(parent) == "vizdoom":
        try:
            os.rmdir(parent)  # only when empty: other envs may still use it
        except OSError:
            pass


def _close_engine(game, pidfd=None):
    """Close ``game``'s engine (under :data:`INIT_LOCK`) and its pidfd."""
    if pidfd is not None:
        try:
            os.close(pidfd)
        except OSError:
            pass
    if game is not None:
        with INIT_LOCK:
            try:
                game.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                pass


def _release(game, work_dir, runtime_dir, pidfd=None):
    """Finalizer: close the engine, then remove its runtime files."""
    _close_engine(game, pidfd)
    remove_runtime_dir(work_dir, runtime_dir)


def engine_seed(seed, generation):
    """The seed of an env's ``generation``-th engine (0: the env's own
    ``seed``): a fixed function of both, so a run that recycles its engines
    (:data:`ENGINE_RECYCLE_EPISODES`) replays exactly from the same seed."""
    if generation == 0:
        return int(seed) & 0x7FFFFFFF
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(generation)])
               .generate_state(1)[0]) & 0x7FFFFFFF


class DoomEnv(Env):
    """One ViZDoom game as an :class:`~a3c_core.envs.base.Env`.

    Args:
        scenario: shipped scenario name (``'basic'``) or path to a ``.cfg``.
        seed: seeds the game; with the same seed and actions every episode
            sequence (observations, rewards) repeats exactly.
        frame_skip: tics per step (``make_action(onehot, frame_skip)``); 4.
        runtime_dir: where the engine's runtime files go (a private subdir of
            ``runtime_dir/vizdoom/``); default: a temp dir. Removed on close.
        render: also keep RGB frames for :meth:`render_frame` (the game then
            renders RGB24 and the gray obs is computed exactly as GRAY8 would).
        episode_timeout: override the cfg's timeout, in tics (0 = none).
        game_args: extra engine arguments (str), e.g. ``"+sv_cheats 1"``.
        health_reward: add ``health_reward`` x the step's change in the
            player's HEALTH to the reward (0 = off). A medkit then pays at
            once instead of only through the death it postpones; the shaping
            summed over the episode is :attr:`episode_shaping`, which the
            trainer subtracts from the score it logs.
        ammo_reward: add ``ammo_reward`` x the step's change in the selected
            weapon's ammo (SELECTED_WEAPON_AMMO) to the reward (0 = off): a
            shot then costs at once instead of only through the kill it can
            no longer make once the ammo is gone (no HUD shows the count).
            A step that switches weapons adds no ammo term (the count read
            is then another weapon's). Summed into :attr:`episode_shaping`
            with the health term.
        action_set: ``"buttons"`` (one action per cfg button, one button
            pressed at a time: the scenario as shipped; a delta button such
            as LOOK_UP_DOWN_DELTA gives two, +1 and -1) or ``"combos"``
            (:func:`button_combos`: one action per combination of a turn, a
            move, a strafe and each other button, none included, so the
            player can turn while it walks or shoots).
        view: ``"full"`` (the whole frame, resized to 84x84) or ``"band"``
            (its middle 60 rows, 30-89 of the 120, where a scenario's
            horizon is, at the full width: resized to 42x160, so distant
            monsters keep twice the width they have in 84x84). It sets
            :attr:`preprocess_spec`; the screen itself is the same.
        recycle_episodes: start a new engine at the :meth:`reset` after
            this many episodes on the current one (0 = never; default
            :data:`ENGINE_RECYCLE_EPISODES`). The new engine's seed is the next
            of this env's stream (:func:`engine_seed`), so runs still repeat
            exactly from their seed.
    """

    def __init__(self, scenario="basic", *, seed=0, frame_skip=None, runtime_dir=None,
                 render=False, episode_timeout=None, game_args=None, health_reward=0.0,
                 ammo_reward=0.0, action_set="buttons", view="full",
                 recycle_episodes=None):
        vzd = import_vizdoom()
        if action_set not in ACTION_SETS:
            raise ValueError(f"action_set must be one of {', '.join(ACTION_SETS)}, got {action_set!r}")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        self.action_set = action_set
        self.view = view
        self.health_reward = _finite("health_reward", health_reward)
        self.ammo_reward = _finite("ammo_reward", ammo_reward)
        self.episode_shaping = 0.0
        # (factor, game variable) per shaping term that is on, and each
        # variable's last value
        self._ammo_var = vzd.GameVariable.SELECTED_WEAPON_AMMO
        self._shaping = [(f, v) for f, v in ((self.health_reward, vzd.GameVariable.HEALTH),
                                             (self.ammo_reward, self._ammo_var))
                         if f]
        self._last_vars = [0.0] * len(self._shaping)
        # SELECTED_WEAPON_AMMO jumps to the other weapon's count on a switch
        # (pistol to fist: -50 in deathmatch): the ammo term skips that step
        self._weapon_var = vzd.GameVariable.SELECTED_WEAPON if self.ammo_reward else None
        self._weapon = 0.0
        self.env_id, self.cfg_path = resolve_scenario(scenario)
        self.frame_skip = check_frame_skip(frame_skip, DEFAULT_FRAME_SKIP)
        self.seed = int(seed)
        self.render = bool(render)
        self._game = None
        self._closed = False
        self.engine_pid = None
        self._engine_fd = None

        self._episode_timeout_arg = episode_timeout
        self._game_args = game_args
        self.recycle_episodes = (ENGINE_RECYCLE_EPISODES if recycle_episodes is None
                                 else int(recycle_episodes))
        if self.recycle_episodes < 0:
            raise ValueError(f"recycle_episodes must be >= 0 (0 = never), got {recycle_episodes!r}")
        #: engines started so far after the first (:meth:`_recycle`)
        self.engine_generation = 0
        self._episodes_on_engine = 0
        game = self._new_game(vzd, self.seed)
        n_buttons = game.get_available_buttons_size()
        if n_buttons == 0:
            raise ValueError(f"{self.env_id}: the config declares no available_buttons")

        self._runtime_dir = runtime_dir
        self._work_dir, self._launcher = _setup_runtime_dir(vzd, runtime_dir)
        if self._launcher is None:
            warnings.warn(
                "ViZDoom launcher could not be made executable; the engine will "
                "create ./_vizdoom/ in the current working directory",
                RuntimeWarning, stacklevel=2,
            )
        self._finalizer = weakref.finalize(self, _release, None, self._work_dir, runtime_dir)
        self._start(game)

        buttons = [b.name for b in game.get_available_buttons()]
        # preallocated button vectors, indexed by action (no per-step allocation)
        if action_set == "combos":
            combos = button_combos(buttons)
            self.action_names = ["+".join(c) or "NOOP" for c in combos]
            self._actions = [button_vector(buttons, c) for c in combos]
        else:
            self.action_names = button_presses(buttons)
            self._actions = [button_vector(buttons, (p,)) for p in self.action_names]
        self.n_actions = len(self._actions)
        self.obs_shape = (game.get_screen_height(), game.get_screen_width())
        self.obs_dtype = np.dtype(np.uint8)
        self.obs_kind = "image"
        crop, out_shape = VIEWS[self.view]
        self.preprocess_spec = dict(IMAGE_PREPROCESS, out_shape=list(out_shape),
                                    crop=list(crop) if any(crop) else None)
        self._zero_obs = np.zeros(self.obs_shape, dtype=np.uint8)
        self._zero_obs.flags.writeable = False
        self._rgb = np.zeros(self.obs_shape + (3,), dtype=np.uint8)
        self._episode_timeout = game.get_episode_timeout()

    def _new_game(self, vzd, seed):
        """A configured, not yet started ``DoomGame`` seeded with ``seed``."""
        game = vzd.DoomGame()
        game.load_config(self.cfg_path)
        _check_wad_paths(game, self.env_id, self.cfg_path)
        self._configure(vzd, game, self._episode_timeout_arg, self._game_args)
        game.set_seed(int(seed))
        return game

    def _start(self, game):
        """Start ``game``'s engine in this env's runtime dir and make it the
        env's engine (its pid for :meth:`kill_engine`, the finalizer that
        closes it)."""
        game.set_doom_config_path(os.path.join(self._work_dir, "_vizdoom.ini"))
        if self._launcher is not None:
            game.set_vizdoom_path(self._launcher)
        try:
            with INIT_LOCK, sigint_blocked():
                game.init()
        except Exception as exc:
            self._finalizer()
            raise RuntimeError(
                f"ViZDoom failed to start {self.env_id} ({self.cfg_path}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._game = game
        self._episodes_on_engine = 0
        # the engine's process, for kill_engine (the step watchdog, a stuck shutdown);
        # a pidfd names this process only, however late the kill comes
        self.engine_pid = _engine_pid(self._work_dir)
        self._engine_fd = None
        if self.engine_pid is not None and hasattr(os, "pidfd_open"):
            try:
                self._engine_fd = os.pidfd_open(self.engine_pid)
            except OSError:
                pass
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, game, self._work_dir,
                                           self._runtime_dir, self._engine_fd)

    def _recycle(self):
        """Replace the engine with a new one between episodes (its seed the
        next of this env's stream, :func:`engine_seed`): a ViZDoom engine's
        resident memory grows with the episodes it plays, a new one starts
        small. The runtime dir stays."""
        old, fd = self._game, self._engine_fd
        # a kill_engine racing the swap finds no engine rather than a closed
        # pidfd whose number another env's engine may get next
        self._engine_fd = self.engine_pid = None
        self._finalizer.detach()
        # a finalizer that closes nothing and keeps the dir, while the old one goes
        self._finalizer = weakref.finalize(self, _release, None, self._work_dir, self._runtime_dir)
        _close_engine(old, fd)
        self.engine_generation += 1
        self._start(self._new_game(import_vizdoom(), engine_seed(self.seed, self.engine_generation)))

    def _configure(self, vzd, game, episode_timeout, game_args):
        """The standard workload on top of the cfg, plus scenario quirks."""
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_audio_buffer_enabled(False)
        game.set_automap_buffer_enabled(False)
        game.set_depth_buffer_enabled(False)
        game.set_labels_buffer_enabled(False)
        game.set_notifications_buffer_enabled(False)
        game.set_console_enabled(False)
        game.set_mode(vzd.Mode.PLAYER)
        game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        fmt = vzd.ScreenFormat.RGB24 if self.render else vzd.ScreenFormat.GRAY8
        game.set_screen_format(fmt)
        if episode_timeout is not None:
            game.set_episode_timeout(int(episode_timeout))

        quirk = {}
        if os.path.dirname(self.cfg_path) == os.path.abspath(vzd.scenarios_path):
            quirk = SCENARIO_QUIRKS.get(os.path.basename(self.cfg_path)[: -len(".cfg")], {})
        if quirk.get("game_args"):
            game.add_game_args(quirk["game_args"])
        iwad = os.path.basename(game.get_doom_game_path()).lower()
        if iwad in _DOOM1_IWADS and _cfg_value(self.cfg_path, "doom_map") is None:
            game.set_doom_map("E1M1")  # Doom-1 IWADs have no MAP01: init would hang
        if game_args:
            game.add_game_args(str(game_args))

    # -- hot loop --------------------------------------------------------------
    def reset(self):
        if self.recycle_episodes and self._episodes_on_engine >= self.recycle_episodes:
            self._recycle()
        self._episodes_on_engine += 1
        game = self._game
        self.episode_over = False
        self.episode_end = None
        game.new_episode()
        self._last_obs = self._observe(game.get_state())
        if self._shaping:
            self.episode_shaping = 0.0
            self._last_vars = [game.get_game_variable(v) for _, v in self._shaping]
            if self._weapon_var is not None:
                self._weapon = game.get_game_variable(self._weapon_var)
        return self._last_obs

    def step(self, action):
        if not 0 <= action < self.n_actions:
            self._raise_bad_action(action)
        game = self._game
        reward = game.make_action(self._actions[action], self.frame_skip)
        if self._shaping:
            switched = False
            if self._weapon_var is not None:
                weapon = game.get_game_variable(self._weapon_var)
                switched, self._weapon = weapon != self._weapon, weapon
            shaping = 0.0
            for i, (factor, var) in enumerate(self._shaping):
                value = game.get_game_variable(var)
                if not (switched and var == self._ammo_var):
                    shaping += factor * (value - self._last_vars[i])
                self._last_vars[i] = value
            self.episode_shaping += shaping
            reward += shaping
        if game.is_episode_finished():
            # Timeout -> truncated; death/goal -> terminated.
            dead = game.is_player_dead()
            truncated = game.is_episode_timeout_reached() and not dead
            self.episode_over = True
            # the scenario's goal (basic's kill, deadly_corridor's vest) ends it alive
            self.episode_end = "died" if dead else "timed out" if truncated else "ended alive"
            if truncated:
                # The engine has no frame once the episode is over. A trainer that
                # bootstraps a time-limit cut (truncation_bootstrap, off for doom
                # by default) needs V(obs), so return the last frame seen (the
                # closest observation there is); termination needs none.
                return self._last_obs, reward, False, True
            if self.render:
                self._rgb = np.zeros(self.obs_shape + (3,), dtype=np.uint8)
            return self._zero_obs, reward, True, False
        if self.render:
            obs = self._last_obs = self._observe(game.get_state())
            return obs, reward, False, False
        obs = self._last_obs = game.get_state().screen_buffer
        return obs, reward, False, False

    def _observe(self, state):
        if state is None:
            return self._zero_obs
        buf = state.screen_buffer
        if not self.render:
            return buf
        self._rgb = buf
        return rgb_to_gray8(buf)

    # -- extras ----------------------------------------------------------------
    def render_frame(self):
        """RGB uint8 ``(120, 160, 3)`` of the current state (``render=True``)."""
        if not self.render:
            raise RuntimeError(f"{self.env_id}: create the env with render=True to render frames")
        return self._rgb.copy()

    def spec(self):
        d = super().spec()
        d["kind"] = "doom"
        d["cfg"] = self.cfg_path
        d["action_set"] = self.action_set   # make_env(id, action_set=) rebuilds the actions
        d["view"] = self.view               # ... and view= the preprocessing
        return d

    @property
    def work_dir(self):
        """The env's private runtime dir (the engine's ini and ``_vizdoom/``),
        removed by :meth:`close`; a worker process that dies leaves it behind
        (:func:`remove_runtime_dir`)."""
        return self._work_dir

    @property
    def engine(self):
        """The ``vizdoom.DoomGame`` this adapter drives (None once closed): for
        benchmarks that compare the adapter with a bare engine loop."""
        return self._game

    def frame_rate(self):
        rate = DOOM_TICRATE
        try:
            rate = int(self._game.get_ticrate()) or DOOM_TICRATE
        except Exception:  # noqa: BLE001 - older vizdoom / closed game: the engine default
            pass
        return rate, f"{rate} tics/s"

    def kill_engine(self) -> bool:
        """SIGKILL the engine process (from any thread): a ``make_action``
        waiting on it raises (ViZDoom: an unexpected exit of its instance).
        True if a signal was sent."""
        if self._closed or self.engine_pid is None:
            return False
        import signal

        fd = self._engine_fd
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(self.engine_pid, signal.SIGKILL)
        except OSError:         # gone already (or the fd closed by a racing close)
            return False
        return True

    def close(self):
        if not self._closed:
            self._closed = True
            self._finalizer()
            self._game = None


def rgb_to_gray8(rgb):
    """uint8 ``(H, W, 3)`` RGB -> uint8 ``(H, W)``, bit-exact with ViZDoom GRAY8
    (the engine's float64 ``0.21 R + 0.72 G + 0.07 B``, summed in that order
    and truncated)."""
    rgb = np.asarray(rgb, dtype=np.float64)
    gray = 0.21 * rgb[..., 0]
    gray += 0.72 * rgb[..., 1]
    gray += 0.07 * rgb[..., 2]
    return gray.astype(np.uint8)
