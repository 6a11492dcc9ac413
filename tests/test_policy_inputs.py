"""Policy: bad observations, non-finite checkpoints, threads, save/load round trip (no env needed)."""
import threading

import numpy as np
import pytest

from a3c_core import Policy, build_network
from a3c_core.checkpoint import CheckpointError, save_checkpoint
from a3c_core.obs import ObservationError


@pytest.fixture(scope="module")
def vec_ckpt(tmp_path_factory):
    net = build_network("mlp-lstm", (4,), 3, seed=1)
    path = str(tmp_path_factory.mktemp("vec") / "policy.npz")
    Policy.from_network(net, (4,), env_id="gym:CartPole-v1").save(path)
    return path


@pytest.fixture(scope="module")
def img_ckpt(tmp_path_factory):
    net = build_network("doom-lstm", (1, 84, 84), 3, seed=2)
    path = str(tmp_path_factory.mktemp("img") / "policy.npz")
    Policy.from_network(net, (120, 160), env_id="doom:basic").save(path)
    return path


def test_saved_policy_round_trip_matches_network(vec_ckpt):
    net = build_network("mlp-lstm", (4,), 3, seed=1)
    policy = Policy.load(vec_ckpt)
    assert policy.path == vec_ckpt and policy.n_actions == 3
    obs = np.array([0.1, -0.2, 0.03, 0.5], np.float32)
    p, v, s = policy.probs(obs, policy.initial_state())
    tp, tv, ts = net.step(obs, net.initial_state())
    np.testing.assert_array_equal(p, tp)
    assert v == pytest.approx(float(tv))
    a, _ = policy.act(obs, policy.initial_state(), greedy=True)
    assert a == int(np.argmax(tp))


def test_array_likes_are_accepted(vec_ckpt, img_ckpt):
    vec = Policy.load(vec_ckpt)
    obs = [0.1, -0.2, 0.03, 0.5]
    a_list, _ = vec.act(obs, None, greedy=True)
    a_arr, _ = vec.act(np.array(obs, np.float64), None, greedy=True)
    assert a_list == a_arr
    assert vec.act(tuple(obs), None, greedy=True)[0] == a_arr
    img = Policy.load(img_ckpt)
    frame = np.random.default_rng(0).integers(0, 256, (120, 160), dtype=np.uint8)
    pa, _, _ = img.probs(frame)
    pl, _, _ = img.probs(frame.tolist())  # a nested list of ints in 0..255
    np.testing.assert_array_equal(pa, pl)


@pytest.mark.parametrize("bad", [None, 3, 2.5, "obs", {"x": 1}, object()])
def test_non_arrays_raise_type_error_naming_shape_and_dtype(vec_ckpt, bad):
    policy = Policy.load(vec_ckpt)
    with pytest.raises(TypeError, match=r"shape \(4,\)") as e:
        policy.act(bad, policy.initial_state())
    assert "float32" in str(e.value)
    assert isinstance(e.value, ObservationError)


def test_wrong_shape_or_dtype_names_expected(vec_ckpt, img_ckpt):
    vec, img = Policy.load(vec_ckpt), Policy.load(img_ckpt)
    with pytest.raises(ValueError, match=r"shape \(5,\).*expects.*\(4,\)"):
        vec.act(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(4,\)"):
        vec.act([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match=r"\(4,\), got dtype <U1"):
        vec.act(np.array(list("abcd")))
    with pytest.raises(ValueError, match=r"uint8"):
        img.act(np.zeros((120, 160), np.float32))
    with pytest.raises(ValueError, match=r"uint8 array of shape \(120, 160\)"):
        img.act(np.full((120, 160), 300).tolist())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_vector_observation_is_rejected(vec_ckpt, bad):
    policy = Policy.load(vec_ckpt)
    state = policy.initial_state()
    obs = np.array([0.1, bad, 0.0, 0.0], np.float32)
    with pytest.raises(ValueError, match=r"1 non-finite value.*index 1"):
        policy.act(obs, state)
    # the caller's state is untouched and later steps are fine
    a, new_state = policy.act(np.zeros(4, np.float32), state, greedy=True)
    assert all(np.isfinite(s).all() for s in new_state)


def test_non_finite_checkpoint_is_refused(tmp_path, vec_ckpt):
    z = np.load(vec_ckpt)
    params = np.full_like(z["params"], np.nan)
    path = tmp_path / "nan.npz"
    np.savez(path, params=params, meta=z["meta"])
    with pytest.raises(CheckpointError, match="not finite"):
        Policy.load(str(path))
    with pytest.raises(CheckpointError, match="not finite"):
        save_checkpoint(tmp_path / "x.npz", params, {"network": {}})


def _episode(policy, obs_seq, seed):
    rng = np.random.default_rng(seed)
    state, out = policy.initial_state(), []
    for obs in obs_seq:
        a_g, _ = policy.act(obs, state, greedy=True)
        a, state = policy.act(obs, state, rng=rng)
        p, v, _ = policy.probs(obs, state)
        out.append((a_g, a, p.copy(), v, state[0].copy()))
    return out


@pytest.mark.parametrize("which", ["vec", "img"])
def test_four_threads_match_sequential(which, vec_ckpt, img_ckpt):
    policy = Policy.load(vec_ckpt if which == "vec" else img_ckpt)
    shape = (4,) if which == "vec" else (120, 160)
    gen = np.random.default_rng(7)
    seqs = [[(gen.standard_normal(shape).astype(np.float32) if which == "vec"
              else gen.integers(0, 256, shape, dtype=np.uint8)) for _ in range(40)] for _ in range(4)]
    expected = [_episode(policy, seq, k) for k, seq in enumerate(seqs)]
    results, errors = [None] * 4, []
    barrier = threading.Barrier(4)

    def run(k):
        try:
            barrier.wait()
            results[k] = _episode(policy, seqs[k], k)
        except BaseException as e:  # pragma: no cover - would be the bug
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for got, want in zip(results, expected):
        for g, w in zip(got, want):
            assert g[0] == w[0] and g[1] == w[1] and g[3] == w[3]
            np.testing.assert_array_equal(g[2], w[2])
            np.testing.assert_array_equal(g[4], w[4])


def test_default_rng_is_per_thread(vec_ckpt):
    policy = Policy.load(vec_ckpt)
    policy.act(np.zeros(4, np.float32))
    mine = policy._local.rng
    seen = []
    t = threading.Thread(target=lambda: (policy.act(np.zeros(4, np.float32)), seen.append(policy._local.rng)))
    t.start()
    t.join()
    assert seen[0] is not mine


def test_load_run_directory_picks_and_falls_back(tmp_path, vec_ckpt):
    import shutil

    run = tmp_path / "run"
    with pytest.raises(CheckpointError, match="no checkpoints/latest.npz or checkpoints/best.npz"):
        Policy.load(str(tmp_path))
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(vec_ckpt, run / "checkpoints" / "best.npz")
    assert Policy.load(str(run)).path.endswith("best.npz")  # latest missing: best
    shutil.copy(vec_ckpt, run / "checkpoints" / "latest.npz")
    assert Policy.load(str(run)).path.endswith("latest.npz")
    assert Policy.load(str(run), which="best").path.endswith("best.npz")
    with pytest.raises(ValueError, match="which must be"):
        Policy.load(str(run), which="newest")
