"""The compiled backward (one nogil kernel per layer, GEMMs in numpy's BLAS
through ``a3c_core.nn.blas``) against its numpy twin (the same layer
backward through ``np.dot``): the same arithmetic in the same order, so the
gradients, stats and dstate are equal bit for bit, for every spec, both
dtypes, ``loss_and_grad`` and the backward-only ``rollout_grad`` (with and
without episode resets inside the rollout)."""
import numpy as np
import pytest

from a3c_core.nn import blas, build_network
from a3c_core.nn.gradcheck import random_rollout

pytestmark = pytest.mark.skipif(blas.gemm_handle() is None,
                                reason="numpy's BLAS gemm entry point not found")

CASES = [("doom-lstm", (1, 84, 84)), ("doom-ff", (1, 84, 84)), ("doom-lstm", (2, 30, 26)),
         ("atari-lstm", (1, 42, 42)), ("atari-lstm", (2, 17, 23)), ("mlp-lstm", (7,)),
         ("mlp", (7,))]


def _outputs(net, stats):
    out = {"grads": net.grads.copy(), "probs": net.last_probs.copy(),
           "values": net.last_values.copy(), "stats": dict(stats)}
    if net.recurrent:
        out["dstate"] = tuple(x.copy() for x in net.last_dstate)
    return out


def _assert_identical(a, b):
    assert np.array_equal(a["grads"], b["grads"])
    assert np.array_equal(a["probs"], b["probs"])
    assert np.array_equal(a["values"], b["values"])
    assert a["stats"] == b["stats"]
    if "dstate" in a:
        assert all(np.array_equal(x, y) for x, y in zip(a["dstate"], b["dstate"]))


def _both(net, fn):
    """``fn()`` with the compiled backward, then with the numpy one."""
    assert net.compiled_backward
    net.grads[...] = np.nan
    got = _outputs(net, fn())
    net.compiled_backward = False
    net.grads[...] = np.nan
    want = _outputs(net, fn())
    net.compiled_backward = True
    return got, want


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("spec,obs_shape", CASES)
def test_loss_and_grad_compiled_equals_numpy(spec, obs_shape, dtype):
    net = build_network(spec, obs_shape, 4, dtype=dtype, seed=3)
    obs, actions, ret, adv, state = random_rollout(net, 7, np.random.default_rng(2))
    kw = {"value_coef": 0.4, "entropy_beta": 0.02}

    def run():
        stats, _ = net.loss_and_grad(obs, actions, ret, adv, state, **kw)
        return stats

    got, want = _both(net, run)
    assert np.isfinite(got["grads"]).all()
    _assert_identical(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("spec,obs_shape", CASES)
@pytest.mark.parametrize("cuts", [(), (2, 5)])
def test_rollout_grad_compiled_equals_numpy(spec, obs_shape, dtype, cuts):
    """Backward-only updates over rows recorded by batch-1 steps, the
    rollout reset at ``cuts`` (no gradient across a reset)."""
    net = build_network(spec, obs_shape, 3, dtype=dtype, seed=4)
    obs, actions, ret, adv, state = random_rollout(net, 8, np.random.default_rng(5))

    def run():
        net.begin_rollout(8)
        s = state
        for t in range(8):
            if t in cuts:
                s = net.initial_state()
            _, _, s = net.step(obs[t], s, record=True)
        return net.rollout_grad(actions, ret, adv, value_coef=0.5, entropy_beta=0.01)

    got, want = _both(net, run)
    assert np.isfinite(got["grads"]).all()
    _assert_identical(got, want)


def test_gemm_matches_numpy_dot_bit_for_bit():
    """``blas.gemm`` (each transpose, row slices of larger buffers, beta) is
    ``np.dot`` into the same output, bit for bit, for both dtypes."""
    fns, ints = blas.gemm_handle()
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):      # gemm calls the dtype's own entry point
        a = rng.standard_normal((9, 13)).astype(dt)
        big = rng.standard_normal((30, 11)).astype(dt)
        b = big[4:17]                       # (13, 11) row slice, row stride 11
        c = np.empty((9, 11), dt)
        blas.gemm(fns, ints, a, False, b, False, c, 0.0)
        assert np.array_equal(c, np.dot(a, b))
        ct = np.empty((13, 11), dt)
        blas.gemm(fns, ints, a[:, :9].copy(), True, big[:9], False, ct[:9, :], 0.0)
        assert np.array_equal(ct[:9], np.dot(a[:, :9].T, big[:9]))
        w = rng.standard_normal((11, 13)).astype(dt)
        c2 = rng.standard_normal((9, 11)).astype(dt)
        want = np.dot(a, w.T) + 0.5 * c2
        blas.gemm(fns, ints, a, False, w, True, c2, 0.5)
        np.testing.assert_allclose(c2, want, rtol=1e-5 if dt == np.float32 else 1e-13)
        # an empty inner dimension: op(a) @ op(b) = 0
        z = np.full((3, 4), 7.0, dt)
        blas.gemm(fns, ints, np.empty((3, 0), dt), False, np.empty((0, 4), dt), False, z, 0.0)
        assert not z.any()


def test_gemm_rejects_bad_shapes_and_strides():
    fns, ints = blas.gemm_handle()
    a, b = np.ones((3, 4)), np.ones((5, 6))
    with pytest.raises(ValueError, match="shapes"):
        blas.gemm(fns, ints, a, False, b, False, np.empty((3, 6)), 0.0)
    with pytest.raises(ValueError, match="contiguous"):
        blas.gemm(fns, ints, np.ones((3, 8))[:, ::2], False, np.ones((4, 6)), False,
                  np.empty((3, 6)), 0.0)
    overlapping = np.lib.stride_tricks.as_strided(np.ones(20), (3, 4), (16, 8))
    with pytest.raises(ValueError, match="overlap"):
        blas.gemm(fns, ints, overlapping, False, np.ones((4, 6)), False, np.empty((3, 6)), 0.0)
    # one row: its stride is free; the result is still np.dot's
    one = np.arange(8.0)[None, ::1][:, :4]
    out = np.empty((1, 6))
    blas.gemm(fns, ints, one, False, np.ones((4, 6)), False, out, 0.0)
    assert np.array_equal(out, np.dot(one, np.ones((4, 6))))


def test_numpy_backward_can_be_forced(monkeypatch):
    """``A3C_NUMPY_BACKWARD=1`` (and ``compiled_backward = False``) select the numpy path."""
    monkeypatch.setenv("A3C_NUMPY_BACKWARD", "1")
    net = build_network("mlp", (5,), 2)
    assert not net.compiled_backward
    with pytest.raises(RuntimeError, match="not found"):
        net.compiled_backward = True
    monkeypatch.delenv("A3C_NUMPY_BACKWARD")
    assert build_network("mlp", (5,), 2).compiled_backward


def test_forks_keep_the_backward_path():
    net = build_network("mlp-lstm", (6,), 3)
    assert net.fork().compiled_backward
    net.compiled_backward = False
    assert not net.fork().compiled_backward


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("atari-lstm", (1, 42, 42)),
                                            ("mlp", (7,))])
def test_replayed_backward_calls_follow_new_rows_lengths_and_regrows(spec, obs_shape):
    """``rollout_grad`` keeps its compiled calls per (T, resets) and replays
    them: over a sequence of rollouts of new data, other lengths, with and
    without resets, and past a workspace regrow (T > 20), every gradient
    equals that of a fresh network's numpy backward on the same rows."""
    net = build_network(spec, obs_shape, 3, seed=6)
    ref = build_network(spec, obs_shape, 3, seed=6)
    ref.compiled_backward = False
    rng = np.random.default_rng(7)
    for t_len, cut in [(8, None), (8, None), (5, 2), (8, 3), (8, None), (5, None), (26, 4),
                       (8, None)]:
        obs, actions, ret, adv, state = random_rollout(net, t_len, rng)
        results = []
        for n in (net, ref):
            n.begin_rollout(t_len)
            s = state
            for t in range(t_len):
                if t == cut:
                    s = n.initial_state()
                _, _, s = n.step(obs[t], s, record=True)
            n.grads[...] = np.nan
            stats = n.rollout_grad(actions, ret, adv)
            results.append(_outputs(n, stats))
        assert np.isfinite(results[0]["grads"]).all()
        _assert_identical(*results)
    # kept per (T, resets); the regrow to 26 rows dropped the calls made before it
    assert (26, net.recurrent, 1) in net._bw_calls and (8, False, 1) in net._bw_calls
    assert not any(t == 5 for t, _, _ in net._bw_calls)
