"""a3c_core: CPU-only Asynchronous Advantage Actor-Critic without a DL framework.

Public entry points (imported lazily so ``import a3c_core`` stays cheap):

* :func:`build_network` - networks from a spec (``doom-lstm``, ``doom-ff``,
  ``atari-lstm``, ``mlp-lstm``, ``mlp``; ``a3c_core.nn.SPECS``) over one flat
  parameter buffer;
* :func:`gradcheck` - centred finite-difference gradient check in float64;
* :class:`Policy` - load a checkpoint and act, numpy + numba only;
* :class:`Config` and :func:`train` - the A3C trainer;
* :class:`ObservationError`, :class:`CheckpointError` - what ``Policy`` raises
  for a bad observation or checkpoint.

``a3c compile`` (:mod:`a3c_core.compile`) fills the Numba cache ahead of time
for read-only installs.
"""
import importlib

__version__ = "0.1.0"

_LAZY = {
    "build_network": ("a3c_core.nn.network", "build_network"),
    "network_from_spec": ("a3c_core.nn.network", "network_from_spec"),
    "gradcheck": ("a3c_core.nn.gradcheck", "gradcheck"),
    "Policy": ("a3c_core.policy", "Policy"),
    "Config": ("a3c_core.train.config", "Config"),
    "train": ("a3c_core.train.trainer", "train"),
    "make_env": ("a3c_core.envs", "make_env"),
    "ObservationError": ("a3c_core.obs", "ObservationError"),
    "CheckpointError": ("a3c_core.checkpoint", "CheckpointError"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'a3c_core' has no attribute {name!r}")


def __dir__():
    return __all__
