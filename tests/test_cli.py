"""The a3c command line, run as a real subprocess: version, help texts, eval, plot, compile."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from a3c_core import Policy, build_network
from a3c_core.checkpoint import save_checkpoint
from cartpole_ends import cartpole_end_fits


def a3c(*args, env=None, timeout=120):
    """Run ``python -m a3c_core ARGS``; returns the CompletedProcess (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "a3c_core", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def test_version_both_entry_points():
    from a3c_core import __version__

    out = a3c("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"a3c_core {__version__}"
    script = os.path.join(os.path.dirname(sys.executable), "a3c")
    if os.path.exists(script):
        out = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"a3c_core {__version__}"


def test_train_help_renders_and_says_each_default_once():
    out = a3c("train", "--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "option_strings" not in text and "{'" not in text
    assert "--pin-threads" in text
    from a3c_core.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    from dataclasses import fields

    from a3c_core.train.config import Config

    def defaults_said(help_text):
        h = " ".join(help_text.lower().split())
        assert "default: none" not in h, help_text      # an unset field's help says it in words
        return h.count("(default") + h.count("; default:")

    names = {f.name for f in fields(Config)}
    for action in train._actions:
        if action.dest in names:
            assert defaults_said(action.help) == 1, (action.dest, action.help)
    max_grad_norm = next(a for a in train._actions if a.dest == "max_grad_norm")
    assert max_grad_norm.help.endswith(f"(default: {Config().max_grad_norm!r})")
    # the env options' flags: their help from the family record, the family's default once
    health = next(a for a in train._actions if a.dest == "health_reward")
    assert health.help.endswith("else 0 = off"), health.help
    noop = next(a for a in train._actions if a.dest == "noop_max")
    assert noop.help == ("Atari: up to this many no-op actions at the start of an episode "
                         "(0 = off) (default: 30)")
    assert "--env-options" not in text       # set by the options' own flags
    # rendered: every option's block states one default
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])[1:]
    for block in blocks:
        if not block.startswith(("-h", "--help", "--config", "--resume")):
            assert defaults_said(block) == 1, block


def test_a_removed_flag_is_an_error_saying_why(tmp_path):
    """``a3c train --entropy-target 0.1``: exit 2, one error line naming the
    flag and why it went, nothing run or written."""
    from a3c_core.train.config import REMOVED_FIELDS

    run = tmp_path / "run"
    out = a3c("train", "--env", "CartPole-v1", "--entropy-target", "0.1", "--run-dir", str(run),
              "--total-steps", "100", "--quiet")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == ("a3c train: error: --entropy-target was removed: "
                                  + REMOVED_FIELDS["entropy_target"])
    assert "Traceback" not in out.stderr and not run.exists()
    out = a3c("train", "--env", "CartPole-v1", "--value-coef", "1", "--run-dir", str(run))
    assert (out.returncode, out.stderr.strip()) == (2, "a3c train: error: --value-coef was removed: "
                                                       + REMOVED_FIELDS["value_coef"])
    assert not run.exists()
    # each removed knob's flag, as a flag or with its value
    from a3c_core.cli import main

    for name in REMOVED_FIELDS:
        flag = "--" + name.replace("_", "-")
        for argv in ([flag, "1"], [f"{flag}=1"]):
            assert main(["train", "--env", "CartPole-v1", *argv]) == 2, argv


def test_the_env_option_flags_set_env_options(tmp_path):
    """``--health-reward 1``, ``--view band``, ``--action-set combos``,
    ``--noop-max 0``, ``--terminal-on-life-loss``, ... each set their option
    in ``env_options``, over a ``--config`` file's; an option the env's
    family does not take is an error naming it, the env and what it takes."""
    from a3c_core.cli import build_parser, config_from_args
    from a3c_core.train.config import ConfigError

    def cfg(*argv):
        return config_from_args(build_parser().parse_args(["train", *argv]))

    doom = cfg("--env", "doom:defend_the_line", "--health-reward", "1", "--view", "full",
               "--action-set", "combos", "--ammo-reward", "0.5")
    assert doom.env_options == {"health_reward": 1.0, "ammo_reward": 0.5, "action_set": "combos",
                                "view": "full"}
    atari = cfg("--env", "ALE/Pong-v5", "--noop-max", "0", "--terminal-on-life-loss",
                "--repeat-action-probability", "0")
    assert atari.env_options == {"noop_max": 0, "terminal_on_life_loss": True,
                                 "repeat_action_probability": 0.0}
    assert cfg("--env", "ALE/Pong-v5", "--no-terminal-on-life-loss").env_options == {
        "terminal_on_life_loss": False}
    assert cfg().env_options == {}
    toml = tmp_path / "c.toml"
    toml.write_text('env = "doom:defend_the_line"\n[env_options]\nview = "full"\nhealth_reward = 1\n')
    both = cfg("--config", str(toml), "--view", "band")
    assert both.env_options == {"view": "band", "health_reward": 1.0}
    # a file's options for the env the command line names
    toml.write_text('[env_options]\nnoop_max = 0\n')
    assert cfg("--config", str(toml), "--env", "atari:Pong").env_options == {"noop_max": 0}
    with pytest.raises(ConfigError, match="'env_options.view' = 'band': applies to doom envs only; "
                                          "CartPole-v1 is a gym env"):
        cfg("--env", "CartPole-v1", "--view", "band")
    with pytest.raises(ConfigError, match="'env_options.noop_max' = 0: applies to atari envs only"):
        cfg("--noop-max", "0")
    with pytest.raises(ConfigError, match="'env_options.view' = 'wide': choose one of full, band"):
        cfg("--view", "wide")


def test_resume_with_another_run_dir_is_a_clear_error(tmp_path, capsys):
    """``a3c train --resume R --run-dir OTHER``: exit 2 naming both, nothing
    written to OTHER; ``--run-dir R`` (the same directory) is accepted."""
    from a3c_core.cli import main

    run = tmp_path / "run"
    assert main(["train", "--env", "CartPole-v1", "--workers", "1", "--total-steps", "300",
                 "--run-dir", str(run), "--quiet"]) == 0
    other = tmp_path / "other"
    assert main(["train", "--resume", str(run), "--run-dir", str(other)]) == 2
    err = capsys.readouterr().err
    assert "--run-dir" in err and "--resume" in err and "Traceback" not in err
    assert not other.exists()
    assert main(["train", "--resume", str(run), "--run-dir", str(run), "--total-steps", "600",
                 "--quiet"]) == 0


def test_eval_help_documents_every_option():
    out = a3c("eval", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert re.search(r"--episodes N episodes to play \(default: 10\)", text), text
    assert re.search(r"--seed SEED seed of the env and of action sampling \(default: 0\)", text), text
    assert re.search(r"-v, --verbose print every episode's return, length and end", text), text


def _vector_ckpt(path, **meta_extra):
    net = build_network("mlp-lstm", (4,), 2, seed=3)
    policy = Policy.from_network(net, (4,), env_id="gym:CartPole-v1")
    meta = dict(policy.meta, **meta_extra)
    meta["env"] = dict(meta["env"], frame_skip=1, obs_dtype="float32")
    return save_checkpoint(path, net.params, meta)


@pytest.mark.parametrize("content", [os.urandom(2048), b'env = "doom:basic"\nseed = 0\n'])
def test_eval_on_a_non_checkpoint(tmp_path, content):
    p = tmp_path / "config.toml"
    p.write_bytes(b"x" + content)
    out = a3c("eval", str(p))
    assert out.returncode == 2
    assert "is not an .npz checkpoint" in out.stderr and "pickled" not in out.stderr
    assert "Traceback" not in out.stderr


def test_eval_refuses_non_finite_checkpoint(tmp_path):
    p = _vector_ckpt(str(tmp_path / "c.npz"))
    z = dict(np.load(p))
    z["params"] = np.full_like(z["params"], np.nan)
    np.savez(p, **z)
    out = a3c("eval", p)
    assert out.returncode == 2 and "not finite" in out.stderr and "Traceback" not in out.stderr


def test_eval_with_a_mismatched_env_is_a_clear_error(tmp_path):
    pytest.importorskip("gymnasium")
    net = build_network("doom-lstm", (1, 84, 84), 3)
    p = Policy.from_network(net, (120, 160), env_id="doom:basic").save(str(tmp_path / "doom.npz"))
    out = a3c("eval", p, "--env", "MountainCar-v0", "--episodes", "1")
    assert out.returncode == 2, out.stdout
    assert "Traceback" not in out.stderr
    assert "does not match the checkpoint" in out.stderr and "'doom:basic'" in out.stderr
    assert "(120, 160)" in out.stderr and "(2,)" in out.stderr


def test_eval_on_its_own_env_with_other_actions_says_the_env_changed(tmp_path):
    """The saved id and the env's agree but the actions do not (a deathmatch
    run saved before its delta buttons gained a '-' action): the message says
    the env changed, not to leave out an --env the user never gave."""
    from types import SimpleNamespace

    from a3c_core.evaluate import EvalError, check_env_matches

    net = build_network("doom-lstm", (1, 84, 84), 20)
    policy = Policy.load(Policy.from_network(net, (120, 160), env_id="doom:deathmatch")
                         .save(str(tmp_path / "dm.npz")))
    env = SimpleNamespace(obs_shape=(120, 160), obs_kind="image", n_actions=23)
    with pytest.raises(EvalError, match="actions: 20 in the checkpoint, 23 in the env") as e:
        check_env_matches(policy, env, "doom:deathmatch")
    assert "train a new run" in str(e.value) and "leave out --env" not in str(e.value)
    check_env_matches(policy, SimpleNamespace(obs_shape=(120, 160), obs_kind="image",
                                              n_actions=20), "doom:deathmatch")


def test_eval_says_what_it_loaded(tmp_path):
    pytest.importorskip("gymnasium")
    run = tmp_path / "run"
    ckpt = _vector_ckpt(str(run / "checkpoints" / "latest.npz"), counters={"steps": 40000},
                        moving_avg=21.5, best_moving_avg=30.0, avg_window=100)
    out = a3c("eval", str(run), "--episodes", "2", "-v")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"loaded {ckpt}")
    assert "step 40,000" in first and "21.50 over the last 100 episodes" in first and "best 30.00" in first
    assert "episode 2: return" in out.stdout
    assert "gym:CartPole-v1: 2 episodes (greedy)" in out.stdout
    # CartPole ends by falling (terminated) or at 500 steps (truncated, unless
    # the pole falls on that step too: test_gym_truncation_passes_through)
    ends = re.findall(r"episode \d: return ([\d.]+), (\d+) steps, (terminated|truncated)\n", out.stdout)
    assert len(ends) == 2 and all(cartpole_end_fits(int(n), end) for _, n, end in ends)
    total = re.search(r"episode ends: (\d+) (\w+)(?:, (\d+) (\w+))?\n", out.stdout)
    assert total and sum(int(g) for g in total.groups()[::2] if g) == 2


def test_eval_gif_is_real_time_and_reports_the_file(tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("PIL")
    pytest.importorskip("pygame")  # CartPole's rgb_array rendering
    from PIL import Image

    ckpt = _vector_ckpt(str(tmp_path / "c.npz"))
    gif = str(tmp_path / "ep.gif")
    out = a3c("eval", ckpt, "--episodes", "1", "--gif", gif)
    assert out.returncode == 0, out.stderr
    with Image.open(gif) as im:
        n = im.n_frames
        durations = []
        for i in range(n):
            im.seek(i)
            durations.append(im.info["duration"])
    # CartPole renders at 50 fps, frame skip 1: 20 ms per step
    m = re.search(r"wrote .*ep\.gif: (\d+) steps of episode 1 as (\d+) GIF frames.*, 20 ms per step "
                  r"\(frame skip 1 at the env's render_fps 50: 20 ms of game time\), ([\d.]+) s in all",
                  out.stdout)
    assert m, out.stdout
    steps, frames, seconds = int(m[1]), int(m[2]), float(m[3])
    assert frames == n and seconds == pytest.approx(sum(durations) / 1000) == pytest.approx(steps * 0.02)


def test_write_gif_merges_identical_frames_keeping_real_time(tmp_path):
    pytest.importorskip("PIL")
    from a3c_core.envs.doom import DoomEnv
    from a3c_core.evaluate import write_gif

    class Doomish(DoomEnv):     # no engine: a closed game falls back to ViZDoom's 35 tics/s
        def __init__(self):
            self.env_id, self.frame_skip, self._game = "doom:basic", 4, None

    step_s, how = Doomish().seconds_per_step()
    assert step_s == pytest.approx(4 / 35) and how == "frame skip 4 at 35 tics/s"
    a = np.zeros((8, 8, 3), np.uint8)
    b = np.full((8, 8, 3), 200, np.uint8)
    frames = [a, a, a, b, a, b, b]
    info = write_gif(str(tmp_path / "x.gif"), frames, step_s)
    assert info["steps"] == 7 and info["frames"] == 4  # a a a | b | a | b b
    assert info["frame_ms"] == 110  # 114 ms in GIF's 10 ms units
    assert info["seconds"] == pytest.approx(7 * 0.110)


def _fake_run(d, seed):
    rng = np.random.default_rng(seed)
    os.makedirs(d)
    with open(os.path.join(d, "episodes.csv"), "w") as fh:
        fh.write("episode,wall_time,step,worker,return,length\n")
        for i in range(150):
            fh.write(f"{i},{i * 0.5:.3f},{i * 100},{i % 2},{rng.normal(i / 3):.3f},{50}\n")
        fh.write("150,75.0,15")  # torn last line of a killed run
    with open(os.path.join(d, "metrics.csv"), "w") as fh:
        fh.write("wall_time,step,name,value\n")
        for i in range(30):
            for name in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/sps"):
                fh.write(f"{i * 2.5},{i * 500},{name},{rng.random():.4f}\n")


def test_plot_overlays_runs_and_prints_the_png(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [str(tmp_path / f"run{k}") for k in range(2)]
    for k, r in enumerate(runs):
        _fake_run(r, k)
    out_png = str(tmp_path / "out" / "curves.png")
    out = a3c("plot", *runs, "-o", out_png, "--window", "20", "--target", "30")
    assert out.returncode == 0, out.stderr
    assert f"wrote {out_png}" in out.stdout
    assert "run0: 150 episodes, final 20-episode average" in out.stdout
    assert "reached 30" in out.stdout or "did not reach 30" in out.stdout
    with open(out_png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    from a3c_core.plot import moving_average, read_run

    run = read_run(runs[0])
    assert run["episodes"]["return"].size == 150
    assert set(run["metrics"]) == {"losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/sps"}
    x = run["episodes"]["return"]
    np.testing.assert_allclose(moving_average(x, 20)[-1], x[-20:].mean())
    np.testing.assert_allclose(moving_average(x, 20)[4], x[:5].mean())
    # one run: the PNG goes into the run directory
    from a3c_core.cli import main

    assert main(["plot", runs[1]]) == 0
    assert os.path.getsize(os.path.join(runs[1], "learning_curve.png")) > 1000


def test_resume_from_a_checkpoint_file_names_its_run_directory(tmp_path):
    """``a3c train --resume RUN/checkpoints/latest.npz``: exit 2, saying that
    --resume takes a run directory and which one that file belongs to; a
    missing path is still "run directory not found"; nothing is written."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    f = run / "checkpoints" / "latest.npz"
    f.write_bytes(b"not read")
    out = a3c("train", "--resume", str(f))
    assert out.returncode == 2, out.stderr
    assert f"--resume takes a run directory, not a file: {f}" in out.stderr
    assert f"its run directory is {run} (a3c train --resume {run})" in out.stderr
    other = tmp_path / "policy.npz"
    other.write_bytes(b"x")
    out = a3c("train", "--resume", str(other))
    assert out.returncode == 2 and "not a file" in out.stderr and "its run directory" not in out.stderr
    out = a3c("train", "--resume", str(tmp_path / "nope"))
    assert out.returncode == 2 and "run directory not found" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.npz", "run"]
    assert [p.name for p in run.iterdir()] == ["checkpoints"]


def test_plot_errors(tmp_path):
    out = a3c("plot", str(tmp_path / "nope"))
    assert out.returncode == 2 and "run directory not found" in out.stderr
    _fake_run(str(tmp_path / "r"), 0)
    code = ("import sys; sys.modules['matplotlib'] = None; from a3c_core.cli import main; "
            f"sys.exit(main(['plot', {str(tmp_path / 'r')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "matplotlib is not installed" in out.stderr and "a3c_core[plot]" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow    # compiles every mlp kernel in a fresh cache (~8 s)
def test_compile_check_in_a_fresh_cache(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    out = a3c("compile", "--check", "--spec", "mlp", env=env)
    assert out.returncode == 1 and "not in the cache" in out.stderr
    m = re.search(r"(\d+) signatures: 0 loaded from the cache, (\d+) compiled", out.stdout)
    assert m and int(m[1]) == int(m[2]) > 0, out.stdout
    # what it compiled was written to NUMBA_CACHE_DIR: a new process loads it all
    out = a3c("compile", "--check", "--spec", "mlp", env=env)
    assert out.returncode == 0, out.stderr
    m = re.search(r"(\d+) signatures: (\d+) loaded from the cache, 0 compiled", out.stdout)
    assert m and int(m[1]) == int(m[2]) > 0, out.stdout
    assert str(tmp_path / "cache") in out.stdout
    out = a3c("compile", "--spec", "nope", env=env)
    assert out.returncode == 2 and "unknown spec" in out.stderr


def test_final_line_gives_each_window_once():
    from a3c_core.cli import final_line
    from a3c_core.train.trainer import TrainResult

    full = TrainResult("r", "done", 5000, 2500, 10.0, 80.5, "r/latest.npz", long_avg=79.25,
                       avg_window=100, long_window=1000)
    assert "final raw reward avg100 80.50, avg1000 79.25 (parameters in r/latest.npz)" in final_line(full)
    # 13 episodes (e.g. since a resume): one window, printed once
    short = TrainResult("r", "done", 80, 13, 1.0, 79.92, "r/latest.npz", long_avg=79.92,
                        avg_window=13, long_window=13)
    line = final_line(short)
    assert "final raw reward avg13 79.92 (parameters in r/latest.npz)" in line
    assert line.count("avg13") == 1
    # how the short window's episodes ended, where the env tells
    ends = TrainResult("r", "done", 5000, 2500, 10.0, 1109.4, "r/latest.npz", long_avg=1106.3,
                       avg_window=100, long_window=1000,
                       episode_ends={"died": 69, "ended alive": 31})
    assert ("final raw reward avg100 1109.40 (69 died, 31 ended alive), avg1000 1106.30 "
            "(parameters in r/latest.npz)") in final_line(ends)


def test_reward_windows_count_how_the_short_windows_episodes_ended():
    from a3c_core.train.run_report import RewardWindows

    w = RewardWindows(4, 40)
    assert w.ends() == {}
    for end in ["died", "died", None, "ended alive", "died", "timed out", "died"]:
        w.add(1.0, end)
    # the last 4: "ended alive", "died", "timed out", "died" (None: the env did not tell)
    assert w.ends() == {"died": 2, "ended alive": 1, "timed out": 1}
    assert list(w.ends())[0] == "died"


def test_the_run_line_names_the_backend_and_why(tmp_path):
    """Threads below 8 workers, processes from 8 on (Linux) or with one worker
    per core; the flags force either; the run line says which and why."""
    pytest.importorskip("gymnasium")
    base = ["train", "--env", "CartPole-v1", "--spec", "mlp", "--total-steps", "300",
            "--no-tensorboard", "--quiet"]
    for extra, want in ((["--workers", "2"], "2 worker threads (2 workers < 8"),
                        (["--workers", "9"], "9 worker processes (9 workers >= 8"),
                        (["--workers", "9", "--no-worker-processes"],
                         "9 worker threads (--no-worker-processes)"),
                        (["--workers", "1", "--worker-processes"],
                         "1 worker processes (--worker-processes)")):
        r = a3c(*base, *extra, "--run-dir", str(tmp_path / "-".join(extra)))
        assert r.returncode == 0, r.stdout + r.stderr
        assert want in r.stdout, r.stdout


@pytest.mark.slow
def test_health_gathering_trains_with_its_health_reward_and_logs_time_alive(tmp_path):
    """doom:health_gathering's default health reward is on (the run line says
    so) and the logged scores are the scenario's own: 4 per step alive
    (frame skip 4), -100 at death, with no trace of the shaping."""
    import csv

    pytest.importorskip("vizdoom")
    out = a3c("train", "--env", "doom:health_gathering", "--workers", "1", "--total-steps", "3000",
              "--run-dir", str(tmp_path / "run"), "--quiet", "--checkpoint-interval", "0",
              timeout=300)
    assert out.returncode == 0, out.stderr
    assert "health reward: 1 x each step's HEALTH change" in out.stdout
    with open(tmp_path / "run" / "episodes.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for r in rows:
        ret, n = float(r["return"]), int(r["length"])
        assert ret in (4 * n - 100, 4 * n), r


def test_a_resume_whose_cfg_now_has_other_buttons_is_a_clear_error(tmp_path):
    """A doom:<path.cfg> run whose cfg was edited since (other buttons): the
    resume is an error naming both action lists, before anything is written."""
    vizdoom = pytest.importorskip("vizdoom")
    src = os.path.join(os.path.dirname(vizdoom.__file__), "scenarios", "basic.cfg")
    cfg = tmp_path / "basic.cfg"
    text = open(src).read()
    cfg.write_text(text)
    (tmp_path / "basic.wad").write_bytes(open(os.path.join(os.path.dirname(src), "basic.wad"),
                                              "rb").read())
    run = tmp_path / "run"
    out = a3c("train", "--env", f"doom:{cfg}", "--workers", "1", "--total-steps", "200",
              "--quiet", "--no-tensorboard", "--run-dir", str(run),
              timeout=300)
    assert out.returncode == 0, out.stderr
    ckpt = run / "checkpoints" / "latest.npz"
    before = ckpt.read_bytes()
    cfg.write_text(text.replace("MOVE_RIGHT", "MOVE_RIGHT TURN_LEFT"))
    out = a3c("train", "--resume", str(run), "--total-steps", "400", timeout=300)
    assert out.returncode == 2, out.stdout
    assert "trained with 3 actions (MOVE_LEFT, MOVE_RIGHT, ATTACK), this env has 4 " \
        "(MOVE_LEFT, MOVE_RIGHT, TURN_LEFT, ATTACK); start a new run" in out.stderr
    assert ckpt.read_bytes() == before


def test_a_combos_run_evaluates_with_its_actions_and_resumes_only_with_them(tmp_path):
    """A doom run trained with --action-set combos: its checkpoint records the
    set, ``a3c eval`` rebuilds the 6 combined actions from it, and a resume
    that asks for the shipped buttons is an error naming the flag that fits,
    with the checkpoint left as it was."""
    pytest.importorskip("vizdoom")
    run = tmp_path / "run"
    out = a3c("train", "--env", "doom:defend_the_line", "--action-set", "combos", "--workers", "1",
              "--total-steps", "300", "--quiet", "--no-tensorboard",
              "--run-dir", str(run), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "actions: 6 combinations of the scenario's buttons" in out.stdout
    ckpt = run / "checkpoints" / "latest.npz"
    before = ckpt.read_bytes()
    out = a3c("eval", str(run), "--episodes", "1", "-v", timeout=300)
    assert out.returncode == 0, out.stderr
    # defend_the_line has no timeout: the player's death ends every episode
    assert re.search(r"episode 1: return -?[\d.]+, \d+ steps, died\n", out.stdout), out.stdout
    assert "episode ends: 1 died\n" in out.stdout
    out = a3c("train", "--resume", str(run), "--action-set", "buttons", "--total-steps", "600",
              timeout=300)
    assert out.returncode == 2, out.stdout
    assert "trained with 6 actions (NOOP, ATTACK, TURN_LEFT" in out.stderr
    assert "this env has 3 (TURN_LEFT, TURN_RIGHT, ATTACK); resume with --action-set combos" \
        in out.stderr
    assert ckpt.read_bytes() == before


def test_a_band_view_run_says_so_evaluates_with_it_and_resumes_only_with_it(tmp_path):
    """defend_the_line's default view is the horizon band: the run line says
    so, the checkpoint records it (42x160 input, the crop), ``a3c eval``
    rebuilds it, and a resume that asks for the full frame is an error
    naming the flag that fits, with the checkpoint left as it was."""
    pytest.importorskip("vizdoom")
    from a3c_core.checkpoint import load_checkpoint

    run = tmp_path / "run"
    out = a3c("train", "--env", "doom:defend_the_line", "--workers", "1", "--total-steps", "300",
              "--no-tensorboard", "--log-interval", "60",
              "--run-dir", str(run), timeout=300)
    assert out.returncode == 0, out.stderr
    assert "view: the frame's middle 60 rows at its full width, resized to 42x160" in out.stdout
    ckpt = run / "checkpoints" / "latest.npz"
    saved = load_checkpoint(str(ckpt))
    assert saved.env_spec["view"] == "band"
    assert saved.preprocess_spec["crop"] == [30, 30, 0, 0]
    assert saved.preprocess_spec["out_shape"] == [42, 160]
    assert 'view = "band"' in (run / "config.toml").read_text()
    before = ckpt.read_bytes()
    out = a3c("eval", str(run), "--episodes", "1", timeout=300)
    assert out.returncode == 0, out.stderr
    out = a3c("train", "--resume", str(run), "--view", "full", "--total-steps", "600", timeout=300)
    assert out.returncode == 2, out.stdout
    assert "was trained with the band view, this env has the full one; resume with --view band" \
        in out.stderr
    assert ckpt.read_bytes() == before


def test_a_doom_checkpoint_saved_before_action_sets_evaluates_with_its_buttons(tmp_path):
    """deadly_corridor's default is now combos; a checkpoint saved before the
    env recorded its action set (and view) trained one button per action on
    the whole frame, and ``a3c eval`` rebuilds that (7 actions), not the
    scenario's current default."""
    pytest.importorskip("vizdoom")
    from a3c_core.checkpoint import load_checkpoint
    from a3c_core.evaluate import trained_env_options

    run = tmp_path / "run"
    out = a3c("train", "--env", "doom:deadly_corridor", "--action-set", "buttons", "--workers", "1",
              "--total-steps", "200", "--quiet", "--no-tensorboard",
              "--run-dir", str(run), timeout=300)
    assert out.returncode == 0, out.stderr
    ckpt = load_checkpoint(str(run))
    meta = dict(ckpt.meta, env={k: v for k, v in ckpt.meta["env"].items()
                                if k not in ("action_set", "view")})
    assert meta["env"]["kind"] == "doom" and len(meta["env"]["action_names"]) == 7
    old = tmp_path / "old.npz"
    save_checkpoint(str(old), ckpt.params, meta)
    assert trained_env_options(meta["env"]) == {"action_set": "buttons", "view": "full"}
    assert trained_env_options({"id": "CartPole-v1", "kind": "gym"}) == {}
    out = a3c("eval", str(old), "--episodes", "1", timeout=300)
    assert out.returncode == 0, out.stderr
