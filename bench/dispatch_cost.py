"""What calling a worker's compiled agent step costs before the kernel runs.

    python bench/dispatch_cost.py [--calls 20000] [--repeats 7]

Each figure is GIL-held Python on hot caches (a tight loop), so it is a
floor for what the same call costs in a worker, whose caches the engine
and the kernels have just evicted:

* a no-op Numba function of 2 and of 20 array arguments (the dispatcher
  types and unboxes each array), and the 20-argument one through its
  compiled overload's ``entry_point`` (no type dispatch);
* one rollout of 20 agent steps through :meth:`Actor.step_row` against the
  same 20 calls of the step's kernel with its arguments prepared once,
  both with a no-op stand-in for ``kernels.doom_act_packed`` (its 26
  arguments), so only the Python around the kernel is timed.

Medians of ``--repeats`` runs, µs per call.  Never run it beside a
training run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _per_call(fn, calls, repeats):
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(out), min(out), max(out)


def dispatch_rows(calls, repeats):
    from numba import njit

    @njit(nogil=True)
    def two(t, a0, a1, u, eps):
        return t

    @njit(nogil=True)
    def twenty(t, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16,
               a17, a18, a19, u, eps):
        return t

    arrs = [np.zeros((3, 4), np.float32) for _ in range(10)] + [np.zeros(5, np.int64)
                                                                 for _ in range(10)]
    args2 = (1, arrs[0], arrs[1], 0.5, 0.0)
    args20 = (1, *arrs, 0.5, 0.0)
    two(*args2)
    twenty(*args20)
    entry = twenty.overloads[twenty.signatures[0]].entry_point
    return [("no-op, 2 arrays", _per_call(lambda: two(*args2), calls, repeats)),
            ("no-op, 20 arrays", _per_call(lambda: twenty(*args20), calls, repeats)),
            ("no-op, 20 arrays, entry_point", _per_call(lambda: entry(*args20), calls, repeats))]


def actor_rows(calls, repeats, T=20):
    from numba import njit

    import a3c_core.nn.kernels as K
    from a3c_core._blas import limit_blas_threads
    from a3c_core.nn.network import build_network
    from a3c_core.obs import ObsPipeline

    limit_blas_threads(1)
    pipe = ObsPipeline({"kind": "image", "out_shape": [84, 84]}, (120, 160))
    net = build_network("doom-lstm", pipe.net_obs_shape, 3)
    actions, values = np.zeros(T, np.int64), np.zeros(T, np.float32)
    act = net.actor(pipe, actions, values)
    rows = list(np.zeros((T + 1,) + net.obs_shape, np.float32))
    frame = np.zeros((120, 160), np.uint8)
    u = np.random.default_rng(0).random(T)
    state = net.initial_state()

    @njit(nogil=True)
    def noop(t, raw, prep_fn, prep_ctx, obs, h0, c0, from_rows, probs, params, scratch, offs1,
             meta, ints, obs_t, z1, flat2, fc, gates, hs, cs, u, eps, actions, values, pg_w):
        return 0

    def through_step_row():
        net.begin_rollout(T)
        for t in range(T):
            act.step_row(t, rows[t], u[t], frame, state if t == 0 else None)

    def prepared():
        net.begin_rollout(T)
        static = (*net._step_packed, *net._rec_static)
        h, c = net._state_arrays(state)
        fr = frame.reshape(-1)
        zh = act._zero_h
        for t in range(T):
            first = t == 0
            noop(t, fr, act._fn, act._ctx, rows[t], h if first else zh, c if first else zh,
                 not first, act.probs, *static, u[t], act.eps, actions, values, act.pg_weights)

    saved = K.doom_act_packed
    K.doom_act_packed = noop
    try:
        n = max(calls // T, 1)
        rows_out = []
        for name, fn in (("20 steps via Actor.step_row, per step", through_step_row),
                         ("20 prepared kernel calls, per step", prepared)):
            med, lo, hi = _per_call(lambda: [fn() for _ in range(n)], 1, repeats)
            rows_out.append((name, (med / (n * T), lo / (n * T), hi / (n * T))))
        return rows_out
    finally:
        K.doom_act_packed = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    if a.calls < 1 or a.repeats < 1:
        ap.error("--calls and --repeats must be >= 1")
    print(f"{'call':45s} {'median us':>10s} {'min':>7s} {'max':>7s}")
    for name, (med, lo, hi) in dispatch_rows(a.calls, a.repeats) + actor_rows(a.calls, a.repeats):
        print(f"{name:45s} {med:10.3f} {lo:7.3f} {hi:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
