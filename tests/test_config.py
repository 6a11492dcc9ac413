import dataclasses
import importlib.util
import sys

import pytest

from a3c_core.envs.families import FAMILIES
from a3c_core.train.config import (REMOVED_FIELDS, REMOVED_TO_CONSTANTS, rollout_defaults, SAVED_RUN_DEFAULTS,
                                   Config, ConfigError, env_options_by_name, removed_flag, resolve)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from the registry
    import tomli as tomllib

#: ale-py registers the Atari ids of gymnasium's form (PongNoFrameskip-v4);
#: without it such an id is a plain gymnasium one
HAS_ALE = importlib.util.find_spec("ale_py") is not None


def _r(obs_kind="image", **kw):
    """The resolved settings of ``Config(**kw)``."""
    return resolve(Config(**kw).validate(), obs_kind)


def _o(**options):
    """``Config`` keywords that set these env options."""
    return {"env_options": options}


def test_config_has_at_most_40_fields():
    # issue 72: every field has a measured use; an env family's options are
    # one mapping (env_options), not a field each
    assert len(dataclasses.fields(Config)) <= 40


def test_defaults_are_the_standard_workload():
    c = Config().validate()
    assert c.env == "doom:basic"
    assert (c.t_max, c.envs_per_worker, c.gamma, c.gae_lambda) == (None, None, 0.99, None)
    assert c.max_grad_norm == 40.0 and c.env_options == {}
    # basic's default: the batched worker, 8 envs at t_max 10, Adam 2e-4
    d = rollout_defaults(c)
    assert (d.envs_per_worker, d.t_max) == (8, 10)
    assert resolve(c).lr == pytest.approx(2e-4)
    assert rollout_defaults(c.replace(envs_per_worker=4)).t_max == 10
    assert _r(envs_per_worker=4).lr == pytest.approx(1e-4)              # 40 rows: 1x
    assert _r(envs_per_worker=8).lr == pytest.approx(2e-4)              # 80 rows: 2x
    # the paper's worker where K = 1 is asked for, or on other scenarios
    p1 = rollout_defaults(c.replace(envs_per_worker=1))
    assert (p1.envs_per_worker, p1.t_max) == (1, 20)
    assert _r(envs_per_worker=1).lr == pytest.approx(1e-4)
    mw = rollout_defaults(c.replace(env="doom:my_way_home"))
    assert (mw.envs_per_worker, mw.t_max) == (1, 20)
    for sc, k, t in (("defend_the_center", 8, 10), ("health_gathering", 8, 10),
                     ("simpler_basic", 8, 10), ("rocket_basic", 8, 10),
                     ("take_cover", 8, 20), ("health_gathering_supreme", 1, 20)):
        d = rollout_defaults(c.replace(env=f"doom:{sc}"))
        assert (d.envs_per_worker, d.t_max) == (k, t), sc
    # take_cover's batched rollouts are 20 ticks, for any K > 1 (Adam: 160 rows / 40)
    tc = c.replace(env="doom:take_cover")
    assert _r(env="doom:take_cover").lr == pytest.approx(4e-4)
    assert rollout_defaults(tc.replace(envs_per_worker=4)).t_max == 20
    assert rollout_defaults(tc.replace(envs_per_worker=1)).t_max == 20
    assert rollout_defaults(tc.replace(t_max=10)).t_max == 10
    assert _r(envs_per_worker=4, t_max=20).lr == pytest.approx(2e-4)     # 80 rows / 40
    assert _r(envs_per_worker=4, t_max=5).lr == pytest.approx(1e-4)      # 20 rows: 1x
    assert _r(envs_per_worker=1, t_max=40).lr == pytest.approx(2e-4)     # K = 1: rows / 20
    c = c.replace(envs_per_worker=1)
    r = resolve(c)
    assert r.entropy_beta == 0.01 and c.entropy_beta is None     # the family's
    assert r.gae_lambda == 1.0                                    # the family's
    assert (r.family, r.spec) == ("doom", "doom-lstm")
    assert r.lr == pytest.approx(1e-4)
    assert c.reward_scale is None  # normalized by the running return std
    assert c.adam_amsgrad is None and c.lr_anneal is None and c.truncation_bootstrap is None
    assert c.lr_anneal_steps == 1_000_000


def test_flag_help_names_every_scenario_whose_default_is_the_batched_worker():
    """`a3c train --help` for --envs-per-worker and --t-max names each Doom
    scenario whose record sets K > 1 or its own batched t_max."""
    from a3c_core.envs.families import DOOM

    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(Config)}
    batched = [sc for sc in DOOM.scenarios if DOOM.defaults_for(f"doom:{sc}").envs_per_worker > 1]
    assert batched
    for sc in batched:
        assert sc in helps["envs_per_worker"], sc
    for sc in DOOM.scenarios:
        t = DOOM.defaults_for(f"doom:{sc}").batched_t_max
        if t is not None:
            assert f"{sc} {t}" in helps["t_max"], sc


def test_resolve_learning_rate_per_family_and_spec():
    # Adam: 1e-4 on doom and Atari, 3e-4 on the vector specs (docs/defaults.md);
    # an explicit lr always wins
    assert _r().lr == pytest.approx(2e-4)                 # basic: 8 envs x 10 ticks / 40
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
        assert _r(env=f"doom:{sc}", **_o(health_reward=0.0)).env_args["health_reward"] == 0.0
    assert _r(env="doom:defend_the_line", **_o(health_reward=0.5)).env_args["health_reward"] == 0.5
    with pytest.raises(ConfigError, match="'env_options.health_reward'.*doom envs only"):
        _r("vector", env="CartPole-v1", **_o(health_reward=1.0))


def test_ammo_reward_is_defend_the_centers_default_settable_on_doom_and_doom_only():
    assert _r().env_args["ammo_reward"] == 0.0
    assert _r(env="doom:defend_the_center").env_args["ammo_reward"] == 0.5    # its default
    assert _r(env="doom:defend_the_center", **_o(ammo_reward=0.0)).env_args["ammo_reward"] == 0.0
    assert _r(env="doom:defend_the_center", **_o(ammo_reward=0.5)).env_args["ammo_reward"] == 0.5
    with pytest.raises(ConfigError, match="'env_options.ammo_reward'.*doom envs only"):
        _r("vector", env="CartPole-v1", **_o(ammo_reward=0.5))


def test_action_set_is_doom_only_and_an_old_saved_run_keeps_its_buttons():
    assert _r().env_args["action_set"] == "buttons"
    # deadly_corridor's default: the combinations; a flag still wins
    assert _r(env="doom:deadly_corridor").env_args["action_set"] == "combos"
    assert _r(env="doom:deadly_corridor", **_o(action_set="buttons")).env_args["action_set"] == "buttons"
    assert _r(env="doom:my_way_home", **_o(action_set="combos")).env_args["action_set"] == "combos"
    with pytest.raises(ConfigError, match="'env_options.action_set'.*doom envs only"):
        _r("vector", env="CartPole-v1", **_o(action_set="combos"))
    # a run saved before the switch trained one button per action, whatever
    # a scenario's default has become since
    old = Config.from_dict({"env": "doom:deadly_corridor"}, saved_run=True)
    assert old.env_option("action_set") == "buttons"
    assert resolve(old.validate()).env_args["action_set"] == "buttons"
    assert Config.from_dict({"env": "CartPole-v1"}, saved_run=True).env_option("action_set") is None
    assert Config(env="doom:basic").pinned(_r()).env_option("action_set") == "buttons"


def test_view_is_doom_only_band_on_defend_the_line_and_an_old_saved_run_keeps_the_full_frame():
    assert _r().env_args["view"] == "full"
    # defend_the_line's default: the horizon band; a flag still wins
    assert _r(env="doom:defend_the_line").env_args["view"] == "band"
    assert _r(env="doom:defend_the_line", **_o(view="full")).env_args["view"] == "full"
    assert _r(env="doom:basic", **_o(view="band")).env_args["view"] == "band"
    with pytest.raises(ConfigError, match="'env_options.view'.*doom envs only"):
        _r("vector", env="CartPole-v1", **_o(view="band"))
    # a run saved before the switch trained on the whole frame
    old = Config.from_dict({"env": "doom:defend_the_line"}, saved_run=True)
    assert old.env_option("view") == "full" and resolve(old.validate()).env_args["view"] == "full"
    assert Config.from_dict({"env": "CartPole-v1"}, saved_run=True).env_option("view") is None
    pinned = Config(env="doom:defend_the_line").pinned(_r(env="doom:defend_the_line"))
    assert pinned.env_option("view") == "band"


def test_atari_options_are_the_familys_defaults_and_atari_only():
    """noop_max and terminal_on_life_loss reach every Atari env (30, off);
    repeat_action_probability only where set (the id's own otherwise); a
    Doom or gym env refuses them, naming the option, the env and its own."""
    args = _r(env="ALE/Pong-v5").env_args
    assert (args["noop_max"], args["terminal_on_life_loss"]) == (30, False)
    assert "repeat_action_probability" not in args
    set_ = _r(env="ALE/Pong-v5", **_o(noop_max=0, repeat_action_probability=0.0)).env_args
    assert (set_["noop_max"], set_["repeat_action_probability"]) == (0, 0.0)
    with pytest.raises(ConfigError, match=r"'env_options.noop_max' = 0: applies to atari envs "
                                          r"only; doom:basic is a doom env \(doom envs take "
                                          r"health_reward, ammo_reward, action_set, view\)"):
        Config(**_o(noop_max=0)).validate()
    assert "noop_max" not in _r().env_args and "noop_max" not in _r("vector", env="CartPole-v1").env_args
    pinned = Config(env="ALE/Pong-v5").pinned(_r(env="ALE/Pong-v5"))
    assert pinned.env_options == {"noop_max": 30, "terminal_on_life_loss": False}


def test_the_family_records_are_the_one_list_of_env_options():
    by_name = env_options_by_name()
    assert set(by_name) == {"health_reward", "ammo_reward", "action_set", "view", "noop_max",
                            "terminal_on_life_loss", "repeat_action_probability"}
    for name, (family, option) in by_name.items():
        assert option.name == name and name in family.options
        assert not hasattr(Config, name)           # an option is not a field too
    assert {f.name for f in FAMILIES if f.options} == {"doom", "atari"}


@pytest.mark.parametrize("env,options,message", [
    ("doom:basic", {"fov": 90}, "'env_options.fov' = 90: doom:basic (a doom env) has no such option; "
                                "doom envs take health_reward, ammo_reward, action_set, view"),
    ("CartPole-v1", {"view": "band"}, "'env_options.view' = 'band': applies to doom envs only; "
                                      "CartPole-v1 is a gym env (gym envs take no options)"),
    ("doom:basic", {"view": "wide"}, "'env_options.view' = 'wide': choose one of full, band"),
    ("doom:basic", {"action_set": "all"}, "'env_options.action_set' = 'all': choose one of buttons, combos"),
    ("doom:basic", {"health_reward": -1.0}, "'env_options.health_reward' = -1.0: must be in [0.0, 1000.0]"),
    ("doom:basic", {"health_reward": float("nan")}, "'env_options.health_reward' = nan: must be a finite number"),
    ("doom:basic", {"ammo_reward": "lots"}, "'env_options.ammo_reward' = 'lots': must be a number"),
    ("doom:basic", {"ammo_reward": float("inf")}, "'env_options.ammo_reward' = inf: must be a finite number"),
    ("ALE/Pong-v5", {"noop_max": -1}, "'env_options.noop_max' = -1: must be in [0, 1000]"),
    ("ALE/Pong-v5", {"noop_max": 2.5}, "'env_options.noop_max' = 2.5: must be an integer"),
    ("ALE/Pong-v5", {"repeat_action_probability": 1.5},
     "'env_options.repeat_action_probability' = 1.5: must be in [0.0, 1.0]"),
    ("ALE/Pong-v5", {"terminal_on_life_loss": 1}, "'env_options.terminal_on_life_loss' = 1: must be true or false"),
    ("doom:basic", ["view"], "'env_options' = ['view']: must be a table of option = value"),
])
def test_bad_env_options_name_the_option_the_env_and_what_it_takes(env, options, message):
    with pytest.raises(ConfigError) as e:
        Config(env=env, env_options=options).validate()
    assert str(e.value).startswith("config field " + message), str(e.value)


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
        ("max_grad_norm", float("nan")),
        ("total_seconds", float("-inf")),
        ("target_reward", float("inf")),
        ("lr", 2.0),
        ("seed", -1),
        ("seed", 2**40),
        ("checkpoint_interval", -5.0),
        ("lstm_size", 0),
        ("env", " "),
        ("merge_below", -1.0),
        ("env_options", "view=band"),
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
    # a file's bad value is an error even where the command line replaces it
    p.write_text('tensorboard = "yes"\n')
    with pytest.raises(ConfigError, match="'tensorboard'"):
        Config.from_toml(str(p), overrides={"tensorboard": False})


def test_lr_anneal_over_total_steps_needs_total_steps():
    with pytest.raises(ConfigError, match="'lr_anneal'.*--lr-anneal-steps or --total-steps"):
        Config(lr_anneal=True, lr_anneal_steps=0, total_steps=0).validate()
    # its own horizon needs no budget
    Config(lr_anneal=True, total_steps=0).validate()
    Config(total_steps=0, lr_anneal_steps=0).validate()   # default (unset): no error
    with pytest.raises(ConfigError, match="'lr_anneal_steps'"):
        Config(lr_anneal_steps=-1).validate()


def test_shipped_config_files_load():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "configs"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        Config.from_toml(str(f))
    basic = Config.from_toml(str(root / "doom_basic.toml"))
    assert basic == Config().replace(spec="doom-lstm", frame_skip=4, lr=2e-4, lr_anneal=True,
                                     entropy_beta=0.01, gae_lambda=1.0, obs_norm=True,
                                     envs_per_worker=8, t_max=10)
    rb, rd = resolve(basic), resolve(Config())
    assert rb.obs_norm == rd.obs_norm is True
    assert rb.merge_below == rd.merge_below
    # "the defaults, spelled out": the same optimizer as an unset config's
    for name in ("lr", "amsgrad", "anneal_steps"):
        assert getattr(rb, name) == getattr(rd, name), name
    pong = Config.from_toml(str(root / "pong.toml"))
    assert (pong.env, pong.total_seconds) == ("ALE/Pong-v5", 3600.0)
    assert pong.env_options == {"repeat_action_probability": 0.0}       # its [env_options] table


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
    doom, ignored = _saved(env="doom:basic")
    assert (doom.merge_below, doom.obs_norm, doom.self_imitation) == (0.0, False, False)
    assert doom.env_options == {"action_set": "buttons", "view": "full"}
    assert doom.lr_anneal_steps == 1_000_000 and ignored == []      # anneal unset
    assert rollout_defaults(doom).envs_per_worker == 1              # before the batched worker
    cart, _ = _saved(env="CartPole-v1")
    assert (cart.merge_below, cart.obs_norm, cart.self_imitation) == (0.0, False, False)
    assert cart.env_options == {}                                   # not a Doom run
    # annealed to 0 over total_steps: the floor is 0.1 now, and the run is told
    annealed, ignored = _saved(env="CartPole-v1", lr_anneal=True)
    assert annealed.lr_anneal_steps == 0 and ignored == ["lr_anneal_floor"]
    kept, ignored = _saved(env="doom:deadly_corridor", merge_below=6.0, obs_norm=True,
                           env_options={"action_set": "combos", "view": "band"}, lr_anneal=True,
                           lr_anneal_steps=500, lr_anneal_floor=0.1)
    assert (kept.merge_below, kept.obs_norm, kept.env_options) == (
        6.0, True, {"action_set": "combos", "view": "band"})
    assert kept.lr_anneal_steps == 500 and ignored == []
    new = Config.from_dict({"env": "doom:basic"})
    assert (new.merge_below, new.obs_norm, new.env_options) == (8.0, None, {})
    assert rollout_defaults(new).envs_per_worker == 8               # basic's default today
    assert set(SAVED_RUN_DEFAULTS) <= set(Config.__dataclass_fields__) | set(REMOVED_FIELDS)


#: a doom:defend_the_line run's config.toml as versions before env_options
#: wrote it (the fields that became constants and every env option at the
#: top level, Atari's included), its unchanged fields left out
OLD_SAVED_CONFIG = """env = "doom:defend_the_line"
total_steps = 300000
reward_window = 100
lr_anneal_floor = 0.1
value_coef = 0.5
max_skipped_updates = 100
noop_max = 30
terminal_on_life_loss = false
# repeat_action_probability = (unset)
health_reward = 0.0
ammo_reward = 0.0
action_set = "buttons"
view = "band"
"""


def test_a_saved_run_with_top_level_env_options_resumes_with_the_same_ones(tmp_path):
    """Its Doom options move into env_options, Atari's (which never applied
    to a Doom env) and the constants it held are dropped silently; the env
    is built as it was, and a flag still overrides one option."""
    p = tmp_path / "config.toml"
    p.write_text(OLD_SAVED_CONFIG)
    ignored = []
    c = Config.from_toml(str(p), saved_run=True, ignored=ignored)
    assert ignored == []
    assert c.env_options == {"health_reward": 0.0, "ammo_reward": 0.0, "action_set": "buttons",
                             "view": "band"}
    assert resolve(c).env_args == {"frame_skip": 4, "env_process": False, "health_reward": 0.0,
                                   "ammo_reward": 0.0, "action_set": "buttons", "view": "band"}
    # what --resume RUN --view full reads: the flag's option over the saved ones
    flagged = Config.from_toml(str(p), saved_run=True, overrides={"env_options": {"view": "full"}})
    assert flagged.env_option("view") == "full" and flagged.env_option("action_set") == "buttons"
    # today's config.toml of the same run reads back the same
    again = tmp_path / "again.toml"
    again.write_text(c.to_toml())
    assert tomllib.loads(again.read_text())["env_options"] == c.env_options     # an inline table
    assert "\nview =" not in again.read_text()
    assert Config.from_toml(str(again), saved_run=True) == c


def test_a_toml_sets_env_options_in_a_table_or_at_the_top_level(tmp_path):
    """``[env_options]`` (or ``[a3c.env_options]``), or the top-level keys
    of configs before it; the two forms of one option together are an error."""
    p = tmp_path / "c.toml"
    p.write_text('env = "doom:defend_the_line"\n\n[env_options]\nview = "full"\nhealth_reward = 1\n')
    c = Config.from_toml(str(p))
    assert c.env_options == {"view": "full", "health_reward": 1.0}
    assert type(c.env_option("health_reward")) is float          # TOML's 1, as lr = 1 is 1.0
    p.write_text('[a3c]\nenv = "doom:basic"\n\n[a3c.env_options]\naction_set = "combos"\n')
    assert Config.from_toml(str(p)).env_options == {"action_set": "combos"}
    p.write_text('env = "doom:defend_the_line"\nview = "full"\nhealth_reward = 1\n')
    assert Config.from_toml(str(p)).env_options == {"view": "full", "health_reward": 1.0}
    p.write_text('env = "ALE/Pong-v5"\nrepeat_action_probability = 0.0\nnoop_max = 0\n')
    assert Config.from_toml(str(p)).env_options == {"repeat_action_probability": 0.0, "noop_max": 0}
    # an option of another family: dropped where it holds that family's
    # default (it never applied), else refused by name
    p.write_text('env = "CartPole-v1"\nnoop_max = 30\nterminal_on_life_loss = false\n')
    assert Config.from_toml(str(p)).env_options == {}
    p.write_text('env = "CartPole-v1"\nview = "band"\n')
    with pytest.raises(ConfigError, match="'env_options.view' = 'band': applies to doom envs only"):
        Config.from_toml(str(p))
    p.write_text('env = "doom:basic"\nview = "band"\n[env_options]\nview = "full"\n')
    with pytest.raises(ConfigError, match=f"{p}: env option 'view' is set twice"):
        Config.from_toml(str(p))
    p.write_text('env = "doom:basic"\n[env_options]\nview = "wide"\n')
    with pytest.raises(ConfigError, match="'env_options.view' = 'wide': choose one of full, band"):
        Config.from_toml(str(p))
    # the command line's env options add to the file's, on the final env
    p.write_text('[env_options]\nnoop_max = 0\n')
    c = Config.from_toml(str(p), overrides={"env": "ALE/Pong-v5",
                                            "env_options": {"terminal_on_life_loss": True}})
    assert c.env_options == {"noop_max": 0, "terminal_on_life_loss": True}


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
    ignored = []
    c = Config.from_toml(str(old), saved_run=True, ignored=ignored)
    assert c.lr_anneal_steps == 0 and ignored == ["lr_anneal_floor"]   # to 0.1 x lr now, not 0
    assert resolve(c, "vector").anneal_steps == 5_000_000
    fresh = Config.from_toml(str(old))                      # a user's config file
    assert fresh.lr_anneal_steps == 1_000_000
    new = tmp_path / "new.toml"
    new.write_text('lr_anneal = true\nlr_anneal_steps = 2000\nlr_anneal_floor = 0.5\n')
    ignored = []
    c2 = Config.from_toml(str(new), saved_run=True, ignored=ignored)
    assert c2.lr_anneal_steps == 2000 and ignored == ["lr_anneal_floor"]
    off = tmp_path / "off.toml"
    off.write_text("lr_anneal = false\n")
    assert resolve(Config.from_toml(str(off), saved_run=True)).anneal_steps == 0


@pytest.mark.parametrize("name", sorted(REMOVED_FIELDS))
def test_a_removed_field_in_a_new_config_is_an_error_naming_it(tmp_path, name):
    value = True if name == "cross_episode" else 0.3       # not the constant a field became
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
    value = True if name == "cross_episode" else 0.3       # not the constant a field became
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


@pytest.mark.parametrize("name", sorted(REMOVED_TO_CONSTANTS))
def test_a_saved_run_that_held_a_removed_fields_constant_resumes_silently(name):
    """reward_window, max_skipped_updates, lr_anneal_floor and value_coef
    became constants; every config.toml wrote them, and one that holds the
    constant resumes as it trained, with nothing to report."""
    c, ignored = _saved(env="CartPole-v1", **{name: REMOVED_TO_CONSTANTS[name]})
    assert ignored == [] and c.env == "CartPole-v1"
    with pytest.raises(ConfigError, match=f"config field '{name}' was removed: "):
        Config.from_dict({name: REMOVED_TO_CONSTANTS[name]})         # a new config: an error


def test_a_removed_flag_names_itself_and_why():
    assert removed_flag(["--env", "CartPole-v1", "--entropy-target", "0.1"]) == (
        "--entropy-target was removed: " + REMOVED_FIELDS["entropy_target"])
    assert removed_flag(["--adam-beta2=0.9"]).startswith("--adam-beta2 was removed: ")
    assert removed_flag(["--no-cross-episode"]).startswith("--no-cross-episode was removed: ")
    assert removed_flag(["--cross-episode"]).startswith("--cross-episode was removed: ")
    assert removed_flag(["--min-rollout", "20"]).startswith("--min-rollout was removed: ")
    assert removed_flag(["--exploration", "rnd"]).startswith("--exploration was removed: ")
    assert removed_flag(["--value-coef", "1"]) == (
        "--value-coef was removed: the A3C value-loss weight; --value-coef 1 on "
        "doom:defend_the_line ended level with 0.5 (avg1000 29.59 against 29.25)")
    for flag in ("--reward-window=10", "--max-skipped-updates", "--lr-anneal-floor"):
        assert removed_flag([flag, "0"]).startswith(flag.split("=")[0] + " was removed: ")
    assert removed_flag(["--env", "CartPole-v1", "--merge-below", "0"]) is None
