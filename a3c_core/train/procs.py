"""Worker processes (``worker_processes = true``): Hogwild across processes.

Why: worker threads share one GIL.  On a 16-core Xeon with doom:basic
(``a3c bench``'s end-to-end rows), 16 worker threads ran 6,674 agent
steps/s and 16 worker *processes* sharing the same parameters 10,924; at 8
workers 5,228 against 6,151 (docs/results.md).  The trainer therefore uses
processes by default on Linux from 8 workers, or with one worker per core
(:func:`~a3c_core.train.config.backend_choice`).

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
run fails naming the worker, as with threads).  A process that dies without
one (SIGKILL, the OOM killer) is restarted, up to ``worker_restarts`` (3)
times per run: a lock it held is taken back (:func:`free_lock`), the engines
and env processes it started are killed (their guards would kill them too)
and its ViZDoom runtime dirs removed, the shared parameters and optimizer
statistics are checked to be finite (a process killed mid-apply leaves a
partly applied update, which Hogwild tolerates), and worker ``i`` is forked again from the trainer: the same
index and core, new envs on a new seed stream (the seed mixed with its
restart count), its update counters continued.  Each restart is a
``warning:`` line, an errors.log entry, the ``charts/worker_restarts``
scalar and ``summary.json`` ``worker_restarts``.  Past the limit (or with
non-finite parameters) the death fails the run with its exit status, and a
lock it held is taken back so that the others stop at once.  Children
ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
group; the trainer, which gets it too, stops them and checkpoints) and die
with the trainer (``PR_SET_PDEATHSIG``).

Not with ``--ray`` (its nodes are already processes).  Linux only (fork).
"""
from __future__ import annotations

import ctypes
import mmap
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import time
import traceback

import numpy as np

from a3c_core._fpenv import flush_denormals
from a3c_core.envs.proc import describe_exit
from a3c_core.train.backends import Backend, step_watchdog
from a3c_core.train.config import ConfigError
from a3c_core.train.store import LossStats, ThreadStore
from a3c_core.train.worker import RolloutAborted

__all__ = ["ProcessBackend", "ProcStore", "SharedBlock"]

# the int64 counters of SharedBlock "scalars"
S_STEPS, S_UPDATES, S_SKIPPED, S_CONSEC, S_OPT_STEP = range(5)
N_SCALARS = 5

#: seconds a stopping worker process may take (its rollout, closing its envs)
#: before it is killed (its engines and env processes die with it: their
#: guards watch it).  A process stuck in an env call would otherwise hold
#: the run past its signal.
STOP_TIMEOUT = 5.0


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
    counters, the optimizer's step and the normalizers' merges under the
    process-shared ``lock``, and finished episodes sent over ``conn``."""

    syncs_on_apply = True

    def __init__(self, shared, normalizer, adv_normalizer, scalars, lock, conn):
        super().__init__(shared, normalizer, None, adv_normalizer)
        self.scalars = scalars
        self.plock = lock
        #: held by the worker around its one-call targets (the normalizers' merges)
        self.targets_lock = lock
        self.conn = conn

    @property
    def steps(self) -> int:
        return int(self.scalars[S_STEPS])

    def apply(self, grads, max_grad_norm, offset=0, local=None):
        sh, s = self.shared, self.scalars
        opt = sh.optimizer
        stepped = hasattr(opt, "step")
        with self.plock:
            sh.steps = int(s[S_STEPS])          # the learning-rate anneal's global step
            if stepped:                          # this apply is the optimizer's step + 1
                opt.step = int(s[S_OPT_STEP])
                s[S_OPT_STEP] += 1
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
        return norm, applied

    def add_steps(self, n):
        with self.plock:
            self.scalars[S_STEPS] += int(n)
            return int(self.scalars[S_STEPS])

    def record_episode(self, wid, raw_return, length, end=None):
        # with the global step and the time it ended (the trainer logs it later)
        self.conn.send(("episode", wid, float(raw_return), int(length),
                        int(self.scalars[S_STEPS]), time.perf_counter(), end))

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


def _proc_start_time(pid):
    """``pid``'s start time (clock ticks since boot, /proc/PID/stat field
    22), or None if it is gone or a zombie: with the pid, it names one
    process (a recycled pid has another start time)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _own_children():
    """``[(pid, start time)]`` of this process's live child processes (a
    ViZDoom engine under its guard, an env process), read from /proc."""
    me, out = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X"):
            out.append((int(d), int(fields[19])))
    return out


def kill_left_behind(procs, wait=2.0) -> int:
    """After a worker process died: its engines and env processes
    (``[(pid, start time)]``, as its :func:`_own_children` reported them)
    are killed by their own guards; those still there after ``wait``
    seconds are killed here.  Returns how many had to be killed."""
    deadline = time.monotonic() + wait
    left = [(pid, st) for pid, st in procs if _proc_start_time(pid) == st]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [(pid, st) for pid, st in left if _proc_start_time(pid) == st]
    killed = 0
    for pid, st in left:
        if _proc_start_time(pid) == st:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _die_with_parent():
    """SIGKILL this process when the process that forked it exits (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProcessBackend(Backend):
    """Workers as forked processes on one shared block (see the module docstring)."""

    name = "worker processes"
    _ended = None     # (global step, perf_counter) of the episode being recorded

    def __init__(self, why: str = ""):
        if not sys.platform.startswith("linux"):
            raise ConfigError("config field 'worker_processes' = True: needs Linux (fork)")
        super().__init__(why)
        self._procs = []
        self._conns = {}          # read end -> worker id
        self._block = None
        self._reported = set()    # worker ids whose failure is in the trainer's errors
        self._lock = self._pstop = self._mpctx = None
        self._engines = {}        # worker id -> [(pid, start time)] of its engines, env processes
        self.restarts = 0         # worker processes restarted in this run

    def prepare(self):
        # env 0 was started by the trainer (the env id checked, the frame
        # statistics measured); each worker process starts its own envs
        slots = self.ctx.env_slots
        slots.close()
        slots.reset()

    # -- the shared block ---------------------------------------------------
    def _share(self):
        ctx = self.ctx
        sh, opt = ctx.shared, ctx.shared.optimizer
        n = sh.n_params
        specs = [("scalars", (N_SCALARS,), np.int64),
                 ("losses", (ctx.n_workers, len(LossStats.FIELDS)), np.float64),
                 ("merging", (ctx.n_workers,), np.int64),     # -1: not updating yet
                 ("params", (n,), sh.params.dtype)]
        specs += [("opt." + a, (n,), getattr(opt, a).dtype) for a in opt.array_names]
        norms = [(k, m) for k, m in (("rn", ctx.parts.normalizer),
                                     ("an", ctx.parts.adv_normalizer)) if m is not None]
        specs += [(k + ".stats", m.stats.shape, m.stats.dtype) for k, m in norms]
        b = self._block = SharedBlock(specs)
        b.move(sh, "params", "params")
        for a in opt.array_names:
            b.move(opt, a, "opt." + a)
        for k, m in norms:
            b.move(m, "stats", k + ".stats")
        b["merging"][:] = -1
        s = b["scalars"]
        s[S_STEPS], s[S_UPDATES], s[S_SKIPPED] = sh.steps, sh.updates, sh.skipped_updates
        s[S_OPT_STEP] = int(getattr(opt, "step", 0))

    def _mirror(self):
        """The trainer's own counters from the shared ones (its monitor,
        logs and checkpoints read these)."""
        if self._block is None:
            return
        s, sh = self._block["scalars"], self.ctx.shared
        sh.steps, sh.updates, sh.skipped_updates = int(s[S_STEPS]), int(s[S_UPDATES]), int(s[S_SKIPPED])
        opt = sh.optimizer
        if hasattr(opt, "step"):
            opt.step = int(s[S_OPT_STEP])
        self.ctx.store.consecutive_skips = int(s[S_CONSEC])

    # -- the backend's hooks ------------------------------------------------------
    def start(self):
        self.ctx.warm_up()
        self._share()
        mpctx = self._mpctx = mp.get_context("fork")
        self._lock, self._pstop = mpctx.Lock(), mpctx.Event()
        self.ctx.clock.start()
        for wid in range(self.ctx.n_workers):
            self._procs.append(self._fork(wid))
        return self._procs

    def _fork(self, wid, restart=0):
        """Fork worker ``wid``'s process (``restart``: how many times it was
        restarted so far, 0 at the start)."""
        report = self.ctx.report
        if report.logger is not None:
            report.logger.flush()     # no buffered row is copied into the children
        for out in (report.out, sys.stdout, sys.stderr):     # nor buffered output
            try:
                out.flush()
            except (AttributeError, OSError, ValueError):
                pass
        r, w = self._mpctx.Pipe(duplex=False)
        p = self._mpctx.Process(target=self._child_main, args=(wid, w, restart), daemon=True,
                              name=f"a3c-worker-{wid}")
        p.start()
        w.close()
        self._conns[r] = wid
        return p

    def _left_behind(self):
        """(In a worker process) what its death would leave behind:
        ``([(pid, start time)] of its engines and env processes, [the
        runtime dirs of its ViZDoom envs]])``."""
        dirs = [d for d in (getattr(e, "work_dir", None) for e in self.ctx.env_slots.envs) if d]
        return _own_children(), dirs

    def _clean_up_after(self, wid) -> int:
        """Worker ``wid``'s process died: kill its engines and env processes
        still there (:func:`kill_left_behind`) and remove its envs' runtime
        dirs; returns how many processes had to be killed."""
        procs, dirs = self._engines.pop(wid, ([], []))
        killed = kill_left_behind(procs)
        if dirs:
            from a3c_core.envs import remove_runtime_dir

            runtime = os.path.join(self.ctx.run_dir, "vizdoom")
            for d in dirs:
                remove_runtime_dir(d, runtime)
        return killed

    def worker_pids(self) -> list:
        """The pids of the worker processes (the current ones, after restarts)."""
        return [p.pid for p in self._procs]

    def _child_main(self, wid, conn, restart=0):
        # a terminal's Ctrl-C or a SIGTERM to the whole group: the trainer,
        # which gets it too, stops the workers and checkpoints
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _die_with_parent()
        ctx = self.ctx
        for r in self._conns:                  # the earlier workers' pipes: not ours
            r.close()
        watchdog = None
        try:
            ctx.env_slots.pin_worker(wid)
            store = ProcStore(ctx.shared, ctx.parts.normalizer, ctx.parts.adv_normalizer,
                              self._block["scalars"], self._lock, conn)

            def restarted(wid, k, summary, text, count, limit):
                # the trainer writes errors.log and the warning line
                conn.send(("restart", wid, k, summary, text, count, limit))
                conn.send(("engines", wid) + self._left_behind())     # the new engine's

            w = ctx.make_worker(wid, store, on_env_restart=restarted)
            conn.send(("engines", wid) + self._left_behind())   # cleaned up if this process dies
            rows, merging = self._block["losses"], self._block["merging"]
            if restart:     # a restarted worker's counters go on from its predecessor's
                for f, v in zip(LossStats.FIELDS, rows[wid]):
                    setattr(w.stats, f, float(v))
            stop, total = self._pstop, ctx.cfg.total_steps
            w.stopping = stop
            watchdog = step_watchdog(ctx.cfg.env_step_timeout, lambda: [w])     # its one worker
            with flush_denormals():         # as Worker.run does (a3c_core._fpenv)
                while not stop.is_set():
                    if total and store.steps >= total:
                        break
                    try:
                        w.rollout()
                    except RolloutAborted:      # stopping while an env failed
                        break
                    rows[wid] = w.stats.as_array()
                    merging[wid] = w.merging
            rows[wid] = w.stats.as_array()
            conn.send(("done", wid))
        except BaseException:  # noqa: BLE001 - reported to the trainer
            conn.send(("error", wid, traceback.format_exc()))
            raise SystemExit(1) from None
        finally:
            if watchdog is not None:
                watchdog.stop()
            ctx.env_slots.close()

    def _drain(self, timeout=0.0):
        """Take in what the workers sent: episodes (counted and logged here),
        failures, their last words."""
        if not self._conns:
            return
        ctx = self.ctx
        episodes = []
        for r in mpc.wait(list(self._conns), timeout):
            wid = self._conns[r]
            try:
                while r.poll():
                    msg = r.recv()
                    if msg[0] == "episode":
                        episodes.append(msg)
                    elif msg[0] == "restart":
                        ctx.report.env_restarted(*msg[1:])
                    elif msg[0] == "engines":
                        self._engines[wid] = msg[2:]
                    elif msg[0] == "error":
                        self._reported.add(wid)
                        ctx.report.errors.append((wid, msg[2]))
                        ctx.stop_event.set()
            except (EOFError, OSError, ValueError, pickle.UnpicklingError):
                # EOF: the worker ended; anything else: a message cut short by its death
                del self._conns[r]
                r.close()
        episodes.sort(key=lambda m: m[5])       # the workers' episodes in the order they ended
        for _, wid, ret, length, step, when, end in episodes:
            self._ended = step, when
            ctx.store.record_episode(wid, ret, length, end=end)

    def episode_stamp(self):
        """The step and time the worker sent with the episode being recorded."""
        step, when = self._ended
        return step, self.ctx.clock.at(when)

    def before_tick(self):
        self._drain()
        self._mirror()

    def running(self, procs) -> bool:
        stop_event = self.ctx.stop_event
        if stop_event.is_set():
            self._pstop.set()
        alive = False
        for wid, p in enumerate(procs):
            if p.is_alive():
                alive = True
            elif p.exitcode and wid not in self._reported:
                self._drain()                     # its last words, if it had any
                if wid not in self._reported:
                    if self._restart(procs, wid, p):
                        alive = True
                        continue
                    self._reported.add(wid)
                    stop_event.set()
                    self._pstop.set()
                    free_lock(self._lock)     # the others can then stop at once
        # once the run stops, stop() takes over (bounded: a worker process
        # stuck in an env call is killed after STOP_TIMEOUT)
        return alive and not stop_event.is_set()

    def _shared_finite(self) -> bool:
        """The shared parameters, optimizer statistics and normalizer
        statistics hold no NaN or inf."""
        b = self._block
        names = [n for n in b._views if n == "params" or n.startswith("opt.")
                 or n.endswith(".stats")]
        for n in names:
            a = b[n]
            if a.dtype.kind == "f":
                for lo in range(0, a.size, 1 << 20):       # no full-size temporary
                    if not np.isfinite(a.reshape(-1)[lo:lo + (1 << 20)]).all():
                        return False
        return True

    def _restart(self, procs, wid, p) -> bool:
        """Worker ``wid``'s process ``p`` died without a word: fork it again
        (True), or put its death in the trainer's errors (False: the
        restarts are used up, the run is stopping, or the shared state is
        no longer finite)."""
        ctx = self.ctx
        errors = ctx.report.errors
        how = describe_exit(p.exitcode)
        died = f"worker process {wid} (pid {p.pid}) died: {how}"
        limit = int(getattr(ctx.cfg, "worker_restarts", 0))
        # its engines and env processes: gone with it (their guards), or killed here
        reaped = self._clean_up_after(wid)
        if ctx.stop_event.is_set() or self._pstop.is_set():
            errors.append((wid, died))
            return False
        if self.restarts >= limit:
            if limit:
                died += (f"; not restarted: the run's {limit} worker restart"
                         f"{'s' * (limit > 1)} are used up (--worker-restarts)")
            errors.append((wid, died))
            return False
        free_lock(self._lock)     # it may have died holding it
        if not self._shared_finite():
            errors.append((wid, died + "; not restarted: the shared parameters or "
                                       "optimizer statistics are no longer finite (NaN/inf)"))
            return False
        self.restarts += 1
        gen = ctx.env_slots.next_generation(wid)
        procs[wid] = self._fork(wid, restart=gen)
        ctx.report.worker_restarted(wid, p.pid, how, procs[wid].pid, self.restarts, limit, reaped)
        return True

    def stop(self, procs):
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
        for wid, p in enumerate(procs):
            if p.is_alive():
                print(f"worker process {wid} (pid {p.pid}) did not stop within "
                      f"{STOP_TIMEOUT:g} s: killed (its engines with it)", file=sys.stderr,
                      flush=True)
                self._reported.add(wid)     # killed here: not a failure of the run
                p.kill()
                p.join()
        self._drain()
        self.running(procs)             # one that died without a word
        self._mirror()

    def live_steps(self) -> int:
        return int(self._block["scalars"][S_STEPS]) if self._block is not None else 0

    def worker_updates(self) -> list:
        if self._block is None:
            return [0] * self.ctx.n_workers
        rows = self._block["losses"]
        return [int(u + k) for u, k in zip(rows[:, 4], rows[:, 5])]

    def merging_workers(self):
        if self._block is None:
            return None
        m = self._block["merging"]
        return int((m > 0).sum()) if (m >= 0).any() else None

    def loss_totals(self):
        if self._block is None:
            return np.zeros(len(LossStats.FIELDS))
        return self._block["losses"].sum(axis=0)

    def consecutive_skips(self) -> int:
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
