"""The CPU backend (backend.py) and its numba kernels, one module per role.

The kernel modules are this package's submodules (core.backend.cpu.matvec_float, .attention...);
backend.py reaches them through accessors of the same names (matvec_float(), attention()...) that
import them on first use, so that importing the backend imports no numba. The accessors are not
re-exported here: importing a submodule sets the package attribute of its name to the module.
"""

from .backend import (KERNEL_TYPES, SPARSE_MIN_KV, CPUBackend, alibi_slopes, as_float, cache_bits,
                      gemm_tasks)

__all__ = ["KERNEL_TYPES", "SPARSE_MIN_KV", "CPUBackend", "alibi_slopes", "as_float", "cache_bits",
           "gemm_tasks"]
