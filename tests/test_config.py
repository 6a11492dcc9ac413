import pytest

from a3c_core.train.config import Config, ConfigError


def test_defaults_are_the_standard_workload():
    c = Config().validate()
    assert c.env == "doom:basic"
    assert (c.t_max, c.gamma, c.gae_lambda) == (20, 0.99, 1.0)
    assert (c.value_coef, c.effective_entropy_beta(), c.max_grad_norm) == (0.5, 0.01, 40.0)
    assert c.optimizer == "adam" and c.learning_rate() == pytest.approx(1e-4)
    assert Config(optimizer="rmsprop").learning_rate() == pytest.approx(7e-4)
    assert not c.bootstrap_truncated() and Config(env="CartPole-v1").bootstrap_truncated()
    assert (c.rmsprop_alpha, c.rmsprop_eps) == (0.99, 0.1)
    assert c.effective_reward_scale() == 0.01
    cp = Config(env="CartPole-v1")
    assert (cp.effective_reward_scale(), cp.effective_entropy_beta()) == (0.1, 0.001)
    assert Config(env="CartPole-v1", entropy_beta=0.02).effective_entropy_beta() == 0.02


@pytest.mark.parametrize(
    "field,value",
    [
        ("t_max", 0),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("optimizer", "adagrad"),
        ("spec", "resnet"),
        ("workers", -1),
        ("lr", -1e-3),
        ("max_grad_norm", -1.0),
        ("hidden", "64,abc"),
        ("hidden", "0"),
        ("frame_size", 20),
        ("reward_scale", 0.0),
        ("t_max", 2.5),
        ("quiet", "yes"),
        ("gamma", float("nan")),
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        Config(**{field: value}).validate()


def test_toml_round_trip_and_overrides(tmp_path):
    c = Config(env="CartPole-v1", lr=3e-4, workers=2, target_reward=475.0)
    p = tmp_path / "c.toml"
    p.write_text(c.to_toml())
    back = Config.from_toml(str(p))
    assert back == c
    assert back.replace(seed=3).seed == 3


def test_toml_errors(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("lr = 'fast'\n")
    with pytest.raises(ConfigError, match="'lr'"):
        Config.from_toml(str(p))
    p.write_text("learning_rate = 1e-3\n")
    with pytest.raises(ConfigError, match="unknown config field 'learning_rate'"):
        Config.from_toml(str(p))
    p.write_text("lr = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(str(p))
    with pytest.raises(ConfigError, match="not found"):
        Config.from_toml(str(tmp_path / "missing.toml"))
    p.write_text("[a3c]\nt_max = 5\nlr = 1\n")
    c = Config.from_toml(str(p))
    assert c.t_max == 5 and c.lr == 1.0


def test_lr_anneal_needs_total_steps():
    with pytest.raises(ConfigError, match="'lr_anneal'"):
        Config(lr_anneal=True, total_steps=0).validate()


def test_shipped_config_files_load():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "configs"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        Config.from_toml(str(f))
    assert Config.from_toml(str(root / "doom_basic.toml")) == Config().replace(
        spec="doom-lstm", reward_scale=0.01, frame_skip=4, lr=1e-4, entropy_beta=0.01)
