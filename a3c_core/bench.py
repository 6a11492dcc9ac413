"""``a3c bench``: kernel, update, env and end-to-end throughput of the A3C engine.

Every row warms up, then times ``--repeat`` repetitions (each long enough to
dwarf the timer) and reports the median, min and max.  Rows:

* ``sgemm peak``: numpy float32 ``n x n @ n x n`` on ONE BLAS thread, GFLOP/s;
  the reference every "fraction of peak" is relative to.
* ``step``: batch-1 ``net.step(obs, state)`` (LSTM state carried), us; the
  note says whether the fused ``doom_step`` kernel or the per-layer kernels ran.
* ``loss_and_grad``: forward + BPTT backward over a ``t_max``-step rollout,
  us and achieved GFLOP/s.  FLOPs come from :func:`flops`: multiply-adds of
  the network's layer list (``layer.flop_rows()``) x 2 for the forward, x 2 again for the backward
  (input grads + weight grads; the first layer needs no input grad).
  Elementwise work (activations, softmax, LSTM gates) is not counted, so the
  figure is a slight under-count of the work actually done.
* ``update``: what a worker does per rollout after the forward steps:
  loss_and_grad + clip_grad_norm + Adam apply (the default) + sync_params, us.
* ``learner us/agent step``: what one worker's learner costs per agent step,
  ``(T x step + update) / T`` with ``update`` = the backward-only
  ``rollout_grad`` over the rows the T ``step(record=True)`` calls recorded +
  the trainer's update tail (norm pass, then Adam with the clip folded in and
  the worker's params written in the same sweep) (:func:`bench_learner`; sampling, the env and the
  bootstrap step, ~1 step / T more, are not in it).  Timed interleaved with
  ``learner us/agent step (recompute)`` (plain steps + ``loss_and_grad``, the
  path before backward-only updates) and, when torch is installed,
  ``learner us/agent step (torch)``: the same rollout done PyTorch-A3C style
  (T ``inference_mode`` steps, forward+backward recompute, ``clip_grad_norm_``,
  ``torch.optim.Adam`` on a shared model, copy back), one thread each.
* ``learner + self-imitation us/agent step`` (:func:`bench_self_imitation`):
  the plain update (``rollout_grad`` + clipped apply) with a real worker's
  self-imitation replays (a row replayed per row played, every replay
  updating), alternated with the plain update in one run; the note gives
  the ratio (doom-lstm only).
* ``memory bandwidth``: every core copies its own 64 MB array at once, GB/s
  (read + written bytes).
* ``step kernel, unpacked/packed args``: the fused step called with its
  static arrays one by one against the packed form the network uses (the
  difference is Numba's per-argument dispatch, paid with the GIL held), us.
* ``rmsprop/adam apply``, ``clip_grad_norm``, ``gae``: flat-buffer kernels, us.
* ``update tail (3 passes)`` / ``(fused)``: an update's fixed cost after the
  backward, paid once per update whatever its length: clip + Adam apply +
  sync as three calls, against the trainer's norm pass + fused apply/sync
  (:func:`bench_update_tail`, interleaved), us.
* ``preprocess``: uint8 gray 120x160 -> float32 84x84 (area resize), us.
* ``env step``: one ``env.step(a)`` of the env (ViZDoom: frame skip 4; the
  episode resets are not timed), us.  Skipped when the env cannot be made.
* ``env adapter overhead`` (``doom:*`` envs): ``DoomEnv.step`` minus the bare
  ``DoomGame`` loop (make_action + screen buffer) on the same game and
  actions, interleaved (:func:`doom_adapter_overhead_us`), us per step.
* ``train steps/s wN`` / ``train frames/s wN``: a real :class:`Trainer` with
  N worker threads; after the first update plus a warm-up period the global
  step counter is sampled every 0.5 s for ``--seconds``; median/min/max are
  over those windows, the note gives the whole-window mean.  frames/s =
  steps/s x frame skip.  ``scaling wN`` = steps/s(N) / (N x steps/s(1)).
* ``GIL held (1 worker)``: the share of wall-clock time one training worker
  keeps the GIL from another thread, measured from outside (see
  :func:`gil_waits`): a probe thread loops "spin a random time (exponential,
  mean 200 us) in a nogil Numba kernel that ends by reading the CPU's
  time-stamp counter, then take the GIL back and read the counter again".
  The difference is how long that GIL request waited: ~0.1 us when the GIL
  is free, the rest of the worker's hold plus a thread wake-up (tens of us
  in a VM) when it is not.  Requests that waited more than
  :data:`GIL_WAIT_THRESHOLD_S` (2 us) arrived while the worker held the
  GIL; with random arrival times their share is the share of time the GIL
  was unavailable (:func:`gil_held_share`), whatever the length of the holds
  and whatever the wake-up costs.  A short nogil call inside a hold (shorter
  than a wake-up) counts as held: a waiting thread cannot use it either.
  Checked against synthetic workers of known GIL time (2-core VM,
  2026-11-26): holds of 10-50 us read within ~15 %, holds of 0.3-5 us read
  0.3-3 us high (docs/results.md).  Where the
  counter cannot be used (not x86-64, or no ``constant_tsc``) the previous
  probe runs instead (:func:`gil_probe`: the summed excess of fixed-length
  cycles, which counts its own jitter and the wake-ups as blocked time and
  under-reads long holds), and the note says so.  The probe holds the GIL
  ~1 us per cycle and busy-spins one core, so it needs a free core: the
  note gives the worker's steps/s with and without the probe and flags the
  row PERTURBED when it drops by >10 %.  ``GIL us/step`` = share / steps/s,
  and 1 / share bounds the thread speed-up.  ``GIL us/step (probe noise
  subtracted)``: the same less the share the probe reads alone.

``--json PATH`` writes the rows plus machine info (CPU model, cores, Python,
numpy, numba versions) and the FLOP counts.  The default run takes about a
minute on 2 cores; ``--quick`` is a few seconds per section (smoke test).
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import threadpoolctl
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from a3c_core import _conv, core
from a3c_core._blas import limit_blas_threads
from a3c_core._fpenv import flush_denormals
from a3c_core._jit import kernel
from a3c_core.checkpoint import versions
from a3c_core.core import Preprocessor
from a3c_core.envs import make_env
from a3c_core.envs.doom import DoomEnv
from a3c_core.export import export_onnx, onnx_session
from a3c_core.nn import batch as batch_mod
from a3c_core.nn import kernels as K
from a3c_core.nn import torch_twin
from a3c_core.nn.blas import gemm_handle
from a3c_core.nn.gradcheck import DEFAULT_OBS
from a3c_core.policy import Policy
from a3c_core.nn.network import build_network
from a3c_core.obs import ObsPipeline
from a3c_core.timing import blas_kernel_note, blas_note, hugepage_info, time_call  # noqa: F401
from a3c_core.timing import time_alternating
from a3c_core.timing import cpu_info as _cpuinfo
from a3c_core.train.config import Config, resolve
from a3c_core.train.trainer import Trainer

# ---------------------------------------------------------------------------
# FLOP counting


def layer_table(net) -> list[dict]:
    """The compute ops of ``net`` as dicts ``{kind, name, macs, ...}`` (per step),
    from its layer list (``layer.flop_rows()``, in layout order).

    ``kind`` is ``conv`` (``in_shape``, ``out_shape``, ``k``, ``stride``,
    ``pad``), ``dense`` (``n_in``, ``n_out``; the heads give ``policy`` and
    ``value``) or ``lstm`` (``n_in``, ``hidden``).
    """
    return [row for layer in net.layers for row in layer.flop_rows()]


def flops(net_or_spec="doom-lstm", obs_shape=(1, 84, 84), n_actions=3, *, T=1, **spec_kwargs) -> dict:
    """FLOPs of ``T`` steps of a network: ``{forward, backward, total, per_step, layers}``.

    ``net_or_spec`` is a built network or a spec name (built with
    ``obs_shape``, ``n_actions``).  forward = 2 x multiply-adds of every
    conv/dense/LSTM layer; backward = 2 x forward minus the first layer's
    input-gradient GEMM (the observation needs no gradient).  Elementwise
    operations are not counted.
    """
    if isinstance(net_or_spec, str):
        net = build_network(net_or_spec, obs_shape, n_actions, **spec_kwargs)
    else:
        net = net_or_spec
    return flops_of_layers(layer_table(net), T=T)


def flops_of_layers(layers, *, T=1) -> dict:
    """See :func:`flops`; ``layers`` as returned by :func:`layer_table`."""
    fwd = sum(2 * L["macs"] for L in layers)
    first = 2 * layers[0]["macs"] if layers else 0
    bwd = 2 * fwd - first
    return {"forward": fwd * T, "backward": bwd * T, "total": (fwd + bwd) * T,
            "per_step": {"forward": fwd, "backward": bwd},
            "layers": [dict(L, forward_flops=2 * L["macs"]) for L in layers], "T": T}


# ---------------------------------------------------------------------------
# machine info and timing helpers


def machine_info() -> dict:
    """CPU model and vector extensions, core counts, OS, Python / numpy /
    numba versions, BLAS (library, kernel set, ``OPENBLAS_CORETYPE``)."""
    model, flags = _cpuinfo()
    cpu = model or platform.processor() or platform.machine()
    info = {
        "cpu_model": cpu,
        "cpu_isa": sorted(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512bw",
                                                    "avx512vl", "avx512_bf16")),
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        **versions(),  # python, numpy, numba, a3c_core
        "hugepages": hugepage_info(),
    }
    # the backward's path: one compiled call per layer through numpy's BLAS, or np.dot
    info["backward"] = "compiled" if gemm_handle() is not None else "numpy"
    info["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "num_threads",
                                           "architecture")}
                    for d in threadpoolctl.threadpool_info() if d.get("user_api") == "blas"]
    # OpenBLAS reads it once, when numpy loads it: the kernel set of every GEMM
    info["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    info["blas_note"] = blas_note(info)
    return info


class Row:
    """One table row: ``name``, ``median``/``min``/``max`` in ``unit``, ``notes``."""

    def __init__(self, name, samples, unit, notes="", extra=None):
        vals = [float(v) for v in samples]
        self.name, self.unit, self.notes = name, unit, notes
        self.median = statistics.median(vals)
        self.min, self.max = min(vals), max(vals)
        self.n = len(vals)
        self.extra = extra or {}

    def to_dict(self):
        d = {"name": self.name, "median": self.median, "min": self.min, "max": self.max,
             "unit": self.unit, "notes": self.notes, "samples": self.n}
        d.update(self.extra)
        return d


def _us(samples):
    return [s * 1e6 for s in samples]


# ---------------------------------------------------------------------------
# sections


def bench_bandwidth(mb, repeat) -> Row:
    """Memory bandwidth, GB/s: every core copies its own ``mb`` MB float32
    array at once (numpy's copy loop runs without the GIL); bytes read +
    written / wall time.  The figure a memory-bound workload (the optimizer
    apply, reading weights that no cache holds) shares among all workers."""
    n_thr = default_workers()[-1]
    n = mb * (1 << 20) // 4
    srcs = [np.ones(n, np.float32) for _ in range(n_thr)]
    dsts = [np.empty(n, np.float32) for _ in range(n_thr)]
    barrier = threading.Barrier(n_thr + 1)

    def copy(i):
        barrier.wait()
        np.copyto(dsts[i], srcs[i])
        barrier.wait()

    out = []
    for _ in range(repeat + 1):
        ths = [threading.Thread(target=copy, args=(i,)) for i in range(n_thr)]
        for th in ths:
            th.start()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        out.append(2 * 4 * n * n_thr / (time.perf_counter() - t0) / 1e9)
        for th in ths:
            th.join()
    return Row("memory bandwidth", out[1:], "GB/s",
               f"{n_thr} thread(s) each copying {mb} MB float32 (read + write bytes / time)",
               {"threads": n_thr})


def bench_sgemm(n, repeat, min_time) -> Row:
    """Single-thread float32 GEMM GFLOP/s (numpy/BLAS), the peak reference."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    secs = time_call(lambda: np.matmul(a, b, out=c), repeat=repeat, min_time=min_time)
    gf = [2.0 * n ** 3 / s / 1e9 for s in secs]
    return Row("sgemm peak", gf, "GFLOP/s", f"numpy float32 {n}x{n}x{n}, 1 BLAS thread")


def _rollout(net, T, rng):
    obs = rng.random((T,) + tuple(net.obs_shape), dtype=np.float32).astype(net.params.dtype)
    actions = rng.integers(0, net.n_actions, T).astype(np.int64)
    returns = rng.standard_normal(T).astype(net.params.dtype)
    adv = rng.standard_normal(T).astype(net.params.dtype)
    return obs, actions, returns, adv


def bench_network(net, T, repeat, min_time, peak, fl) -> list[Row]:
    rows = []
    rng = np.random.default_rng(0)
    obs1 = rng.random(tuple(net.obs_shape), dtype=np.float32)
    holder = [net.initial_state()]

    def step():
        _, _, holder[0] = net.step(obs1, holder[0])

    s = time_call(step, repeat=repeat, min_time=min_time)
    gf = fl["per_step"]["forward"] / statistics.median(s) / 1e9
    path = "fused doom_step" if net.fused_step else "per-layer kernels"
    rows.append(Row("step (batch 1)", _us(s), "us",
                    f"{net.spec['name']} ({path}); {gf:.1f} GFLOP/s = {gf / peak:.0%} of sgemm peak "
                    f"({fl['per_step']['forward'] / 1e6:.2f} MFLOP)"))

    if net.fused_step:
        rows.extend(bench_step_packing(net, obs1, repeat, min_time))

    obs, actions, returns, adv = _rollout(net, T, rng)
    state0 = net.initial_state()

    def lag():
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)

    s = time_call(lag, repeat=repeat, min_time=min_time)
    rows.append(Row(f"loss_and_grad T={T}", _us(s), "us", "forward + BPTT backward, grads into flat buffer"))
    total = fl["forward"] + fl["backward"]
    gfs = [total / x / 1e9 for x in s]
    rows.append(Row(f"loss_and_grad T={T} GFLOP/s", gfs, "GFLOP/s",
                    f"{total / 1e6:.1f} MFLOP/update; {statistics.median(gfs) / peak:.0%} of sgemm peak",
                    {"fraction_of_peak": statistics.median(gfs) / peak, "flops": total}))

    shared = net.params.copy()
    opt = core.Adam(net.n_params, lr=1e-4)  # the trainer's default optimizer

    def update():
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)
        core.clip_grad_norm(net.grads, 40.0)
        opt.apply(shared, net.grads, 0)
        core.sync_params(shared, net.params)

    s = time_call(update, repeat=repeat, min_time=min_time)
    rows.append(Row(f"update T={T}", _us(s), "us", "loss_and_grad + clip + Adam apply + sync_params"))

    rows.extend(bench_learner(net, T, repeat, min_time))
    if len(net.obs_shape) == 3 and net.spec["name"] == "doom-lstm":
        rows.append(bench_self_imitation(net, T, repeat))

    grads = (rng.standard_normal(net.n_params) * 1e-3).astype(net.params.dtype)
    params = net.params.copy()
    n = net.n_params
    for name, opt in (("rmsprop apply", core.RMSProp(n, lr=7e-4, alpha=0.99, eps=0.1)),
                      ("adam apply", core.Adam(n, lr=1e-4)),
                      ("adam apply (amsgrad)", core.Adam(n, lr=3e-4, amsgrad=True))):
        s = time_call(lambda: opt.apply(params, grads, 0), repeat=repeat, min_time=min_time)
        rows.append(Row(name, _us(s), "us", f"{n:,} float32 params, in place"))
    rows.extend(bench_update_tail(n, grads, repeat, min_time))
    g2 = grads.copy()
    s = time_call(lambda: core.clip_grad_norm(g2, 1e9), repeat=repeat, min_time=min_time)
    rows.append(Row("clip_grad_norm", _us(s), "us", f"{n:,} params (no rescale)"))
    r = rng.standard_normal(T).astype(np.float32)
    v = rng.standard_normal(T).astype(np.float32)
    s = time_call(lambda: core.gae(r, v, 0.5, 0.99, 1.0), repeat=repeat, min_time=min_time)
    rows.append(Row(f"gae T={T}", _us(s), "us", "returns + advantages"))
    return rows


def _interleaved(fa, fb, repeat, min_time):
    """Samples of ``fa`` and ``fb`` timed in turn (warm-up first), so machine
    load hits both alike; ``(samples_a, samples_b)`` in seconds."""
    for fn in (fa, fb):
        time_call(fn, repeat=1, min_time=min_time / 4, warmup=2)
    a, b = [], []
    for _ in range(repeat):
        a += time_call(fa, repeat=1, min_time=min_time, warmup=0)
        b += time_call(fb, repeat=1, min_time=min_time, warmup=0)
    return a, b


def bench_step_packing(net, obs1, repeat, min_time) -> list[Row]:
    """The fused step kernel called with its 33 arguments unpacked (what the
    network passed before) against the packed form it passes now (11: two
    flat buffers and an int table), interleaved: the difference is Numba's
    per-argument dispatch cost, paid with the GIL held."""
    st, pk = net.fused_static, net.fused_packed
    h, c = net.initial_state() if net.recurrent else (np.zeros(1, net.dtype),) * 2
    out = [np.empty_like(h), np.empty_like(c), np.empty(net.n_actions, net.dtype)]
    obs = np.ascontiguousarray(obs1, net.dtype)

    def unpacked():
        K.doom_step(obs, h, c, *out, *st)

    def packed():
        K.doom_step_packed(obs, h, c, *out, *pk)

    a, b = _interleaved(unpacked, packed, repeat, min_time)
    diff = statistics.median(x - y for x, y in zip(a, b)) * 1e6
    return [Row("step kernel, unpacked args", _us(a), "us",
                f"doom_step with its {6 + len(st)} arguments"),
            Row("step kernel, packed args", _us(b), "us",
                f"doom_step_packed, {6 + len(pk)} arguments; {diff:.1f} us less per step "
                f"(median of interleaved pairs)", {"saved_us": diff})]


def bench_update_tail(n, grads, repeat, min_time) -> list[Row]:
    """An update's fixed cost after the backward, per update (independent of
    T): the old three passes (clip, Adam apply, sync) against the trainer's
    path (norm pass, Adam with the clip folded in and the worker's params
    written in the same sweep), timed interleaved."""
    local = np.zeros(n, np.float32)
    shared_old = core.SharedState(np.zeros(n, np.float32), core.Adam(n, lr=1e-4))
    shared_new = core.SharedState(np.zeros(n, np.float32), core.Adam(n, lr=1e-4))
    g = grads.copy()

    def old():
        core.clip_grad_norm(g, 1e9)
        shared_old.optimizer.apply(shared_old.params, g, 0)
        core.sync_params(shared_old.params, local)

    def new():
        shared_new.apply(g, 1e9, sync_to=local)

    a, b = _interleaved(old, new, repeat, min_time)
    ratio = statistics.median(x / y for x, y in zip(a, b))
    return [Row("update tail (3 passes)", _us(a), "us",
                f"clip_grad_norm + Adam apply + sync_params, {n:,} params"),
            Row("update tail (fused)", _us(b), "us",
                f"norm pass + Adam apply writing the local copy (SharedState.apply(sync_to=)); "
                f"{ratio:.2f}x faster than 3 passes, interleaved", {"speedup": ratio})]


def _torch_learner(net, obs, actions, returns, adv, state0):
    """A PyTorch-A3C-style learner rollout for ``net``'s twin, or None without torch."""
    try:
        torch = torch_twin.import_torch()
    except ImportError:
        return None
    torch.set_num_threads(1)
    model = torch_twin.torch_model(net)
    shared = copy.deepcopy(model)
    opt = torch.optim.Adam(shared.parameters(), lr=1e-4)
    x = torch.from_numpy(np.ascontiguousarray(obs, np.float32))
    ts0 = torch_twin.torch_state(state0, model)
    pairs = list(zip(model.parameters(), shared.parameters()))

    def rollout():
        st = ts0
        with torch.inference_mode():
            for t in range(x.shape[0]):
                logits, _, st = model(x[t:t + 1], st)
                torch.softmax(logits, 1)
        torch_twin.torch_loss_and_grad(model, obs, actions, returns, adv, state0)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 40.0)
        for p, sp in pairs:
            sp.grad = p.grad
        opt.step()
        with torch.no_grad():
            for p, sp in pairs:
                p.copy_(sp)

    return rollout


def bench_learner(net, T, repeat, min_time) -> list[Row]:
    """``learner us/agent step`` rows: backward-only (ours), recompute (ours,
    the old path) and PyTorch-style recompute (when torch is installed), the
    paths timed interleaved (one sample of each in turn) so machine load
    hits them alike.  Each = one rollout's ``T`` steps + update, / ``T``."""
    rng = np.random.default_rng(1)
    obs, actions, returns, adv = _rollout(net, T, rng)
    state0 = net.initial_state()
    shared = net.params.copy()
    opt = core.Adam(net.n_params, lr=1e-4)
    fused = core.SharedState(net.params, core.Adam(net.n_params, lr=1e-4))

    def apply():      # the path before: clip pass(es), apply pass, sync pass
        core.clip_grad_norm(net.grads, 40.0)
        opt.apply(shared, net.grads, 0)
        core.sync_params(shared, net.params)

    def backward_only():
        net.begin_rollout(T)
        s = state0
        for t in range(T):
            _, _, s = net.step(obs[t], s, record=True)
        net.rollout_grad(actions, returns, adv, value_coef=0.5, entropy_beta=0.01)
        # the trainer's update: norm pass, then apply with the clip folded in
        # and the worker's params refreshed in the same sweep
        fused.apply(net.grads, 40.0, sync_to=net.params)

    def recompute():
        s = state0
        for t in range(T):
            _, _, s = net.step(obs[t], s)
        net.loss_and_grad(obs, actions, returns, adv, state0, value_coef=0.5, entropy_beta=0.01)
        apply()

    paths = {"backward-only": backward_only, "recompute": recompute}
    torch_fn = _torch_learner(net, obs, actions, returns, adv, state0)
    if torch_fn is not None:
        paths["torch"] = torch_fn
    samples = {k: [] for k in paths}
    for fn in paths.values():
        time_call(fn, repeat=1, min_time=min_time / 4, warmup=2)
    for _ in range(repeat):
        for k, fn in paths.items():
            samples[k] += time_call(fn, repeat=1, min_time=min_time, warmup=0)
    per = {k: [s * 1e6 / T for s in v] for k, v in samples.items()}
    med = {k: statistics.median(v) for k, v in per.items()}
    # the per-sample ratio of interleaved neighbours is steadier than the ratio of medians
    ratio = statistics.median(b / a for a, b in zip(per["backward-only"], per["recompute"]))
    note = (f"T={T}: T x step(record) + rollout_grad + norm + Adam with clip and sync fused, / T; "
            f"recompute path {med['recompute']:.0f} us ({ratio:.2f}x)")
    if "torch" in med:
        tr = statistics.median(b / a for a, b in zip(per["backward-only"], per["torch"]))
        note += f"; torch recompute-style {med['torch']:.0f} us ({tr:.2f}x)"
    rows = [Row("learner us/agent step", per["backward-only"], "us", note,
                {"recompute_over_backward_only": ratio}),
            Row("learner us/agent step (recompute)", per["recompute"], "us",
                "T x step + loss_and_grad + clip + Adam + sync, / T (the path before "
                "backward-only updates)")]
    if "torch" in per:
        rows.append(Row("learner us/agent step (torch)", per["torch"], "us",
                        "PyTorch-A3C style: T inference_mode steps + forward/backward recompute "
                        "+ clip_grad_norm_ + Adam on a shared model + copy back, / T, 1 thread"))
    return rows


#: rows of each episode ``bench_self_imitation`` keeps: deadly_corridor's episodes (the
#: scenario it is on by default) run 32-41 steps once past the trap (docs/scenarios.md)
SIL_EPISODE_ROWS = 40


def measure_sil_cost(*, t_max=20, episode_rows=SIL_EPISODE_ROWS, repeat=31, warmup=3,
                     seed=0, obs_shape=(1, 84, 84), n_actions=3) -> dict:
    """Learner microseconds per agent step of the plain update and of the
    update with self-imitation (``--self-imitation``), on the doom-lstm
    workload, in one run: ``warmup`` rounds, then ``repeat`` rounds
    alternating the two; medians.

    plain: ``rollout_grad`` over one ``t_max``-row recorded rollout + the
    shared optimizer's clip and apply (with the local refresh), as a worker
    runs them.  With self-imitation: the
    same plus a real :class:`~a3c_core.train.worker.Worker`'s
    ``sil_replay`` for the rows played: it replays whole kept episodes (a
    row replayed per row played), each a batched forward over the episode,
    its backward and one more clipped Hogwild apply, with subnormal floats
    flushed to zero as in a worker thread.  The worker keeps
    ``SelfImitation.EPISODES`` episodes of ``episode_rows`` rows that each pay
    +1 per step, so every replay's return beats the value and every replay
    updates: the most a replay costs (one whose return beats no value skips
    the backward and the apply; a run logs the share that updated as
    ``charts/sil_update_share``).  A round is ``lcm(t_max, episode_rows) /
    t_max`` updates, so each replays the same rows.

    Returns ``{"plain_us_per_step", "sil_us_per_step", "ratio", "replays",
    "updates", "rows_played", "rows_replayed", "rounds_per_sample", "t_max",
    "episode_rows", "repeat"}``; the counts are over the timed rounds."""
    from a3c_core.core.normalize import AdvantageNormalizer, ReturnNormalizer
    from a3c_core.train.sil import SelfImitation
    from a3c_core.train.worker import RolloutSettings, ThreadStore, Worker

    # as in a worker: one BLAS thread, subnormal floats flushed (Worker.run)
    with limit_blas_threads(1), flush_denormals():
        net = build_network("doom-lstm", obs_shape, n_actions, seed=seed)
        shared = core.SharedState(net.params.copy(), core.make_optimizer("adam", net.n_params))
        store = ThreadStore(shared, ReturnNormalizer(0.99), adv_normalizer=AdvantageNormalizer())
        settings = RolloutSettings(t_max=t_max, gamma=0.99, reward_scale=None,
                                   normalize_advantages=True, self_imitation=True)
        w = Worker(0, _NoEnv(), net, _FramePipe(obs_shape), store, settings,
                   np.random.default_rng(seed), fused_act=False)
        rng = np.random.default_rng(seed)
        for _ in range(SelfImitation.EPISODES):
            w.sil_keep(rng.random((episode_rows,) + tuple(obs_shape)).astype(net.dtype),
                       rng.integers(0, n_actions, episode_rows), np.ones(episode_rows))
        obs = rng.random((t_max,) + tuple(obs_shape)).astype(net.dtype)
        actions = rng.integers(0, n_actions, t_max)
        returns = rng.standard_normal(t_max).astype(np.float32)
        adv = rng.standard_normal(t_max).astype(np.float32)
        net.record_rollout(obs)
        rounds = math.lcm(t_max, episode_rows) // t_max

        def plain():
            for _ in range(rounds):
                net.rollout_grad(actions, returns, adv)
                shared.apply(net.grads, 40.0, sync_to=net.params)

        def with_sil():
            for _ in range(rounds):
                net.rollout_grad(actions, returns, adv)
                shared.apply(net.grads, 40.0, sync_to=net.params)
                w.sil_replay(t_max)

        time_alternating(plain, with_sil, repeat=0, warmup=warmup)
        replays0, updates0 = w.stats.sil_replays, w.stats.sil_updates
        a, b = time_alternating(plain, with_sil, repeat=repeat, warmup=0)
    steps = rounds * t_max
    pa, pb = float(np.median(a)) * 1e6 / steps, float(np.median(b)) * 1e6 / steps
    replays = int(w.stats.sil_replays - replays0)
    return {"plain_us_per_step": pa, "sil_us_per_step": pb, "ratio": pb / pa,
            "replays": replays, "updates": int(w.stats.sil_updates - updates0),
            "rows_played": repeat * steps, "rows_replayed": replays * episode_rows,
            "rounds_per_sample": rounds, "t_max": t_max, "episode_rows": episode_rows,
            "repeat": repeat}


class _NoEnv:
    """The env of :func:`measure_sil_cost`'s worker, which only replays (never stepped)."""


class _FramePipe:
    """The pipeline of :func:`measure_sil_cost`'s worker (never called)."""

    def __init__(self, shape):
        self.net_obs_shape = tuple(shape)


def bench_self_imitation(net, T, repeat) -> Row:
    """Self-imitation's cost (``--self-imitation``): learner µs per agent
    step with its replays against the plain update, alternated in one run
    (:func:`measure_sil_cost`)."""
    r = measure_sil_cost(t_max=T, repeat=max(4 * repeat + 1, 11), warmup=3,
                         obs_shape=tuple(net.obs_shape), n_actions=net.n_actions)
    return Row("learner + self-imitation us/agent step", [r["sil_us_per_step"]], "us",
               f"{r['ratio']:.2f}x of the plain update's {r['plain_us_per_step']:.0f} us "
               f"(T={T}; a row replayed per row played, episodes of {r['episode_rows']} rows, "
               f"every replay updating; medians of {r['repeat']} alternating rounds)",
               {"ratio": r["ratio"], "plain_us_per_step": r["plain_us_per_step"]})


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

        a, b = _interleaved(single, batch, repeat, min_time)
        act_all += a
        per = [x / n for x in b]
        ratio = statistics.median(per) / statistics.median(a)
        batch_us[n] = statistics.median(per) * 1e6
        rows.append(Row(f"act_batch N={n} per agent", _us(per), "us",
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
        a, b = _interleaved(lambda: policy.act_batch(frames[:64], states),
                            lambda: gemm.act_batch(frames[:64], states), repeat, min_time)
        ratio = statistics.median(b) / statistics.median(a)
        rows.append(Row("act_batch N=64, im2col + GEMM convs", _us([x / 64 for x in b]), "us",
                        f"{ratio:.2f}x of act_batch N=64 with the direct convs (timed in turn)",
                        {"ratio_to_direct": ratio, "n": 64}))
    rows.insert(0, Row("Policy.act (batch 1)", _us(act_all), "us",
                       f"{net.spec['name']}, raw {tuple(raw_shape)} frame -> action"))
    rows.extend(_bench_embed_peers(policy, frames, repeat, min_time, batch_us))
    return rows


def _bench_embed_peers(policy, frames, repeat, min_time, batch_us) -> list[Row]:
    """onnxruntime and PyTorch rows of :func:`bench_embedding` (skipped,
    with a note, where not installed)."""
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
        rows.append(Row(f"onnxruntime N={n} per agent", _us(per), "us",
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
        x = torch.from_numpy(policy._batch_input(frames[:n]).copy())
        st = None
        if net.recurrent:
            st = (torch.zeros(n, net.lstm_size), torch.zeros(n, net.lstm_size))

        def run(x=x, st=st):
            with torch.no_grad():
                model.step_batch(x, st)

        s = time_call(run, repeat=repeat, min_time=min_time)
        per = [v / n for v in s]
        ratio = statistics.median(per) * 1e6 / batch_us[n]
        rows.append(Row(f"pytorch N={n} per agent", _us(per), "us",
                        f"{ratio:.2f}x of act_batch N={n} (network only: frames preprocessed "
                        f"beforehand; torch {torch.__version__}, 1 thread)",
                        {"ratio_to_act_batch": ratio, "n": n}))
    return rows


def bench_preprocess(in_shape, out_shape, repeat, min_time) -> Row:
    prep = Preprocessor(tuple(in_shape), tuple(out_shape))
    frame = np.random.default_rng(0).integers(0, 256, tuple(in_shape), dtype=np.uint8)
    out = np.empty(tuple(out_shape), np.float32)
    s = time_call(lambda: prep(frame, out), repeat=repeat, min_time=min_time)
    shp = "x".join(map(str, in_shape))
    return Row("preprocess", _us(s), "us", f"uint8 {shp} -> float32 {out_shape[0]}x{out_shape[1]} area resize")


def bench_env(env, repeat, min_time) -> list[Row]:
    """env.step(a) of random actions; resets are done outside the timed region."""
    rng = np.random.default_rng(0)
    env.reset()
    acts = rng.integers(0, env.n_actions, 4096)
    pos = [0]

    def batch(n):
        t = 0.0
        for _ in range(n):
            a = int(acts[pos[0] & 4095])
            pos[0] += 1
            t0 = time.perf_counter()
            _, _, term, trunc = env.step(a)
            t += time.perf_counter() - t0
            if term or trunc:
                env.reset()
        return t

    batch(20)
    t0 = time.perf_counter()
    batch(10)
    per = max((time.perf_counter() - t0) / 10, 1e-6)
    n = max(10, int(min_time / per))
    samples = [batch(n) / n for _ in range(repeat)]
    spec = env.spec() if callable(getattr(env, "spec", None)) else {}
    fs = spec.get("frame_skip", "?") if isinstance(spec, dict) else "?"
    resets = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(5):
            env.reset()
        resets.append((time.perf_counter() - t0) / 5)
    return [Row("env step", _us(samples), "us", f"{spec.get('id', '?') if isinstance(spec, dict) else ''}"
                f" frame skip {fs}; random actions; resets untimed"),
            Row("env reset", _us(resets), "us",
                "env.reset() (a new episode; paid once per episode, so per agent step it "
                "weighs 1/episode length: a trained doom:basic agent's episodes are ~6 steps)")]


# -- end to end -------------------------------------------------------------


class _TrainerRun:
    """A real Trainer in a background thread, stopped by :meth:`stop`."""

    def __init__(self, env, spec, workers, seed=0, limit_s=600.0, envs_per_worker=1,
                 processes=False):
        self.tmp = tempfile.TemporaryDirectory(prefix="a3c-bench-")
        cfg = Config(env=env, spec=spec, workers=workers, total_steps=0, total_seconds=float(limit_s),
                     seed=seed, envs_per_worker=int(envs_per_worker), run_dir=os.path.join(self.tmp.name, "run"), quiet=True,
                     tensorboard=False, checkpoint_interval=0.0, log_interval=1.0,
                     worker_processes=bool(processes))
        self.trainer = Trainer(cfg, out=io.StringIO())
        self.n_envs = int(workers) * int(envs_per_worker)
        self.ramp_s = 0.0
        es = self.trainer.env_spec if isinstance(self.trainer.env_spec, dict) else {}
        self.frame_skip = int(es.get("frame_skip") or cfg.frame_skip or 1)
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, name="a3c-bench-trainer", daemon=True)

    def _run(self):
        try:
            self.result = self.trainer.run()
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self.error = e

    @property
    def steps(self):
        return self.trainer.live_steps()

    def _all_updated(self):
        """Every worker is built (its envs started) and has applied an update."""
        counts = self.trainer.worker_updates()
        return bool(counts) and min(counts) > 0

    def start(self, warmup, timeout=None):
        """Start; return once every worker has made its first update and
        ``warmup`` s passed.

        The envs start one ViZDoom init at a time (a module lock), beside
        the warm-up and then in the workers that still lack theirs, so with
        many workers (times ``envs_per_worker``) the last one starts
        seconds after the first: a window that opened at the first update
        would time a ramp.  ``self.ramp_s`` is the time
        from the first update to the last worker's first update."""
        if timeout is None:     # the envs start one at a time: ~0.1-0.3 s each
            timeout = 120.0 + 0.5 * self.n_envs
        self.thread.start()
        t_end = time.perf_counter() + timeout
        t_first = None
        while not self._all_updated():
            if t_first is None and self.steps > 0:
                t_first = time.perf_counter()
            if not self.thread.is_alive() or time.perf_counter() > t_end:
                self.stop()
                raise RuntimeError("training produced no steps" if t_first is None else
                                   f"not every worker updated within {timeout:g} s")
            time.sleep(0.02)
        self.ramp_s = time.perf_counter() - t_first if t_first is not None else 0.0
        time.sleep(warmup)

    def sample_rates(self, seconds, tick=0.5):
        """Steps/s over ``tick`` windows for ``seconds``; also the overall mean."""
        rates = []
        t0 = t_prev = time.perf_counter()
        s0 = s_prev = self.steps
        while True:
            time.sleep(tick)
            t, s = time.perf_counter(), self.steps
            rates.append((s - s_prev) / (t - t_prev))
            t_prev, s_prev = t, s
            if t - t0 >= seconds:
                break
            if not self.thread.is_alive():
                break
        return rates, (s_prev - s0) / (t_prev - t0)

    def stop(self):
        self.trainer.stop_event.set()
        self.thread.join(120)
        try:
            if self.error is not None:
                raise self.error
        finally:
            self.tmp.cleanup()


def _step_breakdown(n, spent) -> list[Row]:
    """Where an agent step went in the measured window, from the workers'
    timers (``LossStats``' ``t_*`` fields, summed over the workers): env,
    forward (with the preprocessing), backward, apply, and the rest (Python
    glue, the targets, the pull, self-imitation), in us per agent step of
    one worker and as shares of the rollouts' wall time."""
    from a3c_core.train.store import LossStats
    f = {name: float(v) for name, v in zip(LossStats.FIELDS, spent)}
    steps = f["agent_steps"]
    if steps <= 0 or f["t_rollout"] <= 0:
        return []
    parts = [("env", f["t_env"]), ("forward", f["t_forward"]),
             ("backward", f["t_backward"]), ("apply", f["t_apply"])]
    parts.append(("glue", f["t_rollout"] - sum(v for _, v in parts)))
    rows = []
    for name, sec in parts:
        us = 1e6 * sec / steps
        rows.append(Row(f"step {name} w{n}", [us], "us",
                        f"{100 * sec / f['t_rollout']:.0f}% of a worker's rollout time "
                        f"(per agent step, {n} worker(s))",
                        {"workers": n, "share": sec / f["t_rollout"]}))
    return rows


def bench_e2e(env, spec, worker_counts, seconds, warmup, envs_per_worker=1,
              processes=False) -> list[Row]:
    rows, base = [], None
    per = f", {envs_per_worker} envs each" if envs_per_worker > 1 else ""
    kk = f" k{envs_per_worker}" if envs_per_worker > 1 else ""
    kind = "process(es)" if processes else "thread(s)"
    for n in worker_counts:
        run = _TrainerRun(env, spec, n, envs_per_worker=envs_per_worker, processes=processes)
        run.start(warmup)
        before = run.trainer.backend.loss_totals()
        rates, mean = run.sample_rates(seconds)
        spent = run.trainer.backend.loss_totals() - before
        run.stop()
        fs = run.frame_skip
        rows.append(Row(f"train steps/s w{n}{kk}", rates, "steps/s",
                        f"{n} worker {kind}{per}; mean {mean:.0f} over {seconds:g}s after warm-up "
                        f"(all workers updating {run.ramp_s:.1f}s after the first)",
                        {"workers": n, "mean": mean, "ramp_s": run.ramp_s,
                         "processes": bool(processes)}))
        rows.append(Row(f"train frames/s w{n}{kk}", [r * fs for r in rates], "frames/s",
                        f"steps/s x frame skip {fs}; mean {mean * fs:.0f}", {"workers": n, "mean": mean * fs}))
        rows.extend(_step_breakdown(f"{n}{kk}", spent))
        if n == 1:
            base = mean
        if base and n > 1:
            eff = mean / (n * base)
            rows.append(Row(f"scaling w{n}{kk}", [eff], "ratio",
                            f"steps/s(w{n}) / ({n} x steps/s(w1)); speed-up {mean / base:.2f}x",
                            {"workers": n}))
    return rows


# -- GIL --------------------------------------------------------------------


_SPIN = None


def _spin_kernel():
    """A nogil Numba busy loop and its seconds per iteration (compiled once)."""
    global _SPIN
    if _SPIN is None:
        @kernel
        def spin(n):
            x = 0.0
            for i in range(n):
                x += i * 1e-9
            return x

        spin(10)
        per = []
        for _ in range(3):
            t0 = time.perf_counter()
            spin(2_000_000)
            per.append((time.perf_counter() - t0) / 2_000_000)
        _SPIN = (spin, min(per))
    return _SPIN


#: a GIL request that waited longer than this found the GIL held (alone, on
#: the 2-core VM, 99 % of requests take under 1 us and 99.9 % under 2 us)
GIL_WAIT_THRESHOLD_S = 2e-6

_TSC = None


def _tsc_probe():
    """``(spin, now, seconds per spin iteration, counter ticks per second)``:
    a nogil busy loop that returns the time-stamp counter when it ends, and
    a GIL-holding read of it; None where the counter is not a usable clock
    (not x86-64, or the CPU does not report ``constant_tsc``)."""
    global _TSC
    if _TSC is None:
        _TSC = False
        if platform.machine().lower() in ("x86_64", "amd64") and "constant_tsc" in _cpuinfo()[1]:
            _TSC = _build_tsc_probe()
    return _TSC or None


def _build_tsc_probe():
    @intrinsic
    def _rdtsc(typingctx):
        def codegen(context, builder, signature, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                                "llvm.readcyclecounter")
            return builder.call(fn, [])
        return types.uint64(), codegen

    @njit(nogil=True)
    def spin(n):
        x = 0.0
        for i in range(n):
            x += i * 1e-9
        if x < 0.0:           # never: keeps the loop from being optimized away
            return np.uint64(0)
        return _rdtsc()

    @njit(nogil=False)
    def now():
        return _rdtsc()

    spin(10)
    now()
    t0, c0 = time.perf_counter(), now()
    time.sleep(0.05)
    t1, c1 = time.perf_counter(), now()
    hz = (int(c1) - int(c0)) / (t1 - t0)
    per = []
    for _ in range(3):
        t0 = time.perf_counter()
        spin(2_000_000)
        per.append((time.perf_counter() - t0) / 2_000_000)
    if not hz > 0:
        return False
    return spin, now, min(per), hz


def gil_waits(seconds, period=200e-6, seed=0):
    """Seconds each GIL request of a probe thread waited, or None where
    :func:`_tsc_probe` has no counter.

    Each cycle spins a random time (exponential, mean ``period``) in a
    nogil kernel that reads the time-stamp counter as it ends, then reads
    it again once the GIL is back; the difference is the wait.  Random
    spins make the requests arrive at random times, so the share that
    waited is the share of time the GIL was held (:func:`gil_held_share`).
    """
    probe = _tsc_probe()
    if probe is None:
        return None
    spin, now, per, hz = probe
    rng = np.random.default_rng(seed)
    n = max(1, int(period / per))
    lens = np.maximum(1, rng.exponential(n, size=1 << 16)).astype(np.int64)
    out = []
    perf = time.perf_counter
    t_end = perf() + seconds
    i = 0
    while perf() < t_end:
        end = spin(lens[i & 0xFFFF])
        got = now()
        out.append(int(got) - int(end))
        i += 1
    return np.asarray(out, np.float64) / hz


def gil_held_share(waits, threshold=GIL_WAIT_THRESHOLD_S) -> float:
    """Share of the GIL requests in ``waits`` (seconds) that waited longer
    than ``threshold``: the share of time another thread held the GIL."""
    waits = np.asarray(waits)
    return float(np.mean(waits > threshold)) if waits.size else 0.0


def gil_probe(seconds, period=200e-6) -> np.ndarray:
    """Durations (s) of probe cycles: ``period`` of GIL-free spinning + GIL
    re-acquisition (the probe before :func:`gil_waits`; ``a3c bench`` falls
    back to it where there is no usable time-stamp counter).

    Each cycle calls a ``nogil`` Numba busy loop of ~``period`` (the GIL is
    released inside), then needs the GIL back to continue in Python.  Alone,
    every cycle lasts about the same; while another thread holds the GIL the
    cycle ends only once that thread lets go (and the hand-off completes).
    Busy-waiting instead of sleeping keeps the CPU out of idle states, so the
    baseline does not depend on how busy the machine is.  The probe holds
    the GIL ~1 us per cycle and keeps one core busy.
    """
    spin, per = _spin_kernel()
    n = max(1, int(period / per))
    out = []
    perf = time.perf_counter
    t_end = perf() + seconds
    t0 = perf()
    while t0 < t_end:
        spin(n)
        t1 = perf()
        out.append(t1 - t0)
        t0 = t1
    return np.asarray(out)


def gil_blocked_fraction(cycles, baseline) -> float:
    """Share of the probe's wall time lost beyond its alone median cycle (time-weighted)."""
    cycles = np.asarray(cycles)
    return float(np.sum(np.maximum(0.0, cycles - baseline)) / max(np.sum(cycles), 1e-12))


def bench_gil(env, spec, seconds, warmup, envs_per_worker=1) -> list[Row]:
    """GIL share of one training worker, by the probe of :func:`gil_waits`
    (or, without a time-stamp counter, :func:`gil_probe`)."""
    timed = gil_waits(0.01) is not None
    if timed:
        alone = gil_waits(1.0, seed=1)
        noise = gil_held_share(alone)
        how = (f"probe GIL requests (after a random nogil spin, mean 200us) that waited "
               f">{GIL_WAIT_THRESHOLD_S * 1e6:g}us")
    else:
        alone = gil_probe(1.0)
        base = float(np.median(alone))
        noise = gil_blocked_fraction(alone, base)
        how = ("TSC unusable, previous probe: share of the probe's time lost beyond its alone "
               "cycle (200us nogil spin + GIL re-acquire)")
    run = _TrainerRun(env, spec, 1, envs_per_worker=envs_per_worker)
    try:
        run.start(warmup)
        _, sps_alone = run.sample_rates(seconds / 2)
        s0, t0 = run.steps, time.perf_counter()
        chunks = []
        t_end = t0 + seconds
        while time.perf_counter() < t_end:  # 0.5 s chunks -> spread for min/max
            chunks.append(gil_waits(0.5, seed=len(chunks) + 2) if timed else gil_probe(0.5))
        sps_probe = (run.steps - s0) / (time.perf_counter() - t0)
    finally:
        run.stop()
    if timed:
        fracs = [gil_held_share(c) for c in chunks]
        frac = gil_held_share(np.concatenate(chunks))
    else:
        fracs = [gil_blocked_fraction(c, base) for c in chunks]
        frac = gil_blocked_fraction(np.concatenate(chunks), base)
    per = f" ({envs_per_worker} envs)" if envs_per_worker > 1 else ""
    note = (f"{how}; alone {noise:.2%}; worker{per} {sps_probe:.0f} steps/s with probe, "
            f"{sps_alone:.0f} without")
    if sps_alone > 0 and sps_probe < 0.9 * sps_alone:
        note = ("PERTURBED (worker >10% slower with the probe: no free core? rerun on a quiet "
                "machine); " + note)
    us_step = [f / sps_probe * 1e6 for f in fracs] if sps_probe > 0 else [0.0]
    us_net = ([max(0.0, f - noise) / sps_probe * 1e6 for f in fracs] if sps_probe > 0
              else [0.0])
    extra = {"fraction": frac, "probe_alone_fraction": noise, "estimator":
             "waits" if timed else "cycles", "worker_sps_with_probe": sps_probe,
             "worker_sps_alone": sps_alone, "probe_cycles": int(sum(c.size for c in chunks))}
    if timed:
        allw = np.concatenate(chunks)
        held = allw[allw > GIL_WAIT_THRESHOLD_S]
        extra["blocked_wait_us_p50_p90_p99"] = (
            [float(x) for x in np.percentile(held, [50, 90, 99]) * 1e6] if held.size else [])
    return [
        Row("GIL held (1 worker)", [f * 100 for f in fracs], "%", note, extra),
        Row("GIL us/step", us_step, "us",
            f"GIL-held time per agent step (share / steps/s); threads can speed up at most "
            f"~{(1 / frac if frac > 0 else float('inf')):.0f}x (Amdahl)"),
        Row("GIL us/step (probe noise subtracted)", us_net, "us",
            f"the row above less the share the probe reads with no worker ({noise:.2%}, "
            f"{noise / sps_probe * 1e6 if sps_probe > 0 else 0:.1f} us/step at this rate)",
            {"probe_alone_fraction": noise}),
    ]


# ---------------------------------------------------------------------------
# table and CLI


def format_table(rows) -> str:
    head = ("name", "median", "min", "max", "unit", "notes")
    def num(x, unit=""):
        if unit == "ratio":
            return f"{x:.3f}"
        if x == 0 or not math.isfinite(x):
            return f"{x:g}"
        return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
    body = [(r.name, num(r.median, r.unit), num(r.min, r.unit), num(r.max, r.unit), r.unit, r.notes)
            for r in rows]
    w = [max(len(head[i]), *(len(b[i]) for b in body)) if body else len(head[i]) for i in range(5)]
    lines = ["  ".join([head[0].ljust(w[0])] + [head[i].rjust(w[i]) for i in (1, 2, 3)]
                       + [head[4].ljust(w[4]), head[5]])]
    lines.append("-" * (sum(w) + 8 + 6 + 5))
    for b in body:
        lines.append("  ".join([b[0].ljust(w[0])] + [b[i].rjust(w[i]) for i in (1, 2, 3)]
                               + [b[4].ljust(w[4]), b[5]]))
    return "\n".join(lines)


def _parse_workers(s):
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers: expected e.g. 1,2,4, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--workers: counts must be >= 1, got {s!r}")
    return out


def _parse_envs(s):
    """``K`` or ``K1,K2,...``: the end-to-end rows run for each K in turn."""
    try:
        ks = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, e.g. 1,8, got {s!r}") from None
    if not ks or not all(1 <= k <= 64 for k in ks):
        raise argparse.ArgumentTypeError(f"each must be 1-64, got {s!r}")
    return ks


def default_workers():
    n = os.cpu_count() or 1
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    out.append(n)
    return out


def build_parser():
    p = argparse.ArgumentParser(
        prog="a3c bench",
        description="Measure kernel, update, env and end-to-end A3C throughput (median of "
                    "repetitions after warm-up). See the module docstring of a3c_core.bench "
                    "for what each row measures.")
    p.add_argument("--spec", default="auto", help="network spec (default: the env's default, doom-lstm)")
    p.add_argument("--env", default="doom:basic", help="environment id (default doom:basic)")
    p.add_argument("--workers", type=_parse_workers, default=None,
                   help="worker counts for end-to-end training, e.g. 1,2,4 (default 1,2,..,cores)")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per end-to-end point (default 6, --quick 2)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions per micro-benchmark (default 7, --quick 3)")
    p.add_argument("--envs-per-worker", type=_parse_envs, default=[1],
                   help="envs each training worker steps in lockstep, K or K1,K2 (end-to-end "
                        "rows for each K in one run, and the GIL probe with the last; default 1)")
    p.add_argument("--worker-processes", action="store_true",
                   help="end-to-end rows with each worker in its own process (the trainer's "
                        "worker_processes); the GIL probe is then skipped")
    p.add_argument("--t-max", type=int, default=20, help="rollout length of loss_and_grad/update (default 20)")
    p.add_argument("--sgemm-n", type=int, default=None, help="sgemm size n (default 1024, --quick 256)")
    p.add_argument("--quick", action="store_true", help="short runs (smoke test; numbers are rough)")
    p.add_argument("--skip-e2e", action="store_true", help="skip end-to-end training and the GIL probe")
    p.add_argument("--skip-env", action="store_true", help="skip the env step row")
    p.add_argument("--skip-gil", action="store_true", help="skip the GIL probe")
    p.add_argument("--skip-embed", action="store_true",
                   help="skip the embedding rows (act_batch, onnxruntime, pytorch)")
    p.add_argument("--json", metavar="PATH", help="also write rows + machine info as JSON")
    return p


def _make_env(env_id, runtime_dir):
    """``(env, None)`` or ``(None, reason)``: the env gives the network's input
    shape.  ViZDoom writes its runtime files under ``runtime_dir``."""
    try:
        try:
            env = make_env(env_id, seed=0, runtime_dir=runtime_dir)
        except TypeError:  # an adapter without runtime_dir
            env = make_env(env_id, seed=0)
    except Exception as e:  # noqa: BLE001 - env row and e2e are skipped with a note
        return None, f"{type(e).__name__}: {e}"
    return env, None


def doom_adapter_overhead_us(scenario="basic", n_steps=3000, repeats=5, seed=0,
                             runtime_dir=None):
    """Median us per step: the bare ``DoomGame`` loop (make_action +
    get_state().screen_buffer, new_episode at the end) versus
    ``DoomEnv.step``/``reset`` on the same game, same action sequence,
    interleaved, after a warm-up.  Returns ``{"bare_us": .., "env_us": ..}``."""
    rng = np.random.default_rng(seed)
    with DoomEnv(scenario, seed=seed, runtime_dir=runtime_dir) as env:
        actions = rng.integers(0, env.n_actions, size=n_steps).tolist()
        game, onehots, skip = env.engine, env._actions, env.frame_skip

        def bare():
            game.new_episode()
            game.get_state()
            t0 = time.perf_counter()
            for a in actions:
                game.make_action(onehots[a], skip)
                if game.is_episode_finished():
                    game.new_episode()
                game.get_state().screen_buffer
            return time.perf_counter() - t0

        def adapter():
            step, reset = env.step, env.reset
            reset()
            t0 = time.perf_counter()
            for a in actions:
                _, _, terminated, truncated = step(a)
                if terminated or truncated:
                    reset()
            return time.perf_counter() - t0

        bare(), adapter()  # warm-up
        t_bare, t_env = [], []
        for _ in range(repeats):
            t_bare.append(bare())
            t_env.append(adapter())
    scale = 1e6 / n_steps
    return {"bare_us": float(np.median(t_bare) * scale), "env_us": float(np.median(t_env) * scale),
            "bare_samples_us": [t * scale for t in t_bare],
            "env_samples_us": [t * scale for t in t_env]}


def bench_doom_overhead(scenario, n_steps, repeat, runtime_dir) -> Row:
    """Row: the ``DoomEnv`` adapter's us per step over the bare ``DoomGame`` loop."""
    r = doom_adapter_overhead_us(scenario, n_steps, repeat, runtime_dir=runtime_dir)
    diffs = [e - b for e, b in zip(r["env_samples_us"], r["bare_samples_us"])]
    return Row("env adapter overhead", diffs, "us",
               f"DoomEnv.step - bare DoomGame loop per step (bare {r['bare_us']:.0f} us, "
               f"adapter {r['env_us']:.0f} us; {n_steps} steps x {repeat})")


def _bench_micro(args, env, env_err, runtime, repeat, min_time, peak, quick, add, skipped):
    """Network, kernel, preprocess and env rows; ``(spec, obs_shape, n_actions, flops)``."""
    if env is not None:
        pipe_spec = dict(env.preprocess_spec)
        pipe = ObsPipeline(pipe_spec, env.obs_shape)
        obs_shape, n_actions = pipe.net_obs_shape, env.n_actions
        spec = args.spec if args.spec != "auto" else resolve(Config(env=args.env),
                                                             env.obs_kind).spec
        raw_image = pipe_spec.get("kind") == "image"
        raw_shape = tuple(env.obs_shape)
    else:
        skipped.append(f"env {args.env} ({env_err})")
        spec = args.spec if args.spec != "auto" else "doom-lstm"
        obs_shape = DEFAULT_OBS[spec] if len(DEFAULT_OBS.get(spec, ())) == 3 else (8,)
        n_actions, raw_image, raw_shape = 3, True, (120, 160)
    net = build_network(spec, obs_shape, n_actions)
    fl = flops(net, T=args.t_max)
    add(bench_network(net, args.t_max, repeat, min_time, peak, fl))
    if args.skip_embed:
        skipped.append("embedding rows (--skip-embed)")
    else:
        pipe_spec_e = pipe_spec if env is not None else (
            {"kind": "image", "out_shape": list(obs_shape[1:]), "crop": None}
            if len(obs_shape) == 3 else {"kind": "vector"})
        add(bench_embedding(net, raw_shape if env is not None or len(obs_shape) == 3
                            else obs_shape, pipe_spec_e, repeat, min_time))
    if raw_image and len(raw_shape) in (2, 3):
        add(bench_preprocess(raw_shape, (84, 84), repeat, min_time))
    else:
        add(bench_preprocess((120, 160), (84, 84), repeat, min_time))
    if env is not None and not args.skip_env:
        add(bench_env(env, repeat, min_time))
        if getattr(env, "engine", None) is not None:     # an adapter over a bare engine
            add(bench_doom_overhead(args.env.split(":", 1)[1], 300 if quick else 1000, repeat,
                                    runtime))
    return spec, obs_shape, n_actions, fl


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    quick = args.quick
    repeat = args.repeat or (3 if quick else 7)
    if repeat < 1:
        print("a3c bench: error: --repeat must be >= 1", file=sys.stderr)
        return 2
    seconds = args.seconds if args.seconds is not None else (2.0 if quick else 6.0)
    warmup = 1.0 if quick else 2.0
    min_time = 0.01 if quick else 0.05
    sgemm_n = args.sgemm_n or (256 if quick else 1024)
    workers = args.workers or default_workers()

    limit_blas_threads(1)
    info = machine_info()
    hp = info["hugepages"]
    print(f"a3c bench: {info['cpu_model']}, {info['cpu_count']} cores, Python {info['python']}, "
          f"numpy {info['numpy']}, numba {info['numba']}, huge pages "
          f"{'on' if hp['requested'] else 'off'} (THP {hp['thp'] or 'n/a'}), "
          f"{info['backward']} backward", flush=True)
    if info["blas_note"]:
        print(f"a3c bench: note: {info['blas_note']}", flush=True)

    rows, skipped = [], []

    def add(new):
        for r in new if isinstance(new, list) else [new]:
            rows.append(r)
            if not quick:
                print(f"  {r.name}: {r.median:.4g} {r.unit}", flush=True)

    add(bench_sgemm(sgemm_n, repeat, min_time))
    peak = rows[0].median
    add(bench_bandwidth(16 if quick else 64, repeat))

    with tempfile.TemporaryDirectory(prefix="a3c-bench-env-") as runtime:
        env, env_err = _make_env(args.env, runtime)
        try:
            spec, obs_shape, n_actions, fl = _bench_micro(args, env, env_err, runtime, repeat,
                                                          min_time, peak, quick, add, skipped)
        finally:
            if env is not None:
                env.close()

    if args.skip_e2e:
        skipped.append("end-to-end and GIL (--skip-e2e)")
    elif env is None:
        skipped.append("end-to-end and GIL (no env)")
    else:
        for k in args.envs_per_worker:
            add(bench_e2e(args.env, spec, workers, seconds, warmup, k, args.worker_processes))
        if args.skip_gil:
            skipped.append("GIL probe (--skip-gil)")
        elif args.worker_processes:
            skipped.append("GIL probe (--worker-processes: the workers share no GIL)")
        else:
            add(bench_gil(args.env, spec, max(seconds, 2.0), warmup, args.envs_per_worker[-1]))

    print()
    print(format_table(rows))
    if skipped:
        print("skipped: " + "; ".join(skipped))
    if args.json:
        doc = {"machine": info,
               "args": {k: v for k, v in vars(args).items()},
               "settings": {"repeat": repeat, "seconds": seconds, "warmup": warmup, "sgemm_n": sgemm_n,
                            "workers": workers, "spec": spec, "obs_shape": list(obs_shape),
                            "n_actions": n_actions},
               "flops": {k: v for k, v in fl.items()},
               "rows": [r.to_dict() for r in rows],
               "skipped": skipped,
               "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, default=_json_default)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
