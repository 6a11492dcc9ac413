"""The GIL probes of ``a3c bench`` see a GIL-holding thread.

Lives in ``bench/`` (not ``tests/``): it depends on a free core and on
timing, so it can fail on a loaded machine.  ``pytest bench/test_bench_gil.py``.
"""
import contextlib
import threading
import time

import numpy as np
import pytest

from a3c_core.bench import gil


@contextlib.contextmanager
def _gil_hog():
    """A thread holding the GIL ~80 % of the time: 400 us of Python, 100 us of sleep."""
    stop = threading.Event()

    def hog():
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 400e-6:
                pass
            time.sleep(100e-6)

    th = threading.Thread(target=hog)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def test_gil_probe_sees_a_gil_holding_thread():
    alone = gil.gil_probe(0.2)
    base = float(np.median(alone))
    with _gil_hog():
        busy = gil.gil_probe(0.3)
    # loose: the machine may be shared; the point is that the probe sees the hog
    assert gil.gil_blocked_fraction(busy, base) > gil.gil_blocked_fraction(alone, base) + 0.3


def test_gil_waits_sees_a_gil_holding_thread():
    alone = gil.gil_waits(0.2)
    if alone is None:
        pytest.skip("no usable time-stamp counter on this machine")
    with _gil_hog():
        busy = gil.gil_waits(0.3)
    assert gil.gil_held_share(busy) > gil.gil_held_share(alone) + 0.5
