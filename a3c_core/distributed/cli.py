"""``a3c train --ray [ADDRESS] --nodes N --workers W ...``: the command-line side.

:func:`add_ray_arguments` adds the flags to the ``train`` parser;
:func:`run_ray_training` runs a parsed command (exit status like ``a3c train``:
0 done, 1 failed, 2 bad input, 130 SIGINT, 143 SIGTERM).
"""
from __future__ import annotations

import json
import os
import sys

from a3c_core.checkpoint import CheckpointError
from a3c_core.distributed.options import RayOptions
from a3c_core.report import final_line
from a3c_core.train.config import ConfigError

__all__ = ["add_ray_arguments", "misplaced_ray_flags", "ray_options_from_args", "run_ray_training"]

_FLAGS = ("nodes", "shards", "sync_every", "sync_ms", "opt_state", "node_cpus", "max_restarts")


def add_ray_arguments(parser):
    """Add ``--ray [ADDRESS]``, ``--nodes``, ``--shards``, ``--sync-every``,
    ``--sync-ms``, ``--opt-state``, ``--node-cpus``, ``--max-restarts``."""
    d = RayOptions()
    g = parser.add_argument_group(
        "distributed training on Ray (pip install 'a3c_core[ray]')",
        "N node actors each run --workers worker threads (Hogwild inside the node) and sync "
        "asynchronously with S parameter-server shards.")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="train on Ray: no ADDRESS (or 'local') starts a local Ray; 'auto' joins the "
                        "cluster this machine belongs to (after `ray start`); or host:port "
                        "(default: off, single-process training)")
    g.add_argument("--nodes", type=int, default=None, metavar="N",
                   help=f"node actors, spread over the cluster's machines (default: {d.nodes})")
    g.add_argument("--shards", type=int, default=None, metavar="S",
                   help=f"parameter-server shards: contiguous slices of the parameter vector "
                        f"(default: {d.shards})")
    g.add_argument("--sync-every", type=int, default=None, metavar="K",
                   help=f"a node syncs after K local updates (0 = by time only) (default: {d.sync_every})")
    g.add_argument("--sync-ms", type=float, default=None, metavar="X",
                   help=f"a node syncs every X milliseconds (0 = by updates only) (default: {d.sync_ms:g})")
    g.add_argument("--opt-state", choices=("local", "global"), default=None,
                   help="optimizer statistics per node (local) or averaged at the parameter "
                        f"server (global; 3x the sync bytes with Adam) (default: {d.opt_state})")
    g.add_argument("--node-cpus", type=float, default=None, metavar="C",
                   help="CPUs each node actor reserves (default: --workers)")
    g.add_argument("--max-restarts", type=int, default=None, metavar="R",
                   help=f"times Ray restarts a dead node actor (default: {d.max_restarts})")
    return g


def misplaced_ray_flags(args):
    """The Ray flags given without ``--ray`` (e.g. ``['--nodes']``): an error to report."""
    if getattr(args, "ray", None) is not None:
        return []
    return ["--" + k.replace("_", "-") for k in _FLAGS if getattr(args, k, None) is not None]


def ray_options_from_args(args, resume=None):
    """:class:`RayOptions` from parsed flags; on resume, unset flags keep the
    values saved in the run's ``ray.json``."""
    base = {}
    if resume:
        saved = os.path.join(resume, "ray.json")
        if os.path.exists(saved):
            with open(saved) as fh:
                base = {k: v for k, v in json.load(fh).items() if k in _FLAGS}
    for k in _FLAGS:
        v = getattr(args, k, None)
        if v is not None:
            base[k] = v
    address = getattr(args, "ray", None)
    return RayOptions(address=None if address in (None, "local") else address, **base).validate()


def run_ray_training(cfg, args, resume=None) -> int:
    """Run ``a3c train --ray``; returns the exit status."""
    try:
        import ray  # noqa: F401  (lazy: Ray is an optional extra, 'a3c_core[ray]')
    except ImportError:
        print("a3c train: error: --ray needs Ray: pip install 'a3c_core[ray]'", file=sys.stderr)
        return 2
    # lazy: the trainer and the driver load numba (~0.5 s) and Ray; this module
    # is imported to build ``a3c train --help``, which needs neither
    from a3c_core.distributed.driver import RayTrainer, ShardLost
    from a3c_core.train.trainer import TrainingError

    try:
        opts = ray_options_from_args(args, resume)
        trainer = RayTrainer(cfg, opts, resume=resume)
    except (ConfigError, CheckpointError, ValueError, ImportError, OSError) as e:
        print(f"a3c train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\na3c train: interrupted before training started; nothing written", file=sys.stderr)
        return 130
    if trainer.resume_note:
        print(trainer.resume_note, flush=True)
    line = (f"run directory: {trainer.run_dir}  ({opts.nodes} nodes x {trainer.n_workers} workers on "
            f"{trainer.backend.hosts} machine(s), {opts.shards} shard(s), {trainer.spec_name}, "
            f"{trainer.shared.params.size:,} parameters, env {cfg.env})")
    try:
        res = trainer.run(announce=lambda: print(line, flush=True), exiting=True)
    except TrainingError as e:
        if not isinstance(e, ShardLost):
            for who, tb in e.worker_tracebacks:
                if str(who).startswith("node"):
                    print(f"\n--- {who} failed ---\n{tb}", file=sys.stderr)
        print(f"a3c train: error: {e}", file=sys.stderr)
        return 1
    print(final_line(res), flush=True)
    return res.exit_code
