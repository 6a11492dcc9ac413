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

import difflib

from . import proc as _proc
from .atari import is_atari_id
from .base import Env
from .doom import list_doom_scenarios, remove_runtime_dir
from .families import (FAMILIES, EnvFamily, UnknownEnvId, family_of, register_family,
                       supported_forms)

__all__ = ["Env", "EnvFamily", "FAMILIES", "family_of", "register_family", "make_env",
           "list_doom_scenarios", "remove_runtime_dir", "is_atari_id", "supported_forms", "unknown_id_error"]


def make_env(env_id, *, seed=0, frame_skip=None, runtime_dir=None, render=False,
             env_process=None, **kwargs):
    """Build an :class:`Env` from an id, through its family's record
    (:mod:`a3c_core.envs.families`; see the module docstring for the forms).

    Args:
        env_id: ``'doom:basic'``, ``'doom:path/to/x.cfg'``, ``'ALE/Pong-v5'``,
            ``'PongNoFrameskip-v4'``, ``'atari:Pong'``, ``'gym:CartPole-v1'``
            or ``'CartPole-v1'``.
        seed: makes episodes reproducible (same seed + same actions -> same
            observations and rewards).
        frame_skip: frames per step; ``None`` -> the family's default (4 for
            Doom and Atari, 1 for Gymnasium).
        runtime_dir: directory for simulator runtime files (the run dir);
            default: a temp dir. Never the current working directory.
        render: enable :meth:`Env.render_frame` (RGB frames for GIFs).
        env_process: run the env in a child process
            (:class:`~a3c_core.envs.proc.ProcEnv`, same interface) so the
            calling thread waits for it without the GIL. ``None``: the
            family's default (on for Atari, whose step holds the GIL).
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
    if env_process not in (None, True, False):
        raise ValueError(f"env_process must be None, True or False, got {env_process!r}")
    try:
        family = family_of(env_id)
    except UnknownEnvId as exc:
        raise unknown_id_error(env_id.strip(), str(exc)) from None
    env_id = env_id.strip()
    defaults = family.defaults_for(env_id)
    common = dict(seed=seed, frame_skip=defaults.frame_skip if frame_skip is None else frame_skip,
                  runtime_dir=runtime_dir, render=render)
    if env_process is None:
        env_process = defaults.env_process
    if env_process:
        return _proc.ProcEnv(env_id, **common, **kwargs)
    try:
        return family.build(env_id, **common, **kwargs)
    except UnknownEnvId as exc:
        raise unknown_id_error(env_id, str(exc)) from None


def unknown_id_error(env_id, reason) -> ValueError:
    """The error for an id no family builds: the forms, the Doom scenarios, close matches."""
    parts = [f"Unknown env id {env_id!r} ({reason})."]
    parts.append(f"Supported forms: {supported_forms()}.")
    try:
        scenarios = list_doom_scenarios()
    except ImportError:
        parts.append("Doom scenarios: vizdoom is not installed (pip install 'a3c_core[doom]').")
    else:
        name = env_id.rpartition(":")[2]
        close = difflib.get_close_matches(name, scenarios, n=3, cutoff=0.6)
        if close:
            parts.append(f"Did you mean: {', '.join('doom:' + c for c in close)}?")
        parts.append(f"Doom scenarios: {', '.join(scenarios)}.")
    return ValueError(" ".join(parts))
