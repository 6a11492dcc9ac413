"""The machine, the rows' shared helpers and the two reference rows of ``a3c bench``.

* ``sgemm peak``: numpy float32 ``n x n @ n x n`` on ONE BLAS thread, GFLOP/s;
  the reference every "fraction of peak" is relative to.
* ``memory bandwidth``: every core copies its own 64 MB array at once, GB/s
  (read + written bytes).

Also :func:`machine_info` (what ``--json`` records about the machine),
:class:`Row` (one table row) and :func:`format_table`.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import threading
import time

import contextlib

import numpy as np
import threadpoolctl

from a3c_core.checkpoint import versions
from a3c_core.nn.blas import gemm_handle
from a3c_core.timing import blas_note, hugepage_info, time_call
from a3c_core.timing import cpu_info as _cpuinfo
from a3c_core.train.affinity import allowed_cores, pin_thread


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


@contextlib.contextmanager
def one_core():
    """Run the block with the calling thread pinned to one core (the last
    this process may use), as the trainer pins a worker: a ViZDoom engine
    started inside inherits the pin and shares the core with the thread
    that steps it, as in training (an engine on another core doubled a
    step's wall time on the 2-core VM: 305 against 148 us).  Yields the
    core, or None where the OS has no affinity (nothing pinned); the old
    affinity is restored after."""
    cores = allowed_cores()
    if not cores or not pin_thread({cores[-1]}):
        yield None
        return
    try:
        yield cores[-1]
    finally:
        pin_thread(set(cores))


def default_workers():
    """1, 2, 4, ... up to the core count, and the core count."""
    n = os.cpu_count() or 1
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    out.append(n)
    return out


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


def us(samples):
    """Seconds to microseconds."""
    return [s * 1e6 for s in samples]


def interleaved(fa, fb, repeat, min_time):
    """Samples of ``fa`` and ``fb`` timed in turn (warm-up first), so machine
    load hits both alike; ``(samples_a, samples_b)`` in seconds."""
    for fn in (fa, fb):
        time_call(fn, repeat=1, min_time=min_time / 4, warmup=2)
    a, b = [], []
    for _ in range(repeat):
        a += time_call(fa, repeat=1, min_time=min_time, warmup=0)
        b += time_call(fb, repeat=1, min_time=min_time, warmup=0)
    return a, b


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


def format_table(rows) -> str:
    """The rows as an aligned text table: name, median, min, max, unit, notes."""
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
