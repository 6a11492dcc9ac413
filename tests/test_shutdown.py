"""Every way a run can end, with real processes and real signals.

SIGTERM is handled like SIGINT (final checkpoint, final line, exit 143); a
SIGKILLed run resumes from its last checkpoint with consistent metrics; a
terminal's Ctrl-C (SIGINT to the whole process group) is an interruption, not
a worker failure; no engine outlives the trainer.
"""
import csv
import json
import os
import signal
import time

import pytest

from a3c_core.checkpoint import find_resume_checkpoint, load_checkpoint
from proc_util import children_of, finish as _finish, start_cli, wait_for_file, wait_gone

pytestmark = pytest.mark.slow  # signals and faults: the slow tier

pytest.importorskip("vizdoom")
pytest.importorskip("gymnasium")

DOOM = ["train", "--env", "doom:basic", "--workers", "1", "--total-steps", "0",
        "--no-tensorboard", "--log-interval", "0.5"]


def _episode_indices(run):
    with open(os.path.join(run, "episodes.csv"), newline="") as fh:
        return [int(r["episode"]) for r in csv.DictReader(fh)]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT-group"])
def test_signal_stops_cleanly_and_leaves_no_engine(tmp_path, how):
    run = str(tmp_path / "run")
    proc = start_cli([*DOOM, "--run-dir", run], cwd=tmp_path)
    wait_for_file(os.path.join(run, "checkpoints", "latest.npz"), proc)
    kids = children_of(proc.pid)
    assert kids, "the ViZDoom engine should be a child of the trainer"
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:  # a terminal's Ctrl-C: SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    out = _finish(proc)
    want = 143 if how == "SIGTERM" else 130
    assert proc.returncode == want, out
    assert "Traceback" not in out
    assert "interrupted:" in out  # the final line
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "interrupted"
    assert summary["signal"] == how.split("-")[0]
    ck = load_checkpoint(run)
    assert ck.meta["counters"]["steps"] == summary["steps"]
    assert not wait_gone(kids, timeout=10)


def test_sigkill_then_resume_loses_at_most_one_interval(tmp_path):
    run = str(tmp_path / "run")
    proc = start_cli([*DOOM, "--run-dir", run, "--checkpoint-interval", "2"], cwd=tmp_path)
    latest = os.path.join(run, "checkpoints", "latest.npz")
    wait_for_file(latest, proc)
    first = os.stat(latest).st_mtime_ns
    deadline = time.monotonic() + 60
    while os.stat(latest).st_mtime_ns == first and time.monotonic() < deadline:
        time.sleep(0.1)  # wait for the second (interval) checkpoint
    time.sleep(0.5)
    kids = children_of(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    t_kill = time.time()
    assert not wait_gone(kids, timeout=10), "the engine outlived a SIGKILLed trainer"
    ck = load_checkpoint(run)
    # at most one interval (2 s) of training is lost
    assert t_kill - os.stat(latest).st_mtime < 2.0 + 1.5
    steps0, eps0 = ck.meta["counters"]["steps"], ck.meta["counters"]["episodes"]
    assert steps0 > 0
    # resume takes the newest valid checkpoint: latest.npz, or best.npz when a
    # new best was written after the last interval checkpoint
    newest = find_resume_checkpoint(run)
    assert newest.steps >= steps0

    proc = start_cli(["train", "--resume", run, "--total-steps", str(newest.steps + 600), "--quiet"],
                     cwd=tmp_path)
    out = _finish(proc, timeout=120)
    assert proc.returncode == 0, out
    assert f"resuming from {newest.path}" in out
    ck2 = load_checkpoint(run)
    assert ck2.meta["counters"]["steps"] >= newest.steps + 600
    assert ck2.meta["counters"]["resumes"] == 1
    # the reward normalizer's statistics were restored, then grew
    assert ck2.meta["reward_normalizer"]["count"] > ck.meta["reward_normalizer"]["count"] > 0
    # episodes continue from the checkpoint's counter: no duplicates, no gaps, no torn rows
    idx = _episode_indices(run)
    assert idx == list(range(1, len(idx) + 1))
    assert len(idx) == ck2.meta["counters"]["episodes"] >= eps0
    with open(os.path.join(run, "metrics.csv"), newline="") as fh:
        rows = list(csv.reader(fh))
    assert all(len(r) == 4 for r in rows)


def test_resume_without_latest_uses_best(tmp_path):
    """A run killed before its first 'latest' but with a valid 'best' resumes from best."""
    run = str(tmp_path / "run")
    proc = start_cli(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "3000",
                      "--run-dir", run, "--quiet", "--no-tensorboard"], cwd=tmp_path)
    assert _finish(proc, timeout=120) is not None and proc.returncode == 0
    ck_dir = os.path.join(run, "checkpoints")
    assert os.path.exists(os.path.join(ck_dir, "best.npz"))
    os.remove(os.path.join(ck_dir, "latest.npz"))
    proc = start_cli(["train", "--resume", run, "--total-steps", "3500", "--quiet"], cwd=tmp_path)
    out = _finish(proc, timeout=120)
    assert proc.returncode == 0, out
    assert "best.npz" in out
