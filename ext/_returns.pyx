# cython: language_level=3
"""n-step discounted returns and GAE(gamma, lambda) over one rollout (nogil).

Arrays are 1-D float32 of length T (time order); the recursions run backwards
in float64 and store float32.  ``bootstrap_value`` is V(s_T): 0.0 when the
rollout ended in a terminal state, the critic's value when it was cut by
t_max or truncated by a time limit.  The A3C rollout never crosses an episode
boundary, so there is no per-step ``done`` mask.
"""
cimport numpy as cnp
from _arrays cimport _check_f32, _fptr

cnp.import_array()


cdef inline cnp.ndarray _out(object out, str name, Py_ssize_t n):
    if out is None:
        return cnp.PyArray_EMPTY(1, [n], cnp.NPY_FLOAT32, 0)
    _check_f32(out, name, True, n)
    return <cnp.ndarray>out


cdef inline void _discount(const float* r, float* out, Py_ssize_t n, double boot,
                           double gamma) noexcept nogil:
    cdef double acc = boot
    cdef Py_ssize_t t
    for t in range(n - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = <float>acc


cdef inline void _gae(const float* r, const float* v, float* ret, float* adv,
                      Py_ssize_t n, double boot, double gamma, double lam) noexcept nogil:
    cdef double a = 0.0, next_v = boot, vt, delta
    cdef double gl = gamma * lam
    cdef Py_ssize_t t
    for t in range(n - 1, -1, -1):
        vt = v[t]
        delta = r[t] + gamma * next_v - vt
        a = delta + gl * a
        adv[t] = <float>a
        ret[t] = <float>(a + vt)
        next_v = vt


def discounted_returns(rewards, double bootstrap_value, double gamma, out=None):
    """R_t = r_t + gamma*R_{t+1}, R_T = bootstrap_value; float32 (T,) -> (T,)."""
    cdef Py_ssize_t n = _check_f32(rewards, "rewards")
    cdef cnp.ndarray o = _out(out, "out", n)
    cdef const float* pr = _fptr(rewards)
    cdef float* po = _fptr(o)
    with nogil:
        _discount(pr, po, n, bootstrap_value, gamma)
    return o


def gae(rewards, values, double bootstrap_value, double gamma, double lam,
        out_returns=None, out_advantages=None):
    """GAE(gamma, lam): returns (returns, advantages), float32 (T,) each.

    delta_t = r_t + gamma*V_{t+1} - V_t (V_T = bootstrap_value);
    A_t = delta_t + gamma*lam*A_{t+1}; returns = A + V (lambda-returns).
    """
    cdef Py_ssize_t n = _check_f32(rewards, "rewards")
    _check_f32(values, "values", False, n)
    cdef cnp.ndarray ret = _out(out_returns, "out_returns", n)
    cdef cnp.ndarray adv = _out(out_advantages, "out_advantages", n)
    if ret is adv or (n > 0 and cnp.PyArray_DATA(ret) == cnp.PyArray_DATA(adv)):
        raise ValueError("out_returns and out_advantages must be different arrays")
    cdef const float* pr = _fptr(rewards)
    cdef const float* pv = _fptr(values)
    cdef float* pret = _fptr(ret)
    cdef float* padv = _fptr(adv)
    with nogil:
        _gae(pr, pv, pret, padv, n, bootstrap_value, gamma, lam)
    return ret, adv
