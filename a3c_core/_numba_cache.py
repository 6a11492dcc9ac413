"""Load a3c_core's Numba cache from a read-only install (imported by :mod:`a3c_core._jit`).

Numba (``cache=True``) only uses a cache directory it can *write*: next to
the module (``__pycache__``), ``NUMBA_CACHE_DIR``, or ``~/.cache/numba``. In
a read-only install (container image, system site-packages) with a
read-only home, no directory qualifies and decorating a kernel raises
``RuntimeError: cannot cache function ...: no locator available``; with a
writable home, every new home compiles everything again (~10 s).

This module adds two locators, tried after numba's own writable ones, that
accept an existing *read-only* cache directory of a3c_core's own modules
(``NUMBA_CACHE_DIR/<subpath>`` if set, else ``__pycache__`` next to the
module), which ``a3c compile`` filled at image build time. They only read:
a signature missing from such a cache is compiled in memory and not saved
(one warning names ``a3c compile``). Other packages' kernels are untouched.
"""
from __future__ import annotations

import os
import warnings

from numba.core import caching

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _cls(*names):
    for n in names:  # numba >= 0.61 dropped the leading underscore
        if hasattr(caching, n):
            return getattr(caching, n)
    raise ImportError(f"numba.core.caching has none of {names}")


_InTree = _cls("InTreeCacheLocator", "_InTreeCacheLocator")
_UserProvided = _cls("UserProvidedCacheLocator", "_UserProvidedCacheLocator")
_Impl = _cls("CacheImpl", "_CacheImpl")


class _ReadOnlyMixin:
    read_only = True

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if not os.path.isdir(path):
            raise OSError(f"no cache directory {path}")

    @classmethod
    def from_function(cls, py_func, py_file):
        if not os.path.abspath(py_file).startswith(_PKG_DIR):
            return None
        return super().from_function(py_func, py_file)


class ReadOnlyUserProvidedLocator(_ReadOnlyMixin, _UserProvided):
    """An existing, read-only ``NUMBA_CACHE_DIR`` cache of an a3c_core module."""


class ReadOnlyInTreeLocator(_ReadOnlyMixin, _InTree):
    """An existing, read-only ``__pycache__`` cache next to an a3c_core module."""


def _register():
    classes = _Impl._locator_classes
    if ReadOnlyInTreeLocator in classes:
        return
    classes.insert(classes.index(_UserProvided) + 1, ReadOnlyUserProvidedLocator)
    classes.insert(classes.index(_InTree) + 1, ReadOnlyInTreeLocator)

    save = caching.Cache._save_overload
    warned = []

    def _save_overload(self, sig, data):
        if getattr(self._impl.locator, "read_only", False):
            if not warned:
                warned.append(True)
                warnings.warn(
                    f"a3c_core: compiled {self._py_func.__module__}.{self._py_func.__qualname__} "
                    f"({len(sig)} arguments) but its cache directory "
                    f"{self._cache_path} is read-only, so the next process compiles it again; "
                    f"run `a3c compile` where the install is writable (image build)",
                    RuntimeWarning, stacklevel=2)
            return None
        return save(self, sig, data)

    caching.Cache._save_overload = _save_overload


_register()
