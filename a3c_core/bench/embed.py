"""The embedding rows of ``a3c bench`` (serving agents from raw frames) and ``preprocess``.

* ``Policy.act (batch 1)``: raw frame -> action, us.
* ``act_batch N=.. per agent`` (N = 1, 8, 64, 256): ``Policy.act_batch``
  per agent, each N timed in turn with the batch-1 call; the note gives the
  ratio to ``act``.  Where the direct convolutions run,
  ``act_batch N=64, im2col + GEMM convs`` times the path they replace.
* ``onnxruntime N=.. per agent`` / ``pytorch N=.. per agent`` (N = 1, 64):
  the exported graph (``a3c export --onnx``, one intra-op thread) and the
  torch twin (one thread) on the same frames, as ratios to ``act_batch``;
  a ``skipped`` row where not installed.
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
    one intra-op thread) and PyTorch (the torch twin, one thread) on the
    same frames where installed, as ratios to ``act_batch``.  One BLAS
    thread throughout (``a3c bench`` pins it): per-core figures."""
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
    for n in ns:
        x = torch.from_numpy(policy.batch_input(frames[:n]).copy())
        st = None
        if net.recurrent:
            st = (torch.zeros(n, net.lstm_size), torch.zeros(n, net.lstm_size))

        def run(x=x, st=st):
            with torch.no_grad():
                model.step_batch(x, st)

        s = time_call(run, repeat=repeat, min_time=min_time)
        per = [v / n for v in s]
        ratio = statistics.median(per) * 1e6 / batch_us[n]
        rows.append(Row(f"pytorch N={n} per agent", us(per), "us",
                        f"{ratio:.2f}x of act_batch N={n} (network only: frames preprocessed "
                        f"beforehand; torch {torch.__version__}, 1 thread)",
                        {"ratio_to_act_batch": ratio, "n": n}))
    return rows


def bench_preprocess(in_shape, out_shape, repeat, min_time) -> Row:
    """The frame preprocessing (uint8 gray -> float32, area resize), us."""
    prep = Preprocessor(tuple(in_shape), tuple(out_shape))
    frame = np.random.default_rng(0).integers(0, 256, tuple(in_shape), dtype=np.uint8)
    out = np.empty(tuple(out_shape), np.float32)
    s = time_call(lambda: prep(frame, out), repeat=repeat, min_time=min_time)
    shp = "x".join(map(str, in_shape))
    return Row("preprocess", us(s), "us", f"uint8 {shp} -> float32 {out_shape[0]}x{out_shape[1]} area resize")
