"""Whole A3C loss gradient check (float64) for every spec, and the CLI."""
import numpy as np
import pytest

from a3c_core.nn import build_network
from a3c_core.nn.gradcheck import DEFAULT_OBS, gradcheck, main
from a3c_core.nn.network import SPECS, Network


@pytest.mark.parametrize("spec", SPECS)
def test_whole_loss_gradcheck(spec):
    errors = gradcheck(spec, steps=4, seed=1)
    net = build_network(spec, DEFAULT_OBS[spec], 3)
    expected = list(net.layout) + (["state.h0", "state.c0"] if net.recurrent else [])
    assert list(errors) == expected
    bad = {k: v for k, v in errors.items() if not v <= 1e-6}
    assert not bad, bad


@pytest.mark.parametrize("spec", ["mlp-lstm", "doom-lstm"])
def test_whole_loss_gradcheck_with_a_large_entropy_bonus(spec):
    """The same check with a large entropy bonus, through the fused heads
    kernel and every layer below it."""
    errors = gradcheck(spec, steps=4, seed=5, entropy_beta=0.2)
    bad = {k: v for k, v in errors.items() if not v <= 1e-6}
    assert not bad, bad


def test_gradcheck_small_frame_and_net_instance():
    net = build_network("doom-lstm", (2, 30, 26), 4, dtype=np.float32, seed=3)
    errors = gradcheck(net, steps=3, seed=2)
    assert max(errors.values()) <= 1e-6, errors


def test_gradcheck_detects_wrong_gradient(monkeypatch):
    real = Network.loss_and_grad

    def broken(self, *args, **kwargs):
        stats, grads = real(self, *args, **kwargs)
        grads["fc.bias"][3] *= 1.001            # a 0.1 % error in one entry
        return stats, grads
    monkeypatch.setattr(Network, "loss_and_grad", broken)
    errors = gradcheck("doom-ff", steps=2, max_entries=256, directions=1)
    assert errors["fc.bias"] > 1e-5
    assert errors["conv1.weight"] <= 1e-6


def test_atari_lstm_gradcheck_cli(capsys):
    assert main(["--spec", "atari-lstm", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "# atari-lstm obs_shape=(1, 42, 42)" in out
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert [ln.split()[0] for ln in lines[:2]] == ["conv1.weight", "conv1.bias"]
    assert len(lines) == 8 + 4 + 4 + 2 and all(ln.split()[-1] == "ok" for ln in lines)


def test_cli(capsys):
    assert main(["--spec", "mlp-lstm", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(lines) == 14 and all(ln.split()[-1] == "ok" for ln in lines)
    assert lines[0].split()[0] == "fc1.weight" and "(64, 6)" in lines[0]
    assert main(["--spec", "mlp", "--tol", "1e-30"]) == 1
    assert "FAIL" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--spec", "bogus"])
