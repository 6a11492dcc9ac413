"""The batched worker's recording: ``begin_batch_rollout`` / ``record_tick`` /
``rollout_grad`` over K sequences in lockstep (rows time-major, t*K + k).

References: the loss is a sum over steps and no gradient crosses an episode
reset, so the batched gradient is the sum of ``loss_and_grad`` over every
env's segments (each from its own input state: the env's carried one for
its first, zeros after a reset); float64 central differences of that sum;
``step_batch`` for the forward's rows.
"""
import numpy as np
import pytest

from a3c_core.nn import build_network

CASES = [("mlp-lstm", (7,)), ("mlp", (7,)), ("doom-lstm", (2, 30, 26)), ("doom-ff", (1, 36, 36)),
         ("atari-lstm", (1, 42, 42))]


def _batch(net, T, K, seed):
    rng = np.random.default_rng(seed)
    dt = net.dtype
    obs = rng.random((T, K, *net.obs_shape)).astype(dt)
    actions = rng.integers(0, net.n_actions, (T, K))
    ret = rng.standard_normal((T, K)).astype(dt)
    adv = rng.standard_normal((T, K)).astype(dt)
    state = None
    if net.recurrent:
        state = (0.5 * rng.standard_normal((K, net.lstm_size)).astype(dt),
                 0.5 * rng.standard_normal((K, net.lstm_size)).astype(dt))
    return obs, actions, ret, adv, state


def _record(net, obs, state, resets):
    """Record T ticks of K rows; ``resets`` (T, K) bool: the rows that start
    an episode (row 0 never: its state is the given one).  Returns the
    per-tick (probs, values) copies."""
    T, K = obs.shape[:2]
    net.begin_batch_rollout(T, K)
    out = []
    for t in range(T):
        net.tick_inputs(t)[...] = obs[t]
        p, v = net.record_tick(t, state if t == 0 else None, resets[t] if t else None)
        out.append((p.copy(), v.copy()))
    return out


def _segments_sum(net, obs, actions, ret, adv, state, resets, kw):
    """Sum of loss_and_grad over every env's segments: (grads, stats)."""
    T, K = obs.shape[:2]
    grads = np.zeros_like(net.grads)
    stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0}
    for k in range(K):
        cuts = [0] + [t for t in range(1, T) if resets[t, k]] + [T]
        for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            s0 = None
            if net.recurrent:
                s0 = (state[0][k], state[1][k]) if j == 0 else net.initial_state()
            st, _ = net.loss_and_grad(obs[a:b, k], actions[a:b, k], ret[a:b, k], adv[a:b, k],
                                      s0, **kw)
            grads += net.grads
            for key in stats:
                stats[key] += st[key]
    return grads, stats


def _resets(T, K, seed):
    rng = np.random.default_rng(seed)
    r = rng.random((T, K)) < 0.25
    r[0] = False
    return r


@pytest.mark.parametrize("spec,obs_shape", CASES)
@pytest.mark.parametrize("K", [1, 3, 5])
def test_batched_gradient_is_the_sum_of_the_envs_segment_gradients(spec, obs_shape, K):
    net = build_network(spec, obs_shape, 3, dtype=np.float64, seed=3)
    T = 6
    obs, actions, ret, adv, state = _batch(net, T, K, seed=K)
    resets = _resets(T, K, seed=10 + K)
    kw = {"value_coef": 0.6, "entropy_beta": 0.03}
    want, want_stats = _segments_sum(net, obs, actions, ret, adv, state, resets, kw)
    _record(net, obs, state, resets)
    stats = net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)
    np.testing.assert_allclose(net.grads, want, rtol=1e-9, atol=1e-12)
    for key in want_stats:
        assert stats[key] == pytest.approx(want_stats[key], rel=1e-9)


@pytest.mark.parametrize("t_reset", range(1, 6))
def test_a_reset_at_each_position_cuts_only_its_row(t_reset):
    """A reset of env 1 at tick ``t_reset`` (every position of the rollout):
    the gradient is the segments' sum, and differs from the same rows
    without the reset; env 0 and env 2 run on uncut."""
    net = build_network("mlp-lstm", (5,), 3, dtype=np.float64, seed=1)
    T, K = 6, 3
    obs, actions, ret, adv, state = _batch(net, T, K, seed=7)
    resets = np.zeros((T, K), bool)
    resets[t_reset, 1] = True
    kw = {"value_coef": 0.5, "entropy_beta": 0.01}
    want, _ = _segments_sum(net, obs, actions, ret, adv, state, resets, kw)
    ticks = _record(net, obs, state, resets)
    net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)
    np.testing.assert_allclose(net.grads, want, rtol=1e-9, atol=1e-12)
    # the forward: env 1 restarted from zeros at t_reset, the others carried on
    h, c = state[0].copy(), state[1].copy()
    for t in range(T):
        if t == t_reset:
            h[1] = 0
            c[1] = 0
        p, v, (h, c) = net.step_batch(obs[t], (h, c))
        np.testing.assert_allclose(ticks[t][0], p, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(ticks[t][1], v, rtol=1e-10, atol=1e-13)
    no_reset = np.zeros((T, K), bool)
    _record(net, obs, state, no_reset)
    net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)
    assert not np.allclose(net.grads, want, rtol=1e-6)


@pytest.mark.parametrize("spec,obs_shape", [("mlp-lstm", (4,)), ("doom-lstm", (1, 30, 26))])
def test_batched_gradient_matches_finite_differences(spec, obs_shape):
    """Float64 central differences of the batched rollout's loss (the sum of
    its segments' losses) against rollout_grad, on random coordinates of
    every tensor."""
    net = build_network(spec, obs_shape, 3, dtype=np.float64, seed=2,
                        **({"lstm_size": 6, "hidden": (8,)} if spec == "mlp-lstm" else {}))
    T, K = 4, 3
    obs, actions, ret, adv, state = _batch(net, T, K, seed=4)
    resets = np.zeros((T, K), bool)
    resets[2, 0] = resets[1, 2] = True
    kw = {"value_coef": 0.5, "entropy_beta": 0.02}
    _record(net, obs, state, resets)
    net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)
    grads = net.grads.copy()

    def total_loss():
        tot = 0.0
        for k in range(K):
            cuts = [0] + [t for t in range(1, T) if resets[t, k]] + [T]
            for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
                s0 = (state[0][k], state[1][k]) if j == 0 else None
                tot += net.loss(obs[a:b, k], actions[a:b, k], ret[a:b, k], adv[a:b, k], s0,
                                **kw)["loss"]
        return tot

    rng = np.random.default_rng(0)
    eps = 1e-6
    for name in net.layout:
        off, size = net.layout.offset(name), int(np.prod(net.layout.shape(name)))
        for i in rng.choice(size, min(size, 4), replace=False):
            j = off + int(i)
            keep = net.params[j]
            net.params[j] = keep + eps
            up = total_loss()
            net.params[j] = keep - eps
            down = total_loss()
            net.params[j] = keep
            fd = (up - down) / (2 * eps)
            assert grads[j] == pytest.approx(fd, rel=1e-5, abs=1e-8), name


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("mlp-lstm", (7,))])
def test_float32_ticks_are_step_batch_rows(spec, obs_shape):
    """The recorded forward over K rows is step_batch's (the inference path)
    to float32 rounding, and the float32 gradient is the segments' sum to
    float32 accuracy."""
    net = build_network(spec, obs_shape, 3, seed=0)
    T, K = 3, 8
    obs, actions, ret, adv, state = _batch(net, T, K, seed=1)
    resets = _resets(T, K, seed=2)
    ticks = _record(net, obs, state, resets)
    h = c = None
    if state is not None:
        h, c = state[0].copy(), state[1].copy()
    for t in range(T):
        st = None
        if h is not None:
            h[resets[t]] = 0
            c[resets[t]] = 0
            st = (h, c)
        p, v, new = net.step_batch(obs[t], st)
        if new is not None:
            h, c = new
        np.testing.assert_allclose(ticks[t][0], p, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(ticks[t][1], v, rtol=2e-4, atol=1e-5)
    kw = {"value_coef": 0.5, "entropy_beta": 0.01}
    net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)
    got = net.grads.copy()
    want, _ = _segments_sum(net, obs, actions, ret, adv, state, resets, kw)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)


def test_record_tick_refuses_out_of_order_ticks_and_bad_rows():
    net = build_network("mlp-lstm", (4,), 2, seed=0)
    net.begin_batch_rollout(3, 2)
    with pytest.raises(RuntimeError, match="not the next"):
        net.record_tick(1)
    net.tick_inputs(0)[...] = 0.5
    net.tick_inputs(0)[1, 2] = np.nan
    with pytest.raises(ValueError, match="row 1"):
        net.record_tick(0)
    net.tick_inputs(0)[1, 2] = 0.0
    with pytest.raises(ValueError, match="state"):
        net.record_tick(0, (np.zeros((3, net.lstm_size), np.float32),) * 2)
    net.record_tick(0)
    assert net.recorded_steps == 2
