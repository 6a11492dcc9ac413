"""Process helpers for tests that use real processes and real signals (Linux /proc)."""
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children_of(pid):
    """All live descendants of ``pid`` (read from /proc)."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parent[int(d)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier} - out
        out |= nxt
        frontier = nxt
    return out


def alive(pids):
    """The pids of ``pids`` that still exist and are not zombies."""
    left = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    left.add(p)
        except OSError:
            pass
    return left


def wait_gone(pids, timeout=10.0):
    """Wait until none of ``pids`` is alive; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    return left


def start_cli(args, cwd, **kw):
    """Start ``python -m a3c_core ARGS`` in its own process group; stdout+stderr piped."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "a3c_core", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)


def wait_for_file(path, proc, timeout=120.0):
    """Wait until ``path`` exists (or fail if ``proc`` ends first)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before {path} appeared:\n"
                                 + proc.stdout.read())
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)


def finish(proc, timeout=60):
    """Wait for ``proc`` and return its output (killed if it outlives ``timeout``)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out
