"""Worker processes (``worker_processes = true``): Hogwild across processes.

Why: worker threads share one GIL.  On a 16-core Xeon with doom:basic, 16
worker threads ran 7.6k-9.3k agent steps/s and 16 worker *processes* that
share the same parameters 12.2k-16.1k (1.6-1.7x; at 8 workers 1.0-1.26x):
past ~8 workers the threads queue for the GIL (bench/RESULTS.md, session
of 2026-11-27, ``bench/standin_scaling.py --mode``).

How: after the warm-up (the compiled kernels are inherited), the trainer
moves every array the workers write into one ``MAP_SHARED`` anonymous
mapping (:class:`SharedBlock`): the parameters, the optimizer's statistic
arrays, the reward and advantage normalizers' statistics, one row of loss
sums per worker and a few int64 counters.  It then forks one process per
worker.  Each process starts its own envs (pinned to its core, as a worker
thread is), runs the same :class:`~a3c_core.train.worker.Worker` and applies
its updates to the shared arrays in place, lock-free, as threads do
(:class:`ProcStore`).  What threads get from the GIL or a small lock is a
process-shared lock here: the counters, the optimizer's step (Adam's bias
correction counts every process's applies) and the normalizers' merges
(``rollout_targets`` holds it).  Finished episodes travel to the trainer
over one pipe per worker, with the global step and the time they ended;
the trainer counts and logs them as they arrive, so a checkpoint never
counts an episode whose row is not written.
Checkpoints, logs and the stop conditions run in the trainer process,
unchanged, on the shared arrays.

Failures: a worker's exception reaches the trainer with its traceback (the
run fails naming the worker, as with threads); a process that dies without
one (killed) fails the run with its exit status, and a lock it held is
taken back (:func:`free_lock`) so that the others stop at once.  Children
ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
group; the trainer, which gets it too, stops them and checkpoints) and die
with the trainer (``PR_SET_PDEATHSIG``).

Adam's ``clip_relative`` keeps its running sum of v in the block too (each
apply adds its own term to what the others left, under the lock), and so
does the entropy controller its multiplier.  Not with ``--ray`` (its nodes
are already processes).  Linux only (fork).
"""
from __future__ import annotations

import ctypes
import mmap
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
import traceback

import numpy as np

from a3c_core.envs.proc import _describe_exit
from a3c_core.train.trainer import Trainer
from a3c_core.train.worker import LossStats, ThreadStore

__all__ = ["ProcessTrainer", "ProcStore", "SharedBlock"]

# the int64 counters of SharedBlock "scalars"
S_STEPS, S_UPDATES, S_SKIPPED, S_CONSEC, S_OPT_STEP, S_VSUM_STEP, S_CLIPS, S_CHECKS = range(8)
N_SCALARS = 8
# its float64 "floats": Adam's running sum(v) (clip_relative), the entropy
# controller's log multiplier and coefficient
F_VSUM, F_LOG_MULT, F_BETA = range(3)
N_FLOATS = 4

#: seconds a stopping worker process may take (its rollout, closing its envs)
#: before it is killed
STOP_TIMEOUT = 60.0


class SharedBlock:
    """Arrays in one ``MAP_SHARED`` anonymous mapping: a forked child and its
    parent see each other's writes.  ``specs``: ``[(name, shape, dtype)]``;
    each array starts on a 64-byte boundary; ``self[name]`` is its view."""

    def __init__(self, specs):
        offsets, total = [], 0
        for _, shape, dtype in specs:
            offsets.append(total)
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            total += (nbytes + 63) // 64 * 64
        self._mm = mmap.mmap(-1, max(total, 64), flags=mmap.MAP_SHARED)
        self._views = {}
        for (name, shape, dtype), off in zip(specs, offsets):
            count = int(np.prod(shape, dtype=np.int64))
            self._views[name] = np.frombuffer(self._mm, dtype, count, off).reshape(shape)
        self.nbytes = total

    def __getitem__(self, name):
        return self._views[name]

    def move(self, owner, attr, name):
        """Copy ``owner.attr`` into view ``name`` and make the view the attribute."""
        view = self._views[name]
        view[...] = getattr(owner, attr)
        setattr(owner, attr, view)


class ProcStore(ThreadStore):
    """A worker process's side of the shared state: the same
    :class:`~a3c_core.train.worker.ThreadStore` on shared arrays, with the
    counters, the optimizer's step and running sum of v, the entropy
    controller and the normalizers' merges under the process-shared
    ``lock``, and finished episodes sent over ``conn``."""

    syncs_on_apply = True

    def __init__(self, shared, normalizer, adv_normalizer, scalars, lock, conn,
                 entropy_ctl=None, floats=None):
        super().__init__(shared, normalizer, None, adv_normalizer, entropy_ctl)
        self.scalars = scalars
        self.floats = np.zeros(N_FLOATS) if floats is None else floats
        self.plock = lock
        #: held by the worker around its one-call targets (the normalizers' merges)
        self.targets_lock = lock
        self.conn = conn

    @property
    def steps(self) -> int:
        return int(self.scalars[S_STEPS])

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        sh, s, f = self.shared, self.scalars, self.floats
        opt = sh.optimizer
        stepped = hasattr(opt, "step")
        relative = getattr(opt, "clip_relative", 0.0) > 0
        with self.plock:
            sh.steps = int(s[S_STEPS])          # the learning-rate anneal's global step
            if stepped:                          # this apply is the optimizer's step + 1
                opt.step = int(s[S_OPT_STEP])
                s[S_OPT_STEP] += 1
            if relative:                         # Adam's running sum(v), as all applies left it
                v0, vs0 = opt._v_sum, opt._v_sum_step = (
                    float(f[F_VSUM]), None if s[S_VSUM_STEP] < 0 else int(s[S_VSUM_STEP]))
                c0, k0 = opt.relative_clips, opt.relative_checks
        norm, applied = sh.apply(grads, max_grad_norm, offset=offset, sync_to=local)
        with self.plock:
            if applied:
                s[S_UPDATES] += 1
                s[S_CONSEC] = 0
            else:
                s[S_SKIPPED] += 1
                s[S_CONSEC] += 1
                if stepped:                      # nothing applied: the step is given back
                    s[S_OPT_STEP] -= 1
            if relative:
                s[S_CLIPS] += opt.relative_clips - c0
                s[S_CHECKS] += opt.relative_checks - k0
                self._merge_v_sum(opt, v0, vs0, applied)
        return norm, applied

    def _merge_v_sum(self, opt, v0, vs0, applied):
        """Adam's running sum(v) after this apply, into the shared one (lock
        held): its own term on top of what the other processes' applies
        made of it meanwhile, or the exact sum its clip_scale took."""
        s, f = self.scalars, self.floats
        if opt._v_sum_step is None:
            s[S_VSUM_STEP] = -1                  # unknown: the next clip_scale sums v again
        elif opt._v_sum_step != vs0:             # summed exactly during this apply
            f[F_VSUM], s[S_VSUM_STEP] = opt._v_sum, opt._v_sum_step
        elif applied:                            # v_new = b2 v + (1 - b2) d^2, summed
            f[F_VSUM] = opt.beta2 * f[F_VSUM] + (opt._v_sum - opt.beta2 * v0)

    def entropy_beta(self, entropy_sum=0.0, n=0):
        ctl, f = self.entropy_ctl, self.floats
        with self.plock:
            ctl.log_mult, ctl.beta_now = float(f[F_LOG_MULT]), float(f[F_BETA])
            beta = ctl.update(entropy_sum, n)
            f[F_LOG_MULT], f[F_BETA] = ctl.log_mult, ctl.beta_now
        return beta

    def add_steps(self, n):
        with self.plock:
            self.scalars[S_STEPS] += int(n)
            return int(self.scalars[S_STEPS])

    def record_episode(self, wid, raw_return, length):
        # with the global step and the time it ended (the trainer logs it later)
        self.conn.send(("episode", wid, float(raw_return), int(length),
                        int(self.scalars[S_STEPS]), time.perf_counter()))

    def reward_scale(self, returns):
        with self.plock:
            return super().reward_scale(returns)

    def advantage_scale(self, advantages):
        with self.plock:
            return super().advantage_scale(advantages)


def free_lock(lock, wait=1.0):
    """After a worker died: ``lock`` is held only for µs at a time, so if it
    stays held ``wait`` s the dead worker held it; release it for the others
    (a multiprocessing lock may be released by any process)."""
    if lock.acquire(timeout=wait):
        lock.release()
        return False
    lock.release()
    return True


def _die_with_parent():
    """SIGKILL this process when the process that forked it exits (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProcessTrainer(Trainer):
    """:class:`~a3c_core.train.trainer.Trainer` whose workers are processes
    (see the module docstring); everything else is the trainer's."""

    def __init__(self, cfg, *, resume=None, out=None):
        if not sys.platform.startswith("linux"):
            from a3c_core.train.config import ConfigError
            raise ConfigError("config field 'worker_processes' = True: needs Linux (fork)")
        self._procs = []
        self._conns = {}          # read end -> worker id
        self._block = None
        self._reported = set()    # worker ids whose failure is in self.errors
        super().__init__(cfg, resume=resume, out=out)
        # env 0 was started here (the env id checked, the frame statistics
        # measured); each worker process starts its own envs
        self._close_envs()
        self._env_claimed = [False] * len(self._envs)
        self._env_ready = [type(ev)() for ev in self._env_ready]

    def _close_envs(self):
        for i, env in enumerate(self._envs):
            if env is not None:
                self._envs[i] = None
                env.close()

    # -- the shared block ---------------------------------------------------
    def _share(self):
        sh, opt = self.shared, self.shared.optimizer
        n = sh.n_params
        specs = [("scalars", (N_SCALARS,), np.int64), ("floats", (N_FLOATS,), np.float64),
                 ("losses", (self.n_workers, len(LossStats.FIELDS)), np.float64),
                 ("merging", (self.n_workers,), np.int64),     # -1: not updating yet
                 ("params", (n,), sh.params.dtype)]
        specs += [("opt." + a, (n,), getattr(opt, a).dtype) for a in opt._arrays]
        norms = [(k, m) for k, m in (("rn", self.normalizer), ("an", self.adv_normalizer))
                 if m is not None]
        specs += [(k + ".stats", m.stats.shape, m.stats.dtype) for k, m in norms]
        b = self._block = SharedBlock(specs)
        b.move(sh, "params", "params")
        for a in opt._arrays:
            b.move(opt, a, "opt." + a)
        for k, m in norms:
            b.move(m, "stats", k + ".stats")
        b["merging"][:] = -1
        s = b["scalars"]
        s[S_STEPS], s[S_UPDATES], s[S_SKIPPED] = sh.steps, sh.updates, sh.skipped_updates
        s[S_OPT_STEP] = int(getattr(opt, "step", 0))
        f = b["floats"]
        if getattr(opt, "clip_relative", 0.0) > 0:
            f[F_VSUM] = opt._v_sum
            s[S_VSUM_STEP] = -1 if opt._v_sum_step is None else opt._v_sum_step
            s[S_CLIPS], s[S_CHECKS] = opt.relative_clip_counts()
        if self.entropy_ctl is not None:
            f[F_LOG_MULT], f[F_BETA] = self.entropy_ctl.log_mult, self.entropy_ctl.beta_now

    def _mirror(self):
        """The trainer's own counters from the shared ones (its monitor,
        logs and checkpoints read these)."""
        if self._block is None:
            return
        s, sh = self._block["scalars"], self.shared
        sh.steps, sh.updates, sh.skipped_updates = int(s[S_STEPS]), int(s[S_UPDATES]), int(s[S_SKIPPED])
        opt, f = sh.optimizer, self._block["floats"]
        if hasattr(opt, "step"):
            opt.step = int(s[S_OPT_STEP])
        if getattr(opt, "clip_relative", 0.0) > 0:
            with opt._lock:
                opt.relative_clips, opt.relative_checks = int(s[S_CLIPS]), int(s[S_CHECKS])
        if self.entropy_ctl is not None:
            self.entropy_ctl.log_mult, self.entropy_ctl.beta_now = float(f[F_LOG_MULT]), float(f[F_BETA])
        self.store.consecutive_skips = int(s[S_CONSEC])

    # -- backend hooks ----------------------------------------------------------
    def _start_workers(self):
        self._warm_up()
        self._share()
        ctx = mp.get_context("fork")
        self._lock, self._pstop = ctx.Lock(), ctx.Event()
        if self.logger is not None:
            self.logger.flush()     # no buffered row is copied into the children
        self.t_start = time.perf_counter()
        for wid in range(self.n_workers):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(target=self._child_main, args=(wid, w), daemon=True,
                            name=f"a3c-worker-{wid}")
            p.start()
            w.close()
            self._conns[r] = wid
            self._procs.append(p)
        return self._procs

    def _child_main(self, wid, conn):
        # a terminal's Ctrl-C or a SIGTERM to the whole group: the trainer,
        # which gets it too, stops the workers and checkpoints
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _die_with_parent()
        for r in self._conns:                  # the earlier workers' pipes: not ours
            r.close()
        try:
            if self._cores:
                os.sched_setaffinity(0, {self._cores[wid % len(self._cores)]})
            self.store = ProcStore(self.shared, self.normalizer, self.adv_normalizer,
                                   self._block["scalars"], self._lock, conn, self.entropy_ctl,
                                   self._block["floats"])
            w = self._make_worker(wid)
            rows, merging = self._block["losses"], self._block["merging"]
            stop, total = self._pstop, self.cfg.total_steps
            while not stop.is_set():
                if total and self.store.steps >= total:
                    break
                w.rollout()
                rows[wid] = w.stats.as_array()
                merging[wid] = w.merging
            conn.send(("done", wid))
        except BaseException:  # noqa: BLE001 - reported to the trainer
            conn.send(("error", wid, traceback.format_exc()))
            raise SystemExit(1) from None
        finally:
            self._close_envs()

    def _drain(self, timeout=0.0):
        """Take in what the workers sent: episodes (counted and logged here),
        failures, their last words."""
        if not self._conns:
            return
        episodes = []
        for r in mpc.wait(list(self._conns), timeout):
            wid = self._conns[r]
            try:
                while r.poll():
                    msg = r.recv()
                    if msg[0] == "episode":
                        episodes.append(msg)
                    elif msg[0] == "error":
                        self._reported.add(wid)
                        self.errors.append((wid, msg[2]))
                        self.stop_event.set()
            except (EOFError, OSError):
                del self._conns[r]
                r.close()
        episodes.sort(key=lambda m: m[5])       # the workers' episodes in the order they ended
        for _, wid, ret, length, step, t in episodes:
            self._ended = step, t
            self.store.record_episode(wid, ret, length)

    _ended = None     # (global step, perf_counter) of the episode being recorded

    def _on_episode(self, wid, ret, length, index):
        """The trainer's episode row, with the step and time the worker sent."""
        step, t = self._ended
        self._log_episode(wid, ret, length, index, step, self.wall_offset + t - self.t_start)

    def _before_tick(self):
        self._drain()
        self._mirror()

    def _workers_running(self, procs) -> bool:
        if self.stop_event.is_set():
            self._pstop.set()
        alive = False
        for wid, p in enumerate(procs):
            if p.is_alive():
                alive = True
            elif p.exitcode and wid not in self._reported:
                self._drain()                     # its last words, if it had any
                if wid not in self._reported:
                    self._reported.add(wid)
                    self.errors.append((wid, f"worker process {wid} (pid {p.pid}) died: "
                                             f"{_describe_exit(p.exitcode)}"))
                    self.stop_event.set()
                    self._pstop.set()
                    free_lock(self._lock)     # the others can then stop at once
        return alive

    def _stop_workers(self, procs):
        procs = procs or self._procs     # (a signal while they were being started)
        if not procs:
            return
        self._pstop.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            try:
                self._drain(0.05)       # (a worker blocked on a full pipe gets to exit)
                for p in procs:
                    p.join(0.05)
            except KeyboardInterrupt:   # a second Ctrl-C: keep waiting, data first
                pass
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        self._drain()
        self._workers_running(procs)    # one that died without a word
        self._mirror()

    def live_steps(self) -> int:
        return int(self._block["scalars"][S_STEPS]) if self._block is not None else 0

    def worker_updates(self) -> list:
        if self._block is None:
            return [0] * self.n_workers
        rows = self._block["losses"]
        return [int(u + k) for u, k in zip(rows[:, 4], rows[:, 5])]

    def _merging_workers(self):
        if self._block is None:
            return None
        m = self._block["merging"]
        return int((m > 0).sum()) if (m >= 0).any() else None

    def _loss_totals(self):
        if self._block is None:
            return np.zeros(len(LossStats.FIELDS))
        return self._block["losses"].sum(axis=0)

    def _consecutive_skips(self) -> int:
        if self._block is None:
            return 0
        return int(self._block["scalars"][S_CONSEC])

    def close(self):
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()
        for r in list(self._conns):
            r.close()
        self._conns.clear()
        super().close()
