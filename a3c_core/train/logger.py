"""Run-directory metrics: CSV always, TensorBoard scalars when tensorboardX is there.

Scalar names follow one scheme (as CleanRL): ``charts/episodic_return``,
``charts/episodic_length``, ``charts/sps``, ``charts/learning_rate``,
``charts/moving_avg_return`` (short window), ``charts/long_avg_return`` (long
window), ``charts/reward_scale`` (when rewards are normalized),
``losses/policy_loss``, ``losses/value_loss``, ``losses/entropy``,
``losses/grad_norm``, ``losses/skipped_updates``.

* ``metrics.csv``: ``wall_time,step,name,value`` (one row per scalar);
* ``episodes.csv``: ``episode,wall_time,step,worker,return,length,end`` with
  raw (unscaled) episode returns; ``end`` says how the episode ended (the
  env's :attr:`~a3c_core.envs.base.Env.episode_end`: ``died``, ``timed out``
  or ``ended alive`` for Doom, ``terminated`` or ``truncated`` for Gymnasium
  and Atari; empty where the env does not tell).

TensorBoard's per-episode points (``charts/episodic_return`` and
``charts/episodic_length``) are written by :meth:`MetricsLogger.flush` (the
trainer's log tick), not by the worker that finished the episode: a
tensorboardX ``add_scalar`` holds the GIL for ~45 µs, and a trained
doom:basic worker finishes hundreds of episodes a second.  At most
:attr:`MetricsLogger.tb_episodes_per_flush` of a tick's episodes become
points, evenly spread over them (TensorBoard's own UI keeps a sample of
1,000 points per tag anyway); both CSV files keep every episode.

On resume (``resume_at=(steps, episodes)`` of the checkpoint) both files are
first cut back to what the checkpoint covers: rows written after it (the
run went on, then was killed) and a torn last line are dropped, so the
resumed run continues the counters without duplicates. A file written
before a column was added (an ``episodes.csv`` without ``end``) is brought
to the current header then, its old rows keeping an empty cell.
"""
from __future__ import annotations

import csv
import os
import sys
import threading

METRICS_HEADER = ["wall_time", "step", "name", "value"]
EPISODES_HEADER = ["episode", "wall_time", "step", "worker", "return", "length", "end"]


def _file_header(path):
    """The first line of the CSV file ``path`` as a list (None: no file or no line)."""
    if not os.path.exists(path):
        return None
    with open(path, newline="") as fh:
        first = fh.readline()
    return next(csv.reader([first]), None) if first.endswith("\n") else None


def _truncate_csv(path, header, keep):
    """Rewrite ``path`` keeping the header and the complete rows for which
    ``keep(row_dict)`` is true (atomically: temp file + rename). A file whose
    own header is an older ``header`` (columns since added at the end) is
    rewritten with ``header``, its rows' new cells empty."""
    if not os.path.exists(path):
        return
    with open(path, newline="") as fh:
        text = fh.read()
    lines = text.split("\n")
    if lines and lines[-1] != "":  # no final newline: the last line is torn
        lines = lines[:-1]
    own = next(csv.reader(lines[:1]), None) or header
    if own != header[:len(own)]:
        raise ValueError(f"{path}: its header {','.join(own)} is not this version's "
                         f"({','.join(header)}) nor an older one")
    pad = [""] * (len(header) - len(own))
    kept = []
    for row in csv.reader(lines[1:]):
        if len(row) != len(own):
            continue
        try:
            if keep(dict(zip(own, row))):
                kept.append(row + pad)
        except ValueError:  # an unparsable (torn) row
            continue
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(kept)
    os.replace(tmp, path)


class MetricsLogger:
    #: the most per-episode TensorBoard points one flush writes (see the module docstring)
    tb_episodes_per_flush = 100

    def __init__(self, run_dir: str, tensorboard: bool = True, notice=sys.stderr, resume_at=None):
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._tb_episodes = []      # (step, return, length) not yet in TensorBoard
        m_path = os.path.join(run_dir, "metrics.csv")
        e_path = os.path.join(run_dir, "episodes.csv")
        if resume_at is not None:
            steps, episodes = int(resume_at[0]), int(resume_at[1])
            _truncate_csv(m_path, METRICS_HEADER, lambda r: int(r["step"]) <= steps)
            _truncate_csv(e_path, EPISODES_HEADER, lambda r: int(r["episode"]) <= episodes)
        elif _file_header(e_path) not in (None, EPISODES_HEADER):
            _truncate_csv(e_path, EPISODES_HEADER, lambda r: True)   # an older file: upgrade
        new_m = not os.path.exists(m_path)
        new_e = not os.path.exists(e_path)
        self._mf = open(m_path, "a", newline="")
        self._ef = open(e_path, "a", newline="")
        self._m = csv.writer(self._mf)
        self._e = csv.writer(self._ef)
        if new_m:
            self._m.writerow(METRICS_HEADER)
        if new_e:
            self._e.writerow(EPISODES_HEADER)
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                # on resume, TensorBoard drops events past the checkpoint's step
                purge = None if resume_at is None else int(resume_at[0]) + 1
                self._tb = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=purge)
            except ImportError:
                if notice is not None:
                    print(
                        "note: tensorboardX is not installed; writing CSV metrics only "
                        "(pip install 'a3c_core[log]' for TensorBoard scalars)",
                        file=notice,
                    )

    def scalar(self, name: str, value: float, step: int, wall_time: float) -> None:
        with self._lock:
            self._m.writerow([f"{wall_time:.3f}", step, name, f"{float(value):.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(name, float(value), step)

    def episode(self, index, wall_time, step, worker, ret, length, end=None) -> None:
        with self._lock:
            self._e.writerow([index, f"{wall_time:.3f}", step, worker, f"{ret:.6g}", length,
                              end or ""])
            self._m.writerow([f"{wall_time:.3f}", step, "charts/episodic_return", f"{ret:.6g}"])
            self._m.writerow([f"{wall_time:.3f}", step, "charts/episodic_length", length])
            if self._tb is not None:
                self._tb_episodes.append((step, float(ret), float(length)))

    def _write_tb_episodes(self):
        """The pending per-episode points, at most tb_episodes_per_flush of
        them evenly spread (under ``_lock``)."""
        eps, self._tb_episodes = self._tb_episodes, []
        k, cap = len(eps), max(int(self.tb_episodes_per_flush), 1)
        if k > cap:
            eps = [eps[i * k // cap] for i in range(cap)]
        for step, ret, length in eps:
            self._tb.add_scalar("charts/episodic_return", ret, step)
            self._tb.add_scalar("charts/episodic_length", length, step)

    def flush(self) -> None:
        with self._lock:
            if self._tb is not None:
                self._write_tb_episodes()
            self._mf.flush()
            self._ef.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        if self._mf.closed:
            return
        self.flush()
        with self._lock:
            self._mf.close()
            self._ef.close()
            if self._tb is not None:
                self._tb.close()
