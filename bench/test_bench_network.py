"""Network engine benchmarks on the standard workload (doom-lstm, float32,
84x84, 3 actions, one BLAS thread).

    pytest bench/test_bench_network.py --benchmark-only

Groups: ``kernels`` (each fast kernel beside its numpy twin), ``step``
(batch-1 inference), ``loss_and_grad`` (20-step rollout, forward + BPTT),
``threads`` (two forks of one network in two threads; the speed-up over one thread is in
``extra_info['ratio_2_threads']``, no timed assertion), ``startup`` (a fresh
process importing a3c_core and running the first step with a warm Numba cache;
``extra_info['first_step_s']``).
"""
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from a3c_core._blas import limit_blas_threads
from a3c_core.nn import build_network
from a3c_core.nn import kernels as K
from a3c_core.nn import ref
from a3c_core.nn.gradcheck import random_rollout

limit_blas_threads(1)
T_MAX = 20


@pytest.fixture(scope="module")
def net():
    return build_network("doom-lstm", (1, 84, 84), 3, dtype=np.float32, seed=0)


@pytest.fixture(scope="module")
def rollout(net):
    return random_rollout(net, T_MAX, np.random.default_rng(0))


# ---------------------------------------------------------------- kernels

def _conv_args(net):
    p = net.state_dict()
    x = np.random.default_rng(1).random((1, 84, 84)).astype(np.float32)
    return x, p["conv1.weight"], p["conv1.bias"]


@pytest.mark.benchmark(group="kernels")
def test_conv1_single_rows_numba(benchmark, net):
    """conv1 by the generic batch-1 conv (row im2col + blocked dots)."""
    x, w, b = _conv_args(net)
    benchmark(K.conv_act_rows, x, w, b, 4, 0, 0, np.empty((400, 64), np.float32),
              np.empty((16, 20, 20), np.float32))


@pytest.mark.benchmark(group="kernels")
def test_conv1_single_s2d_numba(benchmark, net):
    """conv1 as used by ``doom_step``: space-to-depth axpys, no im2col."""
    x, w, b = _conv_args(net)
    xs_shape, acc_shape, offs_shape, wtab_shape = K.conv_s2d_shapes((1, 84, 84), 16, 8, 4)
    y = np.empty((16, 20, 20), np.float32)
    benchmark(K.conv_act_s2d, x, w, b, 4, 0, np.empty(xs_shape, np.float32),
              np.empty(acc_shape, np.float32), np.empty(offs_shape, np.int64),
              np.empty(wtab_shape, np.float32), y)


@pytest.mark.benchmark(group="kernels")
def test_conv2_single_rows_numba(benchmark, net):
    """conv2 as used by ``doom_step``: row im2col + 4x2 blocked dots."""
    p = net.state_dict()
    x = np.random.default_rng(1).random((16, 20, 20)).astype(np.float32)
    benchmark(K.conv_act_rows, x, p["conv2.weight"], p["conv2.bias"], 2, 0, 0,
              np.empty((81, 256), np.float32), np.empty((32, 9, 9), np.float32))


@pytest.mark.benchmark(group="kernels")
def test_conv1_single_numpy(benchmark, net):
    x, w, b = _conv_args(net)
    benchmark(lambda: ref.elu_forward(ref.conv2d_forward(x[None], w, b, 4)[0]))


@pytest.mark.benchmark(group="kernels")
def test_lstm_cell_numba(benchmark, net):
    p = net.state_dict()
    x = np.random.default_rng(2).random(256).astype(np.float32)
    h, c = net.initial_state()
    out = (np.empty(1024, np.float32), np.empty(256, np.float32), np.empty(256, np.float32))
    benchmark(K.lstm_cell_vec, x, h, c, p["lstm.weight_ih"], p["lstm.weight_hh"],
              p["lstm.bias_ih"], p["lstm.bias_hh"], *out)


@pytest.mark.benchmark(group="kernels")
def test_lstm_cell_numpy(benchmark, net):
    p = net.state_dict()
    x = np.random.default_rng(2).random(256).astype(np.float32)
    h, c = net.initial_state()
    benchmark(ref.lstm_step_forward, x, h, c, p["lstm.weight_ih"], p["lstm.weight_hh"],
              p["lstm.bias_ih"], p["lstm.bias_hh"])


@pytest.mark.benchmark(group="kernels")
def test_lstm_seq_fwd_bwd_numba(benchmark, net):
    p = net.state_dict()
    rng = np.random.default_rng(3)
    gx = rng.standard_normal((T_MAX, 1024)).astype(np.float32)
    hs = np.zeros((T_MAX + 1, 256), np.float32)
    cs = np.zeros((T_MAX + 1, 256), np.float32)
    gates = np.empty((T_MAX, 1024), np.float32)
    da = np.empty_like(gates)
    dhs = rng.standard_normal((T_MAX, 256)).astype(np.float32)
    z = np.zeros(256, np.float32)
    dh0, dc0 = np.empty(256, np.float32), np.empty(256, np.float32)

    def run():
        K.lstm_seq_forward(gx, p["lstm.weight_hh"], p["lstm.bias_ih"], p["lstm.bias_hh"],
                           hs, cs, gates)
        K.lstm_seq_backward(dhs, z, z, p["lstm.weight_hh"], hs, cs, gates, da, dh0, dc0)
    benchmark(run)


@pytest.mark.benchmark(group="kernels")
def test_lstm_seq_fwd_bwd_numpy(benchmark, net):
    p = net.state_dict()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T_MAX, 256)).astype(np.float32)
    dhs = rng.standard_normal((T_MAX, 256)).astype(np.float32)
    h, c = net.initial_state()

    def run():
        _, _, cache = ref.lstm_forward(x, h, c, p["lstm.weight_ih"], p["lstm.weight_hh"],
                                       p["lstm.bias_ih"], p["lstm.bias_hh"])
        ref.lstm_backward(dhs, cache)
    benchmark(run)


@pytest.mark.benchmark(group="kernels")
def test_im2col_conv2_numba(benchmark):
    x = np.random.default_rng(4).random((T_MAX, 20, 20, 16)).astype(np.float32)
    cols = np.empty((T_MAX * 81, 256), np.float32)
    benchmark(K.im2col_nhwc, x, 4, 4, 2, 0, cols)


@pytest.mark.benchmark(group="kernels")
def test_im2col_conv1_numba(benchmark):
    """conv1's im2col in the update (84x84 frames, 8x8 stride 4, one channel)."""
    x = np.random.default_rng(4).random((T_MAX, 84, 84, 1)).astype(np.float32)
    cols = np.empty((T_MAX * 400, 64), np.float32)
    benchmark(K.im2col_nhwc, x, 8, 8, 4, 0, cols)


@pytest.mark.benchmark(group="kernels")
def test_col2im_conv2_numba(benchmark):
    """conv2's input gradient scatter in the update."""
    dcols = np.random.default_rng(4).random((T_MAX * 81, 256)).astype(np.float32)
    dx = np.empty((T_MAX, 20, 20, 16), np.float32)
    benchmark(K.col2im_nhwc, dcols, 4, 4, 2, 0, dx)


@pytest.mark.benchmark(group="kernels")
def test_im2col_conv2_numpy(benchmark):
    x = np.random.default_rng(4).random((T_MAX, 16, 20, 20)).astype(np.float32)
    benchmark(ref.im2col, x, 4, 4, 2)


# ---------------------------------------------------------------- network

@pytest.mark.benchmark(group="step")
def test_step(benchmark, net, rollout):
    obs = rollout[0][0]
    state = net.initial_state()
    for _ in range(20):
        net.step(obs, state)
    benchmark.pedantic(net.step, args=(obs, state), rounds=2000, iterations=1,
                       warmup_rounds=50)


@pytest.mark.benchmark(group="loss_and_grad")
def test_loss_and_grad(benchmark, net, rollout):
    for _ in range(3):
        net.loss_and_grad(*rollout)
    benchmark.pedantic(net.loss_and_grad, args=rollout, rounds=60, iterations=1,
                       warmup_rounds=3)


def _record(net, rollout):
    obs, state = rollout[0], rollout[4]
    net.begin_rollout(obs.shape[0])
    for t in range(obs.shape[0]):
        _, _, state = net.step(obs[t], state, record=True)


@pytest.mark.benchmark(group="loss_and_grad")
def test_rollout_grad(benchmark, net, rollout):
    """The backward-only update over T recorded steps (compare loss_and_grad)."""
    _record(net, rollout)
    args = rollout[1:4]
    for _ in range(3):
        net.rollout_grad(*args)
    benchmark.pedantic(net.rollout_grad, args=args, rounds=60, iterations=1, warmup_rounds=3)


@pytest.mark.benchmark(group="step")
def test_step_record(benchmark, net, rollout):
    """A recorded step (step + its rollout row); restarts the recording when full."""
    obs = rollout[0][0]
    state = net.initial_state()

    def rec():
        if net.recorded_steps == T_MAX:
            net.begin_rollout(T_MAX)
        net.step(obs, state, record=True)

    net.begin_rollout(T_MAX)
    for _ in range(20):
        rec()
    benchmark.pedantic(rec, rounds=2000, iterations=1, warmup_rounds=50)


@pytest.fixture(scope="module")
def atari():
    """atari-lstm, (1, 42, 42), 6 actions: the generic per-layer step path."""
    n = build_network("atari-lstm", (1, 42, 42), 6, dtype=np.float32, seed=0)
    return n, random_rollout(n, T_MAX, np.random.default_rng(0))


@pytest.mark.benchmark(group="step")
def test_step_atari(benchmark, atari):
    net, ro = atari
    obs, state = ro[0][0], net.initial_state()
    for _ in range(20):
        net.step(obs, state)
    benchmark.pedantic(net.step, args=(obs, state), rounds=2000, iterations=1,
                       warmup_rounds=50)


@pytest.mark.benchmark(group="loss_and_grad")
def test_loss_and_grad_atari(benchmark, atari):
    net, ro = atari
    for _ in range(3):
        net.loss_and_grad(*ro)
    benchmark.pedantic(net.loss_and_grad, args=ro, rounds=60, iterations=1, warmup_rounds=3)


def _work(nets_rollouts, n_iter):
    net, ro = nets_rollouts
    obs = ro[0]
    s = net.initial_state()
    for i in range(n_iter):
        for t in range(T_MAX):
            _, _, s = net.step(obs[t], s)
        net.loss_and_grad(*ro)


@pytest.mark.benchmark(group="threads")
def test_two_threads_ratio(benchmark):
    """One A3C-like unit = 20 steps + one 20-step loss_and_grad; ratio =
    (2 * units per thread / two-thread time) / (units / one-thread time)."""
    base = build_network("doom-lstm", (1, 84, 84), 3, seed=0)
    pairs = []
    for seed in range(2):
        n = base.fork()                 # one Network object per thread, shared params
        pairs.append((n, random_rollout(n, T_MAX, np.random.default_rng(seed))))
    n_iter = 40
    _work(pairs[0], 2)
    _work(pairs[1], 2)

    def one():
        t0 = time.perf_counter()
        _work(pairs[0], n_iter)
        return time.perf_counter() - t0

    def two():
        threads = [threading.Thread(target=_work, args=(p, n_iter)) for p in pairs]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t0

    ratios, t1s, t2s = [], [], []

    def measure():
        t1 = one()
        t2 = two()
        t1s.append(t1)
        t2s.append(t2)
        ratios.append(2 * t1 / t2)
    benchmark.pedantic(measure, rounds=3, iterations=1)
    benchmark.extra_info["ratio_2_threads"] = float(np.median(ratios))
    benchmark.extra_info["ratios"] = [round(r, 3) for r in ratios]
    benchmark.extra_info["one_thread_unit_ms"] = 1e3 * float(np.median(t1s)) / n_iter
    benchmark.extra_info["two_thread_unit_ms"] = 1e3 * float(np.median(t2s)) / n_iter
    print(f"\n2-thread ratio: median {np.median(ratios):.3f} all {ratios}")


_STARTUP = r"""
import time, sys
t0 = time.perf_counter()
import numpy as np
import a3c_core
net = a3c_core.build_network("doom-lstm", (1, 84, 84), 3)
obs = np.zeros((1, 84, 84), np.float32)
net.step(obs, net.initial_state())
print(time.perf_counter() - t0)
"""


@pytest.mark.benchmark(group="startup")
def test_fresh_process_first_step(benchmark):
    """Fresh interpreter: import a3c_core, build doom-lstm, first step (warm
    Numba cache; the first run of this test warms it)."""
    subprocess.run([sys.executable, "-c", _STARTUP], check=True, capture_output=True)
    inner = []

    def run():
        out = subprocess.run([sys.executable, "-c", _STARTUP], check=True,
                             capture_output=True, text=True).stdout
        inner.append(float(out.split()[-1]))
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["first_step_s"] = float(np.median(inner))
    print(f"\nfresh process import+build+first step: {inner}")
