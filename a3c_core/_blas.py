"""Keep BLAS single-threaded inside worker threads, for the length of a run.

numpy's OpenBLAS starts one thread per core by default; with several A3C
worker threads each calling ``np.dot`` the BLAS threads oversubscribe the
cores (~30 % slower on 2 cores).  The trainer and the benchmarks run inside
:func:`blas_threads`, which restores the previous limits on exit, so an
application that embeds a3c_core gets its BLAS settings back.
"""
import contextlib

from threadpoolctl import threadpool_limits


@contextlib.contextmanager
def blas_threads(n=1):
    """Limit every loaded BLAS pool to ``n`` threads inside the ``with`` block.

    Uses threadpoolctl (a dependency).
    """
    with threadpool_limits(limits=n, user_api="blas") as limiter:
        yield limiter


def limit_blas_threads(n=1):
    """Permanent, process-wide limit: for benchmark scripts that own their
    process.  Library code uses :func:`blas_threads`."""
    return threadpool_limits(limits=n, user_api="blas")
