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
    if config.getoption("run_all") or config.getoption("markexpr"):
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
    if not (config.getoption("run_all") or config.getoption("markexpr")):
        return "slow tests deselected: `pytest -m slow` runs them, `pytest --all` runs everything"
    return None
