"""Write faults (issue 73, item 3): a checkpoint or a log the file system refuses.

Injected here (ENOSPC, EFBIG, EROFS as OSError from the call that meets it);
``tests/reliability_cases.py`` has the same faults from a real RLIMIT_FSIZE
in a subprocess (slow tier).

* a checkpoint that cannot be written is one line naming the file and the
  error; the previous file is intact; the run goes on and tries again;
* a final checkpoint that cannot be written is rc 1 with one error line
  naming the newest valid checkpoint on disk;
* metrics.csv, episodes.csv and TensorBoard: one warning per file, training
  goes on, the rows not written are counted (summary.json "unwritten_rows")
  and no torn row is left.
"""
import csv
import errno
import hashlib
import io
import json
import os
import sys
import threading

import numpy as np
import pytest

from a3c_core import checkpoint as ck
from a3c_core.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from a3c_core.train.logger import MetricsLogger


def _oserror(code):
    return OSError(code, os.strerror(code))


def _digest(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _meta():
    return {"network": {"name": "mlp"}, "counters": {"steps": 7}}


# -- save_checkpoint ------------------------------------------------------------------
def _fail_savez_midway(code):
    real = np.savez

    def savez(fh, **arrays):
        fh.write(b"PK\x03\x04" + b"\0" * 4096)      # part of the archive went in
        raise _oserror(code)
    return real, savez


@pytest.mark.parametrize("where, code", [("fsync", errno.ENOSPC), ("savez", errno.EFBIG),
                                         ("mkstemp", errno.EROFS), ("replace", errno.EIO)])
def test_a_refused_checkpoint_write_names_the_file_and_keeps_the_previous_one(
        tmp_path, monkeypatch, where, code):
    path = str(tmp_path / "checkpoints" / "latest.npz")
    save_checkpoint(path, np.ones(10, np.float32), _meta())
    before = _digest(path)

    def fail(*a, **k):
        raise _oserror(code)

    if where == "fsync":
        monkeypatch.setattr(ck.os, "fsync", fail)
    elif where == "savez":
        monkeypatch.setattr(ck.np, "savez", _fail_savez_midway(code)[1])
    elif where == "mkstemp":
        monkeypatch.setattr(ck.tempfile, "mkstemp", fail)
    else:
        monkeypatch.setattr(ck.os, "replace", fail)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(path, np.full(10, 2.0, np.float32), _meta())
    monkeypatch.undo()
    e = info.value
    assert str(e) == f"cannot write checkpoint {path}: [Errno {code}] {os.strerror(code)}"
    assert e.path == path and e.errno == code
    assert isinstance(e, ck.CheckpointError)        # callers catching that still do
    assert _digest(path) == before
    assert load_checkpoint(path).params[0] == 1.0
    assert os.listdir(tmp_path / "checkpoints") == ["latest.npz"]   # no temporary file left


# -- the logs --------------------------------------------------------------------------
def _csv_rows(path):
    with open(path, newline="") as fh:
        text = fh.read()
    assert text == "" or text.endswith("\n"), "a torn last row"
    rows = list(csv.reader(text.splitlines()))
    assert len({len(r) for r in rows}) <= 1, "rows of different lengths"
    return rows


class DiskFull:
    """``os.write`` for the files whose names end with ``suffix``: each file's
    first call writes ``partial`` bytes (a short write), later calls raise
    ENOSPC, until ``space()``."""

    def __init__(self, monkeypatch, suffix=".csv", partial=100):
        self.real = os.write
        self.suffix = suffix
        self.partial = partial
        self.full = True
        self.calls = {}
        monkeypatch.setattr(os, "write", self)

    def space(self):
        self.full = False

    def __call__(self, fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if not self.full or not name.endswith(self.suffix):
            return self.real(fd, data)
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] == 1 and self.partial:
            return self.real(fd, bytes(data[:self.partial]))
        raise _oserror(errno.ENOSPC)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_full_disk_under_the_csv_logs_warns_once_per_file_and_counts_the_lost_rows(
        tmp_path, monkeypatch):
    notice = io.StringIO()
    log = MetricsLogger(str(tmp_path), tensorboard=False, notice=notice)
    disk = DiskFull(monkeypatch)
    logged = 0
    for k in range(3):                               # three flushes, all refused
        for i in range(20):
            log.episode(k * 20 + i + 1, 0.1, 10 * i, 0, 1.5, 10, "terminated")
            log.scalar("charts/sps", 100.0, 10 * i, 0.1)
            logged += 1
        log.flush()
    warnings = notice.getvalue().splitlines()
    assert len(warnings) == 2, warnings              # one per file, not one per flush
    for name, line in zip(("metrics.csv", "episodes.csv"), warnings):
        assert line.startswith(f"warning: cannot write {tmp_path / name}: [Errno 28] "
                               "No space left on device; training goes on")
    # the short write kept its whole rows and lost its torn one; the rest is counted
    eps = _csv_rows(tmp_path / "episodes.csv")
    mets = _csv_rows(tmp_path / "metrics.csv")
    assert eps[0][0] == "episode" and mets[0][0] == "wall_time"     # the header went in
    assert len(eps) - 1 + log.unwritten["episodes.csv"] == logged
    assert len(mets) - 1 + log.unwritten["metrics.csv"] == 3 * logged
    assert log.unwritten["episodes.csv"] > 0
    disk.space()                                     # room again: the file goes on
    log.episode(999, 1.0, 1000, 0, 2.5, 12, "truncated")
    log.close()
    eps = _csv_rows(tmp_path / "episodes.csv")
    assert eps[-1] == ["999", "1.000", "1000", "0", "2.5", "12", "truncated"]
    assert len(notice.getvalue().splitlines()) == 2


def test_tensorboard_events_the_disk_refuses_are_counted_without_a_thread_traceback(
        tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    notice = io.StringIO()
    log = MetricsLogger(str(tmp_path), tensorboard=True, notice=notice)
    log.flush()
    recorder = log._tb._get_file_writer().event_writer._ev_writer._py_recordio_writer

    def refuse(*data):
        raise _oserror(errno.ENOSPC)
    monkeypatch.setattr(recorder, "write", refuse)
    for i in range(50):          # more than tensorboardX's queue (10) holds: no block
        log.scalar("charts/sps", float(i), i, 0.1 * i)
    log.flush()
    monkeypatch.setattr(recorder, "write", lambda data: None)     # in the buffer...
    monkeypatch.setattr(recorder, "flush", refuse)                # ...never on disk
    monkeypatch.setattr(recorder, "close", refuse)
    log.scalar("charts/sps", 1.0, 60, 6.0)
    log.close()
    assert log.unwritten["tb"] == 51
    assert not died
    log._tb.file_writer.event_writer.close()     # tensorboardX's atexit hook: done already
    warnings = [w for w in notice.getvalue().splitlines() if w.startswith("warning:")]
    assert len(warnings) == 1 and str(tmp_path / "tb") in warnings[0]
    assert "metrics.csv" not in log.unwritten       # the CSV rows went in


# -- a run -------------------------------------------------------------------------------
CART = ["train", "--env", "CartPole-v1", "--workers", "1", "--spec", "mlp", "--hidden", "8",
        "--quiet", "--no-tensorboard", "--checkpoint-interval", "0.01", "--log-interval", "0.01"]


def _fail_fsync(monkeypatch, times=None):
    """Every checkpoint write fails (ENOSPC at its fsync); with ``times`` only
    the first that many."""
    real, n = os.fsync, [0]

    def fsync(fd):
        n[0] += 1
        if times is None or n[0] <= times:
            raise _oserror(errno.ENOSPC)
        return real(fd)
    monkeypatch.setattr(ck.os, "fsync", fsync)
    return n


def test_a_run_whose_checkpoints_fail_goes_on_and_its_final_failure_names_the_newest_valid(
        tmp_path, monkeypatch, capsys):
    pytest.importorskip("gymnasium")
    from a3c_core.cli import main

    run = str(tmp_path / "run")
    assert main(CART + ["--total-steps", "1000", "--run-dir", run]) == 0
    latest = os.path.join(run, "checkpoints", "latest.npz")
    steps = load_checkpoint(latest).steps
    before = _digest(latest)
    capsys.readouterr()

    _fail_fsync(monkeypatch)                  # the disk is full from here on
    rc = main(["train", "--resume", run, "--total-steps", "4000", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("a3c train: error:")]
    assert errors == [f"a3c train: error: cannot write the final checkpoint {latest}: [Errno 28] "
                      f"No space left on device; the newest valid checkpoint on disk is {latest} "
                      f"(step {steps:,})"]
    # the periodic failures: one line for the file, however many tries (best.npz,
    # tried once the average counts enough episodes, has its own)
    warnings = [ln for ln in lines if ln.startswith("warning:")]
    assert warnings[0] == (
        f"warning: cannot write checkpoint {latest}: [Errno 28] No space left on device; "
        "training goes on, the previous latest.npz is kept, tried again in 0.01 s")
    assert warnings[1:] in ([], [
        f"warning: cannot write checkpoint {run}/checkpoints/best.npz: [Errno 28] No space left "
        "on device; training goes on, no best.npz is on disk yet, tried again at the next log"])
    assert len(lines) == len(warnings) + 1
    assert _digest(latest) == before
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "failed" and summary["checkpoint"] == latest
    assert summary["checkpoint_write_failures"] >= 2      # a periodic one and the final


def test_a_checkpoint_that_fails_then_succeeds_is_a_warning_and_a_note(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gymnasium")
    from a3c_core.cli import main

    run = str(tmp_path / "run")
    _fail_fsync(monkeypatch, times=2)          # the first two writes refused, then room
    assert main(CART + ["--total-steps", "3000", "--run-dir", run]) == 0
    err = capsys.readouterr().err
    latest = os.path.join(run, "checkpoints", "latest.npz")
    assert err.count("warning: cannot write checkpoint") == 1
    assert f"note: {latest} written again after 2 failed attempts" in err
    assert load_checkpoint(latest).steps >= 3000
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "done" and summary["checkpoint_write_failures"] == 2
    assert summary["unwritten_rows"] == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_run_whose_logs_cannot_be_written_finishes_and_reports_the_rows(tmp_path, monkeypatch,
                                                                          capsys):
    pytest.importorskip("gymnasium")
    from a3c_core.cli import main

    run = str(tmp_path / "run")
    DiskFull(monkeypatch, partial=0)
    assert main(CART + ["--total-steps", "2000", "--run-dir", run]) == 0
    captured = capsys.readouterr()
    assert "done:" in captured.out
    warnings = [ln for ln in captured.err.splitlines() if ln.startswith("warning:")]
    assert [w.split(":")[1].split()[-1] for w in warnings[:2]] == [
        f"{run}/metrics.csv", f"{run}/episodes.csv"]
    summary = json.load(open(os.path.join(run, "summary.json")))
    lost = summary["unwritten_rows"]
    assert lost["episodes.csv"] == summary["episodes"]       # none went in
    assert lost["metrics.csv"] >= 2 * summary["episodes"]
    assert warnings[-1] == (f"warning: rows not written (the file system refused them): "
                            f"{lost['metrics.csv']:,} of metrics.csv, "
                            f"{lost['episodes.csv']:,} of episodes.csv; "
                            "see summary.json 'unwritten_rows'")
    assert load_checkpoint(run).steps >= 2000


def test_a_resume_on_a_full_disk_keeps_its_config_toml(tmp_path, monkeypatch, capsys):
    """config.toml is replaced whole: a resume that cannot write it is one error
    line naming it, and the run's config.toml is as it was (not truncated)."""
    pytest.importorskip("gymnasium")
    from a3c_core.cli import main

    run = str(tmp_path / "run")
    assert main(CART + ["--total-steps", "300", "--run-dir", run]) == 0
    conf = os.path.join(run, "config.toml")
    before = open(conf).read()
    capsys.readouterr()
    real = os.replace

    def replace(src, dst, *a, **k):
        if str(dst).endswith("config.toml"):
            raise _oserror(errno.ENOSPC)
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", replace)
    rc = main(["train", "--resume", run, "--total-steps", "600", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines()[-1] == (f"a3c train: error: [Errno 28] cannot write {conf}: "
                                            "No space left on device")
    assert open(conf).read() == before
    assert not os.path.exists(conf + ".tmp")
