"""Networks agree with their PyTorch twins (step outputs, loss, every gradient).

The torch model is built from the same layer list (``a3c_core.nn.torch_twin``).
Needs torch (optional, never a dependency): skipped where it is absent.
"""
import numpy as np
import pytest

pytest.importorskip("torch")

from a3c_core.nn import torch_twin as tt  # noqa: E402


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("spec", ["doom-lstm", "atari-lstm"])
def test_matches_torch(spec, dtype):
    errs = tt.check_agreement(spec, dtype, T=8, steps=3)
    tol = tt.TOL[np.dtype(dtype).name]
    assert max(errs.values()) <= tol, errs
    assert {"step.probs", "step.value", "step.h", "step.c", "loss", "grad.lstm.weight_hh",
            "grad.conv1.weight", "grad.value.bias"} <= set(errs)
    if spec == "atari-lstm":
        assert "grad.conv4.weight" in errs


@pytest.mark.parametrize("spec,obs_shape", [("doom-ff", (3, 40, 36)), ("mlp", (5,)),
                                            ("atari-lstm", (2, 30, 25))])
def test_other_specs_match_torch(spec, obs_shape):
    errs = tt.check_agreement(spec, np.float64, T=4, steps=2, obs_shape=obs_shape)
    assert max(errs.values()) <= tt.TOL["float64"], errs


def test_disagreement_is_detected():
    """A wrong weight in our network must trip the check."""
    net, model = tt.build_pair("atari-lstm", None, 3, np.float64)
    net.state_dict()["conv3.weight"][0, 0, 1, 1] += 1e-3
    obs, actions, returns, adv = tt.random_rollout(net, 3)
    stats, grads = net.loss_and_grad(obs, actions, returns, adv, None)
    tloss, tgrads = tt.torch_loss_and_grad(model, obs, actions, returns, adv,
                                           net.initial_state())
    assert abs(stats["loss"] - tloss) > 1e-9 * abs(tloss)


@pytest.mark.parametrize("spec,obs_shape", [("doom-lstm", (2, 30, 26)), ("atari-lstm", (1, 42, 42)),
                                            ("mlp-lstm", (7,))])
def test_batched_rollout_gradient_matches_torch(spec, obs_shape):
    """The batched worker's update (K envs in lockstep, rows t*K + k, a
    per-row reset mask) against torch autograd through the same recurrence:
    an LSTMCell over the K rows per tick whose state is zeroed where a row
    resets, the A3C loss summed over all T x K rows."""
    import torch

    from a3c_core.nn import build_network

    net = build_network(spec, obs_shape, 3, dtype=np.float64, seed=3)
    model = tt.torch_model(net)
    T, K, H = 5, 4, net.lstm_size
    rng = np.random.default_rng(11)
    obs = rng.random((T, K, *obs_shape))
    actions = rng.integers(0, 3, (T, K))
    ret, adv = rng.standard_normal((T, K)), rng.standard_normal((T, K))
    state = (0.5 * rng.standard_normal((K, H)), 0.5 * rng.standard_normal((K, H)))
    resets = rng.random((T, K)) < 0.3
    resets[0] = False
    resets[2, 1] = True
    kw = {"value_coef": 0.6, "entropy_beta": 0.03}

    net.begin_batch_rollout(T, K)
    for t in range(T):
        net.tick_inputs(t)[...] = obs[t]
        net.record_tick(t, state if t == 0 else None, resets[t] if t else None)
    stats = net.rollout_grad(actions.reshape(-1), ret.reshape(-1), adv.reshape(-1), **kw)

    top = model.features(torch.from_numpy(obs.reshape(T * K, *obs_shape))).reshape(T, K, -1)
    cell = getattr(model, net.core.name)
    h, c = torch.from_numpy(state[0]), torch.from_numpy(state[1])
    hs = []
    for t in range(T):
        keep = torch.from_numpy((~resets[t]).astype(np.float64))[:, None]
        h, c = cell(top[t], (h * keep, c * keep))
        hs.append(h)
    rows = torch.stack(hs).reshape(T * K, -1)
    logp = torch.log_softmax(model.policy(rows), 1)
    values = model.value(rows)[:, 0]
    a = torch.from_numpy(actions.reshape(-1))
    policy_loss = -(logp.gather(1, a[:, None])[:, 0] * torch.from_numpy(adv.reshape(-1))).sum()
    value_loss = 0.5 * ((torch.from_numpy(ret.reshape(-1)) - values) ** 2).sum()
    entropy = -(logp.exp() * logp).sum()
    loss = policy_loss + kw["value_coef"] * value_loss - kw["entropy_beta"] * entropy
    model.zero_grad(set_to_none=False)
    loss.backward()
    assert stats["policy_loss"] == pytest.approx(float(policy_loss.detach()), rel=1e-9)
    assert stats["entropy"] == pytest.approx(float(entropy.detach()), rel=1e-9)
    ours = net.grad_dict()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(ours[name], p.grad.numpy(), rtol=1e-8, atol=1e-11,
                                   err_msg=name)
