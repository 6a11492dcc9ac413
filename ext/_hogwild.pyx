# cython: language_level=3
"""Hogwild kernels over flat float32 parameter buffers (GIL released).

Every ``def`` here validates its arguments (dtype, 1-D, C-contiguous,
writeable, equal lengths) and raises ``TypeError``/``ValueError`` naming the
argument *before* the GIL is released; the hot loop then runs in one
``with nogil:`` block over raw pointers taken from the validated arrays.

The loops read each shared element once into a register, compute, and store
it once: racing writers (Hogwild) can lose or interleave whole-element
updates, never tear a 4-byte aligned float32 (see ``a3c_core.core.optim``).

Public (used by ``a3c_core.core``): ``copy_f32``, ``sumsq_f32``,
``scale_f32``, ``rmsprop_apply``, ``adam_apply``.
"""
cimport numpy as cnp
from _arrays cimport _check_f32, _fptr
from libc.math cimport sqrtf, isfinite
from libc.string cimport memmove

cnp.import_array()

# The element loops are written in C so they can carry ``restrict`` and be
# compiled twice (AVX2 and baseline x86-64) with run-time dispatch; the
# arithmetic is the same expression order as the numpy twins in
# ``a3c_core/core/ref.py`` (no FMA contraction is enabled by the avx2 clone).
cdef extern from *:
    """
    #include <math.h>
    #include <stddef.h>
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    #  define A3C_CLONES __attribute__((target_clones("avx2", "default")))
    #  define A3C_CLONES_512 __attribute__((target_clones("avx512f", "avx2", "default")))
    #else
    #  define A3C_CLONES
    #  define A3C_CLONES_512
    #endif
    #if defined(__GNUC__) || defined(__clang__)
    #  define A3C_RESTRICT __restrict__
    #else
    #  define A3C_RESTRICT
    #endif

    /* sum of squares, float64 accumulation in 32 independent partial sums
       (element i goes to lane i % 32), added pairwise at the end.  Written as
       a lane array so that GCC vectorizes it without reassociating: 8 four-
       double accumulators in the AVX2 clone, 4 eight-double ones in the
       AVX-512 clone, 2x the old 8-scalar loop on 1.2M floats (bench/RESULTS.md).
       A float squared is exact in double, so an FMA the AVX-512 clone may
       contract leaves every partial sum bit-identical. */
    #define A3C_SUMSQ_LANES 32
    A3C_CLONES_512 static double a3c_sumsq(const float *A3C_RESTRICT g, Py_ssize_t n) {
        double s[A3C_SUMSQ_LANES];
        for (int k = 0; k < A3C_SUMSQ_LANES; k++) s[k] = 0;
        Py_ssize_t i = 0;
        for (; i + A3C_SUMSQ_LANES <= n; i += A3C_SUMSQ_LANES)
            for (int k = 0; k < A3C_SUMSQ_LANES; k++) { double x = g[i + k]; s[k] += x * x; }
        for (int k = 0; i < n; i++, k++) { double x = g[i]; s[k] += x * x; }
        for (int w = A3C_SUMSQ_LANES / 2; w >= 1; w /= 2)
            for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
        return s[0];
    }

    A3C_CLONES static void a3c_scale(float *A3C_RESTRICT g, Py_ssize_t n, float s) {
        for (Py_ssize_t i = 0; i < n; i++) g[i] = g[i] * s;
    }

    /* ms <- alpha*ms + (1-alpha)*d*d ; p <- p - lr*d/sqrt(ms+eps), d = gs*g.
       setup.py compiles with -fno-math-errno so sqrtf vectorizes. */
    A3C_CLONES static void a3c_rmsprop(float *A3C_RESTRICT p, const float *A3C_RESTRICT g,
                                      float *A3C_RESTRICT ms, Py_ssize_t n, float lr,
                                      float alpha, float one_m_alpha, float eps, float gs,
                                      float *A3C_RESTRICT out) {
        if (out) {
            for (Py_ssize_t i = 0; i < n; i++) {
                float d = g[i] * gs;
                float s = alpha * ms[i] + one_m_alpha * (d * d);
                float pi = p[i] - (lr * d) / sqrtf(s + eps);
                ms[i] = s;
                p[i] = pi;
                out[i] = pi;
            }
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float d = g[i] * gs;
            float s = alpha * ms[i] + one_m_alpha * (d * d);
            ms[i] = s;
            p[i] = p[i] - (lr * d) / sqrtf(s + eps);
        }
    }

    /* m <- b1*m + (1-b1)*d ; v <- b2*v + (1-b2)*d*d ;
       p <- p - lr*(m*bc1) / (sqrt(v*bc2) + eps), bc = 1/(1-beta^t) */
    A3C_CLONES static void a3c_adam(float *A3C_RESTRICT p, const float *A3C_RESTRICT g,
                                   float *A3C_RESTRICT m, float *A3C_RESTRICT v, Py_ssize_t n,
                                   float lr, float b1, float one_m_b1, float b2, float one_m_b2,
                                   float bc1, float bc2, float eps, float gs,
                                   float *A3C_RESTRICT out) {
        if (out) {
            for (Py_ssize_t i = 0; i < n; i++) {
                float d = g[i] * gs;
                float mi = b1 * m[i] + one_m_b1 * d;
                float vi = b2 * v[i] + one_m_b2 * (d * d);
                float pi = p[i] - (lr * (mi * bc1)) / (sqrtf(vi * bc2) + eps);
                m[i] = mi;
                v[i] = vi;
                p[i] = pi;
                out[i] = pi;
            }
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float d = g[i] * gs;
            float mi = b1 * m[i] + one_m_b1 * d;
            float vi = b2 * v[i] + one_m_b2 * (d * d);
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] - (lr * (mi * bc1)) / (sqrtf(vi * bc2) + eps);
        }
    }

    /* AMSGrad (Reddi et al. 2018; PyTorch's amsgrad=True): as a3c_adam, and
       vmax <- max(vmax, v); the step divides by sqrt(vmax*bc2) + eps, so once
       the gradients shrink the step shrinks with them instead of staying ~lr */
    A3C_CLONES static void a3c_adam_ams(float *A3C_RESTRICT p, const float *A3C_RESTRICT g,
                                       float *A3C_RESTRICT m, float *A3C_RESTRICT v,
                                       float *A3C_RESTRICT vmax, Py_ssize_t n,
                                       float lr, float b1, float one_m_b1, float b2,
                                       float one_m_b2, float bc1, float bc2, float eps,
                                       float gs, float *A3C_RESTRICT out) {
        if (out) {
            for (Py_ssize_t i = 0; i < n; i++) {
                float d = g[i] * gs;
                float mi = b1 * m[i] + one_m_b1 * d;
                float vi = b2 * v[i] + one_m_b2 * (d * d);
                float wi = vmax[i] > vi ? vmax[i] : vi;
                float pi = p[i] - (lr * (mi * bc1)) / (sqrtf(wi * bc2) + eps);
                m[i] = mi;
                v[i] = vi;
                vmax[i] = wi;
                p[i] = pi;
                out[i] = pi;
            }
            return;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            float d = g[i] * gs;
            float mi = b1 * m[i] + one_m_b1 * d;
            float vi = b2 * v[i] + one_m_b2 * (d * d);
            float wi = vmax[i] > vi ? vmax[i] : vi;
            m[i] = mi;
            v[i] = vi;
            vmax[i] = wi;
            p[i] = p[i] - (lr * (mi * bc1)) / (sqrtf(wi * bc2) + eps);
        }
    }
    """
    double a3c_sumsq(const float *g, Py_ssize_t n) noexcept nogil
    void a3c_scale(float *g, Py_ssize_t n, float s) noexcept nogil
    void a3c_rmsprop(float *p, const float *g, float *ms, Py_ssize_t n, float lr,
                     float alpha, float one_m_alpha, float eps, float gs,
                     float *out) noexcept nogil
    void a3c_adam(float *p, const float *g, float *m, float *v, Py_ssize_t n,
                  float lr, float b1, float one_m_b1, float b2, float one_m_b2,
                  float bc1, float bc2, float eps, float gs, float *out) noexcept nogil
    void a3c_adam_ams(float *p, const float *g, float *m, float *v, float *vmax,
                      Py_ssize_t n, float lr, float b1, float one_m_b1, float b2,
                      float one_m_b2, float bc1, float bc2, float eps, float gs,
                      float *out) noexcept nogil


# ---------------------------------------------------------------- validation
cdef inline int _check_disjoint(object a, str name_a, object b, str name_b) except -1:
    """The C loops use ``restrict``: written buffers must not overlap others."""
    cdef char* pa = <char*>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef char* pb = <char*>cnp.PyArray_DATA(<cnp.ndarray>b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(<cnp.ndarray>a)
    cdef Py_ssize_t nb = cnp.PyArray_NBYTES(<cnp.ndarray>b)
    if pa < pb + nb and pb < pa + na:
        raise ValueError(f"{name_a} and {name_b} must not share memory")
    return 0




cdef float* _out_ptr(object out, Py_ssize_t n, list others, list names) except? NULL:
    """NULL for ``out=None``; else the validated pointer of a writeable 1-D
    float32 array of ``n`` elements that shares no memory with ``others``."""
    if out is None:
        return NULL
    _check_f32(out, "out", True, n)
    for a, name in zip(others, names):
        _check_disjoint(out, "out", a, name)
    return _fptr(out)


# ---------------------------------------------------------------- kernels
def copy_f32(src, dst):
    """dst[:] = src (1-D float32, same length); the copy runs without the GIL."""
    cdef Py_ssize_t n = _check_f32(src, "src")
    _check_f32(dst, "dst", True, n)
    cdef const float* ps = _fptr(src)
    cdef float* pd = _fptr(dst)
    if ps == pd:
        return
    with nogil:
        memmove(pd, ps, n * sizeof(float))


def sumsq_f32(grads):
    """Return (sum(grads**2) accumulated in float64, all_finite).

    Non-finite entries make the float64 sum non-finite (inf**2 = inf, NaN
    propagates; float32 max squared is still finite in float64), so one pass
    answers both questions.
    """
    cdef Py_ssize_t n = _check_f32(grads, "grads")
    cdef const float* pg = _fptr(grads)
    cdef double s
    with nogil:
        s = a3c_sumsq(pg, n)
    return s, bool(isfinite(s))


def scale_f32(grads, double scale):
    """grads *= scale in place (float32)."""
    cdef Py_ssize_t n = _check_f32(grads, "grads", True)
    cdef float* pg = _fptr(grads)
    cdef float s = <float>scale
    with nogil:
        a3c_scale(pg, n, s)


def rmsprop_apply(params, grads, square_avg, double lr, double alpha, double eps,
                  double grad_scale=1.0, out=None):
    """Non-centred RMSProp step in place (A3C shared RMSProp).

    d = grad_scale*g; square_avg <- alpha*square_avg + (1-alpha)*d*d;
    params <- params - lr*d/sqrt(square_avg + eps).  All float32, same length.
    ``out`` (optional, same length): also receives each new ``params[i]`` in
    the same sweep (a worker's local copy: apply and sync in one pass).
    """
    cdef Py_ssize_t n = _check_f32(params, "params", True)
    _check_f32(grads, "grads", False, n)
    _check_f32(square_avg, "square_avg", True, n)
    _check_disjoint(params, "params", grads, "grads")
    _check_disjoint(params, "params", square_avg, "square_avg")
    _check_disjoint(square_avg, "square_avg", grads, "grads")
    cdef float* pp = _fptr(params)
    cdef const float* pg = _fptr(grads)
    cdef float* pm = _fptr(square_avg)
    cdef float flr = <float>lr, fa = <float>alpha, f1a = <float>(1.0 - alpha)
    cdef float feps = <float>eps, fgs = <float>grad_scale
    cdef float* po = _out_ptr(out, n, [params, grads, square_avg],
                              ["params", "grads", "square_avg"])
    with nogil:
        a3c_rmsprop(pp, pg, pm, n, flr, fa, f1a, feps, fgs, po)


def adam_apply(params, grads, exp_avg, exp_avg_sq, double lr, double beta1,
               double beta2, double eps, long long step, double grad_scale=1.0, out=None,
               max_exp_avg_sq=None, Py_ssize_t offset=0):
    """Adam step in place with bias correction for the given (shared) step >= 1.

    d = grad_scale*g; m <- b1*m + (1-b1)*d; v <- b2*v + (1-b2)*d*d;
    params <- params - lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
    ``out`` (optional): also receives the new params in the same sweep.
    ``max_exp_avg_sq`` (optional): AMSGrad; vmax <- max(vmax, v) and the step
    divides by sqrt(vmax/(1-b2^t)) + eps instead.
    ``offset`` (in [0, n)): the sweep starts at that element and wraps to the
    start (the same values; staggered workers contend less, core.optim).
    """
    cdef Py_ssize_t n = _check_f32(params, "params", True)
    _check_f32(grads, "grads", False, n)
    _check_f32(exp_avg, "exp_avg", True, n)
    _check_f32(exp_avg_sq, "exp_avg_sq", True, n)
    _check_disjoint(params, "params", grads, "grads")
    _check_disjoint(params, "params", exp_avg, "exp_avg")
    _check_disjoint(params, "params", exp_avg_sq, "exp_avg_sq")
    _check_disjoint(exp_avg, "exp_avg", grads, "grads")
    _check_disjoint(exp_avg_sq, "exp_avg_sq", grads, "grads")
    _check_disjoint(exp_avg, "exp_avg", exp_avg_sq, "exp_avg_sq")
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    if offset < 0 or (offset >= n and n > 0):
        raise ValueError(f"offset must be in [0, {n}), got {offset}")
    cdef float* pw = NULL
    if max_exp_avg_sq is not None:
        _check_f32(max_exp_avg_sq, "max_exp_avg_sq", True, n)
        for other, name in ((params, "params"), (grads, "grads"), (exp_avg, "exp_avg"),
                            (exp_avg_sq, "exp_avg_sq")):
            _check_disjoint(max_exp_avg_sq, "max_exp_avg_sq", other, name)
        pw = _fptr(max_exp_avg_sq)
    cdef float* po = _out_ptr(out, n, [params, grads, exp_avg, exp_avg_sq]
                              + ([] if pw == NULL else [max_exp_avg_sq]),
                              ["params", "grads", "exp_avg", "exp_avg_sq"]
                              + ([] if pw == NULL else ["max_exp_avg_sq"]))
    cdef float bc1 = <float>(1.0 / (1.0 - beta1 ** step))
    cdef float bc2 = <float>(1.0 / (1.0 - beta2 ** step))
    cdef float* pp = _fptr(params)
    cdef const float* pg = _fptr(grads)
    cdef float* pm = _fptr(exp_avg)
    cdef float* pv = _fptr(exp_avg_sq)
    cdef float flr = <float>lr, fb1 = <float>beta1, f1b1 = <float>(1.0 - beta1)
    cdef float fb2 = <float>beta2, f1b2 = <float>(1.0 - beta2)
    cdef float feps = <float>eps, fgs = <float>grad_scale
    cdef Py_ssize_t k = offset, lo, hi, part
    with nogil:
        for part in range(2 if k > 0 else 1):
            lo = k if part == 0 else 0
            hi = n if part == 0 else k
            if pw == NULL:
                a3c_adam(pp + lo, pg + lo, pm + lo, pv + lo, hi - lo, flr, fb1, f1b1, fb2,
                         f1b2, bc1, bc2, feps, fgs, NULL if po == NULL else po + lo)
            else:
                a3c_adam_ams(pp + lo, pg + lo, pm + lo, pv + lo, pw + lo, hi - lo, flr, fb1,
                             f1b1, fb2, f1b2, bc1, bc2, feps, fgs,
                             NULL if po == NULL else po + lo)
