import importlib.util

import pytest

from a3c_core.train.config import (REMOVED_FIELDS, rollout_defaults, SAVED_RUN_DEFAULTS, Config, ConfigError,
                                   removed_flag, resolve)

#: ale-py registers the Atari ids of gymnasium's form (PongNoFrameskip-v4);
#: without it such an id is a plain gymnasium one
HAS_ALE = importlib.util.find_spec("ale_py") is not None


def _r(obs_kind="image", **kw):
    """The resolved settings of ``Config(**kw)``."""
    return resolve(Config(**kw).validate(), obs_kind)


def test_defaults_are_the_standard_workload():
    c = Config().validate()
    assert c.env == "doom:basic"
    assert (c.t_max, c.envs_per_worker, c.gamma, c.gae_lambda) == (None, None, 0.99, None)
    assert (c.value_coef, c.max_grad_norm) == (0.5, 40.0)
    # the paper's worker by default; the batched worker's t_max and Adam rate
    d = rollout_defaults(c)
    assert (d.envs_per_worker, d.t_max) == (1, 20)
    assert resolve(c).lr == pytest.approx(1e-4)
    assert rollout_defaults(c.replace(envs_per_worker=4)).t_max == 5
    assert _r(envs_per_worker=8).lr == pytest.approx(2e-4)              # 40 rows: 2x
    # the paper's worker where K = 1 is asked for, or on other scenarios
    p1 = rollout_defaults(c.replace(envs_per_worker=1))
    assert (p1.envs_per_worker, p1.t_max) == (1, 20)
    assert _r(envs_per_worker=1).lr == pytest.approx(1e-4)
    mw = rollout_defaults(c.replace(env="doom:my_way_home"))
    assert (mw.envs_per_worker, mw.t_max) == (1, 20)
    assert _r(envs_per_worker=4, t_max=10).lr == pytest.approx(2e-4)     # 40 rows / 20
    assert _r(envs_per_worker=4, t_max=5).lr == pytest.approx(1e-4)      # 20 rows: 1x
    c = c.replace(envs_per_worker=1)
    r = resolve(c)
    assert r.entropy_beta == 0.01 and c.entropy_beta is None     # the family's
    assert r.gae_lambda == 1.0                                    # the family's
    assert (r.family, r.spec) == ("doom", "doom-lstm")
    assert r.lr == pytest.approx(1e-4)
    assert c.reward_scale is None  # normalized by the running return std
    assert c.adam_amsgrad is None and c.lr_anneal is None and c.truncation_bootstrap is None
    assert (c.lr_anneal_steps, c.lr_anneal_floor) == (1_000_000, 0.1)


def test_resolve_learning_rate_per_family_and_spec():
    # Adam: 1e-4 on doom and Atari, 3e-4 on the vector specs (docs/defaults.md);
    # an explicit lr always wins
    assert _r().lr == pytest.approx(1e-4)
    assert _r(spec="doom-lstm", envs_per_worker=1).lr == pytest.approx(1e-4)
    cart = dict(env="CartPole-v1")
    assert _r("vector", **cart).spec == "mlp-lstm"
    assert _r("vector", **cart).lr == pytest.approx(3e-4)
    assert _r("vector", spec="mlp", **cart).lr == pytest.approx(3e-4)
    assert _r("vector", lr=5e-5, **cart).lr == pytest.approx(5e-5)
    pytest.importorskip("ale_py")       # the Atari ids of gymnasium's form need it
    for atari in ("ALE/Pong-v5", "PongNoFrameskip-v4"):
        r = _r(env=atari)
        assert (r.family, r.spec) == ("atari", "atari-lstm") and r.lr == pytest.approx(1e-4)


def test_resolve_amsgrad_and_anneal():
    cart = dict(env="CartPole-v1")
    # AMSGrad: on for the vector specs unless set
    assert _r("vector", **cart).amsgrad and _r("vector", spec="mlp", **cart).amsgrad
    assert not _r().amsgrad and not _r(env="ALE/Pong-v5").amsgrad
    assert not _r("vector", adam_amsgrad=False, **cart).amsgrad
    assert _r(adam_amsgrad=True).amsgrad
    # the anneal: on for Adam on doom-lstm, over its own 1M steps
    assert _r().anneal_steps == 1_000_000
    assert _r(spec="doom-ff").anneal_steps == 0
    assert _r(env="ALE/Pong-v5").anneal_steps == 0
    assert _r("vector", **cart).anneal_steps == 0
    assert _r(total_steps=0).anneal_steps == 1_000_000          # not the budget
    # defend_the_line's own default: doom-ff, no anneal (the rate stays 1e-4);
    # doom-lstm chosen there keeps the no-anneal; flags still win
    line = _r(env="doom:defend_the_line")
    assert (line.spec, line.anneal_steps, line.lr) == ("doom-ff", 0, pytest.approx(1e-4))
    assert _r(env="doom:defend_the_line", spec="doom-lstm").spec == "doom-lstm"
    assert _r(env="doom:defend_the_line", spec="doom-lstm").anneal_steps == 0
    assert _r(env="doom:defend_the_line", lr_anneal=True).anneal_steps == 1_000_000
    # and GAE at 0.95 there, n-step returns (1.0) elsewhere; a flag still wins
    assert _r(env="doom:defend_the_line").gae_lambda == 0.95
    assert _r(env="doom:defend_the_line", gae_lambda=1.0).gae_lambda == 1.0
    assert _r(env="doom:defend_the_center").gae_lambda == 1.0
    assert _r("vector", env="CartPole-v1").gae_lambda == 1.0
    # my_way_home's: the ICM paper's A3C (atari-lstm on 42x42 frames, Adam 1e-4
    # without the anneal, raw rewards and advantages, entropy 0.01); flags still win
    home = _r(env="doom:my_way_home")
    assert (home.spec, home.frame_size, home.lr, home.anneal_steps) == ("atari-lstm", 42, 1e-4, 0)
    assert (home.reward_scale, home.normalize_advantages, home.entropy_beta) == (1.0, False, 0.01)
    flagged = _r(env="doom:my_way_home", spec="doom-lstm", frame_size=84, reward_scale=0.0,
                 normalize_advantages=True, lr_anneal=True)
    assert (flagged.spec, flagged.frame_size, flagged.normalize_advantages) == ("doom-lstm", 84, True)
    assert flagged.reward_scale is None     # 0: divided by the running std of the return
    assert flagged.anneal_steps == 1_000_000
    assert _r(env="doom:my_way_home", reward_scale=0.5).reward_scale == 0.5
    assert (r0 := _r()).reward_scale is None and r0.frame_size is None     # basic: normalized, 84
    assert _r(env="doom:defend_the_line").entropy_beta == 0.01
    assert _r(env="doom:defend_the_center").anneal_steps == 1_000_000
    assert _r(total_steps=5000, lr_anneal_steps=0).anneal_steps == 5000
    assert _r(lr_anneal=False).anneal_steps == 0
    assert _r("vector", lr_anneal=True, **cart).anneal_steps == 1_000_000


def test_resolve_per_family_bootstrap_reward_clip_and_advantages():
    r = _r()
    assert not r.truncation_bootstrap and r.reward_clip == 0.0 and r.normalize_advantages
    cart = _r("vector", env="CartPole-v1")
    assert (cart.family, cart.truncation_bootstrap, cart.reward_clip) == ("gym", True, 0.0)
    assert cart.normalize_advantages
    for atari in ("ALE/Pong-v5", "atari:Breakout") + (("PongNoFrameskip-v4",) if HAS_ALE else ()):
        a = _r(env=atari)
        assert a.family == "atari" and a.reward_clip == 1.0 and a.truncation_bootstrap
        assert not a.normalize_advantages
        assert _r(env=atari, normalize_advantages=True).normalize_advantages
        assert _r(env=atari, reward_clip=0.0).reward_clip == 0.0
    assert not _r(normalize_advantages=False).normalize_advantages
    assert _r(truncation_bootstrap=True).truncation_bootstrap
    assert not _r("vector", env="CartPole-v1", truncation_bootstrap=False).truncation_bootstrap


def test_health_reward_is_the_health_scenarios_default_and_doom_only():
    assert _r().env_args["health_reward"] == 0.0                   # doom:basic: off
    for sc in ("health_gathering", "health_gathering_supreme"):
        assert _r(env=f"doom:{sc}").env_args["health_reward"] == 1.0
        assert _r(env=f"doom:{sc}", health_reward=0.0).env_args["health_reward"] == 0.0
    assert _r(env="doom:defend_the_line", health_reward=0.5).env_args["health_reward"] == 0.5
    with pytest.raises(ConfigError, match="'health_reward'.*doom envs only"):
        _r("vector", env="CartPole-v1", health_reward=1.0)


def test_ammo_reward_is_defend_the_centers_default_settable_on_doom_and_doom_only():
    assert _r().env_args["ammo_reward"] == 0.0
    assert _r(env="doom:defend_the_center").env_args["ammo_reward"] == 0.5    # its default
    assert _r(env="doom:defend_the_center", ammo_reward=0.0).env_args["ammo_reward"] == 0.0
    assert _r(env="doom:defend_the_center", ammo_reward=0.5).env_args["ammo_reward"] == 0.5
    with pytest.raises(ConfigError, match="'ammo_reward'.*doom envs only"):
        _r("vector", env="CartPole-v1", ammo_reward=0.5)


def test_action_set_is_doom_only_and_an_old_saved_run_keeps_its_buttons():
    assert _r().env_args["action_set"] == "buttons"
    # deadly_corridor's default: the combinations; a flag still wins
    assert _r(env="doom:deadly_corridor").env_args["action_set"] == "combos"
    assert _r(env="doom:deadly_corridor", action_set="buttons").env_args["action_set"] == "buttons"
    assert _r(env="doom:my_way_home", action_set="combos").env_args["action_set"] == "combos"
    with pytest.raises(ConfigError, match="'action_set'.*doom envs only"):
        _r("vector", env="CartPole-v1", action_set="combos")
    # a run saved before the switch trained one button per action, whatever
    # a scenario's default has become since
    old = Config.from_dict({"env": "doom:deadly_corridor"}, saved_run=True)
    assert old.action_set == "buttons"
    assert resolve(old.validate()).env_args["action_set"] == "buttons"
    assert Config.from_dict({"env": "CartPole-v1"}, saved_run=True).action_set is None
    assert Config(env="doom:basic").pinned(_r()).action_set == "buttons"


def test_view_is_doom_only_band_on_defend_the_line_and_an_old_saved_run_keeps_the_full_frame():
    assert _r().env_args["view"] == "full"
    # defend_the_line's default: the horizon band; a flag still wins
    assert _r(env="doom:defend_the_line").env_args["view"] == "band"
    assert _r(env="doom:defend_the_line", view="full").env_args["view"] == "full"
    assert _r(env="doom:basic", view="band").env_args["view"] == "band"
    with pytest.raises(ConfigError, match="'view'.*doom envs only"):
        _r("vector", env="CartPole-v1", view="band")
    # a run saved before the switch trained on the whole frame
    old = Config.from_dict({"env": "doom:defend_the_line"}, saved_run=True)
    assert old.view == "full" and resolve(old.validate()).env_args["view"] == "full"
    assert Config.from_dict({"env": "CartPole-v1"}, saved_run=True).view is None
    assert Config(env="doom:defend_the_line").pinned(_r(env="doom:defend_the_line")).view == "band"


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
        ("spec", "resnet"),
        ("workers", -1),
        ("lr", -1e-3),
        ("max_grad_norm", -1.0),
        ("hidden", "64,abc"),
        ("hidden", "0"),
        ("hidden", "64,0"),
        ("frame_size", 4),
        ("frame_size", 100000),
        ("reward_scale", -1.0),
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
        ("merge_below", -1.0),
        ("health_reward", -1.0),
        ("health_reward", float("nan")),
        ("ammo_reward", -0.5),
        ("ammo_reward", float("inf")),
        ("action_set", "all"),
        ("view", "wide"),
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
                                     entropy_beta=0.01, gae_lambda=1.0, obs_norm=True,
                                     envs_per_worker=1, t_max=20)
    rb, rd = resolve(basic), resolve(Config())
    assert rb.obs_norm == rd.obs_norm is True
    assert rb.merge_below == rd.merge_below
    # "the defaults, spelled out": the same optimizer as an unset config's
    for name in ("lr", "amsgrad", "anneal_steps"):
        assert getattr(rb, name) == getattr(rd, name), name
    pong = Config.from_toml(str(root / "pong.toml"))
    assert (pong.env, pong.repeat_action_probability, pong.total_seconds) == ("ALE/Pong-v5", 0.0, 3600.0)


def test_obs_norm_default_is_on_for_doom_and_atari_images_only():
    assert _r(env="doom:basic").obs_norm
    assert _r(env="ALE/Pong-v5").obs_norm
    if HAS_ALE:
        assert _r(env="PongNoFrameskip-v4").obs_norm
    assert not _r("vector", env="CartPole-v1").obs_norm
    assert not _r(env="ALE/Pong-v5", obs_norm=False).obs_norm
    assert _r("vector", env="CartPole-v1", obs_norm=True).obs_norm


def _saved(**d):
    """A config a run saved (``--resume`` reads it), and the fields it ignored."""
    ignored = []
    return Config.from_dict(d, saved_run=True, ignored=ignored), ignored


def test_merge_below_is_on_by_default_and_carried_to_the_workers():
    assert Config().merge_below == 8.0 and _r().merge_below == 8.0
    assert _r().records_resets                 # the warm-up compiles the reset variant
    assert _r(merge_below=0.0).merge_below == 0.0
    assert not _r(merge_below=0.0, envs_per_worker=1).records_resets
    assert _r(merge_below=0.0, envs_per_worker=2).records_resets
    with pytest.raises(ConfigError, match="merge_below"):
        Config(merge_below=-1.0).validate()
    from a3c_core.train.build import _settings

    for cfg, want in ((Config(), 8.0), (Config(merge_below=0), 0.0), (Config(merge_below=3), 3.0)):
        assert _settings(cfg, resolve(cfg)).merge_below == want


def test_an_old_saved_run_with_fixed_rollouts_resumes_with_merge_below():
    # min_rollout and cross_episode are ignored (and reported); merge_below
    # is the saved one, or the paper's rollouts where the run predates it
    c, ignored = _saved(env="doom:basic", cross_episode=True, min_rollout=3)
    assert sorted(ignored) == ["cross_episode", "min_rollout"] and c.merge_below == 0.0
    c, ignored = _saved(min_rollout=10, merge_below=8.0)
    assert ignored == ["min_rollout"] and resolve(c).merge_below == 8.0


def test_a_saved_run_fills_the_fields_it_predates_from_one_table():
    """A saved config that lacks a field gets SAVED_RUN_DEFAULTS' value (what
    the run trained with), a new config today's default; a field the saved
    config sets is kept."""
    doom, _ = _saved(env="doom:basic")
    assert (doom.merge_below, doom.obs_norm, doom.self_imitation) == (0.0, False, False)
    assert (doom.action_set, doom.view) == ("buttons", "full")
    assert (doom.lr_anneal_steps, doom.lr_anneal_floor) == (1_000_000, 0.1)   # anneal unset
    cart, _ = _saved(env="CartPole-v1")
    assert (cart.merge_below, cart.obs_norm, cart.self_imitation) == (0.0, False, False)
    assert (cart.action_set, cart.view) == (None, None)             # not a Doom run
    annealed, _ = _saved(env="CartPole-v1", lr_anneal=True)
    assert (annealed.lr_anneal_steps, annealed.lr_anneal_floor) == (0, 0.0)
    kept, _ = _saved(env="doom:deadly_corridor", merge_below=6.0, obs_norm=True,
                     action_set="combos", view="band", lr_anneal=True, lr_anneal_steps=500,
                     lr_anneal_floor=0.2)
    assert (kept.merge_below, kept.obs_norm, kept.action_set, kept.view) == (
        6.0, True, "combos", "band")
    assert (kept.lr_anneal_steps, kept.lr_anneal_floor) == (500, 0.2)
    new = Config.from_dict({"env": "doom:basic"})
    assert (new.merge_below, new.obs_norm, new.action_set) == (8.0, None, None)
    assert set(SAVED_RUN_DEFAULTS) <= {f for f in Config.__dataclass_fields__}


def test_the_removed_optimizers_are_named_and_their_runs_cannot_resume(tmp_path):
    """optimizer, rmsprop_alpha and rmsprop_eps went (Adam is the one
    optimizer): a new config naming one is an error saying why; a saved run's
    config.toml still reads (they are ignored and reported), and its
    checkpoint, whose optimizer state is RMSProp's or SGD's, is refused by name."""
    from a3c_core.checkpoint import CheckpointError
    from a3c_core.train.build import build_parts, plan_run, restore_checkpoint

    new = tmp_path / "new.toml"
    new.write_text('env = "CartPole-v1"\noptimizer = "adam"\n')
    with pytest.raises(ConfigError, match="config field 'optimizer' was removed: Adam is the one"):
        Config.from_toml(str(new))
    for name in ("rmsprop_alpha", "obs_norm_frames", "advantage_horizon"):
        with pytest.raises(ConfigError, match=f"config field '{name}' was removed"):
            Config.from_dict({name: 1})
    old = tmp_path / "config.toml"
    old.write_text('env = "CartPole-v1"\noptimizer = "rmsprop"\nrmsprop_alpha = 0.99\n'
                   'rmsprop_eps = 0.1\nexploration = "none"\nmin_rollout = 0\n')
    ignored = []
    c = Config.from_toml(str(old), saved_run=True, ignored=ignored)
    assert ignored == ["optimizer", "rmsprop_alpha", "rmsprop_eps", "exploration", "min_rollout"]

    class Ckpt:             # what restore_checkpoint reads first
        path = "ckpt.npz"
        meta = {"optimizer": "rmsprop"}

    from a3c_core.envs import make_env

    with make_env("CartPole-v1") as env:
        parts = build_parts(plan_run(c.replace(workers=1), env))
    with pytest.raises(CheckpointError, match="used optimizer 'rmsprop', which was removed"):
        restore_checkpoint(parts, Ckpt())


def test_a_run_saved_before_merge_below_keeps_the_papers_rollouts(tmp_path):
    old = tmp_path / "config.toml"
    old.write_text('env = "doom:basic"\nt_max = 20\n')
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
    assert resolve(c, "vector").anneal_steps == 5_000_000
    fresh = Config.from_toml(str(old))                      # a user's config file
    assert (fresh.lr_anneal_steps, fresh.lr_anneal_floor) == (1_000_000, 0.1)
    new = tmp_path / "new.toml"
    new.write_text('lr_anneal = true\nlr_anneal_steps = 2000\nlr_anneal_floor = 0.5\n')
    c2 = Config.from_toml(str(new), saved_run=True)
    assert (c2.lr_anneal_steps, c2.lr_anneal_floor) == (2000, 0.5)
    off = tmp_path / "off.toml"
    off.write_text("lr_anneal = false\n")
    assert resolve(Config.from_toml(str(off), saved_run=True)).anneal_steps == 0


@pytest.mark.parametrize("name", sorted(REMOVED_FIELDS))
def test_a_removed_field_in_a_new_config_is_an_error_naming_it(tmp_path, name):
    value = True if name == "cross_episode" else 0.1
    with pytest.raises(ConfigError, match=f"config field '{name}' was removed: "):
        Config.from_dict({"env": "CartPole-v1", name: value})
    p = tmp_path / "c.toml"
    p.write_text(f'env = "CartPole-v1"\n{name} = {"true" if value is True else value}\n')
    with pytest.raises(ConfigError, match=f"{p}: config field '{name}' was removed: "):
        Config.from_toml(str(p))
    with pytest.raises(TypeError, match=name):
        Config(**{name: value})


@pytest.mark.parametrize("name", sorted(REMOVED_FIELDS))
def test_a_removed_field_in_a_saved_run_is_ignored_and_reported(tmp_path, name):
    value = True if name == "cross_episode" else 0.1
    c, ignored = _saved(env="CartPole-v1", lr=3e-4, **{name: value})
    assert ignored == [name]
    assert (c.env, c.lr) == ("CartPole-v1", 3e-4)
    # an old run's config.toml, as --resume reads it (without a list: dropped silently)
    p = tmp_path / "config.toml"
    p.write_text(f'env = "CartPole-v1"\n{name} = {"true" if value is True else value}\n')
    ignored = []
    assert Config.from_toml(str(p), saved_run=True, ignored=ignored).env == "CartPole-v1"
    assert ignored == [name]
    assert Config.from_toml(str(p), saved_run=True).env == "CartPole-v1"


def test_a_removed_flag_names_itself_and_why():
    assert removed_flag(["--env", "CartPole-v1", "--entropy-target", "0.1"]) == (
        "--entropy-target was removed: " + REMOVED_FIELDS["entropy_target"])
    assert removed_flag(["--adam-beta2=0.9"]).startswith("--adam-beta2 was removed: ")
    assert removed_flag(["--no-cross-episode"]).startswith("--no-cross-episode was removed: ")
    assert removed_flag(["--cross-episode"]).startswith("--cross-episode was removed: ")
    assert removed_flag(["--min-rollout", "20"]).startswith("--min-rollout was removed: ")
    assert removed_flag(["--exploration", "rnd"]).startswith("--exploration was removed: ")
    assert removed_flag(["--env", "CartPole-v1", "--merge-below", "0"]) is None
