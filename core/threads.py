"""-t/--threads and -tb/--threads-batch: how many threads the CPU kernels (numba) and BLAS use.

llama.cpp takes -t for a decode step of one token and -tb for batches; the context switches
between the two counts the same way. BLAS is told through OpenBLAS's own entry point, found in
the libraries this process has loaded (NumPy's bundled scipy-openblas among them); a BLAS
without one keeps its count, and `describe()` says so.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
           "openblas_set_num_threads")
_current = {"n": 0}


@lru_cache(maxsize=1)
def _blas_setter():
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()})
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in SETTERS:
            if hasattr(lib, name):
                return getattr(lib, name)
    return None


def available() -> int:
    return os.cpu_count() or 1


def use_threads(n: int) -> None:
    """Run the CPU kernels and BLAS on n threads from now on (0: leave them as they are)."""
    if n <= 0 or n == _current["n"]:
        return
    import numba

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    setter = _blas_setter()
    if setter is not None:
        setter(ctypes.c_int(n))
    _current["n"] = n


def describe() -> str:
    return "" if _blas_setter() is not None else "this BLAS offers no thread setting: -t applies to the cpu kernels only"
