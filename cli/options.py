"""Flags shared by every subcommand that builds a context (the same set everywhere, by design)."""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any, NamedTuple, Optional, get_type_hints

import typer

from llmsuite.core.backend import default_cache_type
from llmsuite.core.context import ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import CACHE_TYPES, CTX_KINDS, kv_choices, mask_choices
from llmsuite.core.memory.masks import SparseParams
from llmsuite.core.sampling import sampler_names

# Help texts that list registered names hold these marks; `fill_choices` puts in the names known when
# the command line is built, after the plugins have loaded.
LIVE_CHOICES = {"<kv-kinds>": kv_choices, "<attn-masks>": mask_choices, "<samplers>": sampler_names}

Model = Annotated[Optional[str], typer.Option("-m", "--model", help="GGUF path or known model name")]
CtxSize = Annotated[int, typer.Option("-c", "--ctx-size", help="context size (0: the model's)")]
BatchSize = Annotated[int, typer.Option("-b", "--batch-size", help="logical batch size")]
UBatchSize = Annotated[int, typer.Option("-ub", "--ubatch-size", help="physical micro-batch size")]
Parallel = Annotated[int, typer.Option("-np", "--parallel", help="sequences the context holds")]
Kv = Annotated[str, typer.Option("--kv", help="memory class: <kv-kinds>")]
KvBudget = Annotated[int, typer.Option("--kv-budget", help="cells per sequence a memory kind that evicts keeps "
                                       "(a plugin's; 0: the kind's default)")]
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
AttnMask = Annotated[str, typer.Option("--attn-mask", help="mask producer of the selecting layers: <attn-masks> "
                                       "(auto: topk where --sparse-topk is given)")]
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
KvOffload = Annotated[Optional[bool], typer.Option("-kvo/-nkvo", "--kv-offload/--no-kv-offload", help="llama.cpp "
                                                 "GPU builds: the KV cache on the GPU or not (no effect here)",
                                                 show_default=False)]
NoMmap = Annotated[bool, typer.Option("--no-mmap", help="llama.cpp: read weights instead of mapping (no effect "
                                      "here: the GGUF is mapped)")]
FA_VALUES = ("on", "off", "auto")


def llama_cpp_flags(attn: str, gpu_layers: str | None = None, flash_attn: str = "auto", device: str | None = None,
                    split_mode: str | None = None, main_gpu: int | None = None, no_mmap: bool = False,
                    kv_offload: bool | None = None) -> str:
    """Check and report the GPU-build flags; returns the attention path (-fa off: dense)."""
    from .common import log

    if flash_attn not in FA_VALUES:
        raise InvalidInputError(f"-fa takes on, off or auto, not '{flash_attn}'")
    given = [(flag, value) for flag, value in (("-ngl", gpu_layers), ("-dev", device), ("-sm", split_mode),
                                               ("-mg", main_gpu), ("--no-mmap", no_mmap or None),
                                               ("-kvo/-nkvo", kv_offload)) if value is not None]
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


def cache_types(backend: str, type_k: str | None, type_v: str | None) -> tuple[str, str]:
    """-ctk/-ctv as given, or the backend's default."""
    return type_k or default_cache_type(backend), type_v or default_cache_type(backend)


@dataclass(frozen=True)
class ContextOptions:
    """The context and speed flags, declared once: each field is an option of every command that
    builds a context (its annotation) with its default; see `with_context_options`."""
    ctx_size: CtxSize = 0
    batch_size: BatchSize = 2048
    ubatch_size: UBatchSize = 512
    parallel: Parallel = 1
    kv: Kv = "auto"
    kv_budget: KvBudget = 0
    ctx_kind: Ctx = "auto"
    swa_full: SwaFull = False
    cache_type_k: CacheTypeK = None
    cache_type_v: CacheTypeV = None
    backend: Backend = "cpu"
    attn: Attn = "auto"
    attn_impl: AttnImpl = "auto"
    numerics: Numerics = None
    sparse_topk: SparseTopk = 0
    sparse_block: SparseBlock = SPARSE.block
    sparse_local: SparseLocal = SPARSE.local
    sparse_layers: SparseLayers = SPARSE.layers
    attn_mask: AttnMask = "auto"
    threads: Threads = 0
    threads_batch: ThreadsBatch = 0
    gpu_layers: GpuLayers = None
    flash_attn: FlashAttn = "auto"
    device: Device = None
    split_mode: SplitMode = None
    main_gpu: MainGpu = None
    no_mmap: NoMmap = False
    kv_offload: KvOffload = None

    @property
    def sparse(self) -> SparseParams:
        return SparseParams(self.sparse_topk, self.sparse_block, self.sparse_local, self.sparse_layers)

    def apply_llama_cpp_flags(self) -> ContextOptions:
        """Check and report the GPU-build flags (after -v is set); -fa off makes attention dense."""
        attn = llama_cpp_flags(self.attn, self.gpu_layers, self.flash_attn, self.device, self.split_mode,
                               self.main_gpu, self.no_mmap, self.kv_offload)
        return replace(self, attn=attn)

    def params(self, **changes) -> ContextParams:
        """These flags as ContextParams, with `changes` in its own names (n_ctx=, n_seq_max=, ...);
        checked, and the backend readied, before any model is loaded."""
        type_k, type_v = cache_types(self.backend, self.cache_type_k, self.cache_type_v)
        given = self.cache_type_k is not None or self.cache_type_v is not None
        flags = dict(n_ctx=self.ctx_size, n_batch=self.batch_size, n_ubatch=self.ubatch_size, n_seq_max=self.parallel,
                     type_k=type_k, type_v=type_v, cache_types_given=given, swa_full=self.swa_full, kv=self.kv,
                     ctx=self.ctx_kind, backend=self.backend, attn=self.attn, attn_impl=self.attn_impl,
                     numerics=self.numerics, sparse=self.sparse, attn_mask=self.attn_mask, kv_budget=self.kv_budget,
                     n_threads=self.threads,
                     n_threads_batch=self.threads_batch)
        params = ContextParams(**(flags | changes))
        params.validate()
        from .common import ready_backend

        ready_backend(self.backend, params.numerics)  # an unavailable backend is refused before the model loads
        return params


Plugin = Annotated[Optional[list[str]], typer.Option("--plugin", metavar="FILE", help="a Python file that registers "
                                                    "memory kinds, mask producers, samplers or architectures "
                                                    "(repeatable; loaded before the flags are read)")]


def with_plugin_option(command):
    """The command with --plugin among its flags; `llm` has loaded the files before parsing
    (cli.main.load_plugins), so the command itself never sees them."""
    signature = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def run(*args, plugin=None, **options):
        return command(*args, **options)

    params = [*signature.parameters.values(),
              inspect.Parameter("plugin", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Plugin)]
    run.__signature__ = signature.replace(parameters=params)
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    return run


def fill_choices(command) -> None:
    """Put the registered names (built-in and plugins') into the help of a Click command's options
    and of its subcommands'."""
    for param in getattr(command, "params", []):
        for mark, names in LIVE_CHOICES.items():
            if param.help and mark in param.help:
                param.help = param.help.replace(mark, ", ".join(names()))
    for sub in getattr(command, "commands", {}).values():
        fill_choices(sub)


def on_off_auto(flag: str, value: str, auto: bool) -> bool:
    """A llama.cpp on|off|auto value (and its other spellings: true/false, 1/0, enabled/disabled, -1)."""
    word = value.strip().lower()
    if word in ("on", "true", "1", "enabled", "yes"):
        return True
    if word in ("off", "false", "0", "disabled", "no"):
        return False
    if word in ("auto", "-1"):
        return auto
    raise InvalidInputError(f"{flag} takes on, off or auto, not '{value}'")


class Flag(NamedTuple):
    """An option as a command declares it: Annotated[type, typer.Option(...)], and its default."""
    annotation: Any
    default: Any


CONTEXT_FLAGS = {f.name: Flag(get_type_hints(ContextOptions, include_extras=True)[f.name], f.default)
                 for f in fields(ContextOptions)}


def with_context_options(omit: tuple[str, ...] = (), **changes):
    """Put the context flags in a command's signature where its parameter `context` stands, and
    call it with them as one ContextOptions. A change is a flag's default, or a Flag for a flag the
    command declares its own way (its help, its type); an omitted flag keeps ContextOptions' default."""
    unknown = (set(omit) | set(changes)) - set(CONTEXT_FLAGS)
    if unknown:
        raise TypeError(f"not a context flag: {', '.join(sorted(unknown))}")
    flags = {name: _changed(flag, changes.get(name, flag.default)) for name, flag in CONTEXT_FLAGS.items()
             if name not in omit}

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        if "context" not in signature.parameters:
            raise TypeError(f"{command.__name__} has no parameter `context` for the context flags")

        @functools.wraps(command)
        def run(**options):
            context = ContextOptions(**{name: options.pop(name) for name in flags})
            return command(**options, context=context)

        params = []
        for param in signature.parameters.values():
            if param.name != "context":
                params.append(param)
                continue
            params += [inspect.Parameter(name, param.kind, default=flag.default, annotation=flag.annotation)
                       for name, flag in flags.items()]
        # Typer reads the signature and the resolved annotations: both name the flags, not `context`
        run.__signature__ = signature.replace(parameters=params)
        run.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
        return run

    return decorate


def _changed(flag: Flag, change) -> Flag:
    return change if isinstance(change, Flag) else flag._replace(default=change)
