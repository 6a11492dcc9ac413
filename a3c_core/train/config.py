"""The one configuration object of a training run.

Every hyperparameter is a field of :class:`Config` with its help text in the
field metadata; the ``a3c train`` command line is generated from it, a TOML
file can set any field (``a3c train --config run.toml``), and command-line
flags override the file.  :meth:`Config.validate` rejects bad values with a
message that names the field.

The options of one env family (Doom's view, Atari's no-op starts, ...) are
not fields: ``env_options`` maps them by name, and the family's record
(:attr:`a3c_core.envs.families.EnvFamily.options`) says which exist, what
values each takes and its ``a3c train`` flag.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Optional

from a3c_core.envs import unknown_id_error
from a3c_core.envs.families import FAMILIES, EnvFamily, EnvOption, UnknownEnvId, family_of
from a3c_core.specs import SPECS, spec_options

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from the registry (pyproject: tomli below 3.11)
    import tomli as tomllib


#: fields that earlier versions had, and why each went (docs/results.md has the
#: measurements).  A run saved with one still resumes (the field is ignored and
#: reported); a new config or command line that sets one is an error naming it.
REMOVED_FIELDS = {
    "entropy_target": "the entropy floor did not stop doom:basic's collapses (one of 3 runs "
                      "jumped to uniform play); use entropy_beta",
    "uniform_kl": "the KL(uniform || pi) penalty did not stop doom:basic's collapses",
    "policy_epsilon": "the epsilon-mixture policy did not stop doom:basic's collapses",
    "adam_clip_relative": "Adam's relative clip did not stop doom:basic's collapses (1 of 3 seeds)",
    "advantage_scale_max": "the cap on the advantage multiplier did not stop doom:basic's "
                           "collapses (1 of 3 seeds)",
    "cross_episode": "rollouts of t_max steps across episodes needed 1.4x the agent steps to "
                     "learn doom:basic; merge_below merges short episodes",
    "adam_beta1": "Adam keeps its defaults (0.9, 0.999, 1e-8); no run measured a change",
    "adam_beta2": "Adam keeps its defaults (0.9, 0.999, 1e-8); no run measured a change",
    "adam_eps": "Adam keeps its defaults (0.9, 0.999, 1e-8); no run measured a change",
    "min_rollout": "fixed values needed more agent steps to learn doom:basic (10 reached 75 "
                   "within 300k steps on 1 of 3 seeds, the paper's rollouts on 3 of 3); "
                   "merge_below merges short episodes",
    "exploration": "the RND bonus cost 1.23x the learner's time per agent step and helped in no "
                   "measured case (doom:my_way_home: first on one seed, last on the other)",
    "exploration_scale": "the weight of the removed RND bonus (exploration)",
    "optimizer": "Adam is the one optimizer: RMSProp (the A3C paper's) did not improve "
                 "doom:basic within 300k steps and no run measured a use for it or for SGD",
    "rmsprop_alpha": "a setting of the removed RMSProp optimizer (optimizer)",
    "rmsprop_eps": "a setting of the removed RMSProp optimizer (optimizer)",
    "obs_norm_frames": "obs_norm measures on 2,000 frames of random play; no run measured "
                       "another count",
    "advantage_horizon": "the advantages' running RMS averages over 20,000 samples; no run "
                         "measured another horizon",
    "reward_window": "every figure and target is an average over 100 episodes (avg100, and "
                     "avg1000 for the long one); no run measured another window",
    "max_skipped_updates": "a run stops after 100 updates in a row skipped for non-finite "
                           "gradients; no run measured another limit",
    "lr_anneal_floor": "the anneal ends at 0.1 x lr so a longer run still learns; no run "
                       "measured another floor",
    "value_coef": "the A3C value-loss weight; --value-coef 1 on doom:defend_the_line ended level "
                  "with 0.5 (avg1000 29.59 against 29.25)",
}

#: episodes in the short moving average of raw rewards (avg100: the progress
#: line, ``target_reward``); the long one spans 10x as many
REWARD_WINDOW = 100
#: updates in a row skipped for non-finite gradients that stop a run
MAX_SKIPPED_UPDATES = 100
#: where ``lr_anneal`` ends, as a fraction of lr
LR_ANNEAL_FLOOR = 0.1
#: the weight of the value loss against the policy loss
VALUE_COEF = 0.5

#: the removed fields that became constants, with their value: a saved run
#: that set one to it resumes silently (nothing changes); another value is
#: ignored and reported like any removed field's
REMOVED_TO_CONSTANTS = {"reward_window": REWARD_WINDOW, "max_skipped_updates": MAX_SKIPPED_UPDATES,
                        "lr_anneal_floor": LR_ANNEAL_FLOOR, "value_coef": VALUE_COEF}

#: the shared optimizer (Adam with shared moments); a checkpoint of a run
#: that trained with another (rmsprop, sgd) cannot resume
OPTIMIZER = "adam"

#: what a run saved before a field existed trained with, by field: a saved
#: config (``Config.from_dict(saved_run=True)``, what ``--resume`` reads) that
#: lacks the field gets this value instead of today's default, so the run
#: resumes as it trained.  A callable gets the saved config and returns the
#: value, or None to leave the default.  (The env options its family's spec
#: records come from :attr:`EnvFamily.spec_options` the same way.)
SAVED_RUN_DEFAULTS = {
    "merge_below": 0.0,             # rollouts ended with their episode (the A3C paper's)
    "obs_norm": False,              # raw frames
    "self_imitation": False,        # no replays
    # one env per worker: a run saved before the batched worker keeps the
    # paper's worker on a scenario whose default is now 8 (doom:basic)
    "envs_per_worker": 1,
    # lr_anneal on (the two fields came together): to 0 over total_steps; the
    # floor is a constant now, so such a run resumes to LR_ANNEAL_FLOOR and
    # is told that its lr_anneal_floor was ignored
    "lr_anneal_steps": lambda d: 0 if d.get("lr_anneal") is True else None,
    "lr_anneal_floor": lambda d: 0.0 if d.get("lr_anneal") is True else None,
}


def removed_flag(argv) -> str | None:
    """The first ``--flag`` in ``argv`` that names a removed field, with why (or None)."""
    for a in argv:
        name = a.split("=", 1)[0]
        if name.startswith("--"):
            key = name[2:].replace("-", "_").removeprefix("no_")
            if key in REMOVED_FIELDS:
                return f"{name} was removed: {REMOVED_FIELDS[key]}"
    return None


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _f(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


def env_options_by_name() -> dict[str, tuple[EnvFamily, EnvOption]]:
    """What some env's ``env_options`` may set: every env family's options,
    by name, each with its family (the first where two share a name)."""
    records = {}
    for family in FAMILIES:
        for name, option in family.options.items():
            records.setdefault(name, (family, option))
    return records


def _env_options_help() -> str:
    takes = "; ".join(f"{family.name}: {', '.join(family.options)}"
                      for family in FAMILIES if family.options)
    return (f"options of the env's family, by name ({takes}); each has its own flag "
            "(--view band) and a TOML file sets them in an [env_options] table; an option "
            "left out takes the family's or scenario's default")


# Sane ranges: (low, high) inclusive; a value outside is an error naming the field.
_RANGES = {
    "workers": (0, 256),
    "envs_per_worker": (1, 64),
    "t_max": (1, 10_000),
    "merge_below": (0.0, 1e9),
    "lstm_size": (1, 8192),
    "frame_size": (8, 512),
    "frame_skip": (1, 64),
    "seed": (0, 2**32 - 1),
    "lr": (0.0, 1.0),
    "lr_anneal_steps": (0, 10**15),
    "entropy_beta": (0.0, 10.0),
    "max_grad_norm": (0.0, 1e9),
    "reward_scale": (0.0, 1e9),
    "reward_clip": (0.0, 1e9),
    "total_steps": (0, 10**15),
    "total_seconds": (0.0, 10 * 365 * 86400.0),
    "checkpoint_interval": (0.0, 7 * 86400.0),
    "log_interval": (0.01, 3600.0),
    "env_restarts": (0, 10**6),
    "worker_restarts": (0, 10**6),
    "env_step_timeout": (0.0, 7 * 86400.0),
}

@dataclass
class Config:
    """A3C training configuration (defaults: the standard doom:basic workload)."""

    env: str = _f("doom:basic", "environment id: doom:<scenario>, doom:<path.cfg>, an Atari id (ALE/Pong-v5, PongNoFrameskip-v4), gym:<id> or a gymnasium id")
    spec: str = _f("auto", "network spec, or auto: the env family's (doom-lstm for images, doom-ff on doom:defend_the_line, atari-lstm for Atari and doom:my_way_home, mlp-lstm for vectors)")
    hidden: Optional[str] = _f(None, "hidden layer sizes of the mlp/mlp-lstm encoder, comma separated (default 64,64)")
    lstm_size: Optional[int] = _f(None, "LSTM size (default: the spec's, 256 for the image specs, 64 for mlp-lstm)")
    workers: int = _f(0, "number of workers, 0-256 (0 = one per CPU core)")
    envs_per_worker: Optional[int] = _f(None, "envs each worker steps in lockstep, 1-64: one forward per tick over their K rows, one update over all their rows (1 = the A3C paper's worker); default: the scenario's, 8 on doom:basic, simpler_basic, rocket_basic, defend_the_center, health_gathering and take_cover, else 1")
    worker_processes: Optional[bool] = _f(None, "run workers as processes sharing memory instead of threads (default: on Linux, processes for workers 0 or >= 8, threads below)")
    pin_threads: bool = _f(True, "pin worker i and its ViZDoom engine to core i mod cores (Linux)")
    t_max: Optional[int] = _f(None, "rollout length: ticks per update (truncated BPTT window), 1-10000; default: 20, or with envs_per_worker > 1 the scenario's (10; take_cover 20)")
    gamma: float = _f(0.99, "discount factor, in [0, 1]")
    gae_lambda: Optional[float] = _f(None, "GAE lambda, in [0, 1] (default: the family's, 1.0 = n-step returns as in the A3C paper; 0.95 on doom:defend_the_line)")
    truncation_bootstrap: Optional[bool] = _f(None, "bootstrap from V(s_T) when a time limit cuts an episode (default: the env family's; off for doom)")
    lr: float = _f(0.0, "learning rate, in [0, 1] (0 = the family's default for the optimizer and network; a resumed run keeps its own)")
    lr_anneal: Optional[bool] = _f(None, "anneal lr linearly to 0.1 x lr over lr_anneal_steps, then hold (default: the family's; on for doom-lstm, off on doom:defend_the_line and doom:my_way_home)")
    lr_anneal_steps: int = _f(1_000_000, "agent steps the anneal lasts, whatever the run's budget (0 = total_steps)")
    adam_amsgrad: Optional[bool] = _f(None, "Adam: AMSGrad (default: the family's; on for the vector specs)")
    entropy_beta: Optional[float] = _f(None, "entropy bonus coefficient, in [0, 10] (default: the family's, 0.01)")
    max_grad_norm: float = _f(40.0, "global gradient-norm clip (0 = no clipping)")
    reward_scale: Optional[float] = _f(None, "multiply rewards by this fixed factor; 0 = divide them by the running std of the discounted return (default: 0; 1 on doom:my_way_home)")
    normalize_advantages: Optional[bool] = _f(None, "divide advantages by their running RMS (default: the family's; off for Atari and doom:my_way_home)")
    merge_below: float = _f(8.0, "a worker whose last 1,000 episodes average fewer steps than this lets a rollout run on into the next episode until it holds t_max / 2 steps (0 = off: every rollout ends with its episode, as in the A3C paper)")
    self_imitation: Optional[bool] = _f(None, "self-imitation learning (Oh et al. 2018): each worker keeps its best whole episodes and replays them, learning from the steps whose return beat the value (default: the scenario's; on for doom:deadly_corridor, else off)")
    obs_norm: Optional[bool] = _f(None, "normalize image frames by a mean frame and std measured on random play (default: the family's; on for doom and Atari)")
    reward_clip: Optional[float] = _f(None, "clip raw rewards to [-reward_clip, reward_clip] for learning (default: the family's; 1 for Atari, 0 = off)")
    total_steps: int = _f(300_000, "stop after this many agent steps (0 = no limit)")
    total_seconds: float = _f(0.0, "stop after this many seconds of training (0 = no limit)")
    target_reward: Optional[float] = _f(None, "stop once the 100-episode average of raw rewards "
                                              "reaches this (summary.json: target_reached); default: no target")
    seed: int = _f(0, "random seed: worker i's env and sampling are seeded from (seed, i, resume count)")
    frame_skip: Optional[int] = _f(None, "frames per action, 1-64 (default: the family's; 4 for doom and Atari, 1 otherwise)")
    frame_size: Optional[int] = _f(None, "resize image observations to frame_size x frame_size (default: the env's; 84 for doom, 42x160 with --view band, 42 for Atari and doom:my_way_home)")
    env_options: dict = field(default_factory=dict, metadata={"help": _env_options_help()})
    env_process: Optional[bool] = _f(None, "run each env in a child process (default: the family's; on for Atari, whose step holds the GIL)")
    run_dir: str = _f("", "run directory (default runs/<env>[-<spec>]-s<seed>-<YYYYmmdd-HHMMSS>)")
    checkpoint_interval: float = _f(60.0, "seconds between 'latest' checkpoints (0 = only at the end)")
    log_interval: float = _f(1.0, "seconds between scalar logs and progress-line updates")
    env_restarts: int = _f(3, "an env whose step or reset fails (a crashed ViZDoom engine, a dead env process, any exception) is rebuilt in place with the same seed, its episode dropped; up to this many times per worker in any hour, after which the failure stops the run (0 = never rebuild)")
    worker_restarts: int = _f(3, "worker processes: one that dies without a word (SIGKILL, the OOM killer) is forked again from the shared parameters, with new envs, up to this many times per run, after which a death stops the run (0 = never restart)")
    env_step_timeout: float = _f(30.0, "seconds an env step may take before it counts as a hang (or 50 x the env's median step, whichever is larger): its engine is killed and the env rebuilt as a crashed one (0 = no watchdog)")
    tensorboard: bool = _f(True, "also write TensorBoard scalars when tensorboardX is installed")
    quiet: bool = _f(False, "no live progress line")

    def __post_init__(self):
        if isinstance(self.env_options, dict):   # a copy: no two configs share one
            self.env_options = dict(self.env_options)

    # -- derived values -------------------------------------------------
    def env_option(self, name: str):
        """The value ``env_options`` sets for option ``name``, or None when unset."""
        return self.env_options.get(name)

    def n_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)

    def hidden_sizes(self) -> tuple:
        return tuple(int(h) for h in str(self.hidden).split(",") if h.strip())

    def net_kwargs(self, spec: str) -> dict:
        """Spec options set by the config (unset fields keep the spec's defaults);
        ConfigError when a set field does not apply to ``spec``."""
        opts = spec_options(spec)
        kw = {}
        if self.hidden is not None:
            if "hidden" not in opts:
                raise ConfigError(f"config field 'hidden' = {self.hidden!r}: spec {spec!r} has no "
                                  "hidden layers to size (only the mlp specs do)")
            kw["hidden"] = self.hidden_sizes()
        if self.lstm_size is not None:
            if "lstm_size" not in opts:
                raise ConfigError(f"config field 'lstm_size' = {self.lstm_size!r}: spec {spec!r} "
                                  "has no LSTM")
            kw["lstm_size"] = self.lstm_size
        return kw

    def family(self) -> EnvFamily:
        """The env family record of ``env`` (ConfigError naming the field when none)."""
        try:
            return family_of(self.env)
        except UnknownEnvId as e:
            raise ConfigError(f"config field 'env' = {self.env!r}: "
                              f"{unknown_id_error(self.env.strip(), str(e))}") from None
        except ValueError as e:
            raise ConfigError(f"config field 'env' = {self.env!r}: {e}") from None

    # -- validation -------------------------------------------------------
    def validate(self) -> "Config":
        """Check every field; raise :class:`ConfigError` naming the first bad one."""

        def bad(name, why):
            raise ConfigError(f"config field '{name}' = {getattr(self, name)!r}: {why}")

        for f in fields(self):
            v = getattr(self, f.name)
            want = base_type(f)
            if v is None:
                if not _optional(f):
                    bad(f.name, "must not be empty")
                continue
            if want is bool and not isinstance(v, bool):
                bad(f.name, "must be true or false")
            if want is int and (isinstance(v, bool) or not isinstance(v, int)):
                bad(f.name, "must be an integer")
            if want is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
                bad(f.name, "must be a number")
            if want is float and not math.isfinite(v):
                bad(f.name, "must be a finite number")
            if want is str and not isinstance(v, str):
                bad(f.name, "must be a string")
            if f.name in _RANGES:
                lo, hi = _RANGES[f.name]
                if not lo <= v <= hi:
                    bad(f.name, f"must be in [{lo}, {hi}]")
        if not self.env.strip():
            bad("env", "must name an environment")
        specs = ("auto",) + tuple(SPECS)
        if self.spec not in specs:
            bad("spec", f"unknown network spec; choose one of {', '.join(specs)}")
        if self.hidden is not None:
            try:
                hs = self.hidden_sizes()
            except ValueError:
                hs = ()
            if not hs or min(hs) <= 0 or max(hs) > 65536:
                bad("hidden", "must be comma-separated integers in [1, 65536], e.g. 64,64")
        if not 0.0 <= self.gamma <= 1.0:
            bad("gamma", "must be in [0, 1]")
        if self.gae_lambda is not None and not 0.0 <= self.gae_lambda <= 1.0:
            bad("gae_lambda", "must be in [0, 1]")
        if self.lr_anneal and self.lr_anneal_steps == 0 and self.total_steps == 0:
            bad("lr_anneal", "with lr_anneal_steps 0 anneals over total_steps, which is 0 "
                "(no limit): set --lr-anneal-steps or --total-steps")
        if not isinstance(self.env_options, dict):
            bad("env_options", "must be a table of option = value, e.g. {view = \"band\"}")
        if self.env_options:
            self._check_env_options(self.family())
        return self

    def _check_env_options(self, family: EnvFamily) -> None:
        """ConfigError naming the first option of ``env_options`` that
        ``family`` (the env's) does not take, or whose value it refuses."""
        for name, value in self.env_options.items():
            what = f"config field 'env_options.{name}' = {value!r}"
            option = family.options.get(name)
            if option is None:
                takes = (f"{family.name} envs take {', '.join(family.options)}" if family.options
                         else f"{family.name} envs take no options")
                others = [f.name for f in FAMILIES if name in f.options]
                if others:
                    raise ConfigError(f"{what}: applies to {' and '.join(others)} envs only; "
                                      f"{self.env} is a {family.name} env ({takes})")
                raise ConfigError(f"{what}: {self.env} (a {family.name} env) has no such "
                                  f"option; {takes}")
            why = option.problem(value)
            if why:
                raise ConfigError(f"{what}: {why}")

    def pinned(self, r: "Resolved") -> "Config":
        """This config with the family defaults it left unset written out from
        ``r`` (:func:`resolve` of it): what a run saves as its config.toml, so
        that ``--resume`` keeps the settings the run trained with when a newer
        version changes a default.  Fields the user set stay as they are; the
        network (``spec`` auto) is the checkpoint's on resume."""
        vals = dict(obs_norm=r.obs_norm, reward_clip=r.reward_clip,
                    truncation_bootstrap=r.truncation_bootstrap,
                    normalize_advantages=r.normalize_advantages, entropy_beta=r.entropy_beta,
                    gae_lambda=r.gae_lambda, lr_anneal=r.anneal_steps > 0,
                    frame_skip=r.env_args["frame_skip"],
                    reward_scale=r.reward_scale or 0.0, frame_size=r.frame_size,
                    self_imitation=r.self_imitation, adam_amsgrad=r.amsgrad)
        options = {k: r.env_args[k] for k in self.family().options if k in r.env_args}
        return self.replace(env_options={**options, **self.env_options},
                            **{k: v for k, v in vals.items()
                               if getattr(self, k) is None and v is not None})

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config", saved_run: bool = False,
                  ignored: list | None = None, overrides: dict | None = None) -> "Config":
        """A validated config from ``d``, with ``overrides`` (the command
        line's fields; its ``env_options`` add to ``d``'s) set over it.

        A field in :data:`REMOVED_FIELDS` is a :class:`ConfigError` naming
        it, unless ``saved_run`` (``d`` is the config a run saved, read by
        ``--resume``): then it is dropped and its name appended to
        ``ignored`` (not where it holds the constant it became,
        :data:`REMOVED_TO_CONSTANTS`), and a field the saved config lacks
        takes the value the run trained with (:data:`SAVED_RUN_DEFAULTS`,
        and the env options of :attr:`EnvFamily.spec_options`).  An env
        option at the top level of ``d`` (as configs had them before
        ``env_options``) moves into ``env_options``."""
        known = {f.name: f for f in fields(cls)}
        d = {k.replace("-", "_"): v for k, v in d.items()}
        overrides = dict(overrides or {})
        env = str(overrides.get("env", d.get("env", cls.env)))
        d = _top_level_options_moved(d, env, source)
        if saved_run:
            saved = dict(d)
            for name, value in SAVED_RUN_DEFAULTS.items():
                if name not in saved:
                    value = value(saved) if callable(value) else value
                    if value is not None:
                        d[name] = value
            family = _family_or_none(env)
            if family is not None:
                d["env_options"] = {**family.spec_options, **d["env_options"]}
        kwargs = {}
        for key, v in d.items():
            if key in REMOVED_FIELDS:
                if saved_run:
                    constant = key in REMOVED_TO_CONSTANTS and v == REMOVED_TO_CONSTANTS[key]
                    if ignored is not None and not constant:
                        ignored.append(key)
                    continue
                raise ConfigError(f"{source}: config field '{key}' was removed: "
                                  f"{REMOVED_FIELDS[key]}")
            if key not in known:
                raise ConfigError(
                    f"{source}: unknown config field '{key}'; known fields: {', '.join(sorted(known))}"
                )
            kwargs[key] = _coerce(known[key], v)
        # d's own values are checked as they stand (a bad one is an error even
        # where a flag replaces it), its env options against the env they
        # will run on
        if "env" in overrides:
            kwargs["env"] = overrides["env"]
        cfg = cls(**kwargs).validate()
        if "env_options" in overrides:
            overrides["env_options"] = {**cfg.env_options, **overrides["env_options"]}
        return cfg.replace(**overrides) if overrides else cfg

    @classmethod
    def from_toml(cls, path: str, *, saved_run: bool = False, ignored: list | None = None,
                  overrides: dict | None = None) -> "Config":
        """:meth:`from_dict` of the TOML file ``path`` (its ``[a3c]`` table, if
        it has one; env options in an ``[env_options]`` table)."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        data = data.get("a3c", data)  # allow an [a3c] table or top-level keys
        return cls.from_dict(data, source=path, saved_run=saved_run, ignored=ignored,
                             overrides=overrides)

    def to_toml(self) -> str:
        lines = ["# a3c_core training configuration"]
        for f in fields(self):
            v = getattr(self, f.name)
            lines.append(f"# {f.metadata['help']}")
            if v is None:
                lines.append(f"# {f.name} = (unset)")
            else:
                lines.append(f"{f.name} = {_toml_value(v)}")
        return "\n".join(lines) + "\n"

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes).validate()


def _family_or_none(env: str) -> Optional[EnvFamily]:
    try:
        return family_of(env)
    except ValueError:
        return None


def _top_level_options_moved(d: dict, env: str, source: str) -> dict:
    """``d`` (a config's fields) with the env options it sets at the top
    level, as configs did before ``env_options``, moved into its
    ``env_options`` (a dict in the result; ints where an option takes a
    float are floats, as :func:`_coerce` makes a field's).  One that
    ``env``'s family does not take is dropped where it holds its own
    family's default: a run's config.toml wrote noop_max and
    terminal_on_life_loss whatever its env, and they never applied there;
    another stays for validation to name."""
    options = d.get("env_options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{source}: config field 'env_options' = {options!r}: must be a table "
                          f"of option = value")
    options = dict(options)
    records = env_options_by_name()
    family = _family_or_none(env)
    out = {}
    for key, value in d.items():
        if key not in records:
            out[key] = value
            continue
        if key in options:
            raise ConfigError(f"{source}: env option '{key}' is set twice, at the top level and "
                              f"in env_options; keep the env_options one")
        owner = records[key][0]
        if family is not None and key not in family.options \
                and value == getattr(owner.defaults, key, None):
            continue
        options[key] = value
    for key, value in options.items():
        if key in records and records[key][1].kind is float and type(value) is int:
            options[key] = float(value)
    out["env_options"] = options
    return out


#: from this many workers, worker processes are the default on Linux.  doom:basic
#: on a 16-core Xeon (a3c bench end-to-end rows): 1 worker 983 steps/s as a thread,
#: 880 as a process; 8 workers 5,228 against 6,151; 16 workers 6,674 against 10,924
PROCESS_WORKERS = 8


@dataclass(frozen=True)
class Resolved:
    """Every ``auto`` value of a :class:`Config`, resolved from its env family's
    record (:mod:`a3c_core.envs.families`), the network spec and the machine.
    :func:`resolve` is the one place this happens."""

    family: str
    spec: str
    env_args: dict                  #: make_env's frame_skip, env_process and adapter options
    obs_norm: bool
    reward_clip: float
    reward_scale: Optional[float]   #: None: rewards divided by the running std of the return
    frame_size: Optional[int]       #: None: the env's own image size
    truncation_bootstrap: bool
    normalize_advantages: bool
    entropy_beta: float
    gae_lambda: float
    lr: float
    amsgrad: bool
    anneal_steps: int               #: 0: no anneal
    merge_below: float              #: 0: every rollout ends with its episode
    self_imitation: bool
    records_resets: bool            #: a rollout may hold a new segment after its first row
    n_workers: int
    worker_processes: bool
    backend_reason: str             #: why threads or processes, for the run line


def env_args(cfg: Config) -> dict:
    """:func:`~a3c_core.envs.make_env`'s arguments besides the id, seed and
    runtime dir: frame skip, env process and the family's adapter options."""
    family = cfg.family()
    d = family.defaults_for(cfg.env)
    args = {"frame_skip": d.frame_skip if cfg.frame_skip is None else cfg.frame_skip,
            "env_process": d.env_process if cfg.env_process is None else cfg.env_process}
    for name in family.options:
        value = cfg.env_option(name)
        if value is None:               # the family's (or scenario's) default, if it has one
            value = getattr(d, name, None)
        if value is not None:
            args[name] = value
    return args


#: the rollout length of the paper's worker, and of the batched worker (K > 1).
#: On doom:basic t_max 5 reached avg100 75 sooner but fell back after it, the
#: paper's worker too (K = 1 at t_max 5: avg100 down to -100), as its rollouts
#: cut most of basic's ~6-step episodes and bootstrap them; K = 8 at t_max 20
#: needed 2.2x the agent steps of K = 1 (fewer, larger updates); at t_max 10,
#: K = 4 and K = 8 stayed learned (docs/results.md#the-batched-worker)
T_MAX = 20
T_MAX_BATCHED = 10
#: the rows per update the family's Adam rate is measured for in the batched
#: worker (K x t_max): K = 4 at t_max 10 learned at the family's 1e-4
BATCHED_LR_ROWS = 40


def rollout_defaults(cfg: Config) -> Config:
    """``cfg`` with ``envs_per_worker`` and ``t_max`` filled in where unset:
    the scenario's K, then t_max 20 for K = 1, or for K > 1 the scenario's
    ``batched_t_max``, else 10 (ConfigError naming the field for an unknown
    env).  The trainer runs on this."""
    k, t = cfg.envs_per_worker, cfg.t_max
    if k is None or (t is None and k > 1):
        d = cfg.family().defaults_for(cfg.env)
        k = d.envs_per_worker if k is None else k
        if t is None and k > 1:
            t = d.batched_t_max or T_MAX_BATCHED
    if t is None:
        t = T_MAX
    if (k, t) == (cfg.envs_per_worker, cfg.t_max):
        return cfg
    return cfg.replace(envs_per_worker=k, t_max=t)


def scaled_lr(lr: float, cfg: Config) -> float:
    """Adam's default rate for ``cfg``'s rollouts, as PAAC scales its rate
    with its envs: ``lr`` times the rows of one update (K x t_max) over the
    rows it was measured for, at least 1x: the paper's 20 for K = 1,
    :data:`BATCHED_LR_ROWS` (40) for K > 1.  Measured on doom:basic at t_max
    10: K = 4 (1x, 1e-4) and K = 8 (2x, 2e-4) reached avg100 75 and stayed
    learned."""
    c = rollout_defaults(cfg)
    base = T_MAX if c.envs_per_worker == 1 else BATCHED_LR_ROWS
    return lr * max(1.0, c.envs_per_worker * c.t_max / base)


def backend_choice(cfg: Config) -> tuple:
    """``(worker processes?, why)`` for the run line: the config's flag when set,
    else processes on Linux for one worker per core or from :data:`PROCESS_WORKERS`."""
    n = cfg.n_workers()
    if cfg.worker_processes is not None:
        flag = "--worker-processes" if cfg.worker_processes else "--no-worker-processes"
        return bool(cfg.worker_processes), f"{flag}"
    if not sys.platform.startswith("linux"):
        return False, "worker processes need Linux"
    if cfg.workers == 0 and n > 1:
        return True, "one per core: processes share no GIL"
    if n >= PROCESS_WORKERS:
        return True, f"{n} workers >= {PROCESS_WORKERS}: processes share no GIL"
    return False, f"{n} workers < {PROCESS_WORKERS}: threads were as fast"


def resolve(cfg: Config, obs_kind: str = "image") -> Resolved:
    """The run's effective settings: ``cfg``'s values where set, else its env
    family's defaults (``obs_kind``, the env's ``'image'`` or ``'vector'``,
    picks the network).  ConfigError naming ``env`` when no family takes it."""
    family = cfg.family()
    d = family.defaults_for(cfg.env)
    spec = cfg.spec if cfg.spec != "auto" else d.network.get(obs_kind, "mlp-lstm"
                                                                if obs_kind == "vector"
                                                                else "doom-lstm")
    tuning = d.tuning_for(spec)
    pick = (lambda value, default: default if value is None else value)
    # Adam's rate comes from the env family's record (:class:`~a3c_core.envs.families.Tuning`)
    lr = cfg.lr if cfg.lr > 0 else scaled_lr(tuning.adam_lr, cfg)
    anneals = pick(cfg.lr_anneal, tuning.lr_anneal)
    merge_below = float(cfg.merge_below)
    n = cfg.n_workers()
    processes, why = backend_choice(cfg)
    return Resolved(
        family=family.name, spec=spec, env_args=env_args(cfg),
        obs_norm=bool(pick(cfg.obs_norm, d.obs_norm)),
        reward_clip=float(pick(cfg.reward_clip, d.reward_clip)),
        reward_scale=pick(cfg.reward_scale, d.reward_scale) or None,     # 0: normalized
        frame_size=pick(cfg.frame_size, d.frame_size),
        truncation_bootstrap=bool(pick(cfg.truncation_bootstrap, d.truncation_bootstrap)),
        normalize_advantages=bool(pick(cfg.normalize_advantages, d.normalize_advantages)),
        entropy_beta=float(pick(cfg.entropy_beta, d.entropy_beta)),
        gae_lambda=float(pick(cfg.gae_lambda, d.gae_lambda)),
        lr=float(lr), amsgrad=bool(pick(cfg.adam_amsgrad, tuning.amsgrad)),
        anneal_steps=(cfg.lr_anneal_steps or cfg.total_steps) if anneals else 0,
        merge_below=merge_below,
        self_imitation=bool(pick(cfg.self_imitation, d.self_imitation)),
        records_resets=merge_below > 0 or rollout_defaults(cfg).envs_per_worker > 1,
        n_workers=n, worker_processes=processes, backend_reason=why)


def base_type(f):
    """The plain type of Config field ``f`` (bool, int, float or str; object
    otherwise), its ``Optional[...]`` taken off: what its command-line flag parses."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if name in t:
            return typ
    return object


def _optional(f):
    t = f.type if isinstance(f.type, str) else str(f.type)
    return "Optional" in t or "None" in t


def _coerce(f, v):
    """Ints are fine where floats are expected (TOML ``lr = 1`` is 1.0)."""
    if base_type(f) is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def _toml_value(v):
    if isinstance(v, dict):         # an inline table
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))
