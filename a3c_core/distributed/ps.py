"""Parameter-server shard: one contiguous slice of the global flat vectors.

A :class:`ParamShard` holds ``[lo, hi)`` of the global params and, when the
optimizer statistics are global (``opt_state="global"``), the same slice of
each statistic array.  It is a plain class; the driver runs it as a Ray actor
(``ray.remote(ParamShard)``, one call at a time, so pushes are serialized).
Arrays arrive from the object store as read-only zero-copy views and the
returned slices go back through it; no network object is ever pickled.
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["ParamShard"]


class ParamShard:
    """Global values of ``[lo, hi)`` for the named flat vectors.

    Args:
        index: shard number (for messages).
        lo, hi: the slice of the flat vectors this shard owns.
        init: ``{name: (hi - lo,) float32}``, e.g. ``{"params": ...}``.
        scales: ``{name: factor}`` applied to pushed deltas (default 1).
    """

    def __init__(self, index, lo, hi, init, scales=None):
        self.index, self.lo, self.hi = int(index), int(lo), int(hi)
        self.names = list(init)
        self.values = {}
        for name, arr in init.items():
            a = np.array(arr, dtype=np.float32, copy=True)
            if a.shape != (self.hi - self.lo,):
                raise ValueError(f"shard {index}: {name!r} has shape {a.shape}, "
                                 f"expected ({self.hi - self.lo},)")
            self.values[name] = a
        self.scales = {n: np.float32((scales or {}).get(n, 1.0)) for n in self.names}
        self.pushes = 0
        self.bytes_in = 0
        self.busy = 0.0           # seconds inside push_pull (the add itself)
        self._cpu0 = time.process_time()

    def push_pull(self, deltas):
        """Add ``scale * delta`` for each name in ``deltas`` (a dict of (hi-lo,)
        float32); return ``{name: global slice}`` for the same names."""
        t0 = time.perf_counter()
        out = {}
        for name, d in deltas.items():
            v = self.values.get(name)
            if v is None:
                raise KeyError(f"shard {self.index} holds {self.names}, not {name!r}")
            if d.shape != v.shape or d.dtype != np.float32:
                raise ValueError(f"shard {self.index}: delta {name!r} is {d.dtype}{d.shape}, "
                                 f"expected float32{v.shape}")
            s = self.scales[name]
            if s == 1:
                v += d
            else:
                v += s * d
            self.bytes_in += d.nbytes
            out[name] = v
        self.pushes += 1
        self.busy += time.perf_counter() - t0
        return out

    def pull(self, names=None):
        """``{name: global slice}`` (all names by default)."""
        return {n: self.values[n] for n in (names or self.names)}

    def set(self, values):
        """Overwrite slices (resume, tests)."""
        for name, arr in values.items():
            self.values[name][...] = arr

    def info(self):
        """Counters; ``cpu_seconds`` is the shard process's CPU time since it
        started (deserializing, adding, serializing: what a push costs it)."""
        return {"index": self.index, "lo": self.lo, "hi": self.hi, "names": self.names,
                "pushes": self.pushes, "bytes_in": self.bytes_in, "busy_seconds": self.busy,
                "cpu_seconds": time.process_time() - self._cpu0}
