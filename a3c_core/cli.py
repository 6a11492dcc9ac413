"""Command line: ``a3c train | eval | gradcheck | bench`` (also ``python -m a3c_core``)."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, fields


def _add_config_flags(p):
    from a3c_core.train.config import Config, _base_type

    defaults = Config()
    for f in fields(Config):
        flag = "--" + f.name.replace("_", "-")
        typ = _base_type(f)
        help_ = f.metadata.get("help", "") + f" (default: {getattr(defaults, f.name)!r})"
        if typ is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            conv = {int: int, float: float, str: str}.get(typ, str)
            p.add_argument(flag, dest=f.name, type=conv, default=None, help=help_, metavar=f.name.upper())


def _config_from_args(args):
    from a3c_core.train.config import Config, fields as _fields

    base = Config.from_toml(args.config) if args.config else Config()
    changes = {f.name: getattr(args, f.name) for f in _fields(Config) if getattr(args, f.name) is not None}
    return base.replace(**changes) if changes else base.validate()


def cmd_train(args):
    from a3c_core.checkpoint import CheckpointError, load_checkpoint
    from a3c_core.train.config import Config, ConfigError, fields as _fields
    from a3c_core.train.trainer import Trainer, TrainingError

    try:
        if args.resume:
            saved = os.path.join(args.resume, "config.toml")
            if not os.path.isdir(args.resume):
                raise CheckpointError(f"--resume: run directory not found: {args.resume}")
            if os.path.exists(saved):
                base = Config.from_toml(saved)
            else:
                base = Config.from_dict(load_checkpoint(args.resume).meta["config"])
            changes = {f.name: getattr(args, f.name) for f in _fields(Config)
                       if getattr(args, f.name) is not None}
            cfg = base.replace(run_dir=args.resume, **changes)
        else:
            cfg = _config_from_args(args)
        trainer = Trainer(cfg, resume=args.resume)
    except (ConfigError, CheckpointError, ValueError, ImportError, FileNotFoundError) as e:
        print(f"a3c train: error: {e}", file=sys.stderr)
        return 2
    print(f"run directory: {trainer.run_dir}  ({trainer.n_workers} workers, {trainer.spec_name}, "
          f"{trainer.shared.params.size:,} parameters, env {cfg.env})", flush=True)
    try:
        res = trainer.run()
    except TrainingError as e:
        for wid, tb in e.worker_tracebacks:
            print(f"\n--- worker {wid} failed ---\n{tb}", file=sys.stderr)
        print(f"a3c train: error: {e}", file=sys.stderr)
        return 1
    avg = "n/a" if res.moving_avg is None else f"{res.moving_avg:.2f}"
    print(f"{res.status}: {res.steps:,} steps, {res.episodes} episodes in {res.seconds:.1f}s; "
          f"moving-average raw reward {avg}; checkpoint {res.checkpoint}", flush=True)
    return 130 if res.status == "interrupted" else 0


def cmd_eval(args):
    import numpy as np

    from a3c_core.checkpoint import CheckpointError
    from a3c_core.envs import make_env
    from a3c_core.policy import Policy

    try:
        policy = Policy.load(args.checkpoint, which=args.which)
        env_meta = policy.meta.get("env", {})
        env_id = args.env or env_meta.get("id")
        env = make_env(env_id, seed=args.seed, frame_skip=env_meta.get("frame_skip"),
                       render=bool(args.gif))
    except (CheckpointError, ValueError, ImportError, FileNotFoundError) as e:
        print(f"a3c eval: error: {e}", file=sys.stderr)
        return 2
    if env.n_actions != policy.n_actions:
        print(f"a3c eval: error: env {env_id} has {env.n_actions} actions, the policy "
              f"{policy.n_actions}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    returns, frames = [], []
    try:
        for ep in range(args.episodes):
            obs, state, done, total, length = env.reset(), policy.initial_state(), False, 0.0, 0
            while not done:
                if args.gif and ep == 0:
                    frames.append(env.render_frame())
                a, state = policy.act(obs, state, greedy=not args.sample, rng=rng)
                obs, r, term, trunc = env.step(a)
                total += r
                length += 1
                done = term or trunc
            returns.append(total)
            if args.verbose:
                print(f"episode {ep + 1}: return {total:.2f}, {length} steps")
    finally:
        env.close()
    r = np.asarray(returns)
    mode = "sampled" if args.sample else "greedy"
    print(f"{env_id}: {len(r)} episodes ({mode}): mean raw reward {r.mean():.2f} ± {r.std():.2f} "
          f"(min {r.min():.2f}, max {r.max():.2f})")
    if args.gif:
        _write_gif(args.gif, frames)
        print(f"wrote {args.gif} ({len(frames)} frames)")
    return 0


def _write_gif(path, frames):
    try:
        from PIL import Image
    except ImportError:
        raise SystemExit("a3c eval: --gif needs Pillow (pip install 'a3c_core[log]')")
    imgs = [Image.fromarray(f) for f in frames if f is not None]
    if not imgs:
        return
    tmp = path + ".tmp.gif"
    imgs[0].save(tmp, save_all=True, append_images=imgs[1:], duration=57, loop=0)
    os.replace(tmp, path)


def cmd_gradcheck(args, rest):
    from a3c_core.nn.gradcheck import main as gradcheck_main

    return gradcheck_main(rest)


def cmd_bench(args, rest):
    from a3c_core.bench import main as bench_main

    return bench_main(rest)


def build_parser():
    p = argparse.ArgumentParser(prog="a3c", description="a3c_core: CPU-only A3C (numpy + Numba + Cython)")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train an A3C agent (default: doom:basic)",
                       description="Train an A3C agent. Every config field is a flag; --config reads a TOML file "
                                   "and flags override it.")
    t.add_argument("--config", help="TOML file with config fields (top level or an [a3c] table)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    _add_config_flags(t)
    e = sub.add_parser("eval", help="evaluate a checkpoint: mean ± std raw reward over N episodes")
    e.add_argument("checkpoint", help="checkpoint file (.npz) or run directory")
    e.add_argument("--episodes", type=int, default=10)
    e.add_argument("--sample", action="store_true", help="sample actions instead of greedy argmax")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--env", help="override the env id stored in the checkpoint")
    e.add_argument("--which", default="best", choices=["best", "latest"],
                   help="which checkpoint of a run directory (default best)")
    e.add_argument("--gif", metavar="PATH", help="record the first episode as an animated GIF")
    e.add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("gradcheck", help="finite-difference gradient check of a network spec (see a3c gradcheck --help)",
                   add_help=False)
    sub.add_parser("bench", help="measure kernel, step, update, env and end-to-end throughput (a3c bench --help)",
                   add_help=False)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # gradcheck and bench own their flags
    if argv and argv[0] in ("gradcheck", "bench"):
        return cmd_gradcheck(None, argv[1:]) if argv[0] == "gradcheck" else cmd_bench(None, argv[1:])
    p = build_parser()
    args = p.parse_args(argv)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "eval":
        if args.episodes < 1:
            p.error("--episodes must be >= 1")
        return cmd_eval(args)
    p.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
