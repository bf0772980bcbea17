"""The CPU backend (backend.py) and its numba kernels, one module per role."""

from .backend import (KERNEL_TYPES, SPARSE_MIN_KV, CPUBackend, _key_blocks, alibi_slopes, as_float, cache_bits,
                      gemm_tasks)

__all__ = ["KERNEL_TYPES", "SPARSE_MIN_KV", "CPUBackend", "_key_blocks", "alibi_slopes", "as_float", "cache_bits",
           "gemm_tasks"]
