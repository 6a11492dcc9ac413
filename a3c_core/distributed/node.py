"""A node: the threaded A3C trainer of one machine plus a sync thread.

Inside a node nothing differs from ``a3c train``: W worker threads run
:class:`~a3c_core.train.worker.Worker` rollouts against a
:class:`~a3c_core.train.worker.ThreadStore` on the node's own
:class:`~a3c_core.core.SharedState` (flat params + optimizer statistics,
Hogwild).  One more thread syncs the node with the parameter-server shards
(see :mod:`a3c_core.distributed.sync`): every ``sync_every`` local updates or
every ``sync_ms`` milliseconds, whichever comes first, it pushes the local
change since the last sync and pulls the global vector back.

Optimizer statistics (``opt_state``):

* ``"local"`` (default): each node keeps its own Adam/RMSProp statistics;
  only params travel (one vector up, one down per round).  Each node's
  statistics estimate the moments of the same gradient distribution, so
  nothing is lost by not averaging them, and a round moves 1/3 of the bytes
  of ``"global"`` with Adam (measured: docs/ray.md).
* ``"global"``: the statistics are synced too, averaged across nodes (each
  node's statistics delta is scaled by ``1 / n_nodes`` at the shard).

Reward and advantage normalization (:mod:`a3c_core.core.normalize`) are per
node; the driver checkpoints the first live node's statistics and every node
starts from them on resume.

:class:`Node` is a plain class; the driver runs it as a Ray actor with
``max_restarts``.  A restarted actor runs ``__init__`` again, and the
driver's next :meth:`start` pulls the global vectors: the node rejoins.  Its
optimizer statistics and normalizers start again from the run's starting
state (fresh, or the resumed checkpoint's) in ``opt_state="local"`` mode.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import traceback

import numpy as np

from a3c_core._blas import blas_threads
from a3c_core.distributed.sync import NodeSync
from a3c_core.envs import make_env
from a3c_core.obs import ObsPipeline
from a3c_core.train.affinity import allowed_cores, pin_thread
from a3c_core.train.build import build_parts, new_network, seed_of, worker_offset
from a3c_core.train.config import env_args
from a3c_core.train.backends import STOP_GRACE
from a3c_core.train.watchdog import StepWatchdog, kill_engines
from a3c_core.train.store import LossStats, ThreadStore
from a3c_core.train.worker import Worker
from a3c_core.warmup import warm_up_network

__all__ = ["Node", "NodeStore", "ShardFailure", "stat_arrays"]


class ShardFailure(RuntimeError):
    """A parameter-server shard did not answer a sync round (it died)."""


def stat_arrays(optimizer):
    """Names of the optimizer's statistic arrays, and the lower clamp for each
    when synced (0 for squared-gradient averages, None otherwise)."""
    return {a: (0.0 if "sq" in a or "square" in a else None) for a in optimizer.array_names}


class NodeStore(ThreadStore):
    """ThreadStore whose episodes are queued for the driver and whose
    learning-rate step is the global step (driver's count + local since)."""

    def __init__(self, shared, normalizer=None, adv_normalizer=None):
        super().__init__(shared, normalizer, self._queue_episode, adv_normalizer=adv_normalizer)
        self.episodes = []
        self._elock = threading.Lock()
        self.global_base = 0      # global steps at the driver's last poll
        self.local_base = 0       # local steps at that time

    def _queue_episode(self, wid, ret, length, index, end=None):
        with self._elock:
            self.episodes.append((int(wid), float(ret), int(length), end))

    def drain(self):
        with self._elock:
            out, self.episodes = self.episodes, []
        return out

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        step = self.global_base + (self.shared.steps - self.local_base)
        norm, applied = self.shared.apply(grads, max_grad_norm, global_step=step, offset=offset,
                                          sync_to=local)
        with self._lock:
            self.consecutive_skips = 0 if applied else self.consecutive_skips + 1
        return norm, applied


class Node:
    """One node's workers and sync thread (a Ray actor in a run).

    Args:
        index: node number (0..n_nodes-1); worker ids are ``index * W + i``.
        n_nodes: nodes in the run.
        setup: dict from the driver: ``plan`` (the run's
            :class:`~a3c_core.train.build.RunPlan`), ``n_workers``, ``opt_state`` ("local" or
            "global"), ``sync_every``, ``sync_ms``, ``resumes``.
        shards: Ray actor handles of the :class:`~a3c_core.distributed.ps.ParamShard` s.
        bounds: ``[(lo, hi), ...]`` of the shards.
        restore: ``{"optimizer": state or None, "normalizers": {meta key: state}}``
            (the run's current optimizer / normalizer states; on resume the checkpoint's).
    """

    def __init__(self, index, n_nodes, setup, shards, bounds, restore=None):
        self.index, self.n_nodes = int(index), int(n_nodes)
        self.setup = setup
        self.plan = plan = setup["plan"]
        self.cfg = plan.cfg
        self.shards, self.bounds = list(shards), list(bounds)
        self.n_workers = int(setup["n_workers"])
        self.restarted = _was_restarted()
        # a restarted node must not replay the episodes of its first life
        self.nonce = int.from_bytes(os.urandom(3), "little") if self.restarted else 0
        # the run's parts, built from the driver's plan as the driver built its
        # own; optimizer and normalizer states from the run (on resume: the checkpoint)
        parts = build_parts(plan, restore)
        self.shared = parts.shared
        opt = self.shared.optimizer
        #: running statistics, per node; keys are the checkpoint's meta keys
        self.normalizers = parts.normalizers()
        self.store = NodeStore(self.shared, self.normalizers.get("reward_normalizer"),
                               self.normalizers.get("advantage_normalizer"))
        self.syncs = {"params": NodeSync(self.shared.params, self.bounds)}
        if setup["opt_state"] == "global":
            for name, clamp in stat_arrays(opt).items():
                self.syncs[name] = NodeSync(getattr(opt, name), self.bounds, clamp_min=clamp)
        warm_up_network(new_network(plan), plan.resolved.records_resets,
                        n_envs=plan.cfg.envs_per_worker)
        self.runtime_dir = tempfile.mkdtemp(prefix=f"a3c-node{self.index}-")
        self.stop_event = threading.Event()
        self.errors = []          # (kind, text): kind "worker" or "shard"
        self.workers = [None] * self.n_workers
        self.envs = [None] * self.n_workers
        self.threads = []
        self.sync_thread = None
        self.sync_stats = {"rounds": 0, "seconds": 0.0, "bytes": 0, "max_seconds": 0.0}
        self.started = False
        self.restarts = []        # env restarts not yet polled: on_env_restart's arguments
        self._restart_lock = threading.Lock()
        self.watchdog = None

    # -- setup ------------------------------------------------------------
    def ready(self):
        """``{"node_id": Ray node id, "host": hostname, "restarted": bool, "pid"}``."""
        import socket

        return {"node_id": _ray_node_id(), "host": socket.gethostname(),
                "restarted": self.restarted, "pid": os.getpid(), "n_params": self.shared.n_params}

    def _pull_all(self):
        """{name: [slice per shard]} from every shard (join / rejoin)."""
        import ray

        names = list(self.syncs)
        try:
            res = ray.get([s.pull.remote(names) for s in self.shards], timeout=120)
        except Exception as e:  # noqa: BLE001 - any failure here is a shard failure
            raise ShardFailure(f"node {self.index}: could not pull from the parameter server: "
                               f"{type(e).__name__}: {e}") from None
        return {n: [r[n] for r in res] for n in names}

    # -- control (called by the driver) --------------------------------------
    def join(self):
        """Set the node's vectors (and sync bases) to the global ones."""
        pulled = self._pull_all()
        for name, sync in self.syncs.items():
            sync.reset(pulled[name])

    def start(self, core_offset=0, global_steps=0):
        """Pull the global vectors and start the workers and the sync thread
        (idempotent).  ``core_offset``: first core for pinning on this host."""
        if self.started:
            return self.ready()
        self.join()
        self.store.global_base = int(global_steps)
        self.store.local_base = self.shared.steps
        self.started = True
        for i in range(self.n_workers):
            th = threading.Thread(target=self._worker_main, args=(i, int(core_offset)),
                                  daemon=True, name=f"a3c-node{self.index}-worker-{i}")
            th.start()
            self.threads.append(th)
        self.sync_thread = threading.Thread(target=self._sync_main, daemon=True,
                                            name=f"a3c-node{self.index}-sync")
        self.sync_thread.start()
        self.watchdog = StepWatchdog(lambda: self.workers, self.cfg.env_step_timeout,
                                     lambda line: print(f"node {self.index}: {line}", flush=True))
        self.watchdog.start()
        return self.ready()

    def poll(self, global_steps=None):
        """Cumulative counters of this node's life, and the episodes since the
        last poll: ``{"steps", "updates", "skipped", "episodes": [(wid, ret, len, end)],
        "losses": (len(LossStats.FIELDS),) float64, "consecutive_skips", "sync": {...}, "errors",
        "alive": bool, "started": bool}``.  ``started`` is False in an actor
        that Ray restarted and that has not been told to :meth:`start` yet
        (a poll can reach the new instance before the driver saw the old die)."""
        if global_steps is not None:
            self.store.global_base = int(global_steps)
            self.store.local_base = self.shared.steps
        c = self.shared.counters()
        arrs = [w.stats.as_array() for w in self.workers if w is not None]
        return {
            "steps": c["steps"], "updates": c["updates"], "skipped": c["skipped_updates"],
            "episodes": self.store.drain(),
            "restarts": self._drain_restarts(),
            "losses": np.sum(arrs, axis=0) if arrs else np.zeros(len(LossStats.FIELDS)),
            "consecutive_skips": self.store.consecutive_skips,
            "sync": dict(self.sync_stats),
            "errors": list(self.errors),
            "alive": any(th.is_alive() for th in self.threads) and not self.stop_event.is_set(),
            "started": self.started,
        }

    def stop(self, timeout=60.0):
        """Stop the workers, push the last local change, close the envs;
        returns the final :meth:`poll`."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        grace = time.monotonic() + min(timeout, STOP_GRACE)
        for th in self.threads:
            th.join(max(0.1, grace - time.monotonic()))
        for i, th in enumerate(self.threads):
            if th.is_alive():       # stuck in an env call: its call raises, it ends
                w = self.workers[i]
                kill_engines(w.envs if w is not None else (self.envs[i] or ()))
        for th in self.threads:
            th.join(max(0.1, deadline - time.monotonic()))
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.sync_thread is not None:
            self.sync_thread.join(max(0.1, deadline - time.monotonic()))
        self._close_envs()
        return self.poll()

    def optimizer_state(self):
        """The node's optimizer ``state_dict`` (arrays are copies)."""
        return self.shared.optimizer.state_dict()

    def normalizer_states(self):
        """``{meta key: state_dict}`` of the node's running statistics."""
        return {k: n.state_dict() for k, n in self.normalizers.items()}

    def sync_once(self):
        """Run one sync round now (benchmarks and tests): ``(wall seconds, CPU
        seconds of this process)``; the CPU figure is the round's cost when the
        workers are not running."""
        c0 = time.process_time()
        wall = self._round()
        return wall, time.process_time() - c0

    def local_params(self):
        return self.shared.params.copy()

    def set_local(self, name, values):
        """Overwrite the node's live vector ``name`` (tests: a known local change)."""
        self.syncs[name].x[...] = values

    # -- threads --------------------------------------------------------------
    def _worker_main(self, i, core_offset):
        cfg, st = self.cfg, self.setup
        gw = self.index * self.n_workers + i
        try:
            cores = allowed_cores() if cfg.pin_threads else []
            if cores:
                pin_thread({cores[(core_offset + i) % len(cores)]})
            K = cfg.envs_per_worker
            envs = self.envs[i] = []

            def build(j):               # (env j > 0: envs_per_worker)
                key = (cfg.seed, gw, st["resumes"], self.nonce) + ((j,) if j else ())
                return make_env(cfg.env, seed=seed_of(*key), runtime_dir=self.runtime_dir,
                                **env_args(cfg))

            def remake(j):              # the same seed, kept where _close_envs finds it
                env = envs[j] = build(j)
                return env

            for j in range(K):
                envs.append(build(j))
            env = envs[0]
            pipe = ObsPipeline(self.plan.pipeline_spec, env.obs_shape)
            rng = np.random.default_rng([cfg.seed, gw, st["resumes"], self.nonce])
            w = self.workers[i] = Worker(
                gw, envs if K > 1 else env, new_network(self.plan), pipe, self.store,
                self.plan.settings, rng,
                offset=worker_offset(i, self.n_workers, self.shared.n_params),
                remake_env=remake, env_restarts=cfg.env_restarts,
                on_env_restart=self._env_restarted)
            with blas_threads(1):
                w.run(self.stop_event)
        except BaseException:  # noqa: BLE001 - reported to the driver by poll()
            self.errors.append(("worker", f"node {self.index} worker {gw}:\n{traceback.format_exc()}"))
            self.stop_event.set()

    def _env_restarted(self, wid, k, summary, text, count, limit):
        """Queued for the driver, which writes errors.log and the warning line."""
        with self._restart_lock:
            self.restarts.append((wid, k, summary, f"node {self.index}: {text}", count, limit))

    def _drain_restarts(self):
        with self._restart_lock:
            out, self.restarts = self.restarts, []
        return out

    def _sync_main(self):
        every, period = int(self.setup["sync_every"]), float(self.setup["sync_ms"]) / 1000.0
        last_updates, last_t = self.shared.updates, time.monotonic()
        try:
            while not self.stop_event.is_set():
                due = ((every and self.shared.updates - last_updates >= every)
                       or (period and time.monotonic() - last_t >= period))
                if not due:
                    # by time only: sleep to the deadline; by updates: poll every 2 ms
                    left = period - (time.monotonic() - last_t) if period else 0.002
                    self.stop_event.wait(0.002 if every else max(0.0005, left))
                    continue
                last_updates, last_t = self.shared.updates, time.monotonic()
                self._round()
            for th in self.threads:     # the last local change goes to the shards too
                th.join(30.0)
            self._round()
        except ShardFailure as e:
            self.errors.append(("shard", str(e)))
            self.stop_event.set()
        except BaseException:  # noqa: BLE001
            self.errors.append(("sync", f"node {self.index} sync thread:\n{traceback.format_exc()}"))
            self.stop_event.set()

    def _round(self):
        """One push-pull round to every shard; returns its seconds."""
        import ray

        t0 = time.perf_counter()
        deltas = {name: sync.begin() for name, sync in self.syncs.items()}
        refs = [shard.push_pull.remote({n: d[k] for n, d in deltas.items()})
                for k, shard in enumerate(self.shards)]
        try:
            res = ray.get(refs, timeout=120)
        except Exception as e:  # noqa: BLE001
            k = failed_shard(refs)
            which = f"shard {k}" if k is not None else "a shard"
            raise ShardFailure(f"parameter-server {which} failed during a sync round of node "
                               f"{self.index}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        for name, sync in self.syncs.items():
            sync.finish([r[name] for r in res])
        dt = time.perf_counter() - t0
        s = self.sync_stats
        s["rounds"] += 1
        s["seconds"] += dt
        s["max_seconds"] = max(s["max_seconds"], dt)
        s["bytes"] += 2 * sum(sync.x.nbytes for sync in self.syncs.values())
        return dt

    def _close_envs(self):
        for i, envs in enumerate(self.envs):
            for env in envs or ():        # (worker i's envs, as they were made)
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - closing the rest matters more
                    pass
            self.envs[i] = None
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def failed_shard(refs):
    """The index of the first of a round's ``refs`` (one per shard) that raises
    or has not answered within 0.1 s, or None."""
    import ray

    for k, r in enumerate(refs):
        try:
            ray.get(r, timeout=0.1)
        except Exception:  # noqa: BLE001
            return k
    return None


def _was_restarted():
    import warnings

    try:
        import ray

        with warnings.catch_warnings():  # Ray 2.60 warns from inside its own property
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not in a Ray actor
        return False


def _ray_node_id():
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001
        return None
