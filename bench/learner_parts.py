"""Where one worker's learner time goes, part by part (doom-lstm by default).

    python bench/learner_parts.py [--spec doom-lstm] [--t-max 20] [--repeat 30] [--numpy-backward]

Times, each alone in a loop (median of ``--repeat`` after two warm-up calls,
one BLAS thread): ``T`` recorded steps (``Network.step(record=True)``), the
backward-only update (``Network.rollout_grad``) and the fused tail (norm pass,
then Adam with the clip folded in, writing the worker's local copy:
``SharedState.apply(sync_to=)``), and their sum per agent step, which is what
``a3c bench``'s ``learner us/agent step`` row measures with the paths
interleaved; then the same parts timed in sequence, one rollout after
another, as a worker runs them (each then finds less of its data in the
caches).  Then the backward by layer (``backward_compiled``, one
nogil call per layer, or with ``--numpy-backward`` ``prepare_backward``
and ``backward``; and the heads' fused ``forward_loss``), timed by
wrapping each layer method.  Never run it beside a training run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import threadpoolctl

from a3c_core import core
from a3c_core.bench import _rollout
from a3c_core.nn import kernels as K
from a3c_core.nn import layers as L
from a3c_core.nn.network import build_network


def median_us(fn, repeat):
    fn()
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="doom-lstm")
    ap.add_argument("--t-max", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--numpy-backward", action="store_true",
                    help="the np.dot backward instead of the compiled one (Network.compiled_backward)")
    a = ap.parse_args(argv)
    with threadpoolctl.threadpool_limits(1):
        return _run(a)


def _run(a):
    net = build_network(a.spec)
    if a.numpy_backward:
        net.compiled_backward = False
    T = a.t_max
    obs, actions, returns, adv = _rollout(net, T, np.random.default_rng(1))
    s0 = net.initial_state()
    shared = core.SharedState(net.params, core.Adam(net.n_params, lr=1e-4))

    def steps():
        net.begin_rollout(T)
        s = s0
        for t in range(T):
            _, _, s = net.step(obs[t], s, record=True)

    def backward():
        net.rollout_grad(actions, returns, adv, value_coef=0.5, entropy_beta=0.01)

    def tail():
        shared.apply(net.grads, 40.0, sync_to=net.params)

    steps()
    parts = {f"{T} recorded steps": median_us(steps, a.repeat),
             "rollout_grad": median_us(backward, a.repeat),
             "fused tail": median_us(tail, a.repeat)}
    for k, v in parts.items():
        print(f"{k:>20}: {v:8.0f} us")
    print(f"{'per agent step':>20}: {sum(parts.values()) / T:8.1f} us")

    # the same parts one after the other, as a worker (and a3c bench) runs
    # them: each then finds less of its data in the caches the others share
    perf = time.perf_counter
    seq = []
    for i in range(a.repeat + 2):
        t0 = perf()
        steps()
        t1 = perf()
        backward()
        t2 = perf()
        tail()
        if i >= 2:
            seq.append((t1 - t0, t2 - t1, perf() - t2))
    print("in sequence (one rollout after another):")
    for k, col in zip(parts, zip(*seq)):
        print(f"{k:>20}: {statistics.median(col) * 1e6:8.0f} us")
    print(f"{'per agent step':>20}: {statistics.median(map(sum, seq)) * 1e6 / T:8.1f} us")

    spent = {}

    def wrap(cls, meth):
        f = getattr(cls, meth)

        def timed(self, *args, **kw):
            t0 = time.perf_counter()
            try:
                return f(self, *args, **kw)
            finally:
                key = (getattr(self, "name", cls.__name__.lower()), meth)
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
        setattr(cls, meth, timed)

    def wrap_calls(cls):
        """``backward_calls`` whose kernels are timed as the layer's
        ``backward_compiled`` (``rollout_grad`` replays these calls; a conv's
        prepare and backward calls count together, as in ``backward_compiled``)."""
        f = cls.backward_calls

        def timed_calls(self, *args, **kw):
            key = (self.name, "backward_compiled")

            def timed_kernel(kern):
                def run(*a):
                    t0 = time.perf_counter()
                    try:
                        return kern(*a)
                    finally:
                        spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
                return run
            return [(timed_kernel(k), a) for k, a in f(self, *args, **kw)]
        cls.backward_calls = timed_calls

    saved = [(cls, meth, vars(cls)[meth]) for cls in (L.Conv2d, L.Dense, L.LSTM, L.Heads)
             for meth in ("prepare_backward", "backward", "backward_compiled", "forward_loss",
                          "backward_calls")
             if meth in vars(cls)]
    heads_kernel = K.heads_loss

    def timed_heads(*args):
        # the compiled update calls the heads' kernel itself (Network._rollout_plan)
        t0 = time.perf_counter()
        try:
            return heads_kernel(*args)
        finally:
            key = ("heads", "forward_loss")
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0

    try:
        for cls, meth, _ in saved:
            if meth == "backward_calls":
                wrap_calls(cls)
            elif not (meth == "forward_loss" and net.compiled_backward):
                wrap(cls, meth)
        if net.compiled_backward:
            K.heads_loss = timed_heads
        net._bw_calls = {}      # rebuilt through the timed backward_calls
        steps()
        for _ in range(a.repeat):
            backward()
    finally:        # the layer classes as they were (this may run inside a test process)
        for cls, meth, f in saved:
            setattr(cls, meth, f)
        K.heads_loss = heads_kernel
        net._bw_calls = {}
    print("rollout_grad by layer:")
    for (name, meth), sec in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"{name + '.' + meth:>28}: {sec / a.repeat * 1e6:8.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
