"""The envs of one run's workers, by slot: :class:`EnvSlots`.

Env ``e`` of a run is env ``e % envs_per_worker`` of worker ``e //
envs_per_worker``.  Each slot's env is started once, by the first thread to
claim it (:meth:`EnvSlots.get`): the env starter thread that runs beside the
warm-up (:meth:`EnvSlots.start_beside`), or the worker that needs it first.
A worker's env that fails is rebuilt in its slot (:meth:`EnvSlots.remake`),
with the same id, options and seed.  Each env's seed comes from the run's
seed, the worker, the env's index in the worker, the run's resume count and
the worker's *generation* (how many times its process was restarted: a
restarted worker process plays a new seed stream).

Worker ``i`` and the engine process its env spawns (which inherits the
spawning thread's affinity) share core ``i mod cores`` (``pin_threads``): the
worker blocks while the engine renders, so the core never idles and its
caches stay warm (measured: 1 worker on 2 cores 1,040 -> 1,476 steps/s).
"""
from __future__ import annotations

import os
import threading

from a3c_core.envs import make_env
from a3c_core.train.affinity import pin_thread
from a3c_core.train.build import seed_of
from a3c_core.train.config import env_args
from a3c_core.train.watchdog import kill_engine

__all__ = ["EnvSlots"]


class EnvSlots:
    """The envs this process holds for the run's workers, one slot each.

    ``stop_event`` (the run's) stops the env starter; ``cores`` (possibly
    empty: no pinning) are the cores the workers are pinned to, worker ``i``
    to ``cores[i % len(cores)]``.
    """

    def __init__(self, cfg, run_dir, n_workers, resumes, stop_event, cores=()):
        self.cfg = cfg
        self.run_dir = run_dir
        self.resumes = resumes
        self.stop_event = stop_event
        self.cores = list(cores)
        #: times each worker's process was restarted (a new seed stream each time)
        self.generation = [0] * n_workers
        #: the thread that starts the workers' envs beside the warm-up (None: not begun)
        self.starter = None
        self.reset()

    @property
    def envs(self) -> list:
        """The envs by slot (None: not started yet, or closed)."""
        return self._envs

    def reset(self):
        """Empty slots, none claimed (what a process starts from)."""
        self._envs = [None] * (len(self.generation) * self.cfg.envs_per_worker)
        self._lock = threading.Lock()
        self._claimed = [False] * len(self._envs)
        self._ready = [threading.Event() for _ in self._envs]
        self._error = [None] * len(self._envs)

    def seed(self, wid, j=0):
        """The seed of env ``j`` of worker ``wid`` (``j`` > 0 with
        envs_per_worker > 1); a restarted worker process's envs get a new
        seed stream."""
        gen = self.generation[wid]
        if gen:
            return seed_of(self.cfg.seed, wid, self.resumes, j, gen)
        if j:
            return seed_of(self.cfg.seed, wid, self.resumes, j)
        return seed_of(self.cfg.seed, wid, self.resumes)

    def next_generation(self, wid) -> int:
        """Worker ``wid``'s process is restarted: its next seed stream (returned)."""
        self.generation[wid] += 1
        return self.generation[wid]

    def pin_worker(self, wid):
        """Pin the calling thread (or process) to worker ``wid``'s core."""
        if self.cores:
            pin_thread({self.cores[wid % len(self.cores)]})

    def _new(self, e, pin=False):
        """A new env ``e``.  ``pin`` (a thread other than its worker's): pinned
        to the worker's core meanwhile, so that the engine process, which
        inherits the spawning thread's affinity, shares it."""
        cfg = self.cfg
        wid, j = divmod(e, cfg.envs_per_worker)
        if pin and self.cores:
            mask = set(self.cores)
            pin_thread({self.cores[wid % len(self.cores)]})
        try:
            return make_env(cfg.env, seed=self.seed(wid, j),
                            runtime_dir=os.path.join(self.run_dir, "vizdoom"), **env_args(cfg))
        finally:
            if pin and self.cores:
                pin_thread(mask)

    def get(self, e, pin=False):
        """Env ``e``, started here unless another thread claimed it first
        (then this waits for that start, and raises its error)."""
        with self._lock:
            mine = not self._claimed[e]
            self._claimed[e] = True
        if mine:
            try:
                self._envs[e] = self._new(e, pin)
            except BaseException as exc:
                self._error[e] = exc
                raise
            finally:
                self._ready[e].set()
            return self._envs[e]
        self._ready[e].wait()
        if self._envs[e] is None:
            wid, j = divmod(e, self.cfg.envs_per_worker)
            exc = self._error[e]
            what = f"{type(exc).__name__}: {exc}" if exc is not None else "closed before use"
            raise RuntimeError(f"env {j} of worker {wid} ({self.cfg.env}) did not start: {what}") from exc
        return self._envs[e]

    def worker_envs(self, wid) -> list:
        """Worker ``wid``'s envs, in order (each started here unless claimed)."""
        K = self.cfg.envs_per_worker
        return [self.get(e) for e in range(wid * K, (wid + 1) * K)]

    def start_all(self):
        """Start the workers' envs, in order (each ViZDoom start holds a
        module lock, so they start one at a time).  Stops at the first
        failure (the worker that needs that env raises it) or once the run
        stops."""
        for e in range(len(self._envs)):
            if self.stop_event.is_set():
                return
            try:
                self.get(e, pin=True)
            except BaseException:  # noqa: BLE001 - raised again by the worker that needs it
                return

    def start_beside(self):
        """Begin :meth:`start_all` on a thread (when there is more than one
        env): begun before the warm-up, the starts no longer hold back the
        workers that start after it."""
        if len(self._envs) > 1:
            self.starter = threading.Thread(target=self.start_all, daemon=True,
                                            name="a3c-env-starter")
            self.starter.start()

    def stop_starter(self, timeout=60):
        """Stop the env starter (it sets the run's stop event) and wait for it:
        no env starts after this."""
        if self.starter is not None:
            self.stop_event.set()
            self.starter.join(timeout)

    def remake(self, e):
        """A new env ``e`` (the same id, options and seed) in place of one
        that failed: built by the calling thread (its worker's, pinned to
        the worker's core), kept where :meth:`close` finds it."""
        env = self._new(e)
        self._envs[e] = env
        return env

    def close(self, stuck=()):
        """Close every env held; returns the first error an env raised
        closing (the rest are still closed), or None.  The envs of the
        workers in ``stuck`` (threads that did not stop) are not closed
        under them: their engines are killed and the rest is left to the
        process's exit."""
        first_error = None
        K = self.cfg.envs_per_worker
        stuck = set(stuck or ())
        for i, env in enumerate(self._envs):
            if env is not None:
                if i // K in stuck:
                    kill_engine(env)
                    continue
                try:
                    env.close()
                except Exception as e:  # noqa: BLE001 - keep closing the rest
                    first_error = first_error or e
                self._envs[i] = None
        return first_error
