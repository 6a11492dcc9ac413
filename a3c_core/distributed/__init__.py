"""A3C across machines on Ray: node actors + a sharded parameter server.

Needs the optional extra (``pip install 'a3c_core[ray]'``); importing this
package does not import Ray.

* :mod:`~a3c_core.distributed.sync` - the sync math (numpy; reference twin);
* :mod:`~a3c_core.distributed.ps` - :class:`ParamShard`, a slice of the global vectors;
* :mod:`~a3c_core.distributed.node` - :class:`Node`, W Hogwild worker threads + a sync thread;
* :mod:`~a3c_core.distributed.driver` - :class:`RayTrainer`, the run loop;
* :mod:`~a3c_core.distributed.cli` - ``a3c train --ray`` flags.
"""
from a3c_core.distributed.sync import NodeSync, shard_bounds, sync_round_ref

__all__ = ["NodeSync", "shard_bounds", "sync_round_ref"]
