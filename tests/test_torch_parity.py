"""doom-lstm agrees with a PyTorch twin (step outputs, loss, every gradient).

Needs torch (optional, never a dependency): skipped where it is absent.
The comparison lives in ``bench/torch_compare.py``.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")


def _torch_compare():
    path = Path(__file__).resolve().parents[1] / "bench" / "torch_compare.py"
    spec = importlib.util.spec_from_file_location("a3c_bench_torch_compare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_doom_lstm_matches_torch(dtype):
    tc = _torch_compare()
    errs = tc.check_agreement(dtype, T=8, steps=3)
    tol = tc.TOL[np.dtype(dtype).name]
    assert max(errs.values()) <= tol, errs
    assert {"step.probs", "step.value", "step.h", "step.c", "loss", "grad.lstm.weight_hh",
            "grad.conv1.weight", "grad.value.bias"} <= set(errs)
