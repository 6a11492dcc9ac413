"""Networks: engine vs the ref-layer twin, step vs loss_and_grad, dtypes,
state dicts, flat-buffer views, spec errors."""
import json

import numpy as np
import pytest

import a3c_core
from a3c_core.nn import ParamLayout, build_network, network_from_spec
from a3c_core.nn.gradcheck import random_rollout
from a3c_core.nn.network import SPECS, ref_forward_loss

CASES = [("doom-lstm", (1, 84, 84)), ("doom-ff", (1, 84, 84)), ("doom-lstm", (2, 30, 26)),
         ("doom-lstm", (3, 61, 100)), ("atari-lstm", (1, 42, 42)), ("atari-lstm", (2, 17, 23)),
         ("mlp-lstm", (7,)), ("mlp", (7,))]


def rollout(net, t_len, seed=0):
    return random_rollout(net, t_len, np.random.default_rng(seed))


def test_layout_views_share_one_buffer():
    lay = ParamLayout([("a.weight", (2, 3)), ("a.bias", (2,))])
    assert lay.size == 8 and lay.offset("a.bias") == 6 and lay.names() == ["a.weight", "a.bias"]
    flat = lay.new_flat(np.float64)
    v = lay.views(flat)
    v["a.bias"][:] = [1, 2]
    assert flat[6:].tolist() == [1, 2]
    with pytest.raises(ValueError, match="duplicate"):
        lay.add("a.bias", (1,))
    with pytest.raises(ValueError):
        lay.views(np.zeros(7))


def test_standard_doom_lstm():
    net = a3c_core.build_network("doom-lstm", (1, 84, 84), 3)
    assert net.dtype == np.float32 and net.params.dtype == np.float32
    assert net.recurrent and net.n_actions == 3 and net.obs_shape == (1, 84, 84)
    shapes = {k: v.shape for k, v in net.state_dict().items()}
    assert shapes == {
        "conv1.weight": (16, 1, 8, 8), "conv1.bias": (16,),
        "conv2.weight": (32, 16, 4, 4), "conv2.bias": (32,),
        "fc.weight": (256, 2592), "fc.bias": (256,),
        "lstm.weight_ih": (1024, 256), "lstm.weight_hh": (1024, 256),
        "lstm.bias_ih": (1024,), "lstm.bias_hh": (1024,),
        "policy.weight": (3, 256), "policy.bias": (3,),
        "value.weight": (1, 256), "value.bias": (1,)}
    assert net.n_params == sum(int(np.prod(s)) for s in shapes.values()) == 1200436
    sd = net.state_dict()
    np.testing.assert_allclose(np.linalg.norm(sd["policy.weight"], axis=1), 0.01, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(sd["value.weight"], axis=1), 1.0, rtol=1e-5)
    assert not sd["policy.bias"].any() and not sd["lstm.bias_ih"].any()
    h, c = net.initial_state()
    assert h.shape == c.shape == (256,) and h.dtype == np.float32 and not h.any()
    assert json.loads(json.dumps(net.spec)) == net.spec
    assert build_network("doom-ff", (1, 84, 84), 3).initial_state() is None


def test_params_are_views_of_flat_buffer():
    net = build_network("mlp-lstm", (4,), 2, hidden=(8,), lstm_size=6)
    sd = net.state_dict()
    sd["fc1.weight"][0, 0] = 123.0
    assert net.params[net.layout.offset("fc1.weight")] == 123.0
    net.params[net.layout.slice("value.bias")] = 7.0
    assert sd["value.bias"][0] == 7.0
    for name, v in sd.items():
        assert np.shares_memory(v, net.params), name
    _, grads = net.loss_and_grad(*rollout(net, 3))
    for name, g in grads.items():
        assert np.shares_memory(g, net.grads), name
    assert net.grads.shape == net.params.shape


@pytest.mark.parametrize("spec,obs_shape", CASES)
def test_engine_matches_ref_twin(spec, obs_shape):
    net = build_network(spec, obs_shape, 4, dtype=np.float64, seed=3)
    obs, actions, returns, adv, state = rollout(net, 5, seed=1)
    stats, grads = net.loss_and_grad(obs, actions, returns, adv, state,
                                     value_coef=0.7, entropy_beta=0.05)
    rstats, rgrads, extras = ref_forward_loss(net, net.state_dict(), obs, actions, returns,
                                              adv, state, value_coef=0.7, entropy_beta=0.05)
    for k in ("policy_loss", "value_loss", "entropy", "loss"):
        assert isinstance(stats[k], float)
        assert stats[k] == pytest.approx(rstats[k], rel=1e-12, abs=1e-12)
    assert set(grads) == set(rgrads) == set(net.layout)
    for k in grads:
        np.testing.assert_allclose(grads[k], rgrads[k], rtol=1e-9, atol=1e-12, err_msg=k)
    np.testing.assert_allclose(net.last_probs, extras["probs"], rtol=1e-12)
    np.testing.assert_allclose(net.last_values, extras["values"], rtol=1e-12, atol=1e-14)
    if net.recurrent:
        np.testing.assert_allclose(net.last_dstate[0], extras["dh0"], rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose(net.last_dstate[1], extras["dc0"], rtol=1e-9, atol=1e-13)


def test_grads_overwritten_not_accumulated():
    net = build_network("doom-lstm", (1, 36, 36), 3, dtype=np.float64)
    ro = rollout(net, 4)
    g1 = net.loss_and_grad(*ro)[1]["conv1.weight"].copy()
    net.grads[:] = np.nan
    net.loss_and_grad(*ro)
    np.testing.assert_array_equal(net.grad_dict()["conv1.weight"], g1)
    assert np.all(np.isfinite(net.grads))


@pytest.mark.parametrize("spec,obs_shape", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_matches_rollout_forward(spec, obs_shape, dtype):
    net = build_network(spec, obs_shape, 3, dtype=dtype, seed=2)
    obs, actions, returns, adv, state = rollout(net, 6)
    net.loss_and_grad(obs, actions, returns, adv, state)
    s = state
    tol = 2e-6 if dtype is np.float32 else 1e-12
    for t in range(obs.shape[0]):
        before = None if s is None else (s[0].copy(), s[1].copy())
        probs, value, s_new = net.step(obs[t], s)
        assert probs.shape == (3,) and probs.dtype == dtype
        assert isinstance(value, float)
        np.testing.assert_allclose(probs, net.last_probs[t], rtol=tol, atol=tol)
        assert value == pytest.approx(float(net.last_values[t]), rel=tol, abs=tol)
        if s is not None:     # input state untouched, a new tuple returned
            assert s_new is not s and s_new[0] is not s[0]
            np.testing.assert_array_equal(s[0], before[0])
            np.testing.assert_array_equal(s[1], before[1])
        else:
            assert s_new is None
        s = s_new
    if net.recurrent:
        _, _, extras = ref_forward_loss(net, net.state_dict(), obs, actions, returns, adv,
                                        state, backward=False)
        np.testing.assert_allclose(s[0], extras["state"][0], rtol=tol, atol=tol)


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("mlp-lstm", (5,))])
def test_float32_agrees_with_float64(spec, obs_shape):
    n32 = build_network(spec, obs_shape, 3, dtype=np.float32, seed=5)
    n64 = build_network(spec, obs_shape, 3, dtype=np.float64, seed=5)
    np.testing.assert_allclose(n32.params, n64.params, rtol=1e-6, atol=1e-7)
    n64.params[:] = n32.params                      # identical weights
    ro64 = rollout(n64, 8)
    ro32 = tuple(None if a is None else (tuple(x.astype(np.float32) for x in a)
                                         if isinstance(a, tuple) else a) for a in ro64)
    ro32 = (ro64[0].astype(np.float32),) + ro32[1:]
    s32, g32 = n32.loss_and_grad(*ro32)
    s64, g64 = n64.loss_and_grad(*ro64)
    for k in s64:
        assert s32[k] == pytest.approx(s64[k], rel=1e-4, abs=1e-5)
    for k in g64:
        scale = max(np.abs(g64[k]).max(), 1e-6)
        assert np.abs(g32[k] - g64[k]).max() <= 2e-3 * scale, k
    p32, v32, _ = n32.step(ro32[0][0], ro32[4])
    p64, v64, _ = n64.step(ro64[0][0], ro64[4])
    np.testing.assert_allclose(p32, p64, rtol=1e-5)
    assert v32 == pytest.approx(v64, rel=1e-4, abs=1e-5)


def test_variable_rollout_length_and_defaults():
    net = build_network("doom-lstm", (1, 84, 84), 3)
    for t_len in (1, 20, 3, 25):
        stats, _ = net.loss_and_grad(*rollout(net, t_len))
        assert np.isfinite(stats["loss"]) and np.all(np.isfinite(net.grads))
    obs, a, r, adv, _ = rollout(net, 2)
    s_none, _ = net.loss_and_grad(obs, a, r, adv, None)
    s_zero, _ = net.loss_and_grad(obs, a, r, adv, net.initial_state())
    assert s_none == s_zero
    p, v, s = net.step(obs[0], None)
    assert p.sum() == pytest.approx(1.0, abs=1e-6)


def test_state_dict_round_trip_and_errors():
    a = build_network("doom-lstm", (1, 84, 84), 3, seed=0)
    b = build_network("doom-lstm", (1, 84, 84), 3, seed=1)
    assert not np.array_equal(a.params, b.params)
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    np.testing.assert_array_equal(a.params, b.params)
    sd = {k: v.copy() for k, v in a.state_dict().items()}
    sd["fc.weight"] = sd["fc.weight"][:, :10]
    with pytest.raises(ValueError, match="fc.weight"):
        b.load_state_dict(sd)
    sd = dict(a.state_dict())
    del sd["lstm.bias_hh"]
    with pytest.raises(KeyError, match="lstm.bias_hh"):
        b.load_state_dict(sd)
    sd = dict(a.state_dict(), extra=np.zeros(1))
    with pytest.raises(KeyError, match="extra"):
        b.load_state_dict(sd)


def test_network_from_spec_round_trip():
    net = build_network("mlp-lstm", (5,), 2, dtype=np.float64, hidden=(16, 8), lstm_size=12,
                        activation="relu")
    spec = json.loads(json.dumps(net.spec))
    assert spec["name"] == "mlp-lstm" and spec["dtype"] == "float64"
    assert spec["kwargs"]["hidden"] == [16, 8] and spec["kwargs"]["lstm_size"] == 12
    twin = a3c_core.network_from_spec(spec)
    assert twin.layout == net.layout and twin.dtype == np.float64
    twin.load_state_dict(net.state_dict())
    ro = rollout(net, 3)
    assert twin.loss_and_grad(*ro)[0] == net.loss_and_grad(*ro)[0]
    assert [n for n in twin.layout] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                        "lstm.weight_ih", "lstm.weight_hh", "lstm.bias_ih",
                                        "lstm.bias_hh", "policy.weight", "policy.bias",
                                        "value.weight", "value.bias"]
    assert network_from_spec(net.spec, dtype=np.float32).dtype == np.float32


def test_seeded_init_is_deterministic():
    a = build_network("doom-ff", (1, 84, 84), 3, seed=7)
    b = build_network("doom-ff", (1, 84, 84), 3, seed=7)
    np.testing.assert_array_equal(a.params, b.params)


@pytest.mark.parametrize("args,kwargs,match", [
    (("nope", (1, 84, 84), 3), {}, "unknown network spec 'nope'"),
    (("doom-lstm", (8,), 3), {}, "image obs_shape"),
    (("doom-lstm", (1, 6, 84), 3), {}, "too small for conv1"),
    (("doom-ff", (1, 19, 19), 3), {}, "too small for conv2"),
    (("atari-lstm", (42, 42), 3), {}, "image obs_shape"),
    (("atari-lstm", (1, 42, 42), 3), {"fc_size": 8}, "unknown option"),
    (("mlp", (1, 84, 84), 3), {}, "vector obs_shape"),
    (("mlp", (4,), 3), {"lstm_size": 8}, "unknown option"),
    (("mlp", (4,), 3), {"activation": "tanh"}, "activation"),
])
def test_bad_specs(args, kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        build_network(*args, **kwargs)
    if "option" not in match and "activation" not in match:
        for spec in SPECS:
            assert spec in str(info.value)


def test_bad_inputs():
    net = build_network("mlp-lstm", (4,), 3)
    obs, a, r, adv, s = rollout(net, 3)
    with pytest.raises(ValueError, match="actions"):
        net.loss_and_grad(obs, np.array([0, 1, 3]), r, adv, s)
    with pytest.raises(ValueError, match="obs"):
        net.loss_and_grad(obs[:, :3], a, r, adv, s)
    with pytest.raises(ValueError, match="LSTM state"):
        net.step(obs[0], (np.zeros(3), np.zeros(3)))


def test_step_sees_param_updates():
    """The fused step reads the live weight views on every call (its conv
    tap tables are rebuilt per call): an in-place update is never stale."""
    net = build_network("doom-lstm", (1, 84, 84), 3, seed=4)
    obs = np.random.default_rng(0).random((1, 84, 84)).astype(np.float32)
    net.step(obs, None)
    net.params[:] += np.random.default_rng(1).standard_normal(net.n_params).astype(
        np.float32) * 0.01
    probs, value, (h, c) = net.step(obs, None)
    _, _, extras = ref_forward_loss(net, net.state_dict(), obs[None], np.zeros(1, int),
                                    np.zeros(1, np.float32), np.zeros(1, np.float32), None,
                                    backward=False)
    np.testing.assert_allclose(probs, extras["probs"][0], rtol=2e-5, atol=2e-6)
    assert value == pytest.approx(float(extras["values"][0]), rel=2e-5, abs=2e-5)
    np.testing.assert_allclose(h, extras["state"][0], rtol=2e-5, atol=2e-6)


def test_atari_lstm_layout_and_layers():
    net = build_network("atari-lstm", (1, 42, 42), 6)
    shapes = {k: v.shape for k, v in net.state_dict().items()}
    convs = {f"conv{i}.weight": (32, 1 if i == 1 else 32, 3, 3) for i in range(1, 5)}
    assert shapes == {**{k: v for i in range(1, 5) for k, v in
                         ((f"conv{i}.weight", convs[f"conv{i}.weight"]), (f"conv{i}.bias", (32,)))},
                      "lstm.weight_ih": (1024, 288), "lstm.weight_hh": (1024, 256),
                      "lstm.bias_ih": (1024,), "lstm.bias_hh": (1024,),
                      "policy.weight": (6, 256), "policy.bias": (6,),
                      "value.weight": (1, 256), "value.bias": (1,)}
    assert list(net.layout)[:2] == ["conv1.weight", "conv1.bias"]
    assert [c.out_shape for c in net.encoder] == [(32, 21, 21), (32, 11, 11), (32, 6, 6),
                                                   (32, 3, 3)]
    assert [L.kind for L in net.layers] == ["conv"] * 4 + ["lstm", "heads"]
    assert net.n_features == 288 and net.lstm_size == 256 and net.recurrent
    assert net.n_params == 4 * 32 + 9 * 32 + 3 * 9 * 32 * 32 + 1024 * (288 + 256 + 2) + 7 * 257
    np.testing.assert_allclose(np.linalg.norm(net.state_dict()["policy.weight"], axis=1), 0.01,
                               rtol=1e-5)
    assert not net.fused_step                  # generic per-layer step
    assert build_network("doom-lstm", (1, 84, 84), 3).fused_step
    assert build_network("doom-ff", (3, 64, 48), 3).fused_step
    assert not build_network("mlp-lstm", (4,), 3).fused_step


def test_fork_shares_params_not_scratch():
    net = build_network("doom-lstm", (1, 36, 36), 3, seed=1)
    twin = net.fork()
    assert twin.params is net.params and twin.grads is not net.grads
    assert not np.shares_memory(twin.grads, net.grads)
    for k, v in twin.state_dict().items():
        assert np.shares_memory(v, net.params), k
    assert twin.spec == net.spec and twin.layout == net.layout
    ro_a, ro_b = rollout(net, 5, seed=1), rollout(net, 3, seed=2)
    s_a, g_a = net.loss_and_grad(*ro_a)
    g_a = {k: v.copy() for k, v in g_a.items()}
    probs_a = net.last_probs.copy()
    twin.loss_and_grad(*ro_b)                  # must not touch net's scratch or grads
    np.testing.assert_array_equal(net.last_probs, probs_a)
    for k, v in net.grad_dict().items():
        np.testing.assert_array_equal(v, g_a[k], err_msg=k)
    assert twin.last_probs.shape == (3, 3)
    obs = ro_a[0][0]
    p1, v1, _ = net.step(obs, None)
    p2, v2, _ = twin.step(obs, None)
    np.testing.assert_array_equal(p1, p2)
    net.params[:] *= 0.5                        # an update is seen through the fork
    p3, v3, _ = twin.step(obs, None)
    p4, v4, _ = net.step(obs, None)
    assert v3 == v4 != v1
    np.testing.assert_array_equal(p3, p4)


def test_forks_in_threads_match_serial():
    import threading

    net = build_network("atari-lstm", (1, 20, 20), 3, seed=2)
    rollouts = [rollout(net, 4, seed=s) for s in range(2)]
    serial = [net.loss_and_grad(*ro)[1]["conv1.weight"].copy() for ro in rollouts]
    out = [None, None]

    def work(i, n):
        for _ in range(20):
            _, g = n.loss_and_grad(*rollouts[i])
            n.step(rollouts[i][0][0], None)
        out[i] = g["conv1.weight"].copy()
    threads = [threading.Thread(target=work, args=(i, net.fork())) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(2):
        np.testing.assert_array_equal(out[i], serial[i])


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (1, 84, 84)), ("atari-lstm", (1, 42, 42)),
                                            ("mlp", (5,)), ("mlp-lstm", (5,))])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_step_rejects_non_finite_obs(spec, obs_shape, bad):
    net = build_network(spec, obs_shape, 3, seed=0)
    obs = np.random.default_rng(0).random(obs_shape).astype(np.float32)
    state = None if not net.recurrent else tuple(np.full(net.lstm_size, 0.25, np.float32)
                                                 for _ in range(2))
    obs[(0,) * len(obs_shape)] = bad
    with pytest.raises(ValueError, match="observation contains NaN or inf"):
        net.step(obs, state)
    if state is not None:
        assert np.all(state[0] == 0.25) and np.all(state[1] == 0.25)
    obs[(0,) * len(obs_shape)] = 0.5
    probs, value, _ = net.step(obs, state)
    assert np.all(np.isfinite(probs)) and np.isfinite(value)
    net.params[:] = np.nan                      # NaN weights are not an input error
    probs, value, _ = net.step(obs, state)
    assert np.isnan(value)


def test_atari_step_matches_hand_forward():
    """atari-lstm step vs the ref ops composed by hand here (padding
    1, stride 2, four convs, LSTM, heads) rather than through the layer list."""
    from a3c_core.nn import ref

    net = build_network("atari-lstm", (1, 42, 42), 4, dtype=np.float64, seed=5)
    p = net.state_dict()
    obs = np.random.default_rng(3).random((1, 42, 42))
    x = obs[None]
    for i in range(1, 5):
        x = ref.elu_forward(ref.conv2d_forward(x, p[f"conv{i}.weight"], p[f"conv{i}.bias"],
                                               2, 1)[0])[0]
    assert x.shape == (1, 32, 3, 3)
    h, c, _ = ref.lstm_step_forward(x.reshape(-1), np.zeros(256), np.zeros(256),
                                    p["lstm.weight_ih"], p["lstm.weight_hh"],
                                    p["lstm.bias_ih"], p["lstm.bias_hh"])
    probs_ref = ref.softmax(p["policy.weight"] @ h + p["policy.bias"])
    probs, value, (h1, c1) = net.step(obs, None)
    np.testing.assert_allclose(probs, probs_ref, rtol=1e-12)
    assert value == pytest.approx(float(p["value.weight"][0] @ h + p["value.bias"][0]), rel=1e-12)
    np.testing.assert_allclose(h1, h, rtol=1e-12, atol=1e-15)
