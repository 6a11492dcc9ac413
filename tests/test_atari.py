"""AtariEnv against a plain-numpy twin driving a bare ALEInterface."""
import json

import numpy as np
import pytest

ale_py = pytest.importorskip("ale_py")
pytest.importorskip("gymnasium")

from a3c_core.envs import is_atari_id, make_env  # noqa: E402
from a3c_core.envs.atari import ATARI_CROP, AtariEnv  # noqa: E402


def twin_rollout(game, seed, sticky, actions, frame_skip, noop_max, max_frames=108_000):
    """Reference: every frame grabbed (allocating), max of the step's last two
    frames (the last frame alone when the game ends early), 1..noop_max no-op
    frames after each reset drawn from default_rng(seed)."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", int(np.random.SeedSequence(seed).generate_state(1)[0] & 0x7FFFFFFF))
    ale.setFloat("repeat_action_probability", sticky)
    ale.setInt("max_num_frames_per_episode", max_frames)
    ale.loadROM(ale_py.roms.get_rom_path(game))
    minimal = ale.getMinimalActionSet()
    rng = np.random.default_rng(seed)

    def new_game():
        ale.reset_game()
        for _ in range(int(rng.integers(1, noop_max + 1)) if noop_max else 0):
            ale.act(ale_py.Action.NOOP)
            if ale.game_over():
                ale.reset_game()
        return ale.getScreenGrayscale()

    out = [(new_game(), None, False, False)]
    for a in actions:
        frames, reward = [], 0.0
        for _ in range(frame_skip):
            reward += ale.act(minimal[a])
            frames.append(ale.getScreenGrayscale())
            if ale.game_over():
                break
        if len(frames) == frame_skip and frame_skip > 1:
            obs = np.maximum(frames[-2], frames[-1])
        else:
            obs = frames[-1]
        term = ale.game_over(with_truncation=False)
        trunc = ale.game_over() and not term
        out.append((obs, reward, term, trunc))
        if term or trunc:
            out.append((new_game(), None, False, False))
    return out


def env_rollout(env, actions):
    out = [(env.reset().copy(), None, False, False)]
    for a in actions:
        obs, r, term, trunc = env.step(a)
        out.append((obs.copy(), r, term, trunc))
        if term or trunc:
            out.append((env.reset().copy(), None, False, False))
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for i, ((og, *rg), (ow, *rw)) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(og, ow, err_msg=f"step {i}")
        assert rg == rw, f"step {i}"


@pytest.mark.parametrize("game,frame_skip,sticky,n", [
    ("Breakout", 4, 0.25, 700),  # several whole games: game over inside a step
    ("Pong", 3, 0.0, 200),
    ("Pong", 1, 0.0, 200),
])
def test_atari_matches_numpy_twin(game, frame_skip, sticky, n):
    actions = np.random.default_rng(frame_skip).integers(0, 4, size=n).tolist()
    with make_env(f"ALE/{game}-v5", seed=7, frame_skip=frame_skip, env_process=False,
                  repeat_action_probability=sticky) as env:
        got = env_rollout(env, actions)
    want = twin_rollout(game.lower(), 7, sticky, actions, frame_skip, noop_max=30)
    assert_same(got, want)
    if game == "Breakout":
        assert sum(t for _, _, t, _ in got) >= 2, "whole games are covered"
        assert any(r for _, r, _, _ in got), "rewards are covered"


def test_atari_interface_and_ids():
    with make_env("ALE/Pong-v5", env_process=False) as env:
        assert isinstance(env, AtariEnv)
        assert env.obs_shape == (210, 160) and env.obs_dtype == np.uint8
        assert env.obs_kind == "image" and env.frame_skip == 4 and env.n_actions == 6
        assert env.action_names[:2] == ["NOOP", "FIRE"]
        assert env.preprocess_spec == {"kind": "image", "out_shape": [42, 42],
                                       "crop": list(ATARI_CROP)}
        assert env.repeat_action_probability == 0.25 and env.noop_max == 30
        spec = json.loads(json.dumps(env.spec()))
        assert spec["id"] == "ALE/Pong-v5" and spec["kind"] == "atari"
        obs = env.reset()
        assert obs.shape == (210, 160) and obs.dtype == np.uint8 and not obs.flags.writeable
        # no per-step allocation: outputs alternate between two preallocated buffers
        bufs = env._out
        for _ in range(4):
            obs = env.step(0)[0]
            assert any(np.shares_memory(obs, b) for b in bufs)
        assert env.render_frame().shape == (210, 160, 3)
    with make_env("PongNoFrameskip-v4", env_process=False) as env:
        assert env.repeat_action_probability == 0.0 and env.frame_skip == 4
    with make_env("atari:Pong", env_process=False, repeat_action_probability=0.1) as env:
        assert env.game == "pong" and env.repeat_action_probability == 0.1
    assert is_atari_id("ALE/Breakout-v5") and is_atari_id("BreakoutNoFrameskip-v4")
    assert not is_atari_id("CartPole-v1") and not is_atari_id("doom:basic")
    with pytest.raises(ValueError, match="Unknown Atari game 'Pongg'.*atari:pong"):
        make_env("atari:Pongg")
    with pytest.raises(ValueError, match="noop_max"):
        make_env("ALE/Pong-v5", env_process=False, noop_max=-1)


def test_noop_starts():
    with make_env("ALE/Pong-v5", seed=3, env_process=False) as env:
        draws = np.random.default_rng(3).integers(1, 31, size=8)
        frames = []
        for _ in range(8):
            env.reset()
            frames.append(env._ale.getEpisodeFrameNumber())  # no-op frames so far
        assert frames == draws.tolist() and len(set(frames)) > 1
    with make_env("ALE/Pong-v5", env_process=False, noop_max=0) as env:
        env.reset()
        assert env._ale.getEpisodeFrameNumber() == 0


def test_truncation_by_frame_limit():
    with make_env("ALE/Pong-v5", env_process=False, noop_max=0, max_episode_frames=100) as env:
        env.reset()
        steps = [env.step(0) for _ in range(25)]
        assert [s[3] for s in steps] == [False] * 24 + [True]
        assert not any(s[2] for s in steps) and env.episode_over
        assert env.episode_end == "truncated"


def test_life_loss_as_terminal_continues_the_game():
    actions = np.random.default_rng(0).integers(0, 4, size=20000).tolist()
    with make_env("ALE/Breakout-v5", seed=1, env_process=False,
                  terminal_on_life_loss=True) as env:
        env.reset()
        start_lives = env.lives()
        assert start_lives == 5
        life_losses, i = 0, 0
        while True:
            lives = env.lives()
            _, _, term, trunc = env.step(actions[i])
            i += 1
            if not (term or trunc):
                assert not env.episode_over and env.episode_end is None
                continue
            if env.episode_over:
                assert term and env._ale.game_over() and env.episode_end == "terminated"
                break
            # a mere life loss: terminal for learning, the game goes on
            assert term and env.lives() == lives - 1 and env.episode_end is None
            life_losses += 1
            frame = env._ale.getEpisodeFrameNumber()
            env.reset()
            assert not env.episode_over
            assert env.lives() == lives - 1  # not a new game ...
            assert env._ale.getEpisodeFrameNumber() == frame + env.frame_skip  # ... one no-op step
        assert life_losses == start_lives - 1
        env.reset()  # after game over: a real new game
        assert env.lives() == start_lives and env._ale.getEpisodeFrameNumber() <= 30
    with make_env("ALE/Breakout-v5", seed=1, env_process=False) as env:  # default: whole games
        env.reset()
        i, ends = 0, []
        while not ends:
            _, _, term, trunc = env.step(actions[i])
            i += 1
            if term or trunc:
                ends.append(env.episode_over)
        assert ends == [True] and env.lives() == 0
