"""Network engine: flat-buffer layers, numpy reference twins, Numba kernels.

* :func:`build_network` / :func:`network_from_spec` - actor-critic networks
  (``encoder -> core -> heads`` layer lists; ``Network.fork()`` for another
  thread);
* :mod:`a3c_core.nn.layers` - the layers (conv, dense, LSTM core, heads), each
  with its layout entries, init, batched forward/backward, FLOPs and ref twin;
* :class:`ParamLayout` - name -> (offset, shape) over one flat buffer;
* :mod:`a3c_core.nn.ref` - plain-numpy reference layers;
* :mod:`a3c_core.nn.kernels` - the compiled twins;
* :func:`gradcheck` - whole-loss finite-difference check (float64);
* :mod:`a3c_core.nn.torch_twin` - optional PyTorch twin of any network
  (torch imported lazily, never a dependency).
"""
from .gradcheck import gradcheck
from .layout import ParamLayout
from .network import SPECS, Network, build_network, network_from_spec

__all__ = ["ParamLayout", "SPECS", "Network", "build_network", "network_from_spec",
           "gradcheck"]
