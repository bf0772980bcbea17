"""Memory (KV cache) classes behind one protocol (base.py), chosen by flag (factory.py)."""

from .base import AttnGroup, LoadedState, Memory, MemoryContext, MemoryStatus
from .factory import CTX_KINDS, KV_KINDS, MemoryParams, create_memory, resolve_kinds
from .iswa import KVCacheISWA
from .kv_cache import KVCache, LayerShape
from .none import NoKVMemory
from .storage import CACHE_TYPES

__all__ = ["AttnGroup", "LoadedState", "Memory", "MemoryContext", "MemoryStatus", "KVCache", "KVCacheISWA", "NoKVMemory",
           "LayerShape", "MemoryParams", "create_memory", "resolve_kinds", "KV_KINDS", "CTX_KINDS", "CACHE_TYPES"]
