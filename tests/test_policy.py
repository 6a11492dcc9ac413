"""Policy.load + act on real frames, against an independent numpy pipeline."""
import numpy as np
import pytest

from a3c_core import Policy, build_network
from a3c_core.checkpoint import CheckpointError
from a3c_core.train.config import Config
from a3c_core.train.trainer import Trainer

pytest.importorskip("vizdoom")


@pytest.fixture(scope="module")
def doom_ckpt(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("pol") / "run")
    cfg = Config(env="doom:basic", workers=1, total_steps=60, quiet=True, tensorboard=False,
                 checkpoint_interval=0, run_dir=run)
    res = Trainer(cfg).run()
    return res.checkpoint


def test_policy_act_on_real_frames(doom_ckpt):
    from a3c_core.core.ref import ref_preprocess
    from a3c_core.envs import make_env

    policy = Policy.load(doom_ckpt)
    assert policy.n_actions == 3
    assert policy.action_names == ["MOVE_LEFT", "MOVE_RIGHT", "ATTACK"]
    twin = build_network("doom-lstm", (1, 84, 84), 3)
    twin.params[:] = np.load(doom_ckpt)["params"]
    # doom runs normalize their frames by default: the mean frame and std the
    # trainer measured are in the checkpoint, and the twin applies them by hand
    norm = policy.checkpoint.preprocess_spec["norm"]
    mean = np.array(norm["mean"], np.float64).reshape(84, 84)
    assert norm["frames"] == 2000 and 0.01 < norm["std"] < 0.5
    env = make_env("doom:basic", seed=3)
    try:
        obs = env.reset()
        state, tstate = policy.initial_state(), twin.initial_state()
        for _ in range(10):
            probs, value, new_state = policy.probs(obs, state)
            x = ((ref_preprocess(obs, (84, 84)) - mean) / norm["std"]).astype(np.float32)[None]
            tp, tv, tstate = twin.step(x, tstate)
            np.testing.assert_allclose(probs, tp, rtol=1e-4, atol=1e-6)
            assert value == pytest.approx(float(tv), rel=1e-4, abs=1e-5)
            a, state = policy.act(obs, state, greedy=True)
            assert a == int(np.argmax(probs))
            np.testing.assert_allclose(state[0], new_state[0])
            obs, r, term, trunc = env.step(a)
            if term or trunc:
                break
    finally:
        env.close()


def test_policy_rejects_mismatched_observation(doom_ckpt):
    policy = Policy.load(doom_ckpt)
    with pytest.raises(ValueError, match=r"shape \(84, 84\).*\(120, 160\)"):
        policy.act(np.zeros((84, 84), np.uint8), policy.initial_state())
    with pytest.raises(ValueError, match="uint8"):
        policy.act(np.zeros((120, 160), np.float32), policy.initial_state())


def test_policy_load_errors(tmp_path, doom_ckpt):
    with pytest.raises(CheckpointError, match="not found"):
        Policy.load(str(tmp_path / "nope.npz"))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(open(doom_ckpt, "rb").read()[:1000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        Policy.load(str(bad))


def test_policy_needs_only_numpy_and_numba(doom_ckpt, tmp_path):
    """Load + act in a process where vizdoom, gymnasium, torch, threadpoolctl cannot be imported."""
    import subprocess
    import sys

    frame = np.random.default_rng(0).integers(0, 256, (120, 160), dtype=np.uint8)
    np.save(tmp_path / "frame.npy", frame)
    code = f"""
import sys
for name in ("vizdoom", "gymnasium", "torch", "tensorflow", "threadpoolctl", "tensorboardX"):
    sys.modules[name] = None  # any import of these now fails
import numpy as np
from a3c_core import Policy
p = Policy.load({doom_ckpt!r})
s = p.initial_state()
a, s = p.act(np.load({str(tmp_path / 'frame.npy')!r}), s, greedy=True)
print("ACTION", a)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    policy = Policy.load(doom_ckpt)
    expected, _ = policy.act(frame, policy.initial_state(), greedy=True)
    assert f"ACTION {expected}" in out.stdout
