"""Backward-only update: ``begin_rollout`` / ``step(record=True)`` / ``rollout_grad``
against ``loss_and_grad`` (the self-contained recompute path).

Two claims, tested separately:

* the backward-only path IS today's backward: on the same activation rows
  (recorded by the batched forward, ``record_rollout``) its gradients,
  stats, probs/values and dstate equal ``loss_and_grad``'s bit for bit, in
  float64 and float32;
* the rows batch-1 steps record are the batched forward's up to rounding:
  the step kernels (Numba, fastmath reassoc/contract) and the batched
  forward (BLAS GEMMs) sum in different orders, so even in float64 they
  differ in the last bits (~1e-16 relative, measured) and a real rollout's
  gradients agree to a tolerance, not bit for bit.  The recorded rows are
  the activations the policy acted on.
"""
import numpy as np
import pytest

from a3c_core.nn import build_network
from a3c_core.nn.gradcheck import random_rollout

CASES = [("doom-lstm", (1, 84, 84)), ("doom-ff", (1, 84, 84)), ("doom-lstm", (2, 30, 26)),
         ("atari-lstm", (1, 42, 42)), ("atari-lstm", (2, 17, 23)), ("mlp-lstm", (7,)),
         ("mlp", (7,))]


def _rollout(net, t_len, seed=0):
    return random_rollout(net, t_len, np.random.default_rng(seed))


def _record_steps(net, obs, state, t_cap=None):
    """A real rollout: begin_rollout, then one recorded step per obs row."""
    net.begin_rollout(t_cap or obs.shape[0])
    probs, values = [], []
    s = state
    for t in range(obs.shape[0]):
        p, v, s = net.step(obs[t], s, record=True)
        probs.append(p)
        values.append(v)
    return np.array(probs), np.array(values), s


def _lag(net, obs, actions, ret, adv, state, **kw):
    stats, _ = net.loss_and_grad(obs, actions, ret, adv, state, **kw)
    out = {"stats": stats, "grads": net.grads.copy(), "probs": net.last_probs.copy(),
           "values": net.last_values.copy()}
    if net.recurrent:
        out["dstate"] = tuple(x.copy() for x in net.last_dstate)
    return out


def _roll(net, actions, ret, adv, **kw):
    stats = net.rollout_grad(actions, ret, adv, **kw)
    out = {"stats": stats, "grads": net.grads.copy(), "probs": net.last_probs.copy(),
           "values": net.last_values.copy()}
    if net.recurrent:
        out["dstate"] = tuple(x.copy() for x in net.last_dstate)
    return out


@pytest.mark.parametrize("spec,obs_shape", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_backward_only_is_bit_for_bit_loss_and_grad(spec, obs_shape, dtype):
    net = build_network(spec, obs_shape, 3, dtype=dtype, seed=3)
    obs, actions, ret, adv, state = _rollout(net, 6)
    kw = {"value_coef": 0.7, "entropy_beta": 0.02}
    ref = _lag(net, obs, actions, ret, adv, state, **kw)
    net.grads[:] = np.nan                         # nothing may survive from the last call
    net.record_rollout(obs, state)
    assert net.recorded_steps == 6
    got = _roll(net, actions, ret, adv, **kw)
    np.testing.assert_array_equal(got["grads"], ref["grads"])
    assert got["stats"] == ref["stats"]
    np.testing.assert_array_equal(got["probs"], ref["probs"])
    np.testing.assert_array_equal(got["values"], ref["values"])
    if net.recurrent:
        np.testing.assert_array_equal(got["dstate"][0], ref["dstate"][0])
        np.testing.assert_array_equal(got["dstate"][1], ref["dstate"][1])
    assert np.abs(ref["grads"]).max() > 0


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("atari-lstm", (1, 42, 42)),
                                            ("mlp-lstm", (7,)), ("mlp", (7,)),
                                            ("doom-ff", (1, 84, 84)), ("doom-lstm", (3, 61, 100))])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_recorded_steps_give_loss_and_grad(spec, obs_shape, dtype):
    """A real rollout of recorded steps (from a nonzero LSTM state) vs the
    recompute path: equal up to the step-vs-BLAS rounding (see module doc)."""
    net = build_network(spec, obs_shape, 3, dtype=dtype, seed=4)
    obs, actions, ret, adv, state = _rollout(net, 5, seed=1)
    if net.recurrent:
        state = tuple((np.random.default_rng(9).standard_normal(net.lstm_size) * 0.5)
                      .astype(dtype) for _ in range(2))
    probs, values, s_end = _record_steps(net, obs, state, t_cap=8)
    got = _roll(net, actions, ret, adv)
    ref = _lag(net, obs, actions, ret, adv, state)
    rtol = 1e-12 if dtype is np.float64 else 2e-5
    scale = np.abs(ref["grads"]).max()
    assert scale > 0
    np.testing.assert_allclose(got["grads"], ref["grads"], rtol=0, atol=rtol * scale)
    for key in ("loss", "policy_loss", "value_loss", "entropy"):
        assert got["stats"][key] == pytest.approx(ref["stats"][key], rel=rtol, abs=rtol)
    # the rows are what the policy acted on
    np.testing.assert_allclose(got["probs"], probs, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got["values"], values, rtol=rtol, atol=rtol)
    if net.recurrent:
        for a, b in zip(got["dstate"], ref["dstate"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=rtol * max(np.abs(b).max(), 1e-3))


def test_float64_recorded_rows_match_batched_forward_to_rounding():
    """The recorded activation rows vs the batched forward's, row by row."""
    net = build_network("doom-lstm", (1, 84, 84), 3, dtype=np.float64, seed=5)
    obs, actions, ret, adv, state = _rollout(net, 4)
    _record_steps(net, obs, state)
    ws = net._ws
    rec = [{k: v.copy() for k, v in w.items()} for w in ws]
    net.record_rollout(obs, state)
    for name, key, rows in (("conv1", "z", 4 * 400), ("conv2", "flat", 4), ("fc", "y", 4),
                            ("lstm", "gates", 4), ("lstm", "hs", 5), ("lstm", "cs", 5)):
        i = [L.name for L in net.layers].index(name)
        np.testing.assert_allclose(rec[i][key][:rows], ws[i][key][:rows], rtol=1e-13, atol=1e-14,
                                   err_msg=f"{name}.{key}")


def test_bootstrap_step_does_not_touch_recorded_rows():
    net = build_network("doom-lstm", (1, 84, 84), 3, dtype=np.float64, seed=6)
    obs, actions, ret, adv, state = _rollout(net, 3)
    _, _, s = _record_steps(net, obs, state, t_cap=3)
    g1 = _roll(net, actions, ret, adv)["grads"]
    net.step(obs[0] * 0.5, s)                     # the bootstrap: record=False
    net.step(obs[1], None)
    assert net.recorded_steps == 3
    np.testing.assert_array_equal(_roll(net, actions, ret, adv)["grads"], g1)


@pytest.mark.parametrize("spec", ["doom-lstm", "doom-ff"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_step_kernel_is_the_plain_step_and_leaves_the_rollout_alone(spec, dtype):
    """A training worker's net runs unrecorded steps with the recording kernel
    (one compiled step kernel): the outputs are the plain kernel's, bitwise,
    and its one-step rows are its own, never the rollout's."""
    plain = build_network(spec, (1, 30, 26), 3, dtype=dtype, seed=8)
    net = plain.fork()
    net.single_step_kernel = True
    assert plain._fused and not plain.single_step_kernel
    obs, actions, ret, adv, state = _rollout(net, 4)
    s_p = s_n = state
    for t in range(4):
        p_ref, v_ref, s_p = plain.step(obs[t], s_p)
        p, v, s_n = net.step(obs[t], s_n)
        assert v == v_ref
        np.testing.assert_array_equal(p, p_ref)
        if net.recurrent:
            for a, b in zip(s_n, s_p):
                np.testing.assert_array_equal(a, b)
    # interleaved with a recording: the rows and the gradient are unchanged
    _, _, s = _record_steps(plain, obs[:3], state, t_cap=3)
    g_ref = _roll(plain, actions[:3], ret[:3], adv[:3])["grads"]
    net.begin_rollout(3)
    s = state
    for t in range(3):
        _, _, s = net.step(obs[t], s, record=True)
        net.step(obs[3] * 0.5, net.initial_state())     # unrecorded, another state
    assert net.recorded_steps == 3
    np.testing.assert_array_equal(_roll(net, actions[:3], ret[:3], adv[:3])["grads"], g_ref)
    with pytest.raises(ValueError, match="NaN|finite"):
        net.step(np.full_like(obs[0], np.nan), state)


def test_recording_restarts_and_errors():
    net = build_network("mlp-lstm", (7,), 3, dtype=np.float64, seed=7)
    obs, actions, ret, adv, state = _rollout(net, 4)
    with pytest.raises(RuntimeError, match="begin_rollout"):
        net.step(obs[0], state, record=True)
    with pytest.raises(RuntimeError, match="no recorded steps"):
        net.rollout_grad(actions, ret, adv)
    net.begin_rollout(2)
    assert net.recorded_steps == 0
    with pytest.raises(RuntimeError, match="no recorded steps"):
        net.rollout_grad(actions[:0], ret[:0], adv[:0])
    _record_steps(net, obs[:2], state, t_cap=2)
    s = net.step(obs[0], state)[2]
    for t in range(net._ws_t - 2):               # fill up to the workspace capacity
        s = net.step(obs[0], s, record=True)[2]
    with pytest.raises(RuntimeError, match="full"):
        net.step(obs[0], s, record=True)
    net.begin_rollout(4)
    _record_steps(net, obs, state, t_cap=4)
    with pytest.raises(ValueError, match="actions must be 4"):
        net.rollout_grad(actions[:3], ret, adv)
    with pytest.raises(ValueError, match="4 values"):
        net.rollout_grad(actions, ret[:3], adv)
    with pytest.raises(ValueError, match="t_cap"):
        net.begin_rollout(0)
    np.testing.assert_array_equal(net.recorded_obs, obs)
    net.loss(obs, actions, ret, adv, state)      # reuses the rows: ends the recording
    with pytest.raises(RuntimeError, match="no recorded steps"):
        net.rollout_grad(actions, ret, adv)


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("mlp", (7,))])
def test_non_finite_obs_is_not_recorded(spec, obs_shape):
    net = build_network(spec, obs_shape, 3, dtype=np.float32, seed=8)
    obs, actions, ret, adv, state = _rollout(net, 2)
    net.begin_rollout(4)
    s = net.step(obs[0], state, record=True)[2]
    bad = obs[1].copy()
    bad.reshape(-1)[3] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        net.step(bad, s, record=True)
    assert net.recorded_steps == 1


def test_forks_record_independently():
    net = build_network("doom-lstm", (1, 30, 26), 3, dtype=np.float64, seed=9)
    twin = net.fork()
    obs, actions, ret, adv, state = _rollout(net, 3)
    obs2 = obs[::-1].copy()
    net.begin_rollout(3)
    twin.begin_rollout(3)
    s1, s2 = state, state
    for t in range(3):                            # interleaved, as two threads would
        s1 = net.step(obs[t], s1, record=True)[2]
        s2 = twin.step(obs2[t], s2, record=True)[2]
    g1 = _roll(net, actions, ret, adv)["grads"]
    g2 = _roll(twin, actions, ret, adv)["grads"]
    ref1 = _lag(build_network("doom-lstm", (1, 30, 26), 3, dtype=np.float64, seed=9),
                obs, actions, ret, adv, state)["grads"]
    np.testing.assert_allclose(g1, ref1, rtol=0, atol=1e-12 * np.abs(ref1).max())
    assert not np.allclose(g1, g2)


class _WalkEnv:
    """Vector env for the worker test: obs = noisy position, episodes of 7 steps."""
    n_actions, obs_shape, episode_over = 3, (4,), True

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.t = 0

    def reset(self):
        self.t = 0
        return self.rng.standard_normal(4).astype(np.float32)

    def step(self, a):
        self.t += 1
        return (self.rng.standard_normal(4).astype(np.float32), float(a == 1) - 0.3,
                self.t == 7, False)


class _CheckNet:
    """Proxy of the worker's network: at each ``rollout_grad`` it also runs
    ``loss_and_grad`` on a fork over the recorded obs and the recorded
    initial state, and keeps both gradients."""

    def __init__(self, net):
        self._net, self._twin, self.pairs = net, net.fork(), []

    def __getattr__(self, name):
        return getattr(self._net, name)

    def rollout_grad(self, actions, returns, adv, **kw):
        net = self._net
        lstm_ws = net._ws[len(net.encoder)]
        state0 = (lstm_ws["hs"][0].copy(), lstm_ws["cs"][0].copy())
        obs = net.recorded_obs.copy()
        stats = net.rollout_grad(actions, returns, adv, **kw)
        self._twin.loss_and_grad(obs, actions, returns, adv, state0, **kw)
        self.pairs.append((net.grads.copy(), self._twin.grads.copy(), obs.shape[0],
                           state0[0].copy()))
        return stats


def test_worker_updates_with_the_recorded_rollout():
    """A real Worker (mlp-lstm, float64, episodes spanning several rollouts):
    each update's gradient is loss_and_grad's on the rollout it recorded."""
    from a3c_core.obs import ObsPipeline
    from a3c_core.train.worker import RolloutSettings, Store, Worker

    class NullStore(Store):
        steps = 0

        def pull(self, local):
            pass

        def apply(self, grads, max_grad_norm, offset=0):
            return 1.0, True

        def add_steps(self, n):
            return n

        def record_episode(self, wid, ret, length, end=None):
            pass

    net = _CheckNet(build_network("mlp-lstm", (4,), 3, hidden=(8,), lstm_size=6,
                                  dtype=np.float64, seed=1))
    w = Worker(0, _WalkEnv(), net, ObsPipeline({"kind": "vector"}, (4,)), NullStore(),
               RolloutSettings(t_max=3, reward_scale=1.0), np.random.default_rng(0))
    for _ in range(5):
        w.rollout()
    assert [p[2] for p in net.pairs] == [3, 3, 1, 3, 3]     # 7-step episodes, t_max 3
    assert np.abs(net.pairs[1][3]).max() > 0               # a carried (non-zero) state
    for got, ref, _, _ in net.pairs:
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_record_kernels_match_numpy_twins():
    from a3c_core.nn import kernels as K
    rng = np.random.default_rng(3)
    y = rng.standard_normal((5, 3, 4))
    z = np.zeros((4 * 12, 5))
    K.record_chw_rows(y, z, 2)
    ref = np.zeros_like(z)
    ref[24:36] = y.reshape(5, 12).T                 # numpy twin: CHW -> NHWC rows
    np.testing.assert_array_equal(z, ref)
    rows = np.zeros((3, 60))
    K.record_row(y, rows, 1)
    np.testing.assert_array_equal(rows[1], y.ravel())
    assert not rows[[0, 2]].any()
    h, c, ho, co = rng.standard_normal((4, 6))
    hs, cs = np.zeros((5, 6)), np.zeros((5, 6))
    K.record_state(h, c, ho, co, hs, cs, 2)
    np.testing.assert_array_equal(hs[2:4], [h, ho])
    np.testing.assert_array_equal(cs[2:4], [c, co])
    assert not hs[[0, 1, 4]].any() and not cs[[0, 1, 4]].any()


# -- a recorded rollout that crosses episode boundaries ------------------------

SEG_CASES = [("doom-lstm", (2, 30, 26)), ("atari-lstm", (1, 42, 42)), ("mlp-lstm", (7,)),
             ("mlp", (7,))]


def _record_segments(net, obs, state0, cuts):
    """Record ``obs`` as one rollout whose state is reset to the initial state
    at each row in ``cuts`` (an episode ended before that row)."""
    net.begin_rollout(obs.shape[0])
    s = state0
    for t in range(obs.shape[0]):
        if t in cuts:
            s = net.initial_state()
        _, _, s = net.step(obs[t], s, record=True)


@pytest.mark.parametrize("spec,obs_shape", SEG_CASES)
@pytest.mark.parametrize("cuts", [(3,), (1, 5), (2, 3, 7)])
def test_rollout_across_episodes_is_the_sum_of_its_segments(spec, obs_shape, cuts):
    """One recorded rollout over several episodes has the gradient of the
    separate per-episode rollouts added up (the loss is a sum over steps and
    no gradient flows across a reset), in float64."""
    net = build_network(spec, obs_shape, 3, dtype=np.float64, seed=5)
    t_len = 9
    obs, actions, ret, adv, state0 = _rollout(net, t_len, seed=1)
    kw = {"value_coef": 0.6, "entropy_beta": 0.03}
    bounds = [0, *cuts, t_len]
    want = np.zeros_like(net.grads)
    stats_want = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0}
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        st, _ = net.loss_and_grad(obs[a:b], actions[a:b], ret[a:b], adv[a:b],
                                  state0 if k == 0 else net.initial_state(), **kw)
        want += net.grads
        for key in stats_want:
            stats_want[key] += st[key]
        if k == 0 and net.recurrent:
            dstate0 = tuple(x.copy() for x in net.last_dstate)
    _record_segments(net, obs, state0, cuts)
    stats = net.rollout_grad(actions, ret, adv, **kw)
    np.testing.assert_allclose(net.grads, want, rtol=1e-10, atol=1e-13)
    for key in stats_want:
        assert stats[key] == pytest.approx(stats_want[key], rel=1e-10)
    if net.recurrent:      # dh0/dc0: the gradient wrt the first segment's input state
        np.testing.assert_allclose(net.last_dstate[0], dstate0[0], rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(net.last_dstate[1], dstate0[1], rtol=1e-10, atol=1e-13)
    # and it is not the gradient of the same rows without the resets
    _record_segments(net, obs, state0, ())
    net.rollout_grad(actions, ret, adv, **kw)
    if net.recurrent:
        assert not np.allclose(net.grads, want, rtol=1e-6)


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (2, 30, 26)), ("mlp-lstm", (7,))])
def test_reset_rows_keep_the_previous_output(spec, obs_shape):
    """A reset step's input state goes to hin/cin; the row before it keeps its
    own output (which the heads read)."""
    net = build_network(spec, obs_shape, 3, dtype=np.float64, seed=2)
    obs, *_ = _rollout(net, 5, seed=3)
    net.begin_rollout(5)
    s = net.initial_state()
    outs = []
    for t in range(5):
        if t == 2:
            s = (np.full(net.lstm_size, 0.25), np.full(net.lstm_size, -0.5))   # any new state
        _, _, s = net.step(obs[t], s, record=True)
        outs.append(s[0].copy())
    cws = net._ws[len(net.encoder)]
    np.testing.assert_array_equal(cws["hs"][1:6], np.array(outs))
    assert list(cws["reset"][:5]) == [False, False, True, False, False]
    np.testing.assert_array_equal(cws["hin"][2], np.full(net.lstm_size, 0.25))
    np.testing.assert_array_equal(cws["cin"][2], np.full(net.lstm_size, -0.5))


def test_reset_flags_do_not_leak_into_the_next_recording():
    net = build_network("mlp-lstm", (7,), 3, dtype=np.float64, seed=6)
    obs, actions, ret, adv, state0 = _rollout(net, 6, seed=4)
    _record_segments(net, obs, state0, (2, 4))
    net.rollout_grad(actions, ret, adv)
    for again in ("steps", "batched"):      # a plain recording afterwards: no resets
        if again == "steps":
            _record_segments(net, obs, state0, ())
        else:
            net.record_rollout(obs, state0)
        net.rollout_grad(actions, ret, adv)
        got = net.grads.copy()
        net.loss_and_grad(obs, actions, ret, adv, state0)
        np.testing.assert_allclose(got, net.grads, rtol=1e-10, atol=1e-13)
        _record_segments(net, obs, state0, (3,))
        assert list(net._ws[len(net.encoder)]["reset"][:6]) == [False, False, False, True, False, False]
        net.rollout_grad(actions, ret, adv)
