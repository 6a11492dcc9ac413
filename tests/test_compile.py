"""Read-only installs: a3c_core loads its Numba cache from a directory it cannot write.

Root ignores file modes, so "cannot write" is simulated by making every
writable locator (numba's and a3c_core's) refuse every directory, as they do
on a read-only file system. The install cache (``a3c compile``'s, under
``sys.prefix``) is redirected to a temporary directory by INSTALL below.
"""
import json
import os
import re
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys, warnings
from numba.core import caching

def refuse(self):
    raise OSError(30, "Read-only file system (simulated)")

for name in ("_CacheLocator", "UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator",
             "_UserProvidedCacheLocator", "_InTreeCacheLocator", "_UserWideCacheLocator"):
    cls = getattr(caching, name, None)
    if cls is not None:   # a3c_core's writable locators inherit _CacheLocator's
        cls.ensure_cache_path = refuse
INSTALL

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


def _install(code, install_dir):
    """``code`` with a3c_core's install cache at ``install_dir`` instead of under sys.prefix."""
    patch = ("import a3c_core._numba_cache as _nc; _nc.install_cache_dir = lambda prefix=None: "
             f"{str(install_dir)!r}" if install_dir is not None else "")
    return code.replace("INSTALL", patch) if "INSTALL" in code else patch + "\n" + code


def _run(code, cache_dir, install_dir=None, env_extra=None):
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    env.update(env_extra or {})
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    code = _install(code, install_dir)
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
    bare = _install(PROBE, None).replace(
        "from a3c_core.sampling import", "import a3c_core._numba_cache as m; "
        "[caching.CacheImpl._locator_classes.remove(c) for c in "
        "(m.ReadOnlyUserProvidedLocator, m.InstallCacheLocator, m.ReadOnlyInstallLocator, "
        "m.UserCacheLocator, m.NoCacheLocator)]\n    from a3c_core.sampling import")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0 and "no locator available" in out.stderr


def test_read_only_install_cache_is_loaded_not_recompiled(tmp_path):
    """The image: a3c compile filled the install cache; a later process, whatever its home, loads it read-only."""
    inst = tmp_path / "prefix-cache"
    inst.mkdir()                        # a3c compile creates it (make_install_cache)
    fill = ("import numpy as np; from a3c_core.sampling import sample_categorical as s; "
            "s(np.array([1.0], np.float32), 0.5); print(type(s._cache._impl.locator).__name__)")
    out = _run(fill, None, inst, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert out.stdout.split()[-1] == "InstallCacheLocator"   # chosen over the user cache
    before = _files(inst)
    assert any(f.endswith(".nbi") for f in before) and not (tmp_path / "xdg").exists()
    res = json.loads(_run(PROBE, None, inst, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}).stdout.splitlines()[-1])
    assert res == {"locator": "ReadOnlyInstallLocator", "hits": 1, "misses": 0, "ok": True, "warnings": []}
    assert _files(inst) == before


def test_nothing_writable_compiles_in_memory(tmp_path):
    """No NUMBA_CACHE_DIR, no install cache, nothing writable: import works (numba alone
    raises 'no locator available'), kernels compile in memory, one warning, nothing written."""
    res = json.loads(_run(PROBE, None, tmp_path / "none", {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
                     .stdout.splitlines()[-1])
    assert res["locator"] == "NoCacheLocator" and res["ok"]
    assert res["misses"] == 1 and res["hits"] == 0
    assert len(res["warnings"]) == 1 and "a3c compile" in res["warnings"][0]
    assert "no cache directory could be used" in res["warnings"][0]
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "none").exists()


@pytest.mark.slow    # compiles every mlp kernel in a fresh cache (~8 s)
def test_a3c_compile_fills_the_install_cache(tmp_path):
    """Without NUMBA_CACHE_DIR, a3c compile creates the install cache (under sys.prefix)
    and fills it; a3c compile --check then finds everything there."""
    inst = tmp_path / "share" / "a3c_core" / "numba-cache" / "k"
    code = ("import sys; from a3c_core.cli import main; sys.exit(main(sys.argv[1:]))")
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "A3C_COMPILE_HELPER": "0"}
    args = "['compile', '--spec', 'mlp']"
    out = _run(f"import sys; sys.argv[1:] = {args}\n" + code, None, inst, env_extra=env)
    assert inst.is_dir() and any(f.endswith(".nbi") for f in _files(inst)), out.stdout
    # kernels the command line imported before the install cache existed moved there too
    assert str(inst) in out.stdout and _files(tmp_path / "xdg") == [], out.stdout
    m = re.search(r"(\d+) signatures: 0 loaded from the cache, (\d+) compiled", out.stdout)
    assert m and int(m[1]) == int(m[2]) > 0, out.stdout
    args = "['compile', '--check', '--spec', 'mlp']"
    out = _run(f"import sys; sys.argv[1:] = {args}\n" + code, None, inst, env_extra=env)
    m = re.search(r"(\d+) signatures: (\d+) loaded from the cache, 0 compiled", out.stdout)
    assert m and int(m[1]) == int(m[2]) > 0, out.stdout
