"""Batched recurrent inference: N agents, one step each, in one call.

:meth:`Network.step_batch` (and through it ``Policy.act_batch``) runs here.
Each of the N rows is its own agent with its own LSTM state; the rows share
nothing but the weights.  The encoder runs batched over the rows: the convs by
the register-blocked direct kernel of :mod:`a3c_core._conv` where the CPU has
it (AVX-512 with FMA; else the rollout path's im2col + one BLAS GEMM per
conv), the fc as one GEMM, the LSTM's gate sums as
two GEMMs over the rows, and the cell and heads as one nogil kernel
(``kernels.core_heads_rows``, the batch-1 step's per-row arithmetic).

Fewer than :data:`BATCH_MIN_ROWS` rows run the batch-1 step (the fused
kernel for the doom specs) row by row: there it measures faster.  The rows
go through in chunks of at most :data:`CHUNK` (the scratch does not grow
with N; see docs/results.md for the measurement that picked it), and the
convs of a chunk in sub-chunks of :data:`CONV_CHUNK` images, whose im2col
rows stay in L2 (the dense layers keep the chunk's rows: one pass over
their weights per chunk).

Results agree with N batch-1 :meth:`Network.step` calls to float32 rounding
(the GEMMs sum in another order than the fused step's dot products).
"""
from __future__ import annotations

import numpy as np

from . import kernels as K

#: rows per pass through the encoder (bounded scratch; measured, see above)
CHUNK = 64

#: below this many rows :meth:`Network.step_batch` runs the batch-1 step per
#: row instead: measured 2026-11-28 (2-core VM, one BLAS thread, per-row us
#: batched / batch-1) doom-lstm 1.22, 1.50, 1.22 at N = 1, 2, 3 and 0.88 at
#: 4; mlp-lstm 2.5, 1.18 at 1, 2 and 0.81 at 3; atari-lstm 1.2 at 2, 0.99 at 3
BATCH_MIN_ROWS = 4

#: images per pass through the convs: measured 2026-11-28 (2-core Xeon VM,
#: one BLAS thread, doom-lstm, N = 64) conv1 + conv2 per agent 32.9 us in
#: passes of 8 images, 33.8 of 16, 34.5 of 32, 35.0 of 64
CONV_CHUNK = 8

#: the convs by :mod:`a3c_core._conv`'s direct kernel where it runs (float32,
#: 16/32/64 output channels, AVX-512 with FMA; otherwise im2col +
#: GEMM): measured 2026-11-28 (2-core Xeon VM, AVX-512, doom-lstm, 8 images
#: per pass) conv1 8.0 against 17.8 us per image with im2col + GEMM, conv2 7.8
#: against 16.4 (ELU and layout not counted on the direct side; see
#: docs/results.md#embedding).  False forces the GEMM path (tests, bench).
DIRECT_CONV = True


class BatchStepper:
    """A network's scratch for :meth:`Network.step_batch` (one per Network
    object, like the rest of its scratch: one per thread)."""

    def __init__(self, net):
        self.net = net
        self.cap = 0
        self.ws = None

    def _workspace(self, rows):
        if rows <= self.cap:
            return self.ws
        net, dt = self.net, self.net.dtype
        # the leading convs run CONV_CHUNK images at a time, into ``feat``
        nc = 0
        while nc < len(net.encoder) and net.encoder[nc].kind == "conv":
            nc += 1
        self.n_conv = nc
        sub = min(rows, CONV_CHUNK) if nc else rows
        self.ws = [layer.workspace(sub if i < nc else rows, dt)
                   for i, layer in enumerate(net.encoder)]
        self.feat = np.empty((rows, net.encoder[nc - 1].n_out), dt) if nc else None
        # the convs by the direct kernel where it runs (see the module docstring)
        convs = net.encoder[:nc]
        self.direct = bool(nc) and DIRECT_CONV and all(L.direct_ok(dt) for L in convs)
        self.w_direct = [L.direct_weight(net.param_views) for L in convs] if self.direct else []
        hd = max(net.lstm_size, 1)
        self.gates = np.empty((rows, 4 * hd), dt)
        self.tmp = np.empty((rows, 4 * hd), dt)
        self.cap = rows
        return self.ws

    def __call__(self, obs, h, c, probs, values, h_out, c_out):
        """Rows of ``obs`` ``(N, *obs_shape)`` (checked, contiguous, ``dtype``)
        and the state rows ``h``/``c`` ``(N, H)`` (ignored without an LSTM)
        -> ``probs`` ``(N, A)``, ``values`` ``(N,)``, ``h_out``/``c_out``
        written."""
        net = self.net
        n = obs.shape[0]
        p = net.param_views
        heads = net.heads.step_args(p)
        self._workspace(min(n, CHUNK))
        for layer, w in zip(net.encoder, self.w_direct):   # this call's weights
            layer.direct_weight(p, w)
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            m = hi - lo
            ws = self._workspace(min(n, CHUNK))
            x = obs[lo:hi]
            nc = self.n_conv
            if nc:
                feat = self.feat[:m]
                for s in range(0, m, CONV_CHUNK):
                    e = min(m, s + CONV_CHUNK)
                    y = x[s:e]
                    if self.direct:
                        for layer, lws, w in zip(net.encoder[:nc], ws[:nc], self.w_direct):
                            y = layer.forward_direct(lws, p, y, e - s, w)
                    else:
                        for layer, lws in zip(net.encoder[:nc], ws[:nc]):
                            y = layer.forward(lws, p, y, e - s)
                    feat[s:e] = y.reshape(e - s, -1)
                x = feat
            for layer, lws in zip(net.encoder[nc:], ws[nc:]):
                x = layer.forward_rows(lws, p, x, m)
            x = x.reshape(m, net.n_features)
            if net.recurrent:
                w_ih, w_hh, b_ih, b_hh = net.core.step_args(p)
                top = self.gates[:m]
                # W @ rows.T: numpy's sgemm is ~2x faster in this shape at
                # 8-16 rows (Dense.forward_rows)
                gt = np.dot(w_ih, x.T)
                gt += np.dot(w_hh, h[lo:hi].T)
                top[...] = gt.T
                K.core_heads_rows(top, True, b_ih, b_hh, c[lo:hi], h_out[lo:hi], c_out[lo:hi],
                                  *heads, probs[lo:hi], values[lo:hi])
            else:
                K.core_heads_rows(x, False, heads[1], heads[1], x, x, x,
                                  *heads, probs[lo:hi], values[lo:hi])
