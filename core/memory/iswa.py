"""Interleaved sliding-window attention cache (llama_kv_cache_iswa): a full-size cache for the
global layers and a window-sized one for the sliding-window layers, fed the same ubatches."""

from __future__ import annotations

from ..batch import BatchAllocator
from .base import Memory, MemoryContext, MemoryStatus
from .kv_cache import KVCache, KVCacheContext, LayerShape

PAD = 256


def swa_cache_size(kv_size: int, n_swa: int, n_seq_max: int, n_ubatch: int) -> int:
    """Room for one window per sequence plus a ubatch, padded like llama.cpp."""
    size = min(kv_size, n_swa * n_seq_max + n_ubatch)
    return -(-size // PAD) * PAD


class KVCacheISWA(Memory):
    kind = "iswa"

    def __init__(self, layers: dict[int, LayerShape], swa_layers: set[int], kv_size: int, n_swa: int,
                 n_ubatch: int, n_seq_max: int = 1, type_k: str = "f32", type_v: str = "f32",
                 swa_full: bool = False):
        base_layers = {il: s for il, s in layers.items() if il not in swa_layers}
        window_layers = {il: s for il, s in layers.items() if il in swa_layers}
        swa_size = kv_size if swa_full else swa_cache_size(kv_size, n_swa, n_seq_max, n_ubatch)
        self.swa_layers = frozenset(swa_layers)
        self.base = KVCache(base_layers, kv_size, n_seq_max, type_k, type_v)
        self.swa = KVCache(window_layers, swa_size, n_seq_max, type_k, type_v, n_swa=n_swa)

    def init_batch(self, balloc: BatchAllocator, n_ubatch: int, embd_all: bool = False) -> "ISWAContext":
        ubatches = balloc.split_simple(n_ubatch)
        base_slots = self.base.prepare(ubatches)
        swa_slots = self.swa.prepare(ubatches)
        if base_slots is None or swa_slots is None:
            return ISWAContext(self, MemoryStatus.FAILED_PREPARE)
        return ISWAContext(self, MemoryStatus.SUCCESS, ubatches, base_slots, swa_slots)

    def clear(self) -> None:
        self.base.clear()
        self.swa.clear()

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return self.base.seq_rm(seq, p0, p1) and self.swa.seq_rm(seq, p0, p1)

    def seq_pos_min(self, seq: int) -> int:
        return self.swa.seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.swa.seq_pos_max(seq)

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.swa.nbytes


class ISWAContext(MemoryContext):
    def __init__(self, memory: KVCacheISWA, status: MemoryStatus, ubatches=None, base_slots=None, swa_slots=None):
        super().__init__(status, ubatches)
        self.memory = memory
        self.base = KVCacheContext(memory.base, status, ubatches, base_slots)
        self.swa = KVCacheContext(memory.swa, status, ubatches, swa_slots)

    def next(self) -> bool:
        self.base.next()
        self.swa.next()
        return super().next()

    def apply(self) -> None:
        self.base.apply()
        self.swa.apply()

    def layer(self, il: int) -> KVCacheContext:
        return self.swa if il in self.memory.swa_layers else self.base
