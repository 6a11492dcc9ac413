"""Reference layers vs centred finite differences (float64), and every Numba
kernel vs its numpy twin (float32 tolerance, float64 tight)."""
import numpy as np
import pytest

from a3c_core.nn import kernels as K
from a3c_core.nn import ref


def num_grad(f, x, eps=1e-6):
    """Centred-difference gradient of scalar ``f()`` wrt array ``x`` (in place)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def rel_err(a, b):
    return np.max(np.abs(a - b) / np.maximum(np.abs(a) + np.abs(b), 1e-8))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ---------------------------------------------------------------- ref vs FD


@pytest.mark.parametrize("stride,c,o,k,hw,pad", [(1, 1, 2, 3, (5, 6), 0), (2, 3, 4, 3, (7, 8), 0),
                                                 (4, 2, 3, 4, (12, 13), 0),
                                                 (2, 2, 3, 3, (6, 7), 1), (1, 1, 2, 2, (4, 5), 2)])
def test_conv2d_ref_grad(rng, stride, c, o, k, hw, pad):
    x = rng.standard_normal((2, c, *hw))
    w = rng.standard_normal((o, c, k, k))
    b = rng.standard_normal(o)
    out, cache = ref.conv2d_forward(x, w, b, stride, pad)
    dout = rng.standard_normal(out.shape)
    dx, dw, db = ref.conv2d_backward(dout, cache)
    assert dx.shape == x.shape

    def f():
        return np.sum(ref.conv2d_forward(x, w, b, stride, pad)[0] * dout)
    assert rel_err(dx, num_grad(f, x)) < 1e-6
    assert rel_err(dw, num_grad(f, w)) < 1e-6
    assert rel_err(db, num_grad(f, b)) < 1e-6


def test_conv2d_ref_matches_direct_loop(rng):
    x = rng.standard_normal((2, 3, 9, 10))
    w = rng.standard_normal((4, 3, 3, 2))
    b = rng.standard_normal(4)
    out, _ = ref.conv2d_forward(x, w, b, 2)
    n, _, oh, ow = out.shape
    direct = np.empty_like(out)
    for s in range(n):
        for q in range(4):
            for y in range(oh):
                for xx in range(ow):
                    direct[s, q, y, xx] = np.sum(
                        x[s, :, 2 * y:2 * y + 3, 2 * xx:2 * xx + 2] * w[q]) + b[q]
    np.testing.assert_allclose(out, direct, rtol=1e-12, atol=1e-12)


def test_conv2d_ref_padding_matches_direct_loop(rng):
    """Padding 1, 3x3 stride 2 (the atari conv): 7x8 -> 4x4, zeros outside."""
    x = rng.standard_normal((2, 3, 7, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    out, _ = ref.conv2d_forward(x, w, b, 2, 1)
    assert out.shape == (2, 4, 4, 4)
    xp = np.zeros((2, 3, 9, 10))
    xp[:, :, 1:8, 1:9] = x
    direct = np.empty_like(out)
    for s in range(2):
        for q in range(4):
            for y in range(4):
                for xx in range(4):
                    direct[s, q, y, xx] = np.sum(
                        xp[s, :, 2 * y:2 * y + 3, 2 * xx:2 * xx + 3] * w[q]) + b[q]
    np.testing.assert_allclose(out, direct, rtol=1e-12, atol=1e-12)
    assert [ref.conv_out_size(n, 3, 2, 1) for n in (42, 21, 11, 6)] == [21, 11, 6, 3]


def test_dense_ref_grad(rng):
    x = rng.standard_normal((3, 5))
    w = rng.standard_normal((4, 5))
    b = rng.standard_normal(4)
    out, cache = ref.dense_forward(x, w, b)
    dout = rng.standard_normal(out.shape)
    dx, dw, db = ref.dense_backward(dout, cache)

    def f():
        return np.sum(ref.dense_forward(x, w, b)[0] * dout)
    for a, arr in ((dx, x), (dw, w), (db, b)):
        assert rel_err(a, num_grad(f, arr)) < 1e-6


@pytest.mark.parametrize("name", ["elu", "relu"])
def test_activation_ref_grad(rng, name):
    fwd, bwd = ref.ACTIVATIONS[name]
    x = rng.standard_normal((4, 7))
    x[np.abs(x) < 1e-3] = 0.5          # keep FD away from the kink at 0
    out, cache = fwd(x)
    dout = rng.standard_normal(out.shape)
    dx = bwd(dout, cache)
    assert rel_err(dx, num_grad(lambda: np.sum(fwd(x)[0] * dout), x)) < 1e-6


def test_elu_values():
    x = np.array([-50.0, -1.0, 0.0, 2.0])
    out, _ = ref.elu_forward(x)
    np.testing.assert_allclose(out, [np.expm1(-50.0), np.expm1(-1.0), 0.0, 2.0])


def test_softmax_stable_extremes():
    z = np.array([[1e30, -1e30, 0.0], [-1e30, -1e30, -1e30], [1e30, 1e30, -1e30]])
    for dt in (np.float32, np.float64):
        zz = z.astype(dt)              # 2e30 differences are finite in float32 too
        p = ref.softmax(zz)
        lp = ref.log_softmax(zz)
        assert np.all(np.isfinite(p)) and np.all(np.isfinite(lp))
        np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)
        np.testing.assert_allclose(p[0], [1, 0, 0])
        np.testing.assert_allclose(p[1], [1 / 3] * 3, rtol=1e-6)
        np.testing.assert_allclose(p[2], [0.5, 0.5, 0], rtol=1e-6)
    stats, dl, dv = ref.a3c_loss(z, np.zeros(3), np.array([1, 0, 2]), np.zeros(3),
                                 np.ones(3))
    assert all(np.isfinite(v) for v in stats.values())
    assert np.all(np.isfinite(dl))


def _lstm_params(rng, n_in, hd):
    return (rng.standard_normal((4 * hd, n_in)) * 0.5, rng.standard_normal((4 * hd, hd)) * 0.5,
            rng.standard_normal(4 * hd) * 0.5, rng.standard_normal(4 * hd) * 0.5)


def test_lstm_step_matches_equations(rng):
    w_ih, w_hh, b_ih, b_hh = _lstm_params(rng, 3, 2)
    x, h, c = rng.standard_normal(3), rng.standard_normal(2), rng.standard_normal(2)
    h1, c1, _ = ref.lstm_step_forward(x, h, c, w_ih, w_hh, b_ih, b_hh)
    a = w_ih @ x + b_ih + w_hh @ h + b_hh
    sg = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    i, f, g, o = sg(a[0:2]), sg(a[2:4]), np.tanh(a[4:6]), sg(a[6:8])
    np.testing.assert_allclose(c1, f * c + i * g, rtol=1e-13)
    np.testing.assert_allclose(h1, o * np.tanh(f * c + i * g), rtol=1e-13)
    assert np.all(np.isfinite(ref.sigmoid(np.array([-1e4, 1e4]))))


@pytest.mark.parametrize("batch", [None, 2])
def test_lstm_sequence_ref_grad(rng, batch):
    t_len, n_in, hd = 4, 3, 5
    lead = () if batch is None else (batch,)
    x = rng.standard_normal((t_len, *lead, n_in))
    h0 = rng.standard_normal((*lead, hd))       # non-zero initial state
    c0 = rng.standard_normal((*lead, hd))
    w_ih, w_hh, b_ih, b_hh = _lstm_params(rng, n_in, hd)
    hs, (hT, cT), cache = ref.lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    dhs = rng.standard_normal(hs.shape)
    dhT = rng.standard_normal(hT.shape)
    dcT = rng.standard_normal(cT.shape)
    grads = ref.lstm_backward(dhs, cache, dhT, dcT)

    def f():
        hs_, (hT_, cT_), _ = ref.lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
        return np.sum(hs_ * dhs) + np.sum(hT_ * dhT) + np.sum(cT_ * dcT)
    for g, arr in zip(grads, (x, h0, c0, w_ih, w_hh, b_ih, b_hh)):
        assert rel_err(g, num_grad(f, arr)) < 1e-6


def test_a3c_loss_ref_grad(rng):
    t_len, na = 5, 4
    logits = rng.standard_normal((t_len, na))
    values = rng.standard_normal(t_len)
    actions = rng.integers(0, na, t_len)
    returns = rng.standard_normal(t_len)
    adv = rng.standard_normal(t_len)
    stats, dl, dv = ref.a3c_loss(logits, values, actions, returns, adv, 0.5, 0.1)
    f = lambda: ref.a3c_loss(logits, values, actions, returns, adv, 0.5, 0.1)[0]["loss"]  # noqa
    assert rel_err(dl, num_grad(f, logits)) < 1e-6
    assert rel_err(dv, num_grad(f, values)) < 1e-6
    lp = ref.log_softmax(logits)
    p = np.exp(lp)
    assert stats["policy_loss"] == pytest.approx(-np.sum(lp[np.arange(t_len), actions] * adv))
    assert stats["value_loss"] == pytest.approx(0.5 * np.sum((returns - values) ** 2))
    assert stats["entropy"] == pytest.approx(-np.sum(p * lp))
    assert stats["loss"] == pytest.approx(stats["policy_loss"] + 0.5 * stats["value_loss"]
                                          - 0.1 * stats["entropy"])


# ---------------------------------------------------------- kernels vs ref

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-12)]


def close(a, b, tol):
    scale = max(np.abs(b).max(), 1.0)
    assert np.abs(np.asarray(a) - b).max() <= tol * scale, np.abs(np.asarray(a) - b).max()


@pytest.mark.parametrize("dt,tol", DTYPES)
@pytest.mark.parametrize("c,k,stride,pad", [(3, 3, 2, 0), (3, 3, 2, 1), (1, 3, 2, 1),
                                            (2, 4, 3, 2), (1, 8, 4, 0)])
def test_im2col_col2im_kernels(rng, dt, tol, c, k, stride, pad):
    x = rng.standard_normal((2, c, 11, 10)).astype(dt)
    kh = kw = k
    cols_ref = ref.im2col(x, kh, kw, stride, pad)             # columns (c, i, j)
    p = cols_ref.shape[0]
    to_ijc = lambda a: a.reshape(p, c, kh, kw).transpose(0, 2, 3, 1).reshape(p, -1)  # noqa
    cols = np.full_like(cols_ref, np.nan)                     # padding taps must be written
    K.im2col_nhwc(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), kh, kw, stride, pad, cols)
    np.testing.assert_array_equal(cols, to_ijc(cols_ref))
    d = rng.standard_normal(cols.shape).astype(dt)             # (c, i, j) order
    dx = np.full((2, 11, 10, c), np.nan, dt)
    K.col2im_nhwc(np.ascontiguousarray(to_ijc(d)), kh, kw, stride, pad, dx)
    close(dx.transpose(0, 3, 1, 2), ref.col2im(d, x.shape, kh, kw, stride, pad), tol)


@pytest.mark.parametrize("dt,tol", DTYPES)
@pytest.mark.parametrize("act", ["elu", "relu"])
def test_bias_act_kernels(rng, dt, tol, act):
    code = K.ACT_CODES[act]
    fwd, bwd = ref.ACTIVATIONS[act]
    z = rng.standard_normal((6, 2, 5)).astype(dt)          # (N, P, O)
    b = rng.standard_normal(5).astype(dt)
    y_ref, cache = fwd(z + b)
    y = z.reshape(12, 5).copy()
    K.bias_act(y, b, code)
    close(y.reshape(z.shape), y_ref, tol)
    y_cp = np.empty((6, 5, 2), dt)
    K.bias_act_to_cp(z, b, code, y_cp)
    close(y_cp, y_ref.transpose(0, 2, 1), tol)
    dy = rng.standard_normal(z.shape).astype(dt)
    dz_ref = bwd(dy, cache)
    dz = np.empty((12, 5), dt)
    db = np.empty(5, dt)
    K.act_backward(dy.reshape(12, 5), y.reshape(12, 5), code, dz, db)
    close(dz.reshape(z.shape), dz_ref, tol)
    close(db, dz_ref.sum(axis=(0, 1)), tol)
    dz2 = np.empty_like(z)
    K.act_backward_from_cp(np.ascontiguousarray(dy.transpose(0, 2, 1)), y_cp, code, dz2, db)
    close(dz2, dz_ref, tol)
    close(db, dz_ref.sum(axis=(0, 1)), tol)


@pytest.mark.parametrize("dt,tol", DTYPES)
def test_lstm_seq_kernels(rng, dt, tol):
    t_len, n_in, hd = 5, 6, 4
    x = rng.standard_normal((t_len, n_in)).astype(dt)
    h0 = rng.standard_normal(hd).astype(dt)
    c0 = rng.standard_normal(hd).astype(dt)
    w_ih, w_hh, b_ih, b_hh = (a.astype(dt) for a in _lstm_params(rng, n_in, hd))
    hs_ref, (hT, cT), cache = ref.lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    hs = np.empty((t_len + 1, hd), dt)
    cs = np.empty((t_len + 1, hd), dt)
    hs[0], cs[0] = h0, c0
    gates = np.empty((t_len, 4 * hd), dt)
    K.lstm_seq_forward(x @ w_ih.T, w_hh, b_ih, b_hh, hs, cs, gates)
    close(hs[1:], hs_ref, tol)
    close(cs[-1], cT, tol)
    dhs = rng.standard_normal((t_len, hd)).astype(dt)
    dhT = rng.standard_normal(hd).astype(dt)
    dcT = rng.standard_normal(hd).astype(dt)
    dx_r, dh0_r, dc0_r, dwi_r, dwh_r, dbi_r, _ = ref.lstm_backward(dhs, cache, dhT, dcT)
    da = np.empty((t_len, 4 * hd), dt)
    dh0 = np.empty(hd, dt)
    dc0 = np.empty(hd, dt)
    K.lstm_seq_backward(dhs, dhT, dcT, w_hh, hs, cs, gates, da, dh0, dc0)
    close(dh0, dh0_r, tol)
    close(dc0, dc0_r, tol)
    close(da @ w_ih, dx_r, tol)
    close(da.T @ x, dwi_r, tol)
    close(da.T @ hs[:-1], dwh_r, tol)
    close(da.sum(0), dbi_r, tol)


@pytest.mark.parametrize("dt,tol", DTYPES)
def test_heads_loss_kernel(rng, dt, tol):
    t_len, hd, na = 6, 7, 4
    h = rng.standard_normal((t_len, hd)).astype(dt)
    wp = rng.standard_normal((na, hd)).astype(dt)
    bp = rng.standard_normal(na).astype(dt)
    wv = rng.standard_normal((1, hd)).astype(dt)
    bv = rng.standard_normal(1).astype(dt)
    actions = rng.integers(0, na, t_len)
    ret = rng.standard_normal(t_len).astype(dt)
    adv = rng.standard_normal(t_len).astype(dt)
    logits, pc = ref.dense_forward(h, wp, bp)
    v2, vc = ref.dense_forward(h, wv, bv)
    stats, dl, dv = ref.a3c_loss(logits, v2[:, 0], actions, ret, adv, 0.5, 0.01)
    dh1, dwp_r, dbp_r = ref.dense_backward(dl, pc)
    dh2, dwv_r, dbv_r = ref.dense_backward(dv[:, None], vc)
    probs = np.empty((t_len, na), dt)
    values = np.empty(t_len, dt)
    dh = np.empty_like(h)
    dwp, dbp, dwv, dbv = (np.full_like(a, np.nan) for a in (wp, bp, wv, bv))
    pl, vl, ent = K.heads_loss(h, wp, bp, wv, bv, actions, ret, adv, 0.5, 0.01,
                               probs, values, dh, dwp, dbp, dwv, dbv)
    assert pl == pytest.approx(stats["policy_loss"], rel=tol * 10, abs=tol * 10)
    assert vl == pytest.approx(stats["value_loss"], rel=tol * 10, abs=tol * 10)
    assert ent == pytest.approx(stats["entropy"], rel=tol * 10, abs=tol * 10)
    close(probs, ref.softmax(logits), tol)
    close(values, v2[:, 0], tol)
    close(dh, dh1 + dh2, tol)
    for a, b in ((dwp, dwp_r), (dbp, dbp_r), (dwv, dwv_r), (dbv, dbv_r)):
        close(a, b, tol)


@pytest.mark.parametrize("dt,tol", DTYPES)
def test_heads_kernel_stable(dt, tol):
    big = 1e30 if dt is np.float64 else 1e37
    f = np.array([1.0, -1.0], dt)
    wp = np.array([[big, 0], [-big, 0], [0, 0]], dt)
    probs = np.empty(3, dt)
    v = K.heads_vec(f, wp, np.zeros(3, dt), np.ones((1, 2), dt), np.zeros(1, dt), probs)
    assert np.all(np.isfinite(probs)) and v == pytest.approx(0.0)
    np.testing.assert_allclose(probs, [1, 0, 0])


@pytest.mark.parametrize("dt,tol", DTYPES)
def test_step_kernels(rng, dt, tol):
    # dense vec, LSTM cell, heads vs the ref layers
    v = rng.standard_normal(9).astype(dt)
    wd = rng.standard_normal((5, 9)).astype(dt)
    bd = rng.standard_normal(5).astype(dt)
    out = np.empty(5, dt)
    K.dense_act_vec(v, wd, bd, 1, out)
    close(out, ref.relu_forward(ref.dense_forward(v[None], wd, bd)[0])[0][0], tol)

    hd = 4
    w_ih, w_hh, b_ih, b_hh = (a.astype(dt) for a in _lstm_params(rng, 9, hd))
    h, c = rng.standard_normal(hd).astype(dt), rng.standard_normal(hd).astype(dt)
    h1r, c1r, _ = ref.lstm_step_forward(v, h, c, w_ih, w_hh, b_ih, b_hh)
    h1, c1 = np.empty(hd, dt), np.empty(hd, dt)
    K.lstm_cell_vec(v, h, c, w_ih, w_hh, b_ih, b_hh, np.empty(4 * hd, dt), h1, c1)
    close(h1, h1r, tol)
    close(c1, c1r, tol)

    wp = rng.standard_normal((3, hd)).astype(dt)
    bp = rng.standard_normal(3).astype(dt)
    wv = rng.standard_normal((1, hd)).astype(dt)
    bv = rng.standard_normal(1).astype(dt)
    probs = np.empty(3, dt)
    val = K.heads_vec(h1, wp, bp, wv, bv, probs)
    close(probs, ref.softmax(wp @ h1r + bp), tol)
    close(val, float(wv[0] @ h1r + bv[0]), tol)


@pytest.mark.parametrize("dt,tol", DTYPES)
@pytest.mark.parametrize("shape,o,k,stride,pad", [
    ((1, 84, 84), 16, 8, 4, 0), ((16, 20, 20), 32, 4, 2, 0), ((3, 13, 12), 5, 3, 3, 0),
    ((2, 11, 9), 3, 4, 2, 0), ((1, 42, 42), 32, 3, 2, 1), ((32, 6, 6), 32, 3, 2, 1),
    ((3, 7, 8), 5, 3, 1, 2), ((2, 9, 11), 6, 2, 1, 0), ((1, 5, 6), 3, 3, 3, 2)])
def test_conv_single_variants(rng, dt, tol, shape, o, k, stride, pad):
    """The batch-1 conv kernels (blocked dot products with any padding, or
    pixel axpys when C*k*k < 16; space-to-depth axpys where ``k % stride ==
    0`` and no padding) vs
    ``ref.conv2d_forward`` + ELU."""
    x = rng.standard_normal(shape).astype(dt)
    w = (rng.standard_normal((o, shape[0], k, k)) / k).astype(dt)
    b = rng.standard_normal(o).astype(dt)
    y_ref, _ = ref.elu_forward(ref.conv2d_forward(x[None], w, b, stride, pad)[0][0])
    oh, ow = y_ref.shape[1:]
    y = np.full((o, oh, ow), np.nan, dt)
    cols = np.full((oh * ow, shape[0] * k * k), np.nan, dt)
    K.conv_act_rows(x, w, b, stride, pad, 0, cols, y)
    close(y, y_ref, tol)
    shapes = K.conv_s2d_shapes(shape, o, k, stride)
    if pad or shapes is None:
        return
    xs_shape, acc_shape, offs_shape, wtab_shape = shapes
    y[...] = np.nan
    xs = np.full(xs_shape, np.nan, dt)          # padding must be rewritten, not read stale
    wtab = np.full(wtab_shape, np.nan, dt)
    offs = np.full(offs_shape, -1, np.int64)
    K.conv_act_s2d(x, w, b, stride, 0, xs, np.empty(acc_shape, dt), offs, wtab, y)
    close(y, y_ref, tol)


def test_conv_s2d_shapes_rejects_non_divisible_stride():
    assert K.conv_s2d_shapes((1, 10, 10), 4, 3, 2) is None


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_all_finite_kernel(dt):
    x = np.random.default_rng(0).random((2, 5, 7)).astype(dt)
    assert K.all_finite(x) and np.isfinite(x).all()
    for bad in (np.nan, np.inf, -np.inf):
        for idx in ((0, 0, 0), (1, 4, 6), (1, 2, 3)):
            y = x.copy()
            y[idx] = bad
            assert not K.all_finite(y), (bad, idx)
    big = np.full(9, np.finfo(dt).max, dt)           # finite extremes are finite
    assert K.all_finite(big) and K.all_finite(-big)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fast_transcendentals_vs_numpy(dt):
    """float32 ELU / sigmoid / tanh use a vectorizable polynomial exp: within
    a few ulp of numpy over the whole range, NaN propagates, no overflow.
    float64 uses libm (exact to rounding)."""
    x = np.concatenate([np.linspace(-100, 100, 200001), -np.logspace(-30, 2, 20001),
                        np.logspace(-30, 2, 20001), [0.0, -0.0, np.inf, -np.inf]]).astype(dt)
    x64 = x.astype(np.float64)
    ulp = np.finfo(dt).eps
    y = x.copy().reshape(-1, 1)
    K.bias_act(y, np.zeros(1, dt), K.ACT_CODES["elu"])
    elu = np.where(x64 > 0, x64, np.expm1(np.minimum(x64, 0)))
    fin = np.isfinite(x64)
    err = np.abs(y[fin, 0] - elu[fin]) / np.maximum(np.abs(elu[fin]), np.finfo(dt).tiny)
    assert np.max(err) <= 4 * ulp
    np.testing.assert_array_equal(y[~fin, 0], elu[~fin])        # elu(inf)=inf, elu(-inf)=-1
    # LSTM cell with identity weights: gates = x, so sigmoid/tanh are exercised
    n = 1024
    xs = x[np.linspace(0, x.size - 5, 4 * n).astype(int)]
    xs = np.where(np.isfinite(xs), xs, 0).astype(dt)
    w_ih = np.eye(4 * n, dtype=dt)[:, :4 * n]
    zero_hh = np.zeros((4 * n, n), dt)
    h1, c1 = np.empty(n, dt), np.empty(n, dt)
    c0 = np.linspace(-3, 3, n).astype(dt)
    K.lstm_cell_vec(xs, np.zeros(n, dt), c0, w_ih, zero_hh, np.zeros(4 * n, dt),
                    np.zeros(4 * n, dt), np.empty(4 * n, dt), h1, c1)
    h_r, c_r, _ = ref.lstm_step_forward(xs.astype(np.float64), np.zeros(n), c0.astype(np.float64),
                                        np.eye(4 * n), np.zeros((4 * n, n)), np.zeros(4 * n),
                                        np.zeros(4 * n))
    assert np.max(np.abs(c1 - c_r) / np.maximum(np.abs(c_r), 1e-30)) <= 8 * ulp
    assert np.max(np.abs(h1 - h_r) / np.maximum(np.abs(h_r), 1e-30)) <= 8 * ulp
    nan_in = np.array([[np.nan], [-np.nan]], dt)
    K.bias_act(nan_in, np.zeros(1, dt), K.ACT_CODES["elu"])
    assert np.all(np.isnan(nan_in))
    g = np.full((1, 4), np.nan, dt)
    hs = np.zeros((2, 1), dt)
    cs = np.zeros((2, 1), dt)
    K.lstm_seq_forward(g, np.zeros((4, 1), dt), np.zeros(4, dt), np.zeros(4, dt), hs, cs,
                       np.empty((1, 4), dt))
    assert np.isnan(hs[1, 0]) and np.isnan(cs[1, 0])


@pytest.mark.parametrize("nan_at", [0, 3])
def test_heads_loss_kernel_max_propagates_nan_and_stays_stable(nan_at):
    """heads_loss takes the logits' max by hand (no ndarray.max overload): a
    NaN logit, first or last, makes that step's probs and the losses NaN as
    numpy's max would; huge finite logits still give finite probs."""
    dt, t_len, hd, na = np.float32, 2, 3, 4
    h = np.ones((t_len, hd), dt)
    wp = np.zeros((na, hd), dt)
    bp = np.array([80.0, -80.0, 10.0, 79.0], dt)      # exp(80) overflows float32 unshifted
    wv, bv = np.zeros((1, hd), dt), np.zeros(1, dt)
    args = (np.array([0, 3]), np.zeros(t_len, dt), np.ones(t_len, dt), 0.5, 0.01)
    outs = lambda: (np.empty((t_len, na), dt), np.empty(t_len, dt), np.empty((t_len, hd), dt),
                    np.empty_like(wp), np.empty_like(bp), np.empty_like(wv), np.empty_like(bv))
    o = outs()
    pl, vl, ent = K.heads_loss(h, wp, bp, wv, bv, *args, *o)
    assert np.all(np.isfinite(o[0])) and np.isfinite(pl) and np.isfinite(ent)
    np.testing.assert_allclose(o[0][0], ref.softmax(bp.astype(np.float64)[None])[0], rtol=1e-5,
                               atol=1e-30)
    bad = bp.copy()
    bad[nan_at] = np.nan
    o = outs()
    pl, vl, ent = K.heads_loss(h, wp, bad, wv, bv, *args, *o)
    assert np.all(np.isnan(o[0])) and np.isnan(pl) and np.isnan(ent)
