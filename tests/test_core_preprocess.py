"""Frame preprocessing: parity with the numpy area resize, gray/RGB, crop, sizes, errors."""
import json

import numpy as np
import pytest

from a3c_core.core import Preprocessor, preprocess_frame
from a3c_core.core.ref import ref_area_weights, ref_preprocess
from a3c_core.core.preprocess import area_table

ATOL = 2e-6


@pytest.mark.parametrize("n_in,n_out", [(1, 1), (1, 5), (7, 3), (120, 84), (160, 84),
                                        (5, 7), (84, 84), (13, 26), (11, 4)])
def test_area_table_matches_definition(n_in, n_out):
    start, w = area_table(n_in, n_out)
    M = np.zeros((n_out, n_in))
    for o in range(n_out):
        M[o, start[o]:start[o] + w.shape[1]] = w[o]
    np.testing.assert_allclose(M, ref_area_weights(n_in, n_out), atol=1e-12)
    np.testing.assert_allclose(M.sum(1), 1.0, atol=1e-12)


@pytest.mark.parametrize("in_shape,out_shape,crop", [
    ((120, 160), (84, 84), None),
    ((120, 160), (84, 84), (10, 6, 3, 5)),
    ((37, 53), (11, 17), None),                   # odd, non-integer ratios
    ((9, 7), (20, 15), None),                     # upsampling
    ((84, 84), (84, 84), None),                   # identity
    ((120, 160, 3), (84, 84), None),              # RGB
    ((31, 45, 3), (12, 40), (2, 3, 4, 1)),        # RGB, crop, mixed up/down
    ((50, 60, 1), (25, 30), None),                # gray with channel axis
])
def test_parity(in_shape, out_shape, crop):
    rng = np.random.default_rng(sum(in_shape))
    frame = rng.integers(0, 256, in_shape, dtype=np.uint8)
    pre = Preprocessor(in_shape, out_shape, crop)
    out = pre(frame)
    assert out.shape == out_shape and out.dtype == np.float32
    np.testing.assert_allclose(out, ref_preprocess(frame, out_shape, crop), atol=ATOL)
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_identity_and_constant():
    frame = np.arange(84 * 84, dtype=np.uint32).reshape(84, 84).astype(np.uint8)
    np.testing.assert_allclose(Preprocessor((84, 84), (84, 84))(frame), frame / 255.0, atol=1e-7)
    for shape, out_shape in [((120, 160), (84, 84)), ((9, 7), (20, 15)), ((37, 53, 3), (11, 17))]:
        for val in (0, 1, 128, 255):
            frame = np.full(shape, val, np.uint8)
            out = Preprocessor(shape, out_shape)(frame)
            np.testing.assert_allclose(out, val / 255.0, atol=1e-6)
            assert out.max() <= 1.0


def test_rgb_luma_and_integer_downsample():
    frame = np.zeros((4, 4, 3), np.uint8)
    frame[..., 0] = 255
    out = Preprocessor((4, 4, 3), (2, 2))(frame)
    np.testing.assert_allclose(out, 0.299, atol=1e-6)
    g = np.array([[0, 255, 0, 0], [255, 255, 0, 0], [0, 0, 10, 20], [0, 0, 30, 40]], np.uint8)
    np.testing.assert_allclose(Preprocessor((4, 4), (2, 2))(g),
                               [[0.75, 0.0], [0.0, 25 / 255]], atol=1e-6)


def test_crop_selects_region():
    frame = np.zeros((10, 12), np.uint8)
    frame[2:8, 3:9] = 200
    out = Preprocessor((10, 12), (3, 3), crop=(2, 2, 3, 3))(frame)
    np.testing.assert_allclose(out, 200 / 255, atol=1e-6)


def test_out_forms_and_convenience():
    rng = np.random.default_rng(5)
    frame = rng.integers(0, 256, (120, 160), dtype=np.uint8)
    pre = Preprocessor((120, 160))
    want = pre(frame)
    buf = np.zeros((3, 84, 84), np.float32)
    pre(frame, buf[1])
    np.testing.assert_array_equal(buf[1], want)
    assert not buf[0].any() and not buf[2].any()
    flat = np.zeros(84 * 84, np.float32)
    pre(frame, flat)
    np.testing.assert_array_equal(flat.reshape(84, 84), want)
    chw = np.zeros((1, 84, 84), np.float32)
    pre(frame, chw)
    np.testing.assert_array_equal(chw[0], want)
    out = np.empty((84, 84), np.float32)
    assert preprocess_frame(frame, out) is out
    np.testing.assert_array_equal(out, want)


def test_spec_roundtrip():
    pre = Preprocessor((120, 160, 3), (42, 42), crop=(1, 2, 3, 4))
    d = json.loads(json.dumps(pre.spec()))
    assert d == {"kind": "area", "in_shape": [120, 160, 3], "out_shape": [42, 42],
                 "crop": [1, 2, 3, 4]}
    pre2 = Preprocessor.from_spec(d)
    frame = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    np.testing.assert_array_equal(pre(frame), pre2(frame))
    with pytest.raises(ValueError, match="kind"):
        Preprocessor.from_spec({"kind": "bilinear"})


def test_bad_inputs():
    pre = Preprocessor((12, 16), (6, 8))
    good = np.zeros((12, 16), np.uint8)
    with pytest.raises(TypeError, match="frame.*uint8"):
        pre(good.astype(np.float32))
    with pytest.raises(ValueError, match="frame has shape"):
        pre(np.zeros((12, 15), np.uint8))
    with pytest.raises(ValueError, match="frame.*contiguous"):
        pre(np.zeros((12, 32), np.uint8)[:, ::2])
    with pytest.raises(TypeError, match="frame"):
        pre([[0] * 16] * 12)
    with pytest.raises(TypeError, match="out.*float32"):
        pre(good, np.zeros((6, 8), np.float64))
    with pytest.raises(ValueError, match="out has shape"):
        pre(good, np.zeros((6, 9), np.float32))
    with pytest.raises(ValueError, match="out.*contiguous"):
        pre(good, np.zeros((6, 16), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="crop"):
        Preprocessor((12, 16), (6, 8), crop=(6, 6, 0, 0))
    with pytest.raises(ValueError, match="in_shape"):
        Preprocessor((12, 16, 4))
    with pytest.raises(ValueError, match="out_shape"):
        Preprocessor((12, 16), (0, 8))


def test_set_norm_normalizes_in_the_resize_pass():
    """(x - mean) * inv_std, written by the kernel itself, against the numpy twin;
    None turns it off; a wrong size or a bad scale is refused by name."""
    from a3c_core.core import Preprocessor
    from a3c_core.core.ref import ref_preprocess

    rng = np.random.default_rng(3)
    pre = Preprocessor((30, 40), (12, 16))
    mean = rng.random((12, 16)).astype(np.float32)
    pre.set_norm(mean, 7.5)
    f = rng.integers(0, 256, (30, 40)).astype(np.uint8)
    want = (ref_preprocess(f, (12, 16)) - mean) * 7.5
    np.testing.assert_allclose(pre(f), want, rtol=1e-4, atol=1e-4)
    out = np.empty(12 * 16, np.float32)                      # a flat rollout row
    np.testing.assert_allclose(pre(f, out).reshape(12, 16), want, rtol=1e-4, atol=1e-4)
    pre.set_norm(None)
    np.testing.assert_allclose(pre(f), ref_preprocess(f, (12, 16)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="191 values"):
        pre.set_norm(np.zeros(191, np.float32), 1.0)
    with pytest.raises(ValueError, match="inv_std"):
        pre.set_norm(mean, float("inf"))
