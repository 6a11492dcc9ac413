"""Environments: declared id forms plus one builder, :func:`make_env`.

Id forms:

* ``doom:<scenario>`` - a scenario shipped with vizdoom (``doom:basic``,
  ``doom:defend_the_center``, ...; see :func:`list_doom_scenarios`);
* ``doom:<path to a .cfg>`` - any ViZDoom config file;
* ``ALE/Pong-v5``, ``PongNoFrameskip-v4`` or ``atari:Pong`` - an Atari game
  with standard preprocessing (:class:`~a3c_core.envs.atari.AtariEnv`);
* ``gym:<id>`` or a bare registered Gymnasium id (``CartPole-v1``, or
  ``module:Env-v0``, which imports ``module`` first) - any env with a
  ``Discrete`` action space.

Any env can run in a child process (``env_process=True``,
:class:`~a3c_core.envs.proc.ProcEnv`) so that a worker thread waits for it
without holding the GIL; Atari ids do by default (ALE's step holds the GIL).

Simulators are imported lazily: vizdoom only for ``doom:`` ids, gymnasium only
for Gymnasium ids, ale-py only for Atari ids.
"""
from __future__ import annotations

from .base import Env

__all__ = ["Env", "make_env", "list_doom_scenarios", "is_atari_id", "SUPPORTED_FORMS"]

SUPPORTED_FORMS = (
    "'doom:<scenario>' (a scenario shipped with vizdoom), "
    "'doom:<path to a .cfg file>', "
    "'ALE/Pong-v5', 'PongNoFrameskip-v4' or 'atari:Pong' (Atari), "
    "'gym:<gymnasium id>' or a bare registered gymnasium id such as 'CartPole-v1'"
)


def list_doom_scenarios():
    """Names usable as ``doom:<name>`` (the .cfg files shipped with vizdoom)."""
    from .doom import list_doom_scenarios as _list

    return _list()


def is_atari_id(env_id):
    """True for ids :func:`make_env` builds as Atari envs (``ALE/...``,
    ``*NoFrameskip-v4``, ``atari:<game>``, ...) when ale-py is installed."""
    from .atari import atari_id_defaults

    try:
        return atari_id_defaults(env_id) is not None
    except (ImportError, ValueError):
        return isinstance(env_id, str) and env_id.startswith(("ALE/", "atari:"))


def make_env(env_id, *, seed=0, frame_skip=None, runtime_dir=None, render=False,
             env_process=None, **kwargs):
    """Build an :class:`Env` from an id (see the module docstring for forms).

    Args:
        env_id: ``'doom:basic'``, ``'doom:path/to/x.cfg'``, ``'ALE/Pong-v5'``,
            ``'PongNoFrameskip-v4'``, ``'atari:Pong'``, ``'gym:CartPole-v1'``
            or ``'CartPole-v1'``.
        seed: makes episodes reproducible (same seed + same actions -> same
            observations and rewards).
        frame_skip: frames per step; ``None`` -> 4 for Doom and Atari, 1 for
            Gymnasium.
        runtime_dir: directory for simulator runtime files (the run dir);
            default: a temp dir. Never the current working directory.
        render: enable :meth:`Env.render_frame` (RGB frames for GIFs).
        env_process: run the env in a child process
            (:class:`~a3c_core.envs.proc.ProcEnv`, same interface) so the
            calling thread waits for it without the GIL. ``None``: automatic,
            True for envs known to hold the GIL (Atari), False otherwise.
        **kwargs: adapter options: Doom ``episode_timeout``, ``game_args``;
            Atari ``noop_max``, ``terminal_on_life_loss``,
            ``repeat_action_probability``, ``full_action_space``,
            ``max_episode_frames``; Gymnasium: passed to ``gymnasium.make``.

    Raises:
        ValueError: unknown id (message lists the forms, the Doom scenarios
            and close matches), or an unsupported action/observation space.
        FileNotFoundError: ``doom:<path>`` whose .cfg does not exist.
        ImportError: vizdoom / gymnasium missing (names the extra to install).
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"env_id must be a non-empty string; supported forms: {SUPPORTED_FORMS}")
    env_id = env_id.strip()
    common = dict(seed=seed, frame_skip=frame_skip, runtime_dir=runtime_dir, render=render)
    if env_process not in (None, True, False):
        raise ValueError(f"env_process must be None, True or False, got {env_process!r}")
    from .atari import atari_id_defaults

    atari = atari_id_defaults(env_id)  # ValueError for an unknown atari:<game>
    if env_process is None:
        env_process = atari is not None
    if env_process:
        from .proc import ProcEnv

        return ProcEnv(env_id, **common, **kwargs)
    if atari is not None:
        from .atari import AtariEnv

        return AtariEnv(env_id, **common, **kwargs)
    prefix, sep, rest = env_id.partition(":")
    if sep and prefix == "doom":
        from .doom import DoomEnv, resolve_scenario

        try:
            resolve_scenario(rest)
        except ValueError as exc:
            raise ValueError(f"{exc} Supported id forms: {SUPPORTED_FORMS}.") from None
        return DoomEnv(rest, **common, **kwargs)
    if sep and prefix == "gym":
        gym_id = rest
    elif sep and "/" not in prefix and _is_known_prefix_typo(prefix):
        raise _unknown_id(env_id, f"unknown prefix {prefix + ':'!r}")
    else:
        gym_id = env_id  # bare gymnasium id (or gymnasium's 'module:Env-v0')
    from .gym import GymEnv, check_gym_id

    try:
        check_gym_id(gym_id)
    except ValueError as exc:
        raise _unknown_id(env_id, str(exc)) from None
    return GymEnv(gym_id, **common, **kwargs)


def _is_known_prefix_typo(prefix):
    """'dom:basic', 'gymnasium:CartPole-v1', 'atari:...': a prefix that is not ours
    and not an importable module (gymnasium's 'module:Env-v0' form)."""
    import importlib.util

    try:
        return importlib.util.find_spec(prefix) is None
    except (ImportError, ValueError):
        return True


def _unknown_id(env_id, reason):
    parts = [f"Unknown env id {env_id!r} ({reason})."]
    parts.append(f"Supported forms: {SUPPORTED_FORMS}.")
    try:
        scenarios = list_doom_scenarios()
    except ImportError:
        parts.append("Doom scenarios: vizdoom is not installed (pip install 'a3c_core[doom]').")
    else:
        import difflib

        name = env_id.rpartition(":")[2]
        close = difflib.get_close_matches(name, scenarios, n=3, cutoff=0.6)
        if close:
            parts.append(f"Did you mean: {', '.join('doom:' + c for c in close)}?")
        parts.append(f"Doom scenarios: {', '.join(scenarios)}.")
    return ValueError(" ".join(parts))
