"""The direct convolution of batched inference (a3c_core._conv) against the
float64 numpy twin (nn.ref.conv2d_forward), both input layouts, block tails,
and its errors; and step_batch through it against step_batch through im2col +
GEMM.  Where the CPU has no AVX-512 the kernel does not run (the GEMM path
does, which tests/test_batch.py covers)."""
import numpy as np
import pytest

from a3c_core import _conv, build_network
from a3c_core.nn import batch as batch_mod
from a3c_core.nn import ref

needs_isa = pytest.mark.skipif(_conv.ISA is None, reason="no AVX-512 here: GEMM path only")

# (C, H, W, k, stride, O): the doom and atari convs, and odd sizes whose rows
# end in a partial block (OW not a multiple of the block width)
SHAPES = [(1, 84, 84, 8, 4, 16), (16, 20, 20, 4, 2, 32), (4, 84, 84, 8, 4, 32),
          (32, 20, 20, 4, 2, 64), (64, 9, 9, 3, 1, 64), (3, 13, 31, 3, 2, 16),
          (2, 7, 50, 2, 1, 32), (5, 6, 23, 5, 1, 64)]


def _twin(x, w_hwco, stride):
    """NHWC output of the float64 reference conv (no bias)."""
    w = w_hwco.transpose(3, 2, 0, 1).astype(np.float64)
    out, _ = ref.conv2d_forward(x.astype(np.float64), w, np.zeros(w.shape[0]), stride)
    return out.transpose(0, 2, 3, 1)


@needs_isa
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_float64_twin(shape):
    c, h, w_, k, s, o = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((k, k, c, o)).astype(np.float32)
    want = _twin(x, w, s)
    out = np.full(want.shape, np.nan, np.float32)
    _conv.conv_direct(x, w, s, out)
    scale = np.sqrt(k * k * c)              # the size of a sum of k*k*c unit products
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * scale * 4)
    # the same input as NHWC rows seen through a transposed view
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    out2 = np.full(want.shape, np.nan, np.float32)
    _conv.conv_direct(nhwc.transpose(0, 3, 1, 2), w, s, out2)
    np.testing.assert_array_equal(out2, out)


@needs_isa
def test_bad_arguments_are_named():
    x = np.zeros((2, 1, 84, 84), np.float32)
    w = np.zeros((8, 8, 1, 16), np.float32)
    out = np.zeros((2, 20, 20, 16), np.float32)
    with pytest.raises(ValueError, match="out must have shape"):
        _conv.conv_direct(x, w, 4, np.zeros((2, 20, 19, 16), np.float32))
    with pytest.raises(ValueError, match="input channels"):
        _conv.conv_direct(x, np.zeros((8, 8, 2, 16), np.float32), 4, out)
    with pytest.raises(ValueError, match="stride"):
        _conv.conv_direct(x, w, 0, out)
    with pytest.raises(ValueError, match="smaller than"):
        _conv.conv_direct(x[:, :, :5, :5], w, 4, out)
    with pytest.raises(ValueError, match="16, 32 or 64 output channels"):
        _conv.conv_direct(x, np.zeros((8, 8, 1, 48), np.float32), 4,
                          np.zeros((2, 20, 20, 48), np.float32))
    assert not _conv.supported(48) and _conv.supported(16)


@needs_isa
@pytest.mark.parametrize("spec,shape", [("doom-lstm", (1, 84, 84)), ("doom-ff", (1, 84, 84)),
                                        ("atari-lstm", (1, 42, 42))])
def test_step_batch_direct_equals_gemm_path(spec, shape, monkeypatch):
    net = build_network(spec, shape, 5, seed=4)
    rng = np.random.default_rng(5)
    net.params[:] += rng.normal(0, 0.05, net.n_params).astype(np.float32)
    obs = rng.random((11,) + shape).astype(np.float32)
    state = None
    if net.recurrent:
        state = tuple(rng.normal(size=(11, net.lstm_size)).astype(np.float32) for _ in range(2))
    got = {}
    for direct in (True, False):
        monkeypatch.setattr(batch_mod, "DIRECT_CONV", direct)
        net._batch = None
        got[direct] = net.step_batch(obs, state)
        assert net._batch.direct is direct
    (p1, v1, s1), (p0, v0, s0) = got[True], got[False]
    np.testing.assert_allclose(p1, p0, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(v1, v0, rtol=2e-5, atol=1e-6)
    if net.recurrent:
        np.testing.assert_allclose(s1[0], s0[0], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(s1[1], s0[1], rtol=2e-5, atol=1e-6)
