"""Actor-critic networks over one flat parameter buffer.

Specs (``build_network(spec, obs_shape, n_actions, **kwargs)``):

* ``doom-lstm`` (images ``(C, H, W)``): conv1 16x8x8/4 + ELU, conv2 32x4x4/2 +
  ELU, flatten (PyTorch C,H,W order), fc 256 + ELU, LSTM 256, policy dense
  256->A + softmax, value dense 256->1.  kwargs: ``fc_size=256``,
  ``lstm_size=256``, ``activation='elu'``.
* ``doom-ff``: the same without the LSTM (kwargs ``fc_size``, ``activation``).
* ``mlp-lstm`` (vectors ``(D,)``): ``fc1..fcN`` (``hidden=(64, 64)``) + ELU
  (or ``activation='relu'``), LSTM ``lstm_size=64``, heads.
* ``mlp``: the same without the LSTM.

Tensor names and shapes follow PyTorch (``conv1.weight (16,1,8,8)``,
``lstm.weight_ih (4H,in)``, gate order i,f,g,o, ``policy.weight (A,H)``,
``value.weight (1,H)``) so weights move both ways.

Initialisation (seeded ``np.random.default_rng(seed)``, drawn in float64 then
cast, so float32 and float64 nets with one seed agree): conv/dense weights and
biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch default); LSTM weights
``U(-1/sqrt(H), 1/sqrt(H))`` with ZERO biases (no forget-bias offset, so a
PyTorch LSTM gets the same function from these weights); heads
normalized-columns init (each output unit's weight row has norm 0.01 for the
policy, 1.0 for the value) with zero bias.

Execution:

* ``step`` (batch 1, once per env step): for conv specs the whole forward is
  ONE fused Numba call (``kernels.doom_step``) over the live weight views -
  no transposed copies, so nothing goes stale when params change; for MLP
  specs one call per hidden layer plus one for LSTM+heads.
* ``loss_and_grad`` (a rollout of T steps): conv and dense layers run batched
  over T with numpy BLAS GEMMs (which release the GIL); im2col/col2im, bias +
  activation, the LSTM recurrence (forward and BPTT) and heads + A3C loss run
  in Numba kernels.  im2col columns are ordered (i, j, c) over channels-last
  activations (contiguous runs); the conv weights are permuted to match into
  scratch at the start of every call (8K values; never stale) and dW is
  permuted back into the PyTorch layout.  Scratch buffers are preallocated per network (grown when
  a longer rollout arrives); a network must be used by one thread at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import kernels as K
from . import ref
from .layout import ParamLayout

SPECS = ("doom-lstm", "doom-ff", "mlp-lstm", "mlp")
_SPEC_KWARGS = {
    "doom-lstm": {"fc_size": 256, "lstm_size": 256, "activation": "elu"},
    "doom-ff": {"fc_size": 256, "activation": "elu"},
    "mlp-lstm": {"hidden": (64, 64), "lstm_size": 64, "activation": "elu"},
    "mlp": {"hidden": (64, 64), "activation": "elu"},
}
# conv stack of the doom specs: (name, out_channels, kernel, stride)
_DOOM_CONVS = (("conv1", 16, 8, 4), ("conv2", 32, 4, 2))


@dataclass(frozen=True)
class _Conv:
    name: str
    in_shape: tuple   # (C, H, W)
    out_ch: int
    k: int
    stride: int

    @property
    def out_hw(self):
        _, h, w = self.in_shape
        return (ref.conv_out_size(h, self.k, self.stride),
                ref.conv_out_size(w, self.k, self.stride))

    @property
    def n_pix(self):
        oh, ow = self.out_hw
        return oh * ow

    @property
    def n_col(self):
        return self.in_shape[0] * self.k * self.k


@dataclass(frozen=True)
class _Dense:
    name: str
    n_in: int
    n_out: int


def _spec_error(msg):
    return ValueError(f"{msg}; valid specs: {', '.join(SPECS)} "
                      "(doom-* take image obs_shape (C, H, W) with H, W >= 20; "
                      "mlp* take vector obs_shape (D,))")


def _resolve_kwargs(name, kwargs):
    defaults = _SPEC_KWARGS[name]
    bad = sorted(set(kwargs) - set(defaults))
    if bad:
        raise ValueError(f"spec {name!r}: unknown option(s) {bad}; "
                         f"valid options: {sorted(defaults)}")
    out = dict(defaults)
    out.update(kwargs)
    if out["activation"] not in ("elu", "relu"):
        raise ValueError(f"spec {name!r}: activation must be 'elu' or 'relu', "
                         f"got {out['activation']!r}")
    for key in ("fc_size", "lstm_size"):
        if key in out:
            out[key] = int(out[key])
            if out[key] <= 0:
                raise ValueError(f"spec {name!r}: {key} must be positive")
    if "hidden" in out:
        hidden = out["hidden"]
        if isinstance(hidden, (int, np.integer)):
            hidden = (hidden,)
        hidden = tuple(int(h) for h in hidden)
        if not hidden or any(h <= 0 for h in hidden):
            raise ValueError(f"spec {name!r}: hidden must be positive sizes, got {hidden}")
        out["hidden"] = list(hidden)
    return out


def _normalized_columns(rng, shape, std):
    """Each output row (PyTorch ``(out, in)`` layout) gets L2 norm ``std``."""
    w = rng.standard_normal(shape)
    return w * (std / np.sqrt(np.square(w).sum(axis=1, keepdims=True)))


class Network:
    """An actor-critic network; see the module docstring.

    Attributes: ``params``/``grads`` (flat, ``dtype``; copy into them, never
    rebind), ``layout``, ``spec`` (JSON-able), ``n_params``, ``dtype``,
    ``obs_shape``, ``n_actions``, ``recurrent``.
    """

    def __init__(self, name, obs_shape, n_actions, kwargs, dtype=np.float32, seed=0):
        if name not in SPECS:
            raise _spec_error(f"unknown network spec {name!r}")
        self._dtype = np.dtype(dtype)
        if self._dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {self._dtype}")
        try:
            obs_shape = tuple(int(s) for s in obs_shape)
        except TypeError:
            raise _spec_error(f"obs_shape must be a tuple of ints, got {obs_shape!r}") from None
        n_actions = int(n_actions)
        if n_actions < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        kw = _resolve_kwargs(name, dict(kwargs))
        self.obs_shape = obs_shape
        self.n_actions = n_actions
        self.spec = {"name": name, "obs_shape": list(obs_shape), "n_actions": n_actions,
                     "kwargs": kw, "dtype": self._dtype.name}
        self._act = K.ACT_CODES[kw["activation"]]
        self._build_arch(name, obs_shape, kw)
        self._build_layout()
        self._params = self.layout.new_flat(self._dtype)
        self._grads = self.layout.new_flat(self._dtype)
        self._p = self.layout.views(self._params)
        self._g = self.layout.views(self._grads)
        self._init_params(seed)
        self._build_step()
        self._ws_t = 0

    # ------------------------------------------------------------------ build
    def _build_arch(self, name, obs_shape, kw):
        self.convs: list[_Conv] = []
        self.denses: list[_Dense] = []
        if name.startswith("doom"):
            if len(obs_shape) != 3 or min(obs_shape) < 1:
                raise _spec_error(f"spec {name!r} needs an image obs_shape (C, H, W), "
                                  f"got {obs_shape}")
            shape = obs_shape
            for cname, out_ch, k, s in _DOOM_CONVS:
                conv = _Conv(cname, shape, out_ch, k, s)
                if min(conv.out_hw) < 1:
                    raise _spec_error(
                        f"spec {name!r}: obs_shape {obs_shape} is too small for {cname} "
                        f"({k}x{k} stride {s} on a {shape[1]}x{shape[2]} map)")
                self.convs.append(conv)
                shape = (out_ch, *conv.out_hw)
            n_in = math.prod(shape)
            self.denses.append(_Dense("fc", n_in, kw["fc_size"]))
        else:
            if len(obs_shape) != 1 or obs_shape[0] < 1:
                raise _spec_error(f"spec {name!r} needs a vector obs_shape (D,), "
                                  f"got {obs_shape}")
            n_in = obs_shape[0]
            for i, h in enumerate(kw["hidden"], 1):
                self.denses.append(_Dense(f"fc{i}", n_in, h))
                n_in = h
        self.n_features = self.denses[-1].n_out
        self.lstm_size = kw.get("lstm_size", 0) if name.endswith("lstm") else 0
        self.recurrent = self.lstm_size > 0
        self.n_top = self.lstm_size if self.recurrent else self.n_features

    def _build_layout(self):
        lay = ParamLayout()
        for c in self.convs:
            lay.add(f"{c.name}.weight", (c.out_ch, c.in_shape[0], c.k, c.k))
            lay.add(f"{c.name}.bias", (c.out_ch,))
        for d in self.denses:
            lay.add(f"{d.name}.weight", (d.n_out, d.n_in))
            lay.add(f"{d.name}.bias", (d.n_out,))
        if self.recurrent:
            hd = self.lstm_size
            lay.add("lstm.weight_ih", (4 * hd, self.n_features))
            lay.add("lstm.weight_hh", (4 * hd, hd))
            lay.add("lstm.bias_ih", (4 * hd,))
            lay.add("lstm.bias_hh", (4 * hd,))
        lay.add("policy.weight", (self.n_actions, self.n_top))
        lay.add("policy.bias", (self.n_actions,))
        lay.add("value.weight", (1, self.n_top))
        lay.add("value.bias", (1,))
        self.layout = lay

    def _init_params(self, seed):
        rng = np.random.default_rng(seed)
        p = self._p
        for c in self.convs:
            bound = 1 / math.sqrt(c.n_col)
            p[f"{c.name}.weight"][...] = rng.uniform(-bound, bound, p[f"{c.name}.weight"].shape)
            p[f"{c.name}.bias"][...] = rng.uniform(-bound, bound, c.out_ch)
        for d in self.denses:
            bound = 1 / math.sqrt(d.n_in)
            p[f"{d.name}.weight"][...] = rng.uniform(-bound, bound, (d.n_out, d.n_in))
            p[f"{d.name}.bias"][...] = rng.uniform(-bound, bound, d.n_out)
        if self.recurrent:
            bound = 1 / math.sqrt(self.lstm_size)
            for key in ("lstm.weight_ih", "lstm.weight_hh"):
                p[key][...] = rng.uniform(-bound, bound, p[key].shape)
            p["lstm.bias_ih"][...] = 0
            p["lstm.bias_hh"][...] = 0
        p["policy.weight"][...] = _normalized_columns(rng, p["policy.weight"].shape, 0.01)
        p["policy.bias"][...] = 0
        p["value.weight"][...] = _normalized_columns(rng, p["value.weight"].shape, 1.0)
        p["value.bias"][...] = 0

    def _build_step(self):
        """Preallocate batch-1 scratch and the constant argument tuples."""
        dt, p = self._dtype, self._p
        hd = max(self.lstm_size, 1)
        self._gates1 = np.empty(4 * hd, dt)
        if self.recurrent:
            lstm = (p["lstm.weight_ih"], p["lstm.weight_hh"], p["lstm.bias_ih"], p["lstm.bias_hh"])
        else:
            lstm = (np.zeros((4, 1), dt), np.zeros((4, 1), dt), np.zeros(4, dt), np.zeros(4, dt))
            self._dummy_h = np.zeros(1, dt)
        heads = (p["policy.weight"], p["policy.bias"], p["value.weight"], p["value.bias"])
        if self.convs:
            c1, c2 = self.convs
            d = self.denses[0]
            s2d = K.conv_s2d_shapes(c1.in_shape, c1.k, c1.stride)
            if s2d is None:           # conv1 stride does not divide its kernel
                s2d = ((0, 1), (1,))
            xs1, acc1 = np.empty(s2d[0], dt), np.empty(s2d[1], dt)
            cols1 = np.empty((c1.n_col, c1.n_pix) if s2d[0][0] == 0 else (0, 1), dt)
            y1 = np.empty((c1.out_ch, *c1.out_hw), dt)
            cols2 = np.empty((c2.n_pix, c2.n_col), dt)
            y2 = np.empty((c2.out_ch, *c2.out_hw), dt)
            self._feat1 = np.empty(d.n_out, dt)
            self._step_static = (
                p["conv1.weight"], p["conv1.bias"], c1.stride, cols1, xs1, acc1, y1,
                p["conv2.weight"], p["conv2.bias"], c2.stride, cols2, y2,
                p["fc.weight"], p["fc.bias"], self._feat1, self._act,
                self.recurrent, *lstm, self._gates1, *heads)
        else:
            self._mlp_bufs = [np.empty(d.n_out, dt) for d in self.denses]
            self._mlp_layers = [(p[f"{d.name}.weight"], p[f"{d.name}.bias"], self._act, buf)
                                for d, buf in zip(self.denses, self._mlp_bufs)]
            self._core_static = (self.recurrent, *lstm)
            self._heads_static = heads

    # ------------------------------------------------------------ properties
    @property
    def params(self) -> np.ndarray:
        """Flat parameter buffer (every tensor is a view of it)."""
        return self._params

    @property
    def grads(self) -> np.ndarray:
        """Flat gradient buffer, same layout as ``params``."""
        return self._grads

    @property
    def dtype(self):
        return self._dtype

    @property
    def n_params(self) -> int:
        return self.layout.size

    def __repr__(self):
        return (f"Network({self.spec['name']!r}, obs_shape={self.obs_shape}, "
                f"n_actions={self.n_actions}, n_params={self.n_params}, dtype={self._dtype.name})")

    # ------------------------------------------------------------ state dict
    def state_dict(self) -> dict:
        """``name -> view`` of params (writing a view writes ``params``)."""
        return dict(self._p)

    def grad_dict(self) -> dict:
        """``name -> view`` of grads."""
        return dict(self._g)

    def load_state_dict(self, state) -> None:
        """Copy tensors in (cast to ``dtype``); every layout tensor is required,
        shapes must match, unexpected names are rejected."""
        missing = [n for n in self.layout if n not in state]
        unexpected = [n for n in state if n not in self.layout]
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing tensors {missing}, "
                           f"unexpected tensors {unexpected}")
        for name in self.layout:
            arr = np.asarray(state[name])
            if arr.shape != self.layout.shape(name):
                raise ValueError(f"load_state_dict: tensor {name!r} has shape {arr.shape}, "
                                 f"expected {self.layout.shape(name)}")
        for name in self.layout:
            self._p[name][...] = state[name]

    def initial_state(self):
        """``(h, c)`` zeros of shape ``(H,)`` for LSTM nets, ``None`` otherwise."""
        if not self.recurrent:
            return None
        return (np.zeros(self.lstm_size, self._dtype), np.zeros(self.lstm_size, self._dtype))

    def _state_arrays(self, state):
        if state is None:
            return self.initial_state()
        h, c = state
        dt = self._dtype
        if not (isinstance(h, np.ndarray) and h.dtype == dt and h.flags.c_contiguous):
            h = np.ascontiguousarray(h, dtype=dt)
        if not (isinstance(c, np.ndarray) and c.dtype == dt and c.flags.c_contiguous):
            c = np.ascontiguousarray(c, dtype=dt)
        if h.shape != (self.lstm_size,) or c.shape != (self.lstm_size,):
            raise ValueError(f"LSTM state must be two arrays of shape ({self.lstm_size},), "
                             f"got {h.shape} and {c.shape}")
        return h, c

    # ------------------------------------------------------------------ step
    def step(self, obs, state):
        """One observation ``obs_shape`` -> ``(probs (A,), value float, new_state)``.

        ``new_state`` is a new ``(h, c)`` tuple (LSTM) or ``None``; the input
        state is never modified.
        """
        dt = self._dtype
        if not (type(obs) is np.ndarray and obs.dtype == dt and obs.flags.c_contiguous):
            obs = np.ascontiguousarray(obs, dtype=dt)
        if obs.shape != self.obs_shape:
            obs = obs.reshape(self.obs_shape)
        probs = np.empty(self.n_actions, dt)
        if self.recurrent:
            h, c = self._state_arrays(state)
            h_out = np.empty_like(h)
            c_out = np.empty_like(c)
            new_state = (h_out, c_out)
        else:
            h = c = h_out = c_out = self._dummy_h
            new_state = None
        if self.convs:
            value = K.doom_step(obs, h, c, h_out, c_out, probs, *self._step_static)
        else:
            x = obs
            for w, b, act, buf in self._mlp_layers:
                K.dense_act_vec(x, w, b, act, buf)
                x = buf
            value = K.core_heads_step(x, *self._core_static, h, c, self._gates1, h_out, c_out,
                                      *self._heads_static, probs)
        return probs, value, new_state

    # ---------------------------------------------------------- rollout path
    def _workspace(self, t_len):
        """Grow the rollout scratch to hold ``t_len`` steps."""
        if t_len <= self._ws_t:
            return
        t_cap = max(t_len, 20)
        dt = self._dtype
        ws = {}
        for c in self.convs:
            rows = t_cap * c.n_pix
            ws[c.name + ".cols"] = np.empty((rows, c.n_col), dt)
            ws[c.name + ".z"] = np.empty((rows, c.out_ch), dt)      # pre-act/act, NHWC
            ws[c.name + ".dz"] = np.empty((rows, c.out_ch), dt)
            ws[c.name + ".gw"] = np.empty((c.out_ch, c.n_col), dt)   # dW in (i, j, c)
            ws[c.name + ".w_ijc"] = np.empty((c.out_ch, c.n_col), dt)
        if self.convs:
            c = self.convs[-1]
            ws["flat"] = np.empty((t_cap, c.out_ch * c.n_pix), dt)   # NCHW flatten
            ws["dflat"] = np.empty((t_cap, c.out_ch * c.n_pix), dt)
            for c in self.convs[1:]:
                ws[c.name + ".dcols"] = np.empty((t_cap * c.n_pix, c.n_col), dt)
            for c_prev in self.convs[:-1]:
                ws[c_prev.name + ".dy"] = np.empty((t_cap * c_prev.n_pix, c_prev.out_ch), dt)
        else:
            ws["obs"] = np.empty((t_cap, self.obs_shape[0]), dt)
        for d in self.denses:
            ws[d.name + ".y"] = np.empty((t_cap, d.n_out), dt)
            ws[d.name + ".dy"] = np.empty((t_cap, d.n_out), dt)
        if self.recurrent:
            hd = self.lstm_size
            ws["gx"] = np.empty((t_cap, 4 * hd), dt)
            ws["gates"] = np.empty((t_cap, 4 * hd), dt)
            ws["da"] = np.empty((t_cap, 4 * hd), dt)
            ws["hs"] = np.empty((t_cap + 1, hd), dt)
            ws["cs"] = np.empty((t_cap + 1, hd), dt)
            self._zero_h = np.zeros(hd, dt)
            self.last_dstate = (np.zeros(hd, dt), np.zeros(hd, dt))
        ws["probs"] = np.empty((t_cap, self.n_actions), dt)
        ws["values"] = np.empty(t_cap, dt)
        ws["dtop"] = np.empty((t_cap, self.n_top), dt)
        self._ws = ws
        self._ws_t = t_cap

    def _w_ijc(self, c):
        """Conv weight ``(O,C,kh,kw)`` copied to ``(O, kh*kw*C)`` (im2col order)."""
        out = self._ws[c.name + ".w_ijc"]
        out.reshape(c.out_ch, c.k, c.k, -1)[...] = \
            self._p[c.name + ".weight"].transpose(0, 2, 3, 1)
        return out

    def _run(self, obs, actions, returns, advantages, state, value_coef, entropy_beta,
             backward):
        dt = self._dtype
        t_len = obs.shape[0]
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(f"obs must have shape (T, *{self.obs_shape}), got {obs.shape}")
        if t_len < 1:
            raise ValueError("rollout must have at least one step")
        self._workspace(t_len)
        self._last_t = t_len
        ws, p, g = self._ws, self._p, self._g
        actions = np.ascontiguousarray(actions, dtype=np.int64)
        if actions.shape != (t_len,) or actions.min() < 0 or actions.max() >= self.n_actions:
            raise ValueError(f"actions must be {t_len} ints in [0, {self.n_actions})")
        returns = np.ascontiguousarray(returns, dtype=dt).reshape(t_len)
        advantages = np.ascontiguousarray(advantages, dtype=dt).reshape(t_len)
        act = self._act

        # ---- forward: convs (NHWC, batched GEMM), dense layers, LSTM, heads
        conv_in = []                      # per conv: its NHWC input
        conv_w = []                       # per conv: weight as (O, kh*kw*C)
        if self.convs:
            c0, h0_, w0_ = self.obs_shape
            x = np.ascontiguousarray(obs, dtype=dt)
            x_nhwc = x.reshape(t_len, h0_, w0_, 1) if c0 == 1 else \
                np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            last = len(self.convs) - 1
            for li, c in enumerate(self.convs):
                rows = t_len * c.n_pix
                cols = ws[c.name + ".cols"][:rows]
                z = ws[c.name + ".z"][:rows]
                K.im2col_nhwc(x_nhwc, c.k, c.k, c.stride, cols)
                conv_in.append(x_nhwc)
                # im2col columns are (i, j, c): use the weight in that order
                # (a fresh 1-8K element permuted copy per call, so never stale)
                w_ijc = self._w_ijc(c)
                conv_w.append(w_ijc)
                np.dot(cols, w_ijc.T, out=z)
                if li < last:
                    K.bias_act(z, p[c.name + ".bias"], act)
                    x_nhwc = z.reshape(t_len, *c.out_hw, c.out_ch)
                else:
                    flat = ws["flat"][:t_len]
                    K.bias_act_to_cp(z.reshape(t_len, c.n_pix, c.out_ch), p[c.name + ".bias"],
                                     act, flat.reshape(t_len, c.out_ch, c.n_pix))
                    x = flat
        else:
            x = ws["obs"][:t_len]
            x[...] = obs.reshape(t_len, -1)
        dense_in = []
        for d in self.denses:
            y = ws[d.name + ".y"][:t_len]
            np.dot(x, p[d.name + ".weight"].T, out=y)
            K.bias_act(y, p[d.name + ".bias"], act)
            dense_in.append(x)
            x = y
        feat = x
        if self.recurrent:
            h0, c0 = self._state_arrays(state)
            gx = ws["gx"][:t_len]
            gates = ws["gates"][:t_len]
            hs = ws["hs"][:t_len + 1]
            cs = ws["cs"][:t_len + 1]
            hs[0] = h0
            cs[0] = c0
            np.dot(feat, p["lstm.weight_ih"].T, out=gx)
            K.lstm_seq_forward(gx, p["lstm.weight_hh"], p["lstm.bias_ih"], p["lstm.bias_hh"],
                               hs, cs, gates)
            top = hs[1:]
        else:
            top = feat
        probs = ws["probs"][:t_len]
        values = ws["values"][:t_len]
        dtop = ws["dtop"][:t_len]
        pl, vl, ent = K.heads_loss(
            top, p["policy.weight"], p["policy.bias"], p["value.weight"], p["value.bias"],
            actions, returns, advantages, float(value_coef), float(entropy_beta),
            probs, values, dtop, g["policy.weight"], g["policy.bias"],
            g["value.weight"], g["value.bias"])
        stats = {"policy_loss": float(pl), "value_loss": float(vl), "entropy": float(ent),
                 "loss": float(pl + value_coef * vl - entropy_beta * ent)}
        if not backward:
            return stats

        # ---- backward
        if self.recurrent:
            da = ws["da"][:t_len]
            dh0, dc0 = self.last_dstate
            K.lstm_seq_backward(dtop, self._zero_h, self._zero_h, p["lstm.weight_hh"],
                                hs, cs, gates, da, dh0, dc0)
            np.sum(da, axis=0, out=g["lstm.bias_ih"])
            g["lstm.bias_hh"][...] = g["lstm.bias_ih"]
            np.dot(da.T, feat, out=g["lstm.weight_ih"])
            np.dot(da.T, hs[:t_len], out=g["lstm.weight_hh"])
            dx = np.dot(da, p["lstm.weight_ih"], out=ws[self.denses[-1].name + ".dy"][:t_len])
        else:
            dx = dtop
        n_dense = len(self.denses)
        for li in range(n_dense - 1, -1, -1):
            d = self.denses[li]
            y = ws[d.name + ".y"][:t_len]
            dz = ws[d.name + ".dy"][:t_len]
            K.act_backward(dx, y, act, dz, g[d.name + ".bias"])   # dz may alias dx
            np.dot(dz.T, dense_in[li], out=g[d.name + ".weight"])
            if li > 0:
                dx = np.dot(dz, p[d.name + ".weight"], out=ws[self.denses[li - 1].name + ".dy"][:t_len])
            elif self.convs:
                dx = np.dot(dz, p[d.name + ".weight"], out=ws["dflat"][:t_len])
        for li in range(len(self.convs) - 1, -1, -1):
            c = self.convs[li]
            rows = t_len * c.n_pix
            dz = ws[c.name + ".dz"][:rows]
            if li == len(self.convs) - 1:
                K.act_backward_from_cp(dx.reshape(t_len, c.out_ch, c.n_pix),
                                       ws["flat"][:t_len].reshape(t_len, c.out_ch, c.n_pix),
                                       act, dz.reshape(t_len, c.n_pix, c.out_ch),
                                       g[c.name + ".bias"])
            else:
                K.act_backward(dx, ws[c.name + ".z"][:rows], act, dz, g[c.name + ".bias"])
            gw = ws[c.name + ".gw"]
            np.dot(dz.T, ws[c.name + ".cols"][:rows], out=gw)
            g[c.name + ".weight"][...] = gw.reshape(c.out_ch, c.k, c.k, -1).transpose(0, 3, 1, 2)
            if li > 0:
                dcols = np.dot(dz, conv_w[li], out=ws[c.name + ".dcols"][:rows])
                prev = self.convs[li - 1]
                dprev = ws[prev.name + ".dy"][:t_len * prev.n_pix]
                K.col2im_nhwc(dcols, c.k, c.k, c.stride, dprev.reshape(conv_in[li].shape))
                dx = dprev
        return stats

    def loss(self, obs, actions, returns, advantages, state, *, value_coef=0.5,
             entropy_beta=0.01) -> dict:
        """Forward only: the stats of :meth:`loss_and_grad` (grads untouched
        except the head gradients, which the fused heads kernel writes)."""
        return self._run(obs, actions, returns, advantages, state, value_coef,
                         entropy_beta, backward=False)

    def loss_and_grad(self, obs, actions, returns, advantages, state, *, value_coef=0.5,
                      entropy_beta=0.01):
        """A3C loss over a rollout and its gradient (BPTT from ``state``).

        obs ``(T, *obs_shape)``, actions int ``(T,)``, returns/advantages
        ``(T,)``; ``state`` the LSTM state before ``obs[0]`` (``None`` = zeros).
        ``loss = -sum log pi(a_t) A_t + value_coef * 0.5 sum (R_t - V_t)^2
        - entropy_beta * sum H(pi_t)``.

        Returns ``(stats, grads)``: stats dict of floats ``policy_loss``,
        ``value_loss``, ``entropy``, ``loss``; grads ``name -> view`` of
        ``self.grads`` (overwritten each call).  For LSTM nets the gradient
        wrt the initial state is left in ``self.last_dstate`` ``(dh0, dc0)``.
        After the call ``self.last_probs``/``self.last_values`` view the
        forward's outputs (valid until the next call).
        """
        stats = self._run(obs, actions, returns, advantages, state, value_coef,
                          entropy_beta, backward=True)
        return stats, self._g

    @property
    def last_probs(self):
        """``(T, A)`` policy probs of the last rollout forward (a scratch view)."""
        return self._ws["probs"][:self._last_t] if self._ws_t else None

    @property
    def last_values(self):
        """``(T,)`` values of the last rollout forward (a scratch view)."""
        return self._ws["values"][:self._last_t] if self._ws_t else None


def build_network(spec="doom-lstm", obs_shape=(1, 84, 84), n_actions=3, *, dtype=np.float32,
                  seed=0, **spec_kwargs) -> Network:
    """Build a network from a spec name; see the module docstring.

    Raises ``ValueError`` (naming the problem and the valid specs) for an
    unknown spec, unknown option, or an ``obs_shape`` the spec cannot take.
    """
    if not isinstance(spec, str) or spec not in SPECS:
        raise _spec_error(f"unknown network spec {spec!r}")
    return Network(spec, obs_shape, n_actions, spec_kwargs, dtype=dtype, seed=seed)


def network_from_spec(d, *, seed=0, dtype=None) -> Network:
    """Rebuild a network (fresh init) from ``net.spec``; load weights after."""
    try:
        name, obs_shape, n_actions = d["name"], d["obs_shape"], d["n_actions"]
    except (KeyError, TypeError):
        raise ValueError(f"network spec must be a dict with name, obs_shape, n_actions; "
                         f"got {d!r}") from None
    dt = dtype if dtype is not None else d.get("dtype", "float32")
    return build_network(name, tuple(obs_shape), n_actions, dtype=np.dtype(dt), seed=seed,
                         **dict(d.get("kwargs", {})))


# ---------------------------------------------------------------------------
# reference twin of the whole network (plain numpy layers from ``ref``)


def ref_forward_loss(net, params, obs, actions, returns, advantages, state, *,
                     value_coef=0.5, entropy_beta=0.01, backward=True):
    """The network's forward + A3C loss + backward composed from ``ref`` layers.

    ``params``: ``name -> array`` (e.g. ``net.state_dict()``).  Returns
    ``(stats, grads, extras)`` with grads ``name -> new array`` and extras
    ``{'probs','values','dh0','dc0','state'}``.
    """
    act_f, act_b = ref.ACTIVATIONS[net.spec["kwargs"]["activation"]]
    t_len = obs.shape[0]
    x = obs
    caches = []
    for c in net.convs:
        z, cc = ref.conv2d_forward(x, params[c.name + ".weight"], params[c.name + ".bias"],
                                   c.stride)
        x, ac = act_f(z)
        caches.append((cc, ac))
    x = x.reshape(t_len, -1)
    for d in net.denses:
        z, cc = ref.dense_forward(x, params[d.name + ".weight"], params[d.name + ".bias"])
        x, ac = act_f(z)
        caches.append((cc, ac))
    if net.recurrent:
        h0, c0 = state if state is not None else net.initial_state()
        hs, new_state, lc = ref.lstm_forward(x, h0, c0, params["lstm.weight_ih"],
                                             params["lstm.weight_hh"], params["lstm.bias_ih"],
                                             params["lstm.bias_hh"])
        top = hs
    else:
        top, new_state = x, None
    logits, pc = ref.dense_forward(top, params["policy.weight"], params["policy.bias"])
    values2, vc = ref.dense_forward(top, params["value.weight"], params["value.bias"])
    values = values2[:, 0]
    stats, dlogits, dvalues = ref.a3c_loss(logits, values, actions, returns, advantages,
                                           value_coef, entropy_beta)
    extras = {"probs": ref.softmax(logits), "values": values, "state": new_state}
    if not backward:
        return stats, None, extras
    grads = {}
    dtop, grads["policy.weight"], grads["policy.bias"] = ref.dense_backward(dlogits, pc)
    dtop2, grads["value.weight"], grads["value.bias"] = ref.dense_backward(dvalues[:, None], vc)
    dx = dtop + dtop2
    if net.recurrent:
        (dx, extras["dh0"], extras["dc0"], grads["lstm.weight_ih"], grads["lstm.weight_hh"],
         grads["lstm.bias_ih"], grads["lstm.bias_hh"]) = ref.lstm_backward(dx, lc)
    layers = list(net.convs) + list(net.denses)
    for li in range(len(layers) - 1, -1, -1):
        cc, ac = caches[li]
        dz = act_b(dx, ac)
        if isinstance(layers[li], _Conv):
            dx, gw, gb = ref.conv2d_backward(dz, cc)
        else:
            dx, gw, gb = ref.dense_backward(dz, cc)
            if li > 0 and isinstance(layers[li - 1], _Conv):
                c = layers[li - 1]
                dx = dx.reshape(t_len, c.out_ch, *c.out_hw)
        grads[layers[li].name + ".weight"], grads[layers[li].name + ".bias"] = gw, gb
    return stats, grads, extras
