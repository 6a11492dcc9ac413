"""How ``a3c bench``'s GIL probe reads synthetic workers whose GIL time is known.

    python bench/gil_calibrate.py [--seconds 2] [--cases 0/300,2/300,5/300,20/300,50/300,5/100,20/1000]

Each case ``H/G`` runs a worker thread that loops "hold the GIL for H us
(a Python busy-wait on ``perf_counter``), then spin G us in a ``nogil``
Numba kernel" while the main thread runs :func:`a3c_core.bench.gil_probe`.
The truth per worker call is the held time the worker measured itself
(the busy-wait plus the loop's own Python, timed from the kernel's return to
the next kernel call).  Printed per case: the probe's raw GIL us per call
(``gil_blocked_fraction`` / calls per second, as in ``a3c bench``'s ``GIL
us/step`` row) and the same with the probe's own noise floor subtracted:
the blocked fraction that the probe measures alone (it sums the cycles'
positive deviations from their median, so jitter alone gives a positive
share), and, for reference, beside a GIL-free busy thread.

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

    from a3c_core.bench import _spin_kernel, gil_blocked_fraction, gil_probe

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
    stop = threading.Event()
    th = threading.Thread(target=neighbour, args=(stop,), daemon=True)
    th.start()
    try:
        busy = gil_probe(max(1.0, a.seconds / 2))
    finally:
        stop.set()
        th.join()
    noise_busy = gil_blocked_fraction(busy, base)
    print(f"probe cycle {base * 1e6:.1f} us; noise floor (blocked fraction with no worker): "
          f"alone {noise:.2%}, beside a GIL-free busy thread {noise_busy:.2%}")
    print(f"{'hold/gap us':>12s} {'calls/s':>9s} {'true share':>10s} {'raw share':>9s} "
          f"{'true us':>8s} {'raw us':>7s} {'-noise us':>9s}")
    rows = []
    for hold, gap in cases:
        stop, out = threading.Event(), {}
        th = threading.Thread(target=worker, args=(hold, gap, stop, out), daemon=True)
        th.start()
        time.sleep(0.3)
        t0 = perf()
        cycles = gil_probe(a.seconds)
        stop.set()
        th.join()
        # the worker's totals include its 0.3 s lead-in; its rate and held
        # share are the same there, so per-call figures are unaffected
        calls, held = out["calls"], out["held"]
        wall = perf() - t0 + 0.3
        rate = calls / wall
        true_us = held / max(calls, 1) * 1e6
        raw = gil_blocked_fraction(cycles, base)
        raw_us = raw / rate * 1e6
        sub_us = max(0.0, raw - noise) / rate * 1e6
        rows.append({"hold_us": hold, "gap_us": gap, "calls_per_s": rate,
                     "true_share": held / wall, "raw_share": raw, "true_us": true_us,
                     "raw_us": raw_us, "noise_subtracted_us": sub_us})
        print(f"{f'{hold:g}/{gap:g}':>12s} {rate:9.0f} {held / wall:10.2%} {raw:9.2%} "
              f"{true_us:8.1f} {raw_us:7.1f} {sub_us:9.1f}")
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
