"""Memory (KV cache) classes behind one protocol; see base.py."""

from .base import Memory, MemoryContext, MemoryStatus
from .iswa import KVCacheISWA
from .kv_cache import KVCache, LayerShape

__all__ = ["Memory", "MemoryContext", "MemoryStatus", "KVCache", "KVCacheISWA", "LayerShape"]
