"""A real ViZDoom engine killed or stopped mid-run (issue 73, items 1 and 2).

* SIGKILL of the engine: the env is rebuilt in place and the run goes on to
  its budget, saying so (a warning line, errors.log, summary.json);
* SIGSTOP of the engine (a hung engine) with ``--env-step-timeout 3``: the
  step watchdog kills it and the env is rebuilt; the run goes on;
* SIGSTOP of the engine, then SIGTERM of the trainer: the process writes its
  checkpoint and exits 143 within 10 s, and no engine of the run is left.
"""
import json
import os
import re
import signal
import time

import pytest

from a3c_core.checkpoint import load_checkpoint
from proc_util import alive, children_of, finish, start_cli, wait_for_file, wait_gone
from reliability_cases import engine_pid

pytestmark = pytest.mark.slow

pytest.importorskip("vizdoom")

DOOM = ["train", "--env", "doom:basic", "--workers", "1", "--total-steps", "0",
        "--no-tensorboard", "--checkpoint-interval", "1", "--log-interval", "0.5"]


def _engine_after_first_checkpoint(proc, run, settle=1.0):
    wait_for_file(os.path.join(run, "checkpoints", "latest.npz"), proc)
    time.sleep(settle)
    pid = engine_pid(proc.pid)
    assert pid is not None, "no ViZDoom engine among the trainer's children"
    return pid


def _summary(run):
    with open(os.path.join(run, "summary.json")) as fh:
        return json.load(fh)


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_crashed_or_hung_engine_is_rebuilt_and_the_run_goes_on(tmp_path, fault):
    run = str(tmp_path / "run")
    extra = ["--env-step-timeout", "3"] if fault == "SIGSTOP" else []
    proc = start_cli([*DOOM, "--total-seconds", "12", "--run-dir", run, *extra], cwd=tmp_path)
    pid = None
    try:
        pid = _engine_after_first_checkpoint(proc, run)
        os.kill(pid, getattr(signal, fault))
        out = finish(proc, timeout=120)
    finally:
        if pid is not None and alive({pid}):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert "failed and was rebuilt, its episode dropped" in out
    if fault == "SIGSTOP":
        assert "the step watchdog killed its engine" in out
    assert "1 env restart after a crash or a hang" in out       # the final line
    s = _summary(run)
    assert s["status"] == "done" and s["env_restarts"] == 1
    assert s["seconds"] >= 12
    log = open(os.path.join(run, "errors.log")).read()
    assert re.search(r"worker 0 env \d+ restarted", log) and "Traceback" in log
    assert load_checkpoint(run).meta["counters"]["steps"] == s["steps"]
    assert not alive({pid})


def test_sigterm_with_a_stopped_engine_exits_143_within_10s(tmp_path):
    run = str(tmp_path / "run")
    proc = start_cli([*DOOM, "--total-seconds", "120", "--run-dir", run], cwd=tmp_path)
    pid = None
    try:
        pid = _engine_after_first_checkpoint(proc, run)
        kids = children_of(proc.pid)
        os.kill(pid, signal.SIGSTOP)            # a deadlocked engine
        time.sleep(4.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, timeout=30)
        took = time.monotonic() - t0
    finally:
        if pid is not None and alive({pid}):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    assert took < 10.0, f"exited {took:.1f} s after SIGTERM"
    assert "Traceback" not in out and "interrupted:" in out
    s = _summary(run)
    assert s["status"] == "interrupted" and s["signal"] == "SIGTERM"
    assert load_checkpoint(run).meta["counters"]["steps"] == s["steps"]
    assert not wait_gone(kids | {pid}, timeout=5), "an engine of the run outlived it"
    print(f"exit {took:.1f} s after SIGTERM with the engine stopped")
