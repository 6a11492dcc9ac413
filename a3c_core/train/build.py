"""One build step for every backend: from a config and its first env to the
parts of a run.

:func:`plan_run` decides (everything JSON- or pickle-able: the resolved
settings, the network spec, the observation pipeline with its measured image
normalization, the optimizer's arguments, the rollout settings);
:func:`build_parts` makes the arrays from a plan (network parameters, the
shared optimizer, the reward and advantage normalizers).  The trainer's
threads and worker processes use the parts it builds; a Ray node gets the
plan and calls :func:`build_parts` itself, so nothing is rebuilt by hand
elsewhere.  :func:`worker_offset` is where each worker starts its sweep over
the optimizer's arrays.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from a3c_core.checkpoint import CheckpointError, check_layout, layout_of
from a3c_core.core import SharedState, make_optimizer
from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline, estimate_image_norm
from a3c_core.train.config import (LR_ANNEAL_FLOOR, OPTIMIZER, REMOVED_FIELDS, VALUE_COEF, Config,
                                   ConfigError, Resolved, resolve, rollout_defaults)
from a3c_core.train.worker import RolloutSettings

#: frames of random play ``obs_norm`` measures its mean frame and spread on
OBS_NORM_FRAMES = 2000
#: samples the advantages' running RMS averages over (docs/defaults.md)
ADVANTAGE_HORIZON = 20_000.0

__all__ = ["RunPlan", "RunParts", "plan_run", "build_parts", "restore_checkpoint",
           "worker_offset", "seed_of", "new_network"]


@dataclass
class RunPlan:
    """What a run is, decided once (picklable: a Ray node receives it)."""

    cfg: Config
    resolved: Resolved
    spec_name: str
    net_kwargs: dict
    pipeline_spec: dict             #: ObsPipeline spec, with the measured "norm" where there is one
    net_spec: dict
    layout: dict
    env_spec: dict                  #: the env's description, stored in checkpoints
    n_actions: int
    opt_kwargs: dict
    settings: RolloutSettings
    norm_seconds: float | None = None   #: how long measuring the image normalization took
    notes: list = field(default_factory=list)   #: what the resume kept ("lr 1e-4 as trained")


@dataclass
class RunParts:
    """The arrays of a run: shared parameters and optimizer, normalizers."""

    plan: RunPlan
    shared: SharedState
    normalizer: ReturnNormalizer | None
    adv_normalizer: AdvantageNormalizer | None

    def normalizers(self) -> dict:
        """The running statistics by checkpoint meta key (those the run has)."""
        out = {"reward_normalizer": self.normalizer, "advantage_normalizer": self.adv_normalizer}
        return {k: v for k, v in out.items() if v is not None}


def _measure_image_norm(cfg: Config, env, pipe) -> dict:
    """The mean frame and spread of :data:`OBS_NORM_FRAMES` frames of random
    play in ``env`` (seeded from the run's seed; the workers reset it)."""
    rng = np.random.default_rng((cfg.seed, 0x0B5))
    n_act = int(env.n_actions)

    def frames():
        obs = env.reset()
        for _ in range(OBS_NORM_FRAMES):
            yield pipe(obs)
            obs, _, term, trunc = env.step(int(rng.integers(n_act)))
            if term or trunc:
                obs = env.reset()

    return estimate_image_norm(frames())


def _opt_kwargs(cfg: Config, r: Resolved, lr: float) -> dict:
    return dict(lr=lr, amsgrad=r.amsgrad, anneal_steps=r.anneal_steps,
                anneal_floor=LR_ANNEAL_FLOOR)


def _settings(cfg: Config, r: Resolved) -> RolloutSettings:
    return RolloutSettings(
        t_max=cfg.t_max, gamma=cfg.gamma, gae_lambda=r.gae_lambda, value_coef=VALUE_COEF,
        entropy_beta=r.entropy_beta, max_grad_norm=cfg.max_grad_norm,
        reward_scale=r.reward_scale, reward_clip=r.reward_clip,
        truncation_bootstrap=r.truncation_bootstrap,
        normalize_advantages=r.normalize_advantages, merge_below=r.merge_below,
        self_imitation=r.self_imitation)


def _as_trained(cfg: Config, r: Resolved, ckpt, env_size, notes: list) -> Resolved:
    """``r`` with the network, frame size (``env_size``: the env's own) and
    reward treatment ``ckpt``'s run trained with, where ``cfg`` leaves them
    to the defaults: a run saved before its config.toml pinned them, when a
    newer version has changed the scenario's defaults since."""
    kept = {}
    name = (ckpt.meta.get("network") or {}).get("name")
    if cfg.spec == "auto" and isinstance(name, str) and name != r.spec:
        kept["spec"] = name
    shape = list((ckpt.preprocess_spec or {}).get("out_shape") or ())
    now = [r.frame_size] * 2 if r.frame_size else list(env_size or ())
    square = len(shape) == 2 and shape[0] == shape[1] and isinstance(shape[0], int)
    if cfg.frame_size is None and square and shape != now:
        kept["frame_size"] = shape[0]
    if cfg.reward_scale is None and r.reward_scale is not None \
            and isinstance(ckpt.meta.get("reward_normalizer"), dict):
        kept["reward_scale"] = None
    if kept:
        notes.append(", ".join(f"{k} {'normalized' if v is None else v} as trained"
                               for k, v in kept.items()))
    return dataclasses.replace(r, **kept)


def _actions_hint(ckpt, env) -> str:
    """What to do about a checkpoint whose actions are not ``env``'s: the
    action set it trained with where that differs (a Doom run), else a new run
    (the scenario's cfg has other buttons now)."""
    trained = ckpt.env_spec.get("action_set")
    if trained and trained != getattr(env, "action_set", trained):
        return f"resume with --action-set {trained}"
    return "start a new run for these actions"


def plan_run(cfg: Config, env, ckpt=None) -> RunPlan:
    """Decide a run from ``cfg`` and its first ``env`` (and, resuming, the
    checkpoint ``ckpt``, whose env, preprocessing and learning rate it keeps).
    A new run with ``obs_norm`` measures the image normalization in ``env``."""
    cfg = rollout_defaults(cfg)
    if ckpt is not None and ckpt.env_spec.get("id", env.env_id) != env.env_id:
        raise CheckpointError(
            f"checkpoint {ckpt.path} was trained on env {ckpt.env_spec.get('id')!r}, not "
            f"{env.env_id!r}; resume with --env {ckpt.env_spec.get('id')} or start a new run")
    if ckpt is not None and "action_names" in ckpt.env_spec \
            and list(ckpt.env_spec["action_names"]) != list(env.action_names):
        raise CheckpointError(
            f"checkpoint {ckpt.path} was trained with {len(ckpt.env_spec['action_names'])} "
            f"actions ({', '.join(map(str, ckpt.env_spec['action_names'][:6]))}"
            f"{', ...' if len(ckpt.env_spec['action_names']) > 6 else ''}), this env has "
            f"{env.n_actions} ({', '.join(map(str, env.action_names[:6]))}"
            f"{', ...' if env.n_actions > 6 else ''}); " + _actions_hint(ckpt, env))
    view = getattr(env, "view", None)           # an option its family's spec records
    trained_view = (ckpt.env_spec.get("view", cfg.family().spec_options.get("view"))
                    if ckpt is not None else view)
    if view is not None and trained_view != view:
        raise CheckpointError(f"checkpoint {ckpt.path} was trained with the {trained_view} view, "
                              f"this env has the {view} one; resume with --view {trained_view}")
    r = resolve(cfg, env.obs_kind)
    notes = []
    if ckpt is not None:
        r = _as_trained(cfg, r, ckpt, env.preprocess_spec.get("out_shape"), notes)
    pipeline_spec = dict(env.preprocess_spec)
    image = pipeline_spec.get("kind") == "image"
    if image and r.frame_size is not None:
        pipeline_spec["out_shape"] = [r.frame_size, r.frame_size]
    pipe = ObsPipeline(pipeline_spec, env.obs_shape)
    norm_seconds = None
    if image:
        if ckpt is not None:    # a resumed run keeps the normalization it trained with
            norm = (ckpt.preprocess_spec or {}).get("norm")
            if norm is not None:
                pipeline_spec["norm"] = norm
            elif cfg.obs_norm:
                notes.append("frames not normalized (the run trained without obs_norm)")
            # what the run does (and its config.toml records): as trained
            r = dataclasses.replace(r, obs_norm=norm is not None)
        elif r.obs_norm:
            t0 = time.perf_counter()
            pipeline_spec["norm"] = _measure_image_norm(cfg, env, pipe)
            norm_seconds = time.perf_counter() - t0
        try:
            pipe = ObsPipeline(pipeline_spec, env.obs_shape)
        except ValueError as e:      # a checkpoint's malformed "norm"
            raise CheckpointError(f"checkpoint {getattr(ckpt, 'path', '?')} has an unusable "
                                  f"preprocess spec: {e}") from None
    net_kwargs = cfg.net_kwargs(r.spec)
    try:
        net = build_network(r.spec, pipe.net_obs_shape, env.n_actions, seed=cfg.seed,
                            **net_kwargs)
    except ValueError as e:
        name = "frame_size" if image else "spec"
        raise ConfigError(f"config field '{name}' = {getattr(cfg, name)!r}: {e}") from None
    if ckpt is not None:
        check_layout(ckpt, net)
    # a resumed run keeps the learning rate it trained with unless the config
    # names one (lr 0 = the default, which a newer version may have changed)
    lr = r.lr
    if ckpt is not None and cfg.lr == 0 and ckpt.meta.get("optimizer") == OPTIMIZER:
        saved = (ckpt.meta.get("optimizer_scalars") or {}).get("lr")
        if isinstance(saved, (int, float)) and 0.0 < saved <= 1.0:   # else corrupt: the default
            lr = float(saved)
            notes.append(f"lr {saved:g} as trained (--lr to change it)")
    # and its anneal, on or off, where the config leaves it unset (a run saved
    # before config.toml held the resolved value: see Config.pinned)
    if ckpt is not None and cfg.lr_anneal is None and ckpt.meta.get("optimizer") == OPTIMIZER:
        saved = (ckpt.meta.get("optimizer_scalars") or {}).get("anneal_steps")
        if isinstance(saved, int) and not isinstance(saved, bool) and saved >= 0 \
                and (saved > 0) != (r.anneal_steps > 0):
            steps = (cfg.lr_anneal_steps or cfg.total_steps or saved) if saved else 0
            r = dataclasses.replace(r, anneal_steps=int(steps))
            notes.append(f"lr anneal {'on' if saved else 'off'} as trained "
                         f"(--{'no-' if saved else ''}lr-anneal to change it)")
    return RunPlan(
        cfg=cfg, resolved=r, spec_name=r.spec, net_kwargs=net_kwargs,
        pipeline_spec=pipeline_spec, net_spec=net.spec, layout=layout_of(net),
        env_spec=dict(env.spec(), preprocess=dict(pipeline_spec)), n_actions=int(env.n_actions),
        opt_kwargs=_opt_kwargs(cfg, r, lr), settings=_settings(cfg, r),
        norm_seconds=norm_seconds, notes=notes)


def check_memory(cfg: Config, plan: RunPlan, env, available=None) -> None:
    """ConfigError naming ``envs_per_worker`` when the run's envs and rollout
    rows would not fit the machine's available memory (``available`` bytes;
    default: /proc/meminfo's MemAvailable, where there is one).  Estimated
    from one env (its family's ``env_memory_mb``: an engine's, where it runs
    one) and the network's rollout rows per agent step (t_max x K rows per
    worker)."""
    if available is None:
        try:
            with open("/proc/meminfo") as fh:
                info = dict(line.split(":", 1) for line in fh)
            available = int(info["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return
    cfg = rollout_defaults(cfg)
    n, k = plan.resolved.n_workers, cfg.envs_per_worker
    net = new_network(plan)
    row = sum(a.nbytes for L in net.layers for a in L.workspace(1, net.dtype).values())
    env_b = plan.cfg.family().env_memory_mb * 2**20 \
        + 2 * int(np.prod(env.obs_shape))
    per_worker = k * env_b + (cfg.t_max + 1) * k * row + 4 * net.params.nbytes
    need = n * per_worker
    if need > available:
        raise ConfigError(
            f"config field 'envs_per_worker' = {k}: {n} workers x {k} envs need about "
            f"{need / 2**30:.1f} GB ({env_b / 2**20:.0f} MB per env, "
            f"{(cfg.t_max + 1) * k * row / 2**20:.0f} MB of rollout rows per worker), more "
            f"than the {available / 2**30:.1f} GB available; use fewer envs per worker or workers")


def new_network(plan: RunPlan):
    """A fresh network of the plan's spec (a worker's local copy, a warm-up's)."""
    ns = plan.net_spec
    return build_network(plan.spec_name, tuple(ns["obs_shape"]), ns["n_actions"],
                         seed=plan.cfg.seed, **plan.net_kwargs)


def build_parts(plan: RunPlan, restore: dict | None = None) -> RunParts:
    """The arrays of ``plan``'s run: initial parameters (seeded), the shared
    optimizer, the normalizers.  ``restore``: ``{"optimizer": state,
    "normalizers": {meta key: state}}`` to start from (a Ray node's copy)."""
    cfg = plan.cfg
    net = new_network(plan)
    opt = make_optimizer(OPTIMIZER, net.n_params, **plan.opt_kwargs)
    restore = restore or {}
    if restore.get("optimizer") is not None:
        opt.load_state_dict(restore["optimizer"])
    parts = RunParts(
        plan=plan, shared=SharedState(net.params, opt),
        normalizer=(None if plan.resolved.reward_scale is not None
                    else ReturnNormalizer(cfg.gamma)),
        adv_normalizer=(AdvantageNormalizer(horizon=ADVANTAGE_HORIZON)
                        if plan.resolved.normalize_advantages else None))
    for key, norm in parts.normalizers().items():
        state = (restore.get("normalizers") or {}).get(key)
        if state is not None:
            norm.load_state_dict(state)
    return parts


def restore_checkpoint(parts: RunParts, ckpt) -> None:
    """Load ``ckpt``'s parameters, optimizer statistics, counters and
    normalizers into ``parts`` (CheckpointError when they do not fit)."""
    cfg = parts.plan.cfg
    if ckpt.meta.get("optimizer") != OPTIMIZER:
        raise CheckpointError(
            f"checkpoint {ckpt.path} used optimizer {ckpt.meta.get('optimizer')!r}, which was "
            f"removed ({REMOVED_FIELDS['optimizer']}): it cannot resume; start a new run")
    # statistics and step counts come from the checkpoint; hyperparameters
    # (lr, alpha, eps, betas) from the config, so a resume may change them.
    # So do the anneal's horizon and floor: with --lr-anneal-steps 0 the
    # anneal runs over the config's total_steps, and a run resumed with a
    # larger --total-steps anneals over the new budget
    opt = parts.shared.optimizer
    owned = set(opt.hyper_names) | {"anneal_steps"}
    opt_state = {k: v for k, v in ckpt.meta.get("optimizer_scalars", {}).items()
                 if k not in owned}
    opt_state.update(ckpt.opt_arrays)
    counters = ckpt.meta.get("counters", {})
    try:
        parts.shared.load_state_dict({
            "params": ckpt.params,
            "optimizer": opt_state,
            "counters": {k: counters.get(k, 0) for k in type(parts.shared).COUNTERS},
        })
        for key, norm in parts.normalizers().items():
            if ckpt.meta.get(key) is not None:
                norm.load_state_dict(ckpt.meta[key])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt.path} cannot be resumed: {e}") from None


def seed_of(*keys) -> int:
    """A 31-bit seed derived from ``keys`` (no arithmetic collisions between
    runs): an env's from the run's seed, its worker, the resume count, the
    env's index and the worker process's restarts (the trainer, a Ray node)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0] & 0x7FFFFFFF)


def worker_offset(wid: int, n_workers: int, n_params: int) -> int:
    """Where worker ``wid`` starts its sweep over the optimizer's arrays
    (staggered, so that the workers' applies touch different memory; see
    :mod:`a3c_core.core.optim`), 16-element aligned."""
    return (wid * n_params // n_workers) // 16 * 16
