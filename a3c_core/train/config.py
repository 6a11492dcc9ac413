"""The one configuration object of a training run.

Every hyperparameter is a field of :class:`Config` with its help text in the
field metadata; the ``a3c train`` command line is generated from it, a TOML
file can set any field (``a3c train --config run.toml``), and command-line
flags override the file.  :meth:`Config.validate` rejects bad values with a
message that names the field.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from typing import Optional

OPTIMIZERS = ("rmsprop", "adam", "sgd")
SPECS = ("auto", "doom-lstm", "doom-ff", "mlp-lstm", "mlp")
DEFAULT_LR = {"rmsprop": 7e-4, "adam": 1e-4, "sgd": 1e-2}


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _f(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class Config:
    """A3C training configuration (defaults: the standard doom:basic workload)."""

    env: str = _f("doom:basic", "environment id: doom:<scenario>, doom:<path.cfg>, gym:<id> or a gymnasium id")
    spec: str = _f("auto", "network spec: auto (doom-lstm for images, mlp-lstm for vectors), doom-lstm, doom-ff, mlp-lstm, mlp")
    hidden: str = _f("64,64", "hidden layer sizes of the mlp/mlp-lstm encoders, comma separated")
    lstm_size: int = _f(64, "LSTM size of mlp-lstm (doom-lstm uses 256)")
    workers: int = _f(0, "number of worker threads (0 = number of CPU cores)")
    pin_threads: bool = _f(True, "pin worker i and its ViZDoom engine process to core i mod cores (Linux; +33% steps/s with 1 worker on 2 cores)")
    t_max: int = _f(20, "rollout length: steps per update (truncated BPTT window)")
    gamma: float = _f(0.99, "discount factor")
    gae_lambda: float = _f(1.0, "GAE lambda (1.0 = n-step returns as in the A3C paper)")
    truncation_bootstrap: Optional[bool] = _f(None, "bootstrap from V(s_T) when an episode is cut by a time limit; default: false for doom (the scenario timeout is part of the task; bootstrapping it drives V to the endless living penalty and stalls learning on doom:basic), true for gymnasium TimeLimit")
    optimizer: str = _f("adam", "shared optimizer: adam (shared moments and step; learns doom:basic fastest here), rmsprop (A3C paper, shared statistics) or sgd")
    lr: float = _f(0.0, "learning rate (0 = optimizer default: rmsprop 7e-4, adam 1e-4, sgd 1e-2)")
    lr_anneal: bool = _f(False, "anneal the learning rate linearly to 0 over total_steps (rmsprop)")
    rmsprop_alpha: float = _f(0.99, "RMSProp decay of the shared squared-gradient statistics")
    rmsprop_eps: float = _f(0.1, "RMSProp epsilon (inside the square root, as in the paper)")
    adam_beta1: float = _f(0.9, "Adam beta1")
    adam_beta2: float = _f(0.999, "Adam beta2")
    adam_eps: float = _f(1e-8, "Adam epsilon")
    entropy_beta: Optional[float] = _f(None, "entropy bonus coefficient (default 0.01 for doom, 0.001 otherwise)")
    value_coef: float = _f(0.5, "value-loss coefficient")
    max_grad_norm: float = _f(40.0, "global gradient-norm clip (0 = no clipping)")
    total_steps: int = _f(300_000, "stop after this many agent steps in total (0 = no limit)")
    total_seconds: float = _f(0.0, "stop after this many seconds of training wall-clock (0 = no limit)")
    target_reward: Optional[float] = _f(None, "stop once the moving-average raw episode reward reaches this (optional)")
    reward_window: int = _f(100, "episodes in the moving average of raw reward")
    seed: int = _f(0, "random seed (worker i uses seed + i for its env and action sampling)")
    reward_scale: Optional[float] = _f(None, "multiply rewards by this for learning (default 0.01 for doom, 0.1 otherwise)")
    frame_skip: Optional[int] = _f(None, "frames per action (default 4 for doom, 1 for gymnasium)")
    frame_size: int = _f(84, "image observations are resized to frame_size x frame_size")
    run_dir: str = _f("", "run directory (default runs/<env>-<spec>-s<seed>-<timestamp>)")
    checkpoint_interval: float = _f(60.0, "seconds between 'latest' checkpoints (0 = only at the end)")
    log_interval: float = _f(1.0, "seconds between progress lines and scalar logs")
    tensorboard: bool = _f(True, "also write TensorBoard scalars when tensorboardX is installed")
    quiet: bool = _f(False, "no live progress line")

    # -- derived values -------------------------------------------------
    def n_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)

    def learning_rate(self) -> float:
        return self.lr if self.lr > 0 else DEFAULT_LR[self.optimizer]

    def hidden_sizes(self) -> tuple:
        return tuple(int(h) for h in str(self.hidden).split(",") if h.strip())

    def is_doom(self) -> bool:
        return self.env.startswith("doom:")

    def bootstrap_truncated(self) -> bool:
        if self.truncation_bootstrap is not None:
            return bool(self.truncation_bootstrap)
        return not self.is_doom()

    def effective_reward_scale(self) -> float:
        if self.reward_scale is not None:
            return float(self.reward_scale)
        return 0.01 if self.is_doom() else 0.1

    def effective_entropy_beta(self) -> float:
        """Per env family, by measurement: doom:basic learns with 0.01 (the
        standard workload); on CartPole-v1 0.01 keeps the policy too random
        (plateau at 420-456) while 0.001 reaches 475 in ~10 s."""
        if self.entropy_beta is not None:
            return float(self.entropy_beta)
        return 0.01 if self.is_doom() else 0.001

    # -- validation -------------------------------------------------------
    def validate(self) -> "Config":
        """Check every field; raise :class:`ConfigError` naming the first bad one."""

        def bad(name, why):
            raise ConfigError(f"config field '{name}' = {getattr(self, name)!r}: {why}")

        for f in fields(self):
            v = getattr(self, f.name)
            want = _base_type(f)
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
            if want is float and v != v:
                bad(f.name, "must not be NaN")
            if want is str and not isinstance(v, str):
                bad(f.name, "must be a string")
        if not self.env.strip():
            bad("env", "must name an environment")
        if self.spec not in SPECS:
            bad("spec", f"unknown network spec; choose one of {', '.join(SPECS)}")
        try:
            hs = self.hidden_sizes()
        except ValueError:
            bad("hidden", "must be comma-separated positive integers, e.g. 64,64")
        if not hs or min(hs) <= 0:
            bad("hidden", "must be comma-separated positive integers, e.g. 64,64")
        if self.lstm_size <= 0:
            bad("lstm_size", "must be > 0")
        if self.workers < 0:
            bad("workers", "must be >= 0 (0 = number of cores)")
        if self.t_max < 1:
            bad("t_max", "must be >= 1")
        if not 0.0 <= self.gamma <= 1.0:
            bad("gamma", "must be in [0, 1]")
        if not 0.0 <= self.gae_lambda <= 1.0:
            bad("gae_lambda", "must be in [0, 1]")
        if self.optimizer not in OPTIMIZERS:
            bad("optimizer", f"unknown optimizer; choose one of {', '.join(OPTIMIZERS)}")
        if self.lr < 0:
            bad("lr", "must be >= 0 (0 = optimizer default)")
        if not 0.0 <= self.rmsprop_alpha < 1.0:
            bad("rmsprop_alpha", "must be in [0, 1)")
        if self.rmsprop_eps <= 0:
            bad("rmsprop_eps", "must be > 0")
        if not 0.0 <= self.adam_beta1 < 1.0:
            bad("adam_beta1", "must be in [0, 1)")
        if not 0.0 <= self.adam_beta2 < 1.0:
            bad("adam_beta2", "must be in [0, 1)")
        if self.adam_eps <= 0:
            bad("adam_eps", "must be > 0")
        if self.entropy_beta is not None and self.entropy_beta < 0:
            bad("entropy_beta", "must be >= 0")
        if self.value_coef < 0:
            bad("value_coef", "must be >= 0")
        if self.max_grad_norm < 0:
            bad("max_grad_norm", "must be >= 0 (0 = no clipping)")
        if self.total_steps < 0:
            bad("total_steps", "must be >= 0 (0 = no limit)")
        if self.total_seconds < 0:
            bad("total_seconds", "must be >= 0 (0 = no limit)")
        if self.lr_anneal and self.total_steps == 0:
            bad("lr_anneal", "needs total_steps > 0 to anneal over")
        if self.reward_window < 1:
            bad("reward_window", "must be >= 1")
        if self.seed < 0:
            bad("seed", "must be >= 0")
        if self.reward_scale is not None and not self.reward_scale > 0:
            bad("reward_scale", "must be > 0")
        if self.frame_skip is not None and self.frame_skip < 1:
            bad("frame_skip", "must be >= 1")
        if self.frame_size < 36:
            bad("frame_size", "must be >= 36 (the conv stack needs at least 36x36)")
        if self.checkpoint_interval < 0:
            bad("checkpoint_interval", "must be >= 0")
        if self.log_interval <= 0:
            bad("log_interval", "must be > 0")
        return self

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config") -> "Config":
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for k, v in d.items():
            key = k.replace("-", "_")
            if key not in known:
                raise ConfigError(
                    f"{source}: unknown config field '{k}'; known fields: {', '.join(sorted(known))}"
                )
            kwargs[key] = _coerce(known[key], v)
        return cls(**kwargs).validate()

    @classmethod
    def from_toml(cls, path: str) -> "Config":
        import tomllib

        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        data = data.get("a3c", data)  # allow an [a3c] table or top-level keys
        return cls.from_dict(data, source=path)

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


def _base_type(f):
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
    if _base_type(f) is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))
