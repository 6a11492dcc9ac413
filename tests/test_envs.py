"""Env adapters against the real simulators (ViZDoom basic, Gymnasium classics)."""
import json
import os
import threading

import numpy as np
import pytest

from a3c_core.envs import Env, list_doom_scenarios, make_env

vizdoom = pytest.importorskip("vizdoom")
gymnasium = pytest.importorskip("gymnasium")

from a3c_core.envs.doom import _cfg_value, rgb_to_gray8  # noqa: E402

BASIC_CFG = os.path.join(vizdoom.scenarios_path, "basic.cfg")
MOVE_LEFT, MOVE_RIGHT, ATTACK = 0, 1, 2
# basic.wad's own rewards (ViZDoom docs, "Basic"): +101 for the kill, -5 per missed shot.
KILL_REWARD, MISS_PENALTY = 101.0, -5.0


def rollout(env, actions, episodes=1):
    """Run ``episodes`` episodes cycling through ``actions``; returns a list of
    (obs, reward, terminated, truncated) with the reset observations as rewards None."""
    out, i = [], 0
    for _ in range(episodes):
        out.append((env.reset().copy(), None, False, False))
        while True:
            obs, r, term, trunc = env.step(actions[i % len(actions)])
            i += 1
            out.append((obs.copy(), r, term, trunc))
            if term or trunc:
                break
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (oa, ra, ta, ua), (ob, rb, tb, ub) in zip(a, b):
        np.testing.assert_array_equal(oa, ob)
        assert (ra, ta, ua) == (rb, tb, ub)


# -- ViZDoom ------------------------------------------------------------------
@pytest.fixture(scope="module")
def basic():
    with make_env("doom:basic", seed=0) as env:
        yield env


def test_doom_basic_interface(basic):
    assert isinstance(basic, Env)
    assert basic.env_id == "doom:basic"
    assert basic.n_actions == 3
    assert basic.action_names == ["MOVE_LEFT", "MOVE_RIGHT", "ATTACK"]
    assert basic.frame_skip == 4
    assert basic.obs_shape == (120, 160) and basic.obs_dtype == np.uint8
    assert basic.obs_kind == "image"
    assert basic.preprocess_spec == {"kind": "image", "out_shape": [84, 84], "crop": None}
    obs = basic.reset()
    assert obs.shape == (120, 160) and obs.dtype == np.uint8 and obs.any()
    spec = json.loads(json.dumps(basic.spec()))
    assert spec["id"] == "doom:basic" and spec["frame_skip"] == 4
    assert spec["action_names"] == basic.action_names and spec["obs_shape"] == [120, 160]
    assert spec["obs_dtype"] == "uint8" and spec["obs_kind"] == "image"


def test_doom_basic_timeout_is_truncated_with_raw_living_reward(basic):
    living = float(_cfg_value(BASIC_CFG, "living_reward"))
    timeout = int(_cfg_value(BASIC_CFG, "episode_timeout"))
    assert (living, timeout) == (-1.0, 300)
    steps = rollout(basic, [MOVE_LEFT, MOVE_RIGHT])[1:]
    assert len(steps) == timeout // basic.frame_skip
    assert all(r == living * basic.frame_skip for _, r, _, _ in steps)  # raw, unscaled
    assert sum(r for _, r, _, _ in steps) == living * timeout
    obs, _, terminated, truncated = steps[-1]
    assert truncated and not terminated
    assert not any(t or u for _, _, t, u in steps[:-1])
    # no frame exists after the end: truncation returns the last frame seen (to bootstrap from)
    assert obs.shape == (120, 160) and obs.any()
    np.testing.assert_array_equal(obs, steps[-2][0])


def test_doom_basic_kill_is_terminated_and_misses_are_penalized():
    with make_env("doom:basic", seed=0) as env:
        steps = rollout(env, [ATTACK], episodes=12)
    living = -1.0 * env.frame_skip
    rewards = [r for _, r, _, _ in steps if r is not None]
    ends = [(r, t, u) for _, r, t, u in steps if t or u]
    kills = [r for r, t, u in ends if t]
    assert kills, "seed 0 kills the monster in some of 12 ATTACK-only episodes"
    # The kill ends the episode inside the frame skip: +101 minus 0..3 living tics.
    assert all(KILL_REWARD + living <= r < KILL_REWARD for r in kills)
    assert all(not u for r, t, u in ends if t)
    assert set(rewards) - set(kills) == {living, MISS_PENALTY + living}


def test_doom_episode_end_names_the_kill_the_timeout_and_the_death():
    """basic with ATTACK only: a kill ends the episode alive (terminated), a
    miss runs to the timeout (truncated); deadly_corridor walking forward into
    the fire: the player dies (terminated). None while an episode runs."""
    with make_env("doom:basic", seed=0) as env:
        seen = []
        for _ in range(12):
            env.reset()
            assert env.episode_end is None
            while True:
                _, _, term, trunc = env.step(ATTACK)
                if term or trunc:
                    break
                assert env.episode_end is None
            assert env.episode_end == ("ended alive" if term else "timed out")
            seen.append(env.episode_end)
        assert set(seen) == {"ended alive", "timed out"}, seen
    with make_env("doom:deadly_corridor", seed=0, action_set="buttons") as env:
        forward = env.action_names.index("MOVE_FORWARD")
        env.reset()
        while True:
            _, _, term, trunc = env.step(forward)
            if term or trunc:
                break
        assert term and not trunc and env.episode_end == "died"
        env.reset()
        assert env.episode_end is None


def test_doom_seed_makes_episodes_reproducible():
    actions = np.random.default_rng(7).integers(0, 3, size=97).tolist()
    runs = []
    for _ in range(2):
        with make_env("doom:basic", seed=123) as env:
            runs.append(rollout(env, actions, episodes=3))
    assert_same(*runs)


def test_doom_render_frames_and_identical_gray_obs():
    actions = [MOVE_RIGHT, ATTACK, MOVE_LEFT, MOVE_LEFT]
    with make_env("doom:basic", seed=5) as env:
        plain = rollout(env, actions)
        with pytest.raises(RuntimeError, match="render=True"):
            env.render_frame()
    with make_env("doom:basic", seed=5, render=True) as env:
        obs = env.reset()
        frame = env.render_frame()
        assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8
        assert frame.std(axis=2).max() > 0  # colour, not gray
        np.testing.assert_array_equal(rgb_to_gray8(frame), obs)
    with make_env("doom:basic", seed=5, render=True) as env:
        rendered = rollout(env, actions)
    assert_same(plain, rendered)


def test_doom_runtime_files_never_in_cwd(tmp_path, monkeypatch):
    cwd, run_dir = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with make_env("doom:basic", seed=0, runtime_dir=run_dir) as env:
        env.reset()
        env.step(ATTACK)
        (private,) = (run_dir / "vizdoom").iterdir()
        assert (private / "_vizdoom").is_dir()  # the engine's own folder went here
        assert os.listdir(cwd) == []
    assert os.listdir(cwd) == []
    assert os.listdir(run_dir) == []  # private dir removed on close
    with make_env("doom:basic", seed=0) as env:  # no run dir: a temp dir
        env.reset()
    assert os.listdir(cwd) == []


def test_doom_missing_cfg_and_unknown_scenario(tmp_path):
    missing = tmp_path / "nowhere" / "my.cfg"
    with pytest.raises(FileNotFoundError, match="my.cfg"):
        make_env(f"doom:{missing}")
    with pytest.raises(ValueError, match="Unknown ViZDoom scenario 'basci'") as info:
        make_env("doom:basci")
    msg = str(info.value)
    assert "doom:basic" in msg and "defend_the_center" in msg and "gym:" in msg


def test_doom_scenarios_listed():
    names = list_doom_scenarios()
    for name in ["basic", "defend_the_center", "defend_the_line", "health_gathering",
                 "health_gathering_supreme", "deadly_corridor", "my_way_home",
                 "predict_position", "take_cover", "rocket_basic", "simpler_basic"]:
        assert name in names


def test_doom_cfg_path_form(tmp_path):
    with make_env(f"doom:{BASIC_CFG}", frame_skip=2) as env:
        assert env.env_id == f"doom:{BASIC_CFG}" and env.frame_skip == 2
        env.reset()
        assert env.step(MOVE_LEFT)[1] == -2.0
    with pytest.raises(ValueError, match="frame_skip"):
        make_env("doom:basic", frame_skip=0)


def test_doom_two_envs_in_two_threads():
    actions = np.random.default_rng(3).integers(0, 3, size=150).tolist()
    results, errors = [None, None], []

    def work(i):
        try:
            with make_env("doom:basic", seed=11) as env:  # inits race on purpose
                results[i] = rollout(env, actions, episodes=2)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert_same(*results)


def _unshaped_play(env_id, seed, actions, variables):
    """Play ``actions`` (to the episode's end) in an env without shaping: the
    step rewards, and each named game variable's change per step, as arrays
    read from the game directly (the reference for the shaped env)."""
    var = [getattr(vizdoom.GameVariable, v) for v in variables]
    rewards, changes = [], []
    with make_env(env_id, seed=seed) as plain:
        plain.reset()
        game = plain._game
        before = [game.get_game_variable(v) for v in var]
        for act in actions:
            _, r, term, trunc = plain.step(act)
            after = [game.get_game_variable(v) for v in var]
            rewards.append(r)
            changes.append(np.subtract(after, before))
            before = after
            if term or trunc:
                break
    return np.array(rewards), list(np.array(changes).T)


@pytest.mark.parametrize("env_process", [False, True])
def test_doom_health_reward_adds_the_health_change_and_keeps_its_sum(env_process):
    """health_gathering, same seed and actions with and without the shaping:
    each step's reward differs by exactly health_reward x the HEALTH change
    (medkits +, acid and death -), and episode_shaping is their sum."""
    actions = np.random.default_rng(0).integers(0, 3, 400).tolist()
    ra, (d,) = _unshaped_play("doom:health_gathering", 5, actions, ["HEALTH"])
    with make_env("doom:health_gathering", seed=5, health_reward=2.0,
                  env_process=env_process) as shaped:
        b = rollout(shaped, actions)
        sh = shaped.episode_shaping
    rb = np.array([r for _, r, _, _ in b[1:]])
    assert len(ra) == len(rb) == len(d)
    assert (d > 0).any() and (d < 0).any()        # a medkit and the acid both seen
    np.testing.assert_array_equal(rb - ra, 2.0 * d)
    assert sh == 2.0 * d.sum()
    with pytest.raises(ValueError, match="health_reward"):
        make_env("doom:basic", health_reward=float("nan"))


@pytest.mark.parametrize("env_process", [False, True])
def test_doom_ammo_reward_charges_each_shot_and_adds_to_the_health_term(env_process):
    """defend_the_center, same seed and actions with and without the shaping:
    each step's reward differs by exactly ammo_reward x the change in the
    selected weapon's ammo (one round per pistol shot) plus health_reward x
    the HEALTH change, and episode_shaping is their sum."""
    actions = np.random.default_rng(1).integers(0, 3, 600).tolist()
    ra, (da, dh) = _unshaped_play("doom:defend_the_center", 3, actions, ["AMMO2", "HEALTH"])
    with make_env("doom:defend_the_center", seed=3, ammo_reward=0.25, health_reward=0.5,
                  env_process=env_process) as shaped:
        b = rollout(shaped, actions)
        sh = shaped.episode_shaping
    rb = np.array([r for _, r, _, _ in b[1:]])
    assert len(ra) == len(rb) == len(da)
    assert set(np.unique(da)) == {-1.0, 0.0}         # shots seen, one round each
    assert (dh < 0).any()                            # and hits taken
    np.testing.assert_allclose(rb - ra, 0.25 * da + 0.5 * dh, rtol=0, atol=1e-12)
    assert sh == pytest.approx(0.25 * da.sum() + 0.5 * dh.sum(), abs=1e-9)
    with pytest.raises(ValueError, match="ammo_reward"):
        make_env("doom:basic", ammo_reward="lots")


def test_doom_ammo_reward_skips_a_weapon_switch_and_still_charges_shots():
    """deathmatch holds a pistol (50 rounds) and a fist (no ammo):
    SELECTED_WEAPON_AMMO jumps by 50 each way on a switch, which is no shot;
    the ammo term adds nothing on those steps and still charges each round."""
    with make_env("doom:deathmatch", seed=0, ammo_reward=1.0) as env:
        names, game = env.action_names, env._game
        env.reset()
        ammo = game.get_game_variable(vizdoom.GameVariable.SELECTED_WEAPON_AMMO)
        assert ammo > 0
        plan = ["SELECT_WEAPON1"] * 3 + ["MOVE_FORWARD"] * 3 + ["SELECT_WEAPON2"] * 3 \
            + ["MOVE_FORWARD"] * 3
        weapons, shaping = [], []
        for a in plan:
            _, r, term, trunc = env.step(names.index(a))
            assert not (term or trunc)
            weapons.append(game.get_game_variable(vizdoom.GameVariable.SELECTED_WEAPON))
            shaping.append(env.episode_shaping)
        assert 1.0 in weapons and weapons[-1] == 2.0            # to the fist and back
        assert shaping == [0.0] * len(plan)                     # not -50, then +50
        for _ in range(4):
            env.step(names.index("ATTACK"))
        spent = ammo - game.get_game_variable(vizdoom.GameVariable.SELECTED_WEAPON_AMMO)
        assert spent >= 1
        assert env.episode_shaping == -spent


def test_button_combos_press_at_most_one_of_each_exclusive_pair():
    from a3c_core.envs.doom import button_combos

    dtl = button_combos(["TURN_LEFT", "TURN_RIGHT", "ATTACK"])
    assert dtl == [(), ("ATTACK",), ("TURN_LEFT",), ("TURN_LEFT", "ATTACK"),
                   ("TURN_RIGHT",), ("TURN_RIGHT", "ATTACK")]
    corridor = ["MOVE_LEFT", "MOVE_RIGHT", "ATTACK", "MOVE_FORWARD", "MOVE_BACKWARD",
                "TURN_LEFT", "TURN_RIGHT"]
    combos = button_combos(corridor)
    assert len(combos) == 3 * 2 * 3 * 3 == len(set(combos))
    for pair in (("TURN_LEFT", "TURN_RIGHT"), ("MOVE_FORWARD", "MOVE_BACKWARD"),
                 ("MOVE_LEFT", "MOVE_RIGHT")):
        assert not any(set(pair) <= set(c) for c in combos)
    assert len(button_combos(["TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD", "MOVE_LEFT",
                              "MOVE_RIGHT"])) == 18            # my_way_home: no backward button


def test_delta_buttons_press_each_way_in_both_action_sets():
    from a3c_core.envs.doom import button_combos, button_presses, button_vector

    buttons = ["ATTACK", "LOOK_UP_DOWN_DELTA", "TURN_LEFT"]
    assert button_presses(buttons) == ["ATTACK", "LOOK_UP_DOWN_DELTA+", "LOOK_UP_DOWN_DELTA-",
                                       "TURN_LEFT"]
    assert [button_vector(buttons, (p,)) for p in button_presses(buttons)] == [
        [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]
    combos = button_combos(buttons)
    assert len(combos) == 2 * 3 * 2 == len(set(combos))         # the axis: none, +, -
    assert not any({"LOOK_UP_DOWN_DELTA+", "LOOK_UP_DOWN_DELTA-"} <= set(c) for c in combos)
    assert button_vector(buttons, ("ATTACK", "LOOK_UP_DOWN_DELTA-")) == [1.0, -1.0, 0.0]


def test_doom_deathmatch_tilts_the_view_back_with_its_delta_buttons_minus_press():
    """deathmatch.cfg declares LOOK_UP_DOWN_DELTA: pressed only at +1 the view
    pitched one way for good; its '-' action undoes its '+' action."""
    with make_env("doom:deathmatch", seed=0) as env:
        names = env.action_names
        assert env.n_actions == 20 + 3 and len(set(names)) == env.n_actions
        up, down = names.index("LOOK_UP_DOWN_DELTA+"), names.index("LOOK_UP_DOWN_DELTA-")
        env.reset()
        game, pitch = env._game, vizdoom.GameVariable.PITCH
        p0 = game.get_game_variable(pitch)
        for _ in range(3):
            env.step(up)
        p1 = game.get_game_variable(pitch)
        for _ in range(3):
            env.step(down)
        assert abs(p1 - p0) > 5                         # degrees
        # back to within the engine's angle rounding
        assert game.get_game_variable(pitch) == pytest.approx(p0, abs=0.2)


def test_doom_combos_replay_the_single_buttons_exactly_and_name_their_set():
    """defend_the_line with action_set="combos": the combination holding one
    button plays exactly as that button's action of the shipped set (same
    seed: same frames and rewards); the spec records the set and make_env
    rebuilds it from there."""
    actions = np.random.default_rng(2).integers(0, 3, 300).tolist()
    with make_env("doom:defend_the_line", seed=4) as shipped:
        a = rollout(shipped, actions)
        names = list(shipped.action_names)
        assert shipped.spec()["action_set"] == "buttons"
    with make_env("doom:defend_the_line", seed=4, action_set="combos") as combos:
        assert combos.n_actions == 6 and combos.action_names[0] == "NOOP"
        index = [combos.action_names.index(n) for n in names]
        b = rollout(combos, [index[x] for x in actions])
        spec = combos.spec()
    assert spec["action_set"] == "combos" and spec["n_actions"] == 6
    assert_same(a, b)
    with make_env(spec["id"], action_set=spec["action_set"], env_process=True) as again:
        assert list(again.action_names) == spec["action_names"]
    with pytest.raises(ValueError, match="action_set must be one of buttons, combos"):
        make_env("doom:basic", action_set="all")


def test_doom_band_view_feeds_the_horizon_rows_at_full_width():
    """view="band": the same screen, preprocessed from its rows 30-89 at all
    160 columns to 42x160 (the numpy area resize of that crop), where "full"
    resizes the whole frame to 84x84; the spec records the view and
    make_env rebuilds it from there."""
    from a3c_core.core.ref import ref_preprocess
    from a3c_core.obs import ObsPipeline

    with make_env("doom:defend_the_line", seed=1, view="band") as band, \
            make_env("doom:defend_the_line", seed=1) as full:
        assert full.view == "full" and full.preprocess_spec["out_shape"] == [84, 84]
        assert full.preprocess_spec["crop"] is None
        assert band.preprocess_spec["out_shape"] == [42, 160]
        assert band.preprocess_spec["crop"] == [30, 30, 0, 0]
        frame = band.reset()
        np.testing.assert_array_equal(frame, full.reset())    # the screen is the same
        pipe = ObsPipeline(band.preprocess_spec, band.obs_shape)
        assert pipe.net_obs_shape == (1, 42, 160)
        x = pipe(frame)
        np.testing.assert_allclose(x.reshape(42, 160), ref_preprocess(frame, (42, 160), (30, 30, 0, 0)),
                                   atol=2e-6)
        # the rows cut off do not reach the input
        other = frame.copy()
        other[:30] = 255 - other[:30]
        other[90:] = 0
        np.testing.assert_array_equal(pipe(other), x)
        spec = band.spec()
    assert spec["view"] == "band"
    with make_env(spec["id"], view=spec["view"], env_process=True) as again:
        assert again.preprocess_spec == spec["preprocess"]
    with pytest.raises(ValueError, match="view must be one of full, band"):
        make_env("doom:basic", view="wide")


def test_action_out_of_range(basic):
    basic.reset()
    with pytest.raises(ValueError, match="range\\(3\\)"):
        basic.step(3)


# -- Gymnasium ---------------------------------------------------------------
def test_cartpole_vector_obs_and_seed():
    with make_env("CartPole-v1", seed=4) as env:
        assert env.env_id == "gym:CartPole-v1"
        assert env.n_actions == 2 and len(env.action_names) == 2
        assert env.obs_kind == "vector" and env.obs_shape == (4,)
        assert env.obs_dtype == np.float32
        assert env.preprocess_spec == {"kind": "vector"}
        json.dumps(env.spec())
        obs = env.reset()
        assert obs.shape == (4,) and obs.dtype == np.float32
    actions = np.random.default_rng(0).integers(0, 2, size=300).tolist()
    runs = []
    for _ in range(2):
        with make_env("gym:CartPole-v1", seed=4) as env:
            runs.append(rollout(env, actions, episodes=3))
    assert_same(*runs)


def test_gym_truncation_passes_through():
    with make_env("CartPole-v1", seed=0, max_episode_steps=5) as env:
        steps = rollout(env, [0, 1])[1:]
    assert len(steps) == 5 and steps[-1][3] and not steps[-1][2]
    with make_env("CartPole-v1", seed=0, max_episode_steps=5) as env:
        env.reset()
        for _ in range(4):
            assert env.step(0)[2:] == (False, False) and env.episode_end is None
        # the pole falls on the time limit's own step: Gymnasium sets both flags,
        # and the end is the fall, so a 500-step CartPole episode can be "terminated"
        env._env.unwrapped.state = np.array([0.0, 0.0, 0.2, 2.0])
        assert env.step(1)[2:] == (True, True) and env.episode_end == "terminated"


def test_gym_continuous_actions_rejected():
    with pytest.raises(ValueError, match="only Discrete action spaces.*Box"):
        make_env("Pendulum-v1")


def test_unknown_ids():
    with pytest.raises(ValueError) as info:
        make_env("CartPol-v1")
    msg = str(info.value)
    assert "CartPole-v1" in msg and "doom:<scenario>" in msg and "basic" in msg
    with pytest.raises(ValueError, match="Did you mean: doom:basic"):
        make_env("dom:basic")
    with pytest.raises(ValueError, match="Unknown env id 'gym:NoSuchEnv-v0'"):
        make_env("gym:NoSuchEnv-v0")


# -- bugs: missing .wad, module:Env-v0 ids; episode_over --------------------
def test_doom_cfg_naming_a_missing_wad(tmp_path):
    cfg = tmp_path / "mine.cfg"
    cfg.write_text("doom_scenario_path = maps/nothere.wad\navailable_buttons = { ATTACK }\n")
    with pytest.raises(FileNotFoundError, match="nothere.wad") as info:
        make_env(f"doom:{cfg}")
    assert str(tmp_path / "maps" / "nothere.wad") in str(info.value)


def test_gym_module_colon_id_form():
    with make_env("gymnasium.envs.classic_control:CartPole-v1", seed=2) as env:
        assert env.env_id == "gym:gymnasium.envs.classic_control:CartPole-v1"
        assert env.n_actions == 2 and env.reset().shape == (4,)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        make_env("gym:no_such_module_xyz:CartPole-v1")
    with pytest.raises(ValueError, match="only Discrete action spaces.*Box"):
        make_env("gymnasium.envs.classic_control:Pendulum-v1")


def test_episode_over_marks_episode_ends(basic):
    cartpole = make_env("CartPole-v1", seed=0, max_episode_steps=8)
    for env in (basic, cartpole):
        env.reset()
        flags = []
        while True:
            _, _, term, trunc = env.step(0)
            flags.append((term or trunc, env.episode_over))
            if term or trunc:
                break
        assert flags[-1] == (True, True) and all(not o for _, o in flags[:-1])
        env.reset()
        assert not env.episode_over
    cartpole.close()
    assert Env.episode_over is True  # base default for adapters that do not track it


def test_doom_recycled_engine_plays_as_a_new_engine_with_the_next_seed(tmp_path):
    """After ``recycle_episodes`` episodes the next reset starts a new engine seeded
    with ``engine_seed(seed, 1)``: its episodes are those of a fresh env with
    that seed, the old engine is gone, and close leaves no process or file."""
    from a3c_core.envs.doom import DoomEnv, engine_seed
    from proc_util import alive

    actions = [MOVE_RIGHT, ATTACK, MOVE_LEFT, ATTACK, ATTACK]
    env = DoomEnv("basic", seed=123, runtime_dir=tmp_path, recycle_episodes=2)
    first_pid = env.engine_pid
    before = rollout(env, actions, episodes=2)
    assert env.engine_generation == 0 and env.engine_pid == first_pid
    after = rollout(env, actions, episodes=2)
    assert env.engine_generation == 1 and env.engine_pid != first_pid
    assert first_pid is not None and not alive([first_pid])
    second_pid = env.engine_pid
    env.close()
    assert not alive([second_pid]) and os.listdir(tmp_path) == []

    with DoomEnv("basic", seed=123, recycle_episodes=0) as ref:
        assert_same(before, rollout(ref, actions, episodes=2))
    assert engine_seed(123, 0) == 123 and engine_seed(123, 1) != engine_seed(123, 2)
    with DoomEnv("basic", seed=engine_seed(123, 1), recycle_episodes=0) as ref:
        assert_same(after, rollout(ref, actions, episodes=2))


def test_doom_recycle_episodes_must_not_be_negative():
    from a3c_core.envs.doom import DoomEnv

    with pytest.raises(ValueError, match="recycle_episodes"):
        DoomEnv("basic", recycle_episodes=-1)
