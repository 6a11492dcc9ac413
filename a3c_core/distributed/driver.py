"""The Ray run loop: parameter-server shards, node actors, one run directory.

:class:`RayBackend` is the :class:`~a3c_core.train.backends.Backend` of a
:class:`~a3c_core.train.trainer.Trainer` whose
workers live in node actors (:class:`~a3c_core.distributed.node.Node`, W
threads each) instead of this process.  The driver keeps everything a
single-node run has: the run directory, ``config.toml``, ``metrics.csv`` /
``episodes.csv`` / TensorBoard (every node's episodes and losses merged into
one run, worker ids ``node * W + i``), ``latest.npz`` / ``best.npz``,
``--resume``, SIGINT/SIGTERM, ``summary.json`` and the final line.

Topology: S :class:`~a3c_core.distributed.ps.ParamShard` actors (0 CPUs,
spread over the cluster) hold contiguous slices of the global vectors; N node
actors (``node_cpus`` CPUs each, spread) train and sync asynchronously.  The
driver polls the nodes every ``poll_s`` seconds for counters, episodes and
errors; it never touches the training path.

Faults:

* a node actor that dies is restarted by Ray (``max_restarts``); the driver
  sees the failed poll, asks the new actor to ``start()``, which pulls the
  global vectors (it rejoins), and the run goes on.  Steps and episodes the
  dead node had not reported yet are lost; nothing written is.
* a shard that dies (shards are not restarted: their slice exists nowhere
  else) stops the run with :class:`ShardLost` naming the shard; the last
  checkpoint stays and ``--resume`` continues from it.

Checkpoints hold the global params (from the shards), the optimizer state
(``opt_state="local"``: the element-wise mean of up to 4 live nodes'
statistics, the largest Adam step; ``"global"``: the shards' statistics) and the first live
node's reward/advantage normalizers.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np

from a3c_core.checkpoint import CheckpointError
from a3c_core.distributed.options import RayOptions
from a3c_core.distributed.sync import shard_bounds
from a3c_core.train.backends import Backend, TrainingError
from a3c_core.train.trainer import Trainer
from a3c_core.train.store import LossStats

__all__ = ["RayOptions", "RayBackend", "RayTrainer", "ShardLost", "NodeLost", "train_ray"]


class ShardLost(TrainingError):
    """A parameter-server shard died: the run stops (resume from the last checkpoint)."""


class NodeLost(TrainingError):
    """A node actor died and Ray could not restart it."""


class _NodeSlot:
    """Driver-side bookkeeping of one node actor across its restarts."""

    def __init__(self, index, handle):
        self.index = index
        self.handle = handle
        self.status = "starting"    # running | restarting | stopped
        self.restarts = 0
        self.pending_start = None   # ObjectRef of a start() call in flight
        self.lost_at = None
        # global agent steps when it last became "running": every step and
        # episode it reports from then on is counted after this
        self.running_since_steps = None
        self.last = {"steps": 0, "updates": 0, "skipped": 0}
        self.loss_retired = np.zeros(len(LossStats.FIELDS))
        self.loss_now = np.zeros(len(LossStats.FIELDS))
        self.sync = {"rounds": 0, "seconds": 0.0, "bytes": 0, "max_seconds": 0.0}
        self.sync_retired = {"rounds": 0, "seconds": 0.0, "bytes": 0}
        self.consecutive_skips = 0
        self.core_offset = 0


class RayBackend(Backend):
    """The backend whose workers run in Ray node actors (see the module docstring)."""

    name = "workers per node"
    live_optimizer = False      # the nodes hold the live statistics

    def __init__(self, ray_options: RayOptions | None = None):
        super().__init__("--ray")
        self.opts = (ray_options or RayOptions()).validate()
        self._own_ray = False
        self.shards, self.slots = [], []

    def describe(self) -> str:
        return f"{self.opts.nodes} nodes x {self.ctx.n_workers} workers (Ray)"

    @property
    def tick_seconds(self):
        return self.opts.poll_s

    # -- setup ----------------------------------------------------------------
    def prepare(self):
        """The driver built env 0 only to plan the run; the nodes build their own."""
        self.ctx.env_slots.close()
        self._connect()
        self._launch()

    def written(self):
        with open(os.path.join(self.ctx.run_dir, "ray.json"), "w") as fh:
            json.dump(dataclasses.asdict(self.opts), fh, indent=1)

    def _connect(self):
        import ray

        if ray.is_initialized():
            return
        o = self.opts
        kw = dict(include_dashboard=False, logging_level="WARNING", log_to_driver=True)
        if o.address in (None, "", "local"):
            need = o.nodes * self._node_cpus()
            kw["num_cpus"] = max(int(np.ceil(need)), os.cpu_count() or 1)
            ray.init(**kw)
        else:
            ray.init(address=o.address, **kw)
        self._own_ray = True

    def _node_cpus(self):
        return float(self.opts.node_cpus or self.ctx.n_workers)

    def _setup_dict(self):
        return {
            "plan": self.ctx.plan, "n_workers": self.ctx.n_workers,
            "opt_state": self.opts.opt_state,
            "sync_every": self.opts.sync_every, "sync_ms": self.opts.sync_ms,
            "resumes": self.ctx.resumes,
        }

    def _launch(self):
        """Shards (from the current, possibly resumed, global vectors), then the nodes."""
        import ray

        from a3c_core.distributed.node import Node, stat_arrays
        from a3c_core.distributed.ps import ParamShard

        o = self.opts
        have = ray.cluster_resources().get("CPU", 0.0)
        need = o.nodes * self._node_cpus()
        if have < need:
            raise ValueError(
                f"the Ray cluster has {have:g} CPUs; {o.nodes} nodes x {self._node_cpus():g} "
                f"CPUs need {need:g} (use fewer --nodes or --workers, set --node-cpus, or add machines)")
        n = self.ctx.shared.n_params
        self.bounds = shard_bounds(n, o.shards)
        opt = self.ctx.shared.optimizer
        vectors = {"params": self.ctx.shared.params}
        scales = {"params": 1.0}
        if o.opt_state == "global":
            for name in stat_arrays(opt):
                vectors[name] = getattr(opt, name)
                scales[name] = 1.0 / o.nodes
        ShardActor = ray.remote(ParamShard).options(num_cpus=0, max_restarts=0,
                                                    scheduling_strategy="SPREAD")
        self.shards = [ShardActor.remote(k, lo, hi, {nm: v[lo:hi].copy() for nm, v in vectors.items()},
                                         scales)
                       for k, (lo, hi) in enumerate(self.bounds)]
        # held for the whole run: a restarted node actor gets its constructor
        # arguments again, and an object nobody references is gone by then
        self._restore_ref = restore = ray.put(
            {"optimizer": opt.state_dict(),
             "normalizers": {k: n.state_dict() for k, n in self._normalizers().items()}})
        NodeActor = ray.remote(Node).options(num_cpus=self._node_cpus(), max_restarts=o.max_restarts,
                                             max_task_retries=0, scheduling_strategy="SPREAD")
        setup = self._setup_dict()
        self.slots = [_NodeSlot(i, NodeActor.remote(i, o.nodes, setup, self.shards, self.bounds, restore))
                      for i in range(o.nodes)]
        refs = [s.handle.ready.remote() for s in self.slots]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=o.start_timeout)
        if pending:
            raise ValueError(f"only {len(ready)} of {o.nodes} node actors were ready after "
                             f"{o.start_timeout:g}s (not enough free CPUs in the cluster, or slow "
                             "start-up); see `ray status`")
        infos = ray.get(refs)
        ray.get([s.info.remote() for s in self.shards], timeout=o.start_timeout)
        # pinning: the k-th node actor on a machine starts at core k * W
        per_host = {}
        for slot, info in zip(self.slots, infos):
            rank = per_host.setdefault(info["host"], 0)
            slot.core_offset = rank * self.ctx.n_workers
            per_host[info["host"]] = rank + 1
        self.hosts = len(per_host)
        self.ray_nodes = len({info["node_id"] for info in infos})

    # -- checkpoints --------------------------------------------------------------
    def before_save(self, which="latest"):
        """Refresh the driver's copy of the global state from the shards (and
        the nodes' optimizer statistics); the run's checkpoints then write it
        like a single-node run's."""
        self._refresh_global(which)

    def _refresh_global(self, which):
        import ray

        from a3c_core.distributed.node import failed_shard

        refs = [s.pull.remote() for s in self.shards]
        try:
            res = ray.get(refs, timeout=120)
        except Exception as e:  # noqa: BLE001
            k = failed_shard(refs)
            raise CheckpointError(
                f"parameter-server shard {'?' if k is None else k} did not answer "
                f"({type(e).__name__}: {str(e).splitlines()[0]}); {which}.npz not written, "
                "the previous checkpoint is kept") from None
        opt = self.ctx.shared.optimizer
        for (lo, hi), r in zip(self.bounds, res):
            self.ctx.shared.params[lo:hi] = r["params"]
            if self.opts.opt_state == "global":
                for name, arr in r.items():
                    if name != "params":
                        getattr(opt, name)[lo:hi] = arr
        # optimizer statistics and normalizers: for 'latest', or when the copy is
        # older than a minute ('best' is written often while the average climbs;
        # its params are what matters).  At most 4 nodes' statistics are averaged.
        now = time.perf_counter()
        if which != "latest" and now - getattr(self, "_opt_fresh", -np.inf) < 60.0:
            return
        self._opt_fresh = now
        live = [s for s in self.slots if s.status == "running"][:4]
        states, norms = [], None
        for s in live:
            try:
                states.append(ray.get(s.handle.optimizer_state.remote(), timeout=60))
                if norms is None:
                    norms = ray.get(s.handle.normalizer_states.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a node lost now; the others suffice
                continue
        if states:
            merged = dict(states[0])
            for k in opt.int_names:
                merged[k] = max(int(st[k]) for st in states)
            if self.opts.opt_state == "local":
                for name in opt.array_names:
                    merged[name] = np.mean([st[name] for st in states], axis=0, dtype=np.float64)
            else:
                for name in opt.array_names:
                    merged[name] = getattr(opt, name).copy()
            opt.load_state_dict({k: v for k, v in merged.items() if k not in opt.hyper_names})
        mine = self._normalizers()
        for key, state in (norms or {}).items():
            if key in mine:
                mine[key].load_state_dict(state)

    def _normalizers(self):
        """The driver's copies of the running statistics, by checkpoint meta key."""
        return self.ctx.parts.normalizers()

    # -- the run: the Trainer's template, with nodes instead of threads ---------
    def start(self):
        self.ctx.clock.start()
        self._last_sync = self._sync_totals()
        for s in self.slots:
            s.pending_start = s.handle.start.remote(s.core_offset, int(self.ctx.shared.steps))
        return None

    def running(self, handles) -> bool:
        return not self.ctx.stop_event.is_set()

    def stop(self, handles):
        if self.ctx.clock.started:
            self._stop_nodes()

    def before_tick(self):
        self._poll()

    def consecutive_skips(self) -> int:
        return max((s.consecutive_skips for s in self.slots), default=0)

    def after_log(self, steps, dt):
        sync = self._sync_totals()
        self._log_sync(steps, sync, self._last_sync, dt)
        self._last_sync = sync

    def guard(self, fn, *args):
        self._guarded(fn, *args)

    def extend_result(self, result):
        result.ray = self.ray_summary()

    def failure(self, path):
        errors = self.ctx.report.errors
        who, text = errors[0]
        first = text.strip().splitlines()[-1] if text.strip() else ""
        if who == "shard":
            return ShardLost(f"{first}; the run stopped. Last checkpoint: {path or 'none written'}; "
                             f"continue it with --resume {self.ctx.run_dir}", errors)
        if who == "node-lost":
            return NodeLost(f"{first}; last checkpoint: {path or 'none written'}", errors)
        what = f"{who} failed" if str(who).startswith("node") else f"{who}: {first}"
        return TrainingError(f"{what}; last checkpoint: {path or 'none written'}", errors)

    def _guarded(self, fn, *args):
        """Run a checkpoint write; a dead shard stops the run (ShardLost) instead of raising."""
        try:
            fn(*args)
        except CheckpointError as e:
            if not self._shard_dead():
                raise
            self.ctx.report.errors.append(("shard", str(e)))
            self.ctx.stop_event.set()

    # -- node polling and faults ------------------------------------------------
    def _poll(self):
        import ray

        for s in list(self.slots):
            if s.pending_start is not None:
                self._check_start(s)
        live = [s for s in self.slots if s.status == "running"]
        refs = [s.handle.poll.remote(int(self.ctx.shared.steps)) for s in live]
        for s, ref in zip(live, refs):
            try:
                r = ray.get(ref, timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                self._node_lost(s, e)
                continue
            self._absorb(s, r)

    def _absorb(self, s, r):
        """Fold one poll result of node ``s`` into the global counters and logs."""
        if not r.get("started", True):
            # Ray restarted the actor between two polls: this is its new,
            # unstarted instance (counters from 0), not the node we started
            self._node_lost(s, RuntimeError("node actor restarted by Ray"))
            return
        d_steps = r["steps"] - s.last["steps"]
        d_upd = r["updates"] - s.last["updates"]
        d_skip = r["skipped"] - s.last["skipped"]
        s.last = {"steps": r["steps"], "updates": r["updates"], "skipped": r["skipped"]}
        shared, report = self.ctx.shared, self.ctx.report
        if d_steps:
            shared.add_steps(d_steps)
        if d_upd:
            shared.add_updates(d_upd)
        if d_skip:
            shared.add_skipped_updates(d_skip)
        for wid, ret, length, end in r["episodes"]:
            idx = shared.add_episodes(1)
            report.on_episode(wid, ret, length, idx, end=end)
        for restart in r.get("restarts", ()):
            report.env_restarted(*restart)
        s.loss_now = np.asarray(r["losses"], np.float64)
        s.sync = r["sync"]
        s.consecutive_skips = r["consecutive_skips"]
        for kind, text in r["errors"]:
            entry = ("shard", text) if kind == "shard" else (f"node {s.index} ({kind})", text)
            if entry not in report.errors:
                report.errors.append(entry)
            self.ctx.stop_event.set()

    def _node_lost(self, s, err):
        """A poll or start of node ``s`` failed: Ray is restarting it (or cannot)."""
        if s.status == "restarting":
            return
        s.restarts += 1
        s.status = "restarting"
        s.lost_at = time.perf_counter()
        s.loss_retired += s.loss_now
        s.loss_now = np.zeros(len(LossStats.FIELDS))
        for k in ("rounds", "seconds", "bytes"):
            s.sync_retired[k] += s.sync.get(k, 0)
        s.sync = {"rounds": 0, "seconds": 0.0, "bytes": 0, "max_seconds": 0.0}
        s.last = {"steps": 0, "updates": 0, "skipped": 0}
        ctx = self.ctx
        if s.restarts > self.opts.max_restarts:
            ctx.report.errors.append(("node-lost", f"node {s.index} died {s.restarts} times; "
                                      f"max_restarts={self.opts.max_restarts} is used up"))
            ctx.stop_event.set()
            return
        if not ctx.cfg.quiet:
            print(f"\nnode {s.index} lost ({type(err).__name__}); Ray restarts it and it rejoins "
                  f"from the global parameters (restart {s.restarts}/{self.opts.max_restarts})",
                  file=ctx.report.out, flush=True)
        s.pending_start = s.handle.start.remote(s.core_offset, int(ctx.shared.steps))

    def _check_start(self, s):
        import ray

        done, _ = ray.wait([s.pending_start], timeout=0)
        if not done:
            if s.lost_at is not None and time.perf_counter() - s.lost_at > self.opts.start_timeout:
                self.ctx.report.errors.append(("node-lost", f"node {s.index} did not come back "
                                               f"within {self.opts.start_timeout:g}s of its restart"))
                self.ctx.stop_event.set()
            return
        ref, s.pending_start = s.pending_start, None
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            if s.status == "restarting":   # died again before it started: try again
                s.pending_start = s.handle.start.remote(s.core_offset, int(self.ctx.shared.steps))
            else:
                self._node_lost(s, e)
            return
        except Exception as e:  # noqa: BLE001 - e.g. ShardFailure while joining
            text = str(e)
            kind = "shard" if "parameter server" in text else f"node {s.index}"
            self.ctx.report.errors.append((kind, text))
            self.ctx.stop_event.set()
            return
        s.running_since_steps = int(self.ctx.shared.steps)
        s.status = "running"

    def _shard_dead(self):
        import ray

        for k, sh in enumerate(self.shards):
            try:
                ray.get(sh.info.remote(), timeout=30)
            except Exception:  # noqa: BLE001
                return True
        return False

    def _stop_nodes(self):
        import ray

        live = [s for s in self.slots if s.status == "running"]
        refs = [s.handle.stop.remote() for s in live]
        for s, ref in zip(live, refs):
            try:
                r = ray.get(ref, timeout=120)
                if r.get("started", True):   # else a restarted instance: nothing to count
                    self._absorb(s, r)
            except Exception:  # noqa: BLE001 - a node lost at the very end
                pass
            s.status = "stopped"

    # -- metrics ------------------------------------------------------------------
    def loss_totals(self):
        if not self.slots:
            return np.zeros(len(LossStats.FIELDS))
        return np.sum([s.loss_retired + s.loss_now for s in self.slots], axis=0)

    def _sync_totals(self):
        rounds = sum(s.sync_retired["rounds"] + s.sync.get("rounds", 0) for s in self.slots)
        secs = sum(s.sync_retired["seconds"] + s.sync.get("seconds", 0.0) for s in self.slots)
        nbytes = sum(s.sync_retired["bytes"] + s.sync.get("bytes", 0) for s in self.slots)
        return rounds, secs, nbytes

    def _log_sync(self, steps, now, before, dt):
        rounds = now[0] - before[0]
        el = self.ctx.clock.elapsed()
        log = self.ctx.report.logger
        log.scalar("ray/sync_rounds_per_s", rounds / dt, steps, el)
        log.scalar("ray/sync_mbytes_per_s", (now[2] - before[2]) / dt / 1e6, steps, el)
        if rounds > 0:
            log.scalar("ray/sync_ms", 1e3 * (now[1] - before[1]) / rounds, steps, el)
        log.scalar("ray/node_restarts", sum(s.restarts for s in self.slots), steps, el)

    def ray_summary(self):
        rounds, secs, nbytes = self._sync_totals()
        return {
            **dataclasses.asdict(self.opts), "hosts": getattr(self, "hosts", None),
            "ray_nodes": getattr(self, "ray_nodes", None),
            "workers_per_node": self.ctx.n_workers,
            "node_restarts": [s.restarts for s in self.slots],
            "sync_rounds": rounds, "sync_bytes": nbytes,
            "sync_ms_mean": 1e3 * secs / rounds if rounds else None,
            "sync_ms_max": max((s.sync.get("max_seconds", 0.0) for s in self.slots), default=0.0) * 1e3,
        }

    # -- resources ----------------------------------------------------------------
    def live_steps(self) -> int:
        return int(self.ctx.shared.steps)

    def closed(self):
        """After the trainer closed its envs: the actors, and Ray if this run started it."""
        try:
            import ray
        except ImportError:  # pragma: no cover
            return
        if not ray.is_initialized():
            return
        for a in [s.handle for s in self.slots] + list(self.shards):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.slots, self.shards = [], []
        if self._own_ray:
            ray.shutdown()
            self._own_ray = False


def RayTrainer(cfg, ray_options=None, *, resume=None, out=None) -> Trainer:
    """A :class:`~a3c_core.train.trainer.Trainer` with a :class:`RayBackend`."""
    return Trainer(cfg, resume=resume, out=out, backend=RayBackend(ray_options))


def train_ray(cfg, ray_options=None, *, resume=None, out=None):
    """One-call version: build a Ray-backed trainer and run it."""
    return RayTrainer(cfg, ray_options, resume=resume, out=out).run()
