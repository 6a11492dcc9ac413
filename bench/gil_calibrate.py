"""How ``a3c bench``'s GIL probes read synthetic workers whose GIL time is known.

    python bench/gil_calibrate.py [--seconds 2] [--cases 0/300,2/300,5/300,20/300,50/300,5/100,20/1000]

Each case ``H/G`` runs a worker thread that loops "hold the GIL for H us
(a Python busy-wait on ``perf_counter``), then spin G us in a ``nogil``
Numba kernel" while the main thread runs each probe in turn for
``--seconds``.  The truth per worker call is the held time the worker
measured itself (the busy-wait plus the loop's own Python, timed from the
kernel's return to the next kernel call; the dispatch into and out of the
kernel, ~0.5 us, is held too but not in it).  Printed per case, as GIL us
per worker call (share / calls per second, as in ``a3c bench``'s ``GIL
us/step`` row):

* ``waits``: :func:`a3c_core.bench.gil_waits` and ``gil_held_share``, the
  probe ``a3c bench`` uses: the share of GIL requests that waited > 2 us;
  ``-floor``: less the share it reads alone;
* ``cycles``: :func:`a3c_core.bench.gil_probe`, the probe before it: the
  summed excess of its cycles over their median (``gil_blocked_fraction``);
  ``-noise``: less the fraction it reads alone (its jitter), and, for
  reference, the fraction beside a GIL-free busy thread.

Needs a free core for the probe: never run it beside a training run.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np


def _parse_cases(text):
    cases = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            hold, gap = (float(x) for x in part.split("/"))
        except ValueError:
            raise SystemExit(f"gil_calibrate: bad case {part!r}; expected HOLD_US/GAP_US, "
                             f"e.g. 5/300") from None
        if hold < 0 or gap <= 0:
            raise SystemExit(f"gil_calibrate: case {part!r}: need HOLD_US >= 0 and GAP_US > 0")
        cases.append((hold, gap))
    if not cases:
        raise SystemExit("gil_calibrate: no cases given")
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="probe seconds per case")
    ap.add_argument("--cases", default="0/300,2/300,5/300,20/300,50/300,5/100,20/1000",
                    help="comma-separated HOLD_US/GAP_US pairs")
    a = ap.parse_args(argv)
    cases = _parse_cases(a.cases)

    from a3c_core.bench import (GIL_WAIT_THRESHOLD_S, _spin_kernel, gil_blocked_fraction,
                                gil_held_share, gil_probe, gil_waits)

    spin, per_iter = _spin_kernel()
    perf = time.perf_counter

    def worker(hold_us, gap_us, stop, out):
        n_gap = max(1, int(gap_us * 1e-6 / per_iter))
        held = 0.0
        calls = 0
        t_ret = perf()
        while not stop.is_set():
            t_end = perf() + hold_us * 1e-6
            while perf() < t_end:
                pass
            t_call = perf()
            held += t_call - t_ret          # busy-wait + the loop's own lines
            spin(n_gap)
            t_ret = perf()
            calls += 1
        out["held"], out["calls"] = held, calls

    def neighbour(stop):
        n = max(1, int(1e-3 / per_iter))
        while not stop.is_set():
            spin(n)

    alone = gil_probe(max(1.0, a.seconds / 2))
    base = float(np.median(alone))
    noise = gil_blocked_fraction(alone, base)
    alone_w = gil_waits(max(1.0, a.seconds / 2), seed=1)
    floor = gil_held_share(alone_w) if alone_w is not None else None
    stop = threading.Event()
    th = threading.Thread(target=neighbour, args=(stop,), daemon=True)
    th.start()
    try:
        busy = gil_probe(max(1.0, a.seconds / 2))
    finally:
        stop.set()
        th.join()
    noise_busy = gil_blocked_fraction(busy, base)
    print(f"cycles probe: cycle {base * 1e6:.1f} us; blocked fraction with no worker: alone "
          f"{noise:.2%}, beside a GIL-free busy thread {noise_busy:.2%}")
    if floor is None:
        print("waits probe: no usable time-stamp counter here; its columns are left empty")
    else:
        print(f"waits probe: share of requests waiting > "
              f"{GIL_WAIT_THRESHOLD_S * 1e6:g} us with no worker {floor:.2%}")
    print(f"{'hold/gap us':>12s} {'calls/s':>9s} {'true us':>8s} {'waits':>7s} {'-floor':>7s} "
          f"{'cycles':>7s} {'-noise':>7s}")
    rows = []
    for hold, gap in cases:
        stop, out = threading.Event(), {}
        th = threading.Thread(target=worker, args=(hold, gap, stop, out), daemon=True)
        th.start()
        time.sleep(0.3)
        t0 = perf()
        cycles = gil_probe(a.seconds)
        waits = gil_waits(a.seconds, seed=2) if floor is not None else None
        stop.set()
        th.join()
        # the worker's totals include its 0.3 s lead-in; its rate and held
        # share are the same there, so per-call figures are unaffected
        calls, held = out["calls"], out["held"]
        wall = perf() - t0 + 0.3
        rate = calls / wall
        true_us = held / max(calls, 1) * 1e6
        raw = gil_blocked_fraction(cycles, base)
        row = {"hold_us": hold, "gap_us": gap, "calls_per_s": rate,
               "true_share": held / wall, "true_us": true_us,
               "raw_share": raw, "raw_us": raw / rate * 1e6,
               "noise_subtracted_us": max(0.0, raw - noise) / rate * 1e6}
        if waits is not None:
            share = gil_held_share(waits)
            row.update(waits_share=share, waits_us=share / rate * 1e6,
                       waits_floor_subtracted_us=max(0.0, share - floor) / rate * 1e6)
        rows.append(row)
        w_us = f"{row['waits_us']:7.1f} {row['waits_floor_subtracted_us']:7.1f}" \
            if waits is not None else f"{'-':>7s} {'-':>7s}"
        print(f"{f'{hold:g}/{gap:g}':>12s} {rate:9.0f} {true_us:8.1f} {w_us} "
              f"{row['raw_us']:7.1f} {row['noise_subtracted_us']:7.1f}")
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
