"""Where a3c_core's Numba cache lives (a3c_core._numba_cache): never inside the
installed package, where pip's record does not know it and a leftover
``a3c_core/**/__pycache__`` would shadow the next install (issue 41)."""
import json
import os
import subprocess
import sys

import pytest

import a3c_core
from a3c_core import _numba_cache as nc

KEY = f"{a3c_core.__version__}-{sys.implementation.cache_tag}"
PKG = os.path.dirname(os.path.abspath(a3c_core.__file__))

linux_only = pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="XDG layout")


def test_key_is_version_and_interpreter():
    assert nc.cache_key() == KEY and KEY.startswith(a3c_core.__version__ + "-")


@linux_only
def test_user_cache_dir_follows_xdg_then_home(tmp_path):
    assert nc.user_cache_dir({"XDG_CACHE_HOME": str(tmp_path / "x"), "HOME": "/h"}) == \
        str(tmp_path / "x" / "a3c_core" / KEY)
    assert nc.user_cache_dir({"HOME": "/h"}) == f"/h/.cache/a3c_core/{KEY}"
    # the XDG spec: an empty or relative XDG_CACHE_HOME is ignored
    assert nc.user_cache_dir({"XDG_CACHE_HOME": "", "HOME": "/h"}) == f"/h/.cache/a3c_core/{KEY}"
    assert nc.user_cache_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == f"/h/.cache/a3c_core/{KEY}"


def test_install_cache_dir_is_under_the_prefix_not_the_package(tmp_path):
    d = nc.install_cache_dir(str(tmp_path))
    assert d == str(tmp_path / "share" / "a3c_core" / "numba-cache" / KEY)
    assert nc.install_cache_dir() == os.path.join(sys.prefix, "share", "a3c_core", "numba-cache", KEY)
    assert not nc.install_cache_dir().startswith(PKG + os.sep)


@linux_only
def test_cache_location_the_users_numba_cache_dir_wins(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    prefix = str(tmp_path / "prefix")
    # default: the per-user, per-version cache
    assert nc.cache_location(env, prefix) == ("user", str(tmp_path / "xdg" / "a3c_core" / KEY))
    # once a3c compile made the install cache, it is used
    assert nc.make_install_cache(prefix) == nc.install_cache_dir(prefix)
    assert nc.cache_location(env, prefix) == ("install", nc.install_cache_dir(prefix))
    # NUMBA_CACHE_DIR, when the user sets it, wins over both
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    assert nc.cache_location(env, prefix) == ("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    env["NUMBA_CACHE_DIR"] = ""     # set but empty: numba ignores it too
    assert nc.cache_location(env, prefix)[0] == "install"


def test_make_install_cache_refuses_an_unwritable_prefix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")          # a file where the prefix's share/ would go
    assert nc.make_install_cache(str(blocker)) is None


def test_locators_come_before_numbas_pycache_one():
    from numba.core import caching

    classes = nc._Impl._locator_classes
    order = [classes.index(c) for c in (nc._UserProvided, nc.ReadOnlyUserProvidedLocator,
                                        nc.InstallCacheLocator, nc.ReadOnlyInstallLocator,
                                        nc.UserCacheLocator, nc.NoCacheLocator, nc._InTree)]
    assert order == sorted(order)
    assert caching.CacheImpl._locator_classes is classes


PROBE = r"""
import json, os, sys
import numpy as np
from a3c_core.sampling import sample_categorical as s
s(np.array([0.5, 0.5], np.float32), 0.3)
print(json.dumps({"locator": type(s._cache._impl.locator).__name__, "path": s.stats.cache_path,
                  "misses": sum(s.stats.cache_misses.values()), "hits": sum(s.stats.cache_hits.values())}))
"""


def _nbi(root):
    return {os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs if f.endswith((".nbi", ".nbc"))}


def _probe(env):
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@linux_only
@pytest.mark.skipif(os.path.isdir(nc.install_cache_dir()), reason="this environment has an install cache")
def test_a_process_caches_in_the_user_dir_or_numba_cache_dir_never_in_the_package(tmp_path):
    before = _nbi(PKG)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("NUMBA_CACHE_DIR", None)
    res = _probe(env)
    assert res["locator"] == "UserCacheLocator"
    assert res["path"].startswith(str(tmp_path / "xdg" / "a3c_core" / KEY) + os.sep)
    assert res["misses"] == 1 and _nbi(tmp_path / "xdg")
    assert _probe(env)["hits"] == 1     # the next process loads it
    # the user's NUMBA_CACHE_DIR wins (numba's own locator)
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    res = _probe(env)
    assert res["locator"] == "UserProvidedCacheLocator"
    assert res["path"].startswith(str(tmp_path / "mine") + os.sep) and _nbi(tmp_path / "mine")
    assert _nbi(PKG) == before          # nothing new inside the package
