"""Image normalization (obs.ObsPipeline's "norm"): its statistics against a
numpy twin, the pipeline against a hand-applied twin, the trainer's
measurement, its checkpoint round trip and resume, and clear errors for a
malformed one."""
import importlib
import os

import numpy as np
import pytest

from a3c_core.core.ref import ref_preprocess
from a3c_core.obs import IMAGE_NORM_MIN_STD, ObsPipeline, estimate_image_norm

SPEC = {"kind": "image", "out_shape": [12, 16], "crop": None}


def _frames(n, seed=0, shape=(30, 40)):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, shape).astype(np.int16)
    return [np.clip(base + rng.integers(-40, 41, shape), 0, 255).astype(np.uint8) for _ in range(n)]


def test_estimate_matches_numpy_twin():
    raw = _frames(50)
    pipe = ObsPipeline(SPEC, raw[0].shape)
    xs = [pipe(f) for f in raw]
    norm = estimate_image_norm(xs)
    stack = np.stack([x.astype(np.float64).ravel() for x in xs])
    mean = stack.mean(0)
    std = np.sqrt(((stack - mean) ** 2).mean())          # every pixel around its own mean
    np.testing.assert_allclose(norm["mean"], mean, rtol=1e-6, atol=1e-7)
    assert norm["std"] == pytest.approx(std, rel=1e-9) and norm["frames"] == 50
    # stored as float32 values: exact through JSON and back
    assert np.array_equal(np.float32(norm["mean"]), mean.astype(np.float32))


def test_constant_frames_get_the_floor_std():
    f = np.full((30, 40), 77, np.uint8)
    pipe = ObsPipeline(SPEC, f.shape)
    norm = estimate_image_norm([pipe(f)] * 5)
    assert norm["std"] == IMAGE_NORM_MIN_STD
    with pytest.raises(ValueError, match="no frames"):
        estimate_image_norm([])


def test_pipeline_applies_the_norm_like_a_hand_twin():
    raw = _frames(20, seed=1)
    plain = ObsPipeline(SPEC, raw[0].shape)
    norm = estimate_image_norm(plain(f) for f in raw)
    pipe = ObsPipeline(dict(SPEC, norm=norm), raw[0].shape)
    mean = np.array(norm["mean"], np.float64).reshape(12, 16)
    for f in _frames(5, seed=2):
        want = (ref_preprocess(f, (12, 16)) - mean) / norm["std"]
        got = pipe(f)
        assert got.shape == (1, 12, 16) and got.dtype == np.float32
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
    # over the frames it was measured on: zero mean per pixel, unit std overall
    out = np.stack([pipe(f)[0] for f in raw]).astype(np.float64)
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-4)
    assert np.sqrt((out ** 2).mean()) == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("norm, match", [
    ({"mean": [0.0] * 10, "std": 0.1}, "mean has 10 values"),
    ({"mean": [0.0] * 192, "std": 0.0}, "std > 0"),
    ({"mean": [float("nan")] + [0.0] * 191, "std": 0.1}, "finite"),
    ({"mean": "abc", "std": 0.1}, "not numeric"),
    ({"std": 0.1}, "'mean' and 'std'"),
])
def test_malformed_norm_is_refused_by_name(norm, match):
    with pytest.raises(ValueError, match=match):
        ObsPipeline(dict(SPEC, norm=norm), (30, 40))
    with pytest.raises(ValueError, match="image observations only"):
        ObsPipeline({"kind": "vector", "norm": norm}, (4,))


# -- the trainer --------------------------------------------------------------

vizdoom = pytest.importorskip("vizdoom")


def _run(tmp_path, name="run", **kw):
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    run = str(tmp_path / name)
    cfg = Config(env="doom:basic", workers=1, total_steps=40, quiet=True, tensorboard=False,
                 checkpoint_interval=0, run_dir=run, **kw)
    Trainer(cfg).run()
    return run


def test_trainer_measures_the_norm_on_random_play_and_saves_it(tmp_path, monkeypatch):
    from a3c_core.checkpoint import load_checkpoint
    from a3c_core.envs import make_env

    monkeypatch.setattr(importlib.import_module("a3c_core.train.build"), "OBS_NORM_FRAMES", 300)
    run = _run(tmp_path, seed=4)
    norm = load_checkpoint(run).preprocess_spec["norm"]
    assert norm["frames"] == 300 and len(norm["mean"]) == 84 * 84
    # the twin: 300 frames of uniform random play, the same seeds, by hand
    env = make_env("doom:basic", seed=norm_seed(4))
    rng = np.random.default_rng((4, 0x0B5))
    frames, obs = [], env.reset()
    try:
        for _ in range(300):
            frames.append(ref_preprocess(obs, (84, 84)).ravel())
            obs, _, term, trunc = env.step(int(rng.integers(3)))
            if term or trunc:
                obs = env.reset()
    finally:
        env.close()
    stack = np.stack(frames)
    np.testing.assert_allclose(norm["mean"], stack.mean(0), atol=2e-4)
    assert norm["std"] == pytest.approx(np.sqrt(((stack - stack.mean(0)) ** 2).mean()), rel=1e-2)
    # off: no norm in the checkpoint
    off = _run(tmp_path, "off", obs_norm=False)
    assert "norm" not in load_checkpoint(off).preprocess_spec


def norm_seed(seed):
    """Worker 0's env seed for a fresh run with this seed (the trainer's own rule)."""
    from a3c_core.train.build import seed_of

    return seed_of(seed, 0, 0)


def test_resume_keeps_the_norm_it_trained_with(tmp_path):
    from a3c_core.checkpoint import load_checkpoint, save_checkpoint
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    run = _run(tmp_path)
    ck = load_checkpoint(run)
    base = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    Trainer(base.replace(total_steps=80, seed=9), resume=run).run()   # another seed: not re-measured
    assert load_checkpoint(run).preprocess_spec["norm"] == ck.preprocess_spec["norm"]
    # a checkpoint from before obs_norm (no norm) resumes without one, and says so
    meta = dict(ck.meta, preprocess={k: v for k, v in ck.meta["preprocess"].items() if k != "norm"})
    save_checkpoint(os.path.join(run, "checkpoints", "latest.npz"), ck.params, meta,
                    opt_arrays=ck.opt_arrays)
    tr = Trainer(base.replace(total_steps=120, obs_norm=True), resume=run)
    try:
        assert "norm" not in tr.pipeline_spec and "not normalized" in tr.resume_note
    finally:
        tr.close()


def _corrupt_norm(tmp_path):
    """A trained run whose latest.npz carries a 5-value mean frame; -> (run, path)."""
    from a3c_core.checkpoint import load_checkpoint, save_checkpoint

    run = _run(tmp_path)
    ck = load_checkpoint(run)
    bad = dict(ck.meta["preprocess"], norm={"mean": [0.0] * 5, "std": 0.1})
    path = os.path.join(run, "checkpoints", "latest.npz")
    save_checkpoint(path, ck.params, dict(ck.meta, preprocess=bad), opt_arrays=ck.opt_arrays)
    return run, path


def test_a_corrupt_norm_in_a_checkpoint_is_a_clear_error(tmp_path):
    from a3c_core import Policy
    from a3c_core.checkpoint import CheckpointError

    run, path = _corrupt_norm(tmp_path)
    with pytest.raises(CheckpointError, match="norm.*mean has 5 values"):
        Policy.load(path)


def test_resume_from_a_corrupt_norm_is_refused_and_keeps_the_run(tmp_path):
    from a3c_core.checkpoint import CheckpointError
    from a3c_core.train.config import Config
    from a3c_core.train.trainer import Trainer

    run, _ = _corrupt_norm(tmp_path)
    before = {f: open(os.path.join(run, f), "rb").read() for f in ("config.toml", "checkpoints/latest.npz")}
    base = Config.from_toml(os.path.join(run, "config.toml"), saved_run=True)
    with pytest.raises(CheckpointError, match="norm.*mean has 5 values"):
        Trainer(base.replace(total_steps=80), resume=run)
    for f, data in before.items():
        assert open(os.path.join(run, f), "rb").read() == data


@pytest.mark.parametrize("norm", [False, True])
def test_pipeline_writes_every_accepted_out_shape_alike(norm):
    """The image pipeline hands ``out`` to the resize kernel as it is when the
    kernel takes its shape ((1, H, W), (H, W), (H*W,)) and reshapes anything
    else of H*W contiguous values: every form gets the same values, a
    wrong size is refused."""
    rng = np.random.default_rng(3)
    spec = {"kind": "image", "out_shape": [12, 10]}
    if norm:
        spec["norm"] = {"mean": rng.random(120).tolist(), "std": 0.2}
    pipe = ObsPipeline(spec, (30, 40))
    frame = rng.integers(0, 256, (30, 40), dtype=np.uint8)
    want = pipe(frame)
    assert want.shape == (1, 12, 10)
    for shape in ((1, 12, 10), (12, 10), (120,), (12, 10, 1), (2, 60)):
        out = np.full(shape, np.nan, np.float32)
        assert pipe(frame, out) is out
        assert np.array_equal(out.reshape(1, 12, 10), want), shape
    with pytest.raises(ValueError, match=r"out has shape \(1, 12, 11\)"):
        pipe(frame, np.empty((1, 12, 11), np.float32))
    strided = np.zeros((1, 12, 20), np.float32)[:, :, ::2]     # not contiguous: refused,
    with pytest.raises(ValueError, match="contiguous"):      # never written into a copy
        pipe(frame, strided)
