# cython: language_level=3
"""Argument checks and raw pointers shared by the ext/ kernels (cimport only).

Every ``def`` wrapper checks its arrays with these before it releases the GIL,
so bad input raises a TypeError/ValueError that names the argument instead of
crashing inside a nogil loop.
"""
cimport numpy as cnp


cdef inline Py_ssize_t _check_f32(object a, str name, bint writeable=False,
                                  Py_ssize_t n=-1) except -1:
    """Return len(a) after checking a is a 1-D C-contiguous aligned float32 ndarray."""
    cdef cnp.ndarray arr
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a numpy.ndarray of float32, got {type(a).__name__}")
    arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32:
        raise TypeError(f"{name} must have dtype float32, got {arr.dtype}")
    if cnp.PyArray_NDIM(arr) != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} must be aligned")
    if writeable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} must be writeable (it is written in place)")
    cdef Py_ssize_t size = cnp.PyArray_DIM(arr, 0)
    if n >= 0 and size != n:
        raise ValueError(f"{name} has length {size}, expected {n}")
    return size


cdef inline float* _fptr(object a) noexcept:
    return <float*>cnp.PyArray_DATA(<cnp.ndarray>a)
