"""``a3c compile``: compile every Numba kernel ahead of time and write the on-disk cache.

Numba compiles a kernel the first time it is called with new argument types
(~26 s for all of a3c_core's kernels on a slow 2-core VM) and, with ``cache=True``,
writes the machine code to a cache directory; a new process then loads it in a
few ms per kernel. Which directory (:mod:`a3c_core._numba_cache`):
``NUMBA_CACHE_DIR`` if set, else the *install cache*
``<sys.prefix>/share/a3c_core/numba-cache/<version>-<tag>`` if it exists, else
the per-user cache ``~/.cache/a3c_core/<version>-<tag>`` (``$XDG_CACHE_HOME``).
``a3c compile`` (without ``NUMBA_CACHE_DIR``) creates and fills the install
cache, which later processes use even when it is read-only and whatever
their home directory, so image builds should run

    a3c compile            # after pip install, before the install is made read-only

If the prefix is not writable it fills the per-user cache instead (and says so).

:func:`warm_up` runs every network spec's step, batched inference
(``Policy.act_batch``) and rollout kernels, the samplers and the gradient
clip at the run-time dtypes, which compiles (or loads) every signature a
policy or a trainer uses. With 2+ usable CPUs a helper
process compiles the update kernels meanwhile (not with ``--check``, which
must see the cache as it is).  ``a3c compile --check``
fails if anything still had to be compiled (the cache is incomplete or was
not found), which is how an image build can verify itself; it creates no
directory.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np


def dispatchers():
    """``{qualified name: numba dispatcher}`` of every compiled kernel in loaded a3c_core modules."""
    from numba.core.dispatcher import Dispatcher

    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("a3c_core") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, Dispatcher) and obj.py_func.__module__ == name:
                out[f"{name}.{attr}"] = obj
    return out


def _update_paths(net, rng, dtype, obs_shape):
    """The kernels a network runs besides its step: the batched forward and
    backward (``loss_and_grad``), the backward-only update over rows the
    batched forward recorded, and the gradient clip."""
    from a3c_core.core import clip_grad_norm

    T = 3
    obs = rng.random((T,) + obs_shape).astype(dtype)
    actions = np.array([0, 1, 2], np.int64)
    returns = rng.standard_normal(T).astype(dtype)
    adv = rng.standard_normal(T).astype(dtype)
    net.loss_and_grad(obs, actions, returns, adv, net.initial_state())
    net.record_rollout(obs, net.initial_state())
    net.rollout_grad(actions, returns, adv)
    clip_grad_norm(net.grads, 40.0)
    return obs, actions, returns, adv


def _obs_shape(spec):
    return (4,) if spec.startswith("mlp") else (1, 84, 84)


def warm_up(specs=None, dtypes=(np.float32,), parallel=False):
    """Call every kernel with its run-time argument types (compiling or loading each once).

    ``specs``: network spec names (default: all); ``dtypes``: parameter dtypes
    (float32 is what training and :class:`~a3c_core.Policy` use; add float64
    for gradient checks).  ``parallel``: a helper process compiles the
    update kernels (:func:`_update_paths`, every spec and dtype) into the
    on-disk cache while this process compiles the steps, which it runs first;
    what the helper compiled then loads here.
    """
    from a3c_core.nn.batch import BATCH_MIN_ROWS
    from a3c_core.nn.network import SPECS, build_network
    from a3c_core.sampling import sample_categorical, sample_rows

    specs = list(specs or SPECS)
    helper = None
    if parallel:
        from a3c_core.warmup import CompileHelper

        # a warm cache loads every step within the delay: no helper then
        helper = CompileHelper({"specs": specs, "dtypes": [np.dtype(d).name for d in dtypes]},
                               entry="from a3c_core.compile import _helper_main; _helper_main()",
                               delay=1.0)
        helper.arm()
    try:
        rng = np.random.default_rng(0)
        nets = []
        for dtype in dtypes:           # the steps first (the helper has the rest)
            for spec in specs:
                obs_shape = _obs_shape(spec)
                net = build_network(spec, obs_shape, 3, dtype=dtype)
                probs, _, state = net.step(np.zeros(obs_shape, dtype), net.initial_state())
                net.step(np.ones(obs_shape, dtype), state)
                sample_categorical(probs, 0.5)
                # Policy.act_batch: the batched inference and the row sampler
                n = BATCH_MIN_ROWS
                bprobs, _, bstate = net.step_batch(np.zeros((n,) + obs_shape, dtype))
                net.step_batch(np.ones((n,) + obs_shape, dtype), bstate)
                sample_rows(bprobs, np.full(n, 0.5), np.empty(n, np.int64))
                nets.append((net, dtype, obs_shape))
        if helper is not None:
            helper.wait()
        for net, dtype, obs_shape in nets:
            obs, actions, returns, adv = _update_paths(net, rng, dtype, obs_shape)
            # the worker's path: recorded steps + backward-only update (nn owner)
            T = obs.shape[0]
            net.begin_rollout(T)
            s = net.initial_state()
            for t in range(T):
                if t == 2:          # an episode boundary inside the rollout (merge_below)
                    s = net.initial_state()
                _, _, s = net.step(obs[t], s, record=True)
            net.rollout_grad(actions, returns, adv)
            if net.recurrent:        # and the same rollout without one
                net.begin_rollout(T)
                s = net.initial_state()
                for t in range(T):
                    _, _, s = net.step(obs[t], s, record=True)
                net.rollout_grad(actions, returns, adv)
    finally:
        if helper is not None:
            helper.stop()


def _helper_main():
    """The helper process of ``warm_up(parallel=True)`` (see there)."""
    from a3c_core.warmup import watch_parent
    from a3c_core.nn.network import build_network

    job = watch_parent()["job"]
    rng = np.random.default_rng(0)
    for name in job["dtypes"]:
        for spec in job["specs"]:
            obs_shape = _obs_shape(spec)
            net = build_network(spec, obs_shape, 3, dtype=np.dtype(name))
            _update_paths(net, rng, np.dtype(name), obs_shape)


def cache_stats():
    """``(n_kernels, n_loaded_from_cache, n_compiled, cache_dirs, compiled_names, unsaved_names)``
    so far in this process; ``unsaved_names``: compiled but not saved (read-only cache directory)."""
    hits = misses = 0
    dirs, compiled, unsaved = set(), [], []
    disps = dispatchers()
    for name, d in sorted(disps.items()):
        st = d.stats
        h, m = sum(st.cache_hits.values()), sum(st.cache_misses.values())
        hits, misses = hits + h, misses + m
        if st.cache_path:
            dirs.add(st.cache_path)
        if m:
            compiled.append(name)
            cache = getattr(d, "_cache", None)
            if getattr(getattr(getattr(cache, "_impl", None), "locator", None), "read_only", False):
                unsaved.append(name)
    return len(disps), hits, misses, sorted(dirs), compiled, unsaved


def add_arguments(p):
    p.add_argument("--check", action="store_true",
                   help="fail (exit 1) if any kernel had to be compiled, i.e. was not in the cache; "
                        "what it compiles is still saved where the cache is writable")
    p.add_argument("--spec", action="append", default=None, metavar="NAME",
                   help="only this network spec (repeatable; default: every spec)")
    p.add_argument("--float64", action="store_true",
                   help="also compile the float64 kernels used by gradient checks (default: float32 only)")


def run_compile(args) -> int:
    cache_env = os.environ.get("NUMBA_CACHE_DIR")
    t0 = time.perf_counter()
    from a3c_core._safepoint import held_sigint

    note = ""
    try:
        with held_sigint():     # numba's and llvmlite's C extensions load here
            from a3c_core import _numba_cache

            if not cache_env and not args.check:
                # the install cache: what a read-only image loads, whoever runs it
                if _numba_cache.make_install_cache() is None:
                    note = (f" (the install cache {_numba_cache.install_cache_dir()} cannot be created, "
                            f"so this user's cache was filled; for an image, run a3c compile where "
                            f"sys.prefix is writable)")
                else:           # kernels the command line imported before it existed
                    _numba_cache.relocate(dispatchers().values())
            import a3c_core.nn.network  # noqa: F401  (decorating the kernels needs a cache directory)
            import a3c_core.sampling  # noqa: F401
    except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
        print(f"a3c compile: error: {e}\nNo writable cache directory: set NUMBA_CACHE_DIR to a "
              f"writable directory, or run a3c compile where the install is writable.", file=sys.stderr)
        return 2
    dtypes = (np.float32, np.float64) if args.float64 else (np.float32,)
    from a3c_core.nn.network import SPECS

    unknown = [s for s in args.spec or () if s not in SPECS]
    if unknown:
        print(f"a3c compile: error: unknown spec(s) {unknown}; valid specs: {', '.join(SPECS)}", file=sys.stderr)
        return 2
    from a3c_core.warmup import helper_allowed

    from a3c_core._safepoint import deferred_sigint

    # --check must see the cache as it is: no helper filling it meanwhile.
    # A Ctrl-C waits for the kernel being compiled (see a3c_core._safepoint).
    with deferred_sigint():
        warm_up(specs=args.spec, dtypes=dtypes, parallel=not args.check and helper_allowed())
    seconds = time.perf_counter() - t0
    n, hits, misses, dirs, compiled, unsaved = cache_stats()
    where = ", ".join(dirs) if dirs else "(no cache directory)"
    print(f"{n} kernels, {hits + misses} signatures: {hits} loaded from the cache, {misses} compiled "
          f"in {seconds:.1f} s; cache: {where}"
          + (f" (NUMBA_CACHE_DIR={cache_env})" if cache_env else note))
    if unsaved:
        print(f"a3c compile: error: {len(unsaved)} kernel(s) compiled but not saved, the cache directory "
              f"is read-only: {', '.join(unsaved)}. Run a3c compile where the install (or "
              f"NUMBA_CACHE_DIR) is writable.", file=sys.stderr)
        return 1
    if args.check and misses:
        print(f"a3c compile --check: error: {misses} signature(s) were not in the cache: "
              f"{', '.join(compiled)}. Run `a3c compile` where the cache directory is writable "
              f"(with the same NUMBA_CACHE_DIR as at run time).", file=sys.stderr)
        return 1
    return 0
