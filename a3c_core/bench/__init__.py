"""``a3c bench``: kernel, update, env and end-to-end throughput of the A3C engine.

Every row warms up, then times ``--repeat`` repetitions (each long enough to
dwarf the timer) and reports the median, min and max.  The rows, in the
order a run prints them, each documented in its module's docstring:

* :mod:`~a3c_core.bench.machine`: ``sgemm peak`` (the reference every
  "fraction of peak" is relative to) and ``memory bandwidth``; also the
  machine info, the :class:`Row` and the table.
* :mod:`~a3c_core.bench.network`: ``step (batch 1)``, ``loss_and_grad``
  (us and GFLOP/s), ``update``, ``learner us/agent step`` (with the
  recompute path and, where torch is installed, the PyTorch-style learner)
  and ``learner + self-imitation us/agent step``.
* :mod:`~a3c_core.bench.kernels`: the FLOP counter (:func:`flops`) and the
  flat-buffer kernels ``rmsprop/adam apply``, ``clip_grad_norm``, ``gae``.
* :mod:`~a3c_core.bench.embed`: ``Policy.act``, ``act_batch N=...``,
  onnxruntime and PyTorch at N = 1 and 64 (``--skip-embed``), ``preprocess``.
* :mod:`~a3c_core.bench.env`: ``env step`` and ``env reset``.
* :mod:`~a3c_core.bench.e2e`: ``train steps/s wN``, ``train frames/s wN``,
  ``step env/forward/backward/apply/glue wN`` and ``scaling wN`` (a real
  trainer; ``--skip-e2e``).
* :mod:`~a3c_core.bench.gil`: ``GIL held (1 worker)`` and ``GIL us/step``
  (``--skip-gil``).
* :mod:`~a3c_core.bench.cli`: the command line (:func:`main`).

``--json PATH`` writes the rows plus machine info (CPU model, cores, Python,
numpy, numba versions) and the FLOP counts.  The default run takes about a
minute on 2 cores; ``--quick`` is a few seconds per section (smoke test).

Importing this package imports neither the trainer nor the optional
exporters and PyTorch: the rows that need them import them when they run.
"""
from a3c_core.bench.cli import build_parser, main
from a3c_core.bench.kernels import flops, layer_table
from a3c_core.bench.machine import Row, format_table, machine_info

__all__ = ["Row", "build_parser", "flops", "format_table", "layer_table", "machine_info", "main"]
