"""Numba kernels of the network engine; each has a plain-numpy twin in ``ref``.

Every kernel uses the project decorator :func:`a3c_core._jit.kernel`
(``nogil=True, cache=True``, fastmath ``reassoc``+``contract``), so worker
threads run them in parallel.  Kernels are dtype-generic: the same source is
compiled for float32 and float64 on first use (and cached on disk).  Inner
loops accumulate in the array dtype (``w.dtype.type(0)``) so that float32
dot products vectorise at full SIMD width.

Compile time: only tiny helpers (``_act``, ``_all_finite``, ``_copy_row``,
the packed views ``_pv*``) are ``inline="always"``.  Numba inlines those at
its IR level by deep-copying every block of the callee (with its whole
variable scope) at each call site, which grows with the callee's size; the
layer bodies of the fused step (``_conv_act_s2d``, ``_conv_act_rows_nopad``,
``_dense_act_vec``, ``_lstm_cell_vec``, ``_heads_vec``, ``_gemv_add``) are
plain kernels instead: each is compiled once, linked into its callers and
inlined there by LLVM.  That halved the fused step's first compile with no
change in its speed (2026-11-25; docs/results.md has the compile times).
Activations of the blocked conv are applied in one pass after the dot
products, not at each of the 8 unrolled stores (fewer copies of the ELU
polynomial to compile; the same values).

Conventions: names carry shapes (``x__nhwc``, ``w__oi``); outputs are
preallocated arrays passed last and written in full (never accumulated into
unless said).  ``act`` codes: 0 = ELU (alpha 1), 1 = ReLU, 2 = identity.
Activation backward kernels take the activation OUTPUT ``y``: for ELU
``dy/dz = 1 if y > 0 else y + 1``.

Twins (kernel -> ref):

* ``im2col_nhwc`` / ``col2im_nhwc``   -> ``ref.im2col`` / ``ref.col2im``
* ``bias_act``, ``bias_act_to_cp``   -> ``ref.elu_forward`` / ``relu_forward``
* ``act_backward``, ``act_backward_from_cp`` -> ``ref.elu_backward`` / ...
* ``lstm_seq_forward`` / ``lstm_seq_backward`` -> ``ref.lstm_forward`` /
  ``ref.lstm_backward`` (input projection done outside with BLAS)
* ``heads_loss``                      -> ``ref.dense_forward`` + ``ref.a3c_loss``
* ``conv_act_s2d``, ``conv_act_rows``, ``dense_act_vec``, ``lstm_cell_vec``,
  ``heads_vec`` and the fused ``doom_step_packed`` / ``core_heads_step`` -> ref
  layers, batch 1;  ``all_finite`` -> ``np.isfinite(x).all()``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir as llvm_ir
from numba import carray
from numba.core import types
from numba.extending import intrinsic, overload, register_jitable

from a3c_core._jit import FASTMATH, kernel
from a3c_core.nn.blas import gemm
from a3c_core.sampling import sample_categorical

ACT_CODES = {"elu": 0, "relu": 1, "identity": 2}


# ---------------------------------------------------------------------------
# scalar helpers (inlined by Numba)
#
# LLVM cannot vectorize calls to libm ``exp``/``expm1``/``tanh`` (no SVML),
# and a scalar libm call costs ~25 cycles.  For float32 the nonlinearities
# below therefore use a branch-free Cephes-style polynomial (``_expm1_neg``:
# range reduction x = n ln2 + r, |r| <= ln2/2, degree-7 expm1(r), 2^n built
# from its exponent bits) that LLVM vectorizes 8-wide; it is accurate to
# ~2 ulp (tested against numpy over the whole range).  float64 keeps the
# accurate libm functions, so float64 gradient checks stay exact.  The
# dispatch is on the argument type at compile time (``overload``, compiled
# with the project's fastmath flags and inlined into the kernels by LLVM).
# Every helper propagates NaN (fastmath ``nnan`` stays off).

_F32 = np.float32
_LOG2E = _F32(1.4426950408889634)
_LN2_HI = _F32(0.693359375)          # 9 significant bits: n * _LN2_HI is exact
_LN2_LO = _F32(-2.12194440e-4)
_EXP_LO = _F32(-87.33)               # exp(_EXP_LO) is still a normal float32
_P0, _P1, _P2 = _F32(1.9875691500e-4), _F32(1.3981999507e-3), _F32(8.3334519073e-3)
_P3, _P4, _P5 = _F32(4.1665795894e-2), _F32(1.6666665459e-1), _F32(5.0000001201e-1)
_F32_ONE, _F32_TWO, _F32_HALF, _F32_ZERO = _F32(1), _F32(2), _F32(0.5), _F32(0)
_F32_BIAS = _F32(127.0)
_F32_MANT = _F32(8388608.0)          # 2**23


# overload implementations are compiled like kernels (then inlined by LLVM)
_OV_OPTS = {"nogil": True, "fastmath": set(FASTMATH)}


@intrinsic
def _i32_bits_as_f32(typingctx, bits):
    """Reinterpret the bits of an int32 as a float32 (free; vectorizes)."""
    if not (isinstance(bits, types.Integer) and bits.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())
    return types.float32(bits), codegen


@register_jitable(inline="always")
def _exp_parts_f32(x):
    """float32 ``x <= 0`` (larger values are not supported) -> ``(s, p)`` with
    ``exp(x) = s * (1 + p)``, ``s = 2**n`` and ``p = expm1(r)``.  Below
    ``_EXP_LO`` the result is clamped (exp ~1.2e-38); NaN propagates into p."""
    xn = _EXP_LO if x < _EXP_LO else x          # NaN stays NaN
    xs = _EXP_LO if not (x >= _EXP_LO) else x   # finite (NaN -> _EXP_LO), for n
    xs = _F32_ZERO if xs > _F32_ZERO else xs
    n = np.floor(xs * _LOG2E + _F32_HALF)
    r = xn - n * _LN2_HI
    r = r - n * _LN2_LO
    q = _P0 * r + _P1
    q = q * r + _P2
    q = q * r + _P3
    q = q * r + _P4
    q = q * r + _P5
    p = r + (r * r) * q
    s = _i32_bits_as_f32(np.int32((n + _F32_BIAS) * _F32_MANT))
    return s, p


def _expm1_neg(x):
    """``expm1(x)`` for ``x <= 0`` (float32: vectorizable polynomial)."""
    return np.expm1(x)


def _exp_neg(x):
    """``exp(x)`` for ``x <= 0`` (float32: vectorizable polynomial)."""
    return np.exp(x)


def _sigmoid(a):
    """Overflow-free logistic function."""
    e = np.exp(-abs(a))
    s = 1.0 / (1.0 + e)
    return s if a >= 0 else e * s


def _tanh(a):
    """tanh (float32: from ``_expm1_neg``, no cancellation near 0)."""
    return np.tanh(a)


@overload(_expm1_neg, jit_options=_OV_OPTS)
def _ov_expm1_neg(x):
    if x == types.float32:
        def impl(x):
            s, p = _exp_parts_f32(x)
            return s * p + (s - _F32_ONE)
        return impl
    return lambda x: np.expm1(x)


@overload(_exp_neg, jit_options=_OV_OPTS)
def _ov_exp_neg(x):
    if x == types.float32:
        def impl(x):
            s, p = _exp_parts_f32(x)
            return s * p + s
        return impl
    return lambda x: np.exp(x)


@overload(_sigmoid, jit_options=_OV_OPTS)
def _ov_sigmoid(a):
    if a == types.float32:
        def impl(a):
            s, p = _exp_parts_f32(-abs(a))
            e = s * p + s
            v = _F32_ONE / (_F32_ONE + e)
            return v if a >= _F32_ZERO else e * v
        return impl

    def impl64(a):
        e = np.exp(-abs(a))
        v = 1.0 / (1.0 + e)
        return v if a >= 0 else e * v
    return impl64


@overload(_tanh, jit_options=_OV_OPTS)
def _ov_tanh(a):
    if a == types.float32:
        def impl(a):
            s, p = _exp_parts_f32(_F32(-2) * abs(a))
            em = s * p + (s - _F32_ONE)            # expm1(-2|a|) in (-1, 0]
            t = -em / (_F32_TWO + em)
            return -t if a < _F32_ZERO else t
        return impl
    return lambda a: np.tanh(a)


@kernel(inline="always")
def _act(z, act, zero):
    """``act(z)``; ``zero`` carries the dtype (no float64 promotion)."""
    if act == 0:
        zn = zero if z > zero else z      # NaN stays NaN
        e = _expm1_neg(zn)
        return z if z > zero else e
    if act == 1:
        return z if z > zero else zero
    return z


@kernel(inline="always")
def _act_grad_from_y(y, act, one):
    """``act'`` from the output ``y``; ``one`` carries the dtype."""
    if act == 0:
        return one if y > 0 else y + one
    if act == 1:
        return one if y > 0 else one - one
    return one


# ---------------------------------------------------------------------------
# blocked GEMV helpers (batch-1 dense layers, LSTM gates, BPTT dh)


@kernel
def _gemv_add(w__oi, x__i, y__o):
    """``y += w @ x``, four rows per pass: each ``x`` load feeds four FMAs
    (one row at a time is load-port bound at 2 loads per FMA)."""
    o, n_in = w__oi.shape
    zero = y__o.dtype.type(0)
    o4 = o - o % 4
    for q in range(0, o4, 4):
        a0 = zero
        a1 = zero
        a2 = zero
        a3 = zero
        w0 = w__oi[q]
        w1 = w__oi[q + 1]
        w2 = w__oi[q + 2]
        w3 = w__oi[q + 3]
        for k in range(n_in):
            xk = x__i[k]
            a0 += w0[k] * xk
            a1 += w1[k] * xk
            a2 += w2[k] * xk
            a3 += w3[k] * xk
        y__o[q] += a0
        y__o[q + 1] += a1
        y__o[q + 2] += a2
        y__o[q + 3] += a3
    for q in range(o4, o):
        acc = zero
        for k in range(n_in):
            acc += w__oi[q, k] * x__i[k]
        y__o[q] += acc


@kernel
def _gemv_t_add(w__oi, s__o, y__i):
    """``y += w.T @ s`` as axpys over the contiguous rows, four rows per
    pass (one load + one store of ``y`` per four FMAs)."""
    o, n_in = w__oi.shape
    o4 = o - o % 4
    for q in range(0, o4, 4):
        s0 = s__o[q]
        s1 = s__o[q + 1]
        s2 = s__o[q + 2]
        s3 = s__o[q + 3]
        w0 = w__oi[q]
        w1 = w__oi[q + 1]
        w2 = w__oi[q + 2]
        w3 = w__oi[q + 3]
        for k in range(n_in):
            y__i[k] += s0 * w0[k] + s1 * w1[k] + s2 * w2[k] + s3 * w3[k]
    for q in range(o4, o):
        s0 = s__o[q]
        for k in range(n_in):
            y__i[k] += s0 * w__oi[q, k]


# ---------------------------------------------------------------------------
# batched conv helpers (rollout path; the GEMMs run in BLAS)


# The gather/scatter loops below copy runs through slice *views* (``dst[e] =
# src[e]`` with ``e`` the loop counter) rather than at computed flat indices
# (``cf[d0 + e] = xf[s0 + e]``): numba wraps a possibly negative index at
# every access, and LLVM only drops that check, and vectorizes the run, when
# the index is a plain non-negative induction variable.  Measured on the
# rollout's shapes (T=20): conv1's im2col 1.8x, conv2's 6.8x and conv2's
# col2im 4.1x faster (2-core VM, 2026-11-25).
@kernel
def im2col_nhwc(x__nhwc, kh, kw, stride, pad, cols__pk):
    """x ``(N,H,W,C)`` -> cols ``(N*OH*OW, kh*kw*C)``, column order (i, j, c):
    each kernel row is one contiguous run of ``kw*C`` input values.  Matches
    ``weight.transpose(0, 2, 3, 1).reshape(O, -1)`` of a PyTorch
    ``(O,C,kh,kw)`` weight (``ref.im2col`` uses (c, i, j)).  ``pad`` zeros
    on every side (``OH = (H + 2 pad - kh) // stride + 1``)."""
    n, h, w, c = x__nhwc.shape
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1
    run = kw * c
    k_len = kh * run
    xf = x__nhwc.reshape(x__nhwc.size)
    cf = cols__pk.reshape(cols__pk.size)
    zero = cols__pk.dtype.type(0)
    for b in range(n):
        for y in range(oh):
            for xx in range(ow):
                row = (b * oh + y) * ow + xx
                dst_row = cf[row * k_len:(row + 1) * k_len]
                if pad > 0:     # bounds-checked taps (zeros outside the image)
                    for i in range(kh):
                        r = y * stride + i - pad
                        for j in range(kw):
                            q = xx * stride + j - pad
                            dst = dst_row[(i * kw + j) * c:(i * kw + j + 1) * c]
                            if r < 0 or r >= h or q < 0 or q >= w:
                                for e in range(c):
                                    dst[e] = zero
                            else:
                                s0 = ((b * h + r) * w + q) * c
                                src = xf[s0:s0 + c]
                                for e in range(c):
                                    dst[e] = src[e]
                    continue
                if run == 8:    # conv1 of the doom specs (8x8, one channel): a
                    # constant-length run is one vector move, not a loop
                    for i in range(kh):
                        s0 = ((b * h + y * stride + i) * w + xx * stride) * c
                        src = xf[s0:s0 + 8]
                        dst = dst_row[i * 8:i * 8 + 8]
                        for e in range(8):
                            dst[e] = src[e]
                    continue
                for i in range(kh):
                    s0 = ((b * h + y * stride + i) * w + xx * stride) * c
                    src = xf[s0:s0 + run]
                    dst = dst_row[i * run:(i + 1) * run]
                    for e in range(run):
                        dst[e] = src[e]


@kernel
def col2im_nhwc(dcols__pk, kh, kw, stride, pad, dx__nhwc):
    """Adjoint of :func:`im2col_nhwc`: dx ``(N,H,W,C)`` is overwritten.

    Loops (image, output row, kernel row) outermost so that each input row
    is one short-lived 1-D view receiving ``OW`` contiguous runs of
    ``kw*C`` adds (simple unit-stride inner loop that LLVM vectorizes);
    taps that fall in the ``pad`` border are dropped."""
    n, h, w, c = dx__nhwc.shape
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1
    run = kw * c
    dx__nhwc[...] = 0
    for b in range(n):
        for y in range(oh):
            for i in range(kh):
                r = y * stride + i - pad
                if r < 0 or r >= h:
                    continue
                dst = dx__nhwc[b, r].reshape(w * c)
                for xx in range(ow):
                    src = dcols__pk[(b * oh + y) * ow + xx][i * run:(i + 1) * run]
                    if pad > 0:
                        for j in range(kw):
                            q = xx * stride + j - pad
                            if q >= 0 and q < w:
                                d = dst[q * c:(q + 1) * c]
                                sj = src[j * c:(j + 1) * c]
                                for e in range(c):
                                    d[e] += sj[e]
                        continue
                    d0 = xx * stride * c
                    d = dst[d0:d0 + run]
                    for e in range(run):
                        d[e] += src[e]


@kernel
def bias_act(z__mo, b__o, act):
    """In place ``z = act(z + b)`` over rows of ``(M, O)``."""
    m, o = z__mo.shape
    zero = z__mo.dtype.type(0)
    for r in range(m):
        for k in range(o):
            z__mo[r, k] = _act(z__mo[r, k] + b__o[k], act, zero)


@kernel
def bias_act_to_cp(z__npo, b__o, act, y__nop):
    """``y[n, o, p] = act(z[n, p, o] + b[o])``: channels-last GEMM output to
    PyTorch channel-first (flatten order).  Per image the activation runs
    over contiguous channels into an L1-sized ``(P, O)`` scratch (vectorized
    exp), then a plain transpose writes ``y`` (a strided-write loop around
    the activation would keep it scalar: ~6x slower)."""
    n, p, o = z__npo.shape
    zero = z__npo.dtype.type(0)
    tmp = np.empty((p, o), z__npo.dtype)
    for s in range(n):
        for q in range(p):
            for k in range(o):
                tmp[q, k] = _act(z__npo[s, q, k] + b__o[k], act, zero)
        for k in range(o):
            for q in range(p):
                y__nop[s, k, q] = tmp[q, k]


@kernel
def act_backward(dy__mo, y__mo, act, dz__mo, db__o):
    """``dz = dy * act'(z)`` (from the output ``y``); ``db = sum_rows dz``."""
    m, o = dy__mo.shape
    one = dy__mo.dtype.type(1)
    db__o[:] = 0
    for r in range(m):
        for k in range(o):
            d = dy__mo[r, k] * _act_grad_from_y(y__mo[r, k], act, one)
            dz__mo[r, k] = d
            db__o[k] += d


@kernel
def act_backward_from_cp(dy__nop, y__nop, act, dz__npo, db__o):
    """Like :func:`act_backward` but ``dy``/``y`` channel-first ``(N,O,P)``
    and ``dz`` channels-last ``(N,P,O)``."""
    n, o, p = dy__nop.shape
    one = dy__nop.dtype.type(1)
    db__o[:] = 0
    for s in range(n):
        for k in range(o):
            acc = one - one
            for q in range(p):
                d = dy__nop[s, k, q] * _act_grad_from_y(y__nop[s, k, q], act, one)
                dz__npo[s, q, k] = d
                acc += d
            db__o[k] += acc


# ---------------------------------------------------------------------------
# LSTM over a rollout (input projection x @ w_ih.T done outside with BLAS)


@kernel
def lstm_seq_forward(gx__tg, w_hh__gh, b_ih__g, b_hh__g, hs__th, cs__th, gates__tg):
    """Recurrence of an LSTM over T steps.

    gx ``(T, 4H)`` = ``x @ w_ih.T`` (no bias); ``hs``/``cs`` ``(T+1, H)`` with
    row 0 holding ``h0``/``c0`` on entry; rows 1..T are written.  ``gates``
    ``(T, 4H)`` receives the gate activations (i, f, g, o after their
    nonlinearity) for the backward pass.
    """
    t_len, g4 = gx__tg.shape
    hd = g4 // 4
    for t in range(t_len):
        for r in range(g4):
            gates__tg[t, r] = gx__tg[t, r] + b_ih__g[r] + b_hh__g[r]
        _gemv_add(w_hh__gh, hs__th[t], gates__tg[t])
        for k in range(hd):
            i = _sigmoid(gates__tg[t, k])
            f = _sigmoid(gates__tg[t, hd + k])
            g = _tanh(gates__tg[t, 2 * hd + k])
            o = _sigmoid(gates__tg[t, 3 * hd + k])
            gates__tg[t, k] = i
            gates__tg[t, hd + k] = f
            gates__tg[t, 2 * hd + k] = g
            gates__tg[t, 3 * hd + k] = o
            c = f * cs__th[t, k] + i * g
            cs__th[t + 1, k] = c
            hs__th[t + 1, k] = o * _tanh(c)


@kernel
def lstm_seq_backward(dhs__th, dhT__h, dcT__h, w_hh__gh, hs__th, cs__th, gates__tg,
                      da__tg, dh0__h, dc0__h):
    """BPTT through :func:`lstm_seq_forward`.

    dhs ``(T, H)`` loss grads wrt h_1..h_T; dhT/dcT grads wrt the final state.
    Writes da ``(T, 4H)`` (grads wrt gate pre-activations; db_ih = db_hh =
    ``da.sum(0)``, dw_ih = ``da.T @ x``, dw_hh = ``da.T @ hs[:T]``,
    dx = ``da @ w_ih`` are BLAS outside) and dh0/dc0 ``(H,)``.
    """
    t_len, g4 = da__tg.shape
    hd = g4 // 4
    one = da__tg.dtype.type(1)
    dh = dh0__h
    dc = dc0__h
    _copy_row(dhT__h, dh)
    _copy_row(dcT__h, dc)
    for t in range(t_len - 1, -1, -1):
        for k in range(hd):
            dht = dhs__th[t, k] + dh[k]
            i = gates__tg[t, k]
            f = gates__tg[t, hd + k]
            g = gates__tg[t, 2 * hd + k]
            o = gates__tg[t, 3 * hd + k]
            tc = _tanh(cs__th[t + 1, k])
            dct = dc[k] + dht * o * (one - tc * tc)
            da__tg[t, k] = dct * g * i * (one - i)
            da__tg[t, hd + k] = dct * cs__th[t, k] * f * (one - f)
            da__tg[t, 2 * hd + k] = dct * i * (one - g * g)
            da__tg[t, 3 * hd + k] = dht * tc * o * (one - o)
            dc[k] = dct * f
        dh[:] = 0
        _gemv_t_add(w_hh__gh, da__tg[t], dh)


@kernel
def lstm_rows_backward(dhs__rh, w_hh__gh, hs__rh, cs__rh, cprev__rh, reset__r, gates__rg,
                       da__rg, dh__kh, dc__kh):
    """BPTT over K sequences recorded time-major (the batched worker's
    rollout): row ``r = t*K + k`` is step t of sequence k, K = ``dh.shape[0]``.
    ``hs[r]``/``cprev[r]`` hold row r's input state, ``hs[r + K]``/``cs[r + K]``
    its output; at a row with ``reset[r]`` nothing flows into row ``r - K``
    (its input state was a reset, a constant: the gradient wrt it belongs to
    the reset).  ``dh``/``dc`` ``(K, H)`` carry each sequence's gradient and
    end as those of the input states of rows 0..K-1.  With K = 1 and no
    reset (``cprev = cs[:T]``) this is :func:`lstm_seq_backward`'s
    arithmetic in the same order."""
    t_len, g4 = da__rg.shape
    hd = g4 // 4
    n_seq = dh__kh.shape[0]
    one = da__rg.dtype.type(1)
    for j in range(n_seq):
        for k in range(hd):
            dh__kh[j, k] = 0
            dc__kh[j, k] = 0
    for r in range(t_len - 1, -1, -1):
        j = r % n_seq
        dh = dh__kh[j]
        dc = dc__kh[j]
        for k in range(hd):
            dht = dhs__rh[r, k] + dh[k]
            i = gates__rg[r, k]
            f = gates__rg[r, hd + k]
            g = gates__rg[r, 2 * hd + k]
            o = gates__rg[r, 3 * hd + k]
            tc = _tanh(cs__rh[r + n_seq, k])
            dct = dc[k] + dht * o * (one - tc * tc)
            da__rg[r, k] = dct * g * i * (one - i)
            da__rg[r, hd + k] = dct * cprev__rh[r, k] * f * (one - f)
            da__rg[r, 2 * hd + k] = dct * i * (one - g * g)
            da__rg[r, 3 * hd + k] = dht * tc * o * (one - o)
            dc[k] = dct * f
        dh[:] = 0
        if reset__r[r]:
            dc[:] = 0
        else:
            _gemv_t_add(w_hh__gh, da__rg[r], dh)


# ---------------------------------------------------------------------------
# heads + A3C loss over a rollout (forward and backward in one pass)


@kernel
def heads_loss(h__th, wp__ah, bp__a, wv__1h, bv__1, actions__t, returns__t, adv__t,
               value_coef, entropy_beta,
               probs__ta, values__t, dh__th, dwp__ah, dbp__a, dwv__1h, dbv__1):
    """Policy/value heads, softmax, A3C loss and its backward, over T steps.

    Writes probs ``(T, A)``, values ``(T,)``, dh ``(T, H)`` (overwritten) and
    the head gradients (overwritten).  Returns ``(policy_loss, value_loss,
    entropy)`` as floats; the loss is ``policy_loss + value_coef*value_loss
    - entropy_beta*entropy``.
    """
    t_len, hd = h__th.shape
    na = wp__ah.shape[0]
    zero = h__th.dtype.type(0)
    dwp__ah[...] = 0
    dbp__a[:] = 0
    dwv__1h[...] = 0
    dbv__1[:] = 0
    logits = np.empty(na, dtype=np.float64)
    pl = 0.0
    vl = 0.0
    ent = 0.0
    for t in range(t_len):
        m = -np.inf
        for a in range(na):
            acc = zero
            for k in range(hd):
                acc += wp__ah[a, k] * h__th[t, k]
            logits[a] = acc + bp__a[a]
            # max by hand: NaN-propagating like ndarray.max (its overload costs compile time)
            if logits[a] > m or logits[a] != logits[a]:
                m = logits[a]
        acc = zero
        for k in range(hd):
            acc += wv__1h[0, k] * h__th[t, k]
        v = acc + bv__1[0]
        values__t[t] = v
        s = 0.0
        for a in range(na):
            s += np.exp(logits[a] - m)
        lse = np.log(s)
        h_t = 0.0
        for a in range(na):
            lp = logits[a] - m - lse
            logits[a] = lp                      # now log-probs
            p = np.exp(lp)
            probs__ta[t, a] = p
            h_t -= p * lp
        act = actions__t[t]
        advt = adv__t[t]
        pl -= logits[act] * advt
        ent += h_t
        diff = returns__t[t] - values__t[t]
        vl += 0.5 * diff * diff
        dv = -value_coef * diff
        dbv__1[0] += dv
        for k in range(hd):
            dh__th[t, k] = dv * wv__1h[0, k]
            dwv__1h[0, k] += dv * h__th[t, k]
        for a in range(na):
            p = np.exp(logits[a])
            dl = p * advt + entropy_beta * p * (logits[a] + h_t)
            if a == act:
                dl -= advt
            dbp__a[a] += dl
            for k in range(hd):
                dh__th[t, k] += dl * wp__ah[a, k]
                dwp__ah[a, k] += dl * h__th[t, k]
    return pl, vl, ent


# ---------------------------------------------------------------------------
# batch-1 step (inference): no BLAS; every scratch array is preallocated by the
# network and passed in, so a step allocates nothing (``heads_loss`` and
# ``bias_act_to_cp`` of the rollout path allocate one small scratch per call).


@kernel(inline="always")
def _all_finite(x):
    """True when no element of the contiguous array ``x`` is NaN or inf
    (``v - v`` is 0 for finite ``v``, NaN otherwise; fastmath keeps NaN/inf)."""
    xf = x.reshape(x.size)
    acc = xf.dtype.type(0)
    for i in range(xf.size):
        acc += xf[i] - xf[i]
    return acc == 0


@kernel
def all_finite(x):
    """``np.isfinite(x).all()`` without allocating (x contiguous)."""
    return _all_finite(x)


def conv_s2d_shapes(in_shape, out_ch, k, stride, pad_to=32):
    """Scratch shapes ``(xs (C*s*s, plane), acc (M,), offs (n4,), wtab (O, n4))``
    of :func:`conv_act_s2d` for an input ``(C, H, W)`` and ``out_ch`` filters
    of ``k x k``; ``None`` when ``k % stride != 0``.  ``offs`` is int64."""
    c, h, w = in_shape
    if k % stride:
        return None
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    kd = k // stride
    ws = ow + kd - 1
    mp = -(-(oh * ws) // pad_to) * pad_to
    plane = -(-(mp + (kd - 1) * (ws + 1)) // 8) * 8
    n4 = (c * stride * stride * kd * kd + 3) // 4 * 4
    return (c * stride * stride, plane), (mp,), (n4,), (out_ch, n4)


@kernel
def _conv_act_s2d(x__chw, w__ocij, b__o, stride, act, xs__pm, acc__m, offs__t, wtab__ot,
                  y__ohw):
    """Space-to-depth direct conv, one image (needs ``kh == kw``, ``kh % stride
    == 0``, no padding; scratch from :func:`conv_s2d_shapes`).

    Plane ``(ch, a, b)`` of ``xs`` holds ``x[ch, s*Y + a, s*X + b]`` (row
    stride ``ws = OW + kd - 1``, ``kd = kh / s``), so every tap is an axpy
    over one contiguous run of the plane: the stride-s kh x kh conv becomes
    a stride-1 kd x kd conv, without an im2col gather (~3x fewer copies).
    Outputs are computed on the padded ``(OH, ws)`` grid, ``acc`` rounded up
    to 32 lanes so the vector loop has no scalar remainder; the junk columns
    are dropped when ``act(acc)`` is written to ``y``.  The tap table
    (``offs``: flat offset into ``xs``; ``wtab``: the matching weights, zero
    padded to a multiple of 4 taps) is rebuilt from the live weight every
    call, so it is never stale."""
    c, h, w = x__chw.shape
    o, _, kh, kw = w__ocij.shape
    oh = (h - kh) // stride + 1
    ow = (w - kw) // stride + 1
    kd = kh // stride
    hs = oh + kd - 1
    ws = ow + kd - 1
    mp = acc__m.shape[0]
    pls = xs__pm.shape[1]
    zero = acc__m.dtype.type(0)
    ss = stride * stride
    n_pl = c * ss
    for pl in range(n_pl):
        ch = pl // ss
        a = (pl // stride) % stride
        bb = pl % stride
        dst = xs__pm[pl]
        for yy in range(hs):
            src = x__chw[ch, stride * yy + a][bb::stride]
            drow = dst[yy * ws:(yy + 1) * ws]
            for xx in range(ws):
                drow[xx] = src[xx]
        for m in range(hs * ws, pls):
            dst[m] = zero
    n_tap = n_pl * kd * kd
    n4 = offs__t.shape[0]
    for t in range(n_tap):
        pl = t // (kd * kd)
        di = (t // kd) % kd
        dj = t % kd
        ch = pl // ss
        a = (pl // stride) % stride
        bb = pl % stride
        offs__t[t] = pl * pls + di * ws + dj
        for q in range(o):
            wtab__ot[q, t] = w__ocij[q, ch, stride * di + a, stride * dj + bb]
    for t in range(n_tap, n4):      # padding taps: weight 0 on plane 0
        offs__t[t] = 0
        for q in range(o):
            wtab__ot[q, t] = zero
    xf = xs__pm.reshape(xs__pm.size)
    for q in range(o):
        for m in range(mp):
            acc__m[m] = b__o[q]
        for t in range(0, n4, 4):
            s0 = wtab__ot[q, t]
            s1 = wtab__ot[q, t + 1]
            s2 = wtab__ot[q, t + 2]
            s3 = wtab__ot[q, t + 3]
            c0 = xf[offs__t[t]:offs__t[t] + mp]
            c1 = xf[offs__t[t + 1]:offs__t[t + 1] + mp]
            c2 = xf[offs__t[t + 2]:offs__t[t + 2] + mp]
            c3 = xf[offs__t[t + 3]:offs__t[t + 3] + mp]
            for m in range(mp):
                acc__m[m] += s0 * c0[m] + s1 * c1[m] + s2 * c2[m] + s3 * c3[m]
        for yy in range(oh):
            arow = acc__m[yy * ws:yy * ws + ow]
            yrow = y__ohw[q, yy]
            for xx in range(ow):
                yrow[xx] = _act(arow[xx], act, zero)


@kernel
def conv_act_s2d(x__chw, w__ocij, b__o, stride, act, xs__pm, acc__m, offs__t, wtab__ot,
                 y__ohw):
    """One image: ``y = act(conv2d(x, w, b, stride))`` by space-to-depth
    (twin ``ref.conv2d_forward``); scratch shapes from :func:`conv_s2d_shapes`."""
    _conv_act_s2d(x__chw, w__ocij, b__o, stride, act, xs__pm, acc__m, offs__t, wtab__ot,
                  y__ohw)


SHORT_K = 16      # below this im2col length the batch-1 conv uses pixel-axis axpys


@kernel
def _conv_act_short_k(x__chw, w__ocij, b__o, stride, pad, act, colt__kp, y__ohw):
    """Transposed im2col ``colt (C*kh*kw, OH*OW)`` (zeros in the ``pad``
    border), then per output channel ``y[q, :] = act(b[q] + sum_k w[q, k]
    colt[k, :])`` as axpys over the contiguous pixel axis (SIMD over pixels,
    no horizontal sums): the fast form when K is short and pixels many.
    Output size from ``y``."""
    _, h, w = x__chw.shape
    o, c, kh, kw = w__ocij.shape
    _, oh, ow = y__ohw.shape
    n_pix = oh * ow
    k_len = c * kh * kw
    zero = y__ohw.dtype.type(0)
    for ch in range(c):
        for i in range(kh):
            for j in range(kw):
                row = colt__kp[(ch * kh + i) * kw + j]
                for yy in range(oh):
                    r = yy * stride + i - pad
                    for xx in range(ow):
                        q = xx * stride + j - pad
                        inside = r >= 0 and r < h and q >= 0 and q < w
                        row[yy * ow + xx] = x__chw[ch, r, q] if inside else zero
    w2 = w__ocij.reshape(o, k_len)
    y2 = y__ohw.reshape(o, n_pix)
    for q in range(o):
        yq = y2[q]
        bq = b__o[q]
        for p in range(n_pix):
            yq[p] = bq
        for k in range(k_len):
            s0 = w2[q, k]
            ck = colt__kp[k]
            for p in range(n_pix):
                yq[p] += s0 * ck[p]
        for p in range(n_pix):
            yq[p] = _act(yq[p], act, zero)


@kernel
def _im2col_rows_nopad(x__chw, stride, kh, kw, oh, ow, cols__pk):
    """Row-major im2col of one CHW image without padding: ``cols[p]`` =
    the (c, i, j) taps of output pixel ``p`` of the ``(oh, ow)`` grid."""
    c = x__chw.shape[0]
    for yy in range(oh):
        for xx in range(ow):
            p = yy * ow + xx
            dst = cols__pk[p]
            for ch in range(c):
                for i in range(kh):
                    d0 = (ch * kh + i) * kw
                    src = x__chw[ch, yy * stride + i][xx * stride:xx * stride + kw]
                    d = dst[d0:d0 + kw]
                    for j in range(kw):
                        d[j] = src[j]


@kernel
def _rows_dot_act(w2, b__o, act, cols__pk, y2):
    """``y2[q, p] = act(w2[q] . cols[p] + b[q])`` as blocks of 4 channels x 2
    pixels (8 vector accumulators, 6 loads per 8 FMAs), then the activation
    in one pass over ``y2`` ``(O, P)``."""
    o, k_len = w2.shape
    n_pix = y2.shape[1]
    zero = y2.dtype.type(0)
    o4 = o - o % 4
    p2 = n_pix - n_pix % 2
    for q in range(0, o4, 4):
        w0 = w2[q]
        w1 = w2[q + 1]
        w2q = w2[q + 2]
        w3 = w2[q + 3]
        for p in range(0, p2, 2):
            x0 = cols__pk[p]
            x1 = cols__pk[p + 1]
            a00 = zero
            a01 = zero
            a10 = zero
            a11 = zero
            a20 = zero
            a21 = zero
            a30 = zero
            a31 = zero
            for k in range(k_len):
                u = x0[k]
                v = x1[k]
                a00 += w0[k] * u
                a01 += w0[k] * v
                a10 += w1[k] * u
                a11 += w1[k] * v
                a20 += w2q[k] * u
                a21 += w2q[k] * v
                a30 += w3[k] * u
                a31 += w3[k] * v
            y2[q, p] = a00 + b__o[q]
            y2[q, p + 1] = a01 + b__o[q]
            y2[q + 1, p] = a10 + b__o[q + 1]
            y2[q + 1, p + 1] = a11 + b__o[q + 1]
            y2[q + 2, p] = a20 + b__o[q + 2]
            y2[q + 2, p + 1] = a21 + b__o[q + 2]
            y2[q + 3, p] = a30 + b__o[q + 3]
            y2[q + 3, p + 1] = a31 + b__o[q + 3]
    for q in range(o):
        p_lo = p2 if q < o4 else 0
        for p in range(p_lo, n_pix):
            acc = zero
            for k in range(k_len):
                acc += w2[q, k] * cols__pk[p, k]
            y2[q, p] = acc + b__o[q]
    yf = y2.reshape(y2.size)
    for i in range(yf.size):
        yf[i] = _act(yf[i], act, zero)


@kernel
def _conv_act_rows(x__chw, w__ocij, b__o, stride, pad, act, cols__pk, y__ohw):
    """Row-major im2col ``cols (OH*OW, C*kh*kw)`` (column order (c, i, j), the
    live weight's own order; taps in the ``pad`` border are 0), then
    ``y[q, p] = w[q] . cols[p]`` as blocks of 4 channels x 2 pixels: 8 vector
    accumulators, 6 loads per 8 FMAs, long contiguous K loops (better than
    axpys when there are few pixels).  With a short K (``C*kh*kw <
    SHORT_K``, e.g. a 3x3 conv of one channel) the scratch is used
    transposed ``(K, OH*OW)`` instead and each output channel is ``K`` axpys
    over the contiguous pixel axis.  Output size from ``y`` ``(O, OH, OW)``."""
    o, c, kh, kw = w__ocij.shape
    _, oh, ow = y__ohw.shape
    n_pix = oh * ow
    k_len = c * kh * kw
    if k_len < SHORT_K:
        colt = cols__pk.reshape(cols__pk.size)[:k_len * n_pix].reshape(k_len, n_pix)
        _conv_act_short_k(x__chw, w__ocij, b__o, stride, pad, act, colt, y__ohw)
        return
    h, w = x__chw.shape[1], x__chw.shape[2]
    zero = y__ohw.dtype.type(0)
    if pad == 0:    # the doom conv2 path: plain gather
        _im2col_rows_nopad(x__chw, stride, kh, kw, oh, ow, cols__pk)
    for yy in range(oh if pad > 0 else 0):
        for xx in range(ow):
            p = yy * ow + xx
            col0 = xx * stride - pad
            j_lo = max(0, -col0)               # taps inside the image: j_lo <= j < j_hi
            j_hi = min(kw, w - col0)
            for ch in range(c):
                for i in range(kh):
                    d0 = (ch * kh + i) * kw
                    r = yy * stride + i - pad
                    if r < 0 or r >= h:
                        for j in range(kw):
                            cols__pk[p, d0 + j] = zero
                        continue
                    src = x__chw[ch, r]
                    for j in range(j_lo):
                        cols__pk[p, d0 + j] = zero
                    for j in range(j_lo, j_hi):
                        cols__pk[p, d0 + j] = src[col0 + j]
                    for j in range(j_hi, kw):
                        cols__pk[p, d0 + j] = zero
    _rows_dot_act(w__ocij.reshape(o, k_len), b__o, act, cols__pk, y__ohw.reshape(o, n_pix))


@kernel
def _conv_act_rows_nopad(x__chw, w__ocij, b__o, stride, act, cols__pk, y__ohw):
    """:func:`_conv_act_rows` without padding and with ``C*kh*kw >=
    SHORT_K`` (the fused doom step's conv2; the network checks both)."""
    o, c, kh, kw = w__ocij.shape
    _, oh, ow = y__ohw.shape
    _im2col_rows_nopad(x__chw, stride, kh, kw, oh, ow, cols__pk)
    _rows_dot_act(w__ocij.reshape(o, c * kh * kw), b__o, act, cols__pk,
                  y__ohw.reshape(o, oh * ow))


@kernel
def conv_act_rows(x__chw, w__ocij, b__o, stride, pad, act, cols__pk, y__ohw):
    """One image: ``y = act(conv2d(x, w, b, stride, pad))`` by row-major
    im2col and register-blocked dot products; cols ``(OH*OW, C*kh*kw)`` is
    scratch.  The generic batch-1 conv (any kernel, stride, padding)."""
    _conv_act_rows(x__chw, w__ocij, b__o, stride, pad, act, cols__pk, y__ohw)


@kernel
def _dense_act_vec(x__i, w__oi, b__o, act, y__o):
    o = w__oi.shape[0]
    zero = y__o.dtype.type(0)
    for q in range(o):
        y__o[q] = b__o[q]
    _gemv_add(w__oi, x__i, y__o)
    for q in range(o):
        y__o[q] = _act(y__o[q], act, zero)


@kernel
def dense_act_vec(x__i, w__oi, b__o, act, y__o):
    """``y = act(w @ x + b)`` for one vector."""
    _dense_act_vec(x__i, w__oi, b__o, act, y__o)


@kernel
def _lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                   gates__g, h_out__h, c_out__h):
    g4 = w_ih__gi.shape[0]
    hd = g4 // 4
    for r in range(g4):
        gates__g[r] = b_ih__g[r] + b_hh__g[r]
    _gemv_add(w_ih__gi, x__i, gates__g)
    _gemv_add(w_hh__gh, h__h, gates__g)
    for k in range(hd):
        i = _sigmoid(gates__g[k])
        f = _sigmoid(gates__g[hd + k])
        g = _tanh(gates__g[2 * hd + k])
        o = _sigmoid(gates__g[3 * hd + k])
        gates__g[k] = i                 # activated gates, the rollout backward's layout
        gates__g[hd + k] = f
        gates__g[2 * hd + k] = g
        gates__g[3 * hd + k] = o
        c = f * c__h[k] + i * g
        c_out__h[k] = c
        h_out__h[k] = o * _tanh(c)


@kernel
def lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                  gates__g, h_out__h, c_out__h):
    """One LSTM step for one vector; gates ``(4H,)`` receives the gate
    activations (i, f, g, o after their nonlinearity, as ``lstm_seq_forward``)."""
    _lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                   gates__g, h_out__h, c_out__h)


@kernel
def _heads_vec(f__h, wp__ah, bp__a, wv__1h, bv__1, probs__a):
    na, hd = wp__ah.shape
    zero = f__h.dtype.type(0)
    m = -np.inf
    for a in range(na):
        acc = zero
        for k in range(hd):
            acc += wp__ah[a, k] * f__h[k]
        z = acc + bp__a[a]
        probs__a[a] = z
        if z > m:
            m = z
    s = 0.0
    for a in range(na):
        e = np.exp(probs__a[a] - m)
        probs__a[a] = e
        s += e
    for a in range(na):
        probs__a[a] = probs__a[a] / s
    acc = zero
    for k in range(hd):
        acc += wv__1h[0, k] * f__h[k]
    return float(acc + bv__1[0])


@kernel
def heads_vec(f__h, wp__ah, bp__a, wv__1h, bv__1, probs__a):
    """Softmax policy probs ``(A,)`` (written) and the value (returned)."""
    return _heads_vec(f__h, wp__ah, bp__a, wv__1h, bv__1, probs__a)


@kernel
def core_heads_step(feat__i, use_lstm, w_ih, w_hh, b_ih, b_hh, h__h, c__h,
                    gates__g, h_out__h, c_out__h, wp__ah, bp__a, wv__1h, bv__1, probs__a):
    """Optional LSTM step then heads, one observation.  Returns the value."""
    if use_lstm:
        _lstm_cell_vec(feat__i, h__h, c__h, w_ih, w_hh, b_ih, b_hh,
                       gates__g, h_out__h, c_out__h)
        return _heads_vec(h_out__h, wp__ah, bp__a, wv__1h, bv__1, probs__a)
    return _heads_vec(feat__i, wp__ah, bp__a, wv__1h, bv__1, probs__a)


@kernel
def _doom_record(t, obs__chw, h__h, c__h, h_out__h, c_out__h, y1, y2, feat, use_lstm,
                 obs__tchw, z1__ro, flat2__tn, fc__tn, hs__th, cs__th):
    """Rollout row ``t`` of the fused step (see :func:`doom_step_rec_packed`):
    the observation ``obs__tchw[t]``, conv1's activation as NHWC rows
    ``z1[t*P1:(t+1)*P1]`` ``(P1, O1)``, conv2's channel-first flatten
    ``flat2[t]``, the fc output ``fc[t]`` and (LSTM) the input state
    ``hs[t]``/``cs[t]`` and the new one ``hs[t+1]``/``cs[t+1]``."""
    # flat element loops: numba's generic slice assignment is several times slower
    _copy_row(obs__chw.reshape(obs__chw.size), obs__tchw.reshape(obs__tchw.shape[0], -1)[t])
    o1, oh1, ow1 = y1.shape
    n_pix = oh1 * ow1
    y1f = y1.reshape(o1, n_pix)
    z1f = z1__ro[t * n_pix:(t + 1) * n_pix]
    for q in range(n_pix):
        for o in range(o1):
            z1f[q, o] = y1f[o, q]
    _copy_row(y2.reshape(y2.size), flat2__tn[t])
    _copy_row(feat, fc__tn[t])
    if use_lstm:
        _copy_row(h__h, hs__th[t])
        _copy_row(c__h, cs__th[t])
        _copy_row(h_out__h, hs__th[t + 1])
        _copy_row(c_out__h, cs__th[t + 1])


# -- the fused step with packed static arguments -------------------------------
# The whole conv-conv-dense(-LSTM)-heads forward for one frame, fused in one
# GIL-free call (the network picks it when its layer list is exactly that
# shape, conv1 with ``k % stride == 0`` and no padding): conv1 (many pixels,
# stride 4) by space-to-depth axpys, conv2 (81 pixels) by blocked dot
# products, each the faster form for its shape.  Numba's dispatcher types and
# unboxes every argument on every call (~0.2-0.3 us per array, with the GIL
# held), and the step's constant arguments are 27 (weight views, scratch,
# strides; ``Network``'s static tuple): passed one by one they cost ~10 us a
# step.  So the 22 float arrays among them are passed as views into two flat
# buffers (the network's params and one scratch arena), described by an
# int64 table ``meta`` (row i: buffer 0 = params / 1 = scratch, offset, 4
# dims), and the four ints in ``ints`` (conv1 stride, conv2 stride,
# activation code, use_lstm).

#: positions in the network's static-argument tuple of the float arrays (packed
#: through ``meta``), of the ints (``ints``) and of conv1's int64 offsets
DOOM_STATIC_FLOATS = (0, 1, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 15, 18, 19, 20, 21, 22, 23, 24,
                      25, 26)
DOOM_STATIC_INTS = (2, 10, 16, 17)
DOOM_STATIC_OFFS = 5


@intrinsic
def _packed_ptr(typingctx, a, b, which, offset):
    """Pointer to element ``offset`` of ``a`` (``which == 0``) or ``b``: two
    contiguous 1-D arrays of one dtype, no bounds check.  The choice is an
    LLVM ``select``, not a Python branch: no extra IR blocks at each of the
    packed step's ~25 inlined views (numba copies every block of an inlined
    body, so blocks cost compile time)."""
    ok = (isinstance(a, types.Array) and isinstance(b, types.Array) and a.ndim == b.ndim == 1
          and a.layout == b.layout == "C" and a.dtype == b.dtype
          and isinstance(which, types.Integer) and isinstance(offset, types.Integer))
    if not ok:
        return None

    def codegen(context, builder, sig, args):
        pa = context.make_array(sig.args[0])(context, builder, args[0]).data
        pb = context.make_array(sig.args[1])(context, builder, args[1]).data
        zero = context.get_constant(sig.args[2], 0)
        base = builder.select(builder.icmp_signed("==", args[2], zero), pa, pb)
        return builder.gep(base, [args[3]])
    return types.CPointer(a.dtype)(a, b, which, offset), codegen


# The views are built from a pointer with ``carray`` rather than by slicing and
# a runtime-shaped ``reshape``, whose shape checks bring extra code into the
# step kernel: the trainer's first-run compile is ~2 s shorter (21.3-21.6 s
# against 23.6-23.7 s, interleaved first runs; docs/results.md has the compile
# times since).  There is no bounds check: ``meta`` is written by the network
# from its own layout (network.py, ``_pack_doom_static``), so the views are in
# bounds by construction; the parity tests compare the packed and unpacked steps.
@kernel(inline="always")
def _pv(params, scratch, meta, i):
    """Flat view of packed array ``i``."""
    return carray(_packed_ptr(params, scratch, meta[i, 0], meta[i, 1]),
                  meta[i, 2] * meta[i, 3] * meta[i, 4] * meta[i, 5])


@kernel(inline="always")
def _pv2(params, scratch, meta, i):
    return carray(_packed_ptr(params, scratch, meta[i, 0], meta[i, 1]),
                  (meta[i, 2], meta[i, 3]))


@kernel(inline="always")
def _pv3(params, scratch, meta, i):
    return carray(_packed_ptr(params, scratch, meta[i, 0], meta[i, 1]),
                  (meta[i, 2], meta[i, 3], meta[i, 4]))


@kernel(inline="always")
def _pv4(params, scratch, meta, i):
    return carray(_packed_ptr(params, scratch, meta[i, 0], meta[i, 1]),
                  (meta[i, 2], meta[i, 3], meta[i, 4], meta[i, 5]))


@kernel(inline="always")
def _doom_packed_forward(obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a, params, scratch,
                         offs1, meta, ints, gates__g):
    """The fused forward on the packed views; ``gates__g`` is the gate
    scratch (the recording step passes its rollout row)."""
    act = ints[2]
    y1 = _pv3(params, scratch, meta, 5)
    y2 = _pv3(params, scratch, meta, 9)
    feat = _pv(params, scratch, meta, 12)
    _conv_act_s2d(obs__chw, _pv4(params, scratch, meta, 0), _pv(params, scratch, meta, 1),
                  ints[0], act, _pv2(params, scratch, meta, 2), _pv(params, scratch, meta, 3),
                  offs1, _pv2(params, scratch, meta, 4), y1)
    _conv_act_rows_nopad(y1, _pv4(params, scratch, meta, 6), _pv(params, scratch, meta, 7),
                         ints[1], act, _pv2(params, scratch, meta, 8), y2)
    _dense_act_vec(y2.reshape(y2.size), _pv2(params, scratch, meta, 10),
                   _pv(params, scratch, meta, 11), act, feat)
    top = feat
    if ints[3] != 0:
        _lstm_cell_vec(feat, h__h, c__h, _pv2(params, scratch, meta, 13),
                       _pv2(params, scratch, meta, 14), _pv(params, scratch, meta, 15),
                       _pv(params, scratch, meta, 16), gates__g, h_out__h, c_out__h)
        top = h_out__h
    return _heads_vec(top, _pv2(params, scratch, meta, 18), _pv(params, scratch, meta, 19),
                      _pv2(params, scratch, meta, 20), _pv(params, scratch, meta, 21), probs__a)


@kernel
def doom_step_packed(obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a, params, scratch,
                     offs1, meta, ints):
    """The fused forward of one frame (see above).  Returns the value; probs
    and (for LSTM) h_out/c_out are written.  A non-finite observation is not
    run: the return value is then NaN and nothing is written."""
    if not _all_finite(obs__chw):
        return np.nan
    return _doom_packed_forward(obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a, params,
                                scratch, offs1, meta, ints, _pv(params, scratch, meta, 17))


@kernel
def doom_step_rec_packed(t, obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a, params,
                         scratch, offs1, meta, ints, obs__tchw, z1__ro, flat2__tn, fc__tn,
                         gates__tg, hs__th, cs__th):
    """:func:`doom_step_packed` that also records rollout row ``t`` (what the
    backward-only update reads, :func:`_doom_record`) and, for LSTM, the
    activated gates in ``gates[t]``.  Nothing is written for a non-finite
    obs (NaN returned)."""
    if not _all_finite(obs__chw):
        return np.nan
    value = _doom_packed_forward(obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a, params,
                                 scratch, offs1, meta, ints, gates__tg[t])
    _doom_record(t, obs__chw, h__h, c__h, h_out__h, c_out__h, _pv3(params, scratch, meta, 5),
                 _pv3(params, scratch, meta, 9), _pv(params, scratch, meta, 12), ints[3] != 0,
                 obs__tchw, z1__ro, flat2__tn, fc__tn, hs__th, cs__th)
    return value


# -- a worker's whole agent step in one call ----------------------------------
# Between env steps a worker used to make three calls into compiled code: the
# frame preprocessing (Cython), the recorded step and the action sampling.
# Each is a GIL release and re-acquire, and the short ones (the 10 us resize,
# the sampling) end before a waiting thread wakes up, so for the other threads
# the GIL stays held through them.  doom_act_packed makes them one GIL-free
# call; the resize runs through the Cython Preprocessor's C entry point
# (Preprocessor.c_entry), called by address like the BLAS gemm (nn.blas).


@intrinsic
def _call_frame_fn(typingctx, fn, ctx, src, dst):
    """``int32 fn(void* ctx, const uint8* src, float* dst)`` at address ``fn``
    (``Preprocessor.c_entry``); ``src`` uint8 and ``dst`` float32 arrays
    (their data pointers are passed).  A float64 ``dst`` (a float64
    network's step, which never preprocesses) compiles to a call that
    returns 0 without calling anything."""
    ok = (isinstance(fn, types.Integer) and isinstance(ctx, types.Integer)
          and isinstance(src, types.Array) and src.dtype == types.uint8
          and isinstance(dst, types.Array) and dst.dtype in (types.float32, types.float64))
    if not ok:
        return None
    sig = types.int32(fn, ctx, src, dst)

    def codegen(context, builder, sig, args):
        if sig.args[3].dtype != types.float32:
            return context.get_constant(types.int32, 0)
        i8p = llvm_ir.IntType(8).as_pointer()
        f32p = llvm_ir.FloatType().as_pointer()
        fnty = llvm_ir.FunctionType(llvm_ir.IntType(32), [i8p, i8p, f32p])
        at = sig.args
        fptr = builder.inttoptr(context.cast(builder, args[0], at[0], types.int64),
                                fnty.as_pointer())
        cptr = builder.inttoptr(context.cast(builder, args[1], at[1], types.int64), i8p)
        sptr = builder.bitcast(context.make_array(at[2])(context, builder, args[2]).data, i8p)
        dptr = context.make_array(at[3])(context, builder, args[3]).data
        return builder.call(fptr, [cptr, sptr, dptr])
    return sig, codegen


@kernel
def doom_act_packed(t, raw, prep_fn, prep_ctx, obs__chw, h0__h, c0__h, from_rows, probs__a,
                    params, scratch, offs1, meta, ints, obs__tchw, z1__ro, flat2__tn, fc__tn,
                    gates__tg, hs__th, cs__th, u, actions__t, values__t):
    """A worker's agent step ``t`` in one GIL-free call: the preprocessing
    of the raw frame ``raw`` into ``obs`` (when ``prep_fn`` is not 0: the
    address from ``Preprocessor.c_entry``, ``prep_ctx`` its tables), the
    recorded step :func:`doom_step_rec_packed` (input state: rows
    ``hs[t]``/``cs[t]``, the previous step's output, when ``from_rows``,
    else ``h0``/``c0``; output state ``hs[t+1]``/``cs[t+1]``), and the
    action's sampling with the uniform ``u`` (:func:`sample_categorical`).
    Writes ``actions[t]`` and ``values[t]``; returns the action, -1 for a
    non-finite observation (nothing recorded) or -2 when the preprocessing
    failed (its scratch row could not be allocated)."""
    if prep_fn != 0:
        if _call_frame_fn(prep_fn, prep_ctx, raw, obs__chw) == 0:
            return -2
    if not _all_finite(obs__chw):
        return -1
    if from_rows:
        h = hs__th[t]
        c = cs__th[t]
    else:
        h = h0__h
        c = c0__h
    h_out = hs__th[t + 1]
    c_out = cs__th[t + 1]
    value = _doom_packed_forward(obs__chw, h, c, h_out, c_out, probs__a, params,
                                 scratch, offs1, meta, ints, gates__tg[t])
    _doom_record(t, obs__chw, h, c, h_out, c_out, _pv3(params, scratch, meta, 5),
                 _pv3(params, scratch, meta, 9), _pv(params, scratch, meta, 12), ints[3] != 0,
                 obs__tchw, z1__ro, flat2__tn, fc__tn, hs__th, cs__th)
    a = sample_categorical(probs__a, u)
    actions__t[t] = a
    values__t[t] = value
    return a


@kernel(inline="always")
def _copy_row(src__n, dst__n):
    for i in range(src__n.size):
        dst__n[i] = src__n[i]


# ---------------------------------------------------------------------------
# recording one batch-1 step into rollout rows (the generic, per-layer step)


@kernel
def record_chw_rows(y__ohw, z__ro, t):
    """CHW step output ``y`` ``(O, OH, OW)`` -> NHWC rows ``z[t*P:(t+1)*P]`` ``(P, O)``."""
    o1, oh, ow = y__ohw.shape
    n_pix = oh * ow
    yf = y__ohw.reshape(o1, n_pix)
    for q in range(n_pix):
        r = t * n_pix + q
        for o in range(o1):
            z__ro[r, o] = yf[o, q]


@kernel
def record_row(x, rows__tn, t):
    """``rows[t] = x.ravel()`` (x contiguous, ``rows`` 2-D)."""
    _copy_row(x.reshape(x.size), rows__tn[t])


@kernel
def record_state(h__h, c__h, h_out__h, c_out__h, hs__th, cs__th, t):
    """LSTM rows: ``hs[t], cs[t] = h, c``; ``hs[t+1], cs[t+1] = h_out, c_out``."""
    _copy_row(h__h, hs__th[t])
    _copy_row(c__h, cs__th[t])
    _copy_row(h_out__h, hs__th[t + 1])
    _copy_row(c_out__h, cs__th[t + 1])


# ---------------------------------------------------------------------------
# compiled layer backwards: one nogil call per layer of the batched backward
#
# Each runs exactly the arithmetic of its layer's numpy backward in
# ``layers.py`` (the same elementwise kernels, the same BLAS products in the
# same order through :func:`a3c_core.nn.blas.gemm`, which calls the BLAS numpy
# itself calls): the results are bit-for-bit those of the numpy path
# (tests/test_nn_compiled_backward.py).  What changes is the GIL: numpy's path
# takes it back after every product and reshape (~75 Python-level calls per
# doom-lstm update), these hold it only to dispatch one call per layer.
# ``fns``/``ints``: ``blas.gemm_handle()``, passed through to ``blas.gemm``.


@kernel
def conv_prepare(x__nchw, nchw, w__ocij, x_nhwc__nhwc, k, stride, pad, cols__pk, w_ijc__ok):
    """``Conv2d.prepare_backward``: the im2col of the input rows (NCHW
    observations with ``nchw``, else the previous layer's NHWC rows, passed
    4-D either way) and the weight permuted to the (i, j, c) column order."""
    if nchw:
        n, c, h, w = x__nchw.shape
        if c == 1:
            x = x__nchw.reshape(n, h, w, 1)
        else:
            x = x_nhwc__nhwc[:n]
            for b in range(n):
                for r in range(h):
                    for q in range(w):
                        for e in range(c):
                            x[b, r, q, e] = x__nchw[b, e, r, q]
    else:
        x = x__nchw
    im2col_nhwc(x, k, k, stride, pad, cols__pk)
    o, c2, kh, kw = w__ocij.shape
    for a in range(o):
        for i in range(kh):
            for j in range(kw):
                for e in range(c2):
                    w_ijc__ok[a, (i * kw + j) * c2 + e] = w__ocij[a, e, i, j]


@kernel
def conv_backward(fns, ints, flat, dy__3, y__3, act, dz__ro, db__o, cols__pk, gw__ok, g__ocij,
                  w_ijc__ok, want_dx, dcols__pk, k, stride, pad, dx__nhwc):
    """``Conv2d.backward``: activation backward (``flat``: ``dy``/``y``
    channel-first ``(T, O, P)``, the flattened last conv; else ``(1, T*P, O)``
    NHWC rows), ``dW = dz.T @ cols`` permuted into the ``(O, C, k, k)``
    gradient, ``db``, and with ``want_dx`` ``dx = col2im(dz @ W_ijc)``
    (``dcols`` may be ``cols`` itself: the dW product has read it by then)."""
    rows, o = dz__ro.shape
    if flat:
        t_len = dy__3.shape[0]
        act_backward_from_cp(dy__3, y__3, act, dz__ro.reshape(t_len, rows // t_len, o), db__o)
    else:
        act_backward(dy__3[0], y__3[0], act, dz__ro, db__o)
    gemm(fns, ints, dz__ro, True, cols__pk, False, gw__ok, 0.0)
    _, c, kh, kw = g__ocij.shape
    for a in range(o):
        for i in range(kh):
            for j in range(kw):
                for e in range(c):
                    g__ocij[a, e, i, j] = gw__ok[a, (i * kw + j) * c + e]
    if want_dx:
        gemm(fns, ints, dz__ro, False, w_ijc__ok, False, dcols__pk, 0.0)
        col2im_nhwc(dcols__pk, k, k, stride, pad, dx__nhwc)


@kernel
def dense_backward(fns, ints, dy__to, y__to, act, dz__to, db__o, x__ti, gw__oi, w__oi,
                   want_dx, dx__ti):
    """``Dense.backward``: ``dz = dy * act'``, ``db``, ``dW = dz.T @ x`` and
    with ``want_dx`` ``dx = dz @ W`` (``dz`` may be ``dy`` itself)."""
    act_backward(dy__to, y__to, act, dz__to, db__o)
    gemm(fns, ints, dz__to, True, x__ti, False, gw__oi, 0.0)
    if want_dx:
        gemm(fns, ints, dz__to, False, w__oi, False, dx__ti, 0.0)


@kernel
def lstm_backward(fns, ints, dhs__th, w_hh__gh, hs__th, cs__th, gates__tg, da__tg,
                  dh0__h, dc0__h, resets, reset__t, hin__th, cin__th, hprev__th, cprev__th,
                  x__ti, w_ih__gi, gw_ih__gi, gw_hh__gh, gb_ih__g, gb_hh__g, want_dx, dx__ti,
                  dseq_h__kh, dseq_c__kh):
    """``LSTM.backward``: BPTT over the recorded gates and cells by
    ``lstm_rows_backward`` (K = ``dseq_h.shape[0]`` sequences time-major,
    their carries in ``dseq_h``/``dseq_c``; with K = 1 they end in
    ``dh0``/``dc0`` too; ``resets``: a row's input state was reset),
    then ``db_ih = db_hh = sum_t da``, ``dW_ih = da.T @ x``, ``dW_hh = da.T @
    h_prev`` and with ``want_dx`` ``dx = da @ W_ih``."""
    t_len, hd = hprev__th.shape
    if resets:
        for t in range(t_len):
            if reset__t[t]:
                for k in range(hd):
                    hprev__th[t, k] = hin__th[t, k]
                    cprev__th[t, k] = cin__th[t, k]
            else:
                for k in range(hd):
                    hprev__th[t, k] = hs__th[t, k]
                    cprev__th[t, k] = cs__th[t, k]
        hprev, cprev = hprev__th, cprev__th
    else:
        hprev, cprev = hs__th[:t_len], cs__th[:t_len]
    # one BPTT kernel for K sequences, resets or none (with K = 1 and no
    # reset it is lstm_seq_backward's arithmetic in the same order)
    lstm_rows_backward(dhs__th, w_hh__gh, hs__th, cs__th, cprev, reset__t, gates__tg,
                       da__tg, dseq_h__kh, dseq_c__kh)
    if dseq_h__kh.shape[0] == 1:
        _copy_row(dseq_h__kh[0], dh0__h)
        _copy_row(dseq_c__kh[0], dc0__h)
    g4 = da__tg.shape[1]
    for r in range(g4):
        gb_ih__g[r] = da__tg[0, r]
    for t in range(1, t_len):
        for r in range(g4):
            gb_ih__g[r] += da__tg[t, r]
    for r in range(g4):
        gb_hh__g[r] = gb_ih__g[r]
    gemm(fns, ints, da__tg, True, x__ti, False, gw_ih__gi, 0.0)
    gemm(fns, ints, da__tg, True, hprev, False, gw_hh__gh, 0.0)
    if want_dx:
        gemm(fns, ints, da__tg, False, w_ih__gi, False, dx__ti, 0.0)


# ------------------------------------------------------- batched inference
@kernel
def core_heads_rows(top__nh, use_lstm, b_ih__g, b_hh__g, c__nh, h_out__nh, c_out__nh,
                    wp__ah, bp__a, wv__1h, bv__1, probs__na, values__n):
    """N agents' LSTM cell (optional) and heads, one row each (the batched
    inference of :mod:`a3c_core.nn.batch`).  With ``use_lstm``, ``top`` holds
    each row's gate pre-activations without bias, ``x W_ih^T + h W_hh^T``
    ``(N, 4H)`` (two BLAS GEMMs), overwritten by the activated gates; the new
    state goes to ``h_out``/``c_out`` and the heads read ``h_out``.  Without,
    ``top`` is the encoder's output and the heads read it.  The per-row
    arithmetic is :func:`_lstm_cell_vec`'s and :func:`_heads_vec`'s (the
    batch-1 step's), the gate sums in GEMM order."""
    n = top__nh.shape[0]
    for r in range(n):
        if use_lstm:
            g = top__nh[r]
            hd = g.shape[0] // 4
            for k in range(4 * hd):
                g[k] = g[k] + (b_ih__g[k] + b_hh__g[k])
            for k in range(hd):
                i = _sigmoid(g[k])
                f = _sigmoid(g[hd + k])
                gg = _tanh(g[2 * hd + k])
                o = _sigmoid(g[3 * hd + k])
                g[k] = i
                g[hd + k] = f
                g[2 * hd + k] = gg
                g[3 * hd + k] = o
                c = f * c__nh[r, k] + i * gg
                c_out__nh[r, k] = c
                h_out__nh[r, k] = o * _tanh(c)
            values__n[r] = _heads_vec(h_out__nh[r], wp__ah, bp__a, wv__1h, bv__1, probs__na[r])
        else:
            values__n[r] = _heads_vec(top__nh[r], wp__ah, bp__a, wv__1h, bv__1, probs__na[r])

