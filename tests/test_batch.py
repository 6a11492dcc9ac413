"""Batched recurrent inference: Network.step_batch and Policy.act_batch/probs_batch
against N batch-1 calls, per-row resets, per-row bad input, state checks."""
import threading

import numpy as np
import pytest

from a3c_core import Policy, build_network
from a3c_core.nn import batch as batch_mod
from a3c_core.obs import ObservationError
from a3c_core.sampling import sample_categorical

# spec -> (net obs shape, raw obs shape, preprocess spec)
CASES = {
    "doom-lstm": ((1, 84, 84), (60, 80), None),
    "doom-ff": ((1, 84, 84), (60, 80, 3), None),
    "atari-lstm": ((1, 42, 42), (50, 40), {"kind": "image", "out_shape": [42, 42],
                                           "crop": [2, 4, 0, 3]}),
    "mlp-lstm": ((6,), (6,), None),
    "mlp": ((6,), (2, 3), {"kind": "vector"}),
}


def _policy(spec, seed=0):
    net_shape, raw_shape, prep = CASES[spec]
    net = build_network(spec, net_shape, 5, seed=seed)
    rng = np.random.default_rng(seed)
    # larger than the init's weights, so that probabilities are far from uniform
    # and a wrong row, state or reset shows
    net.params[:] += rng.normal(0, 0.05, net.n_params).astype(np.float32)
    net.state_dict()["policy.weight"][...] *= 50
    return Policy.from_network(net, raw_shape, prep)


def _raw(policy, n, rng):
    shape = policy.pipeline.raw_shape
    if policy.pipeline.kind == "image":
        return rng.integers(0, 256, (n,) + shape, dtype=np.uint8)
    return rng.normal(size=(n,) + shape).astype(np.float32)


def _close(a, b, what, rtol=2e-5):
    # float32 rounding: the GEMMs sum in another order than the batch-1 step
    np.testing.assert_allclose(a, b, rtol=rtol, atol=2e-6, err_msg=what)


def _close_probs(a, b, what):
    # the policy weights are scaled x50 (below), so logits reach ~40, where a
    # float32 ulp is 3.8e-6: a few ulps of summation order in a logit are a
    # relative 1e-5 to 5e-5 in its probability
    _close(a, b, what, rtol=1e-4)


@pytest.mark.parametrize("spec", sorted(CASES))
def test_batch_equals_n_single_steps_with_resets(spec):
    policy = _policy(spec)
    rng = np.random.default_rng(1)
    n = 7
    states = policy.initial_state(n)
    singles = [policy.initial_state() for _ in range(n)]
    for t in range(6):
        frames = _raw(policy, n, rng)
        done = np.zeros(n, bool)
        done[(2 * t) % n] = t > 0           # a different row starts an episode each step
        probs, values, new = policy.probs_batch(frames, states, done)
        assert probs.shape == (n, 5) and values.shape == (n,)
        for i in range(n):
            s = policy.initial_state() if done[i] else singles[i]
            p1, v1, s1 = policy.probs(frames[i], s)
            _close_probs(probs[i], p1, f"{spec} t={t} row {i} probs")
            _close(values[i], v1, f"{spec} t={t} row {i} value")
            if policy.net.recurrent:
                _close(new[0][i], s1[0], f"{spec} t={t} row {i} h")
                _close(new[1][i], s1[1], f"{spec} t={t} row {i} c")
            singles[i] = s1
        if policy.net.recurrent:
            states = new
        else:
            assert new is None


def test_batch_rows_are_independent_and_chunked(monkeypatch):
    """More rows than one chunk (and the convs' sub-chunks not dividing a
    chunk): each row's result does not depend on the others."""
    monkeypatch.setattr(batch_mod, "CHUNK", 3)
    monkeypatch.setattr(batch_mod, "CONV_CHUNK", 2)
    policy = _policy("doom-lstm", seed=3)
    policy.net._batch = None
    rng = np.random.default_rng(2)
    frames = _raw(policy, 8, rng)
    h = rng.normal(size=(8, policy.net.lstm_size)).astype(np.float32)
    c = rng.normal(size=(8, policy.net.lstm_size)).astype(np.float32)
    probs, values, (h2, c2) = policy.probs_batch(frames, (h, c))
    for i in (0, 4, 7):
        p1, v1, (h1, c1) = policy.probs(frames[i], (h[i], c[i]))
        _close_probs(probs[i], p1, f"row {i}")
        _close(h2[i], h1, f"row {i} h")
    rev = policy.probs_batch(frames[::-1].copy(), (h[::-1].copy(), c[::-1].copy()))
    _close_probs(rev[0][::-1], probs, "reversed batch")


def test_act_batch_samples_as_act_with_the_same_uniforms():
    policy = _policy("mlp-lstm")
    rng = np.random.default_rng(5)
    frames = _raw(policy, 50, rng)
    probs, _, _ = policy.probs_batch(frames)
    actions, _ = policy.act_batch(frames, rng=np.random.default_rng(9))
    u = np.random.default_rng(9).random(50)
    want = [sample_categorical(probs[i], u[i]) for i in range(50)]
    assert actions.dtype == np.int64 and actions.tolist() == want
    greedy, _ = policy.act_batch(frames, greedy=True)
    assert greedy.tolist() == probs.argmax(axis=1).tolist()
    assert len(set(actions.tolist())) > 1      # sampled, not a constant


def test_states_are_never_modified_or_poisoned():
    policy = _policy("doom-lstm")
    rng = np.random.default_rng(3)
    h = rng.normal(size=(4, 256)).astype(np.float32)
    c = rng.normal(size=(4, 256)).astype(np.float32)
    h0, c0 = h.copy(), c.copy()
    frames = _raw(policy, 4, rng)
    _, _, (h2, c2) = policy.probs_batch(frames, (h, c), done=[True, False, True, False])
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(c, c0)
    assert h2 is not h and np.isfinite(h2).all()
    bad = [f for f in frames]
    bad[2] = np.zeros((3, 3), np.uint8)
    with pytest.raises(ObservationError, match=r"row 2.*shape \(3, 3\)"):
        policy.act_batch(bad, (h, c))
    np.testing.assert_array_equal(h, h0)


def test_bad_rows_are_named():
    vec = _policy("mlp-lstm")
    obs = np.ones((5, 6), np.float32)
    obs[3, 1] = np.nan
    with pytest.raises(ObservationError, match="row 3.*non-finite"):
        vec.act_batch(obs)
    img = _policy("doom-lstm")
    frames = np.zeros((3, 60, 80), np.float32)       # images must be uint8
    with pytest.raises(ObservationError, match="row 0.*uint8"):
        img.act_batch(frames)
    with pytest.raises(ObservationError, match=r"\(N, 60, 80\)"):
        img.act_batch(np.zeros((60, 80), np.uint8))    # one frame, not a batch
    with pytest.raises(ObservationError, match="at least one"):
        img.act_batch([])


def test_states_that_do_not_match_the_batch():
    policy = _policy("doom-lstm")
    frames = _raw(policy, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"does not match the batch.*\(4, 256\)"):
        policy.act_batch(frames, policy.initial_state(3))
    with pytest.raises(ValueError, match="does not match the batch"):
        policy.act_batch(frames, policy.initial_state())         # a batch-1 state
    with pytest.raises(ValueError, match="pair"):
        policy.act_batch(frames, np.zeros((4, 256), np.float32))
    with pytest.raises(ValueError, match="done must be 4"):
        policy.act_batch(frames, None, done=[True, False])
    ff = _policy("doom-ff")
    with pytest.raises(ValueError, match="no recurrent state"):
        ff.act_batch(_raw(ff, 2, np.random.default_rng(0)), ff.net.initial_batch_state(2) or
                     (np.zeros((2, 4)), np.zeros((2, 4))))


def test_a_done_mask_that_is_not_boolean_is_refused_naming_done():
    """A float mask (0.5: did the episode end or not?) or integers other than
    0/1 are a ValueError naming ``done``, from Policy.act_batch and from
    Network.step_batch; bool masks and 0/1 integer masks reset the same rows."""
    policy = _policy("mlp-lstm")
    rng = np.random.default_rng(0)
    frames = _raw(policy, 4, rng)
    h = rng.normal(size=(4, policy.net.lstm_size)).astype(np.float32)
    c = rng.normal(size=(4, policy.net.lstm_size)).astype(np.float32)
    for bad, what in ((np.full(4, 0.5), "float64"), ([1.0, 0.0, 1.0, 0.0], "float64"),
                      ([0, 1, 2, 0], "got 2 at index 2"), (["yes", "no", "no", "no"], "<U")):
        with pytest.raises(ValueError, match=r"done must be booleans.*" + what):
            policy.act_batch(frames, (h, c), done=bad)
        with pytest.raises(ValueError, match=r"done must be booleans"):
            policy.net.step_batch(np.zeros((4, 6), np.float32), (h, c), done=bad)
    as_bool = policy.probs_batch(frames, (h, c), done=np.array([True, False, True, False]))
    for ints in ([1, 0, 1, 0], np.array([1, 0, 1, 0], np.uint8)):
        got = policy.probs_batch(frames, (h, c), done=ints)
        np.testing.assert_array_equal(got[0], as_bool[0])
        np.testing.assert_array_equal(got[2][0], as_bool[2][0])
    kept = policy.probs_batch(frames, (h, c), done=[0, 0, 0, 0])
    assert not np.array_equal(kept[2][0][0], as_bool[2][0][0])   # row 0 was reset in one only


def test_network_step_rejects_a_wrong_shape_of_the_right_size():
    net = build_network("doom-lstm", (1, 84, 84), 3)
    x = np.zeros((84, 84, 1), np.float32)
    with pytest.raises(ValueError, match=r"shape \(1, 84, 84\), got \(84, 84, 1\)"):
        net.step(x, None)
    with pytest.raises(ValueError, match=r"\(N, 1, 84, 84\)"):
        net.step_batch(x[None], None)
    xb = np.zeros((2, 1, 84, 84), np.float32)
    xb[1, 0, 5, 5] = np.inf
    with pytest.raises(ValueError, match="row 1"):
        net.step_batch(xb, None)


def test_policy_batch_from_threads():
    policy = _policy("doom-lstm")
    rng = np.random.default_rng(4)
    frames = [_raw(policy, 6, rng) for _ in range(4)]
    want = [policy.probs_batch(f)[0] for f in frames]
    got = [None] * 4

    def run(i):
        for _ in range(3):
            got[i] = policy.probs_batch(frames[i])[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], want[i])


@pytest.mark.parametrize("spec", ["doom-lstm", "mlp"])
def test_few_rows_run_the_batch1_step_bit_for_bit(spec):
    """Below BATCH_MIN_ROWS the rows take the batch-1 step: identical results."""
    policy = _policy(spec)
    n = batch_mod.BATCH_MIN_ROWS - 1
    frames = _raw(policy, n, np.random.default_rng(6))
    states = policy.initial_state(n)
    probs, values, new = policy.probs_batch(frames, states, done=[True] + [False] * (n - 1))
    for i in range(n):
        p1, v1, s1 = policy.probs(frames[i])
        np.testing.assert_array_equal(probs[i], p1)
        assert values[i] == np.float32(v1)
        if s1 is not None:
            np.testing.assert_array_equal(new[0][i], s1[0])
