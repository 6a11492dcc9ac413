"""Read-only installs: a3c_core loads its Numba cache from a directory it cannot write.

Root ignores file modes, so "cannot write" is simulated by making numba's own
(writable-only) locators refuse every directory, as they do on a read-only
file system.
"""
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys, warnings
from numba.core import caching

def refuse(self):
    raise OSError(30, "Read-only file system (simulated)")

for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator",
             "_UserProvidedCacheLocator", "_InTreeCacheLocator", "_UserWideCacheLocator"):
    cls = getattr(caching, name, None)
    if cls is not None:
        cls.ensure_cache_path = refuse

import numpy as np
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from a3c_core.sampling import sample_categorical, sample_categorical_ref
    p = np.array([0.2, 0.5, 0.3], np.float32)
    got = [int(sample_categorical(p, u)) for u in (0.1, 0.5, 0.9)]
st = sample_categorical.stats
print(json.dumps({
    "locator": type(sample_categorical._cache._impl.locator).__name__,
    "hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values()),
    "ok": got == [sample_categorical_ref(p, u) for u in (0.1, 0.5, 0.9)],
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
}))
"""


def _run(code, cache_dir):
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out


def _files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def test_read_only_cache_dir_is_loaded_not_recompiled(tmp_path):
    cache = tmp_path / "cache"
    # image build: a writable NUMBA_CACHE_DIR gets the compiled kernel
    _run("import numpy as np; from a3c_core.sampling import sample_categorical as s; "
         "s(np.array([1.0], np.float32), 0.5)", cache)
    before = _files(cache)
    assert any(f.endswith(".nbi") for f in before), before
    # run time: the same directory, now read-only
    res = json.loads(_run(PROBE, cache).stdout.splitlines()[-1])
    assert res == {"locator": "ReadOnlyUserProvidedLocator", "hits": 1, "misses": 0, "ok": True,
                   "warnings": []}
    assert _files(cache) == before


def test_read_only_empty_cache_compiles_in_memory_and_warns(tmp_path):
    from numba.core import caching

    import a3c_core.sampling

    cache = tmp_path / "empty"
    sub = caching._CacheLocator.get_suitable_cache_subpath(a3c_core.sampling.__file__)
    (cache / sub).mkdir(parents=True)  # the image's cache directory, without this kernel
    res = json.loads(_run(PROBE, cache).stdout.splitlines()[-1])
    assert res["locator"] == "ReadOnlyUserProvidedLocator" and res["ok"]
    assert res["misses"] == 1 and res["hits"] == 0
    assert len(res["warnings"]) == 1 and "a3c compile" in res["warnings"][0]
    assert "a3c_core.sampling.sample_categorical" in res["warnings"][0]
    assert _files(cache) == []  # nothing written (and no crash trying)
    # numba alone (without a3c_core's locators) cannot even decorate the kernel
    bare = PROBE.replace("from a3c_core.sampling import", "import a3c_core._numba_cache as m; "
                         "[caching.CacheImpl._locator_classes.remove(c) for c in "
                         "(m.ReadOnlyUserProvidedLocator, m.ReadOnlyInTreeLocator)]\n    from a3c_core.sampling import")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0 and "no locator available" in out.stderr


def test_read_only_install_without_cache_dir_uses_pycache(tmp_path):
    """No NUMBA_CACHE_DIR, nothing writable: import works (numba alone raises 'no locator available')."""
    import a3c_core

    if not os.path.isdir(os.path.join(os.path.dirname(a3c_core.__file__), "__pycache__")):
        pytest.skip("no __pycache__ next to the package")
    res = json.loads(_run(PROBE, None).stdout.splitlines()[-1])
    assert res["locator"] == "ReadOnlyInTreeLocator" and res["ok"]
