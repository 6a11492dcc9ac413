"""The ``a3c bench`` command line: the arguments, the order of the sections, the table and ``--json``."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from a3c_core._blas import limit_blas_threads
from a3c_core.bench.e2e import bench_e2e
from a3c_core.bench.embed import bench_embedding, bench_preprocess
from a3c_core.bench.env import bench_env, make_bench_env
from a3c_core.bench.gil import bench_gil
from a3c_core.bench.kernels import bench_kernels, flops
from a3c_core.bench.machine import (bench_bandwidth, bench_sgemm, default_workers, format_table,
                                    machine_info, one_core)
from a3c_core.bench.network import bench_network
from a3c_core.nn.gradcheck import DEFAULT_OBS
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.train.config import Config, resolve


def _parse_workers(s):
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers: expected e.g. 1,2,4, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--workers: counts must be >= 1, got {s!r}")
    return out


def _parse_envs(s):
    """``K`` or ``K1,K2,...``: the end-to-end rows run for each K in turn."""
    try:
        ks = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, e.g. 1,8, got {s!r}") from None
    if not ks or not all(1 <= k <= 64 for k in ks):
        raise argparse.ArgumentTypeError(f"each must be 1-64, got {s!r}")
    return ks


def build_parser():
    p = argparse.ArgumentParser(
        prog="a3c bench",
        description="Measure kernel, update, env and end-to-end A3C throughput (median of "
                    "repetitions after warm-up). See the docstrings of the a3c_core.bench "
                    "package and its modules for what each row measures.")
    p.add_argument("--spec", default="auto", help="network spec (default: the env's default, doom-lstm)")
    p.add_argument("--env", default="doom:basic", help="environment id (default doom:basic)")
    p.add_argument("--workers", type=_parse_workers, default=None,
                   help="worker counts for end-to-end training, e.g. 1,2,4 (default 1,2,..,cores)")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per end-to-end point (default 6, --quick 2)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions per micro-benchmark (default 7, --quick 3)")
    p.add_argument("--envs-per-worker", type=_parse_envs, default=[1],
                   help="envs each training worker steps in lockstep, K or K1,K2 (end-to-end "
                        "rows for each K in one run, and the GIL probe with the last; default 1)")
    p.add_argument("--worker-processes", action="store_true",
                   help="end-to-end rows with each worker in its own process (the trainer's "
                        "worker_processes); the GIL probe is then skipped")
    p.add_argument("--t-max", type=int, default=20, help="rollout length of loss_and_grad/update (default 20)")
    p.add_argument("--sgemm-n", type=int, default=None, help="sgemm size n (default 1024, --quick 256)")
    p.add_argument("--quick", action="store_true", help="short runs (smoke test; numbers are rough)")
    p.add_argument("--skip-e2e", action="store_true", help="skip end-to-end training and the GIL probe")
    p.add_argument("--skip-env", action="store_true", help="skip the env step row")
    p.add_argument("--skip-gil", action="store_true", help="skip the GIL probe")
    p.add_argument("--skip-embed", action="store_true",
                   help="skip the embedding rows (act_batch, onnxruntime, pytorch)")
    p.add_argument("--json", metavar="PATH", help="also write rows + machine info as JSON")
    return p


def _bench_micro(args, env, env_err, repeat, min_time, peak, add, skipped):
    """Network, kernel, preprocess and env rows; ``(spec, obs_shape, n_actions, flops)``."""
    if env is not None:
        pipe_spec = dict(env.preprocess_spec)
        pipe = ObsPipeline(pipe_spec, env.obs_shape)
        obs_shape, n_actions = pipe.net_obs_shape, env.n_actions
        spec = args.spec if args.spec != "auto" else resolve(Config(env=args.env),
                                                             env.obs_kind).spec
        raw_image = pipe_spec.get("kind") == "image"
        raw_shape = tuple(env.obs_shape)
    else:
        skipped.append(f"env {args.env} ({env_err})")
        spec = args.spec if args.spec != "auto" else "doom-lstm"
        obs_shape = DEFAULT_OBS[spec] if len(DEFAULT_OBS.get(spec, ())) == 3 else (8,)
        n_actions, raw_image, raw_shape = 3, True, (120, 160)
    net = build_network(spec, obs_shape, n_actions)
    fl = flops(net, T=args.t_max)
    add(bench_network(net, args.t_max, repeat, min_time, peak, fl))
    add(bench_kernels(net, args.t_max, repeat, min_time))
    if args.skip_embed:
        skipped.append("embedding rows (--skip-embed)")
    else:
        pipe_spec_e = pipe_spec if env is not None else (
            {"kind": "image", "out_shape": list(obs_shape[1:]), "crop": None}
            if len(obs_shape) == 3 else {"kind": "vector"})
        add(bench_embedding(net, raw_shape if env is not None or len(obs_shape) == 3
                            else obs_shape, pipe_spec_e, repeat, min_time))
    if raw_image and len(raw_shape) in (2, 3):
        add(bench_preprocess(raw_shape, (84, 84), repeat, min_time))
    else:
        add(bench_preprocess((120, 160), (84, 84), repeat, min_time))
    if env is not None and not args.skip_env:
        add(bench_env(env, repeat, min_time))
    return spec, obs_shape, n_actions, fl


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    quick = args.quick
    repeat = args.repeat or (3 if quick else 7)
    if repeat < 1:
        print("a3c bench: error: --repeat must be >= 1", file=sys.stderr)
        return 2
    seconds = args.seconds if args.seconds is not None else (2.0 if quick else 6.0)
    warmup = 1.0 if quick else 2.0
    min_time = 0.01 if quick else 0.05
    sgemm_n = args.sgemm_n or (256 if quick else 1024)
    workers = args.workers or default_workers()

    limit_blas_threads(1)
    info = machine_info()
    hp = info["hugepages"]
    print(f"a3c bench: {info['cpu_model']}, {info['cpu_count']} cores, Python {info['python']}, "
          f"numpy {info['numpy']}, numba {info['numba']}, huge pages "
          f"{'on' if hp['requested'] else 'off'} (THP {hp['thp'] or 'n/a'}), "
          f"{info['backward']} backward", flush=True)
    if info["blas_note"]:
        print(f"a3c bench: note: {info['blas_note']}", flush=True)

    rows, skipped = [], []

    def add(new):
        for r in new if isinstance(new, list) else [new]:
            rows.append(r)
            if not quick:
                print(f"  {r.name}: {r.median:.4g} {r.unit}", flush=True)

    add(bench_sgemm(sgemm_n, repeat, min_time))
    peak = rows[0].median
    add(bench_bandwidth(16 if quick else 64, repeat))

    # the single-thread rows run on one core, the env's engine beside them
    # (one_core), as a pinned training worker and its engines do
    with tempfile.TemporaryDirectory(prefix="a3c-bench-env-") as runtime, one_core() as core:
        if core is not None and not quick:
            print(f"  (single-thread rows pinned to core {core})", flush=True)
        env, env_err = make_bench_env(args.env, runtime)
        try:
            spec, obs_shape, n_actions, fl = _bench_micro(args, env, env_err, repeat, min_time,
                                                          peak, add, skipped)
        finally:
            if env is not None:
                env.close()

    if args.skip_e2e:
        skipped.append("end-to-end and GIL (--skip-e2e)")
    elif env is None:
        skipped.append("end-to-end and GIL (no env)")
    else:
        env_us = next((r.median for r in rows if r.name == "env step"), None)
        for k in args.envs_per_worker:
            add(bench_e2e(args.env, spec, workers, seconds, warmup, k, args.worker_processes,
                          env_step_us=env_us))
        if args.skip_gil:
            skipped.append("GIL probe (--skip-gil)")
        elif args.worker_processes:
            skipped.append("GIL probe (--worker-processes: the workers share no GIL)")
        else:
            add(bench_gil(args.env, spec, max(seconds, 2.0), warmup, args.envs_per_worker[-1]))

    print()
    print(format_table(rows))
    if skipped:
        print("skipped: " + "; ".join(skipped))
    if args.json:
        doc = {"machine": info,
               "args": {k: v for k, v in vars(args).items()},
               "settings": {"repeat": repeat, "seconds": seconds, "warmup": warmup, "sgemm_n": sgemm_n,
                            "workers": workers, "spec": spec, "obs_shape": list(obs_shape),
                            "n_actions": n_actions},
               "flops": {k: v for k, v in fl.items()},
               "rows": [r.to_dict() for r in rows],
               "skipped": skipped,
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, default=_json_default)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
