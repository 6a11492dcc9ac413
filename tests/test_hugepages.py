"""a3c_core._hugepages: huge-page-ready flat buffers are plain zeroed arrays."""
import numpy as np
import pytest

from a3c_core import _hugepages as hp
from a3c_core.core import SharedState, make_optimizer
from a3c_core.nn.network import build_network


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_buffers_are_zeroed_aligned_and_independent(dtype):
    n = 1_200_437                                      # not a multiple of anything
    a, b = hp.zeros(n, dtype), hp.zeros(n, dtype)
    for x in (a, b):
        assert x.shape == (n,) and x.dtype == np.dtype(dtype) and x.flags.c_contiguous
        assert x.flags.writeable and not x.any()
    if hp.enabled():      # inside a 2 MiB-aligned block, at different 4 KiB + 64 B steps
        offs = [x.ctypes.data % hp.HUGE_PAGE for x in (a, b)]
        assert all(o % hp._SKEW_STEP == 0 and o < hp._SKEWS * hp._SKEW_STEP for o in offs)
        assert offs[0] != offs[1]
    a[-1] = 3.0
    a[0] = 1.0
    assert b[-1] == 0 and b[0] == 0 and a.sum() == 4.0


def test_small_buffers_and_the_switch_give_plain_arrays(monkeypatch):
    small = hp.zeros(100)
    assert small.flags.owndata and not small.any()
    monkeypatch.setenv("A3C_HUGEPAGES", "0")
    assert not hp.enabled()
    big = hp.zeros(1_000_000)
    assert big.flags.owndata and big.shape == (1_000_000,) and not big.any()


def test_network_shared_state_and_optimizer_use_them():
    net = build_network("doom-lstm")
    shared = SharedState(net.params, make_optimizer("adam", net.n_params))
    np.testing.assert_array_equal(shared.params, net.params)
    assert shared.params.dtype == np.float32 and shared.params is not net.params
    if hp.enabled():
        offs = [arr.ctypes.data % hp.HUGE_PAGE for arr in
                (net.params, net.grads, shared.params, shared.optimizer.exp_avg,
                 shared.optimizer.exp_avg_sq)]
        assert all(o % hp._SKEW_STEP == 0 for o in offs) and len(set(offs)) == 5


def test_bench_machine_info_records_the_setting(monkeypatch):
    from a3c_core.bench.machine import machine_info

    info = machine_info()["hugepages"]
    assert info["requested"] == hp.enabled()
    assert info["thp"] in (None, "always", "madvise", "never")
    monkeypatch.setenv("A3C_HUGEPAGES", "off")
    assert machine_info()["hugepages"]["requested"] is False


def test_a_failing_madvise_falls_back_to_plain_arrays(monkeypatch):
    """A kernel that refuses the advice: a plain zeroed array, and no padded
    blocks afterwards (enabled() turns False)."""
    if hp._madvise is None:
        pytest.skip("no madvise on this platform")
    monkeypatch.setattr(hp, "_madvise", lambda addr, size, advice: -1)
    monkeypatch.setattr(hp, "_madvise_ok", True)
    x = hp.zeros(1_000_000)
    assert x.flags.owndata and x.shape == (1_000_000,) and not x.any()
    assert not hp.enabled()
    assert hp.zeros(1_000_000).flags.owndata
