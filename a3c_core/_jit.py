"""The one place that sets the Numba decorator flags for every kernel.

All compiled kernels in a3c_core use :func:`kernel` so that they

* release the GIL (``nogil=True``): worker threads run them in parallel;
* are cached on disk (``cache=True``): a new process loads machine code in a
  few ms per kernel instead of compiling. Where: ``NUMBA_CACHE_DIR`` if set,
  else the install cache that ``a3c compile`` made, else a per-user,
  per-version directory (``~/.cache/a3c_core/<version>-<tag>``), never
  inside the installed package (see :mod:`a3c_core._numba_cache`);
* use a restricted fastmath set: ``reassoc`` + ``contract`` let LLVM vectorize
  reductions and fuse multiply-adds, while ``nnan``/``ninf`` stay off so that a
  NaN or inf is never optimized away (gradient checks and the non-finite
  gradient guard rely on them).
"""
from numba import njit

from a3c_core import _numba_cache  # noqa: F401  (before any kernel: where the cache lives)

FASTMATH = frozenset({"reassoc", "contract"})


def kernel(fn=None, **overrides):
    """``@kernel`` or ``@kernel(...)``: ``numba.njit`` with the project's flags."""
    opts = dict(nogil=True, cache=True, fastmath=set(FASTMATH))
    opts.update(overrides)
    if fn is None:
        return njit(**opts)
    return njit(**opts)(fn)
