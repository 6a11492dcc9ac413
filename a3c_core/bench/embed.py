"""The embedding rows of ``a3c bench`` (serving agents from raw frames) and ``preprocess``.

* ``Policy.act (batch 1)``: raw frame -> action, us.
* ``act_batch N=.. per agent`` (N = 1, 8, 64, 256): ``Policy.act_batch``
  per agent, each N timed in turn with the batch-1 call; the note gives the
  ratio to ``act``.  Where the direct convolutions run,
  ``act_batch N=64, im2col + GEMM convs`` times the path they replace.
* ``onnxruntime N=.. per agent`` (N = 1, 64): the exported graph (``a3c
  export --onnx``, one intra-op thread) on the same raw frames, as a ratio
  to ``act_batch``; a ``skipped`` row where not installed.
* ``network N=.. per agent`` / ``pytorch N=.. per agent`` (N = 16, 64): our
  network alone (``Network.step_batch`` on preprocessed frames) and the
  torch twin's batched step (one thread, ``no_grad``) on the same input,
  timed in turn; the note gives torch's time as a ratio to ours (above 1:
  ours is faster).  Skipped, with a row saying so, without torch.
* ``preprocess``: uint8 gray 120x160 -> float32 84x84 (area resize), us.

``--skip-embed`` leaves out all but ``preprocess``.
"""
from __future__ import annotations

import os
import statistics
import tempfile

import numpy as np

from a3c_core import _conv
from a3c_core.bench.machine import Row, interleaved, us
from a3c_core.core import Preprocessor
from a3c_core.nn import batch as batch_mod
from a3c_core.nn.network import build_network
from a3c_core.policy import Policy
from a3c_core.timing import time_call

#: batch sizes of the embedding rows (issue 43: per-agent cost at N = 1, 8, 64, 256)
EMBED_NS = (1, 8, 64, 256)
#: batch sizes of the network-alone rows against PyTorch (a batched worker's
#: K = 16 and an embedding's 64)
TORCH_NS = (16, 64)


def _embed_policy(net, raw_shape, pipe_spec):
    """A Policy over a copy of ``net``'s weights (so nothing the other rows use is shared)."""
    twin = build_network(net.spec["name"], net.obs_shape, net.n_actions, **net.spec["kwargs"])
    twin.params[:] = net.params
    return Policy.from_network(twin, raw_shape, pipe_spec)


def bench_embedding(net, raw_shape, pipe_spec, repeat, min_time, ns=EMBED_NS) -> list[Row]:
    """Serving N agents from raw frames: ``Policy.act`` (batch 1) and
    ``Policy.act_batch`` per agent at each N, with the ratio to ``act`` in
    the notes (one run, each N timed in turn with the batch-1 call so that
    machine load hits both alike); then onnxruntime (``a3c export --onnx``,
    one intra-op thread) on the same frames and our network alone against
    PyTorch's (the torch twin, one thread) where installed (see the module
    docstring).  One BLAS thread, on one core (``a3c bench`` pins it):
    per-core figures."""
    policy = _embed_policy(net, raw_shape, pipe_spec)
    rng = np.random.default_rng(0)
    nmax = max(ns)
    if policy.pipeline.kind == "image":
        frames = rng.integers(0, 256, (nmax,) + tuple(raw_shape), dtype=np.uint8)
    else:
        frames = rng.standard_normal((nmax,) + tuple(raw_shape)).astype(np.float32)
    s1 = policy.initial_state()
    rows, batch_us = [], {}

    def single():
        policy.act(frames[0], s1)

    act_all = []
    for n in ns:
        states = policy.initial_state(n)
        fr = frames[:n]

        def batch(fr=fr, states=states):
            policy.act_batch(fr, states)

        a, b = interleaved(single, batch, repeat, min_time)
        act_all += a
        per = [x / n for x in b]
        ratio = statistics.median(per) / statistics.median(a)
        batch_us[n] = statistics.median(per) * 1e6
        rows.append(Row(f"act_batch N={n} per agent", us(per), "us",
                        f"{ratio:.2f}x of Policy.act's batch-1 call (timed in turn with it); "
                        f"convs: {'direct, ' + _conv.ISA if _conv.ISA else 'im2col + GEMM'}",
                        {"ratio_to_act": ratio, "n": n}))
    if _conv.ISA and 64 in ns:     # the direct convs against the im2col + GEMM path they replace
        gemm = _embed_policy(net, raw_shape, pipe_spec)
        states = gemm.initial_state(64)
        batch_mod.DIRECT_CONV = False       # read when the call's scratch is built
        try:
            gemm.act_batch(frames[:64], states)
        finally:
            batch_mod.DIRECT_CONV = True
        a, b = interleaved(lambda: policy.act_batch(frames[:64], states),
                           lambda: gemm.act_batch(frames[:64], states), repeat, min_time)
        ratio = statistics.median(b) / statistics.median(a)
        rows.append(Row("act_batch N=64, im2col + GEMM convs", us([x / 64 for x in b]), "us",
                        f"{ratio:.2f}x of act_batch N=64 with the direct convs (timed in turn)",
                        {"ratio_to_direct": ratio, "n": 64}))
    rows.insert(0, Row("Policy.act (batch 1)", us(act_all), "us",
                       f"{net.spec['name']}, raw {tuple(raw_shape)} frame -> action"))
    rows.extend(_bench_embed_peers(policy, frames, repeat, min_time, batch_us))
    return rows


def _bench_embed_peers(policy, frames, repeat, min_time, batch_us) -> list[Row]:
    """onnxruntime and PyTorch rows of :func:`bench_embedding` (skipped,
    with a note, where not installed)."""
    from a3c_core.export import export_onnx, onnx_session
    from a3c_core.nn import torch_twin

    rows = []
    ns = [n for n in (1, 64) if n in batch_us]
    try:
        with tempfile.TemporaryDirectory(prefix="a3c-bench-onnx-") as d:
            path = export_onnx(policy, os.path.join(d, "policy.onnx"))
            sess = onnx_session(path)
    except ImportError as e:
        rows.append(Row("onnxruntime", [float("nan")], "us", f"skipped: {e}"))
        sess = None
    net = policy.net
    for n in ns if sess is not None else ():
        feed = {"obs": frames[:n]}
        if net.recurrent:
            feed["h"] = np.zeros((n, net.lstm_size), np.float32)
            feed["c"] = np.zeros((n, net.lstm_size), np.float32)
        s = time_call(lambda feed=feed: sess.run(None, feed), repeat=repeat, min_time=min_time)
        per = [x / n for x in s]
        ratio = statistics.median(per) * 1e6 / batch_us[n]
        rows.append(Row(f"onnxruntime N={n} per agent", us(per), "us",
                        f"{ratio:.2f}x of act_batch N={n} (raw frames in, 1 intra-op thread)",
                        {"ratio_to_act_batch": ratio, "n": n}))
    try:
        torch = torch_twin.import_torch()
    except ImportError as e:
        rows.append(Row("pytorch", [float("nan")], "us", f"skipped: {e}"))
        return rows
    torch.set_num_threads(1)
    model = torch_twin.torch_model(net)
    for n in TORCH_NS:
        xn = np.ascontiguousarray(policy.batch_input(frames[np.arange(n) % len(frames)]))
        x = torch.from_numpy(xn.copy())
        sn = st = None
        if net.recurrent:
            sn = (np.zeros((n, net.lstm_size), np.float32),) * 2
            st = (torch.zeros(n, net.lstm_size), torch.zeros(n, net.lstm_size))

        def theirs(x=x, st=st):
            with torch.no_grad():
                model.step_batch(x, st)

        a, b = interleaved(lambda xn=xn, sn=sn: net.step_batch(xn, sn), theirs, repeat, min_time)
        ours, per = [v / n for v in a], [v / n for v in b]
        ratio = statistics.median(per) / statistics.median(ours)
        rows.append(Row(f"network N={n} per agent", us(ours), "us",
                        f"Network.step_batch alone (frames preprocessed beforehand), timed in "
                        f"turn with PyTorch's", {"n": n}))
        rows.append(Row(f"pytorch N={n} per agent", us(per), "us",
                        f"{ratio:.2f}x of our network alone at N={n} (the torch twin, "
                        f"torch {torch.__version__}, 1 thread, no_grad)",
                        {"ratio_to_network": ratio, "n": n}))
    return rows


def bench_preprocess(in_shape, out_shape, repeat, min_time) -> Row:
    """The frame preprocessing (uint8 gray -> float32, area resize), us."""
    prep = Preprocessor(tuple(in_shape), tuple(out_shape))
    frame = np.random.default_rng(0).integers(0, 256, tuple(in_shape), dtype=np.uint8)
    out = np.empty(tuple(out_shape), np.float32)
    s = time_call(lambda: prep(frame, out), repeat=repeat, min_time=min_time)
    shp = "x".join(map(str, in_shape))
    return Row("preprocess", us(s), "us", f"uint8 {shp} -> float32 {out_shape[0]}x{out_shape[1]} area resize")
