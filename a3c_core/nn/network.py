"""Actor-critic networks over one flat parameter buffer, built from a layer list.

A network is ``encoder -> core -> heads`` (Sample Factory's shape): a list of
encoder layers (:class:`~a3c_core.nn.layers.Conv2d`, ``Dense``), an optional
``LSTM`` core and the policy/value ``Heads`` (see :mod:`a3c_core.nn.layers`;
each layer owns its layout entries, init, batched forward/backward, FLOP
count and reference twin).  ``net.layers`` is that list; the rollout path,
:func:`ref_forward_loss`, the FLOP counter (``a3c_core.bench.flops``),
gradcheck and the torch twin (``a3c_core.nn.torch_twin``) all iterate it.

From an observation to an action: three routes, one per purpose
----------------------------------------------------------------

1. **A training worker's agent step**: :meth:`Network.actor` ->
   :meth:`Actor.step_row` (:meth:`Actor.value` for the rollout's bootstrap).
   The raw frame's preprocessing (the Cython preprocessor's C entry point,
   :meth:`a3c_core.obs.ObsPipeline.c_entry`), the recorded fused step and the
   action's sampling run in ONE compiled GIL-free call,
   ``kernels.doom_act_packed``.  Fused doom step, float32 only; elsewhere
   ``actor()`` returns None and the worker takes route 2 with
   ``record=True``.  Bit for bit ``pipeline`` + ``step(record=True)`` +
   ``sample_categorical``.
2. **Everything else** (:class:`~a3c_core.policy.Policy`, ``a3c eval``, the
   non-fused specs, tests): :class:`~a3c_core.obs.ObsPipeline` writes the
   network input, then :meth:`Network.step` runs the forward
   (``kernels.doom_step_packed`` for the doom specs, per-layer kernels
   otherwise; ``record=True`` records a rollout row), and the caller samples.
3. **Spare act** (:meth:`Network.spare_act`): an unrecorded step through the
   worker's act kernel on one-step rows of its own.  Used by
   :meth:`Actor.value` and, with :attr:`Network.single_step_kernel` set (a
   training worker's network), by :meth:`Network.step`: a trainer's first run
   then compiles one fused kernel instead of two.

The fused kernels' arguments have one owner, the :class:`Network`:
:attr:`~Network.fused_packed` (constant: weight offsets into ``params``,
scratch) and :attr:`~Network.fused_rows` (the rollout's row arrays, rebuilt
when the workspace grows).  :class:`Actor`, in this module,
advances the network's recording cursor itself, as :meth:`Network.step`
does: a method call per step would be Python work on the hottest path.

Specs (``build_network(spec, obs_shape, n_actions, **kwargs)``; a spec is a
few lines in :data:`_SPEC_TABLE`):

* ``doom-lstm`` (images ``(C, H, W)``, H, W >= 20): conv1 16x8x8/4 + ELU,
  conv2 32x4x4/2 + ELU, flatten (PyTorch C,H,W order), fc 256 + ELU, LSTM
  256, policy dense 256->A + softmax, value dense 256->1.  kwargs:
  ``fc_size=256``, ``lstm_size=256``, ``activation='elu'``.
* ``doom-ff``: the same without the LSTM (kwargs ``fc_size``, ``activation``).
* ``atari-lstm`` (images ``(C, H, W)``, universe-starter-agent / pytorch-a3c,
  standard input ``(1, 42, 42)``): conv1..conv4 32x3x3/2 padding 1 + ELU
  (42->21->11->6->3), flatten (288), LSTM 256, heads.  kwargs
  ``lstm_size=256``, ``activation='elu'``.
* ``mlp-lstm`` (vectors ``(D,)``): ``fc1..fcN`` (``hidden=(64, 64)``) + ELU
  (or ``activation='relu'``), LSTM ``lstm_size=64``, heads.
* ``mlp``: the same without the LSTM.

Tensor names and shapes follow PyTorch (``conv1.weight (16,1,8,8)``,
``lstm.weight_ih (4H,in)``, gate order i,f,g,o, ``policy.weight (A,H)``,
``value.weight (1,H)``) so weights move both ways.

Initialisation (seeded ``np.random.default_rng(seed)``, drawn in float64 then
cast, so float32 and float64 nets with one seed agree; layers draw in layout
order): conv/dense weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
(PyTorch default); LSTM weights ``U(-1/sqrt(H), 1/sqrt(H))`` with ZERO biases
(no forget-bias offset, so a PyTorch LSTM gets the same function from these
weights); heads normalized-columns init (each output unit's weight row has
norm 0.01 for the policy, 1.0 for the value) with zero bias.

Execution:

* ``step`` (batch 1, once per env step): when the encoder is exactly
  conv(k % stride == 0, no padding) -> conv -> dense (the doom specs) the
  whole forward is ONE fused Numba call (``kernels.doom_step_packed``); otherwise
  one nogil kernel per encoder layer (``conv_act_rows``, ``dense_act_vec``)
  plus one for LSTM + heads.  All read the live weight views (nothing goes
  stale when params change) and write preallocated scratch: a step allocates
  only its outputs.  A NaN/inf observation raises ``ValueError`` (checked
  inside the compiled path).
* ``loss_and_grad`` (a rollout of T steps): every layer runs batched over T
  (conv/dense GEMMs in BLAS, which releases the GIL; im2col/col2im, bias +
  activation, the LSTM recurrence and BPTT, heads + A3C loss in Numba).
  Activations stay in per-layer workspace rows indexed by t; the workspace
  is preallocated per network and grown when a longer rollout arrives.
  The backward (of ``loss_and_grad`` and of ``rollout_grad``) is one nogil
  Numba call per layer (``kernels.conv_backward``, ``dense_backward``,
  ``lstm_backward``) whose GEMMs call numpy's own BLAS through
  :mod:`a3c_core.nn.blas`: the same arithmetic as the per-layer numpy path
  (``np.dot`` between kernels), bit for bit, with the GIL taken ~5 times
  per update instead of ~20 (:attr:`Network.compiled_backward`; the numpy
  path runs where numpy's BLAS entry point is not found).
* backward-only update (what a worker runs): ``begin_rollout(t_cap)``, then
  ``step(obs, state, record=True)`` per env step stores that step's
  activations as row t of the same workspace (obs, conv outputs, fc
  output, LSTM gates and cells; the fused path records inside
  ``kernels.doom_step_rec_packed``), and ``rollout_grad(actions, returns,
  advantages)`` runs the heads + loss and the backward only.  Within a
  rollout the params are fixed, so the recorded rows are the loss's
  forward: on the same rows the result is bit-for-bit ``loss_and_grad``'s
  (same backward code, ``record_rollout`` fills the rows by the batched
  forward for that test); batch-1 steps round differently from the BLAS
  forward (~1e-16 relative in float64, ~1e-7 in float32), and the recorded
  rows are the activations the policy acted on.  A plain ``step`` (the
  bootstrap) records nothing.
* a worker's agent step (fused doom step, float32): :meth:`Network.actor`
  gives an :class:`Actor` whose call preprocesses the raw frame (through
  the Cython preprocessor's C entry point), records the step and samples
  the action in ONE compiled call (``kernels.doom_act_packed``), bit for
  bit ``pipeline`` + ``step(record=True)`` + ``sample_categorical``.

Threads: a Network's scratch is not shared-safe.  Use ONE Network object per
thread; :meth:`Network.fork` gives another thread its own scratch over the
SAME parameter buffer (views, no copy).
"""
from __future__ import annotations

import numpy as np

from . import blas
from .batch import BATCH_MIN_ROWS, BatchStepper
from . import kernels as K
from .layers import LSTM, Conv2d, Dense, Heads
from .layout import ParamLayout
from ..specs import SPEC_TABLE as _SPEC_TABLE   # name -> (encoder, recurrent, defaults)
from ..specs import SPECS, spec_options  # noqa: F401  (re-exported)


# conv stacks: (name, out_channels, kernel, stride, padding)
_CONV_STACKS = {
    "doom": (("conv1", 16, 8, 4, 0), ("conv2", 32, 4, 2, 0)),
    "atari": tuple((f"conv{i}", 32, 3, 2, 1) for i in range(1, 5)),
}


def _spec_error(msg):
    return ValueError(f"{msg}; valid specs: {', '.join(SPECS)} "
                      "(doom-* take image obs_shape (C, H, W) with H, W >= 20, atari-lstm "
                      "any (C, H, W) (standard (1, 42, 42)); mlp* take vector obs_shape (D,))")


def _resolve_kwargs(name, kwargs):
    defaults = _SPEC_TABLE[name][2]
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


def build_layers(name, obs_shape, n_actions, kw):
    """``(encoder list, core LSTM or None, heads)`` of spec ``name``."""
    family, recurrent, _ = _SPEC_TABLE[name]
    act = kw["activation"]
    encoder = []
    if family in _CONV_STACKS:
        if len(obs_shape) != 3 or min(obs_shape) < 1:
            raise _spec_error(f"spec {name!r} needs an image obs_shape (C, H, W), "
                              f"got {obs_shape}")
        stack = _CONV_STACKS[family]
        shape = obs_shape
        for i, (cname, out_ch, k, s, pad) in enumerate(stack):
            conv = Conv2d(cname, shape, out_ch, k, s, pad, act, nchw_in=(i == 0),
                          flatten_out=(i == len(stack) - 1))
            if min(conv.out_hw) < 1:
                raise _spec_error(
                    f"spec {name!r}: obs_shape {obs_shape} is too small for {cname} "
                    f"({k}x{k} stride {s} padding {pad} on a {shape[1]}x{shape[2]} map)")
            encoder.append(conv)
            shape = conv.out_shape
        n_in = encoder[-1].n_out
        if "fc_size" in kw:
            encoder.append(Dense("fc", n_in, kw["fc_size"], act))
    else:
        if len(obs_shape) != 1 or obs_shape[0] < 1:
            raise _spec_error(f"spec {name!r} needs a vector obs_shape (D,), "
                              f"got {obs_shape}")
        n_in = obs_shape[0]
        for i, h in enumerate(kw["hidden"], 1):
            encoder.append(Dense(f"fc{i}", n_in, h, act))
            n_in = h
    n_feat = encoder[-1].n_out
    core = LSTM(n_feat, kw["lstm_size"]) if recurrent else None
    heads = Heads(core.hidden if core else n_feat, n_actions)
    return encoder, core, heads


def _pack_doom_static(static, params):
    """The fused step's static arguments (weight views, scratch, strides, in
    :data:`~a3c_core.nn.kernels.DOOM_STATIC_FLOATS` order) -> ``(params, scratch, offs1, meta, ints)``
    for ``kernels.doom_step_packed`` (see there): every float array that is a
    contiguous view of ``params`` is addressed there; the others (scratch,
    the zero LSTM stand-ins of a feed-forward net) move into one new scratch
    arena (64-byte aligned slots, contents copied)."""
    floats = [static[i] for i in K.DOOM_STATIC_FLOATS]
    meta = np.zeros((len(floats), 6), np.int64)
    base = params.ctypes.data
    end = base + params.nbytes
    item = params.itemsize
    slots, size = [], 0
    for i, a in enumerate(floats):
        if a.dtype != params.dtype or not a.flags.c_contiguous or a.ndim > 4:
            raise ValueError(f"fused step static array {i} cannot be packed")
        dims = tuple(a.shape) + (1,) * (4 - a.ndim)
        meta[i, 2:] = dims
        p0 = a.ctypes.data
        if base <= p0 and p0 + a.nbytes <= end and a.size:
            meta[i, :2] = (0, (p0 - base) // item)
        else:
            meta[i, :2] = (1, size)
            slots.append((i, size))
            size += -(-max(a.size, 1) // 16) * 16
    scratch = np.zeros(max(size, 16), params.dtype)
    for i, off in slots:
        scratch[off:off + floats[i].size] = floats[i].ravel()
    ints = np.array([int(static[i]) for i in K.DOOM_STATIC_INTS], np.int64)
    return (params, scratch, static[K.DOOM_STATIC_OFFS], meta, ints)


def _fused_doom_step_fits(encoder):
    """The layer list the fused step computes: conv (k % stride == 0, no
    padding) -> conv (no padding) -> dense, same activation."""
    if len(encoder) != 3 or [L.kind for L in encoder] != ["conv", "conv", "dense"]:
        return False
    c1, c2, d = encoder
    return (c1.k % c1.stride == 0 and c1.pad == 0 and c2.pad == 0
            and c2.n_col >= K.SHORT_K and c1.act == c2.act == d.act)


def _done_mask(done, n) -> np.ndarray:
    """``done`` as a bool ``(n,)`` mask: bools, or integers that are all 0 or 1.
    ValueError naming ``done`` for anything else: a float mask (``0.5`` is no
    answer to "did the episode end?"), other integers, another shape."""
    arr = np.asarray(done)
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in "iu":
            example = f" (e.g. {arr.ravel()[0]})" if arr.size else ""
            raise ValueError(f"done must be booleans (or 0/1 integers), got dtype {arr.dtype}"
                             + example
                             + "; pass e.g. terminated | truncated")
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            raise ValueError(f"done must be booleans (or 0/1 integers), got {arr.ravel()[i]} "
                             f"at index {i}")
        arr = arr.astype(bool)
    if arr.shape != (n,):
        raise ValueError(f"done must be {n} booleans (one per observation), "
                         f"got shape {arr.shape}")
    return arr


class Network:
    """An actor-critic network; see the module docstring.

    Attributes: ``params``/``grads`` (flat, ``dtype``; copy into them, never
    rebind), ``layout``, ``spec`` (JSON-able), ``layers`` (encoder + core +
    heads), ``encoder``, ``core``, ``heads``, ``n_params``, ``dtype``,
    ``obs_shape``, ``n_actions``, ``recurrent``, ``lstm_size``.

    The fused doom step's kernel arguments (None for other specs; read-only:
    the kernels' calls are built from them, see the module docstring):

    * ``fused_packed``: the fused step's constant arguments (weight views,
      scratch, strides) packed as ``(params, scratch, offs1, meta,
      ints)`` for ``doom_step_packed``, ``doom_step_rec_packed`` and
      ``doom_act_packed`` (fewer arguments: less of Numba's dispatch, paid
      with the GIL held);
    * ``fused_rows``: the rollout's row arrays the recording kernels write
      (``doom_step_rec*``, ``doom_act_packed``); None before the first
      :meth:`begin_rollout`, replaced when the workspace grows.

    One Network object per thread: ``step``/``loss_and_grad`` use the
    object's scratch.  Use :meth:`fork` for another thread.
    """

    #: fused (doom) step only: run unrecorded steps with the worker's act
    #: kernel (``kernels.doom_act_packed``, see :meth:`actor`) too, writing
    #: one-step rows of their own.  A training worker records every step
    #: through its :class:`Actor`; with this set, a trainer's first run compiles
    #: one step kernel instead of two (docs/results.md has the compile
    #: times).  Inference (Policy) keeps the plain kernel, which copies nothing.
    single_step_kernel = False

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
        self.encoder, self.core, self.heads = build_layers(name, obs_shape, n_actions, kw)
        self.layers = self.encoder + ([self.core] if self.core else []) + [self.heads]
        self.recurrent = self.core is not None
        self.lstm_size = self.core.hidden if self.core else 0
        self.n_features = self.encoder[-1].n_out
        self.layout = ParamLayout(e for L in self.layers for e in L.param_shapes())
        self._setup_buffers(self.layout.new_flat(self._dtype))
        rng = np.random.default_rng(seed)
        for layer in self.layers:
            layer.init(self._p, rng)

    def _setup_buffers(self, params):
        """Every per-object buffer (grads, scratch, workspace) is made here,
        over the parameter buffer ``params`` (shared by forks)."""
        self._params = params
        self._grads = self.layout.new_flat(self._dtype)
        self._p = self.layout.views(self._params)
        self._g = self.layout.views(self._grads)
        self._build_step()
        self._ws = None
        self._ws_gen = 0
        self._ws_t = 0
        self._last_t = 0
        self._obs_rows = None     # (t_cap, *obs_shape): the recorded observations
        self.fused_rows = None    # the fused kernels' rollout row arrays (see the class doc)
        self._rec_t = -1          # recorded rows (-1: no recording in progress)
        self._rec_resets = 0      # recorded steps that started a new segment (state reset)
        self._rec_state = None    # the state the last recorded step returned
        self._n_seq = 1           # sequences of the recording, time-major (begin_batch_rollout)
        self._tick = None         # record_tick's per-rollout views and scratch
        # (gemm addresses, ints): the backward runs one nogil call per layer
        self._bl = blas.gemm_handle()
        self._bw_calls = {}       # (T, resets) -> the backward-only update's plan (_rollout_plan)
        self._batch = None        # step_batch's scratch (BatchStepper), made on first use

    @property
    def compiled_backward(self) -> bool:
        """True when the batched backward (``loss_and_grad``, ``rollout_grad``)
        runs one compiled nogil call per layer, its GEMMs in numpy's BLAS
        through :mod:`a3c_core.nn.blas`; False: the same arithmetic through
        ``np.dot`` and per-layer kernels (bit-for-bit the same gradients).
        False where numpy's BLAS entry point was not found (or with
        ``A3C_NUMPY_BACKWARD=1``).  Settable to False (and back) to compare."""
        return self._bl is not None

    @compiled_backward.setter
    def compiled_backward(self, on):
        self._bw_calls = {}
        if not on:
            self._bl = None
            return
        handle = blas.gemm_handle()
        if handle is None:
            raise RuntimeError("compiled_backward: numpy's BLAS gemm entry point was not "
                               "found (see a3c_core.nn.blas); the numpy backward runs")
        self._bl = handle

    def fork(self) -> "Network":
        """A new Network over the SAME ``params`` buffer (no copy: an update
        through either is seen by both) with its own grads and scratch, for
        use from another thread."""
        twin = object.__new__(Network)
        twin.__dict__.update(self.__dict__)
        twin._setup_buffers(self._params)
        twin._bl = self._bl             # the same backward path as this network
        return twin

    # ------------------------------------------------------------------ build
    def _build_step(self):
        """Preallocate batch-1 scratch and the constant argument tuples."""
        dt, p = self._dtype, self._p
        hd = max(self.lstm_size, 1)
        self._gates1 = np.empty(4 * hd, dt)
        if self.recurrent:
            lstm = self.core.step_args(p)
            self._dummy_h = None
        else:
            lstm = (np.zeros((4, 1), dt), np.zeros((4, 1), dt), np.zeros(4, dt), np.zeros(4, dt))
            self._dummy_h = np.zeros(1, dt)
        heads = self.heads.step_args(p)
        self._fused = _fused_doom_step_fits(self.encoder)
        if self._fused:
            c1, c2, d = self.encoder
            xs1, acc1, offs1, wtab1 = K.conv_s2d_shapes(c1.in_shape, c1.out_ch, c1.k, c1.stride)
            y1 = np.empty(c1.out_shape, dt)
            cols2 = np.empty((c2.n_pix, c2.n_col), dt)
            y2 = np.empty(c2.out_shape, dt)
            feat = np.empty(d.n_out, dt)
            static = (
                p[c1.name + ".weight"], p[c1.name + ".bias"], c1.stride, np.empty(xs1, dt),
                np.empty(acc1, dt), np.empty(offs1, np.int64), np.empty(wtab1, dt), y1,
                p[c2.name + ".weight"], p[c2.name + ".bias"], c2.stride, cols2, y2,
                p[d.name + ".weight"], p[d.name + ".bias"], feat, K.ACT_CODES[d.act],
                self.recurrent, *lstm, self._gates1, *heads)
            self.fused_packed = _pack_doom_static(static, self._params)
            self._spare_static = None
        else:
            self.fused_packed = None
            self._step_chain = [L.step_call(p, dt) for L in self.encoder]
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
    def fused_step(self) -> bool:
        """True when ``step`` runs the one fused ``kernels.doom_step_packed`` call."""
        return self._fused

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

    @property
    def param_views(self) -> dict:
        """``name -> view`` of params: the network's own mapping, not a copy
        (what the layers' kernels read; :meth:`state_dict` copies it)."""
        return self._p

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
    def step(self, obs, state, record=False):
        """One observation ``obs_shape`` -> ``(probs (A,), value float, new_state)``.

        ``new_state`` is a new ``(h, c)`` tuple (LSTM) or ``None``; the input
        state is never modified.  Raises ``ValueError`` when ``obs`` holds a
        NaN or inf (before anything is computed).  ``record=True`` (after
        :meth:`begin_rollout`) also stores this step's activations as the
        next rollout row for :meth:`rollout_grad`.  A recorded step
        continues the previous one only when given the very ``new_state``
        object that step returned; any other state (``initial_state()`` at an
        episode boundary, or a copy) starts a new segment, and the backward
        lets no gradient flow into the steps before it.
        """
        dt = self._dtype
        if not (type(obs) is np.ndarray and obs.dtype == dt and obs.flags.c_contiguous):
            obs = np.ascontiguousarray(obs, dtype=dt)
        if obs.shape != self.obs_shape:
            # no reshape: (84, 84, 1) has the size of (1, 84, 84) but not its layout
            raise ValueError(f"obs must have shape {self.obs_shape}, got {obs.shape}")
        probs = np.empty(self.n_actions, dt)
        if self.recurrent:
            if record and state is self._rec_state and state is not None:
                h, c = state       # the previous recorded step's own output arrays
            else:
                h, c = self._state_arrays(state)
            h_out = np.empty_like(h)
            c_out = np.empty_like(c)
            new_state = (h_out, c_out)
        else:
            h = c = h_out = c_out = self._dummy_h
            new_state = None
        if record:
            value = self._step_record(obs, h, c, h_out, c_out, probs,
                                      self.recurrent and state is not self._rec_state)
            self._rec_state = new_state
        elif self._fused:
            if self.single_step_kernel:
                value = self.spare_act(obs, h, c, h_out, c_out, probs)
            else:
                value = K.doom_step_packed(obs, h, c, h_out, c_out, probs, *self.fused_packed)
            if value != value and not K.all_finite(obs):    # NaN value: bad input?
                raise _bad_obs()
        else:
            if not K.all_finite(obs):
                raise _bad_obs()
            x = obs
            for kern, args, out in self._step_chain:
                kern(x, *args)
                x = out
            value = K.core_heads_step(x, *self._core_static, h, c, self._gates1, h_out, c_out,
                                      *self._heads_static, probs)
        return probs, value, new_state

    def initial_batch_state(self, n):
        """``(h, c)`` zeros of shape ``(n, H)`` for :meth:`step_batch` (None without an LSTM)."""
        if not self.recurrent:
            return None
        n = int(n)
        return (np.zeros((n, self.lstm_size), self._dtype),
                np.zeros((n, self.lstm_size), self._dtype))

    def batch_state(self, state, n, done=None):
        """``state`` checked as ``n`` rows for :meth:`step_batch`: ``(h, c)``
        contiguous ``(n, H)`` arrays of ``dtype`` (copies where needed, never
        the caller's arrays when a row is reset), rows where ``done`` is true
        zeroed.  ValueError naming the mismatch."""
        if not self.recurrent:
            if state is not None:
                raise ValueError(f"this {self.spec['name']!r} network has no recurrent state; "
                                 f"pass state=None")
            return None
        if state is None:
            return self.initial_batch_state(n)
        try:
            h, c = state
        except (TypeError, ValueError):
            raise ValueError("state must be a pair (h, c) of (N, H) arrays") from None
        want = (n, self.lstm_size)
        hs, cs = np.shape(h), np.shape(c)
        if hs != want or cs != want:
            raise ValueError(f"the state does not match the batch: h {hs} and c {cs}, expected "
                             f"{want} ({n} observations, LSTM size {self.lstm_size})")
        if done is not None:
            done = _done_mask(done, n)
        dt = self._dtype
        copy = done is not None and bool(np.any(done))
        h = np.array(h, dtype=dt, order="C", copy=copy or None)
        c = np.array(c, dtype=dt, order="C", copy=copy or None)
        if copy:
            h[done] = 0
            c[done] = 0
        return h, c

    def step_batch(self, obs, state=None, done=None):
        """``N`` agents, one step each: ``obs`` ``(N, *obs_shape)`` ->
        ``(probs (N, A), values (N,), new_state)``.

        ``state`` is ``(h, c)`` of ``(N, H)`` rows (None: zeros; None always
        for feed-forward specs); ``done`` an optional bool ``(N,)`` mask of
        rows whose state is reset to zeros first (a new episode); 0/1
        integers are taken too, anything else (a float mask) is a ValueError.  The input
        state is never modified; ``new_state`` is new arrays.  Row ``i``
        equals ``step(obs[i], (h[i], c[i]))`` to float32 rounding.  Raises
        ValueError for a wrong shape, a state that does not match the batch,
        or a NaN/inf observation (naming the first such row) before anything
        is computed.  See :mod:`a3c_core.nn.batch`."""
        dt = self._dtype
        obs = np.asarray(obs)
        if obs.ndim != len(self.obs_shape) + 1 or obs.shape[1:] != self.obs_shape:
            raise ValueError(f"obs must have shape (N, {', '.join(map(str, self.obs_shape))}), "
                             f"got {obs.shape}")
        n = obs.shape[0]
        if n < 1:
            raise ValueError("step_batch needs at least one observation")
        if not (obs.dtype == dt and obs.flags.c_contiguous):
            obs = np.ascontiguousarray(obs, dtype=dt)
        if done is not None:
            done = _done_mask(done, n)
        if not K.all_finite(obs):
            bad = int(np.flatnonzero(~np.isfinite(obs.reshape(n, -1)).all(axis=1))[0])
            raise ValueError(f"observation row {bad} contains NaN or inf; refusing to step "
                             f"the network (it would poison that agent's LSTM state)")
        st = self.batch_state(state, n, done)
        probs = np.empty((n, self.n_actions), dt)
        values = np.empty(n, dt)
        if self.recurrent:
            h, c = st
            h_out, c_out = np.empty_like(h), np.empty_like(c)
            new_state = (h_out, c_out)
        else:
            h = c = h_out = c_out = None
            new_state = None
        if n < BATCH_MIN_ROWS:      # the batch-1 step per row measures faster here
            for i in range(n):
                st1 = None if h is None else (h[i], c[i])
                probs[i], values[i], out = self.step(obs[i], st1)
                if out is not None:
                    h_out[i], c_out[i] = out
            return probs, values, new_state
        stepper = self._batch
        if stepper is None:
            stepper = self._batch = BatchStepper(self)
        stepper(obs, h, c, probs, values, h_out, c_out)
        return probs, values, new_state

    def spare_act(self, obs, h, c, h_out, c_out, probs, raw=None, fn=0, ctx=0):
        """An unrecorded fused step through the worker's act kernel
        (:attr:`single_step_kernel`, :meth:`Actor.value`), on one-step rows of
        its own (``raw``/``fn``/``ctx``: a frame to preprocess into ``obs``
        first, see :class:`Actor`).  Returns the value, NaN for a non-finite
        obs; writes probs and, when given, h_out and c_out."""
        rows = self._spare_rows()
        acts, vals, no_raw = self._spare_av
        a = K.doom_act_packed(0, no_raw if raw is None else raw, fn, ctx, obs, h, c, False,
                              probs, *self.fused_packed, *rows, 0.5, acts, vals)
        if a == -2:
            raise MemoryError("preprocess scratch row")
        if a < 0:
            return np.nan
        if self.recurrent and h_out is not None:
            h_out[:] = rows[5][1]
            c_out[:] = rows[6][1]
        return float(vals[0])

    def _spare_rows(self):
        """One-step rows of its own for an unrecorded fused step that runs the
        act kernel (:attr:`single_step_kernel`, :meth:`Actor.value`); never the
        rollout's."""
        if self._spare_static is None:
            self._spare_av = (np.zeros(1, np.int64), np.zeros(1, self._dtype),
                              np.zeros(1, np.uint8))
            dt = self._dtype
            ws1, ws2, wsd = (L.workspace(1, dt) for L in self.encoder)
            if self.recurrent:
                cws = self.core.workspace(1, dt)
                lstm = (cws["gates"], cws["hs"], cws["cs"])
            else:
                lstm = (np.empty((1, 4), dt), np.empty((2, 1), dt), np.empty((2, 1), dt))
            self._spare_static = (np.empty((1,) + self.obs_shape, dt), ws1["z"], ws2["flat"],
                                  wsd["y"], *lstm)
        return self._spare_static

    def _step_record(self, obs, h, c, h_out, c_out, probs, new_state):
        """``step`` body that also writes rollout row ``t``; returns the value.

        ``new_state``: the input state is not the previous recorded step's
        output (recurrent nets): from the second row on, this step starts a
        new segment (an episode boundary inside the rollout).  The kernels
        write the input state into ``hs[t]``/``cs[t]``, which hold the
        previous step's output; for such a step the input goes to the
        ``hin``/``cin`` rows instead and the output rows are put back."""
        t = self._record_slot()
        reset = new_state and t > 0
        if reset:
            self._keep_row_state(t)
        if self._fused:
            value = K.doom_step_rec_packed(t, obs, h, c, h_out, c_out, probs, *self.fused_packed,
                                           *self.fused_rows)
            if value != value and not K.all_finite(obs):
                raise _bad_obs()
            if reset:
                self._mark_reset(t)
            self._rec_t = t + 1
            return value
        if not K.all_finite(obs):
            raise _bad_obs()
        ws = self._ws
        K.record_row(obs, self._obs_rows.reshape(self._ws_t, -1), t)
        x = obs
        for (kern, args, out), layer, lws in zip(self._step_chain, self.encoder, ws):
            kern(x, *args)
            layer.record(lws, t, out)
            x = out
        if self.recurrent:
            cws = ws[len(self.encoder)]
            value = K.core_heads_step(x, *self._core_static, h, c, cws["gates"][t], h_out, c_out,
                                      *self._heads_static, probs)
            K.record_state(h, c, h_out, c_out, cws["hs"], cws["cs"], t)
            if reset:
                self._mark_reset(t)
        else:
            value = K.core_heads_step(x, *self._core_static, h, c, self._gates1, h_out, c_out,
                                      *self._heads_static, probs)
        self._rec_t = t + 1
        return value

    # ----------------------------------------------------- fused agent step
    def actor(self, pipeline, actions, values):
        """A :class:`Actor` for a worker: each agent step (the frame's
        preprocessing, the recorded step, the sampling) in one compiled
        GIL-free call (``kernels.doom_act_packed``), or None where this
        network or ``pipeline`` has no such call: a step that is not the
        fused doom step, a float64 network, or a pipeline that is not an
        image pipeline writing this network's input shape.  ``actions``
        (int64) and ``values`` (float32) are the worker's rollout arrays the
        steps write into."""
        if not self._fused or self._dtype != np.float32:
            return None
        entry = (0, 0)                  # no pipeline: an Actor for preprocessed inputs only
        if pipeline is not None:
            entry = pipeline.c_entry()
            if entry is None or tuple(pipeline.net_obs_shape) != self.obs_shape:
                return None
        return Actor(self, pipeline, actions, values, entry)

    def recorded_state(self):
        """The state the last recorded step returned, as new arrays ``(h, c)``
        (None for a feed-forward network or before any recorded step)."""
        t = self._rec_t
        if not self.recurrent or t < 1:
            return None
        cws = self._ws[len(self.encoder)]
        if self._n_seq > 1:         # (K, H): each sequence's last output
            k = self._n_seq
            return cws["hs"][t:t + k].copy(), cws["cs"][t:t + k].copy()
        return cws["hs"][t].copy(), cws["cs"][t].copy()

    def _keep_row_state(self, t):
        """Before a step that starts a new segment at row ``t``: save the
        previous step's output (``hs[t]``/``cs[t]``, which the kernel
        overwrites with the new input state) for :meth:`_mark_reset`."""
        cws = self._ws[len(self.encoder)]
        cws["tmp"][0] = cws["hs"][t]
        cws["tmp"][1] = cws["cs"][t]

    def _mark_reset(self, t):
        """Flag row ``t`` as a reset step: move the input state the kernel
        wrote into ``hs[t]``/``cs[t]`` to ``hin[t]``/``cin[t]`` and put the
        previous step's output (saved in ``tmp``) back.  The flags of a
        recording start cleared (``begin_rollout``)."""
        cws = self._ws[len(self.encoder)]
        cws["reset"][t] = True
        cws["hin"][t] = cws["hs"][t]
        cws["cin"][t] = cws["cs"][t]
        cws["hs"][t] = cws["tmp"][0]
        cws["cs"][t] = cws["tmp"][1]
        self._rec_resets += 1

    # ---------------------------------------------------------- rollout path
    def _workspace(self, t_len):
        """Grow the rollout scratch to hold ``t_len`` steps (one dict per layer)."""
        if t_len <= self._ws_t:
            return
        t_cap = max(t_len, 20)
        dt = self._dtype
        self._ws = [layer.workspace(t_cap, dt) for layer in self.layers]
        self._ws_gen += 1                # record_tick's views of the old rows are stale
        self._bw_calls = {}             # their arguments were views of the old rows
        self._ws_t = t_cap
        self._rec_t = -1                # a recording does not survive a regrow
        self._obs_rows = np.empty((t_cap,) + self.obs_shape, dt)
        if self._fused:
            ws1, ws2, wsd = self._ws[:3]
            if self.recurrent:
                cws = self._ws[3]
                lstm = (cws["gates"], cws["hs"], cws["cs"])
            else:
                lstm = (np.empty((t_cap, 4), dt), np.empty((t_cap + 1, 1), dt),
                        np.empty((t_cap + 1, 1), dt))
            self.fused_rows = (self._obs_rows, ws1["z"], ws2["flat"], wsd["y"], *lstm)

    # ------------------------------------------------------ recorded rollout
    def begin_rollout(self, t_cap=20) -> None:
        """Start recording a rollout of at most ``t_cap`` steps: each
        ``step(obs, state, record=True)`` then stores row ``t`` (0, 1, ...)
        of the activations the backward reads (obs, conv/fc outputs, LSTM
        gates and cells, the input and output state) in this network's
        preallocated workspace, and :meth:`rollout_grad` runs only the
        backward over them.  The rollout must act with fixed parameters
        (that is what makes the recorded activations the loss's forward).
        A ``loss``/``loss_and_grad`` call ends the recording (it reuses the
        rows)."""
        t_cap = int(t_cap)
        if t_cap < 1:
            raise ValueError(f"begin_rollout: t_cap must be >= 1, got {t_cap}")
        self._workspace(t_cap)
        self._n_seq = 1
        self._rec_t = 0
        if self._rec_resets:
            self._ws[len(self.encoder)]["reset"][:] = False
        self._rec_resets = 0
        self._rec_state = None

    def begin_batch_rollout(self, t_max, n_seq) -> None:
        """Start recording a rollout of ``n_seq`` (K) sequences in lockstep,
        at most ``t_max`` ticks: tick t's K rows are rows ``t*K .. t*K+K-1``
        (time-major), each written by one :meth:`record_tick` over the K
        rows, and :meth:`rollout_grad` then runs one backward over all
        ``T*K`` rows, BPTT per sequence (the batched worker).  The inputs
        of tick t go into :meth:`tick_inputs` ``(t)`` before the call.  The
        rollout acts with fixed parameters, as :meth:`begin_rollout`'s."""
        t_max, k = int(t_max), int(n_seq)
        if t_max < 1 or k < 1:
            raise ValueError(f"begin_batch_rollout: t_max and n_seq must be >= 1, got "
                             f"{t_max} and {k}")
        # hs/cs hold K input rows before the first tick's outputs
        self._workspace(t_max * k + k - 1)
        self._rec_t = 0
        self._n_seq = k
        if self._rec_resets:
            self._ws[len(self.encoder)]["reset"][:] = False
        self._rec_resets = 0
        self._rec_state = None
        tick = self._tick
        if tick is None or tick["ws_gen"] != self._ws_gen or tick["k"] != k:
            tick = self._tick = self._tick_setup(k)
        for layer, w in zip(self.encoder, tick["w_direct"]):     # this rollout's weights
            layer.direct_weight(self._p, w)

    def _tick_setup(self, k):
        """:meth:`record_tick`'s scratch for K rows per tick: the direct convs'
        weights, the LSTM's carried-gradient rows, the gate-sum scratch."""
        from a3c_core.nn.batch import DIRECT_CONV
        dt = self._dtype
        convs = [L for L in self.encoder if L.kind == "conv"]
        direct = bool(convs) and DIRECT_CONV and all(L.direct_ok(dt) for L in convs)
        tick = {"ws_gen": self._ws_gen, "k": k, "n_conv": len(convs),
                "w_direct": [L.direct_weight(self._p) for L in convs] if direct else [],
                "probs": np.empty((k, self.n_actions), dt), "values": np.empty(k, dt),
                "views": {}}
        if self.recurrent:
            cws = self._ws[len(self.encoder)]
            hd = self.lstm_size
            cws["dseq_h"] = np.zeros((k, hd), dt)
            cws["dseq_c"] = np.zeros((k, hd), dt)
            tick["tmp"] = np.empty((k, 4 * hd), dt)
            tick["h_in"] = np.empty((k, hd), dt)
            tick["c_in"] = np.empty((k, hd), dt)
        return tick

    def _tick_ws(self, i, layer, row):
        """Layer ``i``'s workspace as views that start at rollout row ``row``
        (its per-row arrays offset, its per-layer ones as they are)."""
        key = (i, row)
        views = self._tick["views"]
        v = views.get(key)
        if v is None:
            lws = self._ws[i]
            per_pix = {"cols", "z", "dz"} | (set() if getattr(layer, "flatten_out", True)
                                              else {"dy"})
            v = {}
            for name, arr in lws.items():
                if name in ("gw", "w_ijc"):
                    v[name] = arr
                elif name in per_pix and layer.kind == "conv":
                    v[name] = arr[row * layer.n_pix:]
                else:
                    v[name] = arr[row:]
            views[key] = v
        return v

    def tick_inputs(self, t):
        """The ``(K, *obs_shape)`` input rows of tick ``t`` of the batched
        recording (write the K preprocessed observations here, then call
        :meth:`record_tick`)."""
        k = self._n_seq
        return self._obs_rows[t * k:(t + 1) * k]

    def record_tick(self, t, state=None, reset=None):
        """One forward over tick ``t``'s K rows (:meth:`tick_inputs`),
        recorded for the backward: returns ``(probs (K, A), values (K,))``
        (scratch views, valid until the next tick).

        ``state``: the K input states ``(h, c)`` ``(K, H)`` at ``t == 0``
        (ignored after; rows of sequences that start an episode must be
        zeros).  ``reset``: at ``t > 0``, a bool ``(K,)`` mask of rows that
        start a new episode: their input state is zeros and no gradient
        flows into the sequence's earlier rows.  Raises ValueError for a
        non-finite observation row (naming it) before anything is computed.
        The rows equal :meth:`step_batch`'s to float32 rounding."""
        k = self._n_seq
        r0 = t * k
        if t < 0 or r0 != self._rec_t or r0 + k > self._ws_t:
            raise RuntimeError(f"record_tick: tick {t} is not the next one of the batched "
                               f"recording ({self._rec_t} rows recorded, K = {k}); call "
                               "begin_batch_rollout() first")
        x = self._obs_rows[r0:r0 + k]
        if not K.all_finite(x):
            bad = int(np.flatnonzero(~np.isfinite(x.reshape(k, -1)).all(axis=1))[0])
            raise ValueError(f"observation row {bad} contains NaN or inf; refusing to step "
                             f"the network (it would poison that agent's LSTM state)")
        tick, p = self._tick, self._p
        nc = tick["n_conv"]
        w_direct = tick["w_direct"]
        if nc:
            from a3c_core.nn.batch import CONV_CHUNK
            for s in range(0, k, CONV_CHUNK):
                e = min(k, s + CONV_CHUNK)
                y = x[s:e]
                for i in range(nc):
                    layer = self.encoder[i]
                    lws = self._tick_ws(i, layer, r0 + s)
                    if w_direct:
                        y = layer.forward_direct(lws, p, y, e - s, w_direct[i])
                    else:
                        y = layer.forward(lws, p, y, e - s)
            x = self.encoder[nc - 1].out_rows(self._tick_ws(nc - 1, self.encoder[nc - 1], r0), k)
        for i in range(nc, len(self.encoder)):
            layer = self.encoder[i]
            x = layer.forward_rows(self._tick_ws(i, layer, r0), p, x, k)
        x = x.reshape(k, self.n_features)
        probs, values = tick["probs"], tick["values"]
        heads = self.heads.step_args(p)
        if not self.recurrent:
            K.core_heads_rows(x, False, heads[1], heads[1], x, x, x, *heads, probs, values)
            self._rec_t = r0 + k
            return probs, values
        cws = self._ws[len(self.encoder)]
        hs, cs = cws["hs"], cws["cs"]
        if t == 0:
            if state is None:
                hs[:k] = 0
                cs[:k] = 0
            else:
                h, c = state
                if np.shape(h) != (k, self.lstm_size) or np.shape(c) != (k, self.lstm_size):
                    raise ValueError(f"record_tick: the state must be two ({k}, "
                                     f"{self.lstm_size}) arrays, got {np.shape(h)} and "
                                     f"{np.shape(c)}")
                hs[:k] = h
                cs[:k] = c
            h_in, c_in = hs[:k], cs[:k]
        else:
            h_in, c_in = hs[r0:r0 + k], cs[r0:r0 + k]
            if reset is not None and reset.any():
                # the rows' input state is zeros (hin/cin); hs/cs keep the
                # previous tick's outputs, which its backward reads
                hi, ci = tick["h_in"], tick["c_in"]
                hi[...] = h_in
                ci[...] = c_in
                hi[reset] = 0
                ci[reset] = 0
                h_in, c_in = hi, ci
                cws["reset"][r0:r0 + k] = reset
                cws["hin"][r0:r0 + k] = hi
                cws["cin"][r0:r0 + k] = ci
                self._rec_resets += int(np.count_nonzero(reset))
        w_ih, w_hh, b_ih, b_hh = self.core.step_args(p)
        gates = cws["gates"][r0:r0 + k]
        # the gate sums as W @ rows.T (numpy's sgemm: ~2x x @ W.T's speed at
        # 8-16 rows, see Dense.forward_rows), transposed into the rows
        gt = np.dot(w_ih, x.T)
        gt += np.dot(w_hh, h_in.T)
        gates[...] = gt.T
        K.core_heads_rows(gates, True, b_ih, b_hh, c_in, hs[r0 + k:r0 + 2 * k],
                          cs[r0 + k:r0 + 2 * k], *heads, probs, values)
        self._rec_t = r0 + k
        return probs, values

    @property
    def recorded_steps(self) -> int:
        """Rows recorded since :meth:`begin_rollout` (0 when none is in progress)."""
        return max(self._rec_t, 0)

    @property
    def recorded_obs(self):
        """``(T, *obs_shape)`` view of the observations recorded since
        :meth:`begin_rollout` (scratch, valid until the next recording)."""
        return self._obs_rows[:self.recorded_steps] if self._obs_rows is not None else None

    def _record_slot(self):
        t = self._rec_t
        if t < 0:
            raise RuntimeError("step(record=True) needs begin_rollout() first "
                               "(or a loss/loss_and_grad call ended the recording)")
        if t >= self._ws_t:
            raise RuntimeError(f"step(record=True): the rollout is full ({self._ws_t} steps "
                               f"recorded); call begin_rollout(t_cap) with a larger t_cap")
        return t

    def record_rollout(self, obs, state=None) -> None:
        """Record the rows of a whole rollout ``obs`` ``(T, *obs_shape)`` from
        ``state`` with the batched forward (BLAS) instead of T steps: the
        rows ``loss_and_grad`` would compute.  A worker records its
        rollouts with ``step(..., record=True)`` and replays kept episodes
        (self-imitation) with this."""
        obs, t_len = self._check_obs(obs)
        h0 = c0 = None
        if self.recurrent:
            h0, c0 = self._state_arrays(state)
        self._workspace(t_len)
        x = np.ascontiguousarray(obs, dtype=self._dtype)
        self._forward_encoder_core(x, h0, c0, t_len)
        self._obs_rows[:t_len] = x
        self._rec_t = t_len
        self._n_seq = 1
        if self._rec_resets:
            self._ws[len(self.encoder)]["reset"][:] = False
        self._rec_resets = 0

    def recorded_values(self) -> np.ndarray:
        """``(T,)`` the value head over the recorded rows (after
        :meth:`record_rollout`): what :meth:`rollout_grad`'s heads will
        compute, up to rounding, before its targets are chosen (a
        self-imitation update needs ``V`` to pick them)."""
        t_len = self._rec_t
        if t_len < 1:
            raise RuntimeError("recorded_values: no recorded rows; call record_rollout() first")
        _, _, top = self._recorded_rows(t_len)
        return top @ self._p["value.weight"][0] + self._p["value.bias"][0]

    def zero_recording(self, t_len) -> None:
        """Mark ``t_len`` all-zero rows as recorded, without a forward: for a
        compile helper that only needs :meth:`rollout_grad`'s kernels (the
        batched forward's are never a worker's)."""
        self.begin_rollout(t_len)
        for lws in self._ws:
            for arr in lws.values():
                arr[...] = 0
        self._obs_rows[...] = 0
        self._rec_t = int(t_len)
        self._n_seq = 1

    def rollout_grad(self, actions, returns, advantages, *, value_coef=0.5,
                     entropy_beta=0.01) -> dict:
        """The gradient of :meth:`loss_and_grad` over the recorded rollout,
        by the backward pass only (the forward is the recorded steps).

        actions int ``(T,)``, returns/advantages ``(T,)`` with T the number
        of recorded steps.  Gradients overwrite ``self.grads``; returns the
        stats dict of :meth:`loss_and_grad`; ``last_probs``/``last_values``/
        ``last_dstate`` are set as after ``loss_and_grad``.  Given the same
        activation rows the result is bit-for-bit ``loss_and_grad``'s (the
        same backward code runs); the rows of batch-1 steps differ from the
        batched forward's only by rounding (fused Numba kernels vs BLAS).
        """
        t_len = self._rec_t
        if t_len < 1:
            raise RuntimeError("rollout_grad: no recorded steps; call begin_rollout() and "
                               "step(obs, state, record=True) for each step first")
        actions, returns, advantages = self._check_targets(actions, returns, advantages, t_len)
        self._last_t = t_len
        compiled = self._bl is not None
        if compiled:
            # every argument but the targets is a fixed view of this network's
            # buffers: the heads' arguments and the backward's calls are built
            # once per (T, resets) and replayed (the Python that builds them
            # runs with the GIL held, on caches the kernels have just evicted)
            key = (t_len, self._rec_resets > 0, self._n_seq)
            plan = self._bw_calls.get(key)
            if plan is None:
                plan = self._bw_calls[key] = self._rollout_plan(t_len, key[1])
            pre, post, calls = plan
            out = K.heads_loss(*pre, actions, returns, advantages, float(value_coef),
                               float(entropy_beta), *post)
            for kern, args in calls:
                kern(*args)
            return self.heads.loss_stats(out, value_coef, entropy_beta)
        inputs, feat, top = self._recorded_rows(t_len, prepare=True)
        stats = self.heads.forward_loss(self._ws[-1], self._p, self._g, top, actions, returns,
                                        advantages, value_coef, entropy_beta, t_len)
        self._backward(inputs, feat, t_len, resets=self._rec_resets > 0)
        return stats

    def _recorded_rows(self, t_len, prepare=False):
        """``(inputs per encoder layer, feat, top)``: views of the recorded
        rows (``prepare``: the numpy backward's per-layer preparation too)."""
        ws, p = self._ws, self._p
        x = self._obs_rows[:t_len]
        inputs = []
        for layer, lws in zip(self.encoder, ws):
            inputs.append(x)
            if prepare:
                layer.prepare_backward(lws, p, x, t_len)
            x = layer.out_rows(lws, t_len)
        k = self._n_seq
        top = ws[len(self.encoder)]["hs"][k:t_len + k] if self.recurrent else x
        return inputs, x, top

    def _rollout_plan(self, t_len, resets):
        """The backward-only update's fixed part for ``t_len`` recorded rows:
        ``(heads_loss arguments before the targets, after the coefficients,
        [(kernel, args)] of the compiled backward)``, the convs preparing
        their im2col rows inside their calls."""
        inputs, feat, top = self._recorded_rows(t_len)
        pre, post = self.heads.loss_args(self._ws[-1], self._p, self._g, top, t_len)
        return pre, post, self._backward_calls(inputs, feat, t_len, resets, True)

    def _check_obs(self, obs):
        obs = np.asarray(obs)
        t_len = obs.shape[0] if obs.ndim else 0
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(f"obs must have shape (T, *{self.obs_shape}), got {obs.shape}")
        if t_len < 1:
            raise ValueError("rollout must have at least one step")
        return obs, t_len

    def _check_targets(self, actions, returns, advantages, t_len):
        # arrays already of the right kind (a worker's) pass without a copy or
        # a numpy reduction: this runs with the GIL held between the kernels
        dt = self._dtype
        if not (type(actions) is np.ndarray and actions.dtype == np.int64
                and actions.flags.c_contiguous):
            actions = np.ascontiguousarray(actions, dtype=np.int64)
        if actions.shape != (t_len,):
            raise ValueError(f"actions must be {t_len} ints in [0, {self.n_actions})")
        acts = actions.tolist()
        if min(acts) < 0 or max(acts) >= self.n_actions:
            raise ValueError(f"actions must be {t_len} ints in [0, {self.n_actions})")
        try:
            if not (type(returns) is np.ndarray and returns.dtype == dt
                    and returns.shape == (t_len,) and returns.flags.c_contiguous):
                returns = np.ascontiguousarray(returns, dtype=dt).reshape(t_len)
            if not (type(advantages) is np.ndarray and advantages.dtype == dt
                    and advantages.shape == (t_len,) and advantages.flags.c_contiguous):
                advantages = np.ascontiguousarray(advantages, dtype=dt).reshape(t_len)
        except ValueError:
            raise ValueError(f"returns and advantages must have {t_len} values "
                             f"(one per rollout step)") from None
        return actions, returns, advantages

    def _forward_encoder_core(self, x, h0, c0, t_len):
        """Batched forward of encoder + core into the workspace rows;
        returns ``(inputs per encoder layer, feat, top)``."""
        ws, p = self._ws, self._p
        inputs = []
        for layer, lws in zip(self.encoder, ws):
            inputs.append(x)
            x = layer.forward(lws, p, x, t_len)
        feat = x
        top = self.core.forward(ws[len(self.encoder)], p, feat, t_len, h0, c0) \
            if self.recurrent else feat
        return inputs, feat, top

    def _backward(self, inputs, feat, t_len, resets=False, prep=False):
        """Backward from the heads' ``dtop`` rows through core and encoder;
        each layer writes its input gradient into the previous layer's
        output-gradient rows.  With :attr:`compiled_backward` each layer is
        one nogil call (``prep``: the conv layers also prepare their im2col
        rows, which the backward-only update has not done)."""
        ws, p, g, bl = self._ws, self._p, self._g, self._bl
        if bl is not None:
            for kern, args in self._backward_calls(inputs, feat, t_len, resets, prep):
                kern(*args)
            return
        n_enc = len(self.encoder)
        dy = ws[-1]["dtop"][:t_len]
        if self.recurrent:
            dx = self.encoder[-1].dy_rows(ws[n_enc - 1], t_len)
            dy = self.core.backward(ws[n_enc], p, g, feat, dy, t_len, dx, resets, self._n_seq)
        for i in range(n_enc - 1, -1, -1):
            dx = self.encoder[i - 1].dy_rows(ws[i - 1], t_len) if i > 0 else None
            dy = self.encoder[i].backward(ws[i], p, g, inputs[i], dy, t_len, dx)

    def _backward_calls(self, inputs, feat, t_len, resets, prep):
        """The compiled backward as ``[(kernel, args)]``, core first, then the
        encoder from the top (``prep``: the convs also build their im2col
        rows, see :meth:`_backward`)."""
        ws, p, g, bl = self._ws, self._p, self._g, self._bl
        n_enc = len(self.encoder)
        calls = []
        dy = ws[-1]["dtop"][:t_len]
        if self.recurrent:
            dx = self.encoder[-1].dy_rows(ws[n_enc - 1], t_len)
            calls += self.core.backward_calls(bl, ws[n_enc], p, g, feat, dy, t_len, dx, resets,
                                              self._n_seq)
            dy = dx.reshape(t_len, self.core.n_in)
        for i in range(n_enc - 1, -1, -1):
            layer = self.encoder[i]
            dx = self.encoder[i - 1].dy_rows(ws[i - 1], t_len) if i > 0 else None
            calls += layer.backward_calls(bl, ws[i], p, g, inputs[i], dy, t_len, dx, prep)
            if dx is not None:
                # the next layer down reads this layer's input gradient in the
                # shape its backward_compiled returns it
                dy = dx.reshape(t_len, layer.n_in) if layer.kind == "dense" else dx
        return calls

    def _run(self, obs, actions, returns, advantages, state, value_coef, entropy_beta,
             backward):
        obs, t_len = self._check_obs(obs)
        actions, returns, advantages = self._check_targets(actions, returns, advantages, t_len)
        h0 = c0 = None
        if self.recurrent:
            h0, c0 = self._state_arrays(state)
        self._workspace(t_len)
        self._rec_t = -1                # the rows are about to be overwritten
        self._n_seq = 1
        self._last_t = t_len
        x = np.ascontiguousarray(obs, dtype=self._dtype)
        inputs, feat, top = self._forward_encoder_core(x, h0, c0, t_len)
        stats = self.heads.forward_loss(self._ws[-1], self._p, self._g, top, actions, returns,
                                        advantages, value_coef, entropy_beta, t_len)
        if backward:
            self._backward(inputs, feat, t_len)
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
        return self._ws[-1]["probs"][:self._last_t] if self._ws_t else None

    @property
    def last_values(self):
        """``(T,)`` values of the last rollout forward (a scratch view)."""
        return self._ws[-1]["values"][:self._last_t] if self._ws_t else None

    @property
    def last_dstate(self):
        """``(dh0, dc0)``: loss gradient wrt the initial LSTM state of the
        last ``loss_and_grad`` (scratch views; ``None`` before one, or
        without an LSTM)."""
        if not (self.recurrent and self._ws_t):
            return None
        cws = self._ws[len(self.encoder)]
        return cws["dh0"], cws["dc0"]


class Actor:
    """One worker's agent steps, each in one compiled call (see
    :meth:`Network.actor`): ``a = actor(t, obs, u, raw=frame, state=...)``.

    Records rollout row ``t`` of the network's current recording (after
    :meth:`Network.begin_rollout`; ``t`` must be the next row) exactly as
    ``step(obs, state, record=True)`` does, samples the action with the
    uniform ``u`` as ``sample_categorical(probs, u)``, and writes
    ``actions[t]`` and ``values[t]``.  ``raw``: a raw frame to preprocess into ``obs``
    first (the pipeline's preprocessing; None: ``obs`` already holds the
    input).  ``state``: the input state at ``t == 0``; at ``t > 0`` None
    continues from the previous row, and a state (``initial_state()`` at an
    episode boundary) starts a new segment, as a recorded ``step`` given a
    state that is not the previous step's output.  The probabilities are
    in :attr:`probs` afterwards.  Raises the pipeline's ObservationError for
    a frame of the wrong type, dtype or shape and ValueError for a
    non-finite observation, before anything is recorded.
    """

    def __init__(self, net, pipeline, actions, values, entry=(0, 0)):
        if not (isinstance(actions, np.ndarray) and actions.dtype == np.int64
                and isinstance(values, np.ndarray) and values.dtype == np.float32):
            raise TypeError("Actor: actions must be an int64 array and values a float32 array")
        self.net = net
        self.pipeline = pipeline
        self.actions, self.values = actions, values
        self.probs = np.zeros(net.n_actions, np.float32)
        self._spare_probs = np.zeros(net.n_actions, np.float32)
        self._fn, self._ctx = entry     # the pipeline's compiled preprocessing (ObsPipeline.c_entry)
        self._raw_shape = tuple(pipeline.raw_shape) if pipeline is not None else None
        self._no_raw = np.zeros(1, np.uint8)
        self._zero_h = np.zeros(max(net.lstm_size, 1), np.float32)

    def __call__(self, t, obs, u, raw=None, state=None):
        self._check_obs(obs)
        return self.step_row(t, obs, u, raw, state)

    def step_row(self, t, obs, u, raw=None, state=None):
        """:meth:`__call__` for a caller whose ``obs`` is known to be a
        C-contiguous float32 array of the network's input shape (a worker's
        own rows: its pipeline writes that shape, which :meth:`Network.actor`
        checked), so the per-step check of ``obs`` is skipped; everything
        else is checked as there."""
        net = self.net
        if t != net._rec_t or t >= len(self.actions):
            net._record_slot()           # no recording, or a full one: its error
            raise RuntimeError(f"Actor: step {t} is not the next rollout row "
                               f"({net.recorded_steps} recorded, {len(self.actions)} at most)")
        reset = False
        if not net.recurrent:
            h = c = net._dummy_h
            from_rows = False
        elif state is None:
            if t == 0:
                raise ValueError("Actor: the rollout's first step needs its input state")
            h = c = self._zero_h
            from_rows = True
        else:
            h, c = net._state_arrays(state)
            from_rows = False
            reset = t > 0              # a new segment
        raw, fn = self._frame_args(raw, obs)
        if reset:
            net._keep_row_state(t)
        a = K.doom_act_packed(t, raw, fn, self._ctx, obs, h, c, from_rows, self.probs,
                              *net.fused_packed, *net.fused_rows, u, self.actions,
                              self.values)
        if a < 0:
            if a == -2:
                raise MemoryError("preprocess scratch row")
            raise _bad_obs()
        if reset:
            net._mark_reset(t)
        net._rec_t = t + 1
        net._rec_state = None
        return a

    def _check_obs(self, obs):
        net = self.net
        if not (type(obs) is np.ndarray and obs.dtype == np.float32
                and obs.shape == net.obs_shape and obs.flags.c_contiguous):
            raise ValueError(f"Actor: obs must be a C-contiguous float32 array of shape "
                             f"{net.obs_shape}")

    def _frame_args(self, raw, obs):
        """``(raw, fn)`` for the kernel: the frame as one flat row and the
        preprocessing's entry point, or (no frame, 0) when ``raw`` is None or
        had to go through the pipeline here (its checks and conversions)."""
        fn = self._fn
        if raw is None:
            return self._no_raw, 0
        if fn == 0:
            raise ValueError("Actor: no pipeline to preprocess raw frames with")
        if (type(raw) is np.ndarray and raw.dtype == np.uint8 and raw.shape == self._raw_shape
                and raw.flags.c_contiguous):
            return raw.reshape(-1), fn       # one compiled signature for any frame layout
        self.pipeline(raw, obs)
        return self._no_raw, 0

    def value(self, obs, state, raw=None):
        """V(s) of one observation, unrecorded (a rollout's bootstrap), in one
        compiled call: ``raw`` (when given) is preprocessed into ``obs``
        first, as in a step.  The value ``step(obs, state)`` returns, bit for
        bit; nothing of the recording changes."""
        net = self.net
        self._check_obs(obs)
        h, c = net._state_arrays(state) if net.recurrent else (net._dummy_h, net._dummy_h)
        raw, fn = self._frame_args(raw, obs)
        value = net.spare_act(obs, h, c, None, None, self._spare_probs, raw, fn, self._ctx)
        if value != value and not K.all_finite(obs):    # NaN value: bad input?
            raise _bad_obs()
        return value


def _bad_obs():
    return ValueError("observation contains NaN or inf; refusing to step the network "
                      "(it would return NaN action probabilities and poison the LSTM state)")


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
# reference twin of the whole network (each layer's plain-numpy twin)


def ref_forward_loss(net, params, obs, actions, returns, advantages, state, *,
                     value_coef=0.5, entropy_beta=0.01, backward=True):
    """The network's forward + A3C loss + backward composed from the layers'
    ``ref`` twins.

    ``params``: ``name -> array`` (e.g. ``net.state_dict()``).  Returns
    ``(stats, grads, extras)`` with grads ``name -> new array`` and extras
    ``{'probs','values','dh0','dc0','state'}``.
    """
    x = obs
    caches = []
    for layer in net.encoder:
        x, cache = layer.ref_forward(params, x)
        caches.append(cache)
    new_state = None
    if net.recurrent:
        x, new_state, core_cache = net.core.ref_forward(
            params, x, state if state is not None else net.initial_state())
    stats, probs, values, head_cache = net.heads.ref_loss(params, x, actions, returns,
                                                          advantages, value_coef, entropy_beta)
    extras = {"probs": probs, "values": values, "state": new_state}
    if not backward:
        return stats, None, extras
    dx, grads = net.heads.ref_backward(head_cache)
    if net.recurrent:
        dx, extras["dh0"], extras["dc0"], g = net.core.ref_backward(dx, core_cache)
        grads.update(g)
    for layer, cache in zip(reversed(net.encoder), reversed(caches)):
        dx, g = layer.ref_backward(dx, cache)
        grads.update(g)
    return stats, grads, extras
