"""The workers' envs start on a thread beside the warm-up (EnvSlots.start_beside):
each env once, with its worker's seed; a failure fails the run with the
env's own error; an interrupted start leaves no env open."""
import threading
import time

import pytest

from a3c_core.train import env_slots as env_slots_mod
from a3c_core.train.config import Config
from a3c_core.train.env_slots import EnvSlots
from a3c_core.train.trainer import Trainer, TrainingError

pytest.importorskip("gymnasium")


class _Spy:
    """make_env that records (seed, thread name) per env and counts closes;
    ``fail_seed``: that env's start raises."""

    def __init__(self, monkeypatch, fail_seed=None, delay=0.0):
        import a3c_core.envs as envs_mod

        self.made, self.closed, self.fail_seed = [], [], fail_seed
        self.seed_of = {}           # id(env) -> seed
        real = envs_mod.make_env

        def make_env(env_id, seed, **kw):
            if seed == self.fail_seed:
                raise RuntimeError(f"engine {seed} would not start")
            env = real(env_id, seed=seed, **kw)
            time.sleep(delay)           # an engine's start takes ~0.1 s
            self.made.append((seed, threading.current_thread().name))
            self.seed_of[id(env)] = seed
            close = env.close

            def counted_close():
                self.closed.append(seed)
                return close()
            env.close = counted_close
            return env

        monkeypatch.setattr(envs_mod, "make_env", make_env)
        monkeypatch.setattr(env_slots_mod, "make_env", make_env)    # the name EnvSlots calls


def _cfg(tmp_path, **kw):
    # worker threads: this process starts the envs (8 workers would be processes)
    base = dict(env="CartPole-v1", workers=3, envs_per_worker=2, total_steps=900, seed=2,
                quiet=True, tensorboard=False, checkpoint_interval=0, worker_processes=False,
                run_dir=str(tmp_path / "run"))
    base.update(kw)
    return Config(**base)


def _slow_warm_up(monkeypatch, until_all_ready=True, then=None):
    """The warm-up waits (up to 20 s) for the env starter to finish before it runs."""
    real = Trainer.warm_up

    def warm_up(self):
        if until_all_ready:
            self.env_slots.starter.join(20)
            assert not self.env_slots.starter.is_alive()
        if then is not None:
            then(self)
        return real(self)

    monkeypatch.setattr(Trainer, "warm_up", warm_up)


def test_envs_start_beside_the_warm_up_once_each_with_their_seeds(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    _slow_warm_up(monkeypatch)
    trainer = Trainer(_cfg(tmp_path))
    res = trainer.run()
    assert res.steps >= 900
    # env 0 in the constructor (an unknown id fails there), the other 5 on the starter
    threads = [name for _, name in spy.made]
    assert threads[0] == threading.main_thread().name
    assert threads[1:] == ["a3c-env-starter"] * 5
    seeds = [seed for seed, _ in spy.made]
    assert seeds == [trainer.env_slots.seed(e // 2, e % 2) for e in range(6)]
    assert len(set(seeds)) == 6
    # worker w plays envs 2w and 2w + 1
    for w in trainer.workers:
        assert [spy.seed_of[id(e)] for e in w.envs] == [trainer.env_slots.seed(w.wid, j) for j in (0, 1)]
    assert sorted(spy.closed) == sorted(seeds)          # every env closed at the end
    assert all(e is None for e in trainer.envs)
    assert not trainer.env_slots.starter.is_alive()


def test_a_worker_starts_the_envs_the_starter_has_not_reached(tmp_path, monkeypatch):
    """A starter that got only to env 3 (as with a fast warm-up): each worker
    starts its own remaining envs, on its own thread, each exactly once."""
    spy = _Spy(monkeypatch)

    def first_three(self):
        for e in range(1, 4):
            self.get(e, pin=True)

    monkeypatch.setattr(EnvSlots, "start_all", first_three)
    _slow_warm_up(monkeypatch)
    trainer = Trainer(_cfg(tmp_path, workers=4, envs_per_worker=3))
    trainer.run()
    by_seed = dict(spy.made)
    assert len(by_seed) == len(spy.made) == 12            # each env once
    for e in range(12):
        w, j = divmod(e, 3)
        who = by_seed[trainer.env_slots.seed(w, j)]
        if e == 0:
            assert who == threading.main_thread().name
        elif e <= 3:
            assert who == "a3c-env-starter"
        else:
            assert who == f"a3c-worker-{w}"
    assert sorted(spy.closed) == sorted(by_seed)


def test_workers_racing_the_starter_start_each_env_once(tmp_path, monkeypatch):
    """No warm-up wait and slow env starts: the starter and the workers claim
    envs at the same time; every env still starts exactly once."""
    spy = _Spy(monkeypatch, delay=0.02)
    trainer = Trainer(_cfg(tmp_path, workers=4, envs_per_worker=3))
    trainer.run()
    seeds = [seed for seed, _ in spy.made]
    assert sorted(seeds) == sorted(trainer.env_slots.seed(e // 3, e % 3) for e in range(12))
    assert sorted(spy.closed) == sorted(seeds)


def test_an_env_that_does_not_start_fails_the_run_with_its_error(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    probe = EnvSlots(cfg, cfg.run_dir, cfg.n_workers(), 0, threading.Event())
    bad = probe.seed(1, 1)                 # env 3: worker 1's second
    spy = _Spy(monkeypatch, fail_seed=bad)
    _slow_warm_up(monkeypatch, until_all_ready=True)
    trainer = Trainer(cfg)
    with pytest.raises(TrainingError) as ei:
        trainer.run()
    msg = str(ei.value)
    assert "worker 1 failed" in msg
    assert "env 1 of worker 1 (CartPole-v1) did not start" in msg
    assert f"engine {bad} would not start" in msg
    # the starter stopped at the failure; every env that started was closed
    assert bad not in [s for s, _ in spy.made]
    assert sorted(spy.closed) == sorted(s for s, _ in spy.made)
    assert all(e is None for e in trainer.envs)


def test_an_interrupted_start_leaves_no_env_open(tmp_path, monkeypatch):
    """Ctrl-C during the warm-up: the starter stops, close() waits for it, and
    every env it started is closed (none starts after)."""
    spy = _Spy(monkeypatch, delay=0.2)

    def interrupt(self):
        time.sleep(0.1)             # the starter is inside its first env's start
        raise KeyboardInterrupt

    _slow_warm_up(monkeypatch, until_all_ready=False, then=interrupt)
    trainer = Trainer(_cfg(tmp_path, workers=8, envs_per_worker=4))
    res = trainer.run()
    assert res.status == "interrupted"
    assert not trainer.env_slots.starter.is_alive()
    trainer.env_slots.starter.join(10)  # (run() joined it: a no-op unless that broke)
    assert 1 <= len(spy.made) < 31      # stopped early
    assert sorted(spy.closed) == sorted(s for s, _ in spy.made)
    assert all(e is None for e in trainer.envs)
