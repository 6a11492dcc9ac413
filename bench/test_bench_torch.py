"""PyTorch cross-check of doom-lstm: agreement + a short side-by-side timing.

Skipped when torch is not importable (it is never a dependency).  Run with
``pytest bench/test_bench_torch.py -s`` to see the timing table.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_compare as tc  # noqa: E402  (bench/ is on sys.path under pytest)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_agreement(dtype):
    errs = tc.check_agreement(dtype, T=20)
    assert errs["loss"] <= tc.TOL[np.dtype(dtype).name]
    assert any(k.startswith("grad.conv1") for k in errs)


def test_side_by_side_timing():
    rows = tc.time_side_by_side(T=20, repeat=3, min_time=0.05)
    assert [r["name"] for r in rows] == ["step (batch 1)", "forward+backward T=20"]
    for r in rows:
        assert r["a3c_core_us"] > 0 and r["torch_us"] > 0
        print(f"{r['name']}: a3c_core {r['a3c_core_us']:.1f} us, torch {r['torch_us']:.1f} us, "
              f"torch/ours {r['torch_over_ours']:.2f}")
