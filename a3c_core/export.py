"""Export a trained :class:`~a3c_core.Policy` for deployment elsewhere.

* :func:`export_onnx` - one ONNX graph: RAW observation batch + recurrent
  state -> action probabilities, value, new state.  The checkpoint's
  preprocessing is part of the graph, so a consumer feeds the env's frames
  as they come (no a3c_core, numba or Cython needed to run it, any ONNX
  runtime will do).  Built with the ``onnx`` package's helpers (no torch).
* :func:`export_npz` - a checkpoint holding only what ``Policy.load`` needs
  (parameters, network spec and layout, preprocessing, the env's
  observation shape and action names): no optimizer moments, ~1/3 of a
  training checkpoint.
* :func:`onnx_session` - an ``onnxruntime`` session on one CPU thread.

The ONNX graph
--------------

Inputs (``N`` is a symbolic batch dimension):

* ``obs``: the raw observations, ``uint8 (N, H, W)`` / ``(N, H, W, C)`` for
  image pipelines (exactly the frames ``Policy.act`` takes, batched),
  ``float32 (N, *raw_shape)`` for vector pipelines;
* ``h``, ``c``: ``float32 (N, lstm_size)``, the LSTM state (recurrent specs
  only; zeros at the start of an episode).

Outputs: ``probs float32 (N, A)`` (softmax), ``value float32 (N,)`` and, for
recurrent specs, ``h_out``, ``c_out`` ``(N, lstm_size)``: the next step's
``h``/``c``.

Image preprocessing in the graph, as :class:`~a3c_core.obs.ObsPipeline` and
its Cython kernel do it: the crop, the BT.601 RGB -> gray weights and the
exact area resize are one linear map, written as two MatMuls with constant
resampling matrices, ``R (Ho, H) @ frame (H, W*C) @ Cm (W*C, Wo)``
(:func:`resize_matrices`: the crop is zero columns, the luma weights are
folded into ``Cm``, the 1/255 into ``R``), then the kernel's clamp at 1.0
and the optional ``norm`` ``(x - mean) * (1 / std)``.

Network: ONNX ``Conv`` (+ ``Elu``/``Relu``), ``Flatten`` (PyTorch C,H,W
order), ``Gemm`` for dense layers, the LSTM cell as
``Gemm``/``Add``/``Split``/``Sigmoid``/``Tanh``/``Mul`` (gate order i, f, g,
o; one step per call), ``Softmax`` for the policy head.  Everything is
float32 (a float64 network is exported in float32).
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from a3c_core import __version__
from a3c_core.checkpoint import process_umask
from a3c_core.core.preprocess import LUMA, area_table
from a3c_core.obs import parse_norm

__all__ = [
    "INSTALL_HINT",
    "MIN_OPSET",
    "ExportError",
    "build_onnx_model",
    "export_npz",
    "export_onnx",
    "onnx_session",
    "resize_matrices",
]

#: the oldest opset the graph is written for (Split/Squeeze take their sizes/axes as inputs)
MIN_OPSET = 13
INSTALL_HINT = 'pip install "a3c_core[onnx]"'


class ExportError(Exception):
    """An export that cannot be done: the target path cannot be written, or
    the policy holds something the exporter does not know."""


def _require(name):
    """Import ``onnx``/``onnxruntime``, or an ImportError that says how to install it."""
    try:
        if name == "onnx":
            import onnx
            from onnx import helper, numpy_helper  # noqa: F401
            return onnx
        import onnxruntime
        return onnxruntime
    except ImportError as e:
        raise ImportError(f"ONNX export needs the {name!r} package, which is not installed: "
                          f"{INSTALL_HINT}  ({e})") from e


# ----------------------------------------------------------------------------- preprocessing
def resize_matrices(raw_shape, out_shape, crop=None):
    """``(R, Cm)``: float32 matrices with ``R @ frame.reshape(H, W*C) @ Cm`` the
    resized gray frame (before the clamp at 1.0 and the optional norm), the
    arithmetic of the Cython ``Preprocessor``:

    * ``R (Ho, H)``: row ``o`` holds ``area_table(Hc, Ho)``'s weights / 255
      (float32, as the kernel stores them) at source rows ``top + start[o] + k``;
    * ``Cm (W*C, Wo)``: column ``o`` holds ``area_table(Wc, Wo)``'s weights at
      source columns ``left + start[o] + k``, times the channel's luma weight
      (``LUMA`` for RGB, 1 for gray) at interleaved position ``x*C + ch``.

    Rows/columns outside the crop stay zero.
    """
    raw_shape = tuple(int(s) for s in raw_shape)
    H, W = raw_shape[:2]
    C = raw_shape[2] if len(raw_shape) == 3 else 1
    Ho, Wo = (int(s) for s in out_shape)
    top, bottom, left, right = (int(v) for v in crop) if crop else (0, 0, 0, 0)
    Hc, Wc = H - top - bottom, W - left - right
    rs, rw = area_table(Hc, Ho)
    cs, cw = area_table(Wc, Wo)
    rw32 = (rw / 255.0).astype(np.float32)       # the kernel's float32 row table
    cw32 = cw.astype(np.float32)
    R = np.zeros((Ho, H), np.float32)
    for o in range(Ho):
        for k in range(rw32.shape[1]):
            R[o, top + rs[o] + k] += rw32[o, k]
    lw = np.asarray(LUMA if C == 3 else (1.0,) + (0.0,) * (C - 1), np.float32)
    Cm = np.zeros((W * C, Wo), np.float32)
    for o in range(Wo):
        for k in range(cw32.shape[1]):
            x = left + cs[o] + k
            for ch in range(C):
                Cm[x * C + ch, o] += cw32[o, k] * lw[ch]
    return R, Cm


class _Graph:
    """Nodes and initializers being collected; unique names."""

    def __init__(self, helper, numpy_helper):
        self.h, self.nh = helper, numpy_helper
        self.nodes, self.inits = [], []
        self._n = 0

    def const(self, name, array):
        self.inits.append(self.nh.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type, inputs, n_out=1, name=None, **attrs):
        self._n += 1
        base = name or f"{op_type.lower()}_{self._n}"
        outs = [base] if n_out == 1 else [f"{base}_{i}" for i in range(n_out)]
        self.nodes.append(self.h.make_node(op_type, list(inputs), outs, name=f"n{self._n}_{op_type}",
                                           **attrs))
        return outs[0] if n_out == 1 else outs


def _preprocess_nodes(g, pipeline, x):
    """Nodes from the raw input ``x`` to the network input ``(N, *net_obs_shape)``."""
    raw = tuple(pipeline.raw_shape)
    if pipeline.kind == "vector":
        return g.op("Flatten", [x], axis=1, name="obs_flat")
    if pipeline.kind != "image":
        raise ExportError(f"unknown preprocess kind {pipeline.kind!r}")
    spec = pipeline.spec
    out_shape = tuple(int(s) for s in spec.get("out_shape", (84, 84)))
    crop = spec.get("crop")
    R, Cm = resize_matrices(raw, out_shape, crop)
    H, W = raw[:2]
    C = raw[2] if len(raw) == 3 else 1
    xf = g.op("Cast", [x], to=1, name="obs_float")               # 1 = FLOAT
    if len(raw) == 3:
        xf = g.op("Reshape", [xf, g.const("rows_shape", np.array([0, H, W * C], np.int64))],
                  name="obs_rows")
    y = g.op("MatMul", [g.const("resize_rows", R), xf], name="resized_rows")   # (N, Ho, W*C)
    y = g.op("MatMul", [y, g.const("resize_cols", Cm)], name="resized")         # (N, Ho, Wo)
    y = g.op("Min", [y, g.const("one", np.array(1.0, np.float32))], name="clamped")
    mean, inv_std = parse_norm(spec.get("norm"), out_shape)
    if mean is not None:
        y = g.op("Sub", [y, g.const("norm_mean", mean.reshape(out_shape))], name="centred")
        y = g.op("Mul", [y, g.const("norm_inv_std", np.array(inv_std, np.float32))],
                 name="normalized")
    return g.op("Unsqueeze", [y, g.const("axis1", np.array([1], np.int64))], name="net_input")


# ----------------------------------------------------------------------------- network
def _act(g, kind, x, name):
    if kind == "elu":
        return g.op("Elu", [x], alpha=1.0, name=name)
    if kind == "relu":
        return g.op("Relu", [x], name=name)
    raise ExportError(f"activation {kind!r} has no ONNX export")


def _network_nodes(g, net, x, h_in, c_in):
    """Nodes from the network input to ``(logits, value (N, 1), h_out, c_out)``."""
    p = {k: np.asarray(v, np.float32) for k, v in net.state_dict().items()}
    for layer in net.encoder:
        n = layer.name
        if layer.kind == "conv":
            if len(p[n + ".weight"].shape) != 4:
                raise ExportError(f"layer {n}: unexpected weight shape")
            pad = int(layer.pad)
            x = g.op("Conv", [x, g.const(n + ".weight", p[n + ".weight"]),
                              g.const(n + ".bias", p[n + ".bias"])],
                     kernel_shape=[layer.k, layer.k], strides=[layer.stride, layer.stride],
                     pads=[pad, pad, pad, pad], name=n)
            x = _act(g, layer.act, x, n + "_act")
            if layer.flatten_out:
                x = g.op("Flatten", [x], axis=1, name=n + "_flat")     # C, H, W order
        elif layer.kind == "dense":
            x = g.op("Gemm", [x, g.const(n + ".weight", p[n + ".weight"]),
                              g.const(n + ".bias", p[n + ".bias"])], transB=1, name=n)
            x = _act(g, layer.act, x, n + "_act")
        else:
            raise ExportError(f"encoder layer {n!r} of kind {layer.kind!r} has no ONNX export")
    h_out = c_out = None
    if net.core is not None:
        n, hd = net.core.name, net.core.hidden
        bias = p[n + ".bias_ih"] + p[n + ".bias_hh"]
        gx = g.op("Gemm", [x, g.const(n + ".weight_ih", p[n + ".weight_ih"]),
                           g.const(n + ".bias", bias)], transB=1, name="lstm_gx")
        gh = g.op("Gemm", [h_in, g.const(n + ".weight_hh", p[n + ".weight_hh"])], transB=1,
                  name="lstm_gh")
        a = g.op("Add", [gx, gh], name="lstm_gates")
        gi, gf, gg, go = g.op("Split", [a, g.const("lstm_split", np.full(4, hd, np.int64))],
                              n_out=4, axis=1, name="lstm_gate")
        i = g.op("Sigmoid", [gi], name="lstm_i")
        f = g.op("Sigmoid", [gf], name="lstm_f")
        gt = g.op("Tanh", [gg], name="lstm_g")
        o = g.op("Sigmoid", [go], name="lstm_o")
        c_out = g.op("Add", [g.op("Mul", [f, c_in], name="lstm_fc"),
                             g.op("Mul", [i, gt], name="lstm_ig")], name="c_out")
        h_out = g.op("Mul", [o, g.op("Tanh", [c_out], name="lstm_tc")], name="h_out")
        x = h_out
    logits = g.op("Gemm", [x, g.const("policy.weight", p["policy.weight"]),
                           g.const("policy.bias", p["policy.bias"])], transB=1, name="logits")
    value = g.op("Gemm", [x, g.const("value.weight", p["value.weight"]),
                          g.const("value.bias", p["value.bias"])], transB=1, name="value2")
    return logits, value, h_out, c_out


def build_onnx_model(policy, *, opset=17):
    """The ``onnx.ModelProto`` :func:`export_onnx` writes (checked, not saved)."""
    onnx = _require("onnx")
    from onnx import TensorProto, helper, numpy_helper

    try:
        opset = int(opset)
    except (TypeError, ValueError):
        raise ValueError(f"opset must be an int, got {opset!r}") from None
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ValueError(f"opset must be between {MIN_OPSET} and {newest} (this onnx "
                         f"{onnx.__version__}), got {opset}")
    net, pipeline = policy.net, policy.pipeline
    g = _Graph(helper, numpy_helper)
    raw = tuple(int(s) for s in pipeline.raw_shape)
    in_type = TensorProto.UINT8 if pipeline.kind == "image" else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("obs", in_type, ["N", *raw])]
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", int(net.n_actions)]),
               helper.make_tensor_value_info("value", TensorProto.FLOAT, ["N"])]
    h_in = c_in = None
    if net.recurrent:
        hd = int(net.lstm_size)
        h_in, c_in = "h", "c"
        for name in (h_in, c_in):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", hd]))
        for name in ("h_out", "c_out"):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", hd]))
    x = _preprocess_nodes(g, pipeline, "obs")
    logits, value2, _, _ = _network_nodes(g, net, x, h_in, c_in)
    g.op("Softmax", [logits], axis=1, name="probs")
    g.op("Squeeze", [value2, g.const("value_axis", np.array([1], np.int64))], name="value")
    spec_name = net.spec.get("name", "?")
    graph = helper.make_graph(g.nodes, f"a3c_core_{spec_name}", inputs, outputs,
                              initializer=g.inits)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="a3c_core",
                              producer_version=__version__,
                              doc_string="a3c_core policy: raw observation batch (+ LSTM state) "
                                         "-> action probabilities, value (+ new state)")
    # the oldest IR version that carries this opset, so that older runtimes load it
    model.ir_version = helper.find_min_ir_version_for(opsets)
    meta = {"a3c_core.network": net.spec, "a3c_core.preprocess_kind": pipeline.kind,
            "a3c_core.raw_obs_shape": list(raw),
            "a3c_core.action_names": list(policy.action_names),
            "a3c_core.env_id": (policy.meta.get("env") or {}).get("id")}
    for k, v in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, json.dumps(v)
    onnx.checker.check_model(model)
    return model


# ----------------------------------------------------------------------------- writing
def _prepare_target(path):
    """``(path, its directory)``, the directory created if missing; ExportError
    naming ``path`` for an empty path, a directory, or a directory that cannot
    be created."""
    path = os.fspath(path)
    if not path:
        raise ExportError("export path is empty")
    if os.path.isdir(path):
        raise ExportError(f"cannot write {path}: it is a directory; give a file name")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot write {path}: its directory {directory} cannot be "
                          f"created ({e.strerror or e})") from None
    return path, directory


def _atomic_write(path, write):
    """``write(fileobj)`` into a temp file beside ``path``, then ``os.replace``;
    nothing is left behind on failure; ExportError naming ``path`` for an
    unwritable target."""
    path, directory = _prepare_target(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=directory)
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e} (directory {directory})") from None
    try:
        if hasattr(os, "fchmod"):        # the mode a new file gets, not mkstemp's 0600
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    return path


def export_onnx(policy, path, *, opset=17):
    """Write ``policy`` (preprocessing + network) as an ONNX graph at ``path``
    (atomically); returns ``path``.  See the module docstring for the graph's
    inputs and outputs.  Raises ImportError (with the install command) when
    ``onnx`` is missing, :class:`ExportError` when ``path`` cannot be written
    or the policy holds a layer with no export, ValueError for a bad opset."""
    model = build_onnx_model(policy, opset=opset)
    data = model.SerializeToString()
    return _atomic_write(path, lambda fh: fh.write(data))


#: checkpoint meta keys an npz-only export keeps besides network/layout/preprocess/env
#: (provenance: where the parameters came from; ``Checkpoint.describe`` reads them)
_KEEP_META = ("versions", "counters", "saved_at", "moving_avg", "avg_window",
              "best_moving_avg", "long_avg", "long_window", "best_step")


def export_npz(policy, path):
    """Write a checkpoint of ``policy`` holding only what :meth:`Policy.load
    <a3c_core.Policy.load>` needs: the parameters (float32), the network spec
    and layout, the preprocessing spec, the env description (id, frame skip,
    observation shape, action names) and the training provenance (steps,
    moving averages, versions); no optimizer state, training config or
    reward/advantage normalizers, and the env's copy of the preprocessing spec
    (the same as the top-level one) only where it differs.  Atomic; returns
    ``path``; :class:`ExportError` when ``path`` cannot be written."""
    from a3c_core.checkpoint import CheckpointError
    from a3c_core.policy import Policy

    src = dict(policy.meta)
    pre = dict(policy.pipeline.spec)
    env = dict(src.get("env") or {})
    env["obs_shape"] = [int(s) for s in policy.pipeline.raw_shape]
    env["obs_kind"] = policy.pipeline.kind
    env["n_actions"] = int(policy.n_actions)
    env["action_names"] = list(policy.action_names)
    if env.get("preprocess") == pre:
        del env["preprocess"]
    meta = {k: src[k] for k in _KEEP_META if k in src}
    meta["env"] = env
    meta["exported"] = {"kind": "npz-only", "from": policy.path, "a3c_core": __version__}
    slim = Policy(policy.net, policy.pipeline, policy.action_names, meta)
    path, _ = _prepare_target(path)
    try:
        return slim.save(path)
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from None


# ----------------------------------------------------------------------------- running
def onnx_session(path):
    """An ``onnxruntime.InferenceSession`` for ``path`` on the CPU provider, one
    intra-op and one inter-op thread (sequential execution)."""
    ort = _require("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(os.fspath(path), sess_options=so,
                                providers=["CPUExecutionProvider"])


def onnx_parity(policy, path, *, batch=7, steps=20, seed=0) -> dict:
    """Run the ONNX graph at ``path`` and ``policy.probs_batch`` on the same
    random raw observations for ``steps`` recurrent steps of ``batch`` agents
    (state carried through both) and return the largest absolute
    differences: ``{"probs": .., "value": .., "state": ..}`` (``state`` 0.0
    for feed-forward specs).  Needs onnxruntime."""
    sess = onnx_session(path)
    rng = np.random.default_rng(seed)
    shape = (batch,) + tuple(policy.pipeline.raw_shape)
    net = policy.net
    states = policy.initial_state(batch)
    feed_state = None if states is None else (states[0].astype(np.float32),
                                              states[1].astype(np.float32))
    worst = {"probs": 0.0, "value": 0.0, "state": 0.0}
    for _ in range(steps):
        if policy.pipeline.kind == "image":
            obs = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            obs = rng.standard_normal(shape).astype(np.float32)
        probs, values, states = policy.probs_batch(obs, states)
        feed = {"obs": obs}
        if net.recurrent:
            feed["h"], feed["c"] = feed_state
        out = sess.run(None, feed)
        worst["probs"] = max(worst["probs"], float(np.abs(out[0] - probs).max()))
        worst["value"] = max(worst["value"], float(np.abs(out[1] - values).max()))
        if net.recurrent:
            feed_state = (out[2], out[3])
            worst["state"] = max(worst["state"], float(np.abs(out[2] - states[0]).max()),
                                 float(np.abs(out[3] - states[1]).max()))
    return worst
