"""ProcEnv: an env in a child process behaves exactly like the same env in-process."""
import json
import os
import signal
import threading

import numpy as np
import pytest

from a3c_core.envs import make_env
from a3c_core.envs.proc import EnvProcessError, ProcEnv

gymnasium = pytest.importorskip("gymnasium")


def rollout(env, actions, episodes=1):
    out, i = [], 0
    for _ in range(episodes):
        out.append((env.reset().copy(), None, False, False, env.episode_over, env.episode_end))
        while True:
            obs, r, term, trunc = env.step(actions[i % len(actions)])
            i += 1
            out.append((obs.copy(), r, term, trunc, env.episode_over, env.episode_end))
            if term or trunc:
                break
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (oa, *ra), (ob, *rb) in zip(a, b):
        np.testing.assert_array_equal(oa, ob)
        assert ra == rb


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture(scope="module")
def cartpole_proc():
    with make_env("CartPole-v1", seed=3, env_process=True, max_episode_steps=40) as env:
        yield env


def test_proc_env_matches_in_process_env(cartpole_proc):
    env = cartpole_proc
    assert isinstance(env, ProcEnv) and env.pid != os.getpid() and _alive(env.pid)
    actions = np.random.default_rng(1).integers(0, 2, size=200).tolist()
    with make_env("CartPole-v1", seed=3, env_process=False, max_episode_steps=40) as local:
        for key in ("env_id", "n_actions", "action_names", "obs_shape", "obs_dtype",
                    "obs_kind", "frame_skip", "preprocess_spec"):
            assert getattr(env, key) == getattr(local, key), key
        assert env.spec() == local.spec()
        json.dumps(env.spec())
        expected = rollout(local, actions, episodes=3)
    got = rollout(env, actions, episodes=3)
    assert_same(got, expected)
    # episode_over: False during an episode, True after its last step;
    # episode_end: None until then, the word of how it ended after it
    assert [e[4:] for e in got] == [e[4:] for e in expected]
    assert got[-1][4] is True and got[1][4] is False
    ends = [e[5] for e in got if e[2] or e[3]]
    assert len(ends) == 3 and set(ends) <= {"terminated", "truncated"}
    assert all(e[5] is None for e in got if not (e[2] or e[3]))


def test_proc_env_observations_are_read_only_and_stay_valid_one_step(cartpole_proc):
    env = cartpole_proc
    first = env.reset()
    kept = first.copy()
    assert not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 1.0
    second, *_ = env.step(0)
    np.testing.assert_array_equal(first, kept)  # two slots: the previous obs is intact
    assert not np.shares_memory(first, second)


def test_proc_env_bad_action_and_child_errors(cartpole_proc):
    with pytest.raises(ValueError, match="range\\(2\\)"):
        cartpole_proc.step(2)
    # errors raised while the child builds its env keep their type and message
    with pytest.raises(ValueError, match="Unknown env id 'CartPol-v1'") as info:
        make_env("CartPol-v1", env_process=True)
    assert "Did you mean" in str(info.value)


def test_proc_env_close_is_idempotent_and_reaps_child():
    env = make_env("CartPole-v1", env_process=True)
    pid = env.pid
    env.reset()
    env.close()
    env.close()
    assert not _alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        env.step(0)


def test_child_killed_mid_episode_raises_clear_error_not_hang():
    env = make_env("CartPole-v1", seed=0, env_process=True)
    env.reset()
    env.step(0)
    result = {}

    def step_after_kill():
        try:
            env.step(1)
        except BaseException as exc:  # captured for the assertions below
            result["exc"] = exc

    os.kill(env.pid, signal.SIGKILL)
    t = threading.Thread(target=step_after_kill, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "step() hung on a dead env process"
    exc = result.get("exc")
    assert isinstance(exc, EnvProcessError), exc
    msg = str(exc)
    assert "CartPole-v1" in msg and str(env.pid) in msg and "SIGKILL" in msg
    env.close()  # still fine after the child died


def test_kill_engine_kills_the_child_and_the_next_call_raises():
    """What the step watchdog does to a hung env process (a3c_core.train.watchdog)."""
    env = make_env("CartPole-v1", seed=0, env_process=True)
    env.reset()
    assert env.kill_engine() is True
    with pytest.raises(EnvProcessError, match="SIGKILL"):
        env.step(0)
    assert env.kill_engine() is False       # gone already
    env.close()


def test_child_killed_while_worker_waits():
    """The worker is blocked in step() when the child dies: it gets the error."""
    pytest.importorskip("ale_py")
    env = make_env("ALE/Pong-v5", seed=0)  # automatic: Atari runs in a child process
    assert isinstance(env, ProcEnv)
    env.reset()
    stop, result = threading.Event(), {}

    def worker():
        try:
            while not stop.is_set():
                _, _, term, trunc = env.step(1)
                if term or trunc:
                    env.reset()
        except BaseException as exc:  # captured for the assertions below
            result["exc"] = exc

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    os.kill(env.pid, signal.SIGKILL)
    t.join(timeout=20)
    stop.set()
    assert not t.is_alive(), "the worker hung on a dead env process"
    assert isinstance(result.get("exc"), EnvProcessError)
    env.close()


def test_doom_and_render_through_a_process():
    pytest.importorskip("vizdoom")
    actions = [0, 2, 1, 2]
    with make_env("doom:basic", seed=5, render=True, env_process=False) as local:
        expected = rollout(local, actions)
        frame_local = local.render_frame()
    with make_env("doom:basic", seed=5, render=True, env_process=True) as env:
        assert env.spec() == local.spec()
        got = rollout(env, actions)
        frame = env.render_frame()
    assert_same(got, expected)          # (the end of the episode, "timed out", included)
    assert got[-1][5] == "timed out" and got[-2][5] is None
    assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8
    np.testing.assert_array_equal(frame, frame_local)


def test_env_process_argument_checked():
    with pytest.raises(ValueError, match="env_process"):
        make_env("CartPole-v1", env_process="yes")


def test_interrupted_wait_keeps_requests_and_replies_paired():
    """A KeyboardInterrupt while waiting for a reply must not shift later replies."""
    with make_env("CartPole-v1", seed=3, env_process=False) as local:
        local.reset()  # the interrupted call below still runs in the child
        want = [local.reset().copy()] + [local.step(a)[0].copy() for a in (0, 1, 1)]
    env = make_env("CartPole-v1", seed=3, env_process=True)
    real = env._sock

    class Interrupting:  # the reply wait is interrupted once, as by a Ctrl-C
        def __init__(self):
            self.armed = True

        def __getattr__(self, name):
            return getattr(real, name)

        def recv_into(self, *args):
            if self.armed:
                self.armed = False
                raise KeyboardInterrupt
            return real.recv_into(*args)

    env._sock = Interrupting()
    try:
        with pytest.raises(KeyboardInterrupt):
            env.reset()
    finally:
        env._sock = real
    got = [env.reset().copy()] + [env.step(a)[0].copy() for a in (0, 1, 1)]
    env.close()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_child_outlives_the_thread_that_created_it():
    """Worker threads create envs and may exit before the main thread closes
    them (PR_SET_PDEATHSIG would kill the child here: it is per-thread)."""
    box = {}
    t = threading.Thread(target=lambda: box.update(env=make_env("CartPole-v1", env_process=True)))
    t.start()
    t.join(timeout=60)
    env = box["env"]
    try:
        assert _alive(env.pid)
        env.reset()
        assert env.step(0)[0].shape == (4,)
        assert _alive(env.pid)
    finally:
        env.close()
    assert not _alive(env.pid)
