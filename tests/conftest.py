import os

import pytest

# Workers and tests must not oversubscribe the 2 CI cores with BLAS threads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# Two tiers (the `slow` marker is registered in pyproject.toml):
#   pytest              the default tier: every test not marked slow
#   pytest -m slow      the slow tier (learning curves, signals and faults,
#                       Ray clusters, the reliability suite, sdist builds, ...)
#   pytest --all        both tiers (so does any explicit -m expression, e.g.
#                       -m "slow or not slow"; a slow test named by node id
#                       on the command line also runs)


def _default_tier(config):
    return not (config.getoption("run_all") or config.getoption("markexpr"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A plain ``pytest`` (the default tier with no paths or node ids named
    and no ``-n``; options such as ``-k``, ``-x`` or ``-p`` may be given)
    runs on one pytest-xdist process per usable CPU: on 2 cores the tier
    took 137 s that way against 216 s in one process, most of the
    difference being the kernels' first compile, which then runs on both
    cores (docs/results.md#test-tiers).  The slow tier (real signals, Ray
    clusters, timed faults) and runs that name tests stay in one process;
    ``-n 0`` or ``-p no:xdist`` turns it off."""
    if not config.pluginmanager.hasplugin("xdist") or config.option.numprocesses is not None:
        return
    if hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ:
        return      # an xdist worker itself: never spawn workers of its own
    if not _default_tier(config) or config.getoption("usepdb", False):
        return
    source = getattr(config, "args_source", None)      # pytest >= 7.2
    if source is not None and source == pytest.Config.ArgsSource.ARGS:
        return      # paths or node ids named: run them as asked, in one process
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        cpus = os.cpu_count() or 1
    if cpus > 1:
        config.option.numprocesses = cpus


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", dest="run_all",
                     help="also run the tests marked slow, which a plain `pytest` deselects "
                          "(`pytest -m slow` runs only those)")


def _named(config):
    """Node ids given on the command line (``path::name``), relative to the rootdir."""
    out = []
    for arg in config.args:
        if "::" not in arg:
            continue
        path, rest = arg.split("::", 1)
        rel = os.path.relpath(os.path.abspath(path), str(config.rootpath)).replace(os.sep, "/")
        out.append(f"{rel}::{rest}")
    return out


def pytest_collection_modifyitems(config, items):
    if not _default_tier(config):
        return
    named = _named(config)
    keep, slow = [], []
    for item in items:
        if item.get_closest_marker("slow") is None or any(
                item.nodeid == n or item.nodeid.startswith((n + "[", n + "::")) for n in named):
            keep.append(item)
        else:
            slow.append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_report_header(config):
    if _default_tier(config):
        return "slow tests deselected: `pytest -m slow` runs them, `pytest --all` runs everything"
    return None
