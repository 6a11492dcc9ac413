"""Numba kernels of the network engine; each has a plain-numpy twin in ``ref``.

Every kernel uses the project decorator :func:`a3c_core._jit.kernel`
(``nogil=True, cache=True``, fastmath ``reassoc``+``contract``), so worker
threads run them in parallel.  Kernels are dtype-generic: the same source is
compiled for float32 and float64 on first use (and cached on disk).  Inner
loops accumulate in the array dtype (``w.dtype.type(0)``) so that float32
dot products vectorise at full SIMD width.

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
* ``conv_act_single``, ``dense_act_vec``, ``lstm_cell_vec``, ``heads_vec``
  and the fused ``doom_step`` / ``core_heads_step`` -> ref layers, batch 1.
"""
from __future__ import annotations

import numpy as np

from a3c_core._jit import kernel

ACT_CODES = {"elu": 0, "relu": 1, "identity": 2}


# ---------------------------------------------------------------------------
# scalar helpers (inlined by Numba)


@kernel(inline="always")
def _act(z, act):
    if act == 0:
        return z if z > 0 else np.expm1(z)
    if act == 1:
        return z if z > 0 else 0.0
    return z


@kernel(inline="always")
def _act_grad_from_y(y, act):
    if act == 0:
        return 1.0 if y > 0 else y + 1.0
    if act == 1:
        return 1.0 if y > 0 else 0.0
    return 1.0


@kernel(inline="always")
def _sigmoid(a):
    if a >= 0:
        return 1.0 / (1.0 + np.exp(-a))
    e = np.exp(a)
    return e / (1.0 + e)


# ---------------------------------------------------------------------------
# batched conv helpers (rollout path; the GEMMs run in BLAS)


@kernel
def im2col_nhwc(x__nhwc, kh, kw, stride, cols__pk):
    """x ``(N,H,W,C)`` -> cols ``(N*OH*OW, kh*kw*C)``, column order (i, j, c):
    each kernel row is one contiguous run of ``kw*C`` input values.  Matches
    ``weight.transpose(0, 2, 3, 1).reshape(O, -1)`` of a PyTorch
    ``(O,C,kh,kw)`` weight (``ref.im2col`` uses (c, i, j))."""
    n, h, w, c = x__nhwc.shape
    oh = (h - kh) // stride + 1
    ow = (w - kw) // stride + 1
    run = kw * c
    k_len = kh * run
    xf = x__nhwc.reshape(x__nhwc.size)
    cf = cols__pk.reshape(cols__pk.size)
    for b in range(n):
        for y in range(oh):
            for xx in range(ow):
                row = (b * oh + y) * ow + xx
                if c == 1:      # short runs (kw values): plain element loop is faster
                    for i in range(kh):
                        for j in range(kw):
                            cols__pk[row, i * kw + j] = x__nhwc[b, y * stride + i,
                                                                xx * stride + j, 0]
                    continue
                for i in range(kh):
                    s0 = ((b * h + y * stride + i) * w + xx * stride) * c
                    d0 = row * k_len + i * run
                    cf[d0:d0 + run] = xf[s0:s0 + run]


@kernel
def col2im_nhwc(dcols__pk, kh, kw, stride, dx__nhwc):
    """Adjoint of :func:`im2col_nhwc`: dx ``(N,H,W,C)`` is overwritten."""
    n, h, w, c = dx__nhwc.shape
    oh = (h - kh) // stride + 1
    ow = (w - kw) // stride + 1
    run = kw * c
    k_len = kh * run
    dx__nhwc[...] = 0
    xf = dx__nhwc.reshape(dx__nhwc.size)
    cf = dcols__pk.reshape(dcols__pk.size)
    for b in range(n):
        for y in range(oh):
            for xx in range(ow):
                row = (b * oh + y) * ow + xx
                for i in range(kh):
                    s0 = ((b * h + y * stride + i) * w + xx * stride) * c
                    d0 = row * k_len + i * run
                    for e in range(run):
                        xf[s0 + e] += cf[d0 + e]


@kernel
def bias_act(z__mo, b__o, act):
    """In place ``z = act(z + b)`` over rows of ``(M, O)``."""
    m, o = z__mo.shape
    for r in range(m):
        for k in range(o):
            z__mo[r, k] = _act(z__mo[r, k] + b__o[k], act)


@kernel
def bias_act_to_cp(z__npo, b__o, act, y__nop):
    """``y[n, o, p] = act(z[n, p, o] + b[o])``: channels-last GEMM output to
    PyTorch channel-first (flatten order)."""
    n, p, o = z__npo.shape
    for s in range(n):
        for q in range(p):
            for k in range(o):
                y__nop[s, k, q] = _act(z__npo[s, q, k] + b__o[k], act)


@kernel
def act_backward(dy__mo, y__mo, act, dz__mo, db__o):
    """``dz = dy * act'(z)`` (from the output ``y``); ``db = sum_rows dz``."""
    m, o = dy__mo.shape
    db__o[:] = 0
    for r in range(m):
        for k in range(o):
            d = dy__mo[r, k] * _act_grad_from_y(y__mo[r, k], act)
            dz__mo[r, k] = d
            db__o[k] += d


@kernel
def act_backward_from_cp(dy__nop, y__nop, act, dz__npo, db__o):
    """Like :func:`act_backward` but ``dy``/``y`` channel-first ``(N,O,P)``
    and ``dz`` channels-last ``(N,P,O)``."""
    n, o, p = dy__nop.shape
    db__o[:] = 0
    for s in range(n):
        for k in range(o):
            acc = 0.0
            for q in range(p):
                d = dy__nop[s, k, q] * _act_grad_from_y(y__nop[s, k, q], act)
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
    zero = hs__th.dtype.type(0)
    for t in range(t_len):
        for r in range(g4):
            acc = zero
            for k in range(hd):
                acc += w_hh__gh[r, k] * hs__th[t, k]
            gates__tg[t, r] = gx__tg[t, r] + b_ih__g[r] + b_hh__g[r] + acc
        for k in range(hd):
            i = _sigmoid(gates__tg[t, k])
            f = _sigmoid(gates__tg[t, hd + k])
            g = np.tanh(gates__tg[t, 2 * hd + k])
            o = _sigmoid(gates__tg[t, 3 * hd + k])
            gates__tg[t, k] = i
            gates__tg[t, hd + k] = f
            gates__tg[t, 2 * hd + k] = g
            gates__tg[t, 3 * hd + k] = o
            c = f * cs__th[t, k] + i * g
            cs__th[t + 1, k] = c
            hs__th[t + 1, k] = o * np.tanh(c)


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
    dh = dh0__h
    dc = dc0__h
    dh[:] = dhT__h
    dc[:] = dcT__h
    for t in range(t_len - 1, -1, -1):
        for k in range(hd):
            dht = dhs__th[t, k] + dh[k]
            i = gates__tg[t, k]
            f = gates__tg[t, hd + k]
            g = gates__tg[t, 2 * hd + k]
            o = gates__tg[t, 3 * hd + k]
            tc = np.tanh(cs__th[t + 1, k])
            dct = dc[k] + dht * o * (1.0 - tc * tc)
            da__tg[t, k] = dct * g * i * (1.0 - i)
            da__tg[t, hd + k] = dct * cs__th[t, k] * f * (1.0 - f)
            da__tg[t, 2 * hd + k] = dct * i * (1.0 - g * g)
            da__tg[t, 3 * hd + k] = dht * tc * o * (1.0 - o)
            dc[k] = dct * f
        dh[:] = 0
        for r in range(g4):
            s = da__tg[t, r]
            for k in range(hd):
                dh[k] += s * w_hh__gh[r, k]


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
        for a in range(na):
            acc = zero
            for k in range(hd):
                acc += wp__ah[a, k] * h__th[t, k]
            logits[a] = acc + bp__a[a]
        acc = zero
        for k in range(hd):
            acc += wv__1h[0, k] * h__th[t, k]
        v = acc + bv__1[0]
        values__t[t] = v
        m = logits.max()
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
# batch-1 step (inference): everything fused, no BLAS, no allocation


@kernel(inline="always")
def _conv_act_single(x__chw, w__ocij, b__o, stride, act, colt__kp, y__ohw):
    """Transposed im2col ``colt (C*kh*kw, OH*OW)`` then, per output channel,
    ``y[o, :] = sum_k w[o, k] * colt[k, :]`` as axpys over the contiguous
    pixel axis (4 taps per pass): SIMD over pixels, no horizontal reductions,
    and the live weight views are used as they are (no transposed copy)."""
    c, h, w = x__chw.shape
    o, _, kh, kw = w__ocij.shape
    oh = (h - kh) // stride + 1
    ow = (w - kw) // stride + 1
    n_pix = oh * ow
    k_len = c * kh * kw
    for ch in range(c):
        for i in range(kh):
            for j in range(kw):
                k = (ch * kh + i) * kw + j
                for y in range(oh):
                    src = y * stride + i
                    for xx in range(ow):
                        colt__kp[k, y * ow + xx] = x__chw[ch, src, xx * stride + j]
    w2 = w__ocij.reshape(o, k_len)
    y2 = y__ohw.reshape(o, n_pix)
    k4 = k_len - k_len % 4
    for q in range(o):
        yq = y2[q]
        bq = b__o[q]
        for p in range(n_pix):
            yq[p] = bq
        for k in range(0, k4, 4):
            s0 = w2[q, k]
            s1 = w2[q, k + 1]
            s2 = w2[q, k + 2]
            s3 = w2[q, k + 3]
            c0 = colt__kp[k]
            c1 = colt__kp[k + 1]
            c2 = colt__kp[k + 2]
            c3 = colt__kp[k + 3]
            for p in range(n_pix):
                yq[p] += s0 * c0[p] + s1 * c1[p] + s2 * c2[p] + s3 * c3[p]
        for k in range(k4, k_len):
            s0 = w2[q, k]
            c0 = colt__kp[k]
            for p in range(n_pix):
                yq[p] += s0 * c0[p]
        for p in range(n_pix):
            yq[p] = _act(yq[p], act)


@kernel
def conv_act_single(x__chw, w__ocij, b__o, stride, act, cols__pk, y__ohw):
    """One image: ``y = act(conv2d(x, w, b, stride))``, channel-first in/out;
    colt ``(C*kh*kw, OH*OW)`` is scratch."""
    _conv_act_single(x__chw, w__ocij, b__o, stride, act, cols__pk, y__ohw)


@kernel(inline="always")
def _dense_act_vec(x__i, w__oi, b__o, act, y__o):
    o, n_in = w__oi.shape
    zero = y__o.dtype.type(0)
    for q in range(o):
        acc = zero
        for k in range(n_in):
            acc += w__oi[q, k] * x__i[k]
        y__o[q] = _act(acc + b__o[q], act)


@kernel
def dense_act_vec(x__i, w__oi, b__o, act, y__o):
    """``y = act(w @ x + b)`` for one vector."""
    _dense_act_vec(x__i, w__oi, b__o, act, y__o)


@kernel(inline="always")
def _lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                   gates__g, h_out__h, c_out__h):
    g4, n_in = w_ih__gi.shape
    hd = g4 // 4
    zero = h__h.dtype.type(0)
    for r in range(g4):
        acc = zero
        for k in range(n_in):
            acc += w_ih__gi[r, k] * x__i[k]
        acc2 = zero
        for k in range(hd):
            acc2 += w_hh__gh[r, k] * h__h[k]
        gates__g[r] = acc + acc2 + b_ih__g[r] + b_hh__g[r]
    for k in range(hd):
        i = _sigmoid(gates__g[k])
        f = _sigmoid(gates__g[hd + k])
        g = np.tanh(gates__g[2 * hd + k])
        o = _sigmoid(gates__g[3 * hd + k])
        c = f * c__h[k] + i * g
        c_out__h[k] = c
        h_out__h[k] = o * np.tanh(c)


@kernel
def lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                  gates__g, h_out__h, c_out__h):
    """One LSTM step for one vector; gates ``(4H,)`` is scratch."""
    _lstm_cell_vec(x__i, h__h, c__h, w_ih__gi, w_hh__gh, b_ih__g, b_hh__g,
                   gates__g, h_out__h, c_out__h)


@kernel(inline="always")
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
def doom_step(obs__chw, h__h, c__h, h_out__h, c_out__h, probs__a,
              c1w, c1b, s1, cols1, y1, c2w, c2b, s2, cols2, y2, fcw, fcb, feat, act,
              use_lstm, w_ih, w_hh, b_ih, b_hh, gates__g, wp__ah, bp__a, wv__1h, bv__1):
    """The whole conv-conv-dense(-LSTM)-heads forward for one frame, fused in
    one GIL-free call.  Scratch: cols1, y1, cols2, y2, feat, gates.  Returns
    the value; probs and (for LSTM) h_out/c_out are written."""
    _conv_act_single(obs__chw, c1w, c1b, s1, act, cols1, y1)
    _conv_act_single(y1, c2w, c2b, s2, act, cols2, y2)
    _dense_act_vec(y2.reshape(y2.size), fcw, fcb, act, feat)
    if use_lstm:
        _lstm_cell_vec(feat, h__h, c__h, w_ih, w_hh, b_ih, b_hh,
                       gates__g, h_out__h, c_out__h)
        return _heads_vec(h_out__h, wp__ah, bp__a, wv__1h, bv__1, probs__a)
    return _heads_vec(feat, wp__ah, bp__a, wv__1h, bv__1, probs__a)
