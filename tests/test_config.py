import pytest

from a3c_core.train.config import Config, ConfigError


def test_defaults_are_the_standard_workload():
    c = Config().validate()
    assert c.env == "doom:basic"
    assert (c.t_max, c.gamma, c.gae_lambda) == (20, 0.99, 1.0)
    assert (c.value_coef, c.entropy_beta, c.max_grad_norm) == (0.5, 0.01, 40.0)
    assert c.optimizer == "adam" and c.learning_rate() == pytest.approx(1e-4)
    assert Config(optimizer="rmsprop").learning_rate() == pytest.approx(7e-4)
    # Adam on the vector specs: 3e-4 (bench/RESULTS.md); an explicit lr always wins
    assert c.learning_rate("doom-lstm") == pytest.approx(1e-4)
    assert c.learning_rate("atari-lstm") == pytest.approx(1e-4)
    assert c.learning_rate("mlp-lstm") == pytest.approx(3e-4)
    assert c.learning_rate("mlp") == pytest.approx(3e-4)
    assert Config(lr=5e-5).learning_rate("mlp-lstm") == pytest.approx(5e-5)
    assert Config(optimizer="rmsprop").learning_rate("mlp-lstm") == pytest.approx(7e-4)
    # AMSGrad: on for the vector specs unless set
    assert c.adam_amsgrad is None
    assert c.amsgrad("mlp-lstm") and c.amsgrad("mlp")
    assert not c.amsgrad("doom-lstm") and not c.amsgrad("atari-lstm")
    assert not Config(adam_amsgrad=False).amsgrad("mlp-lstm")
    assert Config(adam_amsgrad=True).amsgrad("doom-lstm")
    # the anneal: on for Adam on doom-lstm, over its own 1M steps to a tenth
    assert c.lr_anneal is None and (c.lr_anneal_steps, c.lr_anneal_floor) == (1_000_000, 0.1)
    assert c.anneals("doom-lstm") and c.anneal_horizon("doom-lstm") == 1_000_000
    assert not c.anneals("doom-ff") and not c.anneals("atari-lstm") and not c.anneals("mlp-lstm")
    assert c.anneal_horizon("mlp-lstm") == 0
    assert Config(total_steps=0).anneal_horizon("doom-lstm") == 1_000_000  # not the budget
    assert Config(total_steps=5000, lr_anneal_steps=0).anneal_horizon("doom-lstm") == 5000
    assert not Config(optimizer="rmsprop").anneals("doom-lstm")
    assert not Config(lr_anneal=False).anneals("doom-lstm")
    assert Config(lr_anneal=True).anneals("mlp-lstm")
    # one source of truth for optimizer defaults: the optimizer classes
    from a3c_core.core.optim import SGD

    assert Config(optimizer="sgd").learning_rate() == SGD(4).lr
    assert not c.bootstrap_truncated() and Config(env="CartPole-v1").bootstrap_truncated()
    assert (c.rmsprop_alpha, c.rmsprop_eps) == (0.99, 0.1)
    assert c.reward_scale is None  # normalized by the running return std
    assert c.effective_reward_clip() == 0.0
    for atari in ("ALE/Pong-v5", "PongNoFrameskip-v4", "gym:BreakoutNoFrameskip-v4"):
        a = Config(env=atari)
        assert a.is_atari() and a.effective_reward_clip() == 1.0 and a.bootstrap_truncated()
        assert not a.advantages_normalized()
        assert Config(env=atari, normalize_advantages=True).advantages_normalized()
    assert not Config(env="CartPole-v1").is_atari()
    # advantages are normalized by default for doom and gymnasium envs, not Atari
    assert c.advantages_normalized() and Config(env="CartPole-v1").advantages_normalized()
    assert not Config(normalize_advantages=False).advantages_normalized()


def test_net_kwargs_honour_or_reject_spec_fields():
    assert Config(hidden="32,16").net_kwargs("mlp-lstm") == {"hidden": (32, 16)}
    assert Config(lstm_size=128).net_kwargs("doom-lstm") == {"lstm_size": 128}
    assert Config().net_kwargs("doom-lstm") == {}
    with pytest.raises(ConfigError, match="'hidden'"):
        Config(hidden="64").net_kwargs("doom-lstm")
    with pytest.raises(ConfigError, match="'lstm_size'"):
        Config(lstm_size=32).net_kwargs("mlp")


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
        ("adam_clip_relative", -1.0),
        ("adam_clip_relative", float("nan")),
        ("hidden", "64,abc"),
        ("hidden", "0"),
        ("hidden", "64,0"),
        ("frame_size", 4),
        ("frame_size", 100000),
        ("reward_scale", 0.0),
        ("t_max", 2.5),
        ("t_max", 100_000_000),
        ("quiet", "yes"),
        ("gamma", float("nan")),
        ("workers", 1000),
        ("log_interval", float("inf")),
        ("reward_scale", float("inf")),
        ("entropy_beta", float("inf")),
        ("value_coef", float("inf")),
        ("max_grad_norm", float("nan")),
        ("total_seconds", float("-inf")),
        ("target_reward", float("inf")),
        ("lr", 2.0),
        ("seed", -1),
        ("seed", 2**40),
        ("noop_max", -1),
        ("repeat_action_probability", 1.5),
        ("checkpoint_interval", -5.0),
        ("reward_window", 0),
        ("lstm_size", 0),
        ("env", " "),
        ("max_skipped_updates", -1),
        ("min_rollout", -1),
        ("min_rollout", 21),          # > t_max (20)
        ("min_rollout", 2.5),
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


def test_lr_anneal_over_total_steps_needs_total_steps():
    with pytest.raises(ConfigError, match="'lr_anneal'.*--lr-anneal-steps or --total-steps"):
        Config(lr_anneal=True, lr_anneal_steps=0, total_steps=0).validate()
    # its own horizon needs no budget
    Config(lr_anneal=True, total_steps=0).validate()
    Config(total_steps=0, lr_anneal_steps=0).validate()   # default (unset): no error
    for field, bad in (("lr_anneal_floor", 1.5), ("lr_anneal_floor", -0.1), ("lr_anneal_steps", -1)):
        with pytest.raises(ConfigError, match=f"'{field}'"):
            Config(**{field: bad}).validate()


def test_shipped_config_files_load():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "configs"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        Config.from_toml(str(f))
    basic = Config.from_toml(str(root / "doom_basic.toml"))
    assert basic == Config().replace(spec="doom-lstm", frame_skip=4, lr=1e-4, lr_anneal=True,
                                     obs_norm=True)
    assert basic.obs_normalized() == Config().obs_normalized() is True
    assert basic.effective_merge_below() == Config().effective_merge_below()
    # "the defaults, spelled out": the same optimizer as an unset config's
    for name in ("learning_rate", "amsgrad", "anneals", "anneal_horizon"):
        assert getattr(basic, name)("doom-lstm") == getattr(Config(), name)("doom-lstm"), name
    pong = Config.from_toml(str(root / "pong.toml"))
    assert (pong.env, pong.repeat_action_probability, pong.total_seconds) == ("ALE/Pong-v5", 0.0, 3600.0)


def test_obs_norm_default_is_on_for_doom_and_atari_images_only():
    assert Config(env="doom:basic").obs_normalized()
    assert Config(env="ALE/Pong-v5").obs_normalized()
    assert Config(env="PongNoFrameskip-v4").obs_normalized()
    assert not Config(env="CartPole-v1").obs_normalized()
    assert not Config(env="ALE/Pong-v5", obs_norm=False).obs_normalized()
    assert Config(env="CartPole-v1", obs_norm=True).obs_normalized()


def test_min_rollout_default_is_the_papers_rollouts_and_cross_episode_overrides_it():
    assert Config().effective_min_rollout() == 0               # the A3C paper's rollouts
    assert Config(min_rollout=7).effective_min_rollout() == 7
    assert Config(cross_episode=True, min_rollout=3).effective_min_rollout() == 20
    assert Config(t_max=5, cross_episode=True).effective_min_rollout() == 5


def test_trainer_settings_carry_the_effective_min_rollout():
    from a3c_core.train.trainer import Trainer

    for cfg, want in ((Config(), 0), (Config(min_rollout=10), 10), (Config(cross_episode=True), 20)):
        t = Trainer.__new__(Trainer)        # _settings reads only the config and n_actions
        t.cfg, t.n_actions = cfg, 3
        s = t._settings()
        assert s.min_steps == want and s.t_max == 20


def test_merge_below_applies_only_with_the_papers_rollouts():
    assert Config().merge_below == 8.0 and Config().effective_merge_below() == 8.0
    assert Config().runs_across_episodes()           # the warm-up compiles the reset variant
    assert Config(min_rollout=1).effective_merge_below() == 8.0   # 1 is the paper's rollouts
    assert Config(min_rollout=10).effective_merge_below() == 0.0
    assert Config(cross_episode=True).effective_merge_below() == 0.0
    assert not Config(merge_below=0.0).runs_across_episodes()
    with pytest.raises(ConfigError, match="merge_below"):
        Config(merge_below=-1.0).validate()
    from a3c_core.train.trainer import Trainer

    for cfg, want in ((Config(), 8.0), (Config(merge_below=0), 0.0), (Config(min_rollout=10), 0.0)):
        t = Trainer.__new__(Trainer)
        t.cfg, t.n_actions = cfg, 3
        assert t._settings().merge_below == want


def test_a_run_saved_before_merge_below_keeps_the_papers_rollouts(tmp_path):
    old = tmp_path / "config.toml"
    old.write_text('env = "doom:basic"\nmin_rollout = 0\n')
    assert Config.from_toml(str(old), saved_run=True).merge_below == 0.0
    assert Config.from_toml(str(old)).merge_below == 8.0        # a new run's file: the default
    new = tmp_path / "new.toml"
    new.write_text(Config(merge_below=6.5).to_toml())
    assert Config.from_toml(str(new), saved_run=True).merge_below == 6.5


def test_a_run_saved_before_the_anneal_horizon_keeps_its_schedule_on_resume(tmp_path):
    """A config.toml written before lr_anneal_steps existed meant --lr-anneal
    over total_steps to 0: resuming it keeps that; a new config's lr_anneal
    uses the new fields' defaults, and an old run without the anneal stays off."""
    old = tmp_path / "config.toml"
    old.write_text('env = "CartPole-v1"\nlr_anneal = true\ntotal_steps = 5000000\n')
    c = Config.from_toml(str(old), saved_run=True)
    assert (c.lr_anneal_steps, c.lr_anneal_floor) == (0, 0.0)
    assert c.anneal_horizon("mlp-lstm") == 5_000_000
    fresh = Config.from_toml(str(old))                      # a user's config file
    assert (fresh.lr_anneal_steps, fresh.lr_anneal_floor) == (1_000_000, 0.1)
    new = tmp_path / "new.toml"
    new.write_text('lr_anneal = true\nlr_anneal_steps = 2000\nlr_anneal_floor = 0.5\n')
    c2 = Config.from_toml(str(new), saved_run=True)
    assert (c2.lr_anneal_steps, c2.lr_anneal_floor) == (2000, 0.5)
    off = tmp_path / "off.toml"
    off.write_text("lr_anneal = false\n")
    assert not Config.from_toml(str(off), saved_run=True).anneals("doom-lstm")
