"""Env families as declared records: what an id is, how it is built, and the
defaults a run on it starts from.

Every family (and every scenario of one that needs its own defaults) is one
:class:`EnvFamily` record in :data:`FAMILIES`.  :func:`family_of` finds the
record for an id; :func:`~a3c_core.envs.make_env` builds through it; the
config's ``auto`` values (network, frame skip, observation and reward
treatment, bootstrapping at time limits, env processes, learning rate) are
read from :attr:`EnvFamily.defaults` by one function,
:func:`a3c_core.train.config.resolve`; the options a config's
``env_options`` may set on an env are its record's :attr:`EnvFamily.options`
(:class:`EnvOption`: type, range, help).  Nothing outside ``envs/`` asks
which family an id belongs to.

Adding a family is one record (plus its adapter module)::

    register_family(EnvFamily(
        name="toy", form="'toy:<n>'",
        matches=lambda env_id: env_id.startswith("toy:"),
        build=lambda env_id, **common: ToyEnv(env_id, **common),
        defaults=Defaults(frame_skip=1)))

Why each default is what it is: docs/defaults.md (the measurements are in
docs/results.md and, per scenario, docs/scenarios.md).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Optional

from . import atari as _atari
from . import doom as _doom
from . import gym as _gym
from .base import Env

__all__ = ["Tuning", "Defaults", "EnvOption", "EnvFamily", "FAMILIES", "UnknownEnvId", "family_of",
           "family_named", "register_family", "supported_forms"]


@dataclass(frozen=True)
class Tuning:
    """The optimizer's defaults for one network spec on a family's envs."""

    adam_lr: float = 1e-4          #: Adam's learning rate (RMSProp keeps the A3C paper's)
    amsgrad: bool = False          #: Adam divides by the running max of its second moments
    lr_anneal: bool = False        #: Adam anneals over ``lr_anneal_steps``


#: image networks: Adam at 1e-4, annealed (keeps a converged doom:basic policy)
IMAGE_TUNING = Tuning(adam_lr=1e-4, lr_anneal=True)
#: vector networks: Adam at 3e-4 with AMSGrad (CartPole-v1: 475 within 30 s in 5 of 6 seeds)
VECTOR_TUNING = Tuning(adam_lr=3e-4, amsgrad=True)


def _frozen(d) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Defaults:
    """The values the config's ``auto`` fields take on a family's envs."""

    frame_skip: int = 1
    obs_norm: bool = False                 #: normalize image frames by a measured mean frame
    reward_clip: float = 0.0               #: 0 = rewards are not clipped
    truncation_bootstrap: bool = True      #: bootstrap from V(s_T) at a time limit
    normalize_advantages: bool = True
    env_process: bool = False              #: each env in a child process (envs that hold the GIL)
    entropy_beta: float = 0.01             #: the entropy bonus's coefficient
    gae_lambda: float = 1.0                #: 1 = the A3C paper's n-step returns
    health_reward: float = 0.0             #: Doom: learning reward per point of HEALTH gained
    ammo_reward: float = 0.0               #: Doom: learning reward per round of ammo gained
    #: a fixed learning-reward factor (None: divide by the running std of the return)
    reward_scale: Optional[float] = None
    #: image frames resized to frame_size x frame_size (None: the env's own size)
    frame_size: Optional[int] = None
    action_set: str = "buttons"            #: Doom: one button per action, or their combos
    view: str = "full"                     #: Doom: the whole frame, or its horizon band
    noop_max: int = _atari.DEFAULT_NOOP_MAX    #: Atari: no-op actions at an episode's start
    terminal_on_life_loss: bool = False    #: Atari: a lost life ends the episode for learning
    #: Atari: the sticky-action probability (None: the id's own)
    repeat_action_probability: Optional[float] = None
    self_imitation: bool = False           #: replay each worker's best episodes (SIL)
    #: envs a worker steps in lockstep (1: the A3C paper's worker)
    envs_per_worker: int = 1
    #: the batched worker's (K > 1) rollout ticks (None: the trainer's, 10);
    #: the paper's worker keeps its 20
    batched_t_max: Optional[int] = None
    #: network spec by observation kind
    network: Mapping[str, str] = field(
        default_factory=lambda: _frozen({"image": "doom-lstm", "vector": "mlp-lstm"}))
    #: optimizer defaults by network spec (a spec not listed: the optimizer's own)
    tuning: Mapping[str, Tuning] = field(default_factory=lambda: _frozen({}))

    def tuning_for(self, spec: str) -> Tuning:
        return self.tuning.get(spec, Tuning())


@dataclass(frozen=True)
class EnvOption:
    """One option a family's envs take: a keyword of its ``build`` that a
    config's ``env_options`` (and the ``a3c train`` flag of the same name)
    sets.  ``kind`` is bool, int, float or str; ``bounds`` the inclusive
    range of a number, ``choices`` the values a string takes.  Where a
    config leaves it unset the env gets its family's (or scenario's)
    :class:`Defaults` field of the same name, if there is one."""

    name: str
    kind: type
    help: str                                   #: the ``a3c train --help`` text
    bounds: Optional[tuple] = None
    choices: tuple = ()

    def problem(self, value) -> Optional[str]:
        """Why ``value`` is not one this option takes (None when it is one)."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind is bool and not isinstance(value, bool):
            return "must be true or false"
        if self.kind is int and not (number and isinstance(value, int)):
            return "must be an integer"
        if self.kind is float and not number:
            return "must be a number"
        if self.kind is float and not math.isfinite(value):
            return "must be a finite number"
        if self.kind is str and not isinstance(value, str):
            return "must be a string"
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:
            return f"must be in [{self.bounds[0]}, {self.bounds[1]}]"
        if self.choices and value not in self.choices:
            return f"choose one of {', '.join(self.choices)}"
        return None


def _options(*options: EnvOption) -> Mapping[str, EnvOption]:
    return _frozen({o.name: o for o in options})


@dataclass(frozen=True)
class EnvFamily:
    """One family of env ids.

    ``build(env_id, *, seed, frame_skip, runtime_dir, render, **options)``
    returns an :class:`~a3c_core.envs.base.Env` (whose spec's ``kind`` is
    the family's ``name``); ``options`` are the :class:`EnvOption` records,
    by name, of what a config's ``env_options`` may set on its envs (the one
    list: another option is a ConfigError naming it, the env and these);
    ``spec_options`` maps each option the env's spec records (it changes
    the env's actions or observations, so a checkpoint's env is rebuilt
    with it) to the value a spec or saved config from before it was
    recorded implies;
    ``scenarios`` maps a scenario name (the id after ``prefix:``) to the
    :class:`Defaults` fields it changes; ``env_memory_mb`` is one env's
    resident memory (its engine process included), for the trainer's
    memory check.
    """

    name: str
    form: str                                   #: the id forms, for error messages
    matches: Callable[[str], bool]
    build: Callable[..., Env]
    defaults: Defaults = field(default_factory=Defaults)
    options: Mapping[str, EnvOption] = field(default_factory=lambda: _frozen({}))
    spec_options: Mapping[str, object] = field(default_factory=lambda: _frozen({}))
    scenarios: Mapping[str, Mapping] = field(default_factory=lambda: _frozen({}))
    env_memory_mb: float = 4.0

    def defaults_for(self, env_id: str) -> Defaults:
        """The family's defaults with the overrides of ``env_id``'s scenario."""
        scenario = env_id.partition(":")[2]
        changes = self.scenarios.get(scenario)
        return dataclasses.replace(self.defaults, **changes) if changes else self.defaults

    def trained_options(self, env_spec) -> dict:
        """The :attr:`spec_options` that rebuild the env a checkpoint's
        ``env_spec`` describes as it trained (a value the spec does not
        record: the one it implies)."""
        return {k: env_spec.get(k, old) for k, old in self.spec_options.items()}


# -- the shipped families ------------------------------------------------------

def _is_doom(env_id: str) -> bool:
    return env_id.startswith("doom:")


def _build_doom(env_id, **kw):
    scenario = env_id.partition(":")[2]
    try:
        _doom.resolve_scenario(scenario)      # ValueError naming the scenarios
    except ValueError as exc:
        raise ValueError(f"{exc} Supported id forms: {supported_forms()}.") from None
    return _doom.DoomEnv(scenario, **kw)


def _is_gym(env_id: str) -> bool:
    """The catch-all: ``gym:<id>`` or any bare id that is not another family's
    prefix typo (``dom:basic``)."""
    prefix, sep, _ = env_id.partition(":")
    if not sep or prefix == "gym" or "/" in prefix:
        return True
    try:    # gymnasium's 'module:Env-v0' form imports module first
        return importlib.util.find_spec(prefix) is not None
    except (ImportError, ValueError):
        return False


class UnknownEnvId(ValueError):
    """An id no family knows; :func:`~a3c_core.envs.make_env` adds the forms
    and close matches to its message."""


def _build_gym(env_id, **kw):
    gym_id = env_id[len("gym:"):] if env_id.startswith("gym:") else env_id
    try:
        _gym.check_gym_id(gym_id)
    except ValueError as exc:
        raise UnknownEnvId(str(exc)) from None
    return _gym.GymEnv(gym_id, **kw)


#: defend_the_line's optimizer, without the anneal on either image network
_DEFEND_THE_LINE = _frozen({"doom-lstm": dataclasses.replace(IMAGE_TUNING, lr_anneal=False),
                            "doom-ff": Tuning(adam_lr=1e-4, lr_anneal=False)})
_MY_WAY_HOME = _frozen({"network": _frozen({"image": "atari-lstm"}), "frame_size": 42,
                        "reward_scale": 1.0, "normalize_advantages": False,
                        "tuning": _frozen({"atari-lstm": Tuning(adam_lr=1e-4)})})

DOOM = EnvFamily(
    name="doom",
    form="'doom:<scenario>' (a scenario shipped with vizdoom), 'doom:<path to a .cfg file>'",
    matches=_is_doom, build=_build_doom,
    # the scenario's timeout is part of the task: bootstrapping it drives V to
    # the endless living penalty
    defaults=Defaults(frame_skip=_doom.DEFAULT_FRAME_SKIP, obs_norm=True,
                      truncation_bootstrap=False,
                      network=_frozen({"image": "doom-lstm"}),
                      tuning=_frozen({"doom-lstm": IMAGE_TUNING})),
    options=_options(
        EnvOption("health_reward", float, "Doom: add this x the step's change in the player's "
                  "HEALTH to the learning reward (logged scores stay the scenario's own); "
                  "default: the scenario's, 1 for health_gathering and "
                  "health_gathering_supreme, else 0 = off", bounds=(0.0, 1000.0)),
        EnvOption("ammo_reward", float, "Doom: add this x the step's change in the selected "
                  "weapon's ammo to the learning reward, so a shot costs at once (logged "
                  "scores stay the scenario's own); default: the scenario's, 0.5 for "
                  "defend_the_center, else 0 = off", bounds=(0.0, 1000.0)),
        EnvOption("action_set", str, "Doom: buttons (one action per button of the scenario's "
                  "cfg, one pressed at a time: the scenario as shipped) or combos (one action "
                  "per combination of a turn, a move, a strafe and each other button); "
                  "default: the scenario's, combos on doom:deadly_corridor, else buttons",
                  choices=_doom.ACTION_SETS),
        EnvOption("view", str, "Doom: full (the whole frame, resized to 84x84) or band (the "
                  "frame's middle 60 rows, where the horizon is, at its full width: 42x160); "
                  "default: the scenario's, band on doom:defend_the_line, else full",
                  choices=tuple(_doom.VIEWS))),
    # what a run saved before its spec recorded them trained with: one action
    # per button of the scenario's cfg, the whole frame
    spec_options=_frozen({"action_set": "buttons", "view": "full"}),
    # a ViZDoom engine's resident memory (measured on doom:my_way_home: 18 MB
    # at minute 2, 25 MB at minute 29; docs/reliability.md)
    env_memory_mb=32.0,
    # no HUD shows the player's health, so a medkit changes neither the
    # reward nor anything the critic sees until the death it postpones;
    # paying for health points at once is what stopped health_gathering's
    # collapses (docs/scenarios.md#health_gathering-why-it-collapsed-and-the-fix)
    # defend_the_line is still learning when the anneal has brought the rate
    # to its floor (1M steps, ~6 minutes on 2 cores): without it the avg100
    # at 10 minutes rose on each of 3 seeds; GAE at lambda 0.95 raised the
    # 1,000-episode average at 10 minutes on each of 5 seeds; the monsters
    # it shoots are all in the one frame, and the feedforward doom-ff (no
    # LSTM, Adam 1e-4, no anneal) ran 1.1-1.25x the agent steps, was ahead
    # per step to 1M and at 10 minutes on each of 3 seeds, and level by the
    # 1,000-episode average at 30 (docs/scenarios.md#defend_the_line); its
    # monsters stand on the horizon, a few pixels wide: the band view (the
    # frame's middle 60 rows at the full 160 columns, 42x160) learned more
    # per step on each of 3 seeds and ran more steps (smaller convs)
    # my_way_home (+1 at the goal, which ~15 % of random episodes reach after
    # ~500 steps): the ICM paper's A3C recipe (42x42 frames, four stride-2
    # convs, raw rewards and advantages, entropy 0.01, no anneal) reached the
    # goal in most episodes within 10 minutes, where the image defaults (and
    # the same network with normalized rewards and advantages) stayed near
    # random play's share (docs/scenarios.md#my_way_home-the-icm-papers-a3c-recipe)
    # deadly_corridor: one button at a time, the policy settled on running
    # forward into the fire (~200); with every combination of a turn, a move,
    # a strafe and the attack (as Sample Factory plays it) it can strafe and
    # shoot at once, and reached the vest (docs/scenarios.md#deadly_corridor-button-combinations);
    # 6 runs in 10 were still trapped running into the fire at ~450, and
    # replaying each worker's best episodes (self-imitation) got them out
    # defend_the_center: every episode ran out of its 26 rounds and 41 % of
    # shots missed; the HUD is off, so a miss costs nothing visible until the
    # ammo is gone ~150 steps later. Paying 0.5 a round at once raised the
    # avg100 at 10 minutes from 12.5 to 21.3 (3 of 3 seeds), kills per shot
    # from 0.59 to 0.90 (docs/scenarios.md#defend_the_center-paying-for-ammo)
    # basic: 8 envs per worker in lockstep (t_max 10, Adam 2e-4 by the rows
    # per update) reached avg100 75 in 19.9-34.9 s (median 22.6) against
    # 28.6-38.4 s (33.4) for the paper's worker, interleaved, and stayed
    # learned on 3 of 3 seeds; at t_max 5 it fell back after 75
    # (docs/results.md#the-batched-worker). defend_the_center with 8 envs:
    # avg100 22.2 [21.8-22.3] at 10 minutes against 22.0 [21.2-22.2], first
    # >= 20 after 54-104 s against 105-161 s (docs/scenarios.md).
    # health_gathering, simpler_basic, rocket_basic and take_cover (at t_max
    # 20; at 10 it reached less) with 8 envs: as much or more at 10 minutes,
    # sooner; the other five reached less or, deathmatch, stayed at random
    # play's level (docs/scenarios.md: the table and the findings)
    scenarios=_frozen({"basic": _frozen({"envs_per_worker": 8}),
                       "simpler_basic": _frozen({"envs_per_worker": 8}),
                       "rocket_basic": _frozen({"envs_per_worker": 8}),
                       "health_gathering": _frozen({"health_reward": 1.0, "envs_per_worker": 8}),
                       "health_gathering_supreme": _frozen({"health_reward": 1.0}),
                       "defend_the_line": _frozen({"network": _frozen({"image": "doom-ff"}),
                                                   "tuning": _DEFEND_THE_LINE, "gae_lambda": 0.95,
                                                   "view": "band"}),
                       "defend_the_center": _frozen({"ammo_reward": 0.5, "envs_per_worker": 8}),
                       "take_cover": _frozen({"envs_per_worker": 8, "batched_t_max": 20}),
                       "my_way_home": _MY_WAY_HOME,
                       "deadly_corridor": _frozen({"action_set": "combos",
                                                   "self_imitation": True})}),
)

ATARI = EnvFamily(
    name="atari",
    form="'ALE/Pong-v5', 'PongNoFrameskip-v4' or 'atari:Pong' (Atari)",
    matches=_atari.is_atari_id, build=_atari.AtariEnv,
    # ALE's step holds the GIL: each env steps in a child process; sparse
    # clipped rewards make most normalized advantages value noise
    defaults=Defaults(frame_skip=_atari.DEFAULT_FRAME_SKIP, obs_norm=True, reward_clip=1.0,
                      normalize_advantages=False, env_process=True,
                      network=_frozen({"image": "atari-lstm"}),
                      tuning=_frozen({"atari-lstm": Tuning(adam_lr=1e-4)})),
    options=_options(
        EnvOption("noop_max", int, "Atari: up to this many no-op actions at the start of an "
                  "episode (0 = off)", bounds=(0, 1000)),
        EnvOption("terminal_on_life_loss", bool, "Atari: a lost life ends the episode for "
                  "learning (scores still count whole games)"),
        EnvOption("repeat_action_probability", float, "Atari: sticky-action probability "
                  "(default: the id's, 0.25 for -v5, 0 for NoFrameskip-v4)",
                  bounds=(0.0, 1.0))),
)

GYM = EnvFamily(
    name="gym",
    form="'gym:<gymnasium id>' or a bare registered gymnasium id such as 'CartPole-v1'",
    matches=_is_gym, build=_build_gym,
    defaults=Defaults(tuning=_frozen({"mlp": VECTOR_TUNING, "mlp-lstm": VECTOR_TUNING,
                                      "doom-lstm": IMAGE_TUNING})),
)

#: in matching order: the first record whose ``matches`` accepts an id builds it
#: (gym, the catch-all, stays last)
FAMILIES: list[EnvFamily] = [ATARI, DOOM, GYM]


def register_family(family: EnvFamily) -> EnvFamily:
    """Add ``family`` ahead of the catch-all gym family (a family of the same
    name is replaced).  Returns it."""
    FAMILIES[:] = [f for f in FAMILIES if f.name != family.name]
    FAMILIES.insert(len(FAMILIES) - 1 if FAMILIES and FAMILIES[-1] is GYM else len(FAMILIES),
                    family)
    return family


def supported_forms() -> str:
    return ", ".join(f.form for f in FAMILIES)


def family_named(name) -> Optional[EnvFamily]:
    """The record called ``name`` (an env spec's ``kind``), or None."""
    return next((f for f in FAMILIES if f.name == name), None)


def family_of(env_id: str) -> EnvFamily:
    """The record that builds ``env_id``; ValueError naming the id forms when none does."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"env_id must be a non-empty string; supported forms: {supported_forms()}")
    env_id = env_id.strip()
    for fam in FAMILIES:
        if fam.matches(env_id):
            return fam
    raise UnknownEnvId(f"unknown prefix {env_id.partition(':')[0] + ':'!r}")
