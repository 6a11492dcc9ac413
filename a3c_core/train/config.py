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
import math
import os
from dataclasses import dataclass, field, fields
from typing import Optional



def _network_specs():
    from a3c_core.nn.network import SPECS  # imported late: keeps `a3c --help` light

    return ("auto",) + tuple(SPECS)


def _spec_options(spec: str) -> tuple:
    """Names of the options a network spec accepts (``hidden``, ``lstm_size``, ...)."""
    from a3c_core.nn import network

    if hasattr(network, "spec_options"):
        return tuple(network.spec_options(spec))
    return tuple(network._SPEC_TABLE[spec][2])


#: Adam's default learning rate for the vector-observation specs (mlp, mlp-lstm),
#: which also default to AMSGrad (``Config.amsgrad``).  Measured on CartPole-v1
#: (2 workers, seeds 0-5, one session, bench/RESULTS.md): avg100 475 first at
#: 20-35 s (5 of 6 within 30 s) with AMSGrad at 3e-4, 35-74 s with Adam at 1e-4;
#: plain Adam at 3e-4 crossed early too but then fell to avg100 9-66 in 3 of 3.
#: The image specs keep the optimizer's 1e-4: doom:basic with 3e-4 had not
#: left random play at 275k steps, where 1e-4 had converged.
VECTOR_SPEC_ADAM_LR = 3e-4
VECTOR_SPECS = ("mlp", "mlp-lstm")

#: Specs whose Adam anneals by default (``Config.anneals``): linearly over the
#: first ``lr_anneal_steps`` (1M) agent steps to ``lr_anneal_floor`` (a tenth),
#: whatever the run's budget, so a short run trains like the start of a long
#: one.  doom-lstm on doom:basic (2 workers, bench/RESULTS.md): without it
#: Adam kept moving converged weights by a constant step and the 1,000-episode
#: average fell below 70 in 1 of 7 seeds to 1M steps (13 dips of avg100 below
#: 50 in 5.4M post-crossing steps); annealed to 0 over 1M it held in 4 of 4
#: (one dip in 3M).  An anneal over the main job's 300k steps instead never
#: left random play.
ANNEALED_SPECS = ("doom-lstm",)


def default_lr(optimizer: str, spec: str | None = None) -> float:
    """The default learning rate: the optimizer's own (:mod:`a3c_core.core.optim`),
    except Adam on a vector-observation spec (:data:`VECTOR_SPEC_ADAM_LR`)."""
    import inspect

    from a3c_core.core.optim import OPTIMIZERS as _CLASSES

    if optimizer == "adam" and spec in VECTOR_SPECS:
        return VECTOR_SPEC_ADAM_LR
    return float(inspect.signature(_CLASSES[optimizer]).parameters["lr"].default)


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _f(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


# Sane ranges: (low, high) inclusive; a value outside is an error naming the field.
_RANGES = {
    "workers": (0, 256),
    "envs_per_worker": (1, 64),
    "t_max": (1, 10_000),
    "min_rollout": (0, 10_000),
    "merge_below": (0.0, 1e9),
    "obs_norm_frames": (1, 1_000_000),
    "lstm_size": (1, 8192),
    "frame_size": (8, 512),
    "frame_skip": (1, 64),
    "noop_max": (0, 1000),
    "reward_window": (1, 1_000_000),
    "seed": (0, 2**32 - 1),
    "lr": (0.0, 1.0),
    "lr_anneal_steps": (0, 10**15),
    "lr_anneal_floor": (0.0, 1.0),
    "entropy_beta": (0.0, 10.0),
    "value_coef": (0.0, 1000.0),
    "max_grad_norm": (0.0, 1e9),
    "reward_scale": (0.0, 1e9),
    "reward_clip": (0.0, 1e9),
    "total_steps": (0, 10**15),
    "total_seconds": (0.0, 10 * 365 * 86400.0),
    "checkpoint_interval": (0.0, 7 * 86400.0),
    "log_interval": (0.01, 3600.0),
    "max_skipped_updates": (0, 10**9),
    "repeat_action_probability": (0.0, 1.0),
    "advantage_horizon": (0.0, 1e12),
    "advantage_scale_max": (0.0, 1e12),
    "entropy_target": (0.0, 1.0),
    "uniform_kl": (0.0, 10.0),
    "policy_epsilon": (0.0, 0.5),
}


@dataclass
class Config:
    """A3C training configuration (defaults: the standard doom:basic workload)."""

    env: str = _f("doom:basic", "environment id: doom:<scenario>, doom:<path.cfg>, an Atari id (ALE/Pong-v5, PongNoFrameskip-v4), gym:<id> or a gymnasium id (also module:Env-v0)")
    spec: str = _f("auto", "network spec: auto (the env's default: doom-lstm for images, atari-lstm for Atari, mlp-lstm for vectors) or a spec name")
    hidden: Optional[str] = _f(None, "hidden layer sizes of the mlp/mlp-lstm encoder, comma separated (default 64,64; rejected for image specs)")
    lstm_size: Optional[int] = _f(None, "LSTM size (default: the spec's, 256 for doom-lstm/atari-lstm, 64 for mlp-lstm)")
    workers: int = _f(0, "number of workers, 0-256 (0 = number of CPU cores): threads, or processes with worker_processes")
    envs_per_worker: int = _f(1, "envs each worker thread plays, 1-64: a rollout plays each in turn for up to t_max steps (each with its own LSTM state and episodes, the same parameters) and one update covers them all, so an update's fixed costs (its Python, the clip and apply passes over the flat arrays) are paid once per envs_per_worker x t_max steps. 1 = the A3C paper's worker")
    worker_processes: bool = _f(False, "run each worker in its own process (Linux, forked after the warm-up) instead of a thread: the parameters, the optimizer's statistics and the reward/advantage normalizers live in shared memory that every process updates in place (Hogwild, as threads do), so the workers do not queue for one GIL. On a 16-core Xeon with doom:basic, 16 worker processes ran 1.6-1.7x the steps/s of 16 threads, 8 about the same (bench/RESULTS.md)")
    pin_threads: bool = _f(True, "pin worker i and its ViZDoom engine process to core i mod cores (Linux; +33 percent steps/s with 1 worker on 2 cores)")
    t_max: int = _f(20, "rollout length: steps per update (truncated BPTT window), 1-10000")
    gamma: float = _f(0.99, "discount factor, in [0, 1]")
    gae_lambda: float = _f(1.0, "GAE lambda, in [0, 1] (1.0 = n-step returns as in the A3C paper)")
    truncation_bootstrap: Optional[bool] = _f(None, "bootstrap from V(s_T) when an episode is cut by a time limit (default: false for doom, where the scenario timeout is part of the task and bootstrapping it drives V to the endless living penalty; true for gymnasium/Atari time limits)")
    optimizer: str = _f("adam", "shared optimizer: adam (shared moments and step; learns doom:basic fastest here), rmsprop (A3C paper, shared statistics) or sgd")
    lr: float = _f(0.0, "learning rate, in [0, 1] (0 = the default: rmsprop 7e-4, sgd 1e-3, adam 1e-4 for image networks and 3e-4 for the vector ones, mlp and mlp-lstm). A resumed run keeps the rate it trained with unless lr is given")
    lr_anneal: Optional[bool] = _f(None, "anneal the learning rate linearly from lr to lr x lr_anneal_floor over the first lr_anneal_steps agent steps, then hold it (rmsprop, adam). Default: on for adam on doom-lstm, where it keeps a converged doom:basic policy learned (bench/RESULTS.md); off otherwise")
    lr_anneal_steps: int = _f(1_000_000, "agent steps the anneal lasts, independent of the run's budget so a short run trains like the start of a long one (0 = total_steps: the A3C paper's anneal to the end of the run)")
    lr_anneal_floor: float = _f(0.1, "where the anneal ends, as a fraction of lr, in [0, 1] (0 with lr_anneal_steps 0: the A3C paper's linear decay to 0)")
    rmsprop_alpha: float = _f(0.99, "RMSProp decay of the shared squared-gradient statistics, in [0, 1)")
    rmsprop_eps: float = _f(0.1, "RMSProp epsilon (inside the square root, as in the paper), > 0")
    adam_beta1: float = _f(0.9, "Adam beta1, in [0, 1)")
    adam_beta2: float = _f(0.999, "Adam beta2, in [0, 1)")
    adam_eps: float = _f(1e-8, "Adam epsilon, > 0")
    adam_amsgrad: Optional[bool] = _f(None, "Adam: AMSGrad, divide the step by the running maximum of the second moments, so the step shrinks with the gradients once they shrink (default: on for the vector specs mlp and mlp-lstm, where it lets their 3e-4 learning rate reach CartPole's 475 within 30 s in 5 of 6 seeds with fewer collapses than plain Adam at that rate; off for the image specs, where it slowed doom:basic's first crossing of 75, and at 2e-4 left one seed in 4 at random play for 600k steps; bench/RESULTS.md)")
    adam_clip_relative: float = _f(0.0, "Adam: also clip each gradient to this many times the norm Adam's second moments expect, sqrt(sum v_hat), so that a burst after convergence cannot move every weight by 3.2 x lr (0 = off; see Adam.clip_scale)")
    entropy_beta: float = _f(0.01, "entropy bonus coefficient, in [0, 10] (rewards are normalized by default, so one value fits every env)")
    entropy_target: float = _f(0.0, "entropy floor, as a fraction of the most a policy can have, ln(n_actions), in [0, 1]: while the rollouts' mean entropy is below it the entropy coefficient rises above entropy_beta (x100 at most) and falls back to it above (0 = off, a fixed entropy_beta). Off by default: on doom:basic at 0.1 it lifted 2 of 3 converged runs to ~0.2 nats, but in the third the coefficient wound up to x19 before the policy moved, and it then jumped to uniform play (bench/RESULTS.md)")
    uniform_kl: float = _f(0.0, "coefficient of a KL(uniform || pi) penalty per step, in [0, 10] (0 = off). Unlike the entropy bonus, whose logit gradient vanishes as the policy turns deterministic, its gradient p - 1/A does not, so it bounds the logit margins of a converged policy. Off by default: on doom:basic at 0.04 it held a converged policy at ~0.3 nats and the run still collapsed once (bench/RESULTS.md)")
    policy_epsilon: float = _f(0.0, "act and learn with the mixture (1 - e) pi + e / n_actions, in [0, 0.5] (0 = off): e of the actions are uniform, and the policy gradient is that of log of the mixture, the usual one times w = (1 - e) pi(a) / mixture(a), so an improbable action's score, whose spikes through the convs precede the collapses on doom:basic, is bounded. Off by default: at 0.03 a 1M-step doom:basic run still collapsed once (bench/RESULTS.md)")
    value_coef: float = _f(0.5, "value-loss coefficient, in [0, 1000]")
    max_grad_norm: float = _f(40.0, "global gradient-norm clip (0 = no clipping)")
    reward_scale: Optional[float] = _f(None, "multiply rewards by this fixed factor for learning (default: normalize them by the running standard deviation of the discounted return; see a3c_core.core.normalize)")
    normalize_advantages: Optional[bool] = _f(None, "divide advantages by their RMS, a moving average over advantage_horizon samples, so the policy term has a unit scale beside the entropy bonus (default: on for doom and gymnasium envs, off for Atari, whose sparse clipped rewards make most advantages value noise; bench/RESULTS.md)")
    advantage_scale_max: float = _f(0.0, "with normalize_advantages: the most the advantages are multiplied by (0 = no cap). Dividing by a small RMS amplifies them; after convergence on doom:basic the multiplier reached x6-20 before every collapse seen (bench/RESULTS.md)")
    advantage_horizon: float = _f(20_000.0, "with normalize_advantages: the advantages' RMS is a moving average over about this many samples (0 = over the whole run)")
    cross_episode: bool = _f(False, "rollouts of exactly t_max steps that run on into the next episode (LSTM state reset, no gradient across): one update per t_max steps however short the episodes")
    min_rollout: int = _f(0, "a rollout that reaches an episode's end with fewer than this many steps runs on into the next episode (LSTM state reset, no gradient across) and ends at the first episode end from this many steps on, or at t_max; 0 = every rollout ends with its episode, as in the A3C paper, until merge_below switches a worker whose episodes are short to t_max / 2 (--cross-episode is min_rollout = t_max). A fixed 10 from the start needed more agent steps to learn doom:basic: with the anneal the 300k-step main job reached avg100 75 on 1 of 3 seeds, against 3 of 3 with 0 (bench/RESULTS.md)")
    merge_below: float = _f(8.0, "with min_rollout 0: while a worker's last 1000 episodes average fewer than this many steps, its rollouts run on into the next episode as with min_rollout = t_max / 2, so an update's fixed costs are not paid every few steps; once they average more than t_max steps, rollouts end with their episode again (0 = off: always the A3C paper's rollouts). On doom:basic a learned agent's episodes average ~5.6 steps and the switch comes at about the first avg100 of 75, after the learning that the paper's rollouts do in fewer agent steps (bench/RESULTS.md)")
    obs_norm: Optional[bool] = _f(None, "normalize image observations: subtract the per-pixel mean frame and divide by the frames' standard deviation around it, both measured on obs_norm_frames frames of random play before training and saved with the policy (checkpoints, a3c eval, Policy). A static background then reads as ~0 and what moves stands out at unit scale (default: on for doom and Atari: doom:basic first reached avg100 75 after 64k-91k agent steps with it (5 seeds), 205k-360k without, and PongNoFrameskip-v4 avg100 18 after 1.21M agent steps with it, 2.25M without (seed 0); off for other Gymnasium envs; bench/RESULTS.md)")
    obs_norm_frames: int = _f(2000, "with obs_norm: frames of random play (worker 0's env) the mean frame and the standard deviation are measured on")
    reward_clip: Optional[float] = _f(None, "clip raw rewards to [-reward_clip, reward_clip] for learning, before scaling; raw rewards are still reported (default 1 for Atari, 0 = off otherwise)")
    total_steps: int = _f(300_000, "stop after this many agent steps in total (0 = no limit)")
    total_seconds: float = _f(0.0, "stop after this many seconds of training wall-clock (0 = no limit)")
    target_reward: Optional[float] = _f(None, "stop once the moving-average raw episode reward (reward_window episodes) reaches this (optional)")
    reward_window: int = _f(100, "episodes in the short moving average of raw reward (progress line, target_reward); the long average uses 10x as many")
    seed: int = _f(0, "random seed: worker i's env and action sampling are seeded from (seed, i, resume count)")
    frame_skip: Optional[int] = _f(None, "frames per action, 1-64 (default 4 for doom and Atari, 1 for other gymnasium envs)")
    frame_size: Optional[int] = _f(None, "image observations are resized to frame_size x frame_size (default: the network's input, 84 for doom-lstm, 42 for atari-lstm)")
    noop_max: int = _f(30, "Atari: up to this many no-op actions at the start of an episode (0 = off)")
    terminal_on_life_loss: bool = _f(False, "Atari: a lost life ends the episode for learning (scores still count whole games)")
    repeat_action_probability: Optional[float] = _f(None, "Atari: sticky-action probability (default: the id's, 0.25 for -v5, 0 for NoFrameskip-v4)")
    env_process: Optional[bool] = _f(None, "run each worker's env in a child process, so envs that hold the GIL (Atari) step in parallel (default: on for Atari, off otherwise)")
    run_dir: str = _f("", "run directory (default runs/<env>[-<spec>]-s<seed>-<YYYYmmdd-HHMMSS>)")
    checkpoint_interval: float = _f(60.0, "seconds between 'latest' checkpoints; the first is written after the first update (0 = only at the end)")
    log_interval: float = _f(1.0, "seconds between scalar logs and, at a terminal, progress-line updates; piped output gets a line every max(10, log_interval) seconds")
    max_skipped_updates: int = _f(100, "stop with an error after this many updates in a row are skipped for non-finite gradients (0 = never)")
    tensorboard: bool = _f(True, "also write TensorBoard scalars when tensorboardX is installed")
    quiet: bool = _f(False, "no live progress line")

    # -- derived values -------------------------------------------------
    def n_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)

    def learning_rate(self, spec: str | None = None) -> float:
        """``lr``, or when it is 0 the default for the optimizer and the network
        spec the run resolved (``spec``; None: the optimizer's own default)."""
        return self.lr if self.lr > 0 else default_lr(self.optimizer, spec)

    def amsgrad(self, spec: str | None = None) -> bool:
        """``adam_amsgrad``, or when it is unset the default for the network spec
        the run resolved: on for the vector specs (see :data:`VECTOR_SPECS`)."""
        if self.adam_amsgrad is not None:
            return bool(self.adam_amsgrad)
        return spec in VECTOR_SPECS

    def anneals(self, spec: str | None = None) -> bool:
        """``lr_anneal``, or when it is unset the default for the optimizer and the
        network spec the run resolved: on for Adam on doom-lstm (:data:`ANNEALED_SPECS`)."""
        if self.lr_anneal is not None:
            return bool(self.lr_anneal)
        return self.optimizer == "adam" and spec in ANNEALED_SPECS

    def anneal_horizon(self, spec: str | None = None) -> int:
        """The optimizer's ``anneal_steps``: 0 when the run does not anneal, else
        ``lr_anneal_steps`` (or ``total_steps`` when that is 0)."""
        if not self.anneals(spec):
            return 0
        return self.lr_anneal_steps if self.lr_anneal_steps > 0 else self.total_steps

    def hidden_sizes(self) -> tuple:
        return tuple(int(h) for h in str(self.hidden).split(",") if h.strip())

    def is_doom(self) -> bool:
        return self.env.startswith("doom:")

    def is_atari(self) -> bool:
        from a3c_core.envs import is_atari_id

        return is_atari_id(self.env.removeprefix("gym:"))

    def bootstrap_truncated(self) -> bool:
        if self.truncation_bootstrap is not None:
            return bool(self.truncation_bootstrap)
        return not self.is_doom()

    def advantages_normalized(self) -> bool:
        if self.normalize_advantages is not None:
            return bool(self.normalize_advantages)
        return not self.is_atari()

    def entropy_target_nats(self, n_actions) -> float:
        """The entropy floor in nats for an env with ``n_actions`` (0 = off)."""
        if self.entropy_target <= 0 or n_actions < 2:
            return 0.0
        return float(self.entropy_target) * math.log(n_actions)

    def effective_min_rollout(self) -> int:
        """Steps a rollout holds before an episode end may end it (see
        ``min_rollout``): t_max with cross_episode, else min_rollout."""
        if self.cross_episode:
            return self.t_max
        return self.min_rollout

    def obs_normalized(self) -> bool:
        """``obs_norm``, or when unset: on for doom and Atari (image
        observations), off for other Gymnasium envs."""
        if self.obs_norm is not None:
            return bool(self.obs_norm)
        return self.is_doom() or self.is_atari()

    def effective_merge_below(self) -> float:
        """``merge_below`` where it applies (the paper's rollouts: min_rollout
        0 or 1, no cross_episode), else 0."""
        return float(self.merge_below) if self.effective_min_rollout() <= 1 else 0.0

    def runs_across_episodes(self) -> bool:
        """Whether rollouts may run on into the next episode (cross_episode,
        min_rollout > 1, or merge_below's switch): the warm-up then also
        compiles the LSTM backward's reset variant."""
        return self.effective_min_rollout() > 1 or self.effective_merge_below() > 0

    def records_resets(self) -> bool:
        """Whether a rollout's recorded rows may hold a new segment after
        the first row: rollouts across episodes (:meth:`runs_across_episodes`)
        or several envs per worker (each env's part starts one).  The
        warm-up then also compiles the LSTM backward's reset variant."""
        return self.runs_across_episodes() or self.envs_per_worker > 1

    def effective_reward_clip(self) -> float:
        if self.reward_clip is not None:
            return float(self.reward_clip)
        return 1.0 if self.is_atari() else 0.0

    def env_kwargs(self) -> dict:
        """Adapter options for :func:`a3c_core.envs.make_env`."""
        kw = {}
        if self.env_process is not None:
            kw["env_process"] = self.env_process
        if self.is_atari():
            kw["noop_max"] = self.noop_max
            kw["terminal_on_life_loss"] = self.terminal_on_life_loss
            if self.repeat_action_probability is not None:
                kw["repeat_action_probability"] = self.repeat_action_probability
        return kw

    def net_kwargs(self, spec: str) -> dict:
        """Spec options set by the config (unset fields keep the spec's defaults).

        Raises :class:`ConfigError` when a set field does not apply to ``spec``.
        """
        opts = _spec_options(spec)
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
        specs = _network_specs()
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
        if 0.0 < self.advantage_horizon < 1.0:
            bad("advantage_horizon", "must be 0 (the whole run) or >= 1 sample")
        if not 0.0 <= self.gae_lambda <= 1.0:
            bad("gae_lambda", "must be in [0, 1]")
        from a3c_core.core.optim import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            bad("optimizer", f"unknown optimizer; choose one of {', '.join(OPTIMIZERS)}")
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
        if not 0.0 <= self.adam_clip_relative <= 1e9:
            bad("adam_clip_relative", "must be in [0, 1e9] (0 = off)")
        if self.min_rollout > self.t_max:
            bad("min_rollout", f"must be <= t_max ({self.t_max}): a rollout has at most t_max steps")
        if self.lr_anneal and self.lr_anneal_steps == 0 and self.total_steps == 0:
            bad("lr_anneal", "with lr_anneal_steps 0 anneals over total_steps, which is 0 "
                "(no limit): set --lr-anneal-steps or --total-steps")
        if self.reward_scale is not None and not self.reward_scale > 0:
            bad("reward_scale", "must be > 0")
        return self

    # -- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config", saved_run: bool = False) -> "Config":
        """``saved_run``: ``d`` is the config a run saved (``--resume``); one saved
        before ``lr_anneal_steps`` existed, with ``lr_anneal`` on, keeps the
        schedule it was trained with (to 0 over ``total_steps``), one saved
        before ``merge_below`` existed keeps the paper's rollouts, and one
        saved before ``obs_norm`` existed its unnormalized frames."""
        known = {f.name: f for f in fields(cls)}
        if saved_run and d.get("lr_anneal") is True and "lr_anneal_steps" not in d:
            d = dict(d, lr_anneal_steps=0, lr_anneal_floor=0.0)
        if saved_run and "merge_below" not in d:    # saved before the switch existed
            d = dict(d, merge_below=0.0)
        if saved_run and "obs_norm" not in d:       # saved before image normalization
            d = dict(d, obs_norm=False)
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
    def from_toml(cls, path: str, *, saved_run: bool = False) -> "Config":
        import tomllib

        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        data = data.get("a3c", data)  # allow an [a3c] table or top-level keys
        return cls.from_dict(data, source=path, saved_run=saved_run)

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
