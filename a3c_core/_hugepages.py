"""Zeroed flat buffers backed by transparent huge pages where Linux offers them.

A batch-1 step of doom-lstm reads its 4.8 MB of weights, and an update
streams the gradients, the optimizer's moments, the shared and the local
parameters (~40 MB).  On 4 KiB pages that is ~1,200 pages per pass over
one buffer, more than the TLB holds.  :func:`zeros` returns a buffer that
starts on a 2 MiB boundary, spans whole 2 MiB pages, and is marked
``madvise(MADV_HUGEPAGE)``, so the kernel can back it with huge pages when
transparent huge pages are ``always`` or ``madvise``.  numpy already
madvises its own large allocations, but only the 2 MiB-aligned part of one
can get a huge page: about one page in a 4.8 MB array.  The learner loop of
doom-lstm ran ~5 % faster per agent step with its five 1.2M-element
buffers placed this way (docs/results.md, 2026-11-26).

Buffers under :data:`MIN_BYTES`, other platforms, a failed ``madvise``
(e.g. THP ``never``) and ``A3C_HUGEPAGES=0`` all give plain ``np.zeros``:
the same values, only the page size differs.
"""
from __future__ import annotations

import ctypes
import os
import sys

import numpy as np

__all__ = ["zeros", "empty", "enabled", "MIN_BYTES"]

HUGE_PAGE = 2 << 20
#: buffers smaller than this keep numpy's allocation (a huge page would be mostly empty)
MIN_BYTES = 1 << 20
_MADV_HUGEPAGE = 14
_SKEW_STEP = 4096 + 64
_SKEWS = 16
_count = 0


def _load_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def thp_mode():
    """The bracketed word of the kernel's THP setting, or None if unreadable."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            text = fh.read()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


_madvise = _load_madvise()
#: False once madvise has failed (e.g. a kernel without THP): no more padded blocks
_madvise_ok = thp_mode() != "never"


def enabled() -> bool:
    """False when ``A3C_HUGEPAGES`` is 0/false/no/off, madvise is unavailable
    or has failed, or the kernel's THP mode is ``never``."""
    if _madvise is None or not _madvise_ok:
        return False
    return os.environ.get("A3C_HUGEPAGES", "1").strip().lower() not in ("0", "false", "no", "off")


def zeros(n, dtype=np.float32) -> np.ndarray:
    """A zeroed, C-contiguous 1-D array of ``n`` elements (huge-page backed when possible).

    The result is a view of a larger uint8 block (2 MiB-aligned start, size
    rounded up to whole 2 MiB pages); the view keeps the block alive.  It
    starts 0-15 steps of 4 KiB + 64 B into the block, a different step for
    each buffer in turn, so that buffers streamed side by side do not alias
    in the caches.
    """
    dtype = np.dtype(dtype)
    n = int(n)
    nbytes = n * dtype.itemsize
    if nbytes < MIN_BYTES or not enabled():
        return np.zeros(n, dtype)
    global _count, _madvise_ok
    # buffers that all start on a 2 MiB boundary would put element i of each
    # in the same L1 and L2 sets, and the optimizer streams 5-8 of them side by
    # side: each buffer starts a different 4 KiB + 64 B step into its block
    skew = (_count % _SKEWS) * _SKEW_STEP
    _count += 1
    size = -(-(nbytes + skew) // HUGE_PAGE) * HUGE_PAGE
    raw = np.empty(size + HUGE_PAGE, np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    block = raw[start:start + size]
    if _madvise(block.ctypes.data, size, _MADV_HUGEPAGE) != 0:
        _madvise_ok = False           # no huge pages to be had: plain arrays from now on
        return np.zeros(n, dtype)
    out = block[skew:skew + nbytes].view(dtype)
    out[...] = 0          # fault the pages in now, after the advice
    return out


def empty(shape, dtype=np.float32) -> np.ndarray:
    """:func:`zeros` in an n-d ``shape`` (zeroed: the pages are faulted in anyway)."""
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
    return zeros(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)
