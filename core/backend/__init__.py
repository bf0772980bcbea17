"""Backends: an array module plus the ops the models call. `cpu` is NumPy; `cuda` needs CuPy and a GPU;
`cuda-emu` is the cuda backend over the kernels built for the host (docs/cuda-emu.md)."""

import os

from ..errors import InvalidInputError
from .cpu import CPUBackend

BACKENDS = ("cpu", "cuda", "cuda-emu")
__all__ = ["BACKENDS", "NUMERICS", "CPUBackend", "BackendUnavailable", "available_backends", "cuda_unavailable_reason", "default_cache_type",
           "default_numerics", "get_backend", "resolve_numerics"]


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
    except Exception as e:  # a machine without a GPU often has no driver, or an old one
        return f"no CUDA device (the CUDA runtime says: {type(e).__name__}: {e})"
    return None


def default_cache_type(backend: str) -> str:
    """f16 on every backend, as llama.cpp. On the CPU, attention converts f16 rows a block at a
    time with a kernel; measured at depth 4096 on SmolLM2 (scripts/decode_profile.py) a decoded
    token's attention takes the same time as over an f32 cache (36 against 38 ms), and the cache
    takes half the memory; logits against llama.cpp are unchanged (docs/performance.md)."""
    return "f16"


def available_backends() -> list[str]:
    """The backends `llm test-ops` checks by default: the emulated device only when asked for (-b)."""
    return ["cpu"] + (["cuda"] if cuda_unavailable_reason() is None else [])


NUMERICS = ("f32", "ggml")


def default_numerics(backend: str) -> str:
    """ggml on the cpu: matmul activations rounded to 8-bit blocks and ggml's integer dots, as
    llama.cpp's CPU backend computes (this engine exists to reproduce it); f32, the float reference
    without that rounding, is a flag away (--numerics f32, or LLMSUITE_NUMERICS=f32 for every command).
    The CUDA backends compute in f16/f32 as llama.cpp's CUDA backend does: f32 is their only numerics."""
    if backend != "cpu":
        return "f32"
    chosen = os.environ.get("LLMSUITE_NUMERICS") or "ggml"
    if chosen not in NUMERICS:
        raise InvalidInputError(f"LLMSUITE_NUMERICS is '{chosen}' (choose from {', '.join(NUMERICS)})")
    return chosen


def resolve_numerics(backend: str, numerics: str | None) -> str:
    """--numerics for a backend (None: its default), or the sentence saying why not."""
    numerics = numerics or default_numerics(backend)
    if numerics not in NUMERICS:
        raise InvalidInputError(f"unknown --numerics '{numerics}' (choose from {', '.join(NUMERICS)})")
    if backend != "cpu" and numerics != "f32":
        raise InvalidInputError(f"--numerics {numerics} is implemented on the cpu backend only")
    return numerics


def get_backend(name: str = "cpu", attn_path: str = "auto", numerics: str | None = None, progress=None):
    """A backend by name (numerics None: the backend's default); `progress` hears of slow first-time
    work (cuda-emu's host build)."""
    numerics = resolve_numerics(name, numerics)
    if name == "cpu":
        return CPUBackend(attn_path, numerics)
    if name == "cuda":
        reason = cuda_unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend unavailable: cuda: {reason}")
        from .cuda import CUDABackend

        return CUDABackend(attn_path)
    if name == "cuda-emu":
        from . import hostcuda

        reason = hostcuda.unavailable_reason()
        if reason:
            raise BackendUnavailable(f"backend unavailable: cuda-emu: {reason}")
        from .cuda import CUDABackend
        from .cuda_emu import EmulatedRuntime

        return CUDABackend(attn_path, EmulatedRuntime(), progress)
    raise InvalidInputError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")
