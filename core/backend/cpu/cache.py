"""How the CPU kernels are declared and cached on disk.

numba keeps a compiled function in __pycache__ under a stamp of the file that defines it, and
loads it again while that file is unchanged. The kernels here inline helpers from other modules of
this package (the IR of ir.py and blocks.py, the driver of matvec.py, fast_exp...), which that
stamp would not see. Importing this module puts a locator in front of numba's for the functions
defined in this package: numba's own choice of cache folder, and as the stamp a hash of every
kernel module of the package, so an edit to any of them recompiles every kernel once.

`cached` is numba's njit with that cache; `specialize` and `per_type` make one cached kernel per
GGUF type out of one template, `parallel_and_serial` a serial twin for a few rows.
"""

from __future__ import annotations

import hashlib
import types as pytypes
from functools import lru_cache
from pathlib import Path

from gguf import GGMLQuantizationType
from numba import njit
from numba.core import caching

PACKAGE = Path(__file__).resolve().parent
# the modules without numba code: an edit there keeps the compiled kernels
NOT_KERNELS = ("__init__.py", "backend.py")
# numba 0.61 renamed _CacheImpl
_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl


@lru_cache(maxsize=1)
def sources_stamp() -> str:
    """A hash of the package's kernel modules (read once per process, as numba reads its stamps)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name not in NOT_KERNELS:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class KernelSourcesLocator(caching._CacheLocator):
    """numba's locator for a function of this package, with the stamp of all its kernel sources."""

    def __init__(self, inner, py_file: str):
        self._inner = inner
        self._py_file = py_file  # numba's warnings name it

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    def get_source_stamp(self):
        return sources_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if Path(py_file).resolve().parent != PACKAGE:
            return None
        for other in _CACHE_IMPL._locator_classes:
            inner = None if other is cls else other.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, py_file)
        return None


def install() -> None:
    if KernelSourcesLocator not in _CACHE_IMPL._locator_classes:
        _CACHE_IMPL._locator_classes.insert(0, KernelSourcesLocator)


install()  # before any kernel of the package is declared: every one of them imports this module


def cached(**options):
    """numba's njit, cached on disk (options as njit's; cache=False leaves a kernel uncached)."""
    return njit(**{"cache": True, **options})


def specialize(template, name: str, constants: dict, **options):
    """A cached kernel compiled from a copy of `template` named `name`, whose globals also hold
    `constants` (a type's row dot, decoder...: numba freezes them into the compiled code). numba
    caches a function by its file, name and bytecode, so each copy has its own cache entry. The
    copy sees the module's globals as they are now: call this below whatever the template uses."""
    scope = {**template.__globals__, **constants}
    fn = pytypes.FunctionType(template.__code__, scope, name, template.__defaults__)
    fn.__qualname__ = name
    return cached(**options)(fn)


def per_type(template, prefix: str, constants: dict[str, dict], **options) -> dict[int, object]:
    """{ggml type id: kernel} for GGUF type names mapped to their constants, each kernel named
    prefix_<type>."""
    return {int(GGMLQuantizationType[name]): specialize(template, f"{prefix}_{name.lower()}", values, **options)
            for name, values in constants.items()}


def parallel_and_serial(template, **options):
    """`template` (a loop over prange) as a parallel kernel for prompts and a serial one, named
    <template>_serial, for a few rows: waking numba's threads costs more than a few rows' work."""
    return (cached(parallel=True, **options)(template),
            specialize(template, template.__name__ + "_serial", {}, **options))
