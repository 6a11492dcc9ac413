"""Subnormal floats flushed to zero in the threads that train (``a3c_core._fpenv``)."""
import threading

import numpy as np
import pytest

from a3c_core import _fpenv

pytestmark = pytest.mark.skipif(not _fpenv.SUPPORTED,
                                reason="no flush-to-zero control on this CPU")

TINY = np.finfo(np.float32).tiny          # the smallest normal float32, ~1.18e-38
#: a subnormal float32 made from its bits (2**-130 = TINY / 16), so no arithmetic makes it
SUB = np.array([0x00080000], np.uint32).view(np.float32)


def _products():
    """A product whose exact result is subnormal, and a subnormal input times 1e10."""
    return (float(np.float32(TINY) * np.float32(0.5)),
            float((SUB * np.float32(1e10))[0]))


def test_flush_denormals_flushes_results_and_inputs_then_restores():
    before = _fpenv.get_mode()
    assert not _fpenv.flushing()
    exact, scaled = _products()
    assert 0 < exact < TINY                     # IEEE gradual underflow without it
    assert 0 < SUB[0] < TINY
    assert scaled == pytest.approx(2.0 ** -130 * 1e10, rel=1e-6)
    with _fpenv.flush_denormals():
        assert _fpenv.flushing()
        assert _fpenv.get_mode() & _fpenv.FLUSH_BITS == _fpenv.FLUSH_BITS
        flushed, scaled_ftz = _products()
        assert flushed == 0.0                   # the subnormal result is flushed
        assert scaled_ftz == 0.0                # the subnormal input reads as zero
        # normal arithmetic is untouched
        assert np.float32(3.0) * np.float32(0.5) == np.float32(1.5)
    # only the flush bits were set and cleared (the sticky status flags aside)
    assert (_fpenv.get_mode() & ~0x3F) == (before & ~0x3F)
    assert not _fpenv.flushing()
    assert 0 < _products()[0] < TINY


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with _fpenv.flush_denormals():
            raise RuntimeError("boom")
    assert not _fpenv.flushing()


def test_the_mode_is_per_thread():
    seen = {}
    inside = threading.Event()
    done = threading.Event()

    def other():
        inside.wait(5)
        seen["other"] = _fpenv.flushing()
        done.set()

    th = threading.Thread(target=other)
    th.start()
    with _fpenv.flush_denormals():
        inside.set()
        done.wait(5)
        seen["self"] = _fpenv.flushing()
    th.join(5)
    assert seen == {"self": True, "other": False}


def test_a_worker_trains_with_subnormals_flushed_and_restores_its_thread():
    """Worker.run's rollouts run flushed; the caller's thread is as it was after."""
    from test_worker import ScriptedEnv, _worker

    env = ScriptedEnv([0.0] * 5)
    w, _, store = _worker(env, t_max=3)
    modes = []
    rollout = w.rollout

    def spy():
        modes.append(_fpenv.flushing())
        rollout()

    w.rollout = spy
    w.run(threading.Event(), total_steps=9)
    assert modes and all(modes)
    assert store.steps >= 9
    assert not _fpenv.flushing()
