"""ParamLayout: an ordered map ``name -> (offset, shape)`` over one flat buffer.

All parameters of a network live in ONE contiguous 1-D array; every tensor is
a view into it (the same for gradients and optimizer statistics).  Syncing,
clipping, checkpointing and Hogwild updates are then single loops over flat
arrays, and a tensor is found by name through the layout.
"""
from __future__ import annotations

import math

import numpy as np

from a3c_core import _hugepages


class ParamLayout:
    """Ordered ``name -> (offset, shape)``; tensors are packed back to back.

    >>> lay = ParamLayout([("fc.weight", (4, 3)), ("fc.bias", (4,))])
    >>> lay.size, lay.offset("fc.bias"), lay.shape("fc.bias")
    (16, 12, (4,))
    """

    def __init__(self, entries=()):
        self._entries: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.size = 0
        for name, shape in entries:
            self.add(name, shape)

    def add(self, name: str, shape) -> None:
        """Append tensor ``name`` of ``shape`` after the existing ones."""
        if name in self._entries:
            raise ValueError(f"duplicate tensor name {name!r} in layout")
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ValueError(f"tensor {name!r}: shape {shape} must be positive")
        self._entries[name] = (self.size, shape)
        self.size += math.prod(shape)

    # -- queries -----------------------------------------------------------
    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self):
        """``(name, (offset, shape))`` pairs in layout order."""
        return self._entries.items()

    def offset(self, name: str) -> int:
        return self._entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def slice(self, name: str) -> slice:
        off, shape = self._entries[name]
        return slice(off, off + math.prod(shape))

    # -- buffers -----------------------------------------------------------
    def new_flat(self, dtype=np.float32) -> np.ndarray:
        """A zeroed contiguous flat buffer of ``size`` elements (on huge
        pages when it is large enough: :mod:`a3c_core._hugepages`)."""
        return _hugepages.zeros(self.size, dtype)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``name -> view`` of ``flat`` (1-D, contiguous, ``size`` long).

        The views share memory with ``flat``: writing one writes the buffer.
        """
        if flat.ndim != 1 or flat.shape[0] != self.size:
            raise ValueError(
                f"flat buffer has shape {flat.shape}, layout needs ({self.size},)")
        if not flat.flags.c_contiguous:
            raise ValueError("flat buffer must be contiguous")
        return {n: flat[o:o + math.prod(s)].reshape(s)
                for n, (o, s) in self._entries.items()}

    def __eq__(self, other):
        return isinstance(other, ParamLayout) and self._entries == other._entries

    def __repr__(self):
        body = ", ".join(f"{n}{s}" for n, (_, s) in self._entries.items())
        return f"ParamLayout(size={self.size}: {body})"
