"""Env restarts and the step watchdog (issue 73, items 1 and 2), default tier.

An env whose ``step`` or ``reset`` raises is rebuilt in place by the
worker's ``remake_env``: its row's episode is dropped, its LSTM state
restarts, the other rows are untouched, the restart is counted and reported,
and past ``env_restarts`` in an hour the exception propagates as before.  A
step that hangs past the watchdog's bound has its engine killed and is then
restarted the same way.  The real ViZDoom engine (killed, stopped) is in
tests/test_engine_faults.py (slow tier).
"""
import json
import os
import threading
import time

import numpy as np
import pytest

from a3c_core.envs.base import Env
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.train.watchdog import StepWatchdog
from a3c_core.train.worker import RESTART_WINDOW, RolloutAborted, RolloutSettings, Worker
from test_worker import RecordingStore

GAMMA = 0.9


class EngineCrash(RuntimeError):
    """What a CrashEnv raises (as ViZDoom's 'Unexpected ViZDoom instance crash')."""


class CrashEnv(Env):
    """Vector env: seeded observations, ``length``-step episodes, reward 1 for
    action 1.  ``fail_steps`` / ``fail_resets``: its own step / reset counts
    (from 1) that raise :class:`EngineCrash`; ``hang_at``: the step that
    blocks until :meth:`kill_engine` (then raises, as a killed engine does)."""

    def __init__(self, seed, length=9, fail_steps=(), fail_resets=(), hang_at=None):
        self.env_id = "test:crash"
        self.n_actions = 2
        self.action_names = ["a", "b"]
        self.obs_shape = (4,)
        self.obs_dtype = np.dtype(np.float32)
        self.obs_kind = "vector"
        self.frame_skip = 1
        self.preprocess_spec = {"kind": "vector"}
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.length = length
        self.fail_steps, self.fail_resets, self.hang_at = set(fail_steps), set(fail_resets), hang_at
        self.steps = self.resets = 0
        self.closed = False
        self.killed = threading.Event()
        self.episode_over = True

    def _obs(self):
        return self.rng.standard_normal(4).astype(np.float32)

    def reset(self):
        self.resets += 1
        if self.resets in self.fail_resets:
            raise EngineCrash(f"reset {self.resets} failed")
        self.t = 0
        self.episode_over = False
        return self._obs()

    def step(self, action):
        self.steps += 1
        if self.steps == self.hang_at:
            self.killed.wait(30)
            raise EngineCrash("the engine was killed")
        if self.steps in self.fail_steps:
            raise EngineCrash(f"step {self.steps} failed")
        self.t += 1
        done = self.t >= self.length
        self.episode_over = done
        return self._obs(), float(action == 1), done, False

    def kill_engine(self):
        self.killed.set()
        return True

    def close(self):
        self.closed = True


class SpyNet:
    """The worker's network; keeps each update's returns and advantages and
    the values the ticks recorded."""

    def __init__(self, net, worker=None):
        self._net = net
        self.worker = worker
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._net, name)

    def rollout_grad(self, actions, returns, adv, **kw):
        m = actions.shape[0]
        self.calls.append({"actions": actions.copy(), "returns": np.array(returns),
                           "adv": np.array(adv), "values": self.worker.values[:m].copy()})
        return self._net.rollout_grad(actions, returns, adv, **kw)


def _worker(envs, remake=None, *, limit=3, t_max=6, reports=None, fused_act=True):
    net = SpyNet(build_network("mlp-lstm", (4,), 2, seed=0, hidden=(8,), lstm_size=6))
    pipe = ObsPipeline({"kind": "vector"}, (4,))
    store = RecordingStore(net.n_params)        # the worker's parameters stay fixed
    s = RolloutSettings(t_max=t_max, gamma=GAMMA, reward_scale=1.0)
    cb = None if reports is None else (lambda *a: reports.append(a))
    w = Worker(0, envs if len(envs) > 1 else envs[0], net, pipe, store, s,
               np.random.default_rng(3), remake_env=remake, env_restarts=limit,
               on_env_restart=cb, fused_act=fused_act)
    net.worker = w
    return w, net, store


def _rows(call, K, k):
    n = call["actions"].shape[0] // K
    return {key: call[key].reshape(n, K)[:, k] for key in ("actions", "returns", "adv", "values")}


def test_a_failed_step_rebuilds_its_row_and_leaves_the_others_as_they_were():
    """K = 3, env 1 fails at its 8th step (tick 7: rollout 1, t = 1): the
    other rows' actions, values and carried LSTM states are those of the
    same worker without the failure; env 1 is closed and rebuilt (same
    seed), its episode dropped, its state reset; the restart is counted and
    reported once."""
    K, T, rollouts = 3, 6, 4
    ref, ref_net, ref_store = _worker([CrashEnv(k) for k in range(K)], t_max=T)
    first = [CrashEnv(0), CrashEnv(1, fail_steps={8}), CrashEnv(2)]
    made, reports = [], []

    def remake(k):
        made.append(k)
        return CrashEnv(k)

    w, net, store = _worker(list(first), remake, t_max=T, reports=reports)
    for _ in range(rollouts):
        assert ref.rollout()[0] == w.rollout()[0] == T * K
    assert made == [1] and first[1].closed and w.envs[1] is not first[1]
    assert w.envs[0] is first[0] and w.envs[2] is first[2] and not first[0].closed
    assert w.stats.env_restarts == 1
    (wid, k, summary, text, count, limit), = reports
    assert (wid, k, count, limit) == (0, 1, 1, 3)
    assert "step raised EngineCrash: step 8 failed" in summary and "EngineCrash" in text
    # the other rows: bit for bit the worker without the failure
    for a, b in zip(ref_net.calls, net.calls):
        for k in (0, 2):
            ra, rb = _rows(a, K, k), _rows(b, K, k)
            for key in ("actions", "values", "returns", "adv"):
                np.testing.assert_array_equal(ra[key], rb[key], err_msg=f"row {k} {key}")
    for i in (0, 1):
        np.testing.assert_array_equal(ref.state[i][[0, 2]], w.state[i][[0, 2]])
    assert not np.array_equal(ref.state[0][1], w.state[0][1])
    # the dropped episode is not reported: env 1 finished one episode, not two
    # (its first ended at tick 9 without the failure, its rebuilt env's at tick 16)
    assert len(store.episodes) == len(ref_store.episodes) - 1
    assert all(length == 9 for _, length in store.episodes)
    # rollout 1 (ticks 6-11): env 1's row t = 0 bootstraps from V(s_1); the
    # failed row t = 1 returns its own value (no advantage); t = 2 starts the
    # rebuilt env from a zero state
    r = _rows(net.calls[1], K, 1)
    reward0 = float(r["actions"][0] == 1)
    assert r["returns"][0] == pytest.approx(reward0 + GAMMA * r["values"][1], rel=1e-5)
    assert r["returns"][1] == pytest.approx(r["values"][1], rel=1e-5)
    assert r["adv"][1] == pytest.approx(0.0, abs=1e-6)
    obs = ObsPipeline({"kind": "vector"}, (4,))(CrashEnv(1).reset())
    v0 = net._net.step(obs, net._net.initial_state())[1]
    assert r["values"][2] == pytest.approx(float(v0), rel=1e-3, abs=1e-5)


@pytest.mark.parametrize("fused_act", [True, False])
def test_a_failed_step_ends_a_paper_rollout_and_its_state(fused_act):
    """K = 1, rollouts end with their episode: the failed step's row ends the
    rollout, the next one starts the rebuilt env from a zero state."""
    reports = []
    w, net, store = _worker([CrashEnv(0, fail_steps={4})], lambda k: CrashEnv(0), t_max=10,
                            reports=reports, fused_act=fused_act)
    n, term, trunc, applied = w.rollout()
    assert (n, term, trunc) == (4, False, False) and w.stats.env_restarts == 1
    np.testing.assert_array_equal(w.state[0], 0)
    c = net.calls[0]
    assert c["returns"][3] == pytest.approx(c["values"][3], rel=1e-5)
    assert c["returns"][2] == pytest.approx(float(c["actions"][2] == 1) + GAMMA * c["values"][3],
                                            rel=1e-5)
    assert w.rollout()[0] == 9 and store.episodes and store.episodes[0][1] == 9


def test_a_failed_reset_is_rebuilt_and_the_finished_episode_kept():
    reports = []
    w, _, store = _worker([CrashEnv(0, fail_resets={2})], lambda k: CrashEnv(0), t_max=20,
                          reports=reports)
    w.rollout()
    w.rollout()
    assert store.episodes[0][1] == 9 and w.stats.env_restarts == 1
    assert "its reset raised EngineCrash" in reports[0][2]


def test_restarts_stop_at_the_limit_per_hour_and_without_a_factory():
    # no factory: the exception propagates, as before
    w, _, _ = _worker([CrashEnv(0, fail_steps={2})])
    with pytest.raises(EngineCrash, match="step 2 failed"):
        w.rollout()
    assert w.stats.env_restarts == 0
    # limit 1: one restart, then the window must slide before the next
    w, _, _ = _worker([CrashEnv(0, fail_steps={2})], lambda k: CrashEnv(0, fail_steps={3}),
                      limit=1, t_max=20)
    w.rollout()                             # step 2 fails: restart 1
    assert w.stats.env_restarts == 1
    w.guard.restart_times[0] -= RESTART_WINDOW + 1     # an hour later
    w.rollout()                             # the new env's step 3 fails: restart again
    assert w.stats.env_restarts == 2
    with pytest.raises(EngineCrash, match="step 3 failed"):
        for _ in range(5):
            w.rollout()
    assert w.stats.env_restarts == 2
    # limit 0: never rebuilt
    w, _, _ = _worker([CrashEnv(0, fail_steps={2})], lambda k: CrashEnv(0), limit=0)
    with pytest.raises(EngineCrash):
        w.rollout()


def test_a_failure_while_stopping_ends_the_worker_quietly():
    stop = threading.Event()

    class StopThenFail(CrashEnv):
        def step(self, action):
            if self.steps == 5:
                stop.set()          # the run's shutdown killed the engine
                raise EngineCrash("killed at shutdown")
            return super().step(action)

    w, _, _ = _worker([StopThenFail(0)], lambda k: CrashEnv(0), t_max=20)
    w.run(stop)                              # returns, no exception
    assert w.stats.env_restarts == 0
    w.stopping = stop
    with pytest.raises(RolloutAborted):
        w.envs[0].steps = 5
        w.rollout()


def test_the_watchdog_kills_a_hung_step_and_the_worker_goes_on():
    reports = []
    w, _, _ = _worker([CrashEnv(0, hang_at=3)], lambda k: CrashEnv(0), t_max=5, reports=reports)
    dog = StepWatchdog(lambda: [w], 0.3, period=0.05).start()
    try:
        t0 = time.monotonic()
        n = w.rollout()[0]
        took = time.monotonic() - t0
    finally:
        dog.stop()
    assert n == 3 and dog.kills == 1 and w.stats.env_restarts == 1
    assert took < 10
    assert "the step watchdog killed its engine" in reports[0][2]
    assert "watchdog" in reports[0][3]
    w.rollout()                              # the rebuilt env steps on


def test_the_watchdog_bound_and_one_kill_per_call():
    class FakeGuard:
        step_env = 0

        def __init__(self, median):
            self.median = median
            self.step_began = 0.0
            self.envs = [CrashEnv(0)]
            self.hang_notes = {}

        def step_median(self):
            return self.median

    class Fake:
        wid = 0

        def __init__(self, median):
            self.guard = FakeGuard(median)

    fast, slow = Fake(None), Fake(1.0)
    dog = StepWatchdog(lambda: [fast, slow, None], 30.0)
    assert dog.bound(fast) == 30.0 and dog.bound(slow) == 50.0
    fast.guard.step_began = slow.guard.step_began = 100.0
    assert dog.check(now=120.0) == []                   # under 30 s
    found = dog.check(now=140.0)                        # 40 s: over 30, under 50
    assert [(f[0], f[4]) for f in found] == [(fast, True)] and fast.guard.envs[0].killed.is_set()
    assert "40.0 s" in fast.guard.hang_notes[0]
    assert dog.check(now=145.0) == []                   # that call is killed once
    found = dog.check(now=151.0)
    assert [f[0] for f in found] == [slow]
    off = StepWatchdog(lambda: [fast], 0).start()       # 0 = off: no thread
    assert off._thread is None


def test_a_run_survives_env_crashes_up_to_the_limit_and_says_so(tmp_path, capsys):
    """crash_envs:RaiseInStep-v0 fails on every instance's 31st step: a
    110-step run rebuilds it 3 times (the limit) and finishes; errors.log
    holds each traceback, metrics.csv and summary.json the count."""
    pytest.importorskip("gymnasium")
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    cfg = Config(env="crash_envs:RaiseInStep-v0", workers=1, total_steps=110, tensorboard=False,
                 quiet=True, log_interval=0.05, worker_processes=False,
                 run_dir=str(tmp_path / "run")).validate()
    res = Trainer(cfg).run()
    assert res.status == "done" and res.env_restarts == 3
    err = capsys.readouterr().err
    assert err.count("failed and was rebuilt, its episode dropped") == 3
    assert "the next failure within the hour stops the run" in err
    run = cfg.run_dir
    log = open(os.path.join(run, "errors.log")).read()
    assert log.count("worker 0 env 0 restarted") == 3 and log.count("EnvCrash") >= 3
    assert json.load(open(os.path.join(run, "summary.json")))["env_restarts"] == 3
    rows = [line.split(",") for line in open(os.path.join(run, "metrics.csv"))
            if ",charts/env_restarts," in line]
    assert rows and float(rows[-1][3]) == 3

    # one more crash than the limit: the run stops as before, naming the env's error
    from a3c_core.train.trainer import TrainingError

    cfg = cfg.replace(run_dir=str(tmp_path / "run2"), total_steps=400)
    with pytest.raises(TrainingError, match=r"worker 0 failed: .*EnvCrash"):
        Trainer(cfg).run()


@pytest.mark.parametrize("env_process", [True, False])
def test_a_run_stops_in_bounded_time_whatever_its_worker_is_stuck_in(tmp_path, monkeypatch,
                                                                     env_process):
    """The budget ends while the worker is stuck in a step (crash_envs:HangInStep-v0).
    An env process: its child is killed after the grace, the step raises and the
    stopping worker ends quietly.  An env stepped in this process cannot be
    killed: the worker is left behind as stuck, its env not closed under it, and
    the run still ends with its checkpoint."""
    pytest.importorskip("gymnasium")
    import crash_envs
    from a3c_core.train import backends
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    here = os.path.dirname(os.path.abspath(__file__))       # an env process imports crash_envs
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH"))
                                                     if p))
    monkeypatch.setattr(backends, "STOP_GRACE", 0.3)
    monkeypatch.setattr(backends, "KILL_GRACE", 1.0 if env_process else 0.3)
    cfg = Config(env="crash_envs:HangInStep-v0", workers=1, total_steps=0, total_seconds=1.0,
                 tensorboard=False, quiet=True, log_interval=0.1, worker_processes=False,
                 env_process=env_process, run_dir=str(tmp_path / "run")).validate()
    t = Trainer(cfg)
    try:
        t0 = time.monotonic()
        res = t.run()
        took = time.monotonic() - t0
        assert res.status == "done" and res.env_restarts == 0
        assert os.path.exists(os.path.join(cfg.run_dir, "checkpoints", "latest.npz"))
        assert took < 20
        if env_process:
            assert t.stuck_workers == [] and t.envs == [None]
        else:
            assert t.stuck_workers == [0] and t.envs[0] is not None    # not closed under it
    finally:
        crash_envs.HANG_RELEASE.set()
    time.sleep(0.2)
    crash_envs.HANG_RELEASE.clear()
