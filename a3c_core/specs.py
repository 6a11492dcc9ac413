"""The network specs by name: which encoder, whether recurrent, default options.

Data only (no numba), so that the config and the command line can name and
check specs without loading the compiled kernels (``a3c --help`` would pay
~0.3 s of numba imports); :mod:`a3c_core.nn.network` builds networks from it.
"""
from __future__ import annotations

#: name -> (encoder family, recurrent, default options)
SPEC_TABLE = {
    "doom-lstm": ("doom", True, {"fc_size": 256, "lstm_size": 256, "activation": "elu"}),
    "doom-ff": ("doom", False, {"fc_size": 256, "activation": "elu"}),
    "atari-lstm": ("atari", True, {"lstm_size": 256, "activation": "elu"}),
    "mlp-lstm": ("mlp", True, {"hidden": (64, 64), "lstm_size": 64, "activation": "elu"}),
    "mlp": ("mlp", False, {"hidden": (64, 64), "activation": "elu"}),
}
SPECS = tuple(SPEC_TABLE)


def spec_options(name) -> tuple:
    """Names of the options a network spec accepts (``hidden``, ``lstm_size``, ...)."""
    return tuple(SPEC_TABLE[name][2])
