"""The GIL probe of ``a3c bench`` sees a GIL-holding thread.

Lives in ``bench/`` (not ``tests/``): it depends on a free core and on
timing, so it can fail on a loaded machine.  ``pytest bench/test_bench_gil.py``.
"""
import numpy as np

from a3c_core import bench


def test_gil_probe_sees_a_gil_holding_thread():
    import threading
    import time

    alone = bench.gil_probe(0.2)
    base = float(np.median(alone))
    stop = threading.Event()

    def hog():  # holds the GIL ~80 % of the time: 400 us of Python, 100 us of sleep
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 400e-6:
                pass
            time.sleep(100e-6)

    th = threading.Thread(target=hog)
    th.start()
    try:
        busy = bench.gil_probe(0.3)
    finally:
        stop.set()
        th.join()
    # loose: the machine may be shared; the point is that the probe sees the hog
    assert bench.gil_blocked_fraction(busy, base) > bench.gil_blocked_fraction(alone, base) + 0.3


def test_gil_waits_sees_a_gil_holding_thread():
    import threading
    import time

    import pytest

    alone = bench.gil_waits(0.2)
    if alone is None:
        pytest.skip("no usable time-stamp counter on this machine")
    stop = threading.Event()

    def hog():  # holds the GIL ~80 % of the time: 400 us of Python, 100 us of sleep
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 400e-6:
                pass
            time.sleep(100e-6)

    th = threading.Thread(target=hog)
    th.start()
    try:
        busy = bench.gil_waits(0.3)
    finally:
        stop.set()
        th.join()
    # loose: the machine may be shared; the point is that the probe sees the hog
    assert bench.gil_held_share(busy) > bench.gil_held_share(alone) + 0.5
