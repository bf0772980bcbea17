"""Flags shared by every subcommand that builds a context (the same set everywhere, by design)."""

from __future__ import annotations

import re
from typing import Annotated, Optional

import typer

from llmsuite.core.backend import default_cache_type
from llmsuite.core.context import ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import CACHE_TYPES, CTX_KINDS, KV_KINDS
from llmsuite.core.memory.masks import SparseParams

Model = Annotated[Optional[str], typer.Option("-m", "--model", help="GGUF path or known model name")]
CtxSize = Annotated[int, typer.Option("-c", "--ctx-size", help="context size (0: the model's)")]
BatchSize = Annotated[int, typer.Option("-b", "--batch-size", help="logical batch size")]
UBatchSize = Annotated[int, typer.Option("-ub", "--ubatch-size", help="physical micro-batch size")]
Parallel = Annotated[int, typer.Option("-np", "--parallel", help="sequences the context holds")]
Kv = Annotated[str, typer.Option("--kv", help=f"memory class: {'|'.join(KV_KINDS)}")]
Ctx = Annotated[str, typer.Option("--ctx", help=f"context kind: {'|'.join(CTX_KINDS)}")]
SwaFull = Annotated[bool, typer.Option("--swa-full", help="full-size window cache (allows position shifts)")]
_CACHE_HELP = f"{'|'.join(CACHE_TYPES)} (f16 unless given, as llama.cpp)"
CacheTypeK = Annotated[Optional[str], typer.Option("-ctk", "--cache-type-k", help=f"K cache type: {_CACHE_HELP}")]
CacheTypeV = Annotated[Optional[str], typer.Option("-ctv", "--cache-type-v", help=f"V cache type: {_CACHE_HELP}")]
Backend = Annotated[str, typer.Option("--backend", help="compute backend: cpu, cuda (with CuPy), cuda-emu (the CUDA "
                                      "kernels emulated on the host: slow, for checking them)")]
Attn = Annotated[str, typer.Option("--attn", help="attention where masks are sparse: auto|dense|sparse")]
AttnImpl = Annotated[str, typer.Option("--attn-impl", help="latent-attention models (deepseek2): mla caches the "
                                       "latent, naive K and V per head (auto: mla)")]
SPARSE = SparseParams()  # the defaults of --sparse-block, --sparse-local and --sparse-layers
SparseTopk = Annotated[int, typer.Option("--sparse-topk", help="block top-k: keep each query's best blocks up to K cells (0: dense)")]
SparseBlock = Annotated[int, typer.Option("--sparse-block", help="cells per block of --sparse-topk (a power of two)")]
SparseLocal = Annotated[int, typer.Option("--sparse-local", help="last positions --sparse-topk always keeps (<= K; -1: min(128, K))")]
SparseLayers = Annotated[str, typer.Option("--sparse-layers", help="layers that select: '2-', 'all', '0,4-9', 'none'")]
Numerics = Annotated[Optional[str], typer.Option("--numerics", help="ggml | f32: ggml (the cpu's default) rounds matmul "
                                                  "activations to 8-bit blocks and takes integer dots, as ggml-cpu does; "
                                                  "f32 is the float reference (the CUDA backends' numerics)")]
Threads = Annotated[int, typer.Option("-t", "--threads", help="threads for a one-token step (0: all cores)")]
ThreadsBatch = Annotated[int, typer.Option("-tb", "--threads-batch", help="threads for batches (0: as -t)")]
Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="log details; tracebacks on errors (as llm -v)")]
# flags a llama.cpp GPU build takes: accepted, and reported under -v as having no effect here
GpuLayers = Annotated[Optional[str], typer.Option("-ngl", "--n-gpu-layers", "--gpu-layers",
                                                  help="llama.cpp GPU builds: layers offloaded (no effect here)")]
FlashAttn = Annotated[str, typer.Option("-fa", "--flash-attn", help="on|off|auto; off runs attention on the "
                                        "dense path (--attn dense)")]
Device = Annotated[Optional[str], typer.Option("-dev", "--device", help="llama.cpp GPU builds (no effect here; "
                                               "see --backend)")]
SplitMode = Annotated[Optional[str], typer.Option("-sm", "--split-mode", help="llama.cpp multi-GPU (no effect here)")]
MainGpu = Annotated[Optional[int], typer.Option("-mg", "--main-gpu", help="llama.cpp multi-GPU (no effect here)")]
NoMmap = Annotated[bool, typer.Option("--no-mmap", help="llama.cpp: read weights instead of mapping (no effect "
                                      "here: the GGUF is mapped)")]
FA_VALUES = ("on", "off", "auto")


def llama_cpp_flags(attn: str, gpu_layers: str | None = None, flash_attn: str = "auto", device: str | None = None,
                    split_mode: str | None = None, main_gpu: int | None = None, no_mmap: bool = False) -> str:
    """Check and report the GPU-build flags; returns the attention path (-fa off: dense)."""
    from .common import log

    if flash_attn not in FA_VALUES:
        raise InvalidInputError(f"-fa takes on, off or auto, not '{flash_attn}'")
    given = [(flag, value) for flag, value in (("-ngl", gpu_layers), ("-dev", device), ("-sm", split_mode),
                                               ("-mg", main_gpu), ("--no-mmap", no_mmap or None)) if value is not None]
    for flag, _ in given:
        log(f"note: {flag} has no effect here (it places layers on a llama.cpp GPU build; see --backend)")
    if flash_attn == "off":
        if attn not in ("auto", "dense"):
            raise InvalidInputError(f"-fa off runs attention densely; it contradicts --attn {attn}")
        log("note: -fa off: attention takes the dense path (llmsuite's attention is always one fused op)")
        return "dense"
    return attn


def verbose_flag(verbose: bool) -> None:
    """`llm generate -v` as `llm -v generate`."""
    from .common import settings

    if verbose:
        settings["verbose"] = True


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|[nrt'\"\\])")
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's -e: \\n \\r \\t \\' \\" \\\\ and \\xNN become what they stand for; any
    other backslash stays."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "x" else _ESCAPED[m.group(1)], text)


def context_params(ctx_size: int, batch_size: int, ubatch_size: int, parallel: int, kv: str, ctx: str,
                   swa_full: bool, cache_type_k: str | None, cache_type_v: str | None, backend: str = "cpu",
                   attn: str = "auto", numerics: str | None = None, sparse: SparseParams | None = None,
                   attn_impl: str = "auto", threads: int = 0, threads_batch: int = 0) -> ContextParams:
    """The flags as ContextParams (-ctk/-ctv None: not given), checked before any model is loaded."""
    given = cache_type_k is not None or cache_type_v is not None
    cache_type_k, cache_type_v = cache_types(backend, cache_type_k, cache_type_v)
    params = ContextParams(n_ctx=ctx_size, n_batch=batch_size, n_ubatch=ubatch_size, n_seq_max=parallel,
                           type_k=cache_type_k, type_v=cache_type_v, swa_full=swa_full, kv=kv, ctx=ctx,
                           backend=backend, attn=attn, numerics=numerics, cache_types_given=given,
                           sparse=sparse or SparseParams(), attn_impl=attn_impl, n_threads=threads,
                           n_threads_batch=threads_batch)
    params.validate()
    from .common import ready_backend

    ready_backend(backend, params.numerics)  # an unavailable backend is refused before the model loads
    return params


def cache_types(backend: str, type_k: str | None, type_v: str | None) -> tuple[str, str]:
    """-ctk/-ctv as given, or the backend's default."""
    return type_k or default_cache_type(backend), type_v or default_cache_type(backend)
