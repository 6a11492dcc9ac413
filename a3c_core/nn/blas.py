"""``gemm`` callable from Numba kernels, through numpy's own BLAS, GIL released.

Numba's ``np.dot`` needs SciPy (its BLAS bindings come from
``scipy.linalg.cython_blas``), which a3c_core does not depend on.  numpy
itself ships (or links) a BLAS: this module finds its ``cblas_?gemm`` entry
point by name in the shared library that numpy loaded and hands its address
to compiled kernels as a plain integer.  The call is an LLVM ``inttoptr`` +
``call`` (:func:`_cblas_gemm`), so the kernels stay cacheable on disk (no
address is baked into the machine code) and one kernel can run a layer's
whole backward (elementwise passes and its GEMMs) in one ``nogil`` call:
the worker holds the GIL once per layer instead of once per ``np.dot``.

The library is the one numpy uses, so the GEMMs are numpy's (same kernels,
same single-thread limit set by threadpoolctl).  Symbols tried, in order:
``scipy_cblas_sgemm64_`` (numpy >= 2 wheels: scipy-openblas, 64-bit ints),
``cblas_sgemm64_`` (numpy 1.2x wheels), ``scipy_cblas_sgemm``,
``cblas_sgemm`` (32-bit ints: system OpenBLAS, MKL, BLIS).  The integer
width travels as the dtype of the ``ints`` prototype array a kernel
receives (``int64`` or ``int32``), so it is part of the compiled
signature, never a stale constant in a cached kernel.

:func:`gemm_handle` returns ``(fns, ints)`` (``fns``: the sgemm and dgemm
addresses as an int64 array; :func:`gemm` calls the one of its arrays'
dtype) or None when no entry point was found or a probe product differs
from ``np.dot``; the network then runs its numpy backward instead (the same
results, bit for bit).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from a3c_core._jit import kernel

#: CBLAS enum values (cblas.h)
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

_SYMBOLS = (("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", np.int64),
            ("cblas_sgemm64_", "cblas_dgemm64_", np.int64),
            ("scipy_cblas_sgemm", "scipy_cblas_dgemm", np.int32),
            ("cblas_sgemm", "cblas_dgemm", np.int32))


@intrinsic
def _cblas_gemm(typingctx, fn, ints, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """``cblas_?gemm(RowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)``
    through the function at address ``fn``; ``a``/``b``/``c`` are arrays
    (their data pointers are passed), ``ints`` an int32/int64 array whose
    dtype is the library's integer width."""
    scalars = (fn, ta, tb, m, n, k, lda, ldb, ldc)
    if not all(isinstance(s, types.Integer) for s in scalars):
        return None
    if not (isinstance(a, types.Array) and isinstance(b, types.Array)
            and isinstance(c, types.Array) and isinstance(ints, types.Array)):
        return None
    dt = c.dtype
    if a.dtype != dt or b.dtype != dt or dt not in (types.float32, types.float64):
        return None
    if ints.dtype not in (types.int32, types.int64):
        return None
    iw = ints.dtype.bitwidth
    sig = types.void(fn, ints, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context, builder, sig, args):
        (fn_v, _, ta_v, tb_v, m_v, n_v, k_v, al_v, a_v, lda_v, b_v, ldb_v, be_v, c_v,
         ldc_v) = args
        at = sig.args
        i32, ib = ir.IntType(32), ir.IntType(iw)
        fl = context.get_value_type(dt)
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, ib, ib, ib, fl, fl.as_pointer(),
                                               ib, fl.as_pointer(), ib, fl, fl.as_pointer(), ib])

        def as_int(v, ty, width):
            v = context.cast(builder, v, ty, types.int64)
            return builder.trunc(v, ir.IntType(width)) if width < 64 else v

        def data(v, ty):
            return context.make_array(ty)(context, builder, v).data

        ptr = builder.inttoptr(context.cast(builder, fn_v, at[0], types.int64),
                               fnty.as_pointer())
        builder.call(ptr, [
            i32(ROW_MAJOR), as_int(ta_v, at[2], 32), as_int(tb_v, at[3], 32),
            as_int(m_v, at[4], iw), as_int(n_v, at[5], iw), as_int(k_v, at[6], iw),
            context.cast(builder, al_v, at[7], dt), data(a_v, at[8]), as_int(lda_v, at[9], iw),
            data(b_v, at[10]), as_int(ldb_v, at[11], iw),
            context.cast(builder, be_v, at[12], dt), data(c_v, at[13]),
            as_int(ldc_v, at[14], iw)])
        return context.get_dummy_value()

    return sig, codegen


@kernel
def gemm(fns, ints, a, trans_a, b, trans_b, c, beta):
    """``c = op(a) @ op(b) + beta * c`` (``op`` = transpose where ``trans_*``);
    2-D arrays whose rows are contiguous (any row stride, e.g. a row slice
    of a larger buffer).  ``(fns, ints)`` is :func:`gemm_handle`'s: the
    sgemm/dgemm addresses (the one that matches the arrays' dtype is called)
    and the integer prototype.  Raises ``ValueError`` on a shape mismatch or
    rows that are not contiguous or overlap."""
    isz = c.itemsize
    fn = fns[0] if isz == 4 else fns[1]
    m, n = c.shape
    ka = a.shape[0] if trans_a else a.shape[1]
    ma = a.shape[1] if trans_a else a.shape[0]
    kb = b.shape[1] if trans_b else b.shape[0]
    nb = b.shape[0] if trans_b else b.shape[1]
    if ma != m or nb != n or ka != kb:
        raise ValueError("gemm: shapes do not match")
    if m == 0 or n == 0:
        return
    if ka == 0:            # op(a) @ op(b) is all zeros
        for i in range(m):
            for j in range(n):
                c[i, j] = c[i, j] * beta if beta != 0 else 0
        return
    if ((a.shape[1] > 1 and a.strides[1] != isz) or (b.shape[1] > 1 and b.strides[1] != isz)
            or (n > 1 and c.strides[1] != isz)):
        raise ValueError("gemm: rows must be contiguous")
    lda, ldb, ldc = _ld(a, isz), _ld(b, isz), _ld(c, isz)
    if lda < 0 or ldb < 0 or ldc < 0:
        raise ValueError("gemm: rows overlap (row stride below the row length)")
    _cblas_gemm(fn, ints, TRANS if trans_a else NO_TRANS, TRANS if trans_b else NO_TRANS,
                m, n, ka, 1.0, a, lda, b, ldb, beta, c, ldc)


@kernel(inline="always")
def _ld(x, isz):
    """The leading dimension of a row-major 2-D array (a size-1 first axis may
    carry any stride: its row length then), -1 where rows would overlap."""
    rows, cols = x.shape
    if rows <= 1:
        return max(cols, 1)
    ld = x.strides[0] // isz
    return ld if ld >= cols else -1


_HANDLE = None
_SEARCHED = False


def _numpy_blas_paths():
    """Shared libraries numpy loaded for BLAS (threadpoolctl's view), numpy's own first."""
    try:
        # lazy and optional: a deployed Policy needs numpy and numba only
        # (tests/test_policy.py); without threadpoolctl the numpy backward runs
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    np_dir = os.path.dirname(os.path.dirname(np.__file__))
    paths = [d["filepath"] for d in threadpool_info() if d.get("user_api") == "blas"]
    return sorted(paths, key=lambda p: not p.startswith(np_dir))


def _probe(fn_s, fn_d, ints):
    """A small product of each dtype through ``ctypes`` (nothing to compile)
    against ``np.dot``: the entry point exists and takes this integer width."""
    ci = ctypes.c_int64 if ints.dtype == np.int64 else ctypes.c_int32
    rng = np.random.default_rng(0)
    for addr, dt, cf in ((fn_s, np.float32, ctypes.c_float), (fn_d, np.float64, ctypes.c_double)):
        ptr = ctypes.POINTER(cf)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, ci, ci, ci, cf, ptr,
                              ci, ptr, ci, cf, ptr, ci)(addr)
        a = rng.standard_normal((5, 7)).astype(dt)
        b = rng.standard_normal((6, 7)).astype(dt)
        c = np.full((5, 6), np.nan, dt)
        fn(ROW_MAJOR, NO_TRANS, TRANS, 5, 6, 7, 1.0, a.ctypes.data_as(ptr), 7,
           b.ctypes.data_as(ptr), 7, 0.0, c.ctypes.data_as(ptr), 6)
        if not np.array_equal(c, np.dot(a, b.T)):
            return False
    return True


def _numpy_blas_is_ilp64():
    """True when numpy's build info says its BLAS takes 64-bit integers (an
    ILP64 library whose symbols carry no ``64_`` suffix must not be called
    with 32-bit ones: a ctypes probe would not notice, since libffi widens
    the arguments, but compiled code would pass garbage upper halves)."""
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # noqa: BLE001 - older numpy: no build info, trust the symbol names
        return False
    text = " ".join(str(v) for v in info.values()).lower()
    return "use64bitint" in text or "ilp64" in text


def gemm_handle():
    """``(fns, ints)`` for :func:`gemm`: numpy's BLAS sgemm and dgemm
    addresses (int64 array) and the integer prototype, or None (then the
    callers use ``np.dot``).  ``A3C_NUMPY_BACKWARD=1`` forces
    None (the numpy backward, for comparison)."""
    global _HANDLE, _SEARCHED
    if os.environ.get("A3C_NUMPY_BACKWARD", "") not in ("", "0"):
        return None
    if _SEARCHED:
        return _HANDLE
    _SEARCHED = True
    ilp64 = _numpy_blas_is_ilp64()
    for path in _numpy_blas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s_name, d_name, int_t in _SYMBOLS:
            if ilp64 and int_t is np.int32:
                continue
            try:
                fs, fd = getattr(lib, s_name), getattr(lib, d_name)
            except AttributeError:
                continue
            fns = np.array([ctypes.cast(fs, ctypes.c_void_p).value,
                            ctypes.cast(fd, ctypes.c_void_p).value], np.int64)
            handle = (fns, np.zeros(1, int_t))
            try:
                ok = _probe(int(fns[0]), int(fns[1]), handle[1])
            except Exception:  # noqa: BLE001 - any failure means: do not use it
                ok = False
            if ok:
                _HANDLE = handle
                return _HANDLE
    return None
