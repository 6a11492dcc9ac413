"""Timing and machine facts used outside ``a3c bench``: a base helper that
imports nothing of a3c_core.

* :func:`time_call` - seconds per call of a function (batch-calibrated samples);
  ``a3c bench`` and the torch twin's comparison use it;
* :func:`cpu_info` - the CPU's model name and flags (``/proc/cpuinfo``);
* :func:`hugepage_info` - whether a3c_core asks for huge pages and the kernel's
  transparent-huge-page mode;
* :func:`blas_note` / :func:`blas_kernel_note` - the warning ``a3c train`` and
  ``a3c bench`` print when OpenBLAS runs AVX2 kernels on an AVX-512 CPU.

:mod:`a3c_core.bench` builds its ``machine_info`` from these; nothing in the
package imports :mod:`a3c_core.bench` except the CLI's ``bench`` command.
"""
from __future__ import annotations

import os
import time

import threadpoolctl

from a3c_core import _hugepages

__all__ = ["blas_kernel_note", "blas_note", "cpu_info", "hugepage_info", "time_call"]


def time_call(fn, *, repeat=7, min_time=0.05, warmup=3) -> list[float]:
    """Seconds per call of ``fn()``: ``repeat`` samples, each the mean over a
    batch of calls that lasts at least ``min_time`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    n = 1
    while True:  # calibrate the batch size
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time or n >= 1 << 20:
            break
        n = max(n * 2, int(n * min_time / max(dt, 1e-9) * 1.2))
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return out


def time_alternating(fa, fb, *, repeat, warmup=3) -> tuple[list[float], list[float]]:
    """Seconds of one call of ``fa`` and one of ``fb``, in turn, ``repeat``
    times after ``warmup`` calls of each, so machine load hits both alike:
    ``(samples_a, samples_b)``."""
    for _ in range(warmup):
        fa()
        fb()
    a, b = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fa()
        t1 = time.perf_counter()
        fb()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return a, b


def cpu_info() -> tuple[str | None, set]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; (None, set()) elsewhere."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if model is None and line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif not flags and line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                if model is not None and flags:
                    break
    except OSError:
        pass
    return model, flags


def hugepage_info() -> dict:
    """Whether a3c_core asks for huge pages (``A3C_HUGEPAGES``) and what the
    kernel's transparent-huge-page mode is (the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled; None off Linux)."""
    return {"requested": _hugepages.enabled(), "thp": _hugepages.thp_mode()}


#: OpenBLAS cores (``threadpoolctl``'s ``architecture``) with AVX-512 GEMM kernels
AVX512_BLAS_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def blas_note(info) -> str | None:
    """A warning when OpenBLAS runs AVX2 kernels on a CPU with AVX-512 (its
    GEMMs, the backward's, may then run at half the speed they could: sgemm
    121 against 216-233 GFLOP/s on the 2-core VM (Zen 5) of docs/results.md,
    2026-11-26), else None.  ``info``: a dict with ``cpu_isa``
    (flags), ``blas`` (``threadpoolctl`` rows) and ``openblas_coretype``, as
    :func:`a3c_core.bench.machine_info` returns."""
    if "avx512f" not in info.get("cpu_isa", ()):
        return None
    for d in info.get("blas", ()):
        arch = d.get("architecture")
        if d.get("internal_api") != "openblas" or not arch or \
                arch.lower() in AVX512_BLAS_CORES:
            continue
        forced = info.get("openblas_coretype")
        why = (f"OPENBLAS_CORETYPE={forced} selects them" if forced
               else "OpenBLAS chose them for this CPU")
        return (f"OpenBLAS runs its {arch} (AVX2) kernels on this AVX-512 CPU ({why}); its "
                f"GEMMs, the backward's, may run at up to half the speed AVX-512 kernels reach: "
                f"OPENBLAS_CORETYPE=SkylakeX (or unset) lets OpenBLAS use them")
    return None


def blas_kernel_note() -> str | None:
    """:func:`blas_note` for this process (the CPU's flags, the BLAS libraries
    ``threadpoolctl`` sees, ``OPENBLAS_CORETYPE``): ``a3c train`` prints it at
    the start of a run."""
    info = {"cpu_isa": sorted(cpu_info()[1]),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "blas": [{k: d.get(k) for k in ("internal_api", "architecture")}
                     for d in threadpoolctl.threadpool_info() if d.get("user_api") == "blas"]}
    return blas_note(info)
