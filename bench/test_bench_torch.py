"""PyTorch cross-check of doom-lstm and atari-lstm: agreement + a short
side-by-side timing.

Skipped when torch is not importable (it is never a dependency).  Run with
``pytest bench/test_bench_torch.py -s`` to see the timing table.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from a3c_core.nn import torch_twin as tt  # noqa: E402


@pytest.mark.parametrize("spec", ["doom-lstm", "atari-lstm"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_agreement(spec, dtype):
    errs = tt.check_agreement(spec, dtype, T=20)
    assert errs["loss"] <= tt.TOL[np.dtype(dtype).name]
    assert any(k.startswith("grad.conv1") for k in errs)


@pytest.mark.parametrize("spec", ["doom-lstm", "atari-lstm"])
def test_side_by_side_timing(spec):
    rows = tt.time_side_by_side(spec, T=20, repeat=3, min_time=0.05)
    assert [r["name"] for r in rows] == ["step (batch 1)", "forward+backward T=20"]
    for r in rows:
        assert r["a3c_core_us"] > 0 and r["torch_us"] > 0
        print(f"{spec} {r['name']}: a3c_core {r['a3c_core_us']:.1f} us, torch "
              f"{r['torch_us']:.1f} us, torch/ours {r['torch_over_ours']:.2f}")
