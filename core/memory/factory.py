"""Building a model's memory from the layout it declares (`MemorySpec`) and the plan resolved from
the flags (core/plan.py, where the refusals of flag combinations live).

Each `--kv` value is a `MemoryKind` registered with `@memory_kind`: a new kind of memory adds one
there, with its builder, its size and the models it refuses; the choosing code stays as it is.
Each `--attn-mask` value is a mask producer registered with `@mask_producer` the same way. A plugin
(core/plugins.py) registers through the same two decorators."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..backend import default_cache_type
from ..errors import InvalidInputError
from ..plugins import register
from .base import Memory
from .composite import HybridMemory
from .dsv4 import DSV4Memory, window_layout
from .iswa import KVCacheISWA, swa_cache_size
from .kv_cache import KVCache
from .masks import TOPK_AUTO_MIN_KV, TOPK_AUTO_RATIO, BlockTopK, IndexerTopK, MaskProducer, SparseParams, parse_layers
from .none import NoKVMemory
from .recurrent import RecurrentMemory
from .spec import AttnSpec, MemorySpec, RecurrentSpec
from .storage import check_cache_type, row_bytes

CTX_KINDS = ("auto", "decoder", "encoder", "enc-dec", "no-kv")
ATTN_IMPLS = ("auto", "naive", "mla")
MAX_SEQ = 256


@dataclass
class MemoryParams:
    n_ctx: int = 0
    n_ubatch: int = 512
    n_seq_max: int = 1
    type_k: str = field(default_factory=lambda: default_cache_type("cpu"))  # as the CLI: f16, as llama.cpp
    type_v: str = field(default_factory=lambda: default_cache_type("cpu"))
    swa_full: bool = False
    kv: str = "auto"
    ctx: str = "auto"
    cache_types_given: bool = False  # -ctk/-ctv came from the user, not a default
    attn: str = "auto"  # attention path where a sparse bound exists: auto, dense or sparse
    attn_impl: str = "auto"  # latent-attention models: cache the latent ("mla") or per-head K/V ("naive")
    sparse: SparseParams = field(default_factory=SparseParams)
    attn_mask: str = "auto"  # the mask producer of the selecting layers: auto (topk where --sparse-topk), or a name
    kv_budget: int = 0  # cells per sequence an evicting memory kind keeps (0: the kind's default)
    kv_unified: bool = False  # --kv dsv4: one window stream shared by the sequences (llama.cpp's -kvu, which it ignores)


@dataclass(frozen=True)
class MemoryKind:
    """A selectable memory class: how to build it from a model's spec and the flags, what it will
    take (checked before anything is allocated), and why it cannot serve a model (None: it can)."""
    build: Callable[[MemorySpec, MemoryParams, object], Memory]  # (spec, params, backend)
    nbytes: Callable[[MemorySpec, MemoryParams], int]
    refuses: Callable[[MemorySpec, str, MemoryParams], str | None]
    holds_kv: bool = True  # its storage types are -ctk/-ctv
    budgeted: bool = False  # it keeps at most --kv-budget cells per sequence, evicting the others


MEMORY_KINDS: dict[str, MemoryKind] = {}
# --attn-mask NAME: a function of the memory's parameters giving the producer of the selecting layers
MASK_PRODUCERS: dict[str, Callable[[MemoryParams], MaskProducer]] = {}


def memory_kind(name: str, nbytes=None, refuses=None, holds_kv: bool = True, budgeted: bool = False):
    """Register the decorated builder `build(spec, params, backend) -> Memory` as `--kv name`.
    `nbytes(spec, params)` is what it will allocate (checked against the memory available; None:
    not checked), `refuses(spec, arch, params)` why it cannot serve a model (None: it can);
    `holds_kv`: -ctk/-ctv type its rows; `budgeted`: it takes --kv-budget."""
    def add(build):
        kind = MemoryKind(build, nbytes or (lambda spec, p: 0), refuses or (lambda spec, arch, p: None),
                          holds_kv, budgeted)
        register("memory kind", name, MEMORY_KINDS, kind)
        return build
    return add


def mask_producer(name: str):
    """Register the decorated `make(params) -> MaskProducer` as `--attn-mask name`: the producer of
    every full-attention layer --sparse-layers names (it reads --sparse-topk and the other
    MemoryParams as it likes)."""
    def add(make):
        register("mask producer", name, MASK_PRODUCERS, make)
        return make
    return add


@mask_producer("topk")
def _block_topk(p: MemoryParams) -> BlockTopK:
    """Under --attn auto block top-k selects only where that pays; otherwise always."""
    sp = p.sparse
    min_kv = max(TOPK_AUTO_MIN_KV, TOPK_AUTO_RATIO * (sp.topk + sp.n_local)) if p.attn == "auto" else 0
    return BlockTopK(sp.topk, sp.block, sp.n_local, min_kv)


def mask_name(p: MemoryParams) -> str:
    """The --attn-mask that runs: auto is block top-k where --sparse-topk is given, else none ("")."""
    if p.attn_mask != "auto":
        return p.attn_mask
    return "topk" if p.sparse.topk else ""


def mask_producers(spec: MemorySpec, p: MemoryParams) -> dict[int, MaskProducer]:
    """The indexer of every layer that has one (DSA), and the --attn-mask producer (block top-k by
    default) of every other full-attention layer --sparse-layers names (window layers keep their
    window)."""
    indexed = {il: IndexerTopK(layer.indexer.top_k) for il, layer in spec.of(AttnSpec).items() if layer.indexer}
    name = mask_name(p)
    if not name:
        return indexed
    producer, layers = MASK_PRODUCERS[name](p), parse_layers(p.sparse.layers)
    return {**{il: producer for il, layer in spec.of(AttnSpec).items()
               if layer.window == 0 and not layer.indexer and il in layers}, **indexed}


def default_kind(spec: MemorySpec) -> str:
    if _compressed(spec):
        return "dsv4"
    if spec.layers and len(spec.of(RecurrentSpec)) == len(spec.layers):
        return "recurrent"
    if spec.of(RecurrentSpec):
        return "hybrid"
    if _latent(spec):
        return "dsa" if _indexed(spec) else "mla"
    return _attention_kind(spec)


def _attention_kind(spec: MemorySpec) -> str:
    """The default cache of the attention layers."""
    return "iswa" if spec.window_layers else "unified"


def _hybrid(spec: MemorySpec) -> bool:
    return bool(spec.of(RecurrentSpec)) and bool(spec.of(AttnSpec))


def _latent(spec: MemorySpec) -> bool:
    return any(layer.v_view for layer in spec.of(AttnSpec).values())


def _indexed(spec: MemorySpec) -> bool:
    return any(layer.indexer for layer in spec.of(AttnSpec).values())


def _compressed(spec: MemorySpec) -> dict[int, AttnSpec]:
    """The layers that attend compressed rows beside their window (DeepSeek-V4)."""
    return {il: layer for il, layer in spec.of(AttnSpec).items() if layer.compress is not None}


def create_memory(plan, p: MemoryParams, backend) -> Memory:
    """The memory a resolved plan (core/plan.py) names, for the layout the model declared, its
    arrays in the backend's array module; the cache types are checked against the layer widths and
    the size against the memory available before anything is allocated."""
    spec, kind = plan.spec, MEMORY_KINDS[plan.memory]
    if kind.holds_kv:
        for layer in spec.of(AttnSpec).values():
            check_cache_type(p.type_k, layer.k_width)
            if layer.v_width:
                check_cache_type(p.type_v, layer.v_width)
            if layer.indexer:
                check_cache_type(p.type_k, layer.indexer.head_dim)
            if layer.compress and layer.compress.indexer:
                check_cache_type(p.type_k, layer.compress.indexer.head_dim)
    check_fits(kind.nbytes(spec, p), p.n_ctx, backend.xp)
    return kind.build(spec, p, backend)


# ---- the kinds ---------------------------------------------------------------------------

def attention_refusal(name: str):
    """Refusals of an attention cache: on a hybrid model it is the attention part of --kv hybrid."""
    def refuses(spec: MemorySpec, arch: str, p: MemoryParams) -> str | None:
        if spec.of(RecurrentSpec) and not spec.of(AttnSpec):
            return (f"--kv {name} caches attention keys and values; {arch} has recurrent layers only "
                    f"(use --kv {default_kind(spec)} or --kv none)")
        if _compressed(spec):
            return (f"--kv {name} caches keys and values per token; {arch}'s layers attend compressed rows beside a "
                    "window of raw keys (use --kv dsv4, or --kv none)")
        if name == "iswa" and not spec.window_layers:
            return f"--kv iswa needs sliding-window layers; {arch} has none"
        if _latent(spec):
            return (f"--kv {name} caches K and V per head; {arch} with --attn-impl mla caches the latent "
                    f"(use --kv {default_kind(spec)}" + (")" if _indexed(spec) else ", or --attn-impl naive)"))
        if name == "split" and p.n_ctx // p.n_seq_max < 1:
            return f"-c {p.n_ctx} cannot be split into {p.n_seq_max} sequences"
        return None
    return refuses


def kv_bytes(spec: MemorySpec, p: MemoryParams, n_cells: int, window_cells: int | None = None) -> int:
    """Bytes of K/V rows: n_cells per layer, or window_cells for the windowed layers if given; and
    of the recurrent states of a hybrid model's other layers."""
    total = _state_bytes(spec, p)
    for il, layer in spec.of(AttnSpec).items():
        cells = window_cells if window_cells is not None and layer.window > 0 else n_cells
        total += cells * (row_bytes(p.type_k, layer.k_width) + row_bytes(p.type_v, layer.v_width))
        if layer.indexer:
            total += cells * row_bytes(p.type_k, layer.indexer.head_dim)
    return total


def _window_cells(spec: MemorySpec, p: MemoryParams) -> int:
    return p.n_ctx if p.swa_full else swa_cache_size(p.n_ctx, spec.window, p.n_seq_max, p.n_ubatch)


def _window(spec: MemorySpec) -> dict:
    return dict(n_swa=spec.window, swa_layers=spec.window_layers) if spec.window_layers else {}


def with_recurrent(spec: MemorySpec, p: MemoryParams, backend, attention: Memory) -> Memory:
    """An attention cache alone, or on a hybrid model beside the recurrent states (--kv hybrid)."""
    if not spec.of(RecurrentSpec):
        return attention
    return HybridMemory(attention, _recurrent(spec, p, backend))


@memory_kind("unified", lambda spec, p: kv_bytes(spec, p, p.n_ctx), attention_refusal("unified"))
def _unified(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    cache = KVCache(spec.of(AttnSpec), p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="unified", backend=backend,
                    producers=mask_producers(spec, p), **_window(spec))
    return with_recurrent(spec, p, backend, cache)


@memory_kind("split", lambda spec, p: kv_bytes(spec, p, p.n_ctx), attention_refusal("split"))
def _split(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    cache = KVCache(spec.of(AttnSpec), p.n_ctx // p.n_seq_max, p.n_seq_max, p.n_seq_max, p.type_k, p.type_v,
                    kind="split", producers=mask_producers(spec, p), backend=backend, **_window(spec))
    return with_recurrent(spec, p, backend, cache)


@memory_kind("iswa", lambda spec, p: kv_bytes(spec, p, p.n_ctx, _window_cells(spec, p)), attention_refusal("iswa"))
def _iswa(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    cache = KVCacheISWA(spec.of(AttnSpec), set(spec.window_layers), p.n_ctx, spec.window, p.n_ubatch, p.n_seq_max,
                        p.type_k, p.type_v, p.swa_full, producers=mask_producers(spec, p), backend=backend)
    return with_recurrent(spec, p, backend, cache)


def _hybrid_only(spec: MemorySpec, arch: str, p: MemoryParams) -> str | None:
    if not _hybrid(spec):
        return (f"--kv hybrid pairs an attention cache with recurrent states; {arch} has "
                f"{'recurrent' if spec.of(RecurrentSpec) else 'attention'} layers only (use --kv {default_kind(spec)})")
    return MEMORY_KINDS[_attention_kind(spec)].refuses(spec, arch, p)


@memory_kind("hybrid", lambda spec, p: MEMORY_KINDS[_attention_kind(spec)].nbytes(spec, p), _hybrid_only)
def _hybrid_memory(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    """llama_memory_hybrid: the model's default attention cache (unified, or iSWA where it has
    windows) for its attention layers, recurrent states for the others; --kv unified, split or
    iswa choose the attention part instead."""
    return MEMORY_KINDS[_attention_kind(spec)].build(spec, p, backend)


def _latent_only(name: str):
    def refuses(spec: MemorySpec, arch: str, p: MemoryParams) -> str | None:
        if _compressed(spec):
            return (f"--kv {name} caches the latent of multi-head latent attention; {arch} attends one key head "
                    "with compressed rows beside a window (use --kv dsv4, or --kv none)")
        if not _latent(spec):
            what = "the latent of multi-head latent attention (--attn-impl mla)"
            if name == "dsa":
                what = "the latent and the indexer keys of DeepSeek-3.2's sparse attention"
            return f"--kv {name} caches {what}; {arch} has none (use --kv {default_kind(spec)})"
        if name == "mla" and _indexed(spec):
            return f"--kv mla has no room for {arch}'s indexer keys (use --kv dsa)"
        if name == "dsa" and not _indexed(spec):
            return f"--kv dsa caches indexer keys; {arch} has no indexer (use --kv mla)"
        return None
    return refuses


@memory_kind("mla", lambda spec, p: kv_bytes(spec, p, p.n_ctx), _latent_only("mla"))
def _mla(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    """K-only rows (the latent and the rope part, one head); V is a view of them."""
    return KVCache(spec.of(AttnSpec), p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="mla", backend=backend,
                   producers=mask_producers(spec, p))


@memory_kind("dsa", lambda spec, p: kv_bytes(spec, p, p.n_ctx), _latent_only("dsa"))
def _dsa(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    """The MLA latent cache and, in the same cells, one head of indexer keys per layer."""
    return KVCache(spec.of(AttnSpec), p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="dsa", backend=backend,
                   producers=mask_producers(spec, p))


def _dsv4_only(spec: MemorySpec, arch: str, p: MemoryParams) -> str | None:
    if not _compressed(spec):
        return (f"--kv dsv4 keeps DeepSeek-V4's compressed rows beside a window; {arch} has no compressed layers "
                f"(use --kv {default_kind(spec)})")
    if p.type_k != p.type_v:
        return (f"--kv dsv4 keeps keys only ({arch}'s values are its keys): -ctk {p.type_k} and -ctv {p.type_v} "
                "must be equal")
    return None


def _dsv4_bytes(spec: MemorySpec, p: MemoryParams) -> int:
    """The window cache's rows, the compressed rows and the compressor rings."""
    n_ctx_seq = p.n_ctx // p.n_seq_max
    n_stream, cells = window_layout(p.n_ctx, p.n_seq_max, spec.window, p.n_ubatch, p.kv_unified)
    total = sum(n_stream * cells * row_bytes(p.type_k, layer.k_width) for layer in spec.of(AttnSpec).values())
    for layer in _compressed(spec).values():
        c = layer.compress
        widths = [c.width] + ([c.indexer.head_dim] if c.indexer else [])
        for width in widths:
            total += p.n_seq_max * (-(-n_ctx_seq // c.ratio) * row_bytes(p.type_k, width)
                                    + 2 * 4 * c.state_size * (2 * width if c.overlap else width))
    return total


@memory_kind("dsv4", _dsv4_bytes, _dsv4_only)
def _dsv4(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    """llama_kv_cache_dsv4: every layer's raw keys in a window cache (a stream per sequence), the
    compressed layers' rows and compressor rings per sequence."""
    return DSV4Memory(spec.of(AttnSpec), p.n_ctx, p.n_seq_max, p.n_ubatch, spec.window, p.type_k, p.kv_unified,
                      backend=backend)


def _recurrent_only(spec: MemorySpec, arch: str, p: MemoryParams) -> str | None:
    if spec.of(AttnSpec):
        return (f"--kv recurrent holds recurrent states; {arch} has attention layers "
                f"(use --kv {default_kind(spec)})")
    return None


def _state_bytes(spec: MemorySpec, p: MemoryParams) -> int:
    """The float32 recurrent states of every sequence."""
    return 4 * p.n_seq_max * sum(s.n_floats for s in spec.of(RecurrentSpec).values())


@memory_kind("recurrent", _state_bytes, _recurrent_only, holds_kv=False)
def _recurrent(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    return RecurrentMemory(spec.of(RecurrentSpec), p.n_seq_max, xp=backend.xp)


@memory_kind("none", lambda spec, p: 0, lambda spec, arch, p: None, holds_kv=False)
def _none(spec: MemorySpec, p: MemoryParams, backend) -> Memory:
    return NoKVMemory(p.n_seq_max, n_vocab=spec.n_vocab, recurrent=spec.of(RecurrentSpec),
                      producers=mask_producers(spec, p), xp=backend.xp, compressed=_compressed(spec), **_window(spec))


def kv_choices() -> tuple[str, ...]:
    """--kv's values now: auto, the built-in kinds, and those plugins registered."""
    return ("auto", *MEMORY_KINDS)


def mask_choices() -> tuple[str, ...]:
    """--attn-mask's values now: auto and every registered producer."""
    return ("auto", *MASK_PRODUCERS)


def check_fits(n_bytes: int, n_ctx: int, xp) -> None:
    available = available_memory(xp)
    if available is not None and n_bytes > available:
        raise InvalidInputError(f"a context of {n_ctx} cells (-c) needs {n_bytes / 2**30:.1f} GiB of KV cache, "
                                f"more than the {available / 2**30:.1f} GiB of memory available; give a smaller -c")


def available_memory(xp) -> int | None:
    """Bytes free where the cache would live: the device's memory for CuPy; else the system's
    MemAvailable, or less where the process's address space is capped (ulimit -v)."""
    if xp is not np:
        return int(xp.cuda.runtime.memGetInfo()[0])
    status = _proc_fields("/proc/meminfo", "MemAvailable") | _proc_fields("/proc/self/status", "VmSize")
    available = status.get("MemAvailable")
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap != resource.RLIM_INFINITY and "VmSize" in status:
            room = cap - status["VmSize"]
            available = room if available is None else min(available, room)
    except ImportError:
        pass
    return available


def _proc_fields(path: str, *names: str) -> dict[str, int]:
    """Fields given in kB from a /proc file, in bytes ({} where there is no /proc)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    fields = (line.split() for line in lines)
    return {f[0].rstrip(":"): int(f[1]) * 1024 for f in fields if len(f) >= 2 and f[0].rstrip(":") in names}
