"""Signals during a run: SIGINT and SIGTERM stop it cleanly, once.

:class:`SignalsAsExceptions` turns the first SIGINT into KeyboardInterrupt
and the first SIGTERM into :class:`StopSignal` in the main thread, at a point
known to be safe (:mod:`a3c_core._safepoint`); later signals are noted and
ignored, so a second Ctrl-C cannot tear the final checkpoint.  With
``keep_ignoring`` (the CLI, whose process ends after the run) they stay
ignored after the run too, to the process's exit: a second Ctrl-C during the
interpreter's shutdown would otherwise end it by the signal (rc -2) instead
of with 130.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from a3c_core._safepoint import safe_points

#: exit status of a run stopped by a signal: 128 + signal number (shell convention)
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


class StopSignal(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM (SIGINT raises KeyboardInterrupt)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class SignalsAsExceptions:
    """While a run is in progress (main thread only): SIGINT raises
    KeyboardInterrupt and SIGTERM :class:`StopSignal`, once; both stop the
    workers and write the final checkpoint.  Later signals are ignored with a
    note, so a second Ctrl-C cannot tear the final checkpoint.  The previous
    handlers are restored afterwards (with ``keep_ignoring``, once a signal
    came: SIG_IGN, to the process's exit).

    It starts *deferred* (``defer=True``): a signal is recorded and raised
    later by :meth:`check`, at a point known to be safe (see
    :mod:`a3c_core._safepoint`); :meth:`resume` ends that first deferral and
    :meth:`deferred` opens another, around the kernel warm-up.  Outside a
    deferral the handler raises at once; a raise that Python could not
    propagate (it landed in a weakref or ctypes callback, which drop it) is
    not printed and is raised again by the next :meth:`check`, which the
    monitor calls every tick."""

    def __init__(self, defer=False, keep_ignoring=False):
        self._defer = 1 if defer else 0
        self._keep_ignoring = keep_ignoring
        self._fired = None          # the first signal, once one came
        self._delivered = False     # raised where the run caught it
        self._installed = False

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is not threading.main_thread():
            return self

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self._fired is not None:
                print(f"\n{name}: already stopping, "
                      "writing the final checkpoint...", file=sys.stderr, flush=True)
                return
            self._fired = signum
            if self._defer:
                print(f"\n{name}: stopping once the kernel being compiled is done...",
                      file=sys.stderr, flush=True)
                return
            raise self._exception()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, handler)
        # a raise that landed in a callback Python cannot propagate from (a
        # weakref's, a ctypes callback, a __del__) is "unraisable": Python
        # prints it with its traceback and goes on.  That one is ours and
        # check() raises it again, so it is not printed; others still are
        self._old_hook = old_hook = sys.unraisablehook

        def unraisable(u):
            if not (self._fired is not None and isinstance(u.exc_value, KeyboardInterrupt)):
                old_hook(u)

        sys.unraisablehook = unraisable
        self._installed = True
        return self

    def __exit__(self, *exc):
        # after a stop signal, a process that exits next keeps ignoring them:
        # Python's shutdown puts SIG_DFL back for a Python-level handler
        # (default_int_handler included), so a second Ctrl-C then ends the
        # process by the signal; SIG_IGN is left as it is
        ignore = self._keep_ignoring and self._fired is not None
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_IGN if ignore else old)
        if self._installed:
            sys.unraisablehook = self._old_hook
        self._installed = False
        return False

    def _exception(self):
        if self._fired == signal.SIGINT:
            return KeyboardInterrupt()
        return StopSignal(signal.Signals(self._fired).name)

    def check(self):
        """Raise the signal that came, unless the run has caught it already."""
        if self._fired is not None and not self._delivered:
            self._delivered = True
            raise self._exception()

    def caught(self):
        """The run caught the signal's exception (raised here or by the handler)."""
        self._delivered = True

    def resume(self):
        """End the deferral the object started with; raise what came meanwhile."""
        self._defer = max(0, self._defer - 1)
        self.check()

    @contextlib.contextmanager
    def deferred(self):
        """Record signals inside the block; raise them at its safe points
        (:func:`a3c_core._safepoint.safe_point`, the start of each Numba
        compile) or at its end."""
        if not self._installed:
            yield
            return
        self._defer += 1
        try:
            with safe_points(self.check):
                yield
        finally:
            self._defer -= 1
        self.check()
