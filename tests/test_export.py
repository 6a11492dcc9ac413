"""a3c_core.export: the ONNX graph (preprocessing + network) against Policy,
the npz-only checkpoint, atomic writes and the errors for bad paths."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from a3c_core.checkpoint import save_checkpoint
from a3c_core.export import (
    ExportError,
    export_npz,
    export_onnx,
    onnx_session,
    resize_matrices,
)
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.policy import Policy
from a3c_core.specs import SPECS

TOL = 1e-5


def _img_spec(out_shape, crop=None, norm=None):
    spec = {"kind": "image", "out_shape": list(out_shape), "crop": crop}
    if norm is not None:
        spec["norm"] = norm
    return spec


def _norm(out_shape, seed):
    rng = np.random.default_rng(seed)
    mean = rng.uniform(0.1, 0.6, int(np.prod(out_shape))).astype(np.float32)
    return {"mean": [float(v) for v in mean], "std": 0.17}


# (id, spec, net obs_shape, spec kwargs, raw obs shape, preprocess spec)
CASES = [
    ("doom-lstm-gray", "doom-lstm", (1, 36, 44), {"fc_size": 32, "lstm_size": 16},
     (60, 80), _img_spec((36, 44))),
    ("doom-ff-rgb-crop", "doom-ff", (1, 30, 40), {"fc_size": 24, "activation": "relu"},
     (60, 80, 3), _img_spec((30, 40), crop=[4, 7, 3, 10])),
    ("atari-lstm-gray-norm", "atari-lstm", (1, 42, 42), {"lstm_size": 24},
     (60, 80), _img_spec((42, 42), norm=_norm((42, 42), 1))),
    ("mlp-lstm", "mlp-lstm", (12,), {"hidden": (16, 16), "lstm_size": 8}, (3, 4),
     {"kind": "vector"}),
    ("mlp", "mlp", (10,), {"hidden": (16,), "activation": "relu"}, (10,), {"kind": "vector"}),
]
assert {c[1] for c in CASES} == set(SPECS), "every network spec has a case"


def _policy(case, seed=0):
    _, spec, obs_shape, kw, raw, pre = case
    net = build_network(spec, obs_shape, 5, seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    p = net.state_dict()
    # far from the init: non-uniform probs, non-zero LSTM biases, a value that moves
    p["policy.weight"][...] *= 300.0
    p["policy.bias"][...] = rng.normal(0, 0.3, p["policy.bias"].shape)
    p["value.bias"][...] = 0.7
    for k, v in p.items():
        if k.startswith("lstm.bias"):
            v[...] = rng.normal(0, 0.5, v.shape)
    return Policy.from_network(net, raw, pre, env_id="test:env")


def _frames(pol, rng, n):
    raw = pol.pipeline.raw_shape
    if pol.pipeline.kind == "image":
        f = rng.integers(0, 256, size=(n, *raw), dtype=np.uint8)
        f[:, : raw[0] // 3] //= 4              # some structure: a dark top band
        return f
    return rng.normal(0, 1.5, size=(n, *raw)).astype(np.float32)


def _compare(pol, sess, batch, steps, rng):
    """Run ``steps`` steps on ``batch`` rows through both: max |diff| of probs and
    of values (the new state's included), largest spread of a probability row."""
    rec = pol.net.recurrent
    hd = pol.net.lstm_size
    h = np.zeros((batch, hd), np.float32)
    c = np.zeros((batch, hd), np.float32)
    states = [pol.initial_state() for _ in range(batch)]
    worst_p = worst_v = 0.0
    spread = 0.0
    for _ in range(steps):
        obs = _frames(pol, rng, batch)
        feed = {"obs": obs}
        if rec:
            feed.update(h=h, c=c)
        out = sess.run(None, feed)
        probs, value = out[0], out[1]
        assert probs.shape == (batch, pol.n_actions) and value.shape == (batch,)
        for b in range(batch):
            p_ref, v_ref, states[b] = pol.probs(obs[b], states[b])
            worst_p = max(worst_p, float(np.abs(probs[b] - p_ref).max()))
            worst_v = max(worst_v, abs(float(value[b]) - v_ref))
            spread = max(spread, float(p_ref.max() - p_ref.min()))
            if rec:
                worst_v = max(worst_v, float(np.abs(out[2][b] - states[b][0]).max()),
                              float(np.abs(out[3][b] - states[b][1]).max()))
        if rec:
            h, c = out[2], out[3]
    return worst_p, worst_v, spread


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_onnx_matches_policy(case, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import onnx

    pol = _policy(case)
    path = export_onnx(pol, tmp_path / "policy.onnx")
    assert os.fspath(path) == os.fspath(tmp_path / "policy.onnx")
    assert os.listdir(tmp_path) == ["policy.onnx"]
    model = onnx.load(os.fspath(path))
    onnx.checker.check_model(model)
    ins = {i.name: i for i in model.graph.input}
    assert list(ins) == (["obs", "h", "c"] if pol.net.recurrent else ["obs"])
    assert ins["obs"].type.tensor_type.shape.dim[0].dim_param == "N"
    assert [o.name for o in model.graph.output] == (
        ["probs", "value", "h_out", "c_out"] if pol.net.recurrent else ["probs", "value"])
    assert "LSTM" not in {n.op_type for n in model.graph.node}
    sess = onnx_session(path)
    rng = np.random.default_rng(7)
    res = {b: _compare(pol, sess, b, 20, rng) for b in (1, 7)}
    for b, (dp, dv, spread) in res.items():
        print(f"{case[0]} batch {b}: max |dprobs| {dp:.2e}, max |dvalue|, |dstate| {dv:.2e}")
        assert spread > 0.05, "perturbed params should give non-uniform probabilities"
        assert dp <= TOL and dv <= TOL, (case[0], b, dp, dv)


def test_onnx_detects_a_wrong_network(tmp_path):
    """The comparison can fail: an export of other weights differs by far more than TOL."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    case = CASES[3]
    pol, other = _policy(case, seed=0), _policy(case, seed=1)
    sess = onnx_session(export_onnx(other, tmp_path / "other.onnx"))
    dp, dv, _ = _compare(pol, sess, 2, 3, np.random.default_rng(0))
    assert max(dp, dv) > 1e-2


@pytest.mark.parametrize("raw, out_shape, crop", [
    ((60, 80), (42, 42), None), ((60, 80, 3), (30, 40), [3, 5, 2, 7]),
    ((120, 160), (84, 84), None), ((17, 23, 3), (40, 50), None), ((31, 29, 1), (21, 21), [1, 0, 0, 2]),
])
def test_resize_matrices_match_the_kernel(raw, out_shape, crop):
    pipe = ObsPipeline(_img_spec(out_shape, crop), raw)
    R, Cm = resize_matrices(raw, out_shape, crop)
    h, w = raw[:2]
    c = raw[2] if len(raw) == 3 else 1
    rng = np.random.default_rng(3)
    for frame in (rng.integers(0, 256, raw, dtype=np.uint8), np.full(raw, 255, np.uint8),
                  np.zeros(raw, np.uint8)):
        mine = np.minimum(R @ frame.reshape(h, w * c).astype(np.float32) @ Cm, 1.0)
        assert np.abs(mine - pipe(frame)[0]).max() <= 1e-6


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=["rgb-crop", "gray-norm"])
def test_onnx_preprocessing_matches_pipeline(case, tmp_path):
    """The graph's network input (an intermediate made an output) is ObsPipeline's."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from a3c_core.export import build_onnx_model

    pol = _policy(case)
    model = build_onnx_model(pol)
    model.graph.output.append(onnx.helper.make_tensor_value_info("net_input", onnx.TensorProto.FLOAT, None))
    onnx.save(model, os.fspath(tmp_path / "m.onnx"))
    sess = onnx_session(tmp_path / "m.onnx")
    frames = _frames(pol, np.random.default_rng(5), 4)
    feed = {"obs": frames}
    if pol.net.recurrent:
        feed.update(h=np.zeros((4, pol.net.lstm_size), np.float32),
                    c=np.zeros((4, pol.net.lstm_size), np.float32))
    x = sess.run(["net_input"], feed)[0]
    ref = np.stack([pol.pipeline(f) for f in frames])
    assert x.shape == ref.shape == (4, *pol.pipeline.net_obs_shape)
    # the norm divides by std 0.17: the kernel's ~1e-7 rounding grows by ~6
    scale = 1.0 / pol.pipeline.spec["norm"]["std"] if "norm" in pol.pipeline.spec else 1.0
    assert np.abs(x - ref).max() <= 1e-6 * scale


def test_export_onnx_float64_network_and_opset(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net = build_network("mlp-lstm", (6,), 3, dtype=np.float64, hidden=(8,), lstm_size=4)
    net.state_dict()["policy.weight"][...] *= 200
    pol = Policy.from_network(net, (6,))
    for opset in (13, 17):
        sess = onnx_session(export_onnx(pol, tmp_path / f"p{opset}.onnx", opset=opset))
        dp, dv, _ = _compare(pol, sess, 3, 5, np.random.default_rng(opset))
        assert dp <= TOL and dv <= TOL
    with pytest.raises(ValueError, match="opset"):
        export_onnx(pol, tmp_path / "bad.onnx", opset=9)
    assert not (tmp_path / "bad.onnx").exists()


def test_onnx_missing_gives_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)     # import onnx -> ImportError
    with pytest.raises(ImportError, match=r'pip install "a3c_core\[onnx\]"'):
        export_onnx(_policy(CASES[4]), tmp_path / "p.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r'pip install "a3c_core\[onnx\]"'):
        onnx_session(tmp_path / "p.onnx")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- bad paths
def _leftovers(directory):
    return [n for n in os.listdir(directory) if n.startswith(".tmp-")]


@pytest.mark.parametrize("kind", ["npz", "onnx"])
def test_unwritable_paths_raise_a_clear_error(kind, tmp_path):
    if kind == "onnx":
        pytest.importorskip("onnx")
    export = export_npz if kind == "npz" else export_onnx
    pol = _policy(CASES[4])
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for bad in (tmp_path,                                 # a directory
                blocker / "sub" / "p.out",                # parent cannot be created (a file)
                "/proc/a3c_export_no_such_dir/p.out"):    # nor here, even for root
        with pytest.raises(ExportError, match=os.path.basename(os.fspath(bad))) as ei:
            export(pol, bad)
        assert os.fspath(bad) in str(ei.value)
    assert sorted(os.listdir(tmp_path)) == ["a_file"] and blocker.read_text() == "x"
    if os.name == "posix" and os.geteuid() != 0:          # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(ExportError, match="ro"):
                export(pol, ro / "p.out")
            assert os.listdir(ro) == []
        finally:
            ro.chmod(0o755)


@pytest.mark.parametrize("kind", ["npz", "onnx"])
def test_failed_export_keeps_the_existing_file(kind, tmp_path, monkeypatch):
    if kind == "onnx":
        pytest.importorskip("onnx")
    import a3c_core.checkpoint as ckmod
    import a3c_core.export as ex

    export = export_npz if kind == "npz" else export_onnx
    pol = _policy(CASES[3])
    target = tmp_path / "model.out"
    target.write_bytes(b"previous export")

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr((ckmod if kind == "npz" else ex).os, "fsync", no_space)
    with pytest.raises(ExportError, match="No space left") as ei:
        export(pol, target)
    assert os.fspath(target) in str(ei.value)
    assert target.read_bytes() == b"previous export"
    assert _leftovers(tmp_path) == []
    monkeypatch.undo()

    # an interruption mid-write (not an OSError) is re-raised as it is, same cleanup
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr((ckmod if kind == "npz" else ex).os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(pol, target)
    assert target.read_bytes() == b"previous export"
    assert sorted(os.listdir(tmp_path)) == ["model.out"]
    monkeypatch.undo()
    export(pol, target)                                  # and a working export replaces it
    assert target.read_bytes() != b"previous export"
    assert sorted(os.listdir(tmp_path)) == ["model.out"]
    assert (target.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- npz-only
def _training_checkpoint(pol, path):
    """What a trainer writes: params + Adam moments + a training meta."""
    meta = dict(pol.meta)
    meta.update(config={"lr": 1e-4, "env": "test:env", "workers": 4}, optimizer="adam",
                optimizer_scalars={"step": 10, "lr": 1e-4},
                reward_normalizer={"mean": 0.5}, counters={"steps": 1234, "episodes": 3},
                moving_avg=1.5, avg_window=100, saved_at="2026-01-01T00:00:00+0000")
    n = pol.net.params.size
    rng = np.random.default_rng(0)
    save_checkpoint(path, pol.net.params, meta,
                    {"exp_avg": rng.normal(size=n).astype(np.float32),
                     "exp_avg_sq": rng.random(n).astype(np.float32)})
    return Policy.load(path)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4]], ids=["doom-lstm", "atari-norm", "mlp"])
def test_npz_only_loads_and_acts_the_same(case, tmp_path):
    src = _training_checkpoint(_policy(case), tmp_path / "train.npz")
    out = export_npz(src, tmp_path / "deploy" / "policy.npz")
    assert os.fspath(out) == os.fspath(tmp_path / "deploy" / "policy.npz")
    assert os.listdir(tmp_path / "deploy") == ["policy.npz"]
    with zipfile.ZipFile(out) as z:
        names = sorted(z.namelist())
    assert names == ["meta.npy", "params.npy"]
    assert os.path.getsize(out) < os.path.getsize(tmp_path / "train.npz")
    dep = Policy.load(out)
    np.testing.assert_array_equal(dep.net.params, src.net.params)
    assert dep.checkpoint.opt_arrays == {}
    meta = dep.meta
    for key in ("config", "optimizer", "optimizer_scalars", "reward_normalizer"):
        assert key not in meta
    assert meta["counters"]["steps"] == 1234
    assert meta["env"]["obs_shape"] == list(src.pipeline.raw_shape)
    assert meta["env"]["action_names"] == src.action_names == dep.action_names
    assert meta["env"]["id"] == "test:env"
    assert meta["preprocess"] == src.pipeline.spec
    assert meta["exported"]["from"] == src.path
    rng = np.random.default_rng(11)
    s1, s2 = src.initial_state(), dep.initial_state()
    for f in _frames(src, rng, 15):
        p1, v1, s1 = src.probs(f, s1)
        p2, v2, s2 = dep.probs(f, s2)
        np.testing.assert_array_equal(p1, p2)
        assert v1 == v2
        a1, _ = src.act(f, s1, rng=np.random.default_rng(1))
        a2, _ = dep.act(f, s2, rng=np.random.default_rng(1))
        assert a1 == a2


def test_npz_only_of_an_in_memory_policy(tmp_path):
    """A Policy.from_network (no checkpoint behind it) exports too; the norm's
    mean frame is stored once (not again under env)."""
    pol = _policy(CASES[2])
    out = export_npz(pol, tmp_path / "p.npz")
    with np.load(out) as z:
        meta = json.loads(bytes(z["meta"]).decode())
    assert "preprocess" not in meta["env"] and meta["preprocess"]["norm"]["std"] == 0.17
    dep = Policy.load(out)
    f = _frames(pol, np.random.default_rng(0), 1)[0]
    np.testing.assert_array_equal(dep.probs(f)[0], pol.probs(f)[0])


@pytest.mark.slow
def test_npz_only_loads_in_a_minimal_venv(tmp_path):
    """numpy + numba + threadpoolctl and the built a3c_core package are enough."""
    import shutil
    from importlib import metadata

    import a3c_core

    pol = _policy(CASES[0])
    npz = export_npz(pol, tmp_path / "policy.npz")
    frame = _frames(pol, np.random.default_rng(2), 1)[0]
    np.save(tmp_path / "frame.npy", frame)
    want = int(np.argmax(pol.probs(frame)[0]))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", os.fspath(venv)], check=True)
    py = os.fspath(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    pins = [f"{d}=={metadata.version(d)}" for d in ("numpy", "numba", "threadpoolctl")]
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
                   check=True)
    site = tmp_path / "site"
    shutil.copytree(os.path.dirname(a3c_core.__file__), site / "a3c_core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, numpy as np\n"
            "import a3c_core\n"
            "assert a3c_core.__file__.startswith(sys.argv[3]), a3c_core.__file__\n"
            "from a3c_core import Policy\n"
            "p = Policy.load(sys.argv[1])\n"
            "a, s = p.act(np.load(sys.argv[2]), p.initial_state(), greedy=True)\n"
            "for mod in ('onnx', 'torch', 'gymnasium', 'vizdoom'):\n"
            "    assert mod not in sys.modules, mod\n"
            "print('ACTION', a)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.fspath(site)
    env["NUMBA_CACHE_DIR"] = os.fspath(tmp_path / "numba_cache")
    r = subprocess.run([py, "-c", code, os.fspath(npz), os.fspath(tmp_path / "frame.npy"),
                        os.fspath(site)], check=False, capture_output=True, text=True,
                       env=env, cwd=os.fspath(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"ACTION {want}" in r.stdout
    # nothing else is importable there
    r = subprocess.run([py, "-c", "import onnx"], check=False, capture_output=True, text=True,
                       env=env)
    assert r.returncode != 0
    assert not glob.glob(os.fspath(tmp_path / ".tmp-*"))


def test_cli_export_writes_both_and_checks_parity(tmp_path, capsys):
    """``a3c export`` end to end: both files, the parity line, and the errors
    (nothing asked, a missing checkpoint, an unwritable path) exit 2 and write nothing."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from a3c_core.cli import main

    net = build_network("mlp-lstm", (4,), 3, seed=4)
    net.state_dict()["policy.weight"][...] *= 100
    src = str(tmp_path / "ckpt.npz")
    Policy.from_network(net, (4,), env_id="gym:CartPole-v1").save(src)
    onnx_out, npz_out = str(tmp_path / "out" / "p.onnx"), str(tmp_path / "out" / "p.npz")
    assert main(["export", src, "--onnx", onnx_out, "--npz-only", npz_out]) == 0
    out = capsys.readouterr().out
    assert f"wrote {npz_out}" in out and f"wrote {onnx_out}" in out
    diffs = [float(v) for v in
             out.split("max |diff| probs ")[1].replace(", value", "").replace(", state", "").split()]
    assert len(diffs) == 3 and max(diffs) <= 1e-5
    assert Policy.load(npz_out).probs(np.ones(4, np.float32))[1] == \
        pytest.approx(Policy.load(src).probs(np.ones(4, np.float32))[1])
    assert main(["export", src]) == 2
    assert "--onnx PATH and/or --npz-only PATH" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.npz"), "--onnx", onnx_out]) == 2
    assert "not found" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["export", src, "--onnx", str(blocker / "p.onnx")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert not os.path.exists(blocker / "p.onnx")
