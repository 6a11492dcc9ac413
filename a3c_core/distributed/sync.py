"""The sync math between a node and the parameter-server shards (numpy only).

A node's worker threads change its shared flat vectors (params and, in
``opt_state="global"`` mode, the optimizer statistics) by Hogwild updates.
A sync round, run by the node's sync thread:

1. ``snap = x`` (a copy of the node's live vector), ``delta = snap - base``
   where ``base`` is the global vector the node last pulled;
2. for every shard ``k`` owning ``[lo, hi)``: push ``delta[lo:hi]``; the
   shard adds ``scale * delta`` to its slice of the global vector and sends
   that slice back (``scale`` 1 for params: the nodes' changes add up, as in
   Downpour SGD; ``1 / n_nodes`` for optimizer statistics: the global
   statistics are the nodes' running average);
3. ``x[lo:hi] += g - snap[lo:hi]`` and ``base[lo:hi] = g``: the node now holds
   the global vector plus whatever its workers changed while the round was in
   flight, so no local update is lost.

The merge in step 3 runs while the workers keep writing ``x`` (Hogwild, as
everywhere in a node): an element a worker stores between the merge's read
and write loses that one worker update, the same kind of loss two workers'
concurrent applies already have (see :mod:`a3c_core.core.optim`); the
snapshot/delta pair itself is consistent because both use the same ``snap``.

Nothing waits for another node: each node's rounds are independent and a
shard serializes the pushes it receives (a Ray actor runs one call at a time).
:func:`sync_round_ref` is the whole round on plain arrays, the twin the tests
compare the Ray path against.
"""
from __future__ import annotations

import numpy as np

__all__ = ["shard_bounds", "sync_round_ref", "NodeSync"]


def shard_bounds(n, n_shards, align=16):
    """Split ``range(n)`` into ``n_shards`` contiguous ``(lo, hi)`` pieces.

    Boundaries are multiples of ``align`` (cache lines of float32) except the
    last ``hi = n``; sizes differ by at most ``align``.  Raises ValueError for
    ``n_shards < 1`` or more shards than ``align``-sized blocks.
    """
    n, n_shards = int(n), int(n_shards)
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    blocks = -(-n // align)
    if n_shards > blocks:
        raise ValueError(f"cannot split {n} parameters into {n_shards} shards of >= {align}")
    cuts = [min(n, (blocks * k // n_shards) * align) for k in range(n_shards + 1)]
    return [(cuts[k], cuts[k + 1]) for k in range(n_shards)]


def sync_round_ref(x, base, global_, bounds, scale=1.0, x_after=None):
    """One sync round on plain arrays (the reference twin; inputs untouched).

    Args:
        x: (n,) float32, the node's vector when the round starts.
        base: (n,) float32, the global vector at the node's last sync.
        global_: (n,) float32, the shards' global vector, concatenated.
        bounds: ``[(lo, hi), ...]`` from :func:`shard_bounds`.
        scale: factor on the pushed delta (1 params, 1/n_nodes statistics).
        x_after: (n,) the node's vector when the pulled slices arrive (local
            updates made during the round), default ``x``.
    Returns:
        ``(x_new, base_new, global_new)``, float32 (n,) arrays.
    """
    x = np.asarray(x, np.float32)
    x_after = x if x_after is None else np.asarray(x_after, np.float32)
    delta = x - np.asarray(base, np.float32)
    g = np.asarray(global_, np.float32).copy()
    for lo, hi in bounds:
        g[lo:hi] += np.float32(scale) * delta[lo:hi]
    x_new = x_after + (g - x)
    return x_new, g.copy(), g


class NodeSync:
    """A node's side of the sync rounds for one flat vector ``x`` (in place).

    ``x`` is the live shared vector (float32 (n,), written by the workers);
    ``base`` is the global vector at the last sync.  Buffers are allocated
    once.  Use :meth:`begin` -> push the returned deltas -> :meth:`finish`
    with the pulled slices.  ``clamp_min`` (e.g. 0 for squared-gradient
    statistics) bounds the merged values from below.
    """

    def __init__(self, x, bounds, clamp_min=None):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 1
                and x.flags.c_contiguous):
            raise TypeError("x must be a 1-D C-contiguous float32 array")
        if not bounds or bounds[0][0] != 0 or bounds[-1][1] != x.shape[0]:
            raise ValueError(f"bounds {bounds[:1]}...{bounds[-1:]} do not cover [0, {x.shape[0]})")
        self.x = x
        self.bounds = list(bounds)
        self.clamp_min = clamp_min
        self.base = x.copy()
        self.snap = np.empty_like(x)
        self.delta = np.empty_like(x)

    def reset(self, global_slices):
        """Set ``x`` and ``base`` to the pulled global vector (join / rejoin)."""
        for (lo, hi), g in zip(self.bounds, global_slices, strict=True):
            self._check(lo, hi, g)
            self.x[lo:hi] = g
            self.base[lo:hi] = g

    def begin(self):
        """Snapshot ``x``; returns the per-shard deltas (views into one buffer)."""
        np.copyto(self.snap, self.x)
        np.subtract(self.snap, self.base, out=self.delta)
        return [self.delta[lo:hi] for lo, hi in self.bounds]

    def finish(self, global_slices):
        """Merge the pulled slices: ``x += g - snap``, ``base = g``."""
        for (lo, hi), g in zip(self.bounds, global_slices, strict=True):
            self._check(lo, hi, g)
            corr = self.delta[lo:hi]          # reuse the buffer: the delta was sent
            np.subtract(g, self.snap[lo:hi], out=corr)
            xs = self.x[lo:hi]
            xs += corr
            if self.clamp_min is not None:
                np.maximum(xs, self.clamp_min, out=xs)
            self.base[lo:hi] = g

    @staticmethod
    def _check(lo, hi, g):
        if getattr(g, "shape", None) != (hi - lo,):
            raise ValueError(f"pulled slice has shape {getattr(g, 'shape', None)}, "
                             f"expected ({hi - lo},)")
