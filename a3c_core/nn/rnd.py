"""Random Network Distillation (Burda et al. 2018): an intrinsic-reward bonus.

A fixed, randomly initialised *target* network ``f`` and a trained
*predictor* ``f_hat`` of the same shape map an observation to a feature
vector; the predictor is trained to match the target (MSE) on the states the
agents visit, so its error ``|f_hat(s) - f(s)|^2`` is large on states seen
rarely and small on states seen often: a novelty measure, paid as a bonus on
the transition into ``s``.

The networks (both from the engine's layer list, :mod:`a3c_core.nn.layers`,
with their batched forward/backward; ``x`` the policy's preprocessed
observation rows, ``(T, C, H, W)``):

    avg-pool 4x4 (84x84 -> 21x21)           :func:`avg_pool_rows`
    conv1 16 filters 3x3 stride 2 + ELU     (21 -> 10)
    conv2 32 filters 3x3 stride 2 + ELU     (10 -> 4), flatten (512)
    out   dense 512 -> 64, identity
    novelty e_t = mean_k (f_hat(x_t)_k - f(x_t)_k)^2, loss = mean_t e_t   :func:`mse_rows`

(37,632 parameters each; :data:`ARCH`).  Small on purpose: the bonus's
cost is measured against the policy's update by :func:`measure_cost`, and
the target is at most 30 % more learner time per agent step on the
doom-lstm workload (rollouts of 20 steps).  Measured on the 2-core VM
(shared with other jobs, so provisional), medians of 61 alternating
rounds: this shape 1.22-1.24x; 42x42 input with 8/16 filters 4x4/2 and 32
features 1.44-1.49x (its first conv alone, 8,400 im2col rows per rollout,
cost more than the whole bonus does now); 28x28 with 8/16 filters 1.22x.
Per rollout the bonus spends ~60 us pooling, ~160 us in the target's
forward, ~350 us in the predictor's forward + backward and ~25 us in its
apply; most of it is per-call overhead, not arithmetic.

The input is the rows the policy's rollout recorded
(``Network.recorded_obs``), i.e. frames after the run's preprocessing and
image normalization (``obs_norm``: the measured mean frame subtracted,
divided by its spread), which stands in for the paper's running
observation whitening.

Kernels and twins: :func:`avg_pool_rows` / :func:`avg_pool_backward` and
:func:`mse_rows` are compiled (``a3c_core._jit.kernel``) and have plain-numpy
twins (:func:`ref_avg_pool`, :func:`ref_avg_pool_backward`, :func:`ref_mse`);
:func:`ref_loss_and_grad` is the whole bonus's forward + backward composed
of the layers' ``ref`` twins.  tests/test_rnd.py checks them against each
other, against float64 finite differences and against PyTorch.

Objects:

* :class:`RNDNet` - the compute: the target's and a predictor's parameters
  (flat buffers, layouts from the layers), the workspace rows, and
  :meth:`RNDNet.loss_and_grad` (novelty of each row + the predictor's
  gradient in one pass).  One per thread (its scratch is its own), like a
  :class:`~a3c_core.nn.network.Network`.
* :class:`RNDShared` - what the workers share: the target's parameters
  (fixed; seeded), the predictor's parameters and its optimizer in a
  :class:`~a3c_core.core.SharedState` (Hogwild applies, as the policy's), and
  the moving statistics of the intrinsic returns
  (:class:`~a3c_core.core.normalize.AdvantageNormalizer` with a horizon).  Checkpointed through
  :meth:`RNDShared.arrays` / :meth:`RNDShared.meta`.

How a worker turns novelties into rewards (``a3c_core.train.worker``,
:func:`rollout_bonus`): ``i_t`` = novelty of the next observation
``s_{t+1}`` (a recorded row, or the observation a rollout cut by ``t_max``
bootstraps from; 0 after an episode's last step), divided by the moving
root-mean-square of the discounted intrinsic return over the last
~:data:`INTRINSIC_HORIZON` returns (each env's running return is
NON-episodic: it runs on across episode ends, as the paper's intrinsic
stream does; one shared normalizer), clipped to
``norm_clip`` (10, as the scaled extrinsic rewards are), times
``exploration_scale`` (0.5 by default: the paper's 1 : 2 weighting of
intrinsic to extrinsic advantages), then added to the learning reward (the
clipped, normalized extrinsic one) before the n-step returns and GAE.

The paper divides by the whole run's standard deviation.  Here the
predictor learns the maze's look-alike rooms within ~50k agent steps, and a
whole-run statistic, still holding the first large novelties, shrank the
bonus from 0.017 to ~0.001 per step; over a moving window it keeps its scale
(0.003-0.005 per step through 2M steps on doom:my_way_home; docs/scenarios.md,
"Exploration bonus").

One reward stream, not the paper's two: the paper gives the intrinsic
return its own value head and discount (non-episodic) and adds the two
advantages.  The engine's heads have one value output (``Heads``, fused
into the rollout's loss kernel), and a second head would change the
network, its layout and every checkpoint; so the bonus joins the
extrinsic reward and the critic learns the sum, episodically (its
return stops at a terminal state).  (The paper's comparison on
Montezuma's Revenge favours two heads with a non-episodic intrinsic
return; that is a change to the network for a later part.)  The
normalization still uses the non-episodic intrinsic return, so the bonus's
scale does not depend on where episodes end.

The predictor trains on every row of every rollout (the paper trains on a
random quarter of them when running 128+ envs; with a few workers every row
counts), with the policy's optimizer kind and arguments but no learning-rate
anneal (the error must keep tracking visits).
"""
from __future__ import annotations

import numpy as np

from a3c_core._blas import blas_threads
from a3c_core._jit import kernel
from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer, running_returns
from a3c_core.core.optim import make_optimizer
from a3c_core.core.shared import SharedState
from a3c_core.timing import time_alternating

from . import blas, ref
from .layers import Conv2d, Dense
from .layout import ParamLayout
from .network import build_network

__all__ = ["ARCH", "RNDNet", "RNDShared", "avg_pool_rows", "avg_pool_backward", "mse_rows",
           "ref_avg_pool", "ref_avg_pool_backward", "ref_mse", "ref_loss_and_grad",
           "build_layers", "rollout_bonus", "warm_up", "measure_cost"]

#: the networks' shape: input pooling factor, convs (out channels, kernel,
#: stride), feature size; both networks use it
#: the intrinsic returns' normalization: an exponential moving RMS over about
#: this many returns (agent steps), so the bonus keeps its scale as the
#: predictor learns (a whole-run std stays dominated by the first novelties)
INTRINSIC_HORIZON = 100_000

ARCH = {"pool": 4, "convs": ((16, 3, 2), (32, 3, 2)), "features": 64, "act": "elu"}


# ---------------------------------------------------------------------------
# kernels


@kernel
def avg_pool_rows(x__nchw, k, y__nchw):
    """``y[n, c, i, j]`` = mean of the ``k x k`` block of ``x`` at ``(k*i, k*j)``
    (stride ``k``, no padding; rows/columns past ``k * OH`` are dropped)."""
    n_, c_, _, _ = x__nchw.shape
    oh, ow = y__nchw.shape[2], y__nchw.shape[3]
    inv = x__nchw.dtype.type(1.0 / (k * k))
    zero = x__nchw.dtype.type(0)
    for n in range(n_):
        for c in range(c_):
            for i in range(oh):
                for j in range(ow):
                    s = zero
                    for u in range(k):
                        for v in range(k):
                            s += x__nchw[n, c, i * k + u, j * k + v]
                    y__nchw[n, c, i, j] = s * inv


@kernel
def avg_pool_backward(dy__nchw, k, dx__nchw):
    """The input gradient of :func:`avg_pool_rows`: each input of a block
    gets ``dy / k^2``; inputs in no block get 0 (``dx`` written in full)."""
    n_, c_, oh, ow = dy__nchw.shape
    inv = dy__nchw.dtype.type(1.0 / (k * k))
    dx__nchw[...] = 0
    for n in range(n_):
        for c in range(c_):
            for i in range(oh):
                for j in range(ow):
                    g = dy__nchw[n, c, i, j] * inv
                    for u in range(k):
                        for v in range(k):
                            dx__nchw[n, c, i * k + u, j * k + v] = g


@kernel
def mse_rows(p__nd, t__nd, err__n, dp__nd):
    """Per row ``err[n] = mean_k (p - t)^2``; returns ``loss = mean_n err[n]``
    (float64) and writes ``dp = d loss / d p = 2 (p - t) / (N D)``."""
    n_, d_ = p__nd.shape
    g = 2.0 / (n_ * d_)
    loss = 0.0
    for n in range(n_):
        s = 0.0
        for k in range(d_):
            diff = p__nd[n, k] - t__nd[n, k]
            s += diff * diff
            dp__nd[n, k] = diff * g
        err__n[n] = s / d_
        loss += s / d_
    return loss / n_


# ---------------------------------------------------------------------------
# plain-numpy twins


def ref_avg_pool(x, k):
    """:func:`avg_pool_rows` in numpy: ``(N, C, H, W)`` -> ``(N, C, H//k, W//k)``."""
    n, c, h, w = x.shape
    oh, ow = h // k, w // k
    return x[:, :, :oh * k, :ow * k].reshape(n, c, oh, k, ow, k).mean(axis=(3, 5))


def ref_avg_pool_backward(dy, k, x_shape):
    """:func:`avg_pool_backward` in numpy."""
    dx = np.zeros(x_shape, dy.dtype)
    oh, ow = dy.shape[2:]
    block = np.repeat(np.repeat(dy, k, axis=2), k, axis=3) / (k * k)
    dx[:, :, :oh * k, :ow * k] = block
    return dx


def ref_mse(p, t):
    """:func:`mse_rows` in numpy: ``(loss, err (N,), dp)``."""
    diff = p - t
    err = (diff * diff).mean(axis=1)
    return float(err.mean()), err, 2.0 * diff / diff.size


def _ref_layer_forward(layer, params, x):
    if layer.act == "identity":     # (ref.ACTIVATIONS has no identity; the output layer's)
        z, cache = ref.dense_forward(x.reshape(x.shape[0], -1), params[layer.name + ".weight"],
                                     params[layer.name + ".bias"])
        return z, ("identity", cache)
    return layer.ref_forward(params, x)


def _ref_layer_backward(layer, dy, cache):
    if isinstance(cache, tuple) and len(cache) == 2 and isinstance(cache[0], str):
        dx, gw, gb = ref.dense_backward(dy, cache[1])
        return dx, {layer.name + ".weight": gw, layer.name + ".bias": gb}
    return layer.ref_backward(dy, cache)


def ref_features(layers, params, x, pool):
    """The network's output for raw rows ``x`` (pooled first), numpy twins only."""
    h = ref_avg_pool(x, pool)
    caches = []
    for layer in layers:
        h, cache = _ref_layer_forward(layer, params, h)
        caches.append(cache)
    return h, caches


def ref_loss_and_grad(layers, target, predictor, x, pool):
    """The bonus's forward and the predictor's backward from the layers' ``ref``
    twins: ``(loss, errors (N,), grads name -> array)``; ``target`` and
    ``predictor`` are ``name -> array`` dicts, ``x`` the raw rows."""
    t, _ = ref_features(layers, target, x, pool)
    p, caches = ref_features(layers, predictor, x, pool)
    loss, err, dy = ref_mse(p, t)
    grads = {}
    for layer, cache in zip(reversed(layers), reversed(caches)):
        dy, g = _ref_layer_backward(layer, dy, cache)
        grads.update(g)
    return loss, err, grads


# ---------------------------------------------------------------------------
# the networks


def build_layers(obs_shape, arch=ARCH):
    """The layer list of both networks for network inputs ``obs_shape`` (C, H, W)."""
    if len(obs_shape) != 3:
        raise ValueError(f"RND needs image observations (C, H, W), got shape {tuple(obs_shape)}")
    c, h, w = (int(s) for s in obs_shape)
    k = int(arch["pool"])
    shape = (c, h // k, w // k)
    convs = arch["convs"]
    layers = []
    for i, (out_ch, kk, stride) in enumerate(convs):
        conv = Conv2d(f"conv{i + 1}", shape, out_ch, kk, stride, 0, arch["act"],
                      nchw_in=(i == 0), flatten_out=(i == len(convs) - 1))
        if min(conv.out_hw) < 1:
            raise ValueError(f"RND: observation shape {tuple(obs_shape)} is too small for "
                             f"its networks (pooled {shape[1]}x{shape[2]} before conv{i + 1})")
        layers.append(conv)
        shape = conv.out_shape
    layers.append(Dense("out", layers[-1].n_out, arch["features"], "identity"))
    return layers


class RNDNet:
    """Target + predictor compute over flat parameter buffers (one object per
    thread; see the module docstring).

    ``target``/``predictor``: flat buffers to use (views kept, never copied;
    a worker passes the shared target and its own local predictor copy);
    None: new buffers initialised from ``seed`` (target: ``seed``, predictor:
    ``seed + 1``).  ``grads`` is the predictor's gradient (same layout);
    after :meth:`loss_and_grad`, ``errors[:n]`` holds each row's novelty.
    """

    def __init__(self, obs_shape, dtype=np.float32, *, target=None, predictor=None, seed=0,
                 arch=ARCH):
        self.obs_shape = tuple(int(s) for s in obs_shape)
        if len(self.obs_shape) != 3:
            raise ValueError(f"RND needs image observations (C, H, W), got {self.obs_shape}")
        self.dtype = np.dtype(dtype)
        self.arch = arch
        self.pool = int(arch["pool"])
        self.layers = build_layers(self.obs_shape, arch)
        self.n_features = self.layers[-1].n_out
        self.layout = ParamLayout(e for L in self.layers for e in L.param_shapes())
        self.target = self._buffer(target, seed)
        self.params = self._buffer(predictor, seed + 1)
        self.grads = self.layout.new_flat(self.dtype)
        self._pt = self.layout.views(self.target)
        self._pp = self.layout.views(self.params)
        self._g = self.layout.views(self.grads)
        self._bl = blas.gemm_handle()
        self._t_cap = 0

    def _buffer(self, buf, seed):
        if buf is None:
            buf = self.layout.new_flat(self.dtype)
            init_params(self.layers, self.layout, buf, seed)
            return buf
        if buf.dtype != self.dtype or buf.shape != (self.layout.size,):
            raise ValueError(f"RND: a parameter buffer must be {self.dtype} "
                             f"({self.layout.size},), got {buf.dtype} {buf.shape}")
        return buf

    @property
    def n_params(self) -> int:
        return self.layout.size

    @property
    def pooled_shape(self):
        c, h, w = self.obs_shape
        return (c, h // self.pool, w // self.pool)

    def reserve(self, t_cap):
        """Workspace for ``t_cap`` rows (grown, never shrunk)."""
        if t_cap <= self._t_cap:
            return
        t_cap = max(int(t_cap), 21)
        dt = self.dtype
        self._ws_t = [L.workspace(t_cap, dt) for L in self.layers]
        self._ws_p = [L.workspace(t_cap, dt) for L in self.layers]
        self.x = np.zeros((t_cap,) + self.pooled_shape, dt)     # the pooled input rows
        self.errors = np.zeros(t_cap, np.float64)
        self._t_cap = t_cap
        self._calls = {}

    def pool_into(self, rows, at=0):
        """Pool the raw observation rows ``rows`` ``(m, *obs_shape)`` into the
        input rows ``at .. at+m-1``."""
        if rows.shape[1:] != self.obs_shape or rows.dtype != self.dtype:
            raise ValueError(f"RND.pool_into: rows must be {self.dtype} (m, *{self.obs_shape}), "
                             f"got {rows.dtype} {rows.shape}")
        m = rows.shape[0]
        self.reserve(at + m)
        avg_pool_rows(rows, self.pool, self.x[at:at + m])

    def _forward(self, ws, p, n):
        x = self.x[:n]
        inputs = []
        for layer, lws in zip(self.layers, ws):
            inputs.append(x)
            x = layer.forward(lws, p, x, n)
        return inputs, x

    def _backward_calls(self, inputs, n):
        """The predictor's compiled backward, from the output's gradient rows
        (the output layer's ``dy`` rows) down to conv1 (no input gradient)."""
        ws, p, g, bl = self._ws_p, self._pp, self._g, self._bl
        calls = []
        dy = self.layers[-1].dy_rows(ws[-1], n)
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            dx = self.layers[i - 1].dy_rows(ws[i - 1], n) if i > 0 else None
            calls += layer.backward_calls(bl, ws[i], p, g, inputs[i], dy, n, dx, False)
            if dx is not None:
                dy = dx.reshape(n, layer.n_in) if layer.kind == "dense" else dx
        return calls

    def loss_and_grad(self, n, backward=True) -> float:
        """Over input rows ``0 .. n-1`` (:meth:`pool_into`): the target's and the
        predictor's forward, each row's novelty into ``errors[:n]``, the MSE
        loss (returned) and, with ``backward``, the predictor's gradient into
        ``grads`` (overwritten)."""
        if n < 1 or n > self._t_cap:
            raise ValueError(f"RND.loss_and_grad: {n} rows, {self._t_cap} pooled")
        _, tgt = self._forward(self._ws_t, self._pt, n)
        inputs, pred = self._forward(self._ws_p, self._pp, n)
        dy = self.layers[-1].dy_rows(self._ws_p[-1], n)
        loss = mse_rows(pred, tgt, self.errors[:n], dy)
        if not backward:
            return loss
        if self._bl is None:
            ws, p, g = self._ws_p, self._pp, self._g
            for i in range(len(self.layers) - 1, -1, -1):
                dx = self.layers[i - 1].dy_rows(ws[i - 1], n) if i > 0 else None
                dy = self.layers[i].backward(ws[i], p, g, inputs[i], dy, n, dx)
            return loss
        calls = self._calls.get(n)
        if calls is None:
            calls = self._calls[n] = self._backward_calls(inputs, n)
        for kern, args in calls:
            kern(*args)
        return loss

    def novelty(self, rows) -> np.ndarray:
        """Each raw row's novelty (a new array), forward only."""
        n = rows.shape[0]
        self.pool_into(np.ascontiguousarray(rows, dtype=self.dtype), 0)
        self.loss_and_grad(n, backward=False)
        return self.errors[:n].copy()

    def state_dicts(self):
        """``(target, predictor)`` as ``name -> view`` dicts."""
        return dict(self._pt), dict(self._pp)


def init_params(layers, layout, flat, seed):
    """PyTorch-default (uniform) init of ``layers`` into ``flat``, seeded."""
    views = layout.views(flat)
    rng = np.random.default_rng(seed)
    for layer in layers:
        layer.init(views, rng)


# ---------------------------------------------------------------------------
# the shared part


def rnd_seeds(seed):
    """``(target seed, predictor seed)`` of a run with seed ``seed``."""
    s = np.random.SeedSequence([int(seed), 0x52D]).generate_state(2)
    return int(s[0] & 0x7FFFFFFF), int(s[1] & 0x7FFFFFFF)


class RNDShared:
    """What the workers share (see the module docstring): ``target``
    (float32, fixed), ``shared`` (the predictor's params and optimizer, a
    :class:`~a3c_core.core.SharedState`), ``normalizer`` (the intrinsic
    returns' running statistics)."""

    #: the checkpoint's array names (save_checkpoint stores them under ``opt/``)
    PREFIX = "rnd/"

    def __init__(self, obs_shape, seed, optimizer="adam", opt_kwargs=None,
                 arch=ARCH):
        self.obs_shape = tuple(int(s) for s in obs_shape)
        self.arch = arch
        self.target_seed, self.predictor_seed = rnd_seeds(seed)
        net = RNDNet(self.obs_shape, np.float32, seed=self.target_seed, arch=arch)
        init_params(net.layers, net.layout, net.params, self.predictor_seed)
        self.layout = net.layout
        self.target = net.target
        self.optimizer_name = optimizer
        opt = make_optimizer(optimizer, net.n_params, **(opt_kwargs or {}))
        self.shared = SharedState(net.params, opt)
        self.normalizer = AdvantageNormalizer(horizon=INTRINSIC_HORIZON)

    @property
    def n_params(self) -> int:
        return self.layout.size

    def new_net(self) -> RNDNet:
        """A worker's compute: the shared target, a local copy of the predictor."""
        net = RNDNet(self.obs_shape, np.float32, target=self.target,
                     predictor=self.shared.params.copy(), arch=self.arch)
        return net

    # -- checkpoints -------------------------------------------------------
    def meta(self) -> dict:
        """The checkpoint's ``exploration`` entry (JSON)."""
        opt = self.shared.optimizer.state_dict()
        return {"kind": "rnd", "arch": _jsonable(self.arch), "obs_shape": list(self.obs_shape),
                "n_params": self.n_params, "target_seed": self.target_seed,
                "optimizer": self.optimizer_name,
                "optimizer_scalars": {k: v for k, v in opt.items()
                                      if not isinstance(v, np.ndarray)},
                "normalizer": self.normalizer.state_dict()}

    def arrays(self) -> dict:
        """The checkpoint's arrays (copies): predictor, target, optimizer statistics."""
        out = {self.PREFIX + "predictor": self.shared.params.copy(),
               self.PREFIX + "target": self.target.copy()}
        for k, v in self.shared.optimizer.state_dict().items():
            if isinstance(v, np.ndarray):
                out[self.PREFIX + "opt." + k] = v
        return out

    @staticmethod
    def unusable(meta, obs_shape, optimizer, arch=ARCH):
        """Why a checkpoint's ``exploration`` entry cannot be restored into a
        run with these networks and optimizer (a string), or None."""
        if not isinstance(meta, dict) or meta.get("kind") != "rnd":
            return "the checkpoint has no RND state"
        if meta.get("arch") != _jsonable(arch) or \
                list(meta.get("obs_shape", [])) != [int(s) for s in obs_shape]:
            return (f"its RND networks (arch {meta.get('arch')}, observation "
                    f"{meta.get('obs_shape')}) are not this version's ({_jsonable(arch)}, "
                    f"{[int(s) for s in obs_shape]})")
        if meta.get("optimizer") != optimizer:
            return (f"its RND predictor used optimizer {meta.get('optimizer')!r}, the config "
                    f"asks for {optimizer!r}")
        return None

    def load(self, meta, arrays) -> None:
        """Restore from :meth:`meta` and :meth:`arrays` (ValueError when they do
        not fit this run's networks or optimizer)."""
        p = self.PREFIX
        why = self.unusable(meta, self.obs_shape, self.optimizer_name, self.arch)
        if why is not None:
            raise ValueError(why)
        pred, target = arrays.get(p + "predictor"), arrays.get(p + "target")
        if pred is None or target is None:
            raise ValueError("its RND arrays are missing")
        for name, a in (("predictor", pred), ("target", target)):
            if a.shape != (self.n_params,) or not np.all(np.isfinite(a)):
                raise ValueError(f"its RND {name} has shape {a.shape} or non-finite values")
        opt = self.shared.optimizer
        owned = set(getattr(opt, "_hyper", ())) | {"anneal_steps"}
        state = {k: v for k, v in (meta.get("optimizer_scalars") or {}).items() if k not in owned}
        state.update({k[len(p + "opt."):]: v for k, v in arrays.items()
                      if k.startswith(p + "opt.")})
        self.shared.load_state_dict({"params": pred, "optimizer": state,
                                     "counters": {}})
        self.target[...] = target
        if meta.get("normalizer") is not None:
            self.normalizer.load_state_dict(meta["normalizer"])

    @classmethod
    def split_arrays(cls, opt_arrays) -> tuple:
        """A checkpoint's ``opt_arrays`` -> ``(the policy optimizer's, RND's)``."""
        mine = {k: v for k, v in opt_arrays.items() if k.startswith(cls.PREFIX)}
        rest = {k: v for k, v in opt_arrays.items() if not k.startswith(cls.PREFIX)}
        return rest, mine


def _jsonable(arch):
    return {k: ([list(c) for c in v] if k == "convs" else v) for k, v in arch.items()}


# ---------------------------------------------------------------------------
# one rollout's bonus (what a worker runs), its warm-up and its cost


def rollout_bonus(rnet, merge, rows, next_rows, seg_ends, seg_next, env_spans, accs, gamma,
                  scale, clip, out) -> float:
    """One rollout's intrinsic rewards and the predictor's gradient.

    ``rows`` ``(n, *obs_shape)``: the recorded observations (the policy's
    input rows); ``next_rows``: ``{segment end row: (1, *obs_shape) array}``,
    the observation after a segment that was cut by ``t_max`` (the one its
    bootstrap value was computed from); ``seg_ends``: each segment's end row
    (exclusive, increasing); ``seg_next``: whether the segment's last step
    has a next observation (False where its episode ended: a bonus of 0).

    The novelty of each row (and of each next row) comes from one pass of
    :meth:`RNDNet.loss_and_grad` (the predictor trained on all of them);
    ``i_t`` = novelty of ``s_{t+1}``.  Each env's rows ``env_spans[k] =
    (start, end)`` continue its running NON-episodic discounted intrinsic
    return ``accs[k]`` (updated in place); ``merge(returns) -> norm`` merges
    them into the shared statistics and gives ``1 / std``.  Writes
    ``out[:n] = scale * min(i_t * norm, clip)`` (float64) and returns the
    predictor's loss.
    """
    n = rows.shape[0]
    rnet.reserve(n + len(next_rows))
    rnet.pool_into(rows, 0)
    slot = {}
    for j, row in next_rows.items():
        slot[j] = n + len(slot)
        rnet.pool_into(row, slot[j])
    loss = rnet.loss_and_grad(n + len(slot))
    err = rnet.errors
    raw = out[:n]
    raw[:n - 1] = err[1:n]          # i_t = novelty of s_{t+1}, the next recorded row ...
    for b0, has_next in zip(seg_ends, seg_next):
        # ... except at a segment's last step: there it is the row the rollout
        # bootstrapped from (cut by t_max), or none (the episode ended)
        raw[b0 - 1] = err[slot[b0]] if has_next else 0.0
    rnet.last_novelty = float(raw.mean())
    parts = []
    for k, (s0, s1) in enumerate(env_spans):
        r, accs[k] = running_returns(raw[s0:s1], gamma, accs[k])
        parts.append(r)
    norm = float(merge(parts[0] if len(parts) == 1 else np.concatenate(parts)))
    np.multiply(raw, norm, out=raw)
    np.minimum(raw, clip, out=raw)
    raw *= scale
    return loss


def warm_up(obs_shape, arch=ARCH):
    """Compile (or load) the bonus's kernels on a private 3-row rollout."""
    net = RNDNet(obs_shape, np.float32, arch=arch)
    rows = np.zeros((4,) + tuple(net.obs_shape), np.float32)
    rollout_bonus(net, ReturnNormalizer().update, rows[:3], {3: rows[3:]}, [3], [True],
                  [(0, 3)], [0.0], 0.99, 1.0, 10.0, np.zeros(3))


def measure_cost(*, t_max=20, repeat=31, warmup=5, optimizer="adam", seed=0,
                 obs_shape=(1, 84, 84), n_actions=3, arch=ARCH) -> dict:
    """Learner microseconds per agent step of the plain update and of the
    update with the RND bonus, on the doom-lstm workload (one rollout of
    ``t_max`` recorded steps, cut by ``t_max``: one bootstrap row), in one
    run: ``warmup`` rounds, then ``repeat`` rounds alternating the two;
    medians.

    plain: ``rollout_grad`` (the backward over the recorded rows) + the
    shared optimizer's clip and apply (with the local refresh), as a worker
    runs them.  bonus: the same plus what a worker adds per rollout with
    ``exploration = "rnd"`` (:func:`rollout_bonus`: pooling the rows and the
    bootstrap row, the target's forward, the predictor's forward and
    backward, the intrinsic rewards' mapping and normalization; then the
    predictor's clip and apply).  Returns ``{"plain_us", "bonus_us",
    "ratio", "plain_us_per_step", "bonus_us_per_step", "rnd_params",
    "t_max", "repeat"}`` (ratio = bonus / plain; the target is <= 1.3).
    BLAS runs single-threaded meanwhile, as in a worker.  Example (the
    figure ``a3c bench`` can report)::

        from a3c_core.nn.rnd import measure_cost
        measure_cost()["ratio"]      # 1.21 on the 2-core VM (2026-11-28)
    """
    with blas_threads(1):
        return _measure_cost(t_max, repeat, warmup, optimizer, seed, obs_shape, n_actions,
                             arch)


def _measure_cost(t_max, repeat, warmup, optimizer, seed, obs_shape, n_actions, arch):
    net = build_network("doom-lstm", obs_shape, n_actions, seed=seed)
    shared = SharedState(net.params, make_optimizer(optimizer, net.n_params))
    rs = RNDShared(obs_shape, seed, optimizer, arch=arch)
    rnet = rs.new_net()
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((t_max + 1,) + tuple(obs_shape)).astype(np.float32)
    actions = rng.integers(0, n_actions, t_max)
    returns = rng.standard_normal(t_max).astype(np.float32)
    adv = rng.standard_normal(t_max).astype(np.float32)
    net.record_rollout(obs[:t_max])
    rows = net.recorded_obs
    bonus = np.zeros(t_max, np.float64)
    accs = [0.0]
    nxt = {t_max: obs[t_max:]}

    def plain():
        net.rollout_grad(actions, returns, adv)
        shared.apply(net.grads, 40.0, sync_to=net.params)

    def with_bonus():
        net.rollout_grad(actions, returns, adv)
        shared.apply(net.grads, 40.0, sync_to=net.params)
        rollout_bonus(rnet, rs.normalizer.update, rows, nxt, [t_max], [True], [(0, t_max)],
                      accs, 0.99, 1.0, 10.0, bonus)
        rs.shared.apply(rnet.grads, 40.0, sync_to=rnet.params)

    a, b = time_alternating(plain, with_bonus, repeat=repeat, warmup=warmup)
    pa, pb = float(np.median(a)) * 1e6, float(np.median(b)) * 1e6
    return {"plain_us": pa, "bonus_us": pb, "ratio": pb / pa,
            "plain_us_per_step": pa / t_max, "bonus_us_per_step": pb / t_max,
            "rnd_params": rs.n_params, "t_max": t_max, "repeat": repeat}
