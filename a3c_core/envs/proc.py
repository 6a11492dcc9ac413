"""Run any :class:`~a3c_core.envs.base.Env` in a child process: :class:`ProcEnv`.

Why: a worker *thread* must wait for its env without holding the GIL. ViZDoom
already does (its engine is a process; ``make_action`` releases the GIL), but
ALE's Python step and most Gymnasium envs run Python code under the GIL, so
two worker threads stepping two such envs serialize (measured: 2 threads at
0.8x one). A :class:`ProcEnv` moves the env into a child process; the worker
thread sends the action over a socket and blocks in ``recv`` (GIL released)
while the child steps; the child writes the observation into shared memory.

Wire protocol (one Unix stream socket, little-endian structs):

* request ``_REQ`` = (command ``u8``, action ``i32``);
* reply ``_REP`` = (status ``u8``, flags ``u8``, obs slot ``u16``, payload
  length ``u32``, reward ``f64``, the env's ``episode_shaping`` ``f64``) then
  ``payload`` bytes (pickles, only for
  hello/render/errors). Flags: 1 terminated, 2 truncated, 4 episode_over;
  bits 3-5 the env's ``episode_end``: 0 for None, else 1 + its index in
  :data:`~a3c_core.envs.base.EPISODE_ENDS`.
* observations: a memfd mapped by both sides holding two obs slots; the child
  alternates slots, so the obs returned by one call stays valid through the
  next call (read-only views, never reallocated).

Lifetime guarantees (tested in ``tests/test_orphans.py``):

* the child is started with ``subprocess`` (fork+exec, safe from a
  multi-threaded parent) in its **own session**, so a terminal Ctrl-C (SIGINT
  to the foreground process group) reaches only the trainer, which then
  closes its envs cleanly;
* the child exits when the parent process dies for any reason (SIGKILL
  included): it holds the read end of a "lifeline" pipe whose only write end
  lives in the parent, plus the command socket; either reaching EOF ends it.
  This is process-level, unlike ``PR_SET_PDEATHSIG``, which fires when the
  *thread* that created the child exits;
* a child that dies makes the parent's next (or current) call raise
  :class:`EnvProcessError` naming the env, the pid and the exit status,
  never a hang (EOF on the socket).
"""
from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import weakref

import numpy as np

from .base import EPISODE_ENDS, Env, sigint_blocked

_REQ = struct.Struct("<Bxxxi")
_REP = struct.Struct("<BBHIdd")
CMD_STEP, CMD_RESET, CMD_RENDER, CMD_CLOSE = 1, 2, 3, 4
ST_OK, ST_ERR = 0, 1
F_TERM, F_TRUNC, F_OVER = 1, 2, 4
_END_SHIFT, _END_MASK = 3, 7
_ENDS = (None,) + EPISODE_ENDS

#: Seconds allowed for the child to import and build its env.
START_TIMEOUT = 120.0
#: Seconds a closing child may take before it is killed.
CLOSE_TIMEOUT = 10.0
#: Seconds the child's lifeline watcher waits for a clean exit before _exit.
LIFELINE_GRACE = 1.0


class EnvProcessError(RuntimeError):
    """The env's child process died or broke the protocol."""


def _recv_exact(sock, view):
    """Fill ``view`` from ``sock``; returns False on EOF before it is full."""
    n, total = 0, len(view)
    while n < total:
        got = sock.recv_into(view[n:], total - n)
        if got == 0:
            return False
        n += got
    return True


def describe_exit(rc):
    """A process's exit code (``Popen.returncode``, ``Process.exitcode``; None:
    still running) in words: ``"killed by SIGKILL"``, ``"exit status 1"``."""
    if rc is None:
        return "still running but not answering"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"killed by {name}"
    return f"exit status {rc}"


def _package_root():
    import a3c_core

    return os.path.dirname(os.path.dirname(os.path.abspath(a3c_core.__file__)))


def _child_env():
    env = dict(os.environ)
    root = _package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


_CHILD_CODE = "from a3c_core.envs.proc import _child_main; _child_main()"


class ProcEnv(Env):
    """An env built by ``make_env(env_id, env_process=False, ...)`` inside a
    child process, presenting the same :class:`Env` interface.

    Args:
        env_id: any id :func:`~a3c_core.envs.make_env` accepts.
        seed, frame_skip, runtime_dir, render, **kwargs: passed to
            ``make_env`` in the child (must be picklable).

    The child rebuilds the env from its id, so a Gymnasium env registered at
    run time in the parent must be named ``'module:Env-v0'`` (the child
    imports ``module`` first). Spawn-style start: ``subprocess`` (fork+exec),
    safe from a multi-threaded parent; the child inherits the CPU affinity of
    the thread that creates it (the trainer's core pinning carries over).

    The observation returned by :meth:`step`/:meth:`reset` is a read-only
    view into shared memory, valid until the call after next (two slots).
    Errors raised by the child env (bad kwargs, unknown id, ...) are re-raised
    here with their original type; a dead child raises :class:`EnvProcessError`.
    """

    def __init__(self, env_id, *, seed=0, frame_skip=None, runtime_dir=None, render=False,
                 **kwargs):
        self._closed = False
        self._proc = None
        self.pid = None
        self.episode_over = True
        self.episode_shaping = 0.0   # the child env's (a shaped Doom env's), sent with each reply
        args = dict(seed=seed, frame_skip=frame_skip, runtime_dir=runtime_dir, render=render,
                    **kwargs)
        payload = pickle.dumps((env_id, args), protocol=pickle.HIGHEST_PROTOCOL)
        sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        life_r, life_w = os.pipe()  # non-inheritable: only this process holds life_w
        try:
            with sigint_blocked():
                proc = subprocess.Popen(
                    [sys.executable, "-c", _CHILD_CODE, str(child_sock.fileno()), str(life_r)],
                    pass_fds=(child_sock.fileno(), life_r), start_new_session=True,
                    stdin=subprocess.DEVNULL, env=_child_env(), close_fds=True,
                )
        except BaseException:
            for fd in (life_r, life_w):
                os.close(fd)
            sock.close()
            child_sock.close()
            raise
        child_sock.close()
        os.close(life_r)
        self._proc, self.pid = proc, proc.pid
        self._sock, self._life_w = sock, life_w
        self._mm = None
        self._finalizer = weakref.finalize(self, _shutdown, proc, sock, life_w, None, 1.0)
        self._pending = False
        self._hdr = bytearray(_REP.size)
        self._hdr_view = memoryview(self._hdr)
        self.env_id = str(env_id)
        try:
            sock.settimeout(START_TIMEOUT)
            sock.sendall(struct.pack("<I", len(payload)) + payload)
            self._hello()
            sock.settimeout(None)
        except BaseException:
            self.close()
            raise

    # -- start-up --------------------------------------------------------------
    def _hello(self):
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._sock, _REP.size, 1, socket.MSG_WAITALL)
        except socket.timeout:
            raise EnvProcessError(
                f"{self.env_id}: the env process (pid {self.pid}) did not start within "
                f"{START_TIMEOUT:.0f} s") from None
        if len(msg) < _REP.size:
            for fd in fds:
                os.close(fd)
            self._raise_dead("start-up")
        self._hdr[:] = msg
        status, _flags, _slot, plen, _r, _sh = _REP.unpack(self._hdr)
        if status != ST_OK:
            self._raise_child_error(plen, "start-up")
        info = pickle.loads(self._recv_payload(plen, "start-up"))
        (fd,) = fds
        try:
            size = os.fstat(fd).st_size
            self._mm = mmap.mmap(fd, size) if size else None
        finally:
            os.close(fd)
        for key, value in info["attrs"].items():
            setattr(self, key, value)
        self._child_spec = info["spec"]
        self._child_type = info["type"]
        dtype, shape = np.dtype(self.obs_dtype), tuple(self.obs_shape)
        n = int(np.prod(shape)) * dtype.itemsize
        views = []
        for slot in range(2):
            if self._mm is None:
                v = np.zeros(shape, dtype)
            else:
                v = np.frombuffer(self._mm, dtype=dtype, count=int(np.prod(shape)),
                                  offset=slot * n).reshape(shape)
            v.flags.writeable = False
            views.append(v)
        self._obs = views
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, self._sock,
                                           self._life_w, self._mm, CLOSE_TIMEOUT)

    # -- the protocol ----------------------------------------------------------
    def reset(self):
        self._call(CMD_RESET, 0, "reset()")
        self.episode_end = None
        return self._obs[self._slot]

    def step(self, action):
        if not 0 <= action < self.n_actions:
            self._raise_bad_action(action)
        flags = self._call(CMD_STEP, int(action), "step()")
        self.episode_end = _ENDS[(flags >> _END_SHIFT) & _END_MASK]
        return self._obs[self._slot], self._reward, bool(flags & F_TERM), bool(flags & F_TRUNC)

    def _call(self, cmd, arg, what):
        sock = self._sock
        if sock is None:
            raise RuntimeError(f"{self.env_id}: the env is closed")
        try:
            if self._pending:
                self._drain()
            sock.sendall(_REQ.pack(cmd, arg))
            self._pending = True  # stays set if a signal (Ctrl-C) interrupts the wait
            ok = _recv_exact(sock, self._hdr_view)  # blocks here without the GIL
        except OSError:
            ok = False
        if not ok:
            self._raise_dead(what)
        self._pending = False
        status, flags, slot, plen, reward, shaping = _REP.unpack(self._hdr)
        if status != ST_OK:
            self._raise_child_error(plen, what)
        self._slot, self._reward, self.episode_shaping = slot, reward, shaping
        self.episode_over = bool(flags & F_OVER)
        if plen:
            self._payload = self._recv_payload(plen, what)
        return flags

    def _drain(self):
        """Read and drop the reply to a call whose wait was interrupted
        (KeyboardInterrupt), so requests and replies stay paired."""
        if not _recv_exact(self._sock, self._hdr_view):
            raise OSError("EOF")
        plen = _REP.unpack(self._hdr)[3]
        if plen and not _recv_exact(self._sock, memoryview(bytearray(plen))):
            raise OSError("EOF")
        self._pending = False

    def _recv_payload(self, n, what):
        buf = bytearray(n)
        try:
            ok = _recv_exact(self._sock, memoryview(buf))
        except OSError:
            ok = False
        if not ok:
            self._raise_dead(what)
        return bytes(buf)

    def _raise_child_error(self, plen, what):
        exc, tb = pickle.loads(self._recv_payload(plen, what))
        if isinstance(exc, BaseException):
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised in the env process, pid {self.pid}, during {what}; "
                             f"its traceback:)\n{tb}")
            raise exc
        raise EnvProcessError(f"{self.env_id}: {what} failed in the env process "
                              f"(pid {self.pid}): {exc}\n{tb}")

    def _raise_dead(self, what):
        proc = self._proc
        rc = None
        try:
            rc = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self._close_handles()
        raise EnvProcessError(
            f"{self.env_id}: the env process (pid {self.pid}) died during {what} "
            f"({describe_exit(rc)}); the env is unusable, create a new one"
        )

    # -- extras ----------------------------------------------------------------
    def render_frame(self):
        """RGB uint8 ``(H, W, 3)`` from the child env's :meth:`render_frame`."""
        self._call(CMD_RENDER, 0, "render_frame()")
        frame, self._payload = pickle.loads(self._payload), None
        return frame

    def spec(self):
        return dict(self._child_spec)

    def close(self):
        """Ask the child to close its env and exit (killed after
        :data:`CLOSE_TIMEOUT` s); idempotent. Call it from the stepping thread
        or once that thread has stopped (the trainer joins its workers first)."""
        if self._closed:
            return
        self._closed = True
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()
        self._sock = None

    def kill_engine(self) -> bool:
        """SIGKILL the env's child process (a call waiting on it then raises
        :class:`EnvProcessError`); True if it was running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        try:
            proc.kill()
        except OSError:
            return False
        return True

    def _close_handles(self):
        """After the child died: release our side only."""
        self._closed = True
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin.detach()
        _shutdown(self._proc, self._sock, self._life_w, None, 0.0)
        self._sock = None

    def __repr__(self):
        return (f"<ProcEnv pid={self.pid} {getattr(self, '_child_type', '?')} {self.env_id} "
                f"actions={getattr(self, 'n_actions', '?')} "
                f"obs={getattr(self, 'obs_kind', '?')}{tuple(getattr(self, 'obs_shape', ()))}>")


def _shutdown(proc, sock, life_w, mm, timeout):
    """Close the child politely (CLOSE), then kill it if it lingers; reap it."""
    if sock is not None:
        try:
            if proc.poll() is None and timeout > 0:
                sock.settimeout(timeout)
                sock.sendall(_REQ.pack(CMD_CLOSE, 0))
                sock.recv(_REP.size)
        except OSError:
            pass
        sock.close()
    try:
        os.close(life_w)  # the child's lifeline: EOF makes it exit in any case
    except OSError:
        pass
    try:
        proc.wait(timeout=max(timeout, 0.5))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # ``mm`` is left to the garbage collector: views may still reference it.


# -- the child side -------------------------------------------------------------
def _watch_lifeline(life_r):
    """Child thread: the parent process is gone when the lifeline hits EOF."""
    try:
        while os.read(life_r, 64):
            pass
    except OSError:
        pass
    import time

    time.sleep(LIFELINE_GRACE)  # the main loop normally exits cleanly first
    os._exit(3)


def _child_main():
    sock_fd, life_r = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # belt and braces: own session already
    threading.Thread(target=_watch_lifeline, args=(life_r,), daemon=True).start()
    (n,) = struct.unpack("<I", _child_recv(sock, 4))
    env_id, kwargs = pickle.loads(_child_recv(sock, n))
    try:
        from . import make_env

        env = make_env(env_id, env_process=False, **kwargs)
    except BaseException as exc:
        _child_send_error(sock, exc)
        return
    try:
        _child_serve(sock, env)
    finally:
        env.close()


def _child_recv(sock, n):
    buf = bytearray(n)
    if not _recv_exact(sock, memoryview(buf)):
        sys.exit(0)  # parent gone
    return buf


def _child_send_error(sock, exc):
    import traceback

    tb = traceback.format_exc()
    try:
        blob = pickle.dumps((exc, tb))
        pickle.loads(blob)
    except Exception:
        blob = pickle.dumps((f"{type(exc).__name__}: {exc}", tb))
    try:
        sock.sendall(_REP.pack(ST_ERR, 0, 0, len(blob), 0.0, 0.0) + blob)
    except OSError:
        sys.exit(0)


def _end_code(end):
    """``episode_end`` as the flag bits carry it (0: None or a word not in
    EPISODE_ENDS, which the parent then reads as None)."""
    try:
        return _ENDS.index(end)
    except ValueError:
        return 0


def _child_serve(sock, env):
    dtype, shape = np.dtype(env.obs_dtype), tuple(env.obs_shape)
    n = int(np.prod(shape)) * dtype.itemsize
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = memfd("a3c-env-obs", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        import tempfile

        fd = os.dup(tempfile.TemporaryFile().fileno())
    os.ftruncate(fd, 2 * n)
    mm = mmap.mmap(fd, 2 * n) if n else None
    slots = [np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape)), offset=s * n).reshape(shape)
             if mm is not None else np.zeros(shape, dtype) for s in range(2)]
    attrs = {k: getattr(env, k) for k in (
        "env_id", "n_actions", "action_names", "obs_shape", "obs_dtype", "obs_kind",
        "frame_skip", "preprocess_spec", "render")}
    attrs["obs_dtype"] = np.dtype(attrs["obs_dtype"])
    for k in ("seed", "cfg_path", "noop_max", "terminal_on_life_loss",
              "repeat_action_probability", "game", "action_set", "view"):
        if hasattr(env, k):
            attrs[k] = getattr(env, k)
    hello = pickle.dumps({"attrs": attrs, "spec": env.spec(), "type": type(env).__name__})
    socket.send_fds(sock, [_REP.pack(ST_OK, 0, 0, len(hello), 0.0, 0.0)], [fd])
    os.close(fd)
    sock.sendall(hello)

    req = bytearray(_REQ.size)
    req_view = memoryview(req)
    pack, unpack = _REP.pack, _REQ.unpack
    slot = 0
    while True:
        try:
            if not _recv_exact(sock, req_view):
                return  # parent closed its end or died
        except OSError:
            return  # parent died with a reply unread (SIGKILL): the connection was reset
        cmd, arg = unpack(req)
        try:
            if cmd == CMD_STEP:
                obs, reward, term, trunc = env.step(arg)
                slot ^= 1
                slots[slot][...] = obs
                flags = (F_TERM if term else 0) | (F_TRUNC if trunc else 0) | (
                    F_OVER if getattr(env, "episode_over", term or trunc) else 0) | (
                    _end_code(getattr(env, "episode_end", None)) << _END_SHIFT)
                sock.sendall(pack(ST_OK, flags, slot, 0, float(reward),
                                  float(getattr(env, "episode_shaping", 0.0))))
            elif cmd == CMD_RESET:
                obs = env.reset()
                slot ^= 1
                slots[slot][...] = obs
                flags = F_OVER if getattr(env, "episode_over", False) else 0
                sock.sendall(pack(ST_OK, flags, slot, 0, 0.0, 0.0))
            elif cmd == CMD_RENDER:
                blob = pickle.dumps(np.ascontiguousarray(env.render_frame()))
                sock.sendall(pack(ST_OK, 0, slot, len(blob), 0.0, 0.0) + blob)
            elif cmd == CMD_CLOSE:
                env.close()
                sock.sendall(pack(ST_OK, 0, slot, 0, 0.0, 0.0))
                return
            else:
                raise EnvProcessError(f"unknown command {cmd}")
        except OSError:
            return  # parent gone mid-reply
        except Exception as exc:
            _child_send_error(sock, exc)
