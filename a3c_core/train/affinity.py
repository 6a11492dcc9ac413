"""Which cores a worker runs on: the cores this process may use, and pinning
the calling thread to some of them (Linux; elsewhere a no-op).  The trainer
pins worker ``i`` (and the engine its env spawns, which inherits the
spawning thread's affinity) to core ``i mod cores``; a Ray node does the same
for its workers."""
from __future__ import annotations

import os

__all__ = ["allowed_cores", "pin_thread"]


def allowed_cores() -> list:
    """The cores this process may run on, sorted (``[]`` where the OS does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return []


def pin_thread(cores) -> bool:
    """Pin the calling thread (Linux: pid 0 = this thread) to ``cores``."""
    try:
        os.sched_setaffinity(0, cores)
        return True
    except (AttributeError, OSError, ValueError):
        return False
