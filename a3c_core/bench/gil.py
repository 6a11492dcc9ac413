"""The GIL rows of ``a3c bench``: how much of the GIL one training worker holds.

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
  row PERTURBED when it drops by >10 %.
* ``GIL us/step`` = share / steps/s, and 1 / share bounds the thread
  speed-up.  ``GIL us/step (probe noise subtracted)``: the same less the
  share the probe reads alone.

Skipped with ``--skip-gil``, ``--skip-e2e`` or ``--worker-processes``.
"""
from __future__ import annotations

import platform
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from a3c_core._jit import kernel
from a3c_core.bench.e2e import _TrainerRun
from a3c_core.bench.machine import Row
from a3c_core.timing import cpu_info as _cpuinfo


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
