"""The options of a Ray run (the ``--ray`` flags); light to import (no Ray, no trainer)."""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RayOptions"]


@dataclass
class RayOptions:
    """How the run is spread over Ray (the ``--ray`` flags)."""

    #: Ray address ("auto", "ray://host:10001", "host:6379"); None or "local" starts a local Ray
    address: str | None = None
    #: node actors (each runs ``cfg.workers`` worker threads)
    nodes: int = 2
    #: parameter-server shards (contiguous slices of the flat vectors)
    shards: int = 1
    #: sync after this many local updates (0 = only by time)
    sync_every: int = 0
    #: sync after this many milliseconds (0 = only by updates).  On doom:basic with
    #: 2 nodes, 200 ms learned per step like one threaded process where 500 ms
    #: did not; a round costs a doom-lstm node ~13-19 ms of CPU, so 200 ms is
    #: ~8 % of one core (docs/ray.md)
    sync_ms: float = 200.0
    #: where the optimizer statistics live: "local" (per node) or "global" (averaged at the shards)
    opt_state: str = "local"
    #: CPUs each node actor reserves (0 = cfg.workers)
    node_cpus: float = 0
    #: restarts Ray grants each node actor
    max_restarts: int = 3
    #: seconds the driver waits for node actors to be placed and ready
    start_timeout: float = 300.0
    #: seconds between driver polls of the nodes
    poll_s: float = 0.25

    def validate(self):
        def bad(name, why):
            raise ValueError(f"ray option '{name}' = {getattr(self, name)!r}: {why}")

        if not 1 <= self.nodes <= 4096:
            bad("nodes", "must be in [1, 4096]")
        if not 1 <= self.shards <= 1024:
            bad("shards", "must be in [1, 1024]")
        if self.sync_every < 0:
            bad("sync_every", "must be >= 0")
        if not (self.sync_ms >= 0 and math.isfinite(self.sync_ms)):
            bad("sync_ms", "must be a finite number >= 0")
        if self.sync_every == 0 and self.sync_ms == 0:
            bad("sync_ms", "sync_every and sync_ms are both 0: the nodes would never sync")
        if self.opt_state not in ("local", "global"):
            bad("opt_state", "must be 'local' or 'global'")
        if self.node_cpus < 0:
            bad("node_cpus", "must be >= 0")
        if self.max_restarts < 0:
            bad("max_restarts", "must be >= 0")
        return self
