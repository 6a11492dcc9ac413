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
