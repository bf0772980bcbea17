"""Memory (KV cache) classes behind one protocol (base.py), built from a model's declared layout
(spec.py) and chosen by flag (factory.py)."""

from .base import AttnGroup, AttnView, LoadedState, Memory, MemoryContext, MemoryStatus, RecurrentView
from .factory import (CTX_KINDS, MASK_PRODUCERS, MEMORY_KINDS, MemoryParams, attention_refusal, create_memory, kv_bytes,
                      kv_choices, mask_choices, mask_producer, memory_kind, with_recurrent)
from .iswa import KVCacheISWA
from .kv_cache import KVCache
from .none import NoKVMemory
from .recurrent import RecurrentMemory
from .spec import AttnSpec, MemorySpec, RecurrentSpec, RopeSpec
from .storage import CACHE_TYPES

__all__ = ["AttnGroup", "AttnView", "RecurrentView", "LoadedState", "Memory", "MemoryContext", "MemoryStatus",
           "KVCache", "KVCacheISWA", "NoKVMemory", "RecurrentMemory", "AttnSpec", "RecurrentSpec", "RopeSpec",
           "MemorySpec", "MemoryParams", "create_memory", "memory_kind", "mask_producer", "MEMORY_KINDS", "MASK_PRODUCERS",
           "kv_choices", "mask_choices", "attention_refusal", "kv_bytes", "with_recurrent",
           "CTX_KINDS", "CACHE_TYPES"]
