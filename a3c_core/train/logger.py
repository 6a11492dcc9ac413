"""Run-directory metrics: CSV always, TensorBoard scalars when tensorboardX is there.

Scalar names follow one scheme (as CleanRL): ``charts/episodic_return``,
``charts/episodic_length``, ``charts/sps``, ``charts/learning_rate``,
``charts/moving_avg_return`` (short window), ``charts/long_avg_return`` (long
window), ``charts/reward_scale`` (when rewards are normalized),
``losses/policy_loss``, ``losses/value_loss``, ``losses/entropy``,
``losses/grad_norm``, ``losses/skipped_updates``, ``charts/env_restarts`` (the
run's env restarts so far, written at each one), ``charts/worker_restarts``
(the run's worker process restarts so far, written at each one).

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

Write faults (a full disk, a file-size limit, an I/O error) do not stop a
run: the rows of a CSV file are kept in memory until :meth:`MetricsLogger.flush`
appends them in one write; a write the file system refuses is cut back to
the file's last whole row, the rest counted as not written
(:attr:`MetricsLogger.unwritten`) and the first failure of each file is one
``warning:`` line.  Later flushes try again, so the file continues once
space is back.  TensorBoard's events are written by the thread that logs
them (not tensorboardX's background thread, whose exception would end it
and then block every later ``add_scalar`` on its full queue); a point whose
write or flush fails is counted the same way.
"""
from __future__ import annotations

import csv
import io
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


def _why(e: OSError) -> str:
    return f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e)


class _RowFile:
    """One CSV file of the run, appended to: rows wait in memory until
    :meth:`flush` writes them with ``os.write`` (after the header, while the
    file is empty).  A write that fails is cut back to its last whole row
    (none torn) and the rows that did not go in are counted in
    :attr:`unwritten`; ``on_error(path, OSError)`` is told."""

    #: a flush starts by itself once this many characters wait
    auto_flush_chars = 1 << 18

    def __init__(self, path, header, on_error):
        self.path = path
        self.unwritten = 0
        self._on_error = on_error
        head = io.StringIO()
        csv.writer(head).writerow(header)
        self._header = head.getvalue()
        self._buf = io.StringIO()
        self._w = csv.writer(self._buf)
        self._rows = 0
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            self._fd = None
            on_error(path, e)

    @property
    def closed(self) -> bool:
        return self._buf is None

    def row(self, values):
        self._w.writerow(values)
        self._rows += 1
        if self._buf.tell() >= self.auto_flush_chars:
            self.flush()

    def flush(self):
        if self._buf is None:
            return
        text = self._buf.getvalue()
        rows, self._rows = self._rows, 0
        self._buf.seek(0)
        self._buf.truncate()
        if self._fd is None:
            self.unwritten += rows
            return
        start, head, data, done = None, 0, b"", 0
        try:
            start = os.lseek(self._fd, 0, os.SEEK_END)
            if start == 0:
                text = self._header + text
                head = len(self._header)
            data = text.encode("utf-8")
            view = memoryview(data)
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError as e:
            # keep the whole rows that went in, cut a torn one (a short write)
            keep = data.rfind(b"\n", 0, done) + 1
            if start is not None:
                try:
                    os.ftruncate(self._fd, start + keep)
                except OSError:
                    pass
            kept = data.count(b"\n", 0, keep) - (1 if head and keep >= head else 0)
            self.unwritten += rows - max(kept, 0)
            self._on_error(self.path, e)

    def close(self):
        if self._buf is None:
            return
        self.flush()
        self._buf = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


_STDERR = object()   # notice's default: sys.stderr as it is when the logger is made


class MetricsLogger:
    #: the most per-episode TensorBoard points one flush writes (see the module docstring)
    tb_episodes_per_flush = 100

    def __init__(self, run_dir: str, tensorboard: bool = True, notice=_STDERR, resume_at=None):
        self.run_dir = run_dir
        self._notice = sys.stderr if notice is _STDERR else notice
        self._lock = threading.Lock()
        self._tb_episodes = []      # (step, return, length) not yet in TensorBoard
        self._warned = set()        # the files whose write failure was reported
        self._tb_unwritten = 0      # TensorBoard points whose write or flush failed
        self._tb_pending = 0        # points written since the last good flush
        m_path = os.path.join(run_dir, "metrics.csv")
        e_path = os.path.join(run_dir, "episodes.csv")
        try:
            if resume_at is not None:
                steps, episodes = int(resume_at[0]), int(resume_at[1])
                _truncate_csv(m_path, METRICS_HEADER, lambda r: int(r["step"]) <= steps)
                _truncate_csv(e_path, EPISODES_HEADER, lambda r: int(r["episode"]) <= episodes)
            elif _file_header(e_path) not in (None, EPISODES_HEADER):
                _truncate_csv(e_path, EPISODES_HEADER, lambda r: True)   # an older file: upgrade
        except OSError as e:   # a full disk: the files keep their rows past the checkpoint
            self._warn(getattr(e, "filename", None) or run_dir, e,
                       "its rows were not cut back to the checkpoint")
        self._m = _RowFile(m_path, METRICS_HEADER, self._fault)
        self._e = _RowFile(e_path, EPISODES_HEADER, self._fault)
        self._tb = None
        self._tb_path = os.path.join(run_dir, "tb")
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                # on resume, TensorBoard drops events past the checkpoint's step
                purge = None if resume_at is None else int(resume_at[0]) + 1
                self._tb = SummaryWriter(self._tb_path, purge_step=purge)
                self._write_tb_in_caller()
            except ImportError:
                if self._notice is not None:
                    print(
                        "note: tensorboardX is not installed; writing CSV metrics only "
                        "(pip install 'a3c_core[log]' for TensorBoard scalars)",
                        file=self._notice,
                    )
            except OSError as e:
                self._tb = None
                self._warn(self._tb_path, e, "the run goes on without TensorBoard")

    # -- write faults -------------------------------------------------------------
    def _warn(self, path, e, what):
        if path in self._warned:
            return
        self._warned.add(path)
        if self._notice is not None:
            print(f"warning: cannot write {path}: {_why(e)}; {what}", file=self._notice, flush=True)

    def _fault(self, path, e):
        self._warn(path, e, "training goes on; the rows that cannot be written are "
                            "counted (summary.json: unwritten_rows)")

    def _write_tb_in_caller(self):
        """Make tensorboardX write each event in the thread that logs it, its
        write and flush failures counted (see the module docstring).  Left as
        it is where tensorboardX's internals differ from 2.x."""
        try:
            ev = self._tb._get_file_writer().event_writer
            writer = ev._ev_writer
        except AttributeError:  # pragma: no cover - another tensorboardX
            return

        def add_event(event):
            if ev._closed:
                return
            try:
                writer.write_event(event)
                self._tb_pending += 1
            except OSError as e:
                self._tb_unwritten += 1
                self._fault(self._tb_path, e)

        def flush():
            if ev._closed:
                return
            try:
                writer.flush()
                self._tb_pending = 0
            except OSError as e:
                self._tb_unwritten += self._tb_pending
                self._tb_pending = 0
                self._fault(self._tb_path, e)

        ev.add_event = add_event
        ev.flush = flush
        self._tb_events = ev

    @property
    def unwritten(self) -> dict:
        """Rows (TensorBoard: points) that could not be written, by file; only
        files that had a failure: ``{"metrics.csv": 412, "tb": 90}``."""
        counts = {"metrics.csv": self._m.unwritten, "episodes.csv": self._e.unwritten,
                  "tb": self._tb_unwritten}
        return {k: v for k, v in counts.items() if v}

    # -- rows -----------------------------------------------------------------------
    def scalar(self, name: str, value: float, step: int, wall_time: float) -> None:
        with self._lock:
            self._m.row([f"{wall_time:.3f}", step, name, f"{float(value):.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(name, float(value), step)

    def episode(self, index, wall_time, step, worker, ret, length, end=None) -> None:
        with self._lock:
            self._e.row([index, f"{wall_time:.3f}", step, worker, f"{ret:.6g}", length, end or ""])
            self._m.row([f"{wall_time:.3f}", step, "charts/episodic_return", f"{ret:.6g}"])
            self._m.row([f"{wall_time:.3f}", step, "charts/episodic_length", length])
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
            self._m.flush()
            self._e.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        if self._m.closed:
            return
        self.flush()
        with self._lock:
            self._m.close()
            self._e.close()
            if self._tb is not None:
                try:
                    self._tb.close()
                except OSError as e:    # its last buffered events
                    self._tb_unwritten += self._tb_pending
                    self._tb_pending = 0
                    self._fault(self._tb_path, e)
                    # the file is closed all the same; tensorboardX's atexit
                    # hook would otherwise try (and fail, with a traceback) again
                    events = getattr(self, "_tb_events", None)
                    if events is not None:
                        events._closed = True
