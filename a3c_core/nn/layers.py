"""The layers a network is built from: encoder (convs, dense) -> core (LSTM) -> heads.

Each layer object is a static description (shapes, stride, activation) that
owns everything about its op, so that the network, the reference twin, the
FLOP counter, gradcheck and the torch twin iterate one list:

* ``param_shapes()`` - its ``(name, shape)`` layout entries (PyTorch names);
* ``init(p, rng)`` - fills its views of the flat buffer (draw order fixed);
* ``flop_rows()`` - ``{kind, name, macs, ...}`` per compute op (one step);
* ``workspace(t_cap, dtype)`` - its rollout scratch, ``t_cap`` steps; the
  forward writes the layer's activations there in rows indexed by ``t``
  (row ``t`` of a dense, rows ``t*P .. t*P+P-1`` of a conv) and the backward
  reads them back; ``out_rows(ws, t_len)`` views them and ``record(ws, t,
  y)`` stores one batch-1 step's output there, so the backward-only update
  (:meth:`Network.rollout_grad`) reuses the activations the policy acted on;
* ``prepare_backward(ws, p, x, t_len)`` - what the backward reads besides the
  output rows (a conv's im2col of its input), from the input rows ``x``;
* ``forward(ws, p, x, t_len)`` / ``backward(ws, p, g, x, dy, t_len, dx)`` -
  batched over a rollout (BLAS GEMMs + Numba kernels).  Its gradients are
  written in full into its views ``g`` of the flat gradient buffer,
  overwriting what was there, never accumulated into (the convention of
  :mod:`a3c_core.nn.kernels`: each backward gives one rollout's gradient;
  summing rollouts is the optimizer's business); ``dx`` is where the input
  gradient goes (the previous layer's ``dy_rows``), also overwritten, or None;
* ``backward_compiled(bl, ...)`` - the same backward (conv, dense, LSTM) in
  one nogil kernel call whose GEMMs go through ``bl`` (the BLAS handle of
  :mod:`a3c_core.nn.blas`), bit for bit ``backward``'s results; what the
  network runs when numpy's BLAS entry point was found;
* ``ref_forward(params, x)`` / ``ref_backward(dy, cache)`` - the plain-numpy
  twin from :mod:`a3c_core.nn.ref`.

Layers hold no buffers: every array lives in the network's workspace, so one
layer list is shared by a network and its forks.  Activation layouts inside
the rollout path: convs work channels-last (NHWC rows ``(T*OH*OW, O)``); the
last conv of the encoder writes the PyTorch channel-first flatten ``(T,
O*OH*OW)`` that the dense/LSTM after it reads.
"""
from __future__ import annotations

import math

import numpy as np

from a3c_core import _conv
from a3c_core._hugepages import empty as _hp_empty

from . import kernels as K
from . import ref


def _uniform(rng, bound, shape):
    return rng.uniform(-bound, bound, shape)


def _normalized_columns(rng, shape, std):
    """Each output row (PyTorch ``(out, in)`` layout) gets L2 norm ``std``."""
    w = rng.standard_normal(shape)
    return w * (std / np.sqrt(np.square(w).sum(axis=1, keepdims=True)))


class Conv2d:
    """``act(conv2d(x, w, b, stride, pad))``, square ``k x k`` kernel.

    ``in_shape`` ``(C, H, W)``; ``nchw_in``: the input is the observation
    ``(T, C, H, W)`` (else the previous conv's NHWC output); ``flatten_out``:
    the output is the channel-first flatten ``(T, O*OH*OW)`` (last conv).
    """
    kind = "conv"

    def __init__(self, name, in_shape, out_ch, k, stride, pad=0, act="elu", *,
                 nchw_in=False, flatten_out=False):
        self.name, self.in_shape, self.out_ch = name, tuple(in_shape), int(out_ch)
        self.k, self.stride, self.pad, self.act = int(k), int(stride), int(pad), act
        self.nchw_in, self.flatten_out = nchw_in, flatten_out
        _, h, w = self.in_shape
        self.out_hw = (ref.conv_out_size(h, self.k, self.stride, self.pad),
                       ref.conv_out_size(w, self.k, self.stride, self.pad))
        self.n_pix = self.out_hw[0] * self.out_hw[1]
        self.n_col = self.in_shape[0] * self.k * self.k

    @property
    def out_shape(self):
        return (self.out_ch, *self.out_hw)

    @property
    def n_out(self):
        """Length of one step's flattened output."""
        return self.out_ch * self.n_pix

    def param_shapes(self):
        return [(self.name + ".weight", (self.out_ch, self.in_shape[0], self.k, self.k)),
                (self.name + ".bias", (self.out_ch,))]

    def init(self, p, rng):
        bound = 1 / math.sqrt(self.n_col)
        w = p[self.name + ".weight"]
        w[...] = _uniform(rng, bound, w.shape)
        p[self.name + ".bias"][...] = _uniform(rng, bound, self.out_ch)

    def flop_rows(self):
        return [{"kind": "conv", "name": self.name, "in_shape": self.in_shape,
                 "out_shape": self.out_shape, "k": (self.k, self.k), "stride": self.stride,
                 "pad": self.pad, "macs": self.n_pix * self.out_ch * self.n_col}]

    # -- rollout path ---------------------------------------------------------
    def workspace(self, t_cap, dt):
        rows, o = t_cap * self.n_pix, self.out_ch
        c, h, w = self.in_shape
        # the rollout's large rows (MBs) on huge pages where possible
        ws = {"cols": _hp_empty((rows, self.n_col), dt),    # im2col, (i, j, c) columns
              "z": _hp_empty((rows, o), dt),                # NHWC pre-act, then act
              "dz": _hp_empty((rows, o), dt),
              "gw": np.empty((o, self.n_col), dt),          # dW in (i, j, c) order
              "w_ijc": np.empty((o, self.n_col), dt)}       # W permuted to (i, j, c)
        if self.flatten_out:
            ws["flat"] = _hp_empty((t_cap, self.n_out), dt)  # act, channel-first flatten
            ws["dy"] = _hp_empty((t_cap, self.n_out), dt)
        else:
            ws["dy"] = _hp_empty((rows, o), dt)
        if self.nchw_in and c > 1:
            ws["x_nhwc"] = np.empty((t_cap, h, w, c), dt)
        if self.pad:                     # forward_direct's padded input (border stays 0)
            q = self.pad
            ws["x_pad"] = np.zeros((t_cap, h + 2 * q, w + 2 * q, c), dt)
        return ws

    def dy_rows(self, ws, t_len):
        """The output-gradient buffer for ``t_len`` steps, shaped like the output."""
        if self.flatten_out:
            return ws["dy"][:t_len]
        return ws["dy"][:t_len * self.n_pix].reshape(t_len, *self.out_hw, self.out_ch)

    def prepare_backward(self, ws, p, x, t_len):
        """What the backward reads besides the output rows: the im2col of the
        input ``x`` (``ws['cols']`` rows) and the (i, j, c)-permuted weight
        ``ws['w_ijc']``.  The forward starts with it; the backward-only path
        (:meth:`Network.rollout_grad`) calls it on the recorded input rows.
        Returns the cols rows ``(T*OH*OW, C*k*k)``."""
        c, h, w = self.in_shape
        if self.nchw_in:
            if c == 1:
                x = x.reshape(t_len, h, w, 1)
            else:
                xt = ws["x_nhwc"][:t_len]
                xt[...] = x.transpose(0, 2, 3, 1)
                x = xt
        cols = ws["cols"][:t_len * self.n_pix]
        K.im2col_nhwc(x, self.k, self.k, self.stride, self.pad, cols)
        # im2col columns are (i, j, c): the weight in that order, a fresh
        # permuted copy per call (1-9K values), so never stale
        ws["w_ijc"].reshape(self.out_ch, self.k, self.k, c)[...] = \
            p[self.name + ".weight"].transpose(0, 2, 3, 1)
        return cols

    def forward(self, ws, p, x, t_len):
        """x ``(T, C, H, W)`` (``nchw_in``) or NHWC ``(T, H, W, C)`` -> the output."""
        cols = self.prepare_backward(ws, p, x, t_len)
        z = ws["z"][:t_len * self.n_pix]
        np.dot(cols, ws["w_ijc"].T, out=z)
        return self._bias_act_out(ws, p, z, t_len)

    #: (the batched paths call forward_rows on every layer after the leading convs)
    forward_rows = forward

    def direct_ok(self, dtype):
        """Whether :meth:`forward_direct` runs for this layer here (float32,
        16/32/64 output channels, a CPU with AVX-512 and FMA)."""
        return np.dtype(dtype) == np.float32 and _conv.supported(self.out_ch)

    def direct_weight(self, p, out=None):
        """The weight in the ``(KH, KW, C, O)`` order :meth:`forward_direct` reads."""
        w = p[self.name + ".weight"].transpose(2, 3, 1, 0)
        if out is None:
            return np.ascontiguousarray(w)
        out[...] = w
        return out

    def forward_direct(self, ws, p, x, t_len, w_hwco):
        """:meth:`forward`'s output (into the same workspace rows) by the
        direct convolution of :mod:`a3c_core._conv` instead of im2col + GEMM:
        the batched inference path (``nn.batch``), where it measures faster.
        Writes no im2col rows, so a backward cannot follow it.  ``w_hwco``:
        :meth:`direct_weight`.  Requires :meth:`direct_ok`."""
        c, h, w = self.in_shape
        if self.nchw_in:
            x4 = x.reshape(t_len, c, h, w)
        else:                                # the previous conv's NHWC rows
            x4 = x.reshape(t_len, h, w, c).transpose(0, 3, 1, 2)
        if self.pad:                         # into the zero-bordered NHWC scratch
            q = self.pad
            xp = ws["x_pad"][:t_len]
            xp[:, q:q + h, q:q + w, :] = x4.transpose(0, 2, 3, 1)
            x4 = xp.transpose(0, 3, 1, 2)
        z = ws["z"][:t_len * self.n_pix]
        _conv.conv_direct(x4, w_hwco, self.stride, z.reshape(t_len, *self.out_hw, self.out_ch))
        return self._bias_act_out(ws, p, z, t_len)

    def _bias_act_out(self, ws, p, z, t_len):
        act = K.ACT_CODES[self.act]
        if self.flatten_out:
            flat = ws["flat"][:t_len]
            K.bias_act_to_cp(z.reshape(t_len, self.n_pix, self.out_ch), p[self.name + ".bias"],
                             act, flat.reshape(t_len, self.out_ch, self.n_pix))
            return flat
        K.bias_act(z, p[self.name + ".bias"], act)
        return z.reshape(t_len, *self.out_hw, self.out_ch)

    def out_rows(self, ws, t_len):
        """The activation rows the forward returned (and the backward reads)."""
        if self.flatten_out:
            return ws["flat"][:t_len]
        return ws["z"][:t_len * self.n_pix].reshape(t_len, *self.out_hw, self.out_ch)

    def record(self, ws, t, y):
        """Store one batch-1 step output ``y`` (CHW ``(O, OH, OW)``, or its
        flatten for the last conv) as row ``t`` of :meth:`out_rows`."""
        if self.flatten_out:
            K.record_row(y, ws["flat"], t)
        else:
            K.record_chw_rows(y, ws["z"], t)

    def backward(self, ws, p, g, x, dy, t_len, dx):
        """dy shaped like the output; writes dW, db and (``dx`` not None) dx NHWC."""
        o, n_pix, act = self.out_ch, self.n_pix, K.ACT_CODES[self.act]
        rows = t_len * n_pix
        dz = ws["dz"][:rows]
        if self.flatten_out:
            K.act_backward_from_cp(dy.reshape(t_len, o, n_pix),
                                   ws["flat"][:t_len].reshape(t_len, o, n_pix), act,
                                   dz.reshape(t_len, n_pix, o), g[self.name + ".bias"])
        else:
            K.act_backward(dy.reshape(rows, o), ws["z"][:rows], act, dz, g[self.name + ".bias"])
        gw = ws["gw"]
        np.dot(dz.T, ws["cols"][:rows], out=gw)
        g[self.name + ".weight"][...] = \
            gw.reshape(o, self.k, self.k, self.in_shape[0]).transpose(0, 3, 1, 2)
        if dx is None:
            return None
        # the input gradient's columns overwrite the im2col rows, read for
        # the last time just above: one buffer of T*OH*OW*C*k*k values, not two
        dcols = np.dot(dz, ws["w_ijc"], out=ws["cols"][:rows])
        K.col2im_nhwc(dcols, self.k, self.k, self.stride, self.pad, dx)
        return dx

    def backward_compiled(self, bl, ws, p, g, x, dy, t_len, dx, prep=False):
        """:meth:`backward` in one nogil call (``kernels.conv_backward``; bit-for-bit
        the same results), ``bl`` = ``blas.gemm_handle()``.  ``prep``: run
        :meth:`prepare_backward` first, in one more call (the backward-only
        update, whose recorded rows have no im2col yet)."""
        for kern, args in self.backward_calls(bl, ws, p, g, x, dy, t_len, dx, prep):
            kern(*args)
        return dx

    def backward_calls(self, bl, ws, p, g, x, dy, t_len, dx, prep=False):
        """The kernel calls of :meth:`backward_compiled`, as ``[(kernel, args)]``:
        fixed for fixed arrays, so a caller may keep and replay them
        (``Network.rollout_grad`` does, per rollout length)."""
        fns, ints = bl
        c, h, w = self.in_shape
        o, n_pix = self.out_ch, self.n_pix
        rows = t_len * n_pix
        cols = ws["cols"][:rows]
        calls = []
        if prep:
            if self.nchw_in:
                x4 = x.reshape(t_len, c, h, w)
                xt = ws["x_nhwc"] if "x_nhwc" in ws else x4
            else:
                x4 = x
                xt = x4
            calls.append((K.conv_prepare, (x4, self.nchw_in, p[self.name + ".weight"], xt,
                                           self.k, self.stride, self.pad, cols, ws["w_ijc"])))
        if self.flatten_out:
            dy3 = dy.reshape(t_len, o, n_pix)
            y3 = ws["flat"][:t_len].reshape(t_len, o, n_pix)
        else:
            dy3 = dy.reshape(1, rows, o)
            y3 = ws["z"][:rows].reshape(1, rows, o)
        want_dx = dx is not None
        dcols = cols      # dx's columns overwrite cols once dW has read them
        dx4 = dx if want_dx else ws["gw"].reshape(1, 1, 1, -1)
        calls.append((K.conv_backward, (fns, ints, self.flatten_out, dy3, y3,
                                        K.ACT_CODES[self.act], ws["dz"][:rows],
                                        g[self.name + ".bias"], cols, ws["gw"],
                                        g[self.name + ".weight"], ws["w_ijc"], want_dx, dcols,
                                        self.k, self.stride, self.pad, dx4)))
        return calls

    # -- batch-1 step -----------------------------------------------------------
    def step_call(self, p, dt):
        """``(kernel, args, out)``: ``kernel(x, *args)`` writes ``out`` (CHW, or
        its flatten for the last conv) for one image ``x`` ``(C, H, W)``."""
        cols = np.empty((self.n_pix, self.n_col), dt)
        y = np.empty(self.out_shape, dt)
        args = (p[self.name + ".weight"], p[self.name + ".bias"], self.stride, self.pad,
                K.ACT_CODES[self.act], cols, y)
        return K.conv_act_rows, args, (y.reshape(-1) if self.flatten_out else y)

    # -- reference twin ---------------------------------------------------------
    def ref_forward(self, params, x):
        """x ``(T, C, H, W)`` -> output (flattened when ``flatten_out``), cache."""
        act_f, _ = ref.ACTIVATIONS[self.act]
        z, cc = ref.conv2d_forward(x, params[self.name + ".weight"], params[self.name + ".bias"],
                                   self.stride, self.pad)
        y, ac = act_f(z)
        return (y.reshape(y.shape[0], -1) if self.flatten_out else y), (cc, ac)

    def ref_backward(self, dy, cache):
        """-> ``(dx (T, C, H, W), {name: grad})``."""
        cc, ac = cache
        _, act_b = ref.ACTIVATIONS[self.act]
        dz = act_b(dy.reshape(dy.shape[0], *self.out_shape), ac)
        dx, gw, gb = ref.conv2d_backward(dz, cc)
        return dx, {self.name + ".weight": gw, self.name + ".bias": gb}


class Dense:
    """``act(x @ w.T + b)``; x ``(T, n_in)``."""
    kind = "dense"

    def __init__(self, name, n_in, n_out, act="elu"):
        self.name, self.n_in, self.n_out, self.act = name, int(n_in), int(n_out), act

    @property
    def out_shape(self):
        return (self.n_out,)

    def param_shapes(self):
        return [(self.name + ".weight", (self.n_out, self.n_in)),
                (self.name + ".bias", (self.n_out,))]

    def init(self, p, rng):
        bound = 1 / math.sqrt(self.n_in)
        p[self.name + ".weight"][...] = _uniform(rng, bound, (self.n_out, self.n_in))
        p[self.name + ".bias"][...] = _uniform(rng, bound, self.n_out)

    def flop_rows(self):
        return [{"kind": "dense", "name": self.name, "n_in": self.n_in, "n_out": self.n_out,
                 "macs": self.n_in * self.n_out}]

    def workspace(self, t_cap, dt):
        return {"y": np.empty((t_cap, self.n_out), dt), "dy": np.empty((t_cap, self.n_out), dt)}

    def dy_rows(self, ws, t_len):
        return ws["dy"][:t_len]

    def forward(self, ws, p, x, t_len):
        x = x.reshape(t_len, self.n_in)
        y = ws["y"][:t_len]
        np.dot(x, p[self.name + ".weight"].T, out=y)
        K.bias_act(y, p[self.name + ".bias"], K.ACT_CODES[self.act])
        return y

    def forward_rows(self, ws, p, x, t_len):
        """:meth:`forward` for a few rows (the batched worker's tick, batched
        inference): ``W @ x.T`` into a (n_out, T) scratch, then its transpose
        into the rows.  numpy's sgemm runs this shape ~2x faster than ``x @
        W.T`` at 8-16 rows (one BLAS thread, 2-core EPYC VM: 305 against 587
        us for 16 x 2592 -> 256); the same sums up to rounding."""
        x = x.reshape(t_len, self.n_in)
        y = ws["y"][:t_len]
        yt = np.dot(p[self.name + ".weight"], x.T)
        y[...] = yt.T
        K.bias_act(y, p[self.name + ".bias"], K.ACT_CODES[self.act])
        return y

    def prepare_backward(self, ws, p, x, t_len):
        """Nothing beyond the output rows and the input (see ``Conv2d``)."""

    def out_rows(self, ws, t_len):
        return ws["y"][:t_len]

    def record(self, ws, t, y):
        """Store one batch-1 step output ``y`` ``(n_out,)`` as row ``t``."""
        K.record_row(y, ws["y"], t)

    def backward(self, ws, p, g, x, dy, t_len, dx):
        dz = ws["dy"][:t_len]                    # may be dy itself: elementwise in place
        K.act_backward(dy, ws["y"][:t_len], K.ACT_CODES[self.act], dz, g[self.name + ".bias"])
        np.dot(dz.T, x.reshape(t_len, self.n_in), out=g[self.name + ".weight"])
        if dx is None:
            return None
        return np.dot(dz, p[self.name + ".weight"], out=dx.reshape(t_len, self.n_in))

    def backward_compiled(self, bl, ws, p, g, x, dy, t_len, dx, prep=False):
        """:meth:`backward` in one nogil call (``kernels.dense_backward``;
        bit-for-bit the same results); ``prep`` is unused (nothing to prepare)."""
        (kern, args), = self.backward_calls(bl, ws, p, g, x, dy, t_len, dx, prep)
        kern(*args)
        return args[-1] if dx is not None else None

    def backward_calls(self, bl, ws, p, g, x, dy, t_len, dx, prep=False):
        """The kernel call of :meth:`backward_compiled` (see ``Conv2d.backward_calls``)."""
        fns, ints = bl
        dz = ws["dy"][:t_len]
        x2 = x.reshape(t_len, self.n_in)
        want_dx = dx is not None
        dx2 = dx.reshape(t_len, self.n_in) if want_dx else x2
        return [(K.dense_backward, (fns, ints, dy, ws["y"][:t_len], K.ACT_CODES[self.act], dz,
                                    g[self.name + ".bias"], x2, g[self.name + ".weight"],
                                    p[self.name + ".weight"], want_dx, dx2))]

    def step_call(self, p, dt):
        y = np.empty(self.n_out, dt)
        return K.dense_act_vec, (p[self.name + ".weight"], p[self.name + ".bias"],
                                 K.ACT_CODES[self.act], y), y

    def ref_forward(self, params, x):
        act_f, _ = ref.ACTIVATIONS[self.act]
        z, cc = ref.dense_forward(x.reshape(x.shape[0], -1), params[self.name + ".weight"],
                                  params[self.name + ".bias"])
        y, ac = act_f(z)
        return y, (cc, ac)

    def ref_backward(self, dy, cache):
        cc, ac = cache
        _, act_b = ref.ACTIVATIONS[self.act]
        dx, gw, gb = ref.dense_backward(act_b(dy, ac), cc)
        return dx, {self.name + ".weight": gw, self.name + ".bias": gb}


class LSTM:
    """The recurrent core: an LSTM cell unrolled over the rollout (PyTorch
    ``LSTMCell`` layout, gate order i, f, g, o; zero biases at init)."""
    kind = "lstm"

    def __init__(self, n_in, hidden, name="lstm"):
        self.name, self.n_in, self.hidden = name, int(n_in), int(hidden)

    @property
    def out_shape(self):
        return (self.hidden,)

    def param_shapes(self):
        g4, n = 4 * self.hidden, self.name
        return [(n + ".weight_ih", (g4, self.n_in)), (n + ".weight_hh", (g4, self.hidden)),
                (n + ".bias_ih", (g4,)), (n + ".bias_hh", (g4,))]

    def init(self, p, rng):
        bound = 1 / math.sqrt(self.hidden)
        for key in (".weight_ih", ".weight_hh"):
            w = p[self.name + key]
            w[...] = _uniform(rng, bound, w.shape)
        p[self.name + ".bias_ih"][...] = 0
        p[self.name + ".bias_hh"][...] = 0

    def flop_rows(self):
        g4 = 4 * self.hidden
        return [{"kind": "lstm", "name": self.name, "n_in": self.n_in, "hidden": self.hidden,
                 "macs": g4 * (self.n_in + self.hidden)}]

    def workspace(self, t_cap, dt):
        g4, hd = 4 * self.hidden, self.hidden
        return {"gx": np.empty((t_cap, g4), dt), "gates": np.empty((t_cap, g4), dt),
                "da": np.empty((t_cap, g4), dt), "hs": np.empty((t_cap + 1, hd), dt),
                "cs": np.empty((t_cap + 1, hd), dt), "zero": np.zeros(hd, dt),
                "dh0": np.zeros(hd, dt), "dc0": np.zeros(hd, dt),
                # a recorded rollout that crosses an episode boundary: the
                # input state of each reset step (hs/cs keep the outputs),
                # the reset mask, and the previous-state rows the backward reads
                "hin": np.zeros((t_cap, hd), dt), "cin": np.zeros((t_cap, hd), dt),
                "reset": np.zeros(t_cap, np.bool_), "no_reset": np.zeros(t_cap, np.bool_),
                "hprev": np.empty((t_cap, hd), dt),
                "cprev": np.empty((t_cap, hd), dt), "tmp": np.empty((2, hd), dt),
                # the carried gradients of K sequences recorded time-major
                # (Network.begin_batch_rollout sizes them for its K)
                "dseq_h": np.zeros((1, hd), dt), "dseq_c": np.zeros((1, hd), dt)}

    def forward(self, ws, p, x, t_len, h0, c0):
        """x ``(T, n_in)``, state ``(H,)`` x2 -> hs ``(T, H)`` (rows 1..T of ``ws['hs']``)."""
        n = self.name
        hs, cs = ws["hs"][:t_len + 1], ws["cs"][:t_len + 1]
        hs[0] = h0
        cs[0] = c0
        gx = ws["gx"][:t_len]
        np.dot(x.reshape(t_len, self.n_in), p[n + ".weight_ih"].T, out=gx)
        K.lstm_seq_forward(gx, p[n + ".weight_hh"], p[n + ".bias_ih"], p[n + ".bias_hh"],
                           hs, cs, ws["gates"][:t_len])
        return hs[1:]

    def backward(self, ws, p, g, x, dhs, t_len, dx, resets=False, n_seq=1):
        """BPTT; dh0/dc0 land in ``ws['dh0']``/``ws['dc0']``.  ``resets``: the
        recorded rollout has steps whose input state was reset (``ws['reset']``
        rows, input states in ``ws['hin']``/``ws['cin']``): no gradient flows
        across them.  ``n_seq`` > 1: the rows are ``n_seq`` sequences
        time-major (row ``t*n_seq + k``).  Both go through
        :func:`~a3c_core.nn.kernels.lstm_rows_backward`."""
        n = self.name
        da = ws["da"][:t_len]
        hs = ws["hs"][:t_len + n_seq]
        cs = ws["cs"][:t_len + n_seq]
        if n_seq > 1 or resets:
            # each row's input state: the previous output, or hin/cin at a reset
            r = ws["reset"][:t_len]
            hprev, cprev = ws["hprev"][:t_len], ws["cprev"][:t_len]
            hprev[...] = hs[:t_len]
            cprev[...] = cs[:t_len]
            hprev[r] = ws["hin"][:t_len][r]
            cprev[r] = ws["cin"][:t_len][r]
        if n_seq > 1 or resets:
            K.lstm_rows_backward(dhs, p[n + ".weight_hh"], hs, cs, cprev, r,
                                 ws["gates"][:t_len], da, ws["dseq_h"][:n_seq],
                                 ws["dseq_c"][:n_seq])
            if n_seq == 1:
                ws["dh0"][...] = ws["dseq_h"][0]
                ws["dc0"][...] = ws["dseq_c"][0]
        else:
            hprev = hs[:t_len]
            K.lstm_seq_backward(dhs, ws["zero"], ws["zero"], p[n + ".weight_hh"], hs, cs,
                                ws["gates"][:t_len], da, ws["dh0"], ws["dc0"])
        np.sum(da, axis=0, out=g[n + ".bias_ih"])
        g[n + ".bias_hh"][...] = g[n + ".bias_ih"]
        np.dot(da.T, x.reshape(t_len, self.n_in), out=g[n + ".weight_ih"])
        np.dot(da.T, hprev, out=g[n + ".weight_hh"])
        if dx is None:
            return None
        return np.dot(da, p[n + ".weight_ih"], out=dx.reshape(t_len, self.n_in))

    def backward_compiled(self, bl, ws, p, g, x, dhs, t_len, dx, resets=False, n_seq=1):
        """:meth:`backward` in one nogil call (``kernels.lstm_backward``;
        bit-for-bit the same results), ``bl`` = ``blas.gemm_handle()``."""
        (kern, args), = self.backward_calls(bl, ws, p, g, x, dhs, t_len, dx, resets, n_seq)
        kern(*args)
        return args[-1] if dx is not None else None

    def backward_calls(self, bl, ws, p, g, x, dhs, t_len, dx, resets=False, n_seq=1):
        """The kernel call of :meth:`backward_compiled` (see ``Conv2d.backward_calls``;
        ``n_seq``: see :meth:`backward`)."""
        fns, ints = bl
        n = self.name
        x2 = x.reshape(t_len, self.n_in)
        want_dx = dx is not None
        dx2 = dx.reshape(t_len, self.n_in) if want_dx else x2
        resets = bool(resets) or n_seq > 1
        return [(K.lstm_backward, (
            fns, ints, dhs, p[n + ".weight_hh"], ws["hs"][:t_len + n_seq],
            ws["cs"][:t_len + n_seq], ws["gates"][:t_len], ws["da"][:t_len], ws["dh0"],
            ws["dc0"], resets, (ws["reset"] if resets else ws["no_reset"])[:t_len],
            ws["hin"][:t_len], ws["cin"][:t_len], ws["hprev"][:t_len], ws["cprev"][:t_len], x2,
            p[n + ".weight_ih"], g[n + ".weight_ih"], g[n + ".weight_hh"], g[n + ".bias_ih"],
            g[n + ".bias_hh"], want_dx, dx2, ws["dseq_h"][:n_seq], ws["dseq_c"][:n_seq]))]

    def step_args(self, p):
        n = self.name
        return (p[n + ".weight_ih"], p[n + ".weight_hh"], p[n + ".bias_ih"], p[n + ".bias_hh"])

    def ref_forward(self, params, x, state):
        """-> ``(hs (T, H), (hT, cT), cache)``."""
        n = self.name
        h0, c0 = state
        return ref.lstm_forward(x.reshape(x.shape[0], -1), h0, c0, params[n + ".weight_ih"],
                                params[n + ".weight_hh"], params[n + ".bias_ih"],
                                params[n + ".bias_hh"])

    def ref_backward(self, dhs, cache):
        """-> ``(dx, dh0, dc0, {name: grad})``."""
        dx, dh0, dc0, gwi, gwh, gbi, gbh = ref.lstm_backward(dhs, cache)
        n = self.name
        return dx, dh0, dc0, {n + ".weight_ih": gwi, n + ".weight_hh": gwh,
                              n + ".bias_ih": gbi, n + ".bias_hh": gbh}


class Heads:
    """Policy head (dense ``n_in -> A``, softmax) and value head (dense
    ``n_in -> 1``), normalized-columns init (std 0.01 / 1.0, zero biases),
    and the A3C loss."""
    kind = "heads"

    def __init__(self, n_in, n_actions):
        self.name, self.n_in, self.n_actions = "heads", int(n_in), int(n_actions)

    def param_shapes(self):
        return [("policy.weight", (self.n_actions, self.n_in)), ("policy.bias", (self.n_actions,)),
                ("value.weight", (1, self.n_in)), ("value.bias", (1,))]

    def init(self, p, rng):
        p["policy.weight"][...] = _normalized_columns(rng, p["policy.weight"].shape, 0.01)
        p["policy.bias"][...] = 0
        p["value.weight"][...] = _normalized_columns(rng, p["value.weight"].shape, 1.0)
        p["value.bias"][...] = 0

    def flop_rows(self):
        return [{"kind": "dense", "name": "policy", "n_in": self.n_in, "n_out": self.n_actions,
                 "macs": self.n_in * self.n_actions},
                {"kind": "dense", "name": "value", "n_in": self.n_in, "n_out": 1,
                 "macs": self.n_in}]

    def workspace(self, t_cap, dt):
        return {"probs": np.empty((t_cap, self.n_actions), dt), "values": np.empty(t_cap, dt),
                "dtop": np.empty((t_cap, self.n_in), dt)}

    def forward_loss(self, ws, p, g, top, actions, returns, advantages, value_coef,
                     entropy_beta, t_len):
        """Heads + A3C loss + their backward in one kernel: probs/values rows,
        ``ws['dtop']`` and the head gradients written.  Returns the stats dict."""
        pre, post = self.loss_args(ws, p, g, top, t_len)
        out = K.heads_loss(*pre, actions, returns, advantages, float(value_coef),
                           float(entropy_beta), *post)
        return self.loss_stats(out, value_coef, entropy_beta)

    def loss_args(self, ws, p, g, top, t_len):
        """``heads_loss``'s arguments before the targets and after the
        coefficients, as two tuples (fixed views: a caller may keep them)."""
        return ((top, p["policy.weight"], p["policy.bias"], p["value.weight"], p["value.bias"]),
                (ws["probs"][:t_len], ws["values"][:t_len], ws["dtop"][:t_len],
                 g["policy.weight"], g["policy.bias"], g["value.weight"], g["value.bias"]))

    @staticmethod
    def loss_stats(out, value_coef, entropy_beta):
        """``heads_loss``'s ``(pl, vl, ent)`` -> the stats dict."""
        pl, vl, ent = out
        return {"policy_loss": float(pl), "value_loss": float(vl), "entropy": float(ent),
                "loss": float(pl + value_coef * vl - entropy_beta * ent)}

    def step_args(self, p):
        return (p["policy.weight"], p["policy.bias"], p["value.weight"], p["value.bias"])

    def ref_loss(self, params, top, actions, returns, advantages, value_coef, entropy_beta):
        """-> ``(stats, probs, values, cache)``."""
        logits, pc = ref.dense_forward(top, params["policy.weight"], params["policy.bias"])
        values2, vc = ref.dense_forward(top, params["value.weight"], params["value.bias"])
        values = values2[:, 0]
        stats, dlogits, dvalues = ref.a3c_loss(logits, values, actions, returns, advantages,
                                               value_coef, entropy_beta)
        return stats, ref.softmax(logits), values, (pc, vc, dlogits, dvalues)

    def ref_backward(self, cache):
        """-> ``(dtop, {name: grad})``."""
        pc, vc, dlogits, dvalues = cache
        grads = {}
        dtop, grads["policy.weight"], grads["policy.bias"] = ref.dense_backward(dlogits, pc)
        dtop2, grads["value.weight"], grads["value.bias"] = ref.dense_backward(dvalues[:, None],
                                                                               vc)
        return dtop + dtop2, grads
