"""Shared optimizers for lock-free (Hogwild) A3C updates on flat float32 buffers.

Each optimizer owns its statistics as flat float32 arrays with the same
length (and so the same layout) as the parameter buffer.  ``opt.apply(params,
grads, global_step=0)`` updates ``params`` and the statistics in place, in one
``nogil`` loop (``a3c_core._hogwild``), so worker threads run it in parallel.

Concurrency (read this before relying on determinism)
-----------------------------------------------------
Workers call ``apply`` on the SAME shared params and statistics at the same
time, without locks.  That is racy by design (Hogwild!, Recht et al. 2011;
the A3C paper's shared RMSProp).  With one worker and a fixed seed, updates
are fully deterministic; with several they are not.

What a race can do:
  * lose or interleave updates of individual elements: two workers read the
    same old ``params[i]``/``square_avg[i]`` and the last store wins, so one
    worker's contribution to that element is lost;
  * use stale statistics: a worker scales its step with a ``square_avg`` /
    ``exp_avg`` that another worker is about to overwrite;
  * mix updates across elements: a reader (``sync_params``, another worker's
    apply) sees some elements before and some after a concurrent update, so
    the parameter vector it gets is half-old/half-new.

What a race cannot do:
  * tear a float32: every element is read once and stored once as an aligned
    4-byte value; on x86-64 (and other mainstream 64-bit CPUs) aligned 4-byte
    loads/stores are single-copy atomic, even inside vector loads/stores,
    because an aligned element never straddles a cache line;
  * create a NaN or an infinity: every stored value is the finite result of a
    complete computation from finite inputs (the statistics are sums of
    squares, ``eps > 0`` keeps the denominators positive), and non-finite
    gradients are rejected before apply (``clip_grad_norm`` /
    ``SharedState.apply`` skip and count them).

Adam's step count is shared too: ONE counter per optimizer object,
incremented under a tiny lock at the start of each ``apply`` (the lock covers
only the ``+= 1``; the element loop runs without it).  The common bug in A3C
code is a per-worker step count: with N workers each worker's bias correction
then lags the true number of updates applied to the shared ``m``/``v`` by a
factor N, so early steps are over-corrected (too large).

``grad_scale`` (a keyword every ``apply`` accepts) multiplies the gradient
inside the loop; ``SharedState.apply`` uses it to fold the norm clip into the
update without a second pass over the gradient.

``out`` (also accepted by every ``apply``): a worker's local float32 copy of
the params, written in the same sweep with each element's new value, so that
apply and the next sync cost one pass over the arrays instead of two (the
copy is what a ``sync_params`` right after the apply would read, except for
elements another worker changes later in the sweep).

``offset`` (also accepted by every ``apply``) starts the sweep at that element
and wraps around: the result is the same, element by element.  The trainer
gives worker ``i`` of ``N`` the offset ``i * n / N`` so that two applies that
run at the same time write different cache lines at any moment instead of
chasing each other over the same ones.  Measured (2 threads, 1.2M params,
medians of three runs on a noisy 2-core VM; docs/results.md, "Investigations
that concluded"): Adam from a common start 1.41-2.30x one thread's time
per update, staggered 1.42-1.54x, two threads on private arrays (no sharing
at all) 1.44-1.58x: staggering removes the contention, the rest is memory
bandwidth (Adam streams 7 arrays).  RMSProp (5 arrays): 1.03-1.55x.
"""
import threading

import numpy as np

from a3c_core import _hogwild, _hugepages

__all__ = ["Optimizer", "RMSProp", "Adam", "make_optimizer", "OPTIMIZERS"]


def _check_positive_int(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return int(value)


def _check_float(name, value, lo=None, hi=None, lo_open=False, hi_open=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ValueError(f"{name} must be {'<' if hi_open else '<='} {hi}, got {v}")
    return v


def _opt(out):
    return () if out is None else (out,)


def _sl(out, sl):
    return None if out is None else out[sl]


class Optimizer:
    """Base class: hyper-parameters as floats, statistics as flat float32 arrays.

    Subclasses set ``name``, ``_hyper`` (names of float hyper-parameters),
    ``_ints`` (names of int counters), ``_arrays`` (names of statistic
    arrays) and implement ``apply``; other modules read the names through
    :attr:`hyper_names`, :attr:`int_names` and :attr:`array_names`.
    """

    name = "base"
    _hyper = ()
    _arrays = ()
    _ints = ()

    def __init__(self, n_params):
        self.n_params = _check_positive_int("n_params", n_params)
        for a in self._arrays:
            setattr(self, a, _hugepages.zeros(self.n_params, np.float32))

    @property
    def array_names(self) -> tuple:
        """Names of the statistic arrays, in :meth:`state_dict` order: each is
        an attribute of this optimizer, a flat float32 array of ``n_params``
        (Adam's AMSGrad adds ``max_exp_avg_sq``)."""
        return self._arrays

    @property
    def hyper_names(self) -> tuple:
        """Names of the float hyper-parameters (attributes; in :meth:`state_dict`)."""
        return self._hyper

    @property
    def int_names(self) -> tuple:
        """Names of the int counters, e.g. Adam's ``step`` (attributes; in :meth:`state_dict`)."""
        return self._ints

    def apply(self, params, grads, global_step=0, grad_scale=1.0, offset=0,
              out=None):  # pragma: no cover
        raise NotImplementedError

    def _spans(self, offset, *arrays):
        """Slices covering all elements, starting at ``offset`` and wrapping once.

        Any argument that is not a 1-D array of ``n_params`` elements gets one
        unsplit slice, so the kernel sees (and rejects) the whole bad array.
        """
        offset = self._offset(offset, *arrays)
        return (slice(None),) if offset == 0 else (slice(offset, None), slice(0, offset))

    def _offset(self, offset, *arrays):
        """``offset`` modulo ``n_params``; 0 when an argument is not a 1-D
        array of ``n_params`` elements (the kernel then rejects it whole)."""
        n = self.n_params
        for a in arrays:
            if not (isinstance(a, np.ndarray) and a.ndim == 1 and a.shape[0] == n):
                return 0
        return int(offset) % n

    #: > 0: the learning rate decays linearly to ``lr * anneal_floor`` at this
    #: global step, and stays there
    anneal_steps = 0
    #: the annealed rate's final fraction of ``lr``, in [0, 1]
    anneal_floor = 0.0

    def lr_at(self, global_step=0):
        """Learning rate used by an apply at ``global_step``:
        ``lr * max(anneal_floor, 1 - global_step / anneal_steps)`` while annealing."""
        if self.anneal_steps > 0:
            return self.lr * max(self.anneal_floor, 1.0 - global_step / self.anneal_steps)
        return self.lr

    def state_dict(self):
        """dict: 'name', float hyper-parameters, int counters, statistic arrays (copies)."""
        d = {"name": self.name, "n_params": self.n_params}
        for h in self._hyper:
            d[h] = float(getattr(self, h))
        for k in self._ints:
            d[k] = int(getattr(self, k))
        for a in self._arrays:
            d[a] = getattr(self, a).copy()
        return d

    def load_state_dict(self, d):
        """Restore from :meth:`state_dict` output; arrays are copied in place."""
        if not isinstance(d, dict):
            raise TypeError(f"state must be a dict, got {type(d).__name__}")
        if d.get("name", self.name) != self.name:
            raise ValueError(f"state is for optimizer {d.get('name')!r}, this is {self.name!r}")
        missing = [k for k in self._arrays if k not in d]
        if missing:
            raise ValueError(f"{self.name} state is missing {missing}")
        new = {}
        for a in self._arrays:
            arr = np.asarray(d[a])
            if arr.shape != (self.n_params,):
                raise ValueError(f"{self.name} state {a!r} has shape {arr.shape}, "
                                 f"expected ({self.n_params},)")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{self.name} state {a!r} has non-finite values")
            new[a] = arr
        hyper = {h: _check_float(h, d[h]) for h in self._hyper if h in d}
        ints = {k: _check_positive_int(k, int(d[k]), allow_zero=True)
                for k in self._ints if k in d}
        for a, arr in new.items():
            getattr(self, a)[...] = arr
        for h, v in hyper.items():
            setattr(self, h, v)
        for k, v in ints.items():
            setattr(self, k, v)

    def __repr__(self):
        hp = ", ".join(f"{h}={getattr(self, h):g}" for h in self._hyper)
        return f"{type(self).__name__}(n_params={self.n_params}, {hp})"


class RMSProp(Optimizer):
    """A3C paper shared RMSProp (non-centred), statistics shared by all workers.

    g <- alpha*g + (1-alpha)*d^2;  params <- params - lr_t * d / sqrt(g + eps)

    ``eps`` is inside the square root (paper / TF convention; 0.1 is the A3C
    default).  With ``anneal_steps > 0`` the learning rate decays linearly,
    lr_t = lr * max(anneal_floor, 1 - global_step/anneal_steps), ``global_step`` being
    the value passed to :meth:`apply` (the shared step counter).
    Statistics start at zero.
    """

    name = "rmsprop"
    _hyper = ("lr", "alpha", "eps", "anneal_floor")
    _ints = ("anneal_steps",)
    _arrays = ("square_avg",)

    def __init__(self, n_params, lr=7e-4, alpha=0.99, eps=0.1, anneal_steps=0, anneal_floor=0.0):
        super().__init__(n_params)
        self.lr = _check_float("lr", lr, lo=0.0)
        self.alpha = _check_float("alpha", alpha, lo=0.0, hi=1.0, hi_open=True)
        self.eps = _check_float("eps", eps, lo=0.0, lo_open=True)
        self.anneal_steps = _check_positive_int("anneal_steps", anneal_steps, allow_zero=True)
        self.anneal_floor = _check_float("anneal_floor", anneal_floor, lo=0.0, hi=1.0)

    def apply(self, params, grads, global_step=0, grad_scale=1.0, offset=0, out=None):
        lr, ms = self.lr_at(global_step), self.square_avg
        for sl in self._spans(offset, params, grads, *_opt(out)):
            _hogwild.rmsprop_apply(params[sl], grads[sl], ms[sl], lr, self.alpha, self.eps,
                                   grad_scale, _sl(out, sl))


class Adam(Optimizer):
    """Adam with SHARED first/second moments and a SHARED step count.

    m <- b1*m + (1-b1)*d;  v <- b2*v + (1-b2)*d^2;  t = shared step (1, 2, ...)
    params <- params - lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)

    ``self.step`` counts applies by all workers together; it is incremented
    under a tiny lock before the nogil loop, so bias correction matches the
    number of updates actually accumulated in m and v.  (A per-worker step
    count, the well-known bug in A3C ports, lags by the number of workers
    and over-corrects early updates.)  ``global_step`` (agent steps, the
    shared counter) only matters with ``anneal_steps > 0``: then, as in
    :class:`RMSProp` and the A3C paper, lr_t = lr * max(anneal_floor, 1 -
    global_step/anneal_steps).

    ``amsgrad=True`` (Reddi et al. 2018; PyTorch's ``amsgrad``) keeps a third
    array, the running maximum of ``v``, and divides the step by it:
    ``params <- params - lr * m_hat / (sqrt(max(v)/(1-b2^t)) + eps)``.  Why:
    Adam's step is invariant to the gradient's scale, so where a converged
    policy's gradients shrink (doom:basic: the policy and value heads',
    10-50x, docs/results.md) plain Adam keeps moving those weights by about
    as much per apply as while it was learning.  With the maximum the step
    shrinks with the gradient, the way plain SGD's does, and a burst after
    convergence is measured against the largest gradients seen, not the
    smallest.  A state saved without the maximum is loaded with it set to
    ``v``.
    """

    name = "adam"
    _hyper = ("lr", "beta1", "beta2", "eps", "anneal_floor")
    _ints = ("step", "anneal_steps")
    _arrays = ("exp_avg", "exp_avg_sq")

    def __init__(self, n_params, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8,
                 amsgrad=False, anneal_steps=0, anneal_floor=0.0):
        if not isinstance(amsgrad, (bool, np.bool_)):
            raise TypeError(f"amsgrad must be a bool, got {type(amsgrad).__name__}")
        #: AMSGrad: the step divides by the running maximum of v (one more array)
        self.amsgrad = bool(amsgrad)
        if self.amsgrad:
            self._arrays = Adam._arrays + ("max_exp_avg_sq",)
        super().__init__(n_params)
        self.lr = _check_float("lr", lr, lo=0.0)
        self.beta1 = _check_float("beta1", beta1, lo=0.0, hi=1.0, hi_open=True)
        self.beta2 = _check_float("beta2", beta2, lo=0.0, hi=1.0, hi_open=True)
        self.eps = _check_float("eps", eps, lo=0.0, lo_open=True)
        self.anneal_steps = _check_positive_int("anneal_steps", anneal_steps, allow_zero=True)
        self.anneal_floor = _check_float("anneal_floor", anneal_floor, lo=0.0, hi=1.0)
        self.step = 0
        self._lock = threading.Lock()

    def apply(self, params, grads, global_step=0, grad_scale=1.0, offset=0, out=None):
        """One Adam step (the shared step count incremented first)."""
        with self._lock:
            self.step += 1
            t = self.step
        m, v = self.exp_avg, self.exp_avg_sq
        lr = self.lr_at(global_step)
        try:
            # a bad argument is rejected by the first call, before anything is
            # written: the spans only split arrays already checked 1-D of n_params
            w = self.max_exp_avg_sq if self.amsgrad else None
            # one call: the kernel sweeps from the offset and wraps itself
            _hogwild.adam_apply(params, grads, m, v, lr, self.beta1, self.beta2, self.eps, t,
                                grad_scale, out, w,
                                self._offset(offset, params, grads, *_opt(out)))
        except (TypeError, ValueError):
            with self._lock:       # rejected before anything was written
                self.step -= 1
            raise

    def load_state_dict(self, d):
        if self.amsgrad and isinstance(d, dict) and "max_exp_avg_sq" not in d \
                and "exp_avg_sq" in d:
            # a state saved without AMSGrad: the running maximum starts at v
            d = dict(d, max_exp_avg_sq=d["exp_avg_sq"])
        super().load_state_dict(d)

    def __repr__(self):
        return super().__repr__()[:-1] + (", amsgrad=True)" if self.amsgrad else ")")

    def moment_stats(self):
        """Diagnostics of the shared moments, for logs (one read pass, racy but finite).

        Returns ``(denominator_rms, update_rms)``: ``sqrt(mean(v_hat))``, the
        gradient RMS per element that Adam's second moments currently expect,
        and ``rms(m_hat / (sqrt(v_hat) + eps))``, the RMS of the step in units
        of ``lr`` that the next apply of a zero gradient would take.  A gradient
        whose per-element RMS is many times the first moves every parameter by
        up to ``(1-beta1)/sqrt(1-beta2)`` (3.2 at the defaults) times ``lr``.
        """
        t = max(self.step, 1)
        bc1 = 1.0 / (1.0 - self.beta1 ** t)
        bc2 = 1.0 / (1.0 - self.beta2 ** t)
        v = self.exp_avg_sq.astype(np.float64) * bc2
        den_rms = float(np.sqrt(v.mean()))
        if self.amsgrad:                 # the step's denominator: the running max
            v = self.max_exp_avg_sq.astype(np.float64) * bc2
        np.sqrt(v, out=v)
        v += self.eps
        u = self.exp_avg.astype(np.float64)
        u *= bc1
        u /= v
        return den_rms, float(np.sqrt(np.mean(u * u)))


OPTIMIZERS = {"rmsprop": RMSProp, "adam": Adam}


def make_optimizer(name, n_params, **kwargs):
    """Build an optimizer by name ('rmsprop' or 'adam'; case-insensitive)."""
    if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    cls = OPTIMIZERS[name.lower()]
    try:
        return cls(n_params, **kwargs)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise TypeError(f"optimizer {name!r}: {e}") from None
        raise
