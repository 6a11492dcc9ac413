"""Command line: ``a3c train | eval | export | plot | compile | gradcheck | bench`` (also ``python -m a3c_core``).

Every command's modules are imported inside the function that runs it, on
purpose (the one place in a3c_core that does so for its own modules):

* numpy's and numba's C extensions must load under :func:`held_sigint`
  (inside :func:`main`): a Ctrl-C while one initialises comes out as an
  ImportError traceback instead of exit 130.  This module's top imports
  nothing that loads them.
* numba alone costs ~0.5 s (2-core VM: ``import numba`` 0.7-0.85 s against
  0.33-0.39 s for numpy), which ``a3c --help``, ``a3c plot`` and ``a3c eval``
  of a bad path should not pay for ``train``'s and ``bench``'s kernels.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from a3c_core import __version__
from a3c_core._safepoint import held_sigint
from a3c_core.report import final_line  # noqa: F401  (re-exported: tests and callers)


def _field_help(text, default) -> str:
    """A config field's (or env option's) ``--help`` text: its documentation
    plus its default, said once.

    A help text that states its own default, ``(default ...`` or
    ``default: ...`` (env-dependent ones do), gets no second one, and neither
    does a field whose default is None (unset: its help says in words what
    that means); ``%`` is escaped because argparse formats help with ``%``.
    """
    said = "(default" in text.lower() or "default:" in text.lower()
    if default is not None and not said:
        text = f"{text} (default: {default!r})" if text else f"default: {default!r}"
    return text.replace("%", "%%")


def _add_flag(p, name, typ, help_):
    flag = "--" + name.replace("_", "-")
    if typ is bool:
        p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        conv = {int: int, float: float, str: str}.get(typ, str)
        p.add_argument(flag, dest=name, type=conv, default=None, help=help_, metavar=name.upper())


def _add_config_flags(p):
    """A flag per config field, and per env option (they set ``env_options``)."""
    from a3c_core.train.config import Config, base_type, env_options_by_name

    defaults = Config()
    for f in fields(Config):
        if f.name != "env_options":
            _add_flag(p, f.name, base_type(f), _field_help(f.metadata.get("help", ""),
                                                           getattr(defaults, f.name)))
    for name, (family, option) in env_options_by_name().items():
        _add_flag(p, name, option.kind,
                  _field_help(option.help, getattr(family.defaults, name, None)))


def _config_changes(args) -> dict:
    """The config fields the command line sets; its env-option flags in ``env_options``."""
    from a3c_core.train.config import Config, env_options_by_name

    changes = {f.name: getattr(args, f.name) for f in fields(Config)
               if f.name != "env_options" and getattr(args, f.name) is not None}
    options = {name: getattr(args, name) for name in env_options_by_name()
               if getattr(args, name) is not None}
    if options:
        changes["env_options"] = options
    return changes


def config_from_args(args):
    """The config ``a3c train``'s parsed ``args`` give a new run: the
    ``--config`` file's fields, with the flags' over them (an env-option
    flag adds to the file's ``env_options``)."""
    from a3c_core.train.config import Config

    changes = _config_changes(args)
    if args.config:
        return Config.from_toml(args.config, overrides=changes)
    return Config.from_dict(changes, source="command line")


def cmd_train(args):
    """``a3c train``: exit 0 done, 1 failed, 2 bad input, 130 SIGINT, 143 SIGTERM."""
    try:
        return _cmd_train(args)
    except KeyboardInterrupt:  # Ctrl-C before the run started (e.g. while kernels load)
        print("\na3c train: interrupted before training started", file=sys.stderr)
        return 130


def _cmd_train(args):
    with held_sigint():     # the trainer's imports load numba's and llvmlite's C extensions
        from a3c_core import checkpoint as ck
        from a3c_core.checkpoint import CheckpointError
        from a3c_core.train.config import Config, ConfigError
        from a3c_core.train.trainer import Trainer, TrainingError

    try:
        if args.resume:
            saved = os.path.join(args.resume, "config.toml")
            if not os.path.isdir(args.resume):
                raise ck.no_run_dir(args.resume)
            changes = _config_changes(args)
            other = changes.pop("run_dir", None)
            if other is not None and os.path.abspath(other) != os.path.abspath(args.resume):
                raise ConfigError(f"--run-dir {other} with --resume {args.resume}: a resumed run "
                                  f"writes to its own directory; drop --run-dir")
            changes["run_dir"] = args.resume
            ignored = []
            if os.path.exists(saved):
                cfg = Config.from_toml(saved, saved_run=True, ignored=ignored, overrides=changes)
            else:
                cfg = Config.from_dict(ck.find_resume_checkpoint(args.resume).meta["config"],
                                       saved_run=True, ignored=ignored, overrides=changes)
            if ignored:
                print(f"note: the saved config sets fields this version removed, ignored: "
                      f"{', '.join(ignored)} (docs/defaults.md)", flush=True)
        else:
            cfg = config_from_args(args)
        from a3c_core.distributed.cli import misplaced_ray_flags, run_ray_training

        if getattr(args, "ray", None) is not None:
            if cfg.worker_processes:
                raise ConfigError("config field 'worker_processes' = True: not with --ray "
                                  "(its nodes are processes already; use --nodes)")
            return run_ray_training(cfg, args, resume=args.resume)
        if misplaced_ray_flags(args):
            raise ConfigError(f"{', '.join(misplaced_ray_flags(args))}: these flags need --ray")
        trainer = Trainer(cfg, resume=args.resume)
    except (ConfigError, CheckpointError, ValueError, ImportError, OSError) as e:
        print(f"a3c train: error: {e}", file=sys.stderr)
        return 2
    try:
        return _run_trainer(trainer, cfg, TrainingError)
    except KeyboardInterrupt:  # before the run installed its signal handling
        trainer.close()
        raise


def _run_trainer(trainer, cfg, TrainingError):
    if trainer.resume_note:
        print(trainer.resume_note, flush=True)
    line = (f"run directory: {trainer.run_dir}  ({trainer.backend.describe()}, {trainer.spec_name}, "
            f"{trainer.shared.params.size:,} parameters, env {cfg.env})")
    norm = trainer.pipeline_spec.get("norm")
    if norm is not None:
        how = (f"measured on {norm.get('frames', '?'):,} frames of random play in "
               f"{trainer.norm_seconds:.1f} s" if getattr(trainer, "norm_seconds", None) is not None
               else "as trained")
        line += f"\nframes normalized: (x - mean frame) / {norm['std']:.4f}, {how}"
    if trainer.plan.resolved.env_args.get("action_set") == "combos":
        line += (f"\nactions: {trainer.plan.n_actions} combinations of the scenario's buttons "
                 f"(--action-set buttons: one button per action)")
    if trainer.plan.resolved.env_args.get("view") == "band":
        shape = "x".join(map(str, trainer.pipeline_spec.get("out_shape", ())))
        line += (f"\nview: the frame's middle 60 rows at its full width, resized to {shape} "
                 f"(--view full: the whole frame)")
    health = trainer.plan.resolved.env_args.get("health_reward", 0.0)
    if health:
        line += (f"\nhealth reward: {health:g} x each step's HEALTH change is added to the learning "
                 f"reward (scores stay the scenario's own; --health-reward 0 turns it off)")
    ammo = trainer.plan.resolved.env_args.get("ammo_reward", 0.0)
    if ammo:
        line += (f"\nammo reward: {ammo:g} x each step's ammo change is added to the learning "
                 f"reward, so a shot costs at once (scores stay the scenario's own; "
                 f"--ammo-reward 0 turns it off)")
    if trainer.plan.resolved.self_imitation:
        line += ("\nself-imitation: each worker replays its 16 best episodes where their return "
                 "beats the value (--no-self-imitation turns it off)")
    from a3c_core.timing import blas_kernel_note

    note = blas_kernel_note()      # OpenBLAS held to AVX2 kernels on an AVX-512 CPU
    if note:
        line += f"\nnote: {note}"
    try:
        # exiting: a second Ctrl-C while the process shuts down cannot end it by the signal
        res = trainer.run(announce=lambda: print(line, flush=True), exiting=True)
    except TrainingError as e:
        print(f"a3c train: error: {e}", file=sys.stderr)
        return _exit_past_stuck(trainer, 1)
    print(final_line(res), flush=True)
    return _exit_past_stuck(trainer, res.exit_code)


def _exit_past_stuck(trainer, code):
    """``code``, or, when a worker thread is still stuck in a C call (its
    engine killed, the final checkpoint and summary written), the process
    ends here with ``os._exit(code)``: the interpreter's shutdown could wait
    on that thread, or run a library's teardown under it."""
    if not trainer.stuck_workers:
        return code
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def cmd_eval(args):
    from a3c_core.evaluate import run_eval

    return run_eval(args)


def cmd_export(args):
    """``a3c export RUN_OR_CKPT --onnx PATH | --npz-only PATH``: 0, or 2 with a message."""
    from a3c_core.checkpoint import CheckpointError
    from a3c_core.export import ExportError, export_npz, export_onnx, onnx_parity
    from a3c_core.policy import Policy

    if not (args.onnx or args.npz_only):
        print("a3c export: error: say what to write: --onnx PATH and/or --npz-only PATH",
              file=sys.stderr)
        return 2
    try:
        policy = Policy.load(args.source, which=args.which)
    except (CheckpointError, OSError) as e:
        print(f"a3c export: error: {e}", file=sys.stderr)
        return 2
    src = policy.path
    steps = (policy.meta.get("counters") or {}).get("steps")
    said = f" (step {steps:,})" if isinstance(steps, int) else ""
    try:
        if args.npz_only:
            out = export_npz(policy, args.npz_only)
            print(f"wrote {out}: {os.path.getsize(out):,} bytes, parameters and what Policy.load "
                  f"needs, from {src}{said} ({os.path.getsize(src):,} bytes)")
        if args.onnx:
            out = export_onnx(policy, args.onnx, opset=args.opset)
            print(f"wrote {out}: {os.path.getsize(out):,} bytes, ONNX opset {args.opset}, raw "
                  f"observations in, from {src}{said}")
            try:
                d = onnx_parity(policy, out)
            except ImportError:
                print("  (onnxruntime is not installed: parity not checked)")
            else:
                print(f"  onnxruntime parity over 20 steps of 7 agents: max |diff| probs "
                      f"{d['probs']:.1e}, value {d['value']:.1e}, state {d['state']:.1e}")
    except (ExportError, ValueError, ImportError) as e:
        print(f"a3c export: error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_plot(args):
    from a3c_core.plot import run_plot

    return run_plot(args)


def cmd_compile(args):
    from a3c_core.compile import run_compile

    return run_compile(args)


def cmd_gradcheck(args, rest):
    from a3c_core.nn.gradcheck import main as gradcheck_main

    return gradcheck_main(rest)


def cmd_bench(args, rest):
    from a3c_core.bench import main as bench_main

    return bench_main(rest)


def _version():
    return f"a3c_core {__version__}"


def build_parser():
    p = argparse.ArgumentParser(prog="a3c", description="a3c_core: CPU-only A3C (numpy + Numba + Cython)")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train an A3C agent (default: doom:basic)",
                       description="Train an A3C agent. Every config field is a flag; --config reads a TOML file "
                                   "and flags override it.")
    t.add_argument("--config", help="TOML file with config fields (top level or an [a3c] table)")
    t.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its newest valid checkpoint")
    _add_config_flags(t)
    from a3c_core.distributed.cli import add_ray_arguments

    add_ray_arguments(t)
    e = sub.add_parser("eval", help="evaluate a checkpoint: mean ± std raw reward over N episodes",
                       description="Play N episodes with a checkpoint and report the raw reward and how the "
                                   "episodes ended (a Doom scenario: died, timed out, or ended "
                                   "alive, its goal where it has one). Says which file it loaded, "
                                   "at which training step and training average.")
    e.add_argument("checkpoint", help="checkpoint file (.npz) or run directory")
    e.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes to play (default: 10)")
    e.add_argument("--sample", action="store_true", help="sample actions instead of greedy argmax")
    e.add_argument("--seed", type=int, default=0,
                   help="seed of the env and of action sampling (default: 0)")
    e.add_argument("--env", help="override the env id stored in the checkpoint (must have the same "
                                 "observations and actions)")
    e.add_argument("--which", default="latest", choices=["latest", "best"],
                   help="which checkpoint of a run directory: latest (default: the end of training) or "
                        "best (highest training moving average, possibly over few episodes)")
    e.add_argument("--gif", metavar="PATH", help="record the first episode as a real-time animated GIF")
    e.add_argument("-v", "--verbose", action="store_true",
                   help="print every episode's return, length and end (default: off)")
    x = sub.add_parser("export", help="write a trained policy for deployment: ONNX graph and/or a "
                                      "policy-only checkpoint",
                       description="Export a checkpoint (or a run directory's latest/best) for "
                                   "deployment. --onnx writes one ONNX graph, raw observations + "
                                   "LSTM state in, probabilities, value and new state out, batch "
                                   "dimension dynamic (needs pip install 'a3c_core[onnx]'); "
                                   "--npz-only writes a checkpoint holding only what Policy.load "
                                   "needs (no optimizer state, about 1/3 of the size). Files are "
                                   "written atomically.")
    x.add_argument("source", help="checkpoint file (.npz) or run directory")
    x.add_argument("--onnx", metavar="PATH", help="write the ONNX graph to PATH")
    x.add_argument("--npz-only", metavar="PATH", help="write the policy-only checkpoint to PATH")
    x.add_argument("--which", default="latest", choices=["latest", "best"],
                   help="which checkpoint of a run directory (default: latest)")
    x.add_argument("--opset", type=int, default=17, help="ONNX opset (default: 17; 13 or newer)")
    pl = sub.add_parser("plot", help="learning curves of one or more runs as a PNG (needs matplotlib)",
                        description="Plot reward (episodes and moving average) and the loss terms of one or "
                                    "more run directories against agent steps and wall time, runs overlaid. "
                                    "Needs matplotlib: pip install 'a3c_core[plot]'.")
    from a3c_core.plot import add_arguments as _plot_args

    _plot_args(pl)
    c = sub.add_parser("compile", help="compile and cache every Numba kernel ahead of time (image builds)",
                       description="Compile every Numba kernel of a3c_core for this machine and write the "
                                   "cache (<prefix>/share/a3c_core/numba-cache/<version>-<tag>, or "
                                   "NUMBA_CACHE_DIR if set), so "
                                   "that a new process loads machine code instead of compiling. Run it "
                                   "once after pip install, before making the install read-only.")
    from a3c_core.compile import add_arguments as _compile_args

    _compile_args(c)
    sub.add_parser("gradcheck", help="finite-difference gradient check of a network spec (see a3c gradcheck --help)",
                   add_help=False)
    sub.add_parser("bench", help="measure kernel, step, update, env and end-to-end throughput (a3c bench --help)",
                   add_help=False)
    return p


def main(argv=None):
    """The ``a3c`` command; a Ctrl-C anywhere outside a run exits 130 without a traceback."""
    try:
        with held_sigint():
            import numpy  # noqa: F401  - every command needs it; see held_sigint
        return _main(argv)
    except KeyboardInterrupt:
        print("\na3c: interrupted", file=sys.stderr)
        return 130


def _main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # gradcheck and bench own their flags
    if argv and argv[0] in ("gradcheck", "bench"):
        return cmd_gradcheck(None, argv[1:]) if argv[0] == "gradcheck" else cmd_bench(None, argv[1:])
    p = build_parser()
    if argv and argv[0] == "train":
        from a3c_core.train.config import removed_flag   # (the parser has imported it)

        removed = removed_flag(argv[1:])
        if removed:
            print(f"a3c train: error: {removed}", file=sys.stderr)
            return 2
    args = p.parse_args(argv)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "eval":
        if args.episodes < 1:
            print(f"a3c eval: error: --episodes must be >= 1, got {args.episodes}", file=sys.stderr)
            return 2
        return cmd_eval(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "plot":
        return cmd_plot(args)
    if args.command == "compile":
        return cmd_compile(args)
    p.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
