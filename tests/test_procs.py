"""Worker processes (``worker_processes``, a3c_core.train.procs): the workers'
shared state is one state, failures and signals end a run as with threads."""
import csv
import json
import os
import signal
import time

import numpy as np
import pytest

from a3c_core.checkpoint import load_checkpoint
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.trainer import Trainer, TrainingError
from cartpole_ends import cartpole_end_fits
from proc_util import children_of, finish, start_cli, wait_for_file, wait_gone

pytest.importorskip("gymnasium")

CART = dict(env="CartPole-v1", spec="mlp-lstm", workers=2, worker_processes=True,
            tensorboard=False, quiet=True, log_interval=0.2)


def _episodes(run):
    with open(os.path.join(run, "episodes.csv"), newline="") as fh:
        return list(csv.DictReader(fh))


def _cfg(tmp_path, **kw):
    return Config(**dict(CART, run_dir=str(tmp_path / "run"), **kw)).validate()


def test_worker_processes_make_the_process_backend(tmp_path):
    from a3c_core.train.procs import ProcessBackend

    t = Trainer(_cfg(tmp_path, total_steps=10))
    try:
        assert isinstance(t.backend, ProcessBackend)
        assert t.envs == [None, None]       # env 0 checked the id, then closed
    finally:
        t.close()
    with pytest.raises(ConfigError, match="'workers'"):
        Config(**dict(CART, workers=-1)).validate()


def test_processes_update_one_shared_state(tmp_path):
    """Two worker processes: every update is counted once by Adam's shared
    step, every step's return is merged into the one shared normalizer,
    every episode reaches episodes.csv once, from both workers, and the
    checkpoint holds what the processes wrote."""
    cfg = _cfg(tmp_path, total_steps=4000)
    t = Trainer(cfg)
    p0 = t.shared.params.copy()
    res = t.run()
    assert res.status == "done" and res.steps >= 4000
    ck = load_checkpoint(os.path.join(cfg.run_dir, "checkpoints", "latest.npz"))
    c = ck.meta["counters"]
    assert c["steps"] == res.steps and c["updates"] > 0 and c["skipped_updates"] == 0
    assert ck.meta["optimizer_scalars"]["step"] == c["updates"]
    # the return normalizer merges each step's return once (one rollout each)
    assert ck.meta["reward_normalizer"]["count"] == res.steps
    assert ck.meta["advantage_normalizer"]["count"] == res.steps
    assert not np.array_equal(ck.params, p0)
    np.testing.assert_array_equal(ck.params, t.shared.params)     # the shared block
    rows = _episodes(cfg.run_dir)
    assert [int(r["episode"]) for r in rows] == list(range(1, res.episodes + 1))
    assert {r["worker"] for r in rows} == {"0", "1"}
    assert sum(int(r["length"]) for r in rows) <= res.steps
    # how each ended, sent by the worker process: CartPole's time limit is 500 steps
    assert all(cartpole_end_fits(int(r["length"]), r["end"]) for r in rows)
    # each row has the step and time its episode ended (sent by its worker,
    # not read when the trainer drains the pipes, up to a tick later): at
    # the end of an episode the shared count holds every step of the
    # episodes that ended before it but each worker's current rollout
    # (t_max = 20); the last episode's length (<= 500) covers a worker
    # preempted between reading the count and the clock
    rows.sort(key=lambda r: float(r["wall_time"]))
    assert 0 < float(rows[-1]["wall_time"]) <= res.seconds
    done = 0
    for r in rows:
        assert done - cfg.workers * 20 - 500 <= int(r["step"]) <= res.steps
        done += int(r["length"])
    summary = json.load(open(os.path.join(cfg.run_dir, "summary.json")))
    assert summary["updates"] == c["updates"]
    with open(os.path.join(cfg.run_dir, "metrics.csv")) as fh:
        metrics = list(csv.reader(fh))
    names = {r[2] for r in metrics[1:]}
    assert "losses/policy_loss" in names             # the workers' loss rows
    assert {float(r[3]) for r in metrics[1:] if r[2] == "charts/merging_workers"} <= {0, 1, 2}
    assert "charts/merging_workers" in names


def test_a_worker_process_exception_fails_the_run_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    cfg = _cfg(tmp_path, env="crash_envs:RaiseInStep-v0", spec="mlp", total_steps=0)
    with pytest.raises(TrainingError, match=r"worker \d failed: .*EnvCrash"):
        Trainer(cfg).run()
    log = open(os.path.join(cfg.run_dir, "errors.log")).read()
    assert "crash_envs: step failed on purpose" in log and "Traceback" in log
    summary = json.load(open(os.path.join(cfg.run_dir, "summary.json")))
    assert summary["status"] == "failed"


def _worker_pids(proc):
    """The trainer's worker processes (its python children, not engines)."""
    out = set()
    for pid in children_of(proc.pid):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid:
            out.add(pid)
    return out


def _start(tmp_path, *extra):
    run = str(tmp_path / "run")
    proc = start_cli(["train", "--env", "CartPole-v1", "--workers", "2", "--worker-processes",
                      "--total-steps", "0", "--no-tensorboard", "--log-interval", "0.2",
                      "--checkpoint-interval", "0.5", "--run-dir", run, *extra], cwd=tmp_path)
    wait_for_file(os.path.join(run, "checkpoints", "latest.npz"), proc)
    deadline = time.monotonic() + 30
    while len(_worker_pids(proc)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    return run, proc


@pytest.mark.slow
def test_a_killed_worker_process_fails_the_run_naming_it(tmp_path):
    """With ``--worker-restarts 0``: a dead worker process stops the run."""
    run, proc = _start(tmp_path, "--worker-restarts", "0")
    kids = children_of(proc.pid)
    victim = min(_worker_pids(proc))
    os.kill(victim, signal.SIGKILL)
    out = finish(proc, timeout=90)
    assert proc.returncode == 1, out
    assert f"(pid {victim}) died: killed by SIGKILL" in out
    assert json.load(open(os.path.join(run, "summary.json")))["status"] == "failed"
    assert load_checkpoint(run).meta["counters"]["steps"] > 0
    assert not wait_gone(kids, timeout=10)


def _kill_a_worker_when(t, ready, out, sig=signal.SIGKILL):
    """On a thread: once ``ready()``, SIGKILL worker 0's process of trainer
    ``t``; its pid goes to ``out``."""
    import threading

    def go():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = t.backend.worker_pids()
            if len(pids) == t.n_workers and ready():
                out.append(pids[0])
                out.append(t.worker_updates()[0])       # its updates so far
                os.kill(pids[0], sig)
                return
            time.sleep(0.02)

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def test_worker_restarts_0_keeps_the_clean_stop(tmp_path, capsys):
    """``worker_restarts = 0``: a killed worker process stops the run as
    before, naming it and its signal, with a final checkpoint."""
    cfg = _cfg(tmp_path, total_steps=0, total_seconds=60, worker_restarts=0)
    t = Trainer(cfg)
    victim = []
    th = _kill_a_worker_when(t, lambda: t.backend.live_steps() > 200, victim)
    with pytest.raises(TrainingError, match=r"worker 0 failed: worker process 0 \(pid \d+\) "
                                            r"died: killed by SIGKILL \(traceback in .*errors\.log\); "
                                            r"last checkpoint: .*latest\.npz"):
        t.run()
    th.join()
    summary = json.load(open(os.path.join(cfg.run_dir, "summary.json")))
    assert summary["status"] == "failed" and summary["worker_restarts"] == 0
    assert "restarted" not in capsys.readouterr().err
    assert load_checkpoint(cfg.run_dir).meta["counters"]["steps"] > 0


def test_a_killed_worker_process_is_forked_again(tmp_path, capsys):
    """The Trainer API: worker 0's process SIGKILLed; a new one takes its
    index (a new pid, a new seed stream), its update counters go on, and
    the run ends at its budget."""
    # a budget in seconds: the kill lands mid-run whatever the machine's speed
    # (a dead worker found once the budget is spent is not restarted)
    cfg = _cfg(tmp_path, total_steps=0, total_seconds=4.0)
    t = Trainer(cfg)
    victim = []
    th = _kill_a_worker_when(t, lambda: t.backend.live_steps() > 500, victim)
    res = t.run()
    th.join()
    assert res.status == "done" and res.steps > 500 and res.worker_restarts == 1
    assert t.env_slots.generation == [1, 0] and t.backend.worker_pids()[0] != victim[0]
    seed = t.env_slots.seed(0)
    t.env_slots.generation[0] = 0
    assert t.env_slots.seed(0) != seed                  # a new seed stream
    err = capsys.readouterr().err
    assert f"warning: worker process 0 (pid {victim[0]}) died: killed by SIGKILL; restarted" in err
    assert json.load(open(os.path.join(cfg.run_dir, "summary.json")))["worker_restarts"] == 1
    assert np.isfinite(t.shared.params).all()
    assert t.worker_updates()[0] >= victim[1] > 0       # its counters go on from the dead one's


def test_kill_left_behind_kills_what_a_dead_worker_left():
    import subprocess
    import sys

    from a3c_core.train.procs import _proc_start_time, kill_left_behind

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        st = _proc_start_time(p.pid)
        assert st is not None
        assert kill_left_behind([(p.pid, st + 1)], wait=0.05) == 0    # another process
        assert kill_left_behind([(p.pid, st)], wait=0.05) == 1
        assert p.wait(10) == -signal.SIGKILL
        assert kill_left_behind([(p.pid, st)], wait=0.05) == 0        # gone
    finally:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_a_killed_worker_process_is_restarted_and_the_run_finishes(tmp_path):
    """``a3c train --workers 2 --worker-processes``, one worker process
    SIGKILLed mid-run: it is forked again (a new pid, the same index), its
    env processes are gone, the run reaches its total steps and exits 0,
    and the restart is reported (the warning line, errors.log,
    charts/worker_restarts in metrics.csv, summary.json); no parameter is NaN."""
    run = str(tmp_path / "run")
    total = 30000
    proc = start_cli(["train", "--env", "CartPole-v1", "--workers", "2", "--worker-processes",
                      "--env-process", "--total-steps", str(total), "--no-tensorboard",
                      "--log-interval", "0.2", "--checkpoint-interval", "0.5", "--run-dir", run],
                     cwd=tmp_path)
    wait_for_file(os.path.join(run, "checkpoints", "latest.npz"), proc)
    deadline = time.monotonic() + 30
    while len(_worker_pids(proc)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = _worker_pids(proc)
    assert len(workers) == 2
    victim = min(workers)
    its_envs = children_of(victim)          # its env processes
    assert its_envs
    os.kill(victim, signal.SIGKILL)
    new = set()
    deadline = time.monotonic() + 60
    while not new and proc.poll() is None and time.monotonic() < deadline:
        new = _worker_pids(proc) - workers
        time.sleep(0.05)
    out = finish(proc, timeout=240)
    assert proc.returncode == 0, out
    assert "Traceback" not in out            # nor from its env processes
    assert new, out                          # forked again
    assert "warning: worker process " in out
    assert f"(pid {victim}) died: killed by SIGKILL; restarted from the shared parameters" in out
    assert "restart 1 of 3 allowed per run (--worker-restarts)" in out
    assert "1 worker process restart after a death" in out         # the final line
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "done" and summary["errors"] == []
    assert summary["worker_restarts"] == 1 and summary["steps"] >= total
    with open(os.path.join(run, "metrics.csv")) as fh:
        rows = [r for r in csv.reader(fh) if r[2] == "charts/worker_restarts"]
    assert [float(r[3]) for r in rows] == [1.0]
    log = open(os.path.join(run, "errors.log")).read()
    assert f"(pid {victim}) died: killed by SIGKILL" in log and "restarted" in log
    ck = load_checkpoint(run)
    assert ck.meta["counters"]["steps"] == summary["steps"]
    assert np.isfinite(ck.params).all()
    for arr in ck.opt_arrays.values():       # the optimizer statistics too
        assert np.isfinite(arr).all()
    # both workers' episodes are logged, the restarted one's after its restart too
    eps = _episodes(run)
    assert {r["worker"] for r in eps} == {"0", "1"}
    assert not wait_gone(its_envs, timeout=10)     # none of its env processes left


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_stops_the_workers_and_checkpoints(tmp_path, sig):
    """A terminal's Ctrl-C (or a SIGTERM to the group) reaches every process:
    the workers ignore it, the trainer stops them, writes its checkpoint and
    exits 130 (143)."""
    run, proc = _start(tmp_path)
    kids = children_of(proc.pid)
    assert len(_worker_pids(proc)) == 2
    os.killpg(proc.pid, getattr(signal, sig))
    out = finish(proc, timeout=90)
    assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[sig], out
    assert "Traceback" not in out and "failed" not in out
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["status"] == "interrupted" and summary["errors"] == []
    assert summary["signal"] == sig
    ck = load_checkpoint(run)
    assert ck.meta["counters"]["steps"] == summary["steps"]
    assert ck.meta["counters"]["episodes"] == len(_episodes(run))
    assert not wait_gone(kids, timeout=10)


@pytest.mark.slow
def test_workers_die_with_a_killed_trainer(tmp_path):
    run, proc = _start(tmp_path)
    workers = _worker_pids(proc)
    assert len(workers) == 2
    proc.kill()
    proc.wait(30)
    assert not wait_gone(workers, timeout=10)


def test_resume_continues_the_shared_counters(tmp_path):
    cfg = _cfg(tmp_path, total_steps=2000)
    first = Trainer(cfg).run()
    res = Trainer(cfg.replace(total_steps=4000), resume=cfg.run_dir).run()
    assert res.steps >= 4000
    ck = load_checkpoint(cfg.run_dir)
    assert ck.meta["optimizer_scalars"]["step"] == ck.meta["counters"]["updates"]
    assert ck.meta["counters"]["updates"] > first.steps // 20
    rows = _episodes(cfg.run_dir)
    assert [int(r["episode"]) for r in rows] == list(range(1, res.episodes + 1))


def test_proc_store_applies_with_the_shared_optimizer_step():
    """ProcStore.apply: Adam's bias correction uses the step every process
    shares (here 5 earlier applies elsewhere: the result is a 6th apply's,
    bit for bit); a skipped update gives its step back."""
    import threading

    from a3c_core import core
    from a3c_core.train import procs

    rng = np.random.default_rng(0)
    p = rng.standard_normal(4096).astype(np.float32)
    g = rng.standard_normal(4096).astype(np.float32)
    m0 = rng.standard_normal(4096).astype(np.float32) * 0.1
    v0 = rng.random(4096).astype(np.float32) * 0.1

    def state(step):
        sh = core.SharedState(p, core.Adam(p.size, lr=1e-2))
        sh.optimizer.exp_avg[:], sh.optimizer.exp_avg_sq[:] = m0, v0
        sh.optimizer.step = step
        return sh

    ref = state(5)
    ref.apply(g, 1e9)
    sh = state(0)                          # this process's own count says nothing
    s = np.zeros(procs.N_SCALARS, np.int64)
    s[procs.S_OPT_STEP], s[procs.S_STEPS] = 5, 100
    store = procs.ProcStore(sh, None, None, s, threading.Lock(), None)
    norm, applied = store.apply(g, 1e9)
    assert applied and norm == pytest.approx(float(np.linalg.norm(g.astype(np.float64))))
    np.testing.assert_array_equal(sh.params, ref.params)
    np.testing.assert_array_equal(sh.optimizer.exp_avg_sq, ref.optimizer.exp_avg_sq)
    assert (s[procs.S_OPT_STEP], s[procs.S_UPDATES], s[procs.S_CONSEC]) == (6, 1, 0)
    before = sh.params.copy()
    bad = g.copy()
    bad[7] = np.nan
    assert store.apply(bad, 1e9)[1] is False
    np.testing.assert_array_equal(sh.params, before)
    assert (s[procs.S_OPT_STEP], s[procs.S_SKIPPED], s[procs.S_CONSEC]) == (6, 1, 1)
    assert store.add_steps(20) == 120 and store.steps == 120


def test_worker_holds_the_stores_targets_lock_around_the_one_call_targets():
    """The normalizers' merge is atomic between processes only under the
    store's lock: the worker takes it once per update, for the targets call."""
    from a3c_core import core
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.envs import make_env
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline
    import a3c_core.train.segments as S
    import a3c_core.train.segments as S
    import a3c_core.train.worker as W

    class Lock:
        held = entered = 0

        def __enter__(self):
            self.held, self.entered = 1, self.entered + 1

        def __exit__(self, *exc):
            self.held = 0

    env = make_env("CartPole-v1", seed=0)
    pipe = ObsPipeline(env.preprocess_spec, env.obs_shape)
    net = build_network("mlp-lstm", pipe.net_obs_shape, env.n_actions, seed=0)
    shared = core.SharedState(net.params.copy(), core.make_optimizer("adam", net.n_params))
    store = W.ThreadStore(shared, ReturnNormalizer(0.99), None, AdvantageNormalizer())
    lock = store.targets_lock = Lock()
    w2 = W.Worker(0, env, net, pipe, store, W.RolloutSettings(normalize_advantages=True),
                  np.random.default_rng(0))
    seen = []
    real = S.rollout_targets

    def spy(*a):
        seen.append(lock.held)
        return real(*a)

    S.rollout_targets = spy
    try:
        for _ in range(3):
            w2.rollout()
    finally:
        S.rollout_targets = real
    assert seen == [1, 1, 1] and lock.entered == 3


def test_processes_with_several_envs_per_worker(tmp_path):
    """Each worker process starts and plays its own 2 envs."""
    cfg = _cfg(tmp_path, total_steps=2000, envs_per_worker=2)
    res = Trainer(cfg).run()
    assert res.status == "done" and res.steps >= 2000
    rows = _episodes(cfg.run_dir)
    assert {r["worker"] for r in rows} == {"0", "1"} and len(rows) == res.episodes


def test_free_lock_takes_back_a_lock_a_killed_worker_held():
    import multiprocessing as mp

    from a3c_core.train.procs import free_lock

    ctx = mp.get_context("fork")
    lock, held = ctx.Lock(), ctx.Event()

    def hold():
        lock.acquire()
        held.set()
        time.sleep(60)

    p = ctx.Process(target=hold, daemon=True)
    p.start()
    assert held.wait(30)
    p.kill()
    p.join()
    assert free_lock(lock, wait=0.2) is True       # it was held: released
    assert lock.acquire(timeout=1.0)
    lock.release()
    assert free_lock(lock, wait=0.2) is False      # free: left as it was
    assert lock.acquire(timeout=1.0)
    lock.release()


def test_an_interrupt_while_the_workers_start_stops_those_started(tmp_path, monkeypatch):
    """Ctrl-C between two forks: the worker already started is stopped
    cleanly (not left to close()'s kill) and the run ends interrupted."""
    import multiprocessing as mp

    from a3c_core.train import procs

    ctx = mp.get_context("fork")

    class Ctx:
        def __getattr__(self, name):
            return getattr(ctx, name)

        def Process(self, *a, **k):
            p = ctx.Process(*a, **k)
            if k.get("name") == "a3c-worker-1":
                def start():
                    time.sleep(0.5)           # worker 0 is running by then
                    raise KeyboardInterrupt
                p.start = start
            return p

    monkeypatch.setattr(procs.mp, "get_context", lambda method: Ctx())
    t = Trainer(_cfg(tmp_path, total_steps=0))
    res = t.run()
    assert res.status == "interrupted" and res.steps > 0
    assert len(t.backend._procs) == 1 and t.backend._procs[0].exitcode == 0
    assert load_checkpoint(t.run_dir).meta["counters"]["steps"] == res.steps


def test_one_worker_process_trains_exactly_as_one_worker_thread(tmp_path):
    """With one worker the run is deterministic, and a worker process makes
    the same updates as a worker thread: the same parameters bit for bit,
    the same counters and normalizer (CartPole: its env 0 is started anew
    in the process with the same seed, untouched in the thread)."""
    cks = []
    for procs in (False, True):
        cfg = Config(env="CartPole-v1", spec="mlp-lstm", workers=1, total_steps=2000, seed=3,
                     run_dir=str(tmp_path / f"run{int(procs)}"), quiet=True, tensorboard=False,
                     worker_processes=procs).validate()
        Trainer(cfg).run()
        cks.append(load_checkpoint(cfg.run_dir))
    a, b = cks
    np.testing.assert_array_equal(a.params, b.params)
    for key in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(a.opt_arrays[key], b.opt_arrays[key])
    for key in ("steps", "updates", "episodes"):
        assert a.meta["counters"][key] == b.meta["counters"][key]
    assert a.meta["reward_normalizer"] == b.meta["reward_normalizer"]
    assert a.meta["optimizer_scalars"]["step"] == b.meta["optimizer_scalars"]["step"]
