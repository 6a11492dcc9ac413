"""Keep BLAS single-threaded inside worker threads.

numpy's OpenBLAS starts one thread per core by default; with several A3C
worker threads each calling ``np.dot`` the BLAS threads oversubscribe the
cores (~30 % slower on 2 cores).  Call :func:`limit_blas_threads` once before
starting workers (the trainer and benchmarks do).
"""
import os

_LIMITER = None


def limit_blas_threads(n=1):
    """Limit every loaded BLAS/OpenMP pool to ``n`` threads (process-wide).

    Uses threadpoolctl when available; otherwise sets the usual environment
    variables, which only take effect for libraries loaded afterwards.
    """
    global _LIMITER
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    _LIMITER = threadpool_limits(limits=n, user_api="blas")
    return _LIMITER
