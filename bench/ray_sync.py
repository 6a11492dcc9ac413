"""A3C on Ray: sync-round cost, and doom:basic 2 nodes vs one process.

    python bench/ray_sync.py sync    [--env doom:basic] [--shards 1,2,4] [--rounds 30]
    python bench/ray_sync.py compare [--seconds 150] [--seed 0]

Both start a local 2-node ``ray.cluster_utils.Cluster`` (1 CPU each, or
``--cpus-per-node``) unless ``--address`` names a running cluster, and shut it
down at the end.

``sync``: 2 node actors (one per Ray node) on the ``--env`` network (doom-lstm,
1.2M params by default), no workers running.  For each shard count and
optimizer-state mode: warm-up rounds, then ``--rounds`` rounds of node 0 alone
(``serial``) and of both nodes at once (``concurrent``).  Reports per round:
bytes moved (push + pull), wall milliseconds (median, p90), node CPU
milliseconds, and the shards' CPU milliseconds (their process time over the
rounds, less their idle rate measured just before: what one round costs the
parameter server, all shards together).

``compare``: the single-process run (``--workers 2`` threads) and the Ray run
(2 nodes x 1 worker on the 2-node cluster), one after the other in this one
invocation, each for ``--seconds`` of training with the same config and seed.
Reports steps/s of each, the ratio, and the seconds until the 100-episode
average raw reward first reached ``--target`` (from each run's metrics.csv);
then the ratio in matching phases (:func:`phase_ratios`: while both still
learn, and once both have converged), since the run that converges later
spends more of its time in long, faster episodes and its whole-run ratio
reads high.
The Ray clock starts when the node actors are ready (as the single run's
starts after its kernels are loaded).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time

import numpy as np


def _cluster(args):
    """(address, cluster or None): a local 2-node cluster unless --address."""
    if args.address:
        return args.address, None
    from ray.cluster_utils import Cluster

    kw = dict(num_cpus=args.cpus_per_node, object_store_memory=args.object_store_mb * 1024**2)
    c = Cluster(initialize_head=True, head_node_args=dict(kw, include_dashboard=False))
    c.add_node(**kw)
    c.wait_for_nodes()
    return c.address, c


def _cfg(args, run_dir, workers, **kw):
    from a3c_core.train.config import Config

    if getattr(args, "cross_episode", None) is not None:
        kw.setdefault("cross_episode", args.cross_episode)
    if getattr(args, "lr", None):
        kw.setdefault("lr", args.lr)
    return Config(env=args.env, workers=workers, seed=args.seed, total_steps=0, quiet=True,
                  tensorboard=False, run_dir=run_dir, **kw)


# -- sync -----------------------------------------------------------------------
def cmd_sync(args):
    import ray

    from a3c_core.distributed.driver import RayOptions, RayTrainer

    address, cluster = _cluster(args)
    rows = []
    try:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR")
        for mode in args.opt_state.split(","):
            for shards in (int(s) for s in args.shards.split(",")):
                with tempfile.TemporaryDirectory() as tmp:
                    opts = RayOptions(nodes=2, shards=shards, opt_state=mode, sync_ms=1e9)
                    tr = RayTrainer(_cfg(args, os.path.join(tmp, "run"), 1), opts)
                    try:
                        rows += _measure(tr, mode, shards, args.rounds)
                    finally:
                        tr.close()
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    print(f"\n{'opt_state':9} {'S':>2} {'how':10} {'MB/round':>8} {'ms med':>7} {'ms p90':>7} "
          f"{'node cpu ms':>11} {'PS cpu ms':>9}")
    for r in rows:
        print(f"{r['opt_state']:9} {r['shards']:>2} {r['how']:10} {r['mbytes']:8.2f} {r['ms_med']:7.1f} "
              f"{r['ms_p90']:7.1f} {r['node_cpu_ms']:11.1f} {r['ps_cpu_ms']:9.1f}")
    _write(args, "ray_sync", {"rows": rows, "machine": _machine()})


def _measure(tr, mode, shards, rounds):
    import ray

    a, b = (s.handle for s in tr.slots)
    ray.get([a.join.remote(), b.join.remote()])
    nbytes = 2 * 4 * tr.shared.n_params * (1 + (len(tr.shared.optimizer._arrays) if mode == "global" else 0))

    def ps_cpu():
        return sum(i["cpu_seconds"] for i in ray.get([s.info.remote() for s in tr.shards]))

    for _ in range(3):   # warm-up
        ray.get(a.sync_once.remote())
    # the shard processes burn some CPU when idle (Ray's own threads): subtract it
    c0, t0 = ps_cpu(), time.perf_counter()
    time.sleep(2.0)
    idle_rate = (ps_cpu() - c0) / (time.perf_counter() - t0)
    out = []
    for how, nodes in (("serial", [a]), ("concurrent", [a, b])):
        walls, cpus = [], []
        c0, t0 = ps_cpu(), time.perf_counter()
        for _ in range(rounds):
            res = ray.get([h.sync_once.remote() for h in nodes])
            walls += [w for w, _ in res]
            cpus += [c for _, c in res]
        busy = ps_cpu() - c0 - idle_rate * (time.perf_counter() - t0)
        ps = max(0.0, busy) / (rounds * len(nodes))
        out.append({"opt_state": mode, "shards": shards, "how": how, "mbytes": nbytes / 1e6,
                    "ms_med": 1e3 * float(np.median(walls)), "ms_p90": 1e3 * float(np.percentile(walls, 90)),
                    "node_cpu_ms": 1e3 * float(np.median(cpus)), "ps_cpu_ms": 1e3 * ps,
                    "n_params": tr.shared.n_params})
        print(out[-1], flush=True)
    return out


# -- compare -----------------------------------------------------------------------
def cmd_compare(args):
    import ray

    from a3c_core.distributed.driver import RayOptions, RayTrainer
    from a3c_core.train.trainer import Trainer

    out_dir = args.run_root or tempfile.mkdtemp(prefix="a3c-ray-compare-")
    results = {}
    if args.only in (None, "single"):
        single_dir = os.path.join(out_dir, "single")
        res = Trainer(_cfg(args, single_dir, 2, total_seconds=args.seconds)).run()
        results["single_2_threads"] = _summary(res, single_dir, args.target)
        print(results["single_2_threads"], flush=True)
    if args.only == "single":
        return _write(args, "ray_compare_single", {"results": results, "args": vars(args)})
    address, cluster = _cluster(args)
    try:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR")
        ray_dir = os.path.join(out_dir, "ray")
        opts = RayOptions(nodes=2, shards=args.shards, sync_ms=args.sync_ms, sync_every=args.sync_every,
                          opt_state=args.opt_state)
        res = RayTrainer(_cfg(args, ray_dir, 1, total_seconds=args.seconds), opts).run()
        results["ray_2_nodes_x_1"] = dict(_summary(res, ray_dir, args.target), ray=res.ray)
        print(results["ray_2_nodes_x_1"], flush=True)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    if args.only == "ray":
        return _write(args, "ray_compare_ray", {"results": results, "machine": _machine(),
                                                "args": vars(args)})
    s, r = results["single_2_threads"], results["ray_2_nodes_x_1"]
    ratio = r["steps_per_s"] / s["steps_per_s"]
    results["throughput_ratio"] = ratio
    results["phases"] = phases = phase_ratios(single_dir, ray_dir, s["seconds_to_target"],
                                              r["seconds_to_target"], s["seconds"])
    print(f"\nsingle process, 2 threads : {s['steps_per_s']:7.0f} steps/s, avg100 >= {args.target:g} "
          f"at {s['seconds_to_target']} s")
    print(f"Ray, 2 nodes x 1 worker   : {r['steps_per_s']:7.0f} steps/s, avg100 >= {args.target:g} "
          f"at {r['seconds_to_target']} s, sync {r['ray']['sync_ms_mean']:.1f} ms/round")
    print(f"throughput ratio Ray/single: {ratio:.3f}  (goal >= 0.85); runs in {out_dir}")
    for ph in phases:
        print(f"  {ph['phase']:>9} [{ph['lo']:.0f}, {ph['hi']:.0f}) s: single {ph['single']:7.0f}, "
              f"Ray {ph['ray']:7.0f} steps/s, ratio {ph['ratio']:.3f}")
    _write(args, "ray_compare", {"results": results, "machine": _machine(), "args": vars(args)})


def _summary(res, run_dir, target):
    return {"status": res.status, "steps": res.steps, "seconds": round(res.seconds, 2),
            "steps_per_s": res.steps / res.seconds, "episodes": res.episodes,
            "final_avg100": res.moving_avg, "seconds_to_target": _time_to(run_dir, target)}


def step_rate(run_dir, lo, hi):
    """Agent steps per second over wall seconds ``[lo, hi)`` of a run, from
    the ``(wall_time, step)`` pairs of its ``metrics.csv`` rows (first and
    last row inside the window); None when the window holds < 2 times."""
    pts = {}
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
        for row in csv.DictReader(fh):
            t = float(row["wall_time"])
            if lo <= t < hi:
                pts[t] = max(pts.get(t, 0), int(float(row["step"])))
    if len(pts) < 2:
        return None
    t0, t1 = min(pts), max(pts)
    return (pts[t1] - pts[t0]) / (t1 - t0)


def phase_ratios(single_dir, ray_dir, t_single, t_ray, seconds, warm=5.0, settle=10.0):
    """Throughput of the two runs compared in matching phases, because a
    run's steps/s depends on its agent (doom:basic: long episodes while it
    learns, ~6-step ones once it is good) and the run that learns later
    spends more of its time in the faster phase.  ``learning``: from
    ``warm`` s to the first crossing of either run; ``converged``: from
    ``settle`` s after the later crossing to the end.  A phase is left out
    when a run never crossed or the window is under 10 s."""
    out = []
    if t_single is None or t_ray is None:
        return out
    for phase, lo, hi in (("learning", warm, min(t_single, t_ray)),
                          ("converged", max(t_single, t_ray) + settle, seconds)):
        if hi - lo < 10.0:
            continue
        a, b = step_rate(single_dir, lo, hi), step_rate(ray_dir, lo, hi)
        if a and b:
            out.append({"phase": phase, "lo": lo, "hi": hi, "single": a, "ray": b, "ratio": b / a})
    return out


def _time_to(run_dir, target):
    """Wall seconds of the first ``charts/moving_avg_return`` >= target, or None."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
        for row in csv.DictReader(fh):
            if row["name"] == "charts/moving_avg_return" and float(row["value"]) >= target:
                return float(row["wall_time"])
    return None


# -- shared ------------------------------------------------------------------------
def _machine():
    from a3c_core.checkpoint import versions

    import ray

    return dict(versions(), ray=ray.__version__, cpus=os.cpu_count(),
                time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), load=os.getloadavg())


def _write(args, name, data):
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}.json")
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("sync", "compare"))
    ap.add_argument("--address", help="a running Ray cluster (default: start a local 2-node one)")
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--object-store-mb", type=int, default=200)
    ap.add_argument("--env", default="doom:basic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/out", help="where the JSON goes (default bench/out, not committed)")
    ap.add_argument("--shards", default=None, help="sync: comma list (default 1,2,4); compare: one (default 1)")
    ap.add_argument("--opt-state", default=None, help="sync: comma list (default local,global); compare: one")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--target", type=float, default=75.0)
    ap.add_argument("--sync-ms", type=float, default=200.0)
    ap.add_argument("--sync-every", type=int, default=0)
    ap.add_argument("--run-root", help="compare: keep the two run directories here")
    ap.add_argument("--cross-episode", action=argparse.BooleanOptionalAction, default=None,
                    help="compare: rollouts across episode boundaries on or off in both runs "
                         "(default: the config default)")
    ap.add_argument("--only", choices=("single", "ray"),
                    help="compare: run only one side (learning trials; the throughput ratio "
                         "needs both in one invocation)")
    ap.add_argument("--lr", type=float, default=None, help="compare: learning rate of both runs "
                    "(default: the config default)")
    args = ap.parse_args(argv)
    if args.what == "sync" and (args.only or args.lr):
        ap.error("--only and --lr apply to compare, not to sync")
    if args.what == "sync":
        args.shards = args.shards or "1,2,4"
        args.opt_state = args.opt_state or "local,global"
        return cmd_sync(args)
    args.shards = int(args.shards or 1)
    args.opt_state = args.opt_state or "local"
    return cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
