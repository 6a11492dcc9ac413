"""Where a3c_core's Numba kernels are cached (imported by :mod:`a3c_core._jit`
before any kernel is decorated).

Numba's own choice (``cache=True``) is the first *writable* directory of
``NUMBA_CACHE_DIR``, ``__pycache__`` next to the module, ``~/.cache/numba``.
The second one is the trouble: files written into ``site-packages/a3c_core``
after installation are not in pip's record, so an uninstall, upgrade or
``pip install -e`` leaves ``a3c_core/**/__pycache__`` behind, and that
leftover ``a3c_core`` directory is a namespace package that shadows the next
(editable) install. So a3c_core's own modules never use ``__pycache__``; their
kernels are cached, in this order of preference, in

1. ``NUMBA_CACHE_DIR/<subpath>`` when the user sets it (numba's own locator,
   unchanged; and if that directory exists but is read-only, it is still
   loaded from, see below);
2. the *install cache* ``<sys.prefix>/share/a3c_core/numba-cache/<key>/<subpath>``,
   only if ``a3c compile`` created it: an image build fills it, and at run
   time it is used read-write if writable, else read-only;
3. the *user cache* ``<user cache dir>/a3c_core/<key>/<subpath>``
   (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux), created on first use.

``<key>`` is ``<a3c_core version>-<interpreter cache tag>`` (``0.1.0-cpython-311``),
so an upgraded package never loads a kernel compiled for another version;
``<subpath>`` is numba's (the module's directory name and a hash of its
path), so two installs of one version do not share entries either, and
numba's index still checks the source file's stamp and numba's version.
None of these directories is on ``sys.path``, so a leftover one cannot
shadow an install. :func:`cache_location` says which one a process uses.

Read-only directories. Numba itself only uses a directory it can *write*;
in a read-only install with a read-only home, no directory qualifies and
decorating a kernel raises ``RuntimeError: cannot cache function ...: no
locator available``. The read-only locators here accept an existing
read-only cache of a3c_core's modules (``NUMBA_CACHE_DIR`` or the install
cache, which ``a3c compile`` filled at image build time) and only read it: a
signature missing from it is compiled in memory and not saved (one warning
names ``a3c compile``). With no usable directory at all, kernels compile in
memory (same warning) rather than failing at import. A cache write the file
system refuses (a full disk, a file-size limit) is one warning too: the
kernel compiled is used, only its cache entry is missing. Other packages'
kernels are untouched.
"""
from __future__ import annotations

import os
import sys
import warnings

from numba.core import caching

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _cls(*names):
    for n in names:  # numba >= 0.61 dropped the leading underscore
        if hasattr(caching, n):
            return getattr(caching, n)
    raise ImportError(f"numba.core.caching has none of {names}")


_Locator = _cls("_CacheLocator", "CacheLocator")
_SourceBacked = _cls("_SourceFileBackedLocatorMixin", "SourceFileBackedLocatorMixin")
_UserProvided = _cls("UserProvidedCacheLocator", "_UserProvidedCacheLocator")
_InTree = _cls("InTreeCacheLocator", "_InTreeCacheLocator")
_Impl = _cls("CacheImpl", "_CacheImpl")


# -- the directories ---------------------------------------------------------

def cache_key() -> str:
    """``<a3c_core version>-<interpreter cache tag>``, the per-version part of the paths."""
    from a3c_core import __version__

    return f"{__version__}-{sys.implementation.cache_tag or 'py'}"


def install_cache_dir(prefix: str | None = None) -> str:
    """The install cache (``a3c compile``'s, for images): ``<prefix>/share/a3c_core/numba-cache/<key>``."""
    return os.path.join(sys.prefix if prefix is None else prefix, "share", "a3c_core", "numba-cache",
                        cache_key())


def user_cache_dir(environ=None) -> str:
    """The per-user cache: ``$XDG_CACHE_HOME/a3c_core/<key>``, else ``~/.cache/a3c_core/<key>``
    (on macOS ``~/Library/Caches``, on Windows ``%LOCALAPPDATA%``)."""
    env = os.environ if environ is None else environ
    if sys.platform == "win32":
        base = env.get("LOCALAPPDATA") or os.path.expanduser(r"~\AppData\Local")
    elif sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    else:
        base = env.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # the XDG spec: a relative value is ignored
            home = env.get("HOME") or os.path.expanduser("~")
            base = os.path.join(home, ".cache")
    return os.path.join(base, "a3c_core", cache_key())


def cache_location(environ=None, prefix: str | None = None) -> tuple[str, str]:
    """``(kind, directory)``: where a process with ``environ`` caches a3c_core's kernels.

    ``kind`` is ``"NUMBA_CACHE_DIR"`` (set and non-empty: the user's choice
    wins), ``"install"`` (the install cache exists) or ``"user"``. The
    directory is the root; each module's kernels go to a numba subpath of it.
    Whether it can be written is not checked here (a read-only one is only
    read, see the module docstring).
    """
    env = os.environ if environ is None else environ
    if env.get("NUMBA_CACHE_DIR"):
        return "NUMBA_CACHE_DIR", env["NUMBA_CACHE_DIR"]
    inst = install_cache_dir(prefix)
    if os.path.isdir(inst):
        return "install", inst
    return "user", user_cache_dir(env)


def make_install_cache(prefix: str | None = None) -> str | None:
    """Create the install cache (``a3c compile``); its path, or None if the prefix is not writable."""
    path = install_cache_dir(prefix)
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK):
            return None
    except OSError:
        return None
    return path


def relocate(dispatchers) -> int:
    """Choose the cache directory again for a3c_core kernels decorated before it
    changed (``a3c compile`` creates the install cache after the command line
    imported some kernels), if nothing of theirs is compiled or loaded yet.
    Returns how many were moved."""
    moved = 0
    for d in dispatchers:
        if getattr(d, "_cache", None) is None or not getattr(d._cache, "_impl", None):
            continue            # not cached (a NullCache)
        if d.overloads or not _ours(d.py_func.__code__.co_filename):
            continue
        if d._cache._impl.locator.__class__ is InstallCacheLocator:
            continue
        d.enable_caching()
        moved += 1
    return moved


# -- numba locators ----------------------------------------------------------

def _ours(py_file) -> bool:
    return os.path.abspath(py_file).startswith(_PKG_DIR)


class _RootLocator(_SourceBacked, _Locator):
    """A writable ``<root>/<numba subpath>`` for an a3c_core module (created on use)."""

    read_only = False

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(self._root(), self.get_suitable_cache_subpath(py_file))

    @classmethod
    def _root(cls):
        raise NotImplementedError

    @classmethod
    def _usable(cls):
        return True

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file) or not cls._usable():
            return None
        return super().from_function(py_func, py_file)   # None unless ensure_cache_path passes


class InstallCacheLocator(_RootLocator):
    """The install cache, writable (it exists only once ``a3c compile`` made it)."""

    @classmethod
    def _root(cls):
        return install_cache_dir()

    @classmethod
    def _usable(cls):
        return os.path.isdir(install_cache_dir())


class UserCacheLocator(_RootLocator):
    """The per-user, per-version cache (the default)."""

    @classmethod
    def _root(cls):
        return user_cache_dir()


class _ReadOnlyMixin:
    read_only = True

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if not os.path.isdir(path):
            raise OSError(f"no cache directory {path}")

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None
        return super().from_function(py_func, py_file)


class ReadOnlyUserProvidedLocator(_ReadOnlyMixin, _UserProvided):
    """An existing, read-only ``NUMBA_CACHE_DIR`` cache of an a3c_core module."""


class ReadOnlyInstallLocator(_ReadOnlyMixin, InstallCacheLocator):
    """An existing, read-only install cache of an a3c_core module (``a3c compile`` in an image)."""


class NoCacheLocator(_ReadOnlyMixin, UserCacheLocator):
    """Nothing usable: compile in memory, load and save nothing (instead of numba's
    'no locator available' at import). Its path is the user cache it could not use."""

    no_cache = True

    def ensure_cache_path(self):
        pass


def _register():
    classes = _Impl._locator_classes
    if NoCacheLocator in classes:
        return
    # after numba's NUMBA_CACHE_DIR locator, before its __pycache__ one
    # (which then never sees an a3c_core module: NoCacheLocator takes them all)
    at = classes.index(_UserProvided) + 1
    classes[at:at] = [ReadOnlyUserProvidedLocator, InstallCacheLocator, ReadOnlyInstallLocator,
                      UserCacheLocator, NoCacheLocator]
    assert classes.index(NoCacheLocator) < classes.index(_InTree)

    load = caching.Cache._load_overload
    save = caching.Cache._save_overload
    warned = []

    def _load_overload(self, sig, target_context):
        if getattr(self._impl.locator, "no_cache", False):
            return None
        return load(self, sig, target_context)

    def _save_overload(self, sig, data):
        locator = self._impl.locator
        if getattr(locator, "read_only", False):
            if not warned:
                warned.append(True)
                why = (f"no cache directory could be used (tried NUMBA_CACHE_DIR, {install_cache_dir()}, "
                       f"{user_cache_dir()})" if getattr(locator, "no_cache", False)
                       else f"its cache directory {self._cache_path} is read-only")
                warnings.warn(
                    f"a3c_core: compiled {self._py_func.__module__}.{self._py_func.__qualname__} "
                    f"({len(sig)} arguments) but {why}, so the next process compiles it again; "
                    f"run `a3c compile` where the install is writable (image build), or set "
                    f"NUMBA_CACHE_DIR to a writable directory",
                    RuntimeWarning, stacklevel=2)
            return None
        try:
            return save(self, sig, data)
        except OSError as e:
            # a full disk or a file-size limit: the kernel is compiled and in use,
            # only its cache entry is missing (numba writes a temporary file and
            # renames it, so the cache is left as it was)
            if not full:
                full.append(True)
                warnings.warn(
                    f"a3c_core: compiled {self._py_func.__module__}.{self._py_func.__qualname__} "
                    f"but could not cache it in {self._cache_path}: [Errno {e.errno}] {e.strerror}; "
                    f"the next process compiles it again", RuntimeWarning, stacklevel=2)
            return None

    full = []
    caching.Cache._load_overload = _load_overload
    caching.Cache._save_overload = _save_overload


_register()
