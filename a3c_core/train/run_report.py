"""What a run tells as it goes: :class:`RunReport`, with its clock
(:class:`RunClock`) and reward averages (:class:`RewardWindows`).

The report owns the run's metrics logger (``metrics.csv``, ``episodes.csv``,
TensorBoard), its console lines (the progress line, the ``warning:`` lines
of env and worker restarts, the end's unwritten-rows line), its error list
and ``errors.log``, and ``summary.json``.

Reward averages: avg100 (the last
:data:`~a3c_core.train.config.REWARD_WINDOW` episodes) drives the progress
line and ``target_reward``; the long average over :data:`LONG_WINDOW_FACTOR`
times as many (1,000 episodes) is what a run reports as its result.  At hundreds of episodes per second a
100-episode average spans less than a second of training; 1,000 episodes is a
window that means something.
"""
from __future__ import annotations

import collections
import json
import math
import os
import sys
import threading
import time

import numpy as np

from a3c_core.train.config import REWARD_WINDOW
from a3c_core.train.logger import MetricsLogger

__all__ = ["LONG_WINDOW_FACTOR", "RewardWindows", "RunClock", "RunReport", "rms_diff"]

#: the long reward average covers this many times ``REWARD_WINDOW`` episodes
LONG_WINDOW_FACTOR = 10


class RunClock:
    """The run's training seconds: ``offset`` (those of the runs it resumes)
    plus the time since :meth:`start` (the workers started)."""

    def __init__(self, offset=0.0):
        self.offset = offset
        #: ``time.perf_counter()`` when the workers started (None: not yet)
        self.t_start = None

    @property
    def started(self) -> bool:
        return self.t_start is not None

    def start(self):
        self.t_start = time.perf_counter()

    def elapsed(self) -> float:
        return self.offset + (0.0 if self.t_start is None else time.perf_counter() - self.t_start)

    def at(self, when) -> float:
        """The run's seconds at ``time.perf_counter()`` value ``when`` (once started)."""
        return self.offset + when - self.t_start


class RewardWindows:
    """Raw episode returns: short and long moving averages, and how the
    episodes of the short window ended (thread-safe)."""

    def __init__(self, short, long):
        self.short = int(short)
        self._ret = collections.deque(maxlen=int(long))
        self._ends = collections.deque(maxlen=self.short)
        self._lock = threading.Lock()

    def add(self, ret, end=None):
        with self._lock:
            self._ret.append(float(ret))
            self._ends.append(end)

    def ends(self) -> dict:
        """How the short window's episodes ended (the env's
        :attr:`~a3c_core.envs.base.Env.episode_end`), most common first;
        episodes whose env does not tell are left out."""
        with self._lock:
            counts = collections.Counter(e for e in self._ends if e)
        return dict(counts.most_common())

    def __len__(self):
        return len(self._ret)

    def averages(self):
        """``(short avg or None, long avg or None, episodes in the window)``."""
        with self._lock:
            if not self._ret:
                return None, None, 0
            arr = np.fromiter(self._ret, np.float64, len(self._ret))
        return float(arr[-self.short:].mean()), float(arr.mean()), arr.size


def rms_diff(a, b) -> float:
    """RMS of ``a - b`` over two flat float32 arrays, in float64 (chunked, no
    full-size temporary)."""
    n = a.shape[0]
    acc = 0.0
    for lo in range(0, n, 1 << 16):
        d = a[lo:lo + (1 << 16)].astype(np.float64) - b[lo:lo + (1 << 16)]
        acc += float(np.dot(d, d))
    return math.sqrt(acc / n) if n else 0.0


def _log_entry(who, text):
    """One errors.log entry, stamped now."""
    return f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {who} ---\n{text.rstrip()}\n"


class RunReport:
    """The run's logs, console lines and errors.

    ``parts``: the run's :class:`~a3c_core.train.build.RunParts` (the shared
    state and normalizers the scalars read); ``clock``: the run's
    :class:`RunClock`; ``stamp()``: ``(global step, wall seconds)`` of the
    episode being recorded; ``live_steps()``: the agent steps so far, as the
    workers count them (the step of a restart's scalar).
    """

    def __init__(self, cfg, run_dir, out, parts, clock, *, stamp, live_steps):
        self.cfg = cfg
        self.run_dir = run_dir
        self.out = out
        self.parts = parts
        self.clock = clock
        self.stamp = stamp
        self.live_steps = live_steps
        #: (worker id or what failed, traceback text) of what failed the run
        self.errors = []
        self.rewards = RewardWindows(REWARD_WINDOW, LONG_WINDOW_FACTOR * REWARD_WINDOW)
        #: the run's MetricsLogger, from :meth:`open_logger` on (None before)
        self.logger = None
        self.env_restarts = 0       # envs rebuilt in this run so far (summary.json)
        self.worker_restarts = 0    # worker processes forked again (summary.json)
        self._restart_lock = threading.Lock()     # restarts: errors.log, the counts
        self._param_snapshot = None     # shared params at the last log (optim/param_change_*)
        self._param_snapshot_updates = 0

    # -- the logger ------------------------------------------------------------
    def open_logger(self, resume_at=None):
        self.logger = MetricsLogger(self.run_dir, tensorboard=self.cfg.tensorboard,
                                    resume_at=resume_at)

    def close_logger(self):
        """Close the logger; returns what closing it raised (or None)."""
        if self.logger is not None:
            try:
                self.logger.close()
            except Exception as e:  # noqa: BLE001 - the caller keeps closing the rest
                return e
        return None

    def on_episode(self, wid, ret, length, index, end=None):
        """Worker ``wid`` finished an episode (the ``index``-th of the run):
        its raw return, length and how it ended, stamped with ``stamp()``
        and logged (:meth:`log_episode`)."""
        step, wall = self.stamp()
        self.log_episode(wid, ret, length, index, step, wall, end)

    def log_episode(self, wid, ret, length, index, step, wall, end=None):
        self.rewards.add(ret, end)
        if self.logger is not None:
            self.logger.episode(index, wall, step, wid, ret, length, end)

    def log_scalars(self, steps, sps, d, tot=None, *, merging=None, live_optimizer=True):
        """One log's scalars: ``d`` the loss sums since the last log, ``tot``
        the run's (:class:`~a3c_core.train.store.LossStats` order);
        ``merging``: workers whose rollouts run on into the next episode
        (None: not logged); ``live_optimizer``: the shared optimizer's
        moments are the ones the workers apply (logged as ``optim/*``)."""
        el = self.clock.elapsed()
        log = self.logger
        shared, normalizer, adv = self.parts.shared, self.parts.normalizer, self.parts.adv_normalizer
        short, long_avg, _ = self.rewards.averages()
        log.scalar("charts/sps", sps, steps, el)
        log.scalar("charts/learning_rate", shared.optimizer.lr_at(steps), steps, el)
        if short is not None:
            log.scalar("charts/moving_avg_return", short, steps, el)
            log.scalar("charts/long_avg_return", long_avg, steps, el)
        if normalizer is not None:
            log.scalar("charts/reward_scale", normalizer.scale, steps, el)
        if adv is not None:
            log.scalar("charts/advantage_scale", adv.scale, steps, el)
        if merging is not None:
            log.scalar("charts/merging_workers", merging, steps, el)
        n_upd = d[4]
        if n_upd > 0:
            for i, name in enumerate(("policy_loss", "value_loss", "entropy", "grad_norm")):
                log.scalar(f"losses/{name}", d[i] / n_upd, steps, el)
        if d[5] > 0:
            log.scalar("losses/skipped_updates", d[5], steps, el)
        if d[6] > 0:
            # self-imitation: episodes replayed since the last log, and the
            # run's share of replays that beat the value somewhere (over the
            # totals: an interval can hold an update whose replay the one
            # before counted)
            log.scalar("charts/sil_replays", d[6], steps, el)
            if tot is not None:
                log.scalar("charts/sil_update_share", tot[7] / tot[6], steps, el)
        stats = getattr(shared.optimizer, "moment_stats", None)
        if stats is not None and live_optimizer and shared.updates > 0:
            den_rms, upd_rms = stats()
            log.scalar("optim/adam_denominator_rms", den_rms, steps, el)
            log.scalar("optim/adam_update_rms", upd_rms, steps, el)
            # how far the shared parameters moved since the last log, RMS per
            # element in units of lr, and per apply: Adam's step does not shrink
            # with the gradient, so after convergence the weights keep moving
            # at this rate whatever the gradients say (docs/results.md: hence
            # the anneal)
            opt = shared.optimizer
            upd_now = int(shared.updates)
            snap = self._param_snapshot
            if snap is not None and upd_now > self._param_snapshot_updates and opt.lr > 0:
                change = rms_diff(shared.params, snap) / opt.lr
                log.scalar("optim/param_change_rms", change, steps, el)
                log.scalar("optim/param_change_per_apply",
                           change / (upd_now - self._param_snapshot_updates), steps, el)
            if snap is None:
                snap = self._param_snapshot = np.empty_like(shared.params)
            np.copyto(snap, shared.params)
            self._param_snapshot_updates = upd_now
            if n_upd > 0 and den_rms > 0:
                # mean gradient norm over the interval / the norm Adam expects
                log.scalar("optim/grad_to_adam_ratio",
                           d[3] / n_upd / (den_rms * math.sqrt(shared.optimizer.n_params)),
                           steps, el)
        log.flush()

    def progress(self, steps, sps, d, tty):
        """The progress line (on a terminal: rewritten in place)."""
        el = self.clock.elapsed()
        shared = self.parts.shared
        losses = ""
        if d[4] > 0:
            losses = (f" | pi {d[0] / d[4]:+.3f} v {d[1] / d[4]:.3f} H {d[2] / d[4]:.3f}"
                      f" |g| {d[3] / d[4]:.2f}")
        skipped = int(shared.skipped_updates)
        if skipped:
            losses += f" skipped {skipped}"
        short, long_avg, n = self.rewards.averages()
        w = REWARD_WINDOW
        avg_s = "   n/a" if short is None else f"{short:7.2f}"
        long_s = "" if long_avg is None or n <= w else f" avg{n} {long_avg:7.2f}"
        line = (f"[{el:7.1f}s] steps {steps:>9,d}  {sps:7.0f} steps/s  episodes "
                f"{int(shared.episodes):>6d}  avg{w} {avg_s}{long_s}{losses}")
        if tty:
            print("\r" + line + "\x1b[K", end="", file=self.out, flush=True)
        else:
            print(line, file=self.out, flush=True)

    # -- restarts (the run goes on) ----------------------------------------------
    def env_restarted(self, wid, k, summary, text, count, limit):
        """Worker ``wid`` rebuilt its env ``k``: one warning line, the
        traceback appended to errors.log and the run's count so far as the
        ``charts/env_restarts`` scalar (the run goes on)."""
        log = self._count_restart("env_restarts", f"worker {wid} env {k} restarted", text)
        left = ("the next failure within the hour stops the run" if count >= limit
                else f"{count} of {limit} allowed per worker per hour")
        print(f"warning: worker {wid}: env {k} ({self.cfg.env}) failed and was rebuilt, its "
              f"episode dropped: {summary}; restart {left} (--env-restarts); traceback in {log}",
              file=sys.stderr, flush=True)

    def worker_restarted(self, wid, pid, how, new_pid, count, limit, reaped=0):
        """Worker ``wid``'s process ``pid`` died (``how``) and was forked
        again as ``new_pid``: one warning line, an errors.log entry and the
        run's count so far as the ``charts/worker_restarts`` scalar."""
        left = ("the next death stops the run" if count >= limit
                else f"{count} of {limit} allowed per run")
        engines = (f"; {reaped} of its engine or env processes killed" if reaped else "")
        what = (f"worker process {wid} (pid {pid}) died: {how}; restarted from the shared "
                f"parameters as pid {new_pid}, with new envs{engines}; restart {left} "
                f"(--worker-restarts)")
        log = self._count_restart("worker_restarts", f"worker process {wid} restarted", what)
        print(f"warning: {what}; see {log}", file=sys.stderr, flush=True)

    def _count_restart(self, counter, title, text):
        """One more ``counter`` (``env_restarts`` or ``worker_restarts``): the
        errors.log entry and the ``charts/<counter>`` scalar; returns the log path."""
        with self._restart_lock:
            n = getattr(self, counter) + 1
            setattr(self, counter, n)
            log = self.append_error_log(title, text)
            if self.logger is not None:
                self.logger.scalar(f"charts/{counter}", n, self.live_steps(),
                                   self.clock.elapsed())
        return log

    # -- errors.log, summary.json ----------------------------------------------------
    def write_error_log(self):
        """Append every entry of :attr:`errors` to errors.log; returns its
        path, or says why it could not be written."""
        path = os.path.join(self.run_dir, "errors.log")
        try:
            with open(path, "a") as fh:
                for who, text in self.errors:
                    fh.write(_log_entry(who, text))
        except OSError as e:
            return f"{path}, which could not be written: [Errno {e.errno}] {e.strerror}"
        return path

    def append_error_log(self, who, text):
        """One entry in errors.log (what a run survived); returns the path, or
        says why it could not be written."""
        path = os.path.join(self.run_dir, "errors.log")
        try:
            with open(path, "a") as fh:
                fh.write(_log_entry(who, text))
        except OSError as e:
            return f"{path}, which could not be written: [Errno {e.errno}] {e.strerror}"
        return path

    def write_summary(self, result, stop_reason, target_reached):
        """``summary.json``: the result, why the run stopped and its errors'
        last lines (replaced whole; a refused write is a warning)."""
        d = result.to_dict()
        d.update(stop_reason=stop_reason, target_reached=target_reached,
                 updates=int(self.parts.shared.updates),
                 errors=[f"{w}: {t.strip().splitlines()[-1]}" for w, t in self.errors])
        tmp = os.path.join(self.run_dir, ".summary.json.tmp")
        try:
            with open(tmp, "w") as fh:
                json.dump(d, fh, indent=1)
            os.replace(tmp, os.path.join(self.run_dir, "summary.json"))
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            print(f"warning: cannot write {os.path.join(self.run_dir, 'summary.json')}: "
                  f"[Errno {e.errno}] {e.strerror}", file=sys.stderr, flush=True)

    @staticmethod
    def report_unwritten(result):
        """One line at the end if the logs lost rows (summary.json has the counts)."""
        if result.unwritten_rows:
            parts = [f"{n:,} of {name}" for name, n in result.unwritten_rows.items()]
            print(f"warning: rows not written (the file system refused them): "
                  f"{', '.join(parts)}; see summary.json 'unwritten_rows'",
                  file=sys.stderr, flush=True)
