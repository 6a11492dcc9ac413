"""Action selection from a probability vector (Numba kernel + numpy twin)."""
import numpy as np

from a3c_core._jit import kernel


@kernel
def sample_categorical(probs__a, u):
    """Index ``a`` with P(a) = probs[a], given one uniform ``u`` in [0, 1).

    Inverse-CDF sampling; rounding in the cumulative sum can never return an
    action of probability 0 (falls back to the last action with p > 0).
    """
    acc = 0.0
    last = 0
    for a in range(probs__a.shape[0]):
        p = probs__a[a]
        if p > 0.0:
            last = a
            acc += p
            if u < acc:
                return a
    return last


def sample_categorical_ref(probs, u):
    """Plain numpy twin of :func:`sample_categorical`."""
    probs = np.asarray(probs, dtype=np.float64)
    idx = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    if idx >= probs.size:  # u beyond the (rounded) total mass
        idx = int(np.flatnonzero(probs > 0)[-1])
    return idx


@kernel
def sample_mixed(probs__a, eps, u):
    """Sample from the epsilon-mixture ``q = (1 - eps) * probs + eps / A``
    with one uniform ``u`` in [0, 1); returns ``(a, w)`` with the policy-
    gradient weight ``w = (1 - eps) * probs[a] / q[a]`` in [0, 1].

    ``-A w (onehot(a) - probs)``, the usual logit gradient scaled by ``w``,
    is the gradient of ``-A log q(a)``: training on ``q`` rather than on
    ``probs`` bounds the score of an improbable action (``q[a] >= eps / A``),
    so ``w`` is ~1 for likely actions and ~``probs[a] A / eps`` for
    improbable ones.  Inverse-CDF over ``q``; rounding can never return past
    the last action.
    """
    n = probs__a.shape[0]
    keep = 1.0 - eps
    floor = eps / n
    acc = 0.0
    a = n - 1
    for i in range(n):
        acc += keep * probs__a[i] + floor
        if u < acc:
            a = i
            break
    pa = keep * probs__a[a]
    return a, (pa / (pa + floor) if pa + floor > 0.0 else 1.0)


def sample_mixed_ref(probs, eps, u):
    """Plain numpy twin of :func:`sample_mixed`."""
    probs = np.asarray(probs, dtype=np.float64)
    q = (1.0 - eps) * probs + eps / probs.size
    a = min(int(np.searchsorted(np.cumsum(q), u, side="right")), probs.size - 1)
    return a, float((1.0 - eps) * probs[a] / q[a]) if q[a] > 0 else 1.0


def greedy(probs):
    """The most probable action."""
    return int(np.argmax(probs))
