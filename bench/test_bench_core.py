"""Hogwild-core kernels beside their numpy twins (pytest-benchmark).

    pytest bench/test_bench_core.py --benchmark-only \
        --benchmark-columns=median,iqr,min,rounds --benchmark-sort=name

Groups: optimizer (1.2M float32 params, the doom-lstm size), clip, returns
(t_max = 20), preprocess (one 120x160 gray ViZDoom frame -> 84x84).  The
two-thread optimizer benchmarks time one round = each of 2 threads applies
K updates to the SAME shared arrays at once; the reported per-update time
(wall / K) and its ratio to one thread go to extra_info.
"""
import threading
import time

import numpy as np
import pytest

from a3c_core.core import Adam, Preprocessor, RMSProp, clip_grad_norm, discounted_returns, gae
from a3c_core.core.ref import (ref_adam, ref_amsgrad, ref_clip, ref_gae, ref_preprocess,
                               ref_returns, ref_rmsprop)

N = 1_200_000
K = 20          # updates per thread per round in the threaded benchmarks


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal(N).astype(np.float32)
    g = (rng.standard_normal(N) * 1e-2).astype(np.float32)
    return p, g


def _make(name):
    return RMSProp(N) if name == "rmsprop" else Adam(N, amsgrad=name == "amsgrad")


def _per_update(opt, p, grads, threads, stagger=True):
    """(median, min) seconds per update while ``threads`` threads apply K updates each.

    ``stagger``: thread i starts its sweep at i * N / threads, as the trainer's
    workers do; False: all start at element 0 (worst-case line contention).
    """
    def work(g, off):
        for _ in range(K):
            opt.apply(p, g, offset=off)
    times = []
    for _ in range(7):
        ts = [threading.Thread(target=work, args=(g, i * N // threads if stagger else 0))
              for i, g in enumerate(grads[:threads])]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        times.append((time.perf_counter() - t0) / K)
    return float(np.median(times)), float(np.min(times))


@pytest.mark.benchmark(group="optimizer")
@pytest.mark.parametrize("name", ["rmsprop", "adam", "amsgrad"])
def test_apply_kernel(benchmark, name):
    p, g = _arrays()
    opt = _make(name)
    benchmark.extra_info["n_params"] = N
    benchmark.pedantic(opt.apply, args=(p, g), rounds=200, warmup_rounds=5)
    assert np.all(np.isfinite(p))


@pytest.mark.benchmark(group="optimizer")
@pytest.mark.parametrize("name", ["rmsprop", "adam"])
def test_apply_kernel_two_threads(benchmark, name):
    """One round = 2 threads x K applies on shared arrays; extra_info has the ratio."""
    p, g = _arrays()
    g2 = _arrays(1)[1]
    opt = _make(name)
    _per_update(opt, p, [g, g2], 1)                       # warm up
    one = _per_update(opt, p, [g, g2], 1)
    two = _per_update(opt, p, [g, g2], 2)
    common = _per_update(opt, p, [g, g2], 2, stagger=False)

    def round_two():
        # staggered starts, as the trainer does (worker i of 2 starts at i * n / 2)
        ts = [threading.Thread(target=lambda gg=gg, off=off: [opt.apply(p, gg, offset=off)
                                                              for _ in range(K)])
              for gg, off in ((g, 0), (g2, N // 2))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    benchmark.pedantic(round_two, rounds=15, warmup_rounds=1)
    benchmark.extra_info.update(updates_per_thread_per_round=K,
                                us_per_update_1_thread_median=round(one[0] * 1e6, 1),
                                us_per_update_2_threads_median=round(two[0] * 1e6, 1),
                                ratio_2_over_1_median=round(two[0] / one[0], 3),
                                us_per_update_1_thread_min=round(one[1] * 1e6, 1),
                                us_per_update_2_threads_min=round(two[1] * 1e6, 1),
                                ratio_2_over_1_min=round(two[1] / one[1], 3),
                                ratio_2_over_1_common_start_median=round(common[0] / one[0], 3))
    assert np.all(np.isfinite(p))


@pytest.mark.benchmark(group="optimizer")
@pytest.mark.parametrize("name", ["rmsprop", "adam", "amsgrad"])
def test_apply_numpy_twin(benchmark, name):
    p, g = _arrays()
    z = np.zeros(N, np.float32)
    if name == "rmsprop":
        benchmark.pedantic(ref_rmsprop, args=(p, g, z, 7e-4, 0.99, 0.1), rounds=30,
                           warmup_rounds=2)
    elif name == "amsgrad":
        benchmark.pedantic(ref_amsgrad, args=(p, g, z, z, z, 1e-4, 0.9, 0.999, 1e-8, 5),
                           rounds=30, warmup_rounds=2)
    else:
        benchmark.pedantic(ref_adam, args=(p, g, z, z, 1e-4, 0.9, 0.999, 1e-8, 5), rounds=30,
                           warmup_rounds=2)


@pytest.mark.benchmark(group="clip")
def test_clip_kernel(benchmark):
    _, g = _arrays()
    benchmark.pedantic(clip_grad_norm, args=(g, 40.0), rounds=200, warmup_rounds=5)


@pytest.mark.benchmark(group="clip")
def test_clip_numpy_twin(benchmark):
    _, g = _arrays()
    benchmark.pedantic(ref_clip, args=(g, 40.0), rounds=30, warmup_rounds=2)


def _rollout(T=20):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(T).astype(np.float32), rng.standard_normal(T).astype(np.float32))


@pytest.mark.benchmark(group="returns")
def test_returns_gae_kernel(benchmark):
    r, v = _rollout()
    o1, o2, o3 = (np.empty(20, np.float32) for _ in range(3))

    def both():
        discounted_returns(r, 0.5, 0.99, o1)
        gae(r, v, 0.5, 0.99, 1.0, o2, o3)
    benchmark(both)


@pytest.mark.benchmark(group="returns")
def test_returns_gae_numpy_twin(benchmark):
    r, v = _rollout()

    def both():
        ref_returns(r, 0.5, 0.99)
        ref_gae(r, v, 0.5, 0.99, 1.0)
    benchmark(both)


def _frame():
    return np.random.default_rng(0).integers(0, 256, (120, 160), dtype=np.uint8)


@pytest.mark.benchmark(group="preprocess")
def test_preprocess_kernel(benchmark):
    frame, out = _frame(), np.empty((84, 84), np.float32)
    pre = Preprocessor((120, 160), (84, 84))
    benchmark(pre, frame, out)


@pytest.mark.benchmark(group="preprocess")
def test_preprocess_numpy_twin(benchmark):
    frame = _frame()
    ref_preprocess(frame, (84, 84))                        # build cached matrices
    benchmark(ref_preprocess, frame, (84, 84))
