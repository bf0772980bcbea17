"""Backends: an array module plus the ops the models call. `cpu` is NumPy; `cuda` needs CuPy and a GPU."""

from ..errors import InvalidInputError
from .cpu import CPUBackend

BACKENDS = ("cpu", "cuda")
__all__ = ["BACKENDS", "CPUBackend", "BackendUnavailable", "available_backends", "cuda_unavailable_reason", "default_cache_type",
           "get_backend"]


class BackendUnavailable(InvalidInputError):
    """A known backend that cannot run here (no CuPy, no driver, no device)."""


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'llmsuite[cuda]')"
    except Exception as e:  # a broken CUDA install fails inside the import
        return f"CuPy failed to import ({type(e).__name__}: {e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as e:
        return f"no usable CUDA driver or device ({type(e).__name__}: {e})"
    return None


def default_cache_type(backend: str) -> str:
    """f16 on every backend, as llama.cpp: the attention kernels read f16 rows in place, so a
    decoded token reads half the cache bytes of f32 (measured on the CPU: tg32@d4096 on SmolLM2
    10.8 t/s with f16 against 8.7 with f32; tg128 the same within noise; logits against llama.cpp
    unchanged, see docs/performance.md)."""
    return "f16"


def available_backends() -> list[str]:
    return ["cpu"] + (["cuda"] if cuda_unavailable_reason() is None else [])


def get_backend(name: str = "cpu", attn_path: str = "auto"):
    if name == "cpu":
        return CPUBackend(attn_path)
    if name == "cuda":
        reason = cuda_unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend unavailable: cuda: {reason}")
        from .cuda import CUDABackend

        return CUDABackend(attn_path)
    raise InvalidInputError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")
