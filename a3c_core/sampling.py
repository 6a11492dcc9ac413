"""Action selection from a probability vector (Numba kernel + numpy twin), and
the uniforms a worker samples with (:class:`UniformBlocks`)."""
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


class UniformBlocks:
    """``n`` uniforms per :meth:`take`: the next values of one
    ``rng.random`` stream, drawn ``block`` takes' worth per rng call (a new
    rng starts its own stream), so a worker's rollouts see the values of
    one ``rng.random(n)`` per rollout."""

    def __init__(self, n, block):
        self.n, self.block = int(n), int(block)
        self.buf = np.empty(0)
        self.pos = 0
        self.rng = None

    def take(self, rng):
        n, pos = self.n, self.pos
        if pos + n > self.buf.shape[0] or self.rng is not rng:
            self.rng = rng
            self.buf = rng.random(n * self.block)
            pos = 0
        self.pos = pos + n
        return self.buf[pos:pos + n]
