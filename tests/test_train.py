"""Smoke tests of the real CLI and trainer with tiny budgets."""
import collections
import csv
import importlib
import json
import os
import threading

import numpy as np
import pytest

from a3c_core.checkpoint import load_checkpoint, save_checkpoint
from a3c_core.cli import main
from a3c_core.train.config import Config, ConfigError
from a3c_core.train.trainer import Trainer, TrainingError

pytest.importorskip("vizdoom")
pytest.importorskip("gymnasium")


def _episodes(run_dir):
    with open(os.path.join(run_dir, "episodes.csv")) as fh:
        return list(csv.DictReader(fh))


def test_cli_train_eval_resume_doom(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = str(tmp_path / "run")
    rc = main(["train", "--env", "doom:basic", "--workers", "2", "--total-steps", "400",
               "--run-dir", run, "--quiet", "--no-tensorboard"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "done:" in out
    ck = load_checkpoint(run)
    assert ck.meta["counters"]["steps"] >= 400
    assert ck.meta["env"]["action_names"] == ["MOVE_LEFT", "MOVE_RIGHT", "ATTACK"]
    assert ck.meta["network"]["name"] == "doom-lstm"
    eps = _episodes(run)
    assert len(eps) >= 1 and all(-500 < float(e["return"]) < 150 for e in eps)  # raw, unscaled
    # how each ended: basic has no death; an episode shorter than its timeout
    # (300 tics, 75 steps of 4) ended with the kill
    assert {e["end"] for e in eps} <= {"ended alive", "timed out"}
    assert all(e["end"] == "ended alive" for e in eps if int(e["length"]) < 75)
    # the result counts the ends of the avg100 window's episodes, as the rows say
    summary = json.load(open(os.path.join(run, "summary.json")))
    tail = collections.Counter(e["end"] for e in eps[-100:])
    assert summary["episode_ends"] == dict(tail) and sum(tail.values()) == min(len(eps), 100)
    assert "timed out" in out or "ended alive" in out
    with open(os.path.join(run, "metrics.csv")) as fh:
        names = {row["name"] for row in csv.DictReader(fh)}
    assert "charts/episodic_return" in names
    # ViZDoom runtime files never land in the working directory
    assert not any(n.startswith("_vizdoom") for n in os.listdir(tmp_path))

    gif = str(tmp_path / "ep.gif")
    rc = main(["eval", run, "--which", "latest", "--episodes", "2", "--gif", gif])
    assert rc == 0
    assert "2 episodes (greedy): mean raw reward" in capsys.readouterr().out
    from PIL import Image

    with Image.open(gif) as im:
        assert im.size == (160, 120) and im.n_frames > 1

    steps_before = ck.meta["counters"]["steps"]
    rc = main(["train", "--resume", run, "--total-steps", str(steps_before + 200), "--quiet"])
    assert rc == 0
    ck2 = load_checkpoint(run)
    assert ck2.meta["counters"]["steps"] >= steps_before + 200
    assert ck2.meta["counters"]["resumes"] == 1


def test_adam_moment_scalars_are_logged(tmp_path):
    """optim/* scalars: Adam's live moments, finite and positive once updates ran."""
    run = str(tmp_path / "run")
    rc = main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "0",
               "--total-seconds", "2.5", "--log-interval", "0.5", "--run-dir", run, "--quiet",
               "--no-tensorboard"])
    assert rc == 0
    vals = {}
    with open(os.path.join(run, "metrics.csv")) as fh:
        for row in csv.DictReader(fh):
            if row["name"].startswith("optim/"):
                vals.setdefault(row["name"], []).append(float(row["value"]))
    names = {"optim/adam_denominator_rms", "optim/adam_update_rms", "optim/grad_to_adam_ratio",
             "optim/param_change_rms", "optim/param_change_per_apply"}
    assert set(vals) == names
    for name, v in vals.items():
        assert all(np.isfinite(x) and x > 0 for x in v), (name, v)


def test_rms_diff_matches_numpy():
    """optim/param_change_rms's reduction against numpy in float64, across the
    chunk boundary (65,536) and for an empty vector."""
    from a3c_core.train.run_report import rms_diff
    rng = np.random.default_rng(3)
    for n in (1, 1000, 65_536, 200_003):
        a = rng.standard_normal(n).astype(np.float32)
        b = (a + rng.standard_normal(n).astype(np.float32) * 1e-3).astype(np.float32)
        want = np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
        assert rms_diff(a, b) == pytest.approx(want, rel=1e-12)
    assert rms_diff(np.zeros(0, np.float32), np.zeros(0, np.float32)) == 0.0


def test_cli_train_cartpole_and_gif_free_eval(tmp_path, capsys):
    run = str(tmp_path / "cp")
    rc = main(["train", "--env", "CartPole-v1", "--workers", "2", "--total-steps", "600",
               "--run-dir", run, "--quiet", "--no-tensorboard"])
    assert rc == 0
    ck = load_checkpoint(run)
    assert ck.meta["network"]["name"] == "mlp-lstm"
    # the vector specs' Adam default (config.VECTOR_SPEC_ADAM_LR) is what the run used
    assert ck.meta["optimizer_scalars"]["lr"] == pytest.approx(3e-4)
    assert set(ck.opt_arrays) == {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}  # AMSGrad
    assert main(["eval", run, "--which", "latest", "--episodes", "3", "--sample"]) == 0
    assert "3 episodes (sampled)" in capsys.readouterr().out


def test_one_worker_fixed_seed_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.import_module("a3c_core.train.build"), "OBS_NORM_FRAMES", 100)
    params = []
    for k in range(2):
        cfg = Config(env="doom:basic", workers=1, total_steps=300, seed=7, quiet=True,
                     tensorboard=False, checkpoint_interval=0,
                     run_dir=str(tmp_path / f"r{k}"))
        res = Trainer(cfg).run()
        params.append(load_checkpoint(res.run_dir).params)
    np.testing.assert_array_equal(params[0], params[1])
    cfg = Config(env="doom:basic", workers=1, total_steps=300, seed=8, quiet=True,
                 tensorboard=False, checkpoint_interval=0,
                 run_dir=str(tmp_path / "r2"))
    other = load_checkpoint(Trainer(cfg).run().run_dir).params
    assert not np.array_equal(params[0], other)


def test_bad_config_and_unknown_env_are_clear(tmp_path, capsys):
    assert main(["train", "--t-max", "0", "--run-dir", str(tmp_path / "x")]) == 2
    assert "'t_max'" in capsys.readouterr().err
    assert main(["train", "--env", "doom:no_such_scenario", "--run-dir", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "no_such_scenario" in err and "basic" in err
    assert main(["train", "--env", "NoSuchEnv-v9", "--run-dir", str(tmp_path / "z")]) == 2
    assert "NoSuchEnv-v9" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "y")


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "100",
                 "--run-dir", run, "--quiet", "--no-tensorboard"]) == 0
    before = open(os.path.join(run, "checkpoints", "latest.npz"), "rb").read()
    assert main(["train", "--env", "CartPole-v1", "--run-dir", run, "--quiet"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert open(os.path.join(run, "checkpoints", "latest.npz"), "rb").read() == before


def test_resume_from_corrupt_checkpoint_fails_and_keeps_file(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "100",
                 "--run-dir", run, "--quiet", "--no-tensorboard"]) == 0
    path = os.path.join(run, "checkpoints", "latest.npz")
    data = open(path, "rb").read()
    with open(path, "wb") as fh:
        fh.write(data[: len(data) // 3])
    assert main(["train", "--resume", run, "--total-steps", "300", "--quiet"]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert open(path, "rb").read() == data[: len(data) // 3]
    assert main(["train", "--resume", str(tmp_path / "missing"), "--quiet"]) == 2


def test_worker_exception_stops_run_and_checkpoints(tmp_path, monkeypatch):
    cfg = Config(env="CartPole-v1", workers=2, total_steps=10_000_000, quiet=True,
                 tensorboard=False, checkpoint_interval=0, run_dir=str(tmp_path / "run"))
    trainer = Trainer(cfg)
    calls = {"n": 0}
    real = trainer.store.on_episode

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated worker crash")
        return real(*args, **kw)

    trainer.store.on_episode = flaky
    with pytest.raises(TrainingError) as ei:
        trainer.run()
    assert "simulated worker crash" in ei.value.worker_tracebacks[0][1]
    ck = load_checkpoint(str(tmp_path / "run"))
    assert ck.meta["counters"]["steps"] > 0
    summary = json.load(open(os.path.join(str(tmp_path / "run"), "summary.json")))
    assert summary["status"] == "failed"


def test_target_reward_stop_records_the_average_that_met_it(tmp_path):
    # random CartPole play averages ~22, so a target of 15 over 100 episodes is met at once
    cfg = Config(env="CartPole-v1", workers=2, total_steps=1_000_000, quiet=True,
                 tensorboard=False, checkpoint_interval=0, target_reward=15.0,
                 run_dir=str(tmp_path / "run"))
    res = Trainer(cfg).run()
    summary = json.load(open(os.path.join(str(tmp_path / "run"), "summary.json")))
    assert summary["stop_reason"] == "target_reward"
    hit = summary["target_reached"]
    # the window that met the target, not the final one (episodes in flight at the stop
    # still land after it): its own average, at or before the run's end
    assert hit["moving_avg"] >= 15.0
    assert 0 < hit["steps"] <= res.steps and 100 <= hit["episodes"] <= res.episodes
    assert hit["seconds"] <= res.seconds
    # a run that stops for another reason records none
    cfg2 = Config(env="CartPole-v1", workers=1, total_steps=300, quiet=True, tensorboard=False,
                  checkpoint_interval=0, run_dir=str(tmp_path / "run2"))
    Trainer(cfg2).run()
    summary2 = json.load(open(os.path.join(str(tmp_path / "run2"), "summary.json")))
    assert summary2["stop_reason"] == "total_steps" and summary2["target_reached"] is None


def test_keyboard_interrupt_writes_checkpoint(tmp_path):
    cfg = Config(env="CartPole-v1", workers=2, total_steps=10_000_000, quiet=True,
                 tensorboard=False, checkpoint_interval=0, run_dir=str(tmp_path / "run"))
    trainer = Trainer(cfg)
    real_wait = trainer.stop_event.wait
    ticks = {"n": 0}

    def wait(timeout=None):
        ticks["n"] += 1
        if ticks["n"] == 5:
            raise KeyboardInterrupt
        return real_wait(timeout)

    trainer.stop_event.wait = wait
    res = trainer.run()
    assert res.status == "interrupted"
    assert load_checkpoint(str(tmp_path / "run")).meta["counters"]["steps"] > 0


@pytest.mark.slow
def test_real_sigint_stops_cleanly_with_checkpoint(tmp_path):
    """Ctrl-C (SIGINT) on the real CLI: workers stop, a loadable checkpoint, no traceback."""
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "a3c_core", "train", "--env", "CartPole-v1", "--workers", "2",
         "--total-steps", "0", "--total-seconds", "120", "--run-dir", str(run), "--quiet",
         "--no-tensorboard"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 90
        while time.time() < deadline:  # wait until episodes are being logged
            ep = run / "episodes.csv"
            if ep.exists() and ep.stat().st_size > 200:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in out
    ck = load_checkpoint(str(run))
    assert ck.meta["counters"]["steps"] > 0
    assert json.load(open(run / "summary.json"))["status"] == "interrupted"


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_workers_are_pinned_and_main_thread_is_not(tmp_path):
    before = os.sched_getaffinity(0)
    cfg = Config(env="CartPole-v1", workers=2, total_steps=400, quiet=True, tensorboard=False,
                 checkpoint_interval=0, run_dir=str(tmp_path / "run"))
    trainer = Trainer(cfg)
    assert os.sched_getaffinity(0) == before  # restored after building worker 0's env
    seen = {}
    real = trainer.store.on_episode

    def record(wid, *args, **kw):
        seen[wid] = os.sched_getaffinity(0)
        return real(wid, *args, **kw)

    trainer.store.on_episode = record
    trainer.run()
    cores = sorted(before)
    assert seen and all(mask == {cores[w % len(cores)]} for w, mask in seen.items())
    assert os.sched_getaffinity(0) == before


def test_resume_with_mismatched_env_is_refused_and_keeps_checkpoint(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "100",
                 "--run-dir", run, "--quiet", "--no-tensorboard"]) == 0
    path = os.path.join(run, "checkpoints", "latest.npz")
    before = open(path, "rb").read()
    assert main(["train", "--resume", run, "--env", "Acrobot-v1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and ("parameters" in err or "Acrobot" in err)
    assert open(path, "rb").read() == before


def test_a_config_toml_with_top_level_env_options_resumes_with_them(tmp_path, capsys):
    """A run's config.toml as versions before ``env_options`` wrote it (each
    env option, Atari's too, and the fields that became constants at the top
    level): ``--resume`` builds the env with the options it trained with
    (the full frame, not defend_the_line's band: a checkpoint error
    otherwise), with nothing to report, and writes today's form back."""
    run = str(tmp_path / "run")
    assert main(["train", "--env", "doom:defend_the_line", "--view", "full", "--workers", "1",
                 "--total-steps", "100", "--quiet", "--no-tensorboard", "--run-dir", run]) == 0
    conf = os.path.join(run, "config.toml")
    lines = [line for line in open(conf).read().splitlines()
             if not line.startswith("env_options =")]
    lines += ["noop_max = 30", "terminal_on_life_loss = false", "health_reward = 0.0",
              "ammo_reward = 0.0", 'action_set = "buttons"', 'view = "full"',
              "reward_window = 100", "max_skipped_updates = 100", "lr_anneal_floor = 0.1",
              "value_coef = 0.5"]
    with open(conf, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["train", "--resume", run, "--total-steps", "200", "--quiet"]) == 0
    out = capsys.readouterr()
    assert "ignored" not in out.out and "error" not in out.err, out
    assert load_checkpoint(run).env_spec["view"] == "full"
    assert Config.from_toml(conf, saved_run=True).env_options == {
        "health_reward": 0.0, "ammo_reward": 0.0, "action_set": "buttons", "view": "full"}
    assert "\nview =" not in open(conf).read()            # in env_options now


def test_resume_with_a_larger_budget_anneals_over_it(tmp_path):
    """--lr-anneal with --lr-anneal-steps 0 decays over the config's
    total_steps: a run resumed with a larger --total-steps anneals over the
    new budget (its learning rate is not held at the floor past the old
    one), and one resumed without the anneal trains at the constant rate;
    the step count comes from the checkpoint, the horizon from the config,
    the floor is 0.1 x lr."""
    run = str(tmp_path / "run")
    base = ["--env", "CartPole-v1", "--workers", "1", "--quiet", "--no-tensorboard"]
    assert main(["train", *base, "--total-steps", "200", "--lr-anneal", "--lr-anneal-steps", "0",
                 "--run-dir", run]) == 0
    ck = load_checkpoint(run)
    assert ck.meta["optimizer_scalars"]["anneal_steps"] == 200
    assert ck.meta["optimizer_scalars"]["anneal_floor"] == pytest.approx(0.1)
    assert ck.meta["counters"]["steps"] >= 200          # lr is at its floor from here on at 200
    assert main(["train", "--resume", run, "--total-steps", "1000", "--quiet"]) == 0
    ck2 = load_checkpoint(run)
    assert ck2.meta["optimizer_scalars"]["anneal_steps"] == 1000
    assert ck2.meta["optimizer_scalars"]["step"] > ck.meta["optimizer_scalars"]["step"]
    assert not np.array_equal(ck2.params, ck.params)   # the weights moved
    params_before = ck2.params.copy()
    assert main(["train", "--resume", run, "--total-steps", "1200", "--no-lr-anneal",
                 "--quiet"]) == 0
    ck3 = load_checkpoint(run)
    assert ck3.meta["optimizer_scalars"]["anneal_steps"] == 0
    assert not np.array_equal(ck3.params, params_before)   # lr > 0: the weights moved
    # a fixed horizon (the default form) does not follow the budget on resume
    assert main(["train", "--resume", run, "--total-steps", "1400", "--lr-anneal",
                 "--lr-anneal-steps", "5000", "--quiet"]) == 0
    ck4 = load_checkpoint(run)
    assert ck4.meta["optimizer_scalars"]["anneal_steps"] == 5000
    assert ck4.meta["optimizer_scalars"]["anneal_floor"] == pytest.approx(0.1)


@pytest.mark.parametrize("extra, want", [
    ({}, (False, 2e-4, 1_000_000, 0.1)),         # doom-lstm defaults, basic's 8 envs: 2x
    ({"envs_per_worker": 1}, (False, 1e-4, 1_000_000, 0.1)),   # the paper's worker
    ({"total_steps": 0, "total_seconds": 60.0}, (False, 2e-4, 1_000_000, 0.1)),  # budget-free
    ({"lr_anneal_steps": 0}, (False, 2e-4, 50_000, 0.1)),      # over the run's budget
    ({"lr_anneal": False, "adam_amsgrad": True, "lr": 3e-4}, (True, 3e-4, 0, 0.1)),
    ({"spec": "doom-ff"}, (False, 2e-4, 0, 0.1)),
])
def test_trainer_builds_the_documented_adam_defaults(tmp_path, extra, want, monkeypatch):
    """The trainer's Adam follows Config's spec defaults: doom-lstm's anneals over
    its first 1M steps to a tenth, whatever the budget; explicit values and
    other specs do not."""
    monkeypatch.setattr(importlib.import_module("a3c_core.train.build"), "OBS_NORM_FRAMES", 100)
    kw = dict(env="doom:basic", workers=1, total_steps=50_000, quiet=True, tensorboard=False,
              checkpoint_interval=0,  run_dir=str(tmp_path / "run"))
    kw.update(extra)
    trainer = Trainer(Config(**kw))
    try:
        opt = trainer.shared.optimizer
        assert (opt.amsgrad, opt.lr, opt.anneal_steps, opt.anneal_floor) == \
            (want[0], pytest.approx(want[1]), want[2], pytest.approx(want[3]))
        if want[2]:
            lr0 = opt.lr_at(0)
            assert opt.lr_at(want[2] // 2) == pytest.approx(lr0 * max(want[3], 0.5))
            assert opt.lr_at(10 * want[2]) == pytest.approx(lr0 * want[3])
    finally:
        trainer.close()


def test_a_resumed_run_keeps_the_rate_it_trained_with(tmp_path, monkeypatch):
    """lr 0 means "the default": a run resumed after the default changed (here:
    the vector specs' Adam rate, patched) keeps the rate its checkpoint
    recorded; an explicit --lr on resume still wins."""
    import dataclasses

    from a3c_core.envs import families

    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--quiet", "--no-tensorboard",
                 "--total-steps", "200", "--run-dir", run]) == 0
    ck = load_checkpoint(run)
    assert ck.meta["config"]["lr"] == 0.0
    assert ck.meta["optimizer_scalars"]["lr"] == pytest.approx(families.VECTOR_TUNING.adam_lr)
    # "a newer default": the gym family's record with another rate for the vector specs
    newer = dataclasses.replace(families.VECTOR_TUNING, adam_lr=1e-3)
    gym = dataclasses.replace(families.GYM, defaults=dataclasses.replace(
        families.GYM.defaults, tuning={"mlp": newer, "mlp-lstm": newer}))
    monkeypatch.setattr(families, "FAMILIES",
                        [gym if f is families.GYM else f for f in families.FAMILIES])
    from a3c_core.train.config import resolve

    assert resolve(Config(env="CartPole-v1"), "vector").lr == pytest.approx(1e-3)
    base = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    for lr, want in ((0.0, ck.meta["optimizer_scalars"]["lr"]), (5e-5, 5e-5)):
        trainer = Trainer(base.replace(run_dir=run, lr=lr, total_steps=400), resume=run)
        try:
            assert trainer.shared.optimizer.lr == pytest.approx(want)
            assert ("as trained" in trainer.resume_note) == (lr == 0.0)
        finally:
            trainer.close()
    fresh = Trainer(Config(env="CartPole-v1", workers=1, quiet=True, tensorboard=False,
                           run_dir=str(tmp_path / "fresh")))
    try:
        assert fresh.shared.optimizer.lr == pytest.approx(1e-3)        # a new run: the new default
    finally:
        fresh.close()
    # a saved rate no config could hold (a corrupt checkpoint) is not used: the default is
    meta = dict(ck.meta, optimizer_scalars=dict(ck.meta["optimizer_scalars"], lr=float("inf")))
    save_checkpoint(os.path.join(run, "checkpoints", "latest.npz"), ck.params, meta,
                    opt_arrays=ck.opt_arrays)
    trainer = Trainer(base.replace(run_dir=run, total_steps=400), resume=run)
    try:
        assert trainer.shared.optimizer.lr == pytest.approx(1e-3)
    finally:
        trainer.close()


def test_a_resumed_run_keeps_the_defaults_it_trained_with(tmp_path, monkeypatch):
    """config.toml holds the family defaults as resolved when the run started
    (Config.pinned), so a newer default (here: the anneal switched on for the
    vector specs) does not change a resumed run; a run saved before that
    (its config.toml leaves lr_anneal unset) keeps the anneal its checkpoint
    trained with, and says so; a flag still overrides both."""
    import dataclasses

    from a3c_core.envs import families
    from a3c_core.train.config import resolve

    run = str(tmp_path / "run")
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--quiet", "--no-tensorboard",
                 "--total-steps", "200", "--seed", "3", "--run-dir", run]) == 0
    saved = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    r = resolve(Config(env="CartPole-v1"), "vector")
    assert (saved.lr_anneal, saved.adam_amsgrad, saved.obs_norm, saved.reward_clip,
            saved.truncation_bootstrap, saved.normalize_advantages, saved.frame_skip,
            saved.gae_lambda) == \
        (False, r.amsgrad, r.obs_norm, r.reward_clip, r.truncation_bootstrap,
         r.normalize_advantages, r.env_args["frame_skip"], r.gae_lambda)
    assert saved.seed == 3 and saved.lr == 0.0 and saved.spec == "auto"   # set ones as they were
    assert load_checkpoint(run).meta["optimizer_scalars"]["anneal_steps"] == 0
    # a newer version: the vector specs anneal by default
    newer = dataclasses.replace(families.VECTOR_TUNING, lr_anneal=True)
    gym = dataclasses.replace(families.GYM, defaults=dataclasses.replace(
        families.GYM.defaults, tuning={"mlp": newer, "mlp-lstm": newer}))
    monkeypatch.setattr(families, "FAMILIES",
                        [gym if f is families.GYM else f for f in families.FAMILIES])
    assert resolve(Config(env="CartPole-v1", total_steps=400), "vector").anneal_steps > 0
    for unset in (False, True):     # this version's config.toml, and an older one's
        base = saved.replace(run_dir=run, total_steps=400, lr_anneal=None if unset else False)
        trainer = Trainer(base, resume=run)
        try:
            assert trainer.shared.optimizer.anneal_steps == 0
            assert ("lr anneal off as trained" in trainer.resume_note) == unset
        finally:
            trainer.close()
    trainer = Trainer(saved.replace(run_dir=run, total_steps=400, lr_anneal=True), resume=run)
    try:
        assert trainer.shared.optimizer.anneal_steps > 0          # the flag wins
    finally:
        trainer.close()


def test_a_resumed_image_run_keeps_its_network_frames_and_reward_scale(tmp_path, monkeypatch):
    """A scenario whose defaults change network, frame size and reward
    treatment (as doom:my_way_home's did) does not change a run that trained
    with the old ones: config.toml pins the reward scale and frame size, and
    a run saved before it did keeps the checkpoint's network, frames and
    normalized rewards, and says so; flags still win."""
    import dataclasses

    from a3c_core.envs import families

    monkeypatch.setattr(importlib.import_module("a3c_core.train.build"), "OBS_NORM_FRAMES", 50)
    run = str(tmp_path / "run")
    assert main(["train", "--env", "doom:basic", "--workers", "1", "--quiet", "--no-tensorboard",
                 "--total-steps", "60", "--seed", "1",
                 "--run-dir", run]) == 0
    saved = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    assert (saved.spec, saved.reward_scale, saved.frame_size) == ("auto", 0.0, None)
    # a newer version: basic plays my_way_home's recipe
    doom = dataclasses.replace(families.DOOM, scenarios={"basic": families._MY_WAY_HOME})
    monkeypatch.setattr(families, "FAMILIES",
                        [doom if f is families.DOOM else f for f in families.FAMILIES])
    fresh = Trainer(Config(env="doom:basic", workers=1, quiet=True, tensorboard=False,
                           run_dir=str(tmp_path / "fresh")))
    try:     # a new run: the new defaults
        assert (fresh.spec_name, fresh.pipeline_spec["out_shape"]) == ("atari-lstm", [42, 42])
        assert fresh.normalizer is None
    finally:
        fresh.close()
    old = saved.replace(run_dir=run, total_steps=100, reward_scale=None)  # saved before the pins
    for cfg, noted in ((saved.replace(run_dir=run, total_steps=100), False), (old, True)):
        trainer = Trainer(cfg, resume=run)
        try:
            assert (trainer.spec_name, trainer.pipeline_spec["out_shape"]) == ("doom-lstm", [84, 84])
            assert trainer.normalizer is not None                  # rewards still normalized
            assert ("reward_scale normalized as trained" in trainer.resume_note) == noted
            assert "spec doom-lstm as trained" in trainer.resume_note
        finally:
            trainer.close()
    with pytest.raises(Exception, match="layout|spec|network"):     # a flag wins: another network
        Trainer(old.replace(spec="atari-lstm"), resume=run).close()


def test_checkpoint_counts_only_episodes_whose_rows_are_on_disk(tmp_path):
    """A checkpoint's episode counter never runs ahead of episodes.csv on disk:
    RunCheckpoints.save() reads the counters under the store's episode lock (an episode is
    counted and its row written under it) and flushes the rows first, so a
    run killed right after the checkpoint resumes with no gap in the indices."""
    pytest.importorskip("gymnasium")
    from a3c_core.train.logger import MetricsLogger

    cfg = Config(env="CartPole-v1", workers=1, seed=0, quiet=True, tensorboard=False,
                 checkpoint_interval=0, run_dir=str(tmp_path / "run"))
    tr = Trainer(cfg)
    os.makedirs(os.path.join(tr.run_dir, "checkpoints"), exist_ok=True)
    tr.report.logger = MetricsLogger(tr.run_dir, tensorboard=False)
    try:
        for k in range(3):
            tr.store.record_episode(0, float(k), 10 + k)      # rows buffered, not flushed
        path = tr.checkpoints.save("latest")
        with open(os.path.join(tr.run_dir, "episodes.csv"), newline="") as fh:
            on_disk = [int(r["episode"]) for r in csv.DictReader(fh)]
        assert load_checkpoint(path).meta["counters"]["episodes"] == 3
        assert on_disk == [1, 2, 3]

        # an episode being reported holds the lock: a checkpoint's counter read waits
        inside, release = threading.Event(), threading.Event()
        report = tr.store.on_episode

        def slow_report(*args, **kw):
            inside.set()
            release.wait(10)
            report(*args, **kw)
        tr.store.on_episode = slow_report
        th = threading.Thread(target=tr.store.record_episode, args=(0, 1.0, 5))
        th.start()
        assert inside.wait(10)
        assert not tr.store.episode_lock.acquire(timeout=0.2)
        release.set()
        th.join(10)
        assert tr.store.episode_lock.acquire(timeout=5)
        tr.store.episode_lock.release()
        path = tr.checkpoints.save("latest")
        assert load_checkpoint(path).meta["counters"]["episodes"] == 4
    finally:
        tr.report.logger.close()
        tr.close()
