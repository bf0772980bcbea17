"""One resolved plan per context: the flags and the model turned, once, into what the context will be
(its kind, its memory kind, the attention implementation and path, the numerics, the sparse
selection). Every refusal of a flag, or of a combination of flags with each other or with the model,
lives here with its sentence; the context, the memory factory and the backend take the plan as given.

`check_flags` holds what is refused whatever the model (the CLI calls it before loading one);
`resolve_plan` adds what depends on the model."""

from __future__ import annotations

from dataclasses import dataclass, field

from .backend import resolve_numerics
from .backend.base import refusal
from .errors import InvalidInputError
from .embeddings import POOLING_NAMES
from .memory.factory import (ATTN_IMPLS, CTX_KINDS, MAX_SEQ, MEMORY_KINDS, default_kind, kv_choices, mask_choices,
                             mask_name, mask_producers)
from .memory.masks import MaskProducer, SparseParams, parse_layers
from .memory.spec import AttnSpec, MemorySpec, RecurrentSpec
from .memory.storage import CACHE_TYPES

ATTN_PATHS = ("auto", "dense", "sparse")  # --attn values


@dataclass(frozen=True)
class Plan:
    """What a context is, decided once from the flags and the model."""
    context: str  # "decoder", "no-kv", "encoder" or "enc-dec" (a class in context.py each)
    memory: str  # a --kv kind ("" for an encoder, which keeps no memory)
    attn_impl: str  # "naive", or "mla" for a latent-attention model caching its latent
    attn_path: str  # where masks are sparse: "auto", "dense" or "sparse"
    numerics: str  # "ggml" or "f32"
    spec: MemorySpec  # the model's memory layout for attn_impl
    sparse: SparseParams = field(default_factory=SparseParams)
    producers: dict[int, MaskProducer] = field(default_factory=dict)  # mask producer per selecting layer


def check_flags(p) -> None:
    """Refuse flag values and combinations that cannot work whatever the model (ContextParams)."""
    if p.n_threads < 0 or p.n_threads_batch < 0:
        raise InvalidInputError("-t and -tb take a thread count (0: all cores)")
    if p.n_ctx < 0:
        raise InvalidInputError("-c must be 0 (the model's context) or a positive size")
    if p.n_ubatch <= 0 or p.n_batch <= 0:
        raise InvalidInputError("-b and -ub must be positive")
    if p.n_ubatch > p.n_batch:
        raise InvalidInputError(f"the micro-batch (-ub {p.n_ubatch}) cannot exceed the batch (-b {p.n_batch})")
    resolve_numerics(p.backend, p.numerics)
    _choice("--attn", p.attn, ATTN_PATHS)
    if p.pooling not in ("auto", *POOLING_NAMES):
        raise InvalidInputError(f"unknown --pooling '{p.pooling}' (choose from {', '.join(POOLING_NAMES)})")
    _choice("--kv", p.kv, kv_choices())
    _choice("--attn-mask", p.attn_mask, mask_choices())
    if p.kv_budget < 0:
        raise InvalidInputError(f"--kv-budget takes a number of cells (0: the memory kind's default), not {p.kv_budget}")
    _choice("--ctx", p.ctx, CTX_KINDS)
    _choice("--attn-impl", p.attn_impl, ATTN_IMPLS)
    if not 1 <= p.n_seq_max <= MAX_SEQ:
        raise InvalidInputError(f"-np must be between 1 and {MAX_SEQ}")
    for flag, type_name in (("--cache-type-k", p.type_k), ("--cache-type-v", p.type_v)):
        if type_name not in CACHE_TYPES:
            raise InvalidInputError(f"{flag} {type_name} is not supported (choose from {', '.join(CACHE_TYPES)})")
    if p.ctx == "no-kv" and p.kv not in ("auto", "none"):
        raise InvalidInputError(f"--ctx no-kv recomputes the prefix without a cache, so --kv {p.kv} cannot apply")
    if p.ctx == "decoder" and p.kv == "none":
        raise InvalidInputError("--ctx decoder decodes over a cache; use --ctx no-kv to run without one")
    if p.swa_full and p.kv not in ("auto", "iswa", "hybrid"):
        raise InvalidInputError(f"--swa-full sizes the window cache of --kv iswa; --kv {p.kv} has none")
    _check_sparse(p.sparse)


def _choice(flag: str, value: str, allowed) -> None:
    if value not in allowed:
        raise InvalidInputError(f"unknown {flag} '{value}' (choose from {', '.join(allowed)})")


def _check_sparse(s: SparseParams) -> None:
    if s.topk < 0:
        raise InvalidInputError(f"--sparse-topk must be 0 (dense) or a positive number of cells, not {s.topk}")
    if s.block < 1 or s.block & (s.block - 1):
        raise InvalidInputError(f"--sparse-block must be a power of two, not {s.block}")
    if s.topk % s.block:
        raise InvalidInputError(f"--sparse-topk {s.topk} is not a multiple of --sparse-block {s.block}")
    if s.local < -1 or (s.topk and s.n_local > s.topk):
        raise InvalidInputError(f"--sparse-local {s.local} must be between 0 and --sparse-topk {s.topk} "
                                "(or -1: the default)")
    parse_layers(s.layers)


def resolve_plan(model, p) -> Plan:
    """The plan for `model` under ContextParams `p`, or InvalidInputError saying why not."""
    check_flags(p)
    attn_impl = _attn_impl(model, p)
    spec = model.memory_spec(attn_impl)
    numerics = resolve_numerics(p.backend, p.numerics)
    if p.embeddings and model.embeddings_refusal:
        raise InvalidInputError(model.embeddings_refusal)
    if spec.model_kind == "encoder":
        _check_encoder(model.arch, p)
        return Plan("encoder", "", attn_impl, p.attn, numerics, spec, p.sparse)
    _check_decoder(model.arch, spec, p)
    kv = p.kv if p.kv != "auto" else ("none" if p.ctx == "no-kv" else default_kind(spec))
    reason = MEMORY_KINDS[kv].refuses(spec, model.arch, p)
    if reason:
        raise InvalidInputError(reason)
    if p.kv_unified and kv != "dsv4":
        raise InvalidInputError(f"kv_unified lays out the window cache of --kv dsv4; --kv {kv} chooses its layout by "
                                "kind (--kv unified or split)")
    if p.kv_budget and not MEMORY_KINDS[kv].budgeted:
        raise InvalidInputError(f"--kv-budget bounds a memory kind that evicts cells; --kv {kv} keeps every cell")
    producers = _producers(spec, model.arch, p)
    if MEMORY_KINDS[kv].holds_kv:
        types = tuple(dict.fromkeys((p.type_k, p.type_v)))
        if not model.backend.supports("SET_ROWS", types):
            raise InvalidInputError(refusal(model.backend, "SET_ROWS", types, f"a {'/'.join(types)} cache (-ctk/-ctv)"))
    if not MEMORY_KINDS[kv].holds_kv and p.cache_types_given and spec.of(RecurrentSpec):
        raise InvalidInputError(f"-ctk/-ctv set the types of cached keys and values; {model.arch}'s recurrent "
                                "states are float32")
    if spec.model_kind == "enc-dec":
        if p.embeddings:
            raise InvalidInputError(f"embeddings of an encoder-decoder model ({model.arch}) are not supported, "
                                    "as in llama.cpp")
        context = "enc-dec"
    else:
        context = "no-kv" if kv == "none" else "decoder"
    return Plan(context, kv, attn_impl, p.attn, numerics, spec, p.sparse, producers)


def _attn_impl(model, p) -> str:
    """--attn-impl for this model: what a latent-attention model caches ("mla": the latent,
    "naive": K and V per head); every other model attends naively. Under auto, a latent model
    takes its first choice unless --kv asks for per-head rows."""
    impls = model.attn_impls
    if not impls:
        if p.attn_impl == "mla":
            raise InvalidInputError(f"--attn-impl mla applies to models with multi-head latent attention; "
                                    f"{model.arch} has none")
        return "naive"
    if p.attn_impl == "auto":
        return "naive" if p.kv in ("unified", "split") and "naive" in impls else impls[0]
    if p.attn_impl not in impls:
        raise InvalidInputError(f"--attn-impl {p.attn_impl} expands K and V per head, but {model.arch}'s dsa cache "
                                "holds the latent its indexer selects from: use --attn-impl mla")
    if p.attn_impl == "naive" and p.kv in ("mla", "dsa"):
        raise InvalidInputError(f"--kv {p.kv} caches the latent of --attn-impl mla; --attn-impl naive caches K and V "
                                "per head (use --kv unified)")
    return p.attn_impl


def _check_encoder(arch: str, p) -> None:
    if p.ctx not in ("auto", "encoder"):
        raise InvalidInputError(f"--ctx {p.ctx} needs a causal decoder; {arch} is an encoder (use --ctx encoder)")
    if p.kv not in ("auto", "none"):
        raise InvalidInputError(f"--kv {p.kv} caches keys for a decoder; {arch} is an encoder and keeps no memory")
    if p.sparse.topk:
        raise InvalidInputError(f"--sparse-topk selects cached keys; {arch} is an encoder and keeps no memory")


def _check_decoder(arch: str, spec: MemorySpec, p) -> None:
    if spec.model_kind == "enc-dec":
        if p.ctx not in ("auto", "enc-dec"):
            raise InvalidInputError(f"{arch} is an encoder-decoder: use --ctx enc-dec (with --kv none to decode "
                                    "without a cache)")
    elif p.ctx == "encoder":
        raise InvalidInputError(f"--ctx encoder needs an encoder model; {arch} is a causal decoder")
    elif p.ctx == "enc-dec":
        raise InvalidInputError(f"--ctx enc-dec needs a model with an encoder; {arch} is a causal decoder")
    if p.swa_full and not spec.window_layers:
        raise InvalidInputError(f"--swa-full applies to sliding-window models; {arch} has none")


def _producers(spec: MemorySpec, arch: str, p) -> dict[int, MaskProducer]:
    """The mask producers of the selecting layers; --sparse-topk (or --attn-mask) must find a layer
    to select in."""
    producers = mask_producers(spec, p)
    if mask_name(p) and not any(layer.window == 0 and not layer.indexer and il in producers
                                for il, layer in spec.of(AttnSpec).items()):
        raise InvalidInputError(_no_selecting_layer(spec, arch, p))
    return producers


def _no_selecting_layer(spec: MemorySpec, arch: str, p) -> str:
    flag = "--sparse-topk" if p.attn_mask == "auto" else f"--attn-mask {p.attn_mask}"
    attn = spec.of(AttnSpec)
    if not attn:
        return f"{flag} selects the keys attention reads; {arch} has no attention layers"
    if all(layer.indexer for layer in attn.values()):
        return f"{flag} selects keys by a mask of its own; every layer of {arch} selects its own with its indexer"
    full = [il for il, layer in attn.items() if layer.window == 0]
    if not full:
        return f"{flag} applies to full-attention layers; every layer of {arch} is a sliding window"
    return (f"--sparse-layers '{p.sparse.layers}' names none of {arch}'s full-attention layers "
            f"({_ranges(full)})")


def _ranges(layers: list[int]) -> str:
    return ",".join(str(il) for il in layers) if len(layers) < 8 else f"{layers[0]}..{layers[-1]}"

