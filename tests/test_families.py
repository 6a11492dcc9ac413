"""Env families are records: a new family is one record (and its adapter),
and `a3c train` trains it with the defaults the record declares."""
import json
import os

import numpy as np
import pytest

from a3c_core.cli import main
from a3c_core.envs import FAMILIES, family_of, make_env, register_family
from a3c_core.envs.base import VECTOR_PREPROCESS, Env
from a3c_core.envs.families import Defaults, EnvFamily, Tuning
from a3c_core.train.config import Config, ConfigError, resolve


class CoinEnv(Env):
    """Guess which of two lamps is lit: reward 1 for the lit one; 8 steps an episode."""

    obs_kind, obs_dtype, obs_shape, n_actions = "vector", np.float32, (2,), 2
    action_names = ["left", "right"]
    preprocess_spec = VECTOR_PREPROCESS

    def __init__(self, env_id, *, seed=0, frame_skip=1, runtime_dir=None, render=False, length=8):
        self.env_id, self.frame_skip, self.length = env_id, frame_skip, int(length)
        self.rng = np.random.default_rng(seed)

    def _obs(self):
        self.lit = int(self.rng.integers(2))
        return np.eye(2, dtype=np.float32)[self.lit]

    def reset(self):
        self.t, self.episode_over = 0, False
        return self._obs()

    def step(self, action):
        reward = float(action == self.lit)
        self.t += 1
        done = self.t >= self.length
        self.episode_over = done
        return self._obs(), reward, done, False


@pytest.fixture
def coin_family():
    fam = register_family(EnvFamily(
        name="coin", form="'coin:<n>'", matches=lambda env_id: env_id.startswith("coin:"),
        build=lambda env_id, **kw: CoinEnv(env_id, **kw),
        defaults=Defaults(frame_skip=1, truncation_bootstrap=False,
                          tuning={"mlp": Tuning(adam_lr=2e-3)}),
        scenarios={"long": {"reward_clip": 0.5}}))
    yield fam
    FAMILIES.remove(fam)


def test_a_registered_family_is_built_and_resolved_from_its_record(coin_family):
    assert family_of("coin:1") is coin_family and family_of("CartPole-v1").name == "gym"
    env = make_env("coin:1", seed=3)
    assert isinstance(env, CoinEnv) and env.frame_skip == 1
    r = resolve(Config(env="coin:1", spec="mlp"), env.obs_kind)
    assert (r.family, r.spec, r.lr, r.truncation_bootstrap) == ("coin", "mlp", 2e-3, False)
    assert resolve(Config(env="coin:1", spec="mlp", lr=1e-3), "vector").lr == 1e-3   # user wins
    assert resolve(Config(env="coin:long"), "vector").reward_clip == 0.5    # a scenario's own
    assert resolve(Config(env="coin:1"), "vector").reward_clip == 0.0


def test_a_registered_family_trains_through_a3c_train(coin_family, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--env", "coin:1", "--spec", "mlp", "--workers", "1", "--seed", "1",
                 "--total-steps", "3000", "--run-dir", str(run), "--quiet", "--no-tensorboard"])
    assert code == 0, capsys.readouterr().err
    with open(os.path.join(run, "summary.json")) as fh:
        summary = json.load(fh)
    assert summary["status"] == "done" and summary["steps"] >= 3000
    # 8 steps an episode: random play scores 4; the policy learned the lamp
    assert summary["long_avg"] > 5.0, summary


@pytest.mark.parametrize("env_id, kind, spec, family", [
    ("doom:basic", "image", "doom-lstm", "doom"), ("PongNoFrameskip-v4", "image", "atari-lstm", "atari"),
    ("CartPole-v1", "vector", "mlp-lstm", "gym"), ("gym:CarRacing-v3", "image", "doom-lstm", "gym")])
def test_the_shipped_records_pick_the_network_by_observation_kind(env_id, kind, spec, family):
    if family == "atari":           # ale-py registers PongNoFrameskip-v4
        pytest.importorskip("ale_py")
    r = resolve(Config(env=env_id), kind)
    assert (r.family, r.spec) == (family, spec)


def test_an_unknown_prefix_names_the_forms_of_every_family(coin_family):
    with pytest.raises(ValueError, match="coin:<n>"):
        make_env("dom:basic")
    pytest.importorskip("vizdoom")
    with pytest.raises(ConfigError, match="'env'.*Did you mean: doom:basic"):
        Config(env="dom:basic").family()
