"""A signal during the warm-up is recorded and raised at a safe point.

Real signals to this process (``os.kill``), real Numba compiles and a real
ctypes callback (libc's ``qsort``): the two places where a KeyboardInterrupt
raised by the handler went wrong before (lost inside a ctypes callback; a
Numba compile cut in the middle).
"""
import ctypes
import os
import signal
import threading

import numba
import pytest

from a3c_core._safepoint import safe_point
from a3c_core.train.signals import SignalsAsExceptions, StopSignal

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signal handlers need the main thread")



@pytest.fixture(autouse=True)
def _default_sigint():
    """Each test starts from Python's own SIGINT handler, as in a terminal,
    even when the runner was started with SIGINT ignored (``nohup``, ``&``)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


_CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def _qsort_with_signal(sig):
    """Sort 4 ints with libc's qsort; the comparator sends ``sig`` to this
    process once. Returns the sorted values (the callback ran to the end)."""
    sent = []

    def cmp(a, b):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), sig)
            sum(range(1000))  # bytecode for the pending handler to run in
        return a[0] - b[0]

    arr = (ctypes.c_int * 4)(4, 2, 3, 1)
    ctypes.CDLL(None).qsort(arr, 4, ctypes.sizeof(ctypes.c_int), _CMP(cmp))
    return list(arr)


def test_signal_in_a_ctypes_callback_is_not_lost_when_deferred(monkeypatch):
    ignored = []
    monkeypatch.setattr("sys.unraisablehook", ignored.append)
    with SignalsAsExceptions() as sigs:
        with sigs.deferred():
            assert _qsort_with_signal(signal.SIGINT) == [1, 2, 3, 4]  # not cut short
            assert ignored == []
            with pytest.raises(KeyboardInterrupt):
                safe_point()
            safe_point()  # raised once only
        # nor again at the deferral's end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_raise_swallowed_by_a_callback_is_raised_again_by_check(monkeypatch):
    """The handler's raise lands in a callback that cannot propagate it (a
    ctypes one here; a weakref's in the field): it is not printed as an
    "Exception ignored" traceback, and check() raises it again.  Other
    unraisable errors still reach the hook; the hook is restored after."""
    ignored = []
    monkeypatch.setattr("sys.unraisablehook", ignored.append)
    with SignalsAsExceptions() as sigs:
        _qsort_with_signal(signal.SIGINT)   # the handler raises inside the callback: lost
        assert ignored == []                # ... quietly
        with pytest.raises(KeyboardInterrupt):
            sigs.check()
        sigs.check()    # delivered: not again

        class Broken:
            def __del__(self):
                raise ValueError("not ours")
        Broken()
        assert [type(u.exc_value) for u in ignored] == [ValueError]
    import sys
    assert sys.unraisablehook == ignored.append


def test_signal_is_raised_at_the_next_compile_start_before_it_compiles():
    @numba.njit(cache=False)
    def first(x):
        return x + 1

    @numba.njit(cache=False)
    def second(x):
        return x * 2

    with SignalsAsExceptions() as sigs:
        with sigs.deferred():
            assert first(1) == 2
            os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(StopSignal) as err:
                second(3)
            assert err.value.name == "SIGTERM"
            assert second.signatures == []        # nothing of it was compiled
            assert second(3) == 6                 # and it compiles cleanly later


def test_a_second_signal_is_only_noted(capfd):
    with SignalsAsExceptions(defer=True) as sigs:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
        err = capfd.readouterr().err
        assert "stopping once the kernel being compiled is done" in err
        assert "already stopping" in err
        with pytest.raises(KeyboardInterrupt):
            sigs.resume()
        sigs.check()


@pytest.mark.parametrize("keep", [False, True])
def test_after_a_stop_signal_an_exiting_process_keeps_ignoring_signals(keep):
    """keep_ignoring (the CLI, Trainer.run(exiting=True)): once a signal stopped
    the run, SIGINT and SIGTERM stay ignored after it, so a second Ctrl-C
    during the interpreter's shutdown (which puts SIG_DFL back for Python
    handlers) cannot end the process by the signal instead of with 130.
    Without a signal, or without keep_ignoring, the old handlers come back."""
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        with SignalsAsExceptions(keep_ignoring=keep):
            pass                                    # a run that no signal stopped
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            with SignalsAsExceptions(keep_ignoring=keep) as sigs:
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(1000))
        assert sigs._fired == signal.SIGINT
        want = signal.SIG_IGN if keep else signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is want
        assert signal.getsignal(signal.SIGTERM) is (signal.SIG_IGN if keep else old_term)
        if keep:
            os.kill(os.getpid(), signal.SIGINT)     # the second Ctrl-C: nothing happens
            sum(range(1000))
    finally:
        signal.signal(signal.SIGTERM, old_term)


def test_outside_a_run_nothing_is_deferred_or_raised():
    sigs = SignalsAsExceptions()        # never entered: a Trainer not running
    with sigs.deferred():
        safe_point()
    sigs.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_held_sigint_raises_once_the_block_ends_and_restores_the_handler():
    """_safepoint.held_sigint (the CLI's C-extension imports): a SIGINT inside the
    block lets the block finish, then comes out as KeyboardInterrupt; the
    handler it found is back; under SIG_IGN the signal stays ignored."""
    from a3c_core._safepoint import held_sigint

    finished = []
    with pytest.raises(KeyboardInterrupt):
        with held_sigint():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # bytecode for the pending handler to run in
            finished.append(1)
    assert finished == [1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with held_sigint():   # nothing came: nothing raised
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with held_sigint():
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
