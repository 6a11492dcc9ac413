"""A run's checkpoints: :class:`RunCheckpoints` writes ``latest.npz`` and
``best.npz`` under ``RUN_DIR/checkpoints`` and keeps the run going through
write faults; :func:`prepare_run_dir` makes the run directory and its
``config.toml``.

``best.npz`` holds the parameters at the best long reward average
(:mod:`a3c_core.train.run_report`), considered only once ``REWARD_WINDOW``
(100) episodes have finished (the long average then covers every episode so far,
up to its full window).

Write faults (a full disk, a file-size limit, an I/O error): a checkpoint
write the file system refuses is a ``warning:`` line (one per file for a
failing streak, and a ``note:`` when it is written again) and is tried
again at the next interval; the previous file stays.  At the end
(:meth:`RunCheckpoints.final`), a final ``latest.npz`` that cannot be
written fails the run naming the newest valid checkpoint on disk.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from a3c_core import checkpoint as ck
from a3c_core.checkpoint import CheckpointError, CheckpointWriteError, save_checkpoint
from a3c_core.train.config import OPTIMIZER, REWARD_WINDOW

__all__ = ["RunCheckpoints", "prepare_run_dir", "remove_partial_checkpoints"]


def remove_partial_checkpoints(ck_dir):
    """Delete the temporary files of checkpoint writes that a kill interrupted
    (``.tmp-<name>.npz-*``; the checkpoint they were replacing is intact)."""
    for name in os.listdir(ck_dir):
        if name.startswith(".tmp-") and ".npz-" in name:
            try:
                os.unlink(os.path.join(ck_dir, name))
            except OSError:
                pass


def prepare_run_dir(run_dir, config_toml):
    """``RUN_DIR/checkpoints`` (without partial writes) and ``config.toml``
    (``config_toml``: the defaults as resolved now), replaced whole: a
    resume on a full disk keeps the config.toml it had.  Raises OSError
    naming the file the file system refused."""
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    remove_partial_checkpoints(os.path.join(run_dir, "checkpoints"))
    conf = os.path.join(run_dir, "config.toml")
    try:
        with open(conf + ".tmp", "w") as fh:
            fh.write(config_toml)
        os.replace(conf + ".tmp", conf)
    except OSError as e:
        try:
            os.unlink(conf + ".tmp")
        except OSError:
            pass
        raise OSError(e.errno, f"cannot write {conf}: {e.strerror}") from None


class RunCheckpoints:
    """The checkpoints of one run.

    ``plan``/``parts``: the run's :class:`~a3c_core.train.build.RunPlan` and
    :class:`~a3c_core.train.build.RunParts` (what a checkpoint holds);
    ``store``: the in-process store (its ``episode_lock``); ``report``: the
    :class:`~a3c_core.train.run_report.RunReport` (reward averages, the
    logger, the clock); ``resumes``: the run's resume count;
    ``before_save(which)``: brings the shared state up to date first (the
    backend's hook); ``meta``: the resumed checkpoint's meta (the best
    average so far), or ``{}``.
    """

    def __init__(self, cfg, run_dir, plan, parts, store, report, *, resumes, before_save,
                 meta=None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.plan = plan
        self.parts = parts
        self.store = store
        self.report = report
        self.resumes = resumes
        self.before_save = before_save
        meta = meta or {}
        best = meta.get("best_long_avg")
        #: the best long average so far (best.npz holds its parameters); -inf: none
        self.best_avg = -np.inf if best is None else float(best)
        self.best_step = meta.get("best_step")
        #: checkpoint writes the file system refused (summary.json)
        self.write_failures = 0
        self.write_error = None     # the last one (CheckpointWriteError)
        self._failing = {}          # path -> failed writes in a row

    def best_long_avg(self):
        """The best long average so far (None: none yet)."""
        return None if not np.isfinite(self.best_avg) else float(self.best_avg)

    def best_on_disk(self):
        """The path of best.npz, if there is one."""
        best = os.path.join(self.run_dir, "checkpoints", "best.npz")
        return best if os.path.exists(best) else None

    def counters(self) -> dict:
        c = self.parts.shared.counters()
        c.update(wall_seconds=self.report.clock.elapsed(), resumes=self.resumes)
        return c

    def save(self, which="latest"):
        """Write ``checkpoints/<which>.npz`` atomically; returns its path.

        Raises :class:`CheckpointError` (and writes nothing) when the
        parameters are no longer finite: the previous checkpoint stays.
        """
        self.before_save(which)
        report, plan, parts = self.report, self.plan, self.parts
        # the counters, and every episode row they count flushed to episodes.csv
        # before the checkpoint exists: a run killed right after it resumes
        # with no gap in the episode indices (the rows past it are truncated)
        with self.store.episode_lock:
            counters = self.counters()
            if report.logger is not None:
                report.logger.flush()
        st = parts.shared.state_dict()  # a snapshot copy; workers keep writing (Hogwild)
        opt = st["optimizer"]
        arrays = {k: v for k, v in opt.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in opt.items() if not isinstance(v, np.ndarray)}
        short, long_avg, n_eps = report.rewards.averages()
        meta = {
            "network": plan.net_spec,
            "layout": plan.layout,
            "env": plan.env_spec,
            "preprocess": plan.pipeline_spec,
            "optimizer": OPTIMIZER,
            "optimizer_scalars": scalars,
            "counters": counters,
            "config": self.cfg.to_dict(),
            "moving_avg": short,
            "long_avg": long_avg,
            "avg_window": report.rewards.short,
            "long_window": n_eps,
            "best_long_avg": self.best_long_avg(),
            "best_step": self.best_step,
            "reward_normalizer": None if parts.normalizer is None else parts.normalizer.state_dict(),
            "advantage_normalizer": (None if parts.adv_normalizer is None
                                     else parts.adv_normalizer.state_dict()),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if not np.all(np.isfinite(st["params"])):
            raise CheckpointError(
                f"parameters are no longer finite (the run diverged); {which}.npz not written, "
                "the previous checkpoint is kept")
        path = os.path.join(self.run_dir, "checkpoints", f"{which}.npz")
        return save_checkpoint(path, st["params"], meta, arrays)

    def maybe_save_best(self, final=False):
        """best.npz: the best long average, once ``REWARD_WINDOW`` episodes have finished."""
        _, long_avg, n = self.report.rewards.averages()
        if long_avg is None or n < REWARD_WINDOW or not long_avg > self.best_avg:
            return
        prev = (self.best_avg, self.best_step)
        self.best_avg, self.best_step = long_avg, int(self.parts.shared.steps)
        try:
            self.save("best")
        except CheckpointWriteError as e:   # a full disk: tried again at the next log
            self.best_avg, self.best_step = prev
            self._write_failed(e, final)
            if final:
                print(f"warning: {e}; the previous best.npz is kept", file=sys.stderr, flush=True)
        except CheckpointError:
            self.best_avg, self.best_step = prev
            raise

    def _write_failed(self, e: CheckpointWriteError, final=False):
        """Count a refused checkpoint write; one line for the first failure of
        a file in a row (none for the final write: the run's error says it)."""
        self.write_failures += 1
        self.write_error = e
        if not final and e.path not in self._failing:
            name = os.path.basename(e.path)
            kept = (f"the previous {name} is kept" if os.path.exists(e.path)
                    else f"no {name} is on disk yet")
            if name != "latest.npz":
                when = "tried again at the next log"
            elif self.cfg.checkpoint_interval:
                when = f"tried again in {self.cfg.checkpoint_interval:g} s"
            else:
                when = "tried again at the end"
            print(f"warning: {e}; training goes on, {kept}, {when}", file=sys.stderr, flush=True)
        self._failing[e.path] = self._failing.get(e.path, 0) + 1

    def save_or_warn(self, which, final=False):
        """Write a checkpoint; a write the file system refuses is a warning
        (returns None), tried again at the next interval."""
        try:
            path = self.save(which)
        except CheckpointWriteError as e:
            self._write_failed(e, final)
            return None
        failed = self._failing.pop(path, 0)
        if failed:
            print(f"note: {path} written again after {failed} failed "
                  f"attempt{'s' * (failed > 1)}", file=sys.stderr, flush=True)
        return path

    def newest_valid(self):
        """The newest checkpoint on disk that loads (None if none does)."""
        try:
            return ck.find_resume_checkpoint(self.run_dir)
        except CheckpointError:
            return None

    def final(self):
        """latest (+ best) at the end; returns (the final checkpoint's path, or
        the newest valid one on disk, or None; ``(who, error text)`` or None).
        A best.npz that cannot be written is only a warning: latest.npz holds
        the final parameters."""
        try:
            path = self.save_or_warn("latest", final=True)
        except (CheckpointError, OSError) as e:     # the parameters are not finite
            newest = self.newest_valid()
            return (newest.path if newest else None), ("checkpoint", str(e))
        if path is None:
            newest = self.newest_valid()
            where = (f"the newest valid checkpoint on disk is {newest.path}"
                     + (f" (step {newest.steps:,})" if newest.steps is not None else "")
                     if newest else "no valid checkpoint is on disk")
            e = self.write_error
            return (newest.path if newest else None), (
                "final checkpoint", f"cannot write the final checkpoint {e.path}: {e.why}; {where}")
        try:
            self.maybe_save_best(final=True)
        except CheckpointError as e:
            print(f"warning: {e}", file=sys.stderr, flush=True)
        return path, None
