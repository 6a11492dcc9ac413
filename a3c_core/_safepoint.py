"""Safe points for a Ctrl-C that arrives while Numba kernels compile.

A ``KeyboardInterrupt`` raised by a signal handler lands at whatever Python
line runs next, and during a first run that is Numba's compiler, which is
not written to be interrupted anywhere:

* inside a ctypes callback (llvmlite's object-cache hook, threadpoolctl's
  library scan) the exception is printed as "Exception ignored" and lost, so
  the Ctrl-C does nothing and training starts anyway;
* the compile it cut short leaves a library without its object code, and the
  next cache write fails with ``RuntimeError: no compiled object yet``, a
  traceback instead of a clean exit.

So the trainer only *records* a signal while it compiles (see
``_signals_as_exceptions.deferred`` in :mod:`a3c_core.train.trainer`) and
raises it at a safe point: :func:`safe_point`, called between the phases of
the warm-up and while it waits for the compile helper, and the start of every
Numba compile in the main thread (before anything of it is built).  The
latency is the compile in progress: up to a few seconds.

:func:`held_sigint` does the same for the CLI's imports of C extensions
(numpy, numba), where a raised KeyboardInterrupt becomes an ImportError.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

_check = None


def safe_point():
    """Raise a deferred signal now, if one is pending (main thread only; a
    no-op outside :func:`safe_points`)."""
    check = _check
    if check is not None and threading.current_thread() is threading.main_thread():
        check()


def _compile_listener():
    # lazy: the CLI imports this module before numba, and held_sigint below
    # guards numba's own import; only the trainer's and compile's blocks use it
    from numba.core import event

    class _CompileStart(event.Listener):
        def on_start(self, ev):
            safe_point()

        def on_end(self, ev):
            pass

    return event, _CompileStart()


@contextlib.contextmanager
def safe_points(check):
    """Inside the block, :func:`safe_point` and the start of each Numba
    compile in the main thread call ``check`` (which raises a pending signal)."""
    global _check
    event, listener = _compile_listener()
    prev, _check = _check, check
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
        _check = prev


class deferred_sigint:
    """For a command that compiles (``a3c compile``, ``a3c eval``'s first
    step): inside the block a SIGINT is recorded, and raised as
    KeyboardInterrupt at the block's safe points or at its end.  Main thread
    only; elsewhere a no-op.  (The trainer has its own, which also handles
    SIGTERM and stays installed for the whole run.)"""

    def __init__(self, note="\nSIGINT: stopping once the kernel being compiled is done..."):
        self.note = note
        self._fired = False
        self._old = None
        self._points = None

    def check(self):
        if self._fired:
            self._fired = False
            raise KeyboardInterrupt

    def _handler(self, signum, frame):
        if not self._fired:
            self._fired = True
            if self.note:
                print(self.note, file=sys.stderr, flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
            self._points = safe_points(self.check)
            self._points.__enter__()
        return self

    def __exit__(self, *exc):
        if self._old is None:
            return False
        self._points.__exit__(*exc)
        signal.signal(signal.SIGINT, self._old)
        self._old = None
        if exc[0] is None:
            self.check()
        return False


@contextlib.contextmanager
def held_sigint():
    """Record a SIGINT inside the block instead of raising it, and raise it as
    KeyboardInterrupt when the block ends (main thread only; elsewhere a no-op).

    For imports of C extensions: a KeyboardInterrupt raised while one
    initialises comes out as an ImportError with a traceback (numpy's core:
    'PyCapsule_Import could not import module "datetime"'), not as the
    Ctrl-C the command exits 130 for.  The handler that was installed
    (Python's own, or SIG_IGN under ``nohup``) is put back.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: fired.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if fired and old is not signal.SIG_IGN:
        raise KeyboardInterrupt
