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


def greedy(probs):
    """The most probable action."""
    return int(np.argmax(probs))


@kernel
def sample_rows(probs__na, u__n, out__n):
    """:func:`sample_categorical` for each row: ``out[i]`` from ``probs[i]`` and ``u[i]``."""
    for i in range(probs__na.shape[0]):
        out__n[i] = sample_categorical(probs__na[i], u__n[i])
