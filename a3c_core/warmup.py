"""Kernel warm-up before a run's clock starts, and the compile helper.

:func:`warm_up_network` compiles (first run) or loads (cached) every Numba
kernel a network's training uses, so that no worker pays a compile inside
its first rollouts.  On a first run with a spare core it starts a helper
process (:class:`CompileHelper`) that compiles the learner's kernels into the
shared cache while this process compiles the step; ``a3c compile`` uses the
same helper.  ``A3C_COMPILE_HELPER=0`` turns the helper off.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

from a3c_core._safepoint import safe_point
from a3c_core.core.targets import warm_up as warm_up_targets
from a3c_core.nn.network import network_from_spec
from a3c_core.sampling import sample_categorical, sample_rows

#: seconds the step's warm-up may take before warm_up_network starts its
#: helper process (a cache load takes well under this; a compile far more)
HELPER_DELAY_S = 1.5


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def helper_allowed() -> bool:
    """Whether a compile helper process may be started: at least 2 usable
    CPUs, a Python interpreter to start (not a frozen app), and no
    ``A3C_COMPILE_HELPER=0`` in the environment."""
    if os.environ.get("A3C_COMPILE_HELPER", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if getattr(sys, "frozen", False) or not sys.executable:
        return False
    return _usable_cpus() >= 2


def warm_up_network(net, cross_episode=False, parallel=None, n_envs=1):
    """Run a worker's kernels once on ``net`` (compiling or loading them):
    steps recorded and not (the bootstrap), the sampler, the update's
    targets and the backward-only update; never ``loss_and_grad``'s batched forward, which a
    worker does not call.  ``cross_episode``: also a rollout with a reset.

    ``parallel`` (default: :func:`helper_allowed`): when the step
    has not loaded within :data:`HELPER_DELAY_S` (a first run: it is being
    compiled), a helper process compiles the update's kernels into the
    on-disk cache meanwhile (:func:`_helper_main`), on the other core; this
    process then loads them instead of compiling them after the step (the
    reset variant of ``cross_episode`` is still compiled here).  Numba
    compiles under a process-wide lock, so this is the only way the two
    halves overlap.  The helper is a child that exits when this process
    does; if it fails or cannot write the cache, the kernels are compiled
    here as before."""
    if hasattr(net, "single_step_kernel"):
        net.single_step_kernel = True
    if parallel is None:
        parallel = helper_allowed()
    helper = CompileHelper(net.spec) if parallel else None
    try:
        if helper is not None:
            helper.arm()
        obs = np.zeros((3,) + tuple(net.obs_shape), net.dtype)
        probs, _, _ = net.step(obs[0], net.initial_state())
        safe_point()
        sample_categorical(probs, 0.5)
        # the update's targets (core.targets): here, while a helper may still be
        # compiling the backward's kernels
        warm_up_targets()
        if helper is not None:
            helper.wait()
        zeros = np.zeros(3, np.float32)
        # a worker records its steps through the network's Actor where it has one
        acts = np.zeros(3, np.int64)
        act = net.actor(None, acts, zeros.copy()) if hasattr(net, "actor") else None
        resets = (False, True) if cross_episode and net.recurrent else (False,)
        for reset in resets:
            net.begin_rollout(3)
            s = net.initial_state()
            for t in range(3):
                if reset and t == 2:
                    s = net.initial_state()
                if act is not None:
                    act(t, obs[t], 0.5, None, s if t == 0 or (reset and t == 2) else None)
                else:
                    _, _, s = net.step(obs[t], s, record=True)
            net.rollout_grad(acts, zeros, zeros)
            safe_point()
        if n_envs > 1:
            # the batched worker (K envs in lockstep): its ticks, sampler and
            # the backward over K sequences, with a per-row reset
            k = 2
            net.begin_batch_rollout(2, k)
            for t in range(2):
                net.tick_inputs(t)[...] = 0
                probs, _ = net.record_tick(t, None, np.array([True, False]) if t else None)
                sample_rows(probs, np.full(k, 0.5), np.zeros(k, np.int64))
            net.rollout_grad(np.zeros(2 * k, np.int64), np.zeros(2 * k, net.dtype),
                             np.zeros(2 * k, net.dtype))
            net.step_batch(np.zeros((k,) + tuple(net.obs_shape), net.dtype))
            safe_point()
    finally:
        if helper is not None:
            helper.stop()


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
#: a helper's code runs first: it imports this process's a3c_core package
#: by its location, not one that the helper's path would find first (``-c``
#: puts the working directory first; the Numba cache is keyed by source
#: path, so another tree's kernels would be compiled for nothing)
_HELPER_IMPORTS = (
    "import importlib.util as _u, sys as _s\n"
    f"_p = _u.spec_from_file_location('a3c_core', {os.path.join(_PKG_DIR, '__init__.py')!r}, "
    f"submodule_search_locations=[{_PKG_DIR!r}])\n"
    "_m = _s.modules['a3c_core'] = _u.module_from_spec(_p)\n"
    "_p.loader.exec_module(_m)\n")


class CompileHelper:
    """A compile helper process (see :func:`warm_up_network`), started at
    most once: :meth:`arm` starts it after ``delay`` seconds (default
    :data:`HELPER_DELAY_S`) unless :meth:`wait` or :meth:`stop` comes
    first, so a warm cache, which loads within the delay, never starts one.
    ``job`` (JSON-able) reaches the ``entry`` code as ``watch_parent()["job"]``."""

    #: seconds to wait for the helper before compiling here anyway
    timeout = 120.0

    def __init__(self, job, entry="from a3c_core.warmup import _helper_main; _helper_main()",
                 delay=None):
        self.arg = json.dumps({"job": job, "parent": os.getpid()})
        self.entry = entry
        self.delay = delay
        self.proc = None
        self._timer = None
        self._lock = threading.Lock()
        self._stopped = False

    def arm(self):
        delay = HELPER_DELAY_S if self.delay is None else self.delay
        self._timer = threading.Timer(delay, self.start)
        self._timer.daemon = True
        self._timer.start()

    def start(self):
        with self._lock:
            if self._stopped or self.proc is not None:
                return
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _HELPER_IMPORTS + self.entry, self.arg],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, close_fds=True)
            except OSError:
                self.proc = None

    def _disarm(self):
        if self._timer is not None:
            self._timer.cancel()

    def wait(self):
        """Cancel a start still pending; wait for a started helper (at most
        :attr:`timeout`)."""
        self._disarm()
        with self._lock:
            self._stopped = True        # a timer that already fired starts nothing now
            proc = self.proc
        if proc is not None:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                safe_point()            # a deferred Ctrl-C stops the wait
                try:
                    proc.wait(0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass

    def stop(self):
        self._disarm()
        with self._lock:
            self._stopped = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def watch_parent():
    """In a helper process: read its argument (``argv[1]``, JSON) and start a
    thread that exits the process as soon as the parent named there is gone."""
    arg = json.loads(sys.argv[1])
    parent = int(arg["parent"])     # not getppid() now: the parent may be gone already

    def watchdog():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    return arg


def _helper_main():
    """Entry of the helper process: compile (into the cache) the kernels of
    the backward-only update for ``argv[1]``'s network, over zero rows
    marked recorded (neither the step kernel, which the parent is compiling,
    nor the batched forward, which a worker never runs).  Exits when its
    parent is gone."""
    net = network_from_spec(watch_parent()["job"])
    zeros = np.zeros(3, np.float32)
    net.zero_recording(3)      # zero rows: no batched-forward kernels to compile
    net.rollout_grad(np.zeros(3, np.int64), zeros, zeros)
