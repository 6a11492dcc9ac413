"""Engine guard: ``python -I -S _engine_guard.py OWNER_PID ENGINE [ARGS...]``.

Run by the per-env ViZDoom launcher (``doom._write_launcher``) in place of the
engine; standalone (stdlib only, no site-packages). It

1. calls ``setsid()``, so the engine has its own session and process group:
   a terminal's Ctrl-C (SIGINT to the foreground group) reaches only our
   Python process, which then closes its envs itself;
2. forks a watchdog, then ``exec``s the engine in this process (the engine
   keeps this pid, which ViZDoom waits on). The watchdog waits, with no
   polling, on pidfds of the owner (our Python process) and of the engine:
   when the owner is gone (exit, crash, SIGKILL) it SIGKILLs the engine (which
   ignores SIGTERM); when the engine is gone it just exits. A pidfd names one
   process, so a recycled pid is never signalled. Cost: one idle process per
   engine, no CPU. Kernels without ``pidfd_open`` (< 5.3) fall back to a
   0.5 s ``kill(pid, 0)`` poll.
"""
import os
import select
import signal
import sys
import time


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _watch(owner, owner_fd, engine):
    """Watchdog body (child of the engine); never returns."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # do not hold the engine's stdio pipes open
        os.dup2(devnull, fd)
    keep = {fd for fd in (owner_fd,) if fd is not None}
    for fd in range(3, 256):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    engine_fd = _pidfd(engine)
    if os.getppid() != engine:  # engine already gone (or we were reparented)
        os._exit(0)
    if owner_fd is not None and engine_fd is not None:
        ready, _, _ = select.select([owner_fd, engine_fd], [], [])
        if owner_fd in ready and engine_fd not in ready:
            try:
                signal.pidfd_send_signal(engine_fd, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)
    while True:  # fallback: poll
        time.sleep(0.5)
        if os.getppid() != engine:
            os._exit(0)
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            os.kill(engine, signal.SIGKILL)
            os._exit(0)
        except OSError:
            pass


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: _engine_guard.py OWNER_PID ENGINE [ARGS...]\n")
        return 2
    owner, engine_args = int(argv[1]), argv[2:]
    try:
        os.setsid()
    except OSError:  # already a group leader: at least ignore terminal SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    owner_fd = _pidfd(owner)
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return 1  # the owner died before the engine started
    me = os.getpid()
    if os.fork() == 0:
        try:
            _watch(owner, owner_fd, me)
        finally:
            os._exit(0)
    if owner_fd is not None:
        os.close(owner_fd)
    os.execv(engine_args[0], engine_args)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
