"""Interleaved sliding-window attention cache (llama_kv_cache_iswa): a full-size cache for the
global layers and a window-sized one for the sliding-window layers, fed the same ubatches."""

from __future__ import annotations

from ..batch import BatchAllocator
from ..errors import InvalidInputError
from ..statefile import StateReader, StateWriter
from .base import BoundAttnView, LoadedState, Memory, MemoryContext, MemoryStatus
from .kv_cache import KVCache, KVCacheContext
from .spec import AttnSpec

PAD = 256


def swa_cache_size(kv_size: int, n_swa: int, n_seq_max: int, n_ubatch: int) -> int:
    """Room for one window per sequence plus a ubatch, padded like llama.cpp."""
    size = min(kv_size, n_swa * n_seq_max + n_ubatch)
    return -(-size // PAD) * PAD


class KVCacheISWA(Memory):
    kind = "iswa"

    def __init__(self, layers: dict[int, AttnSpec], swa_layers: set[int], kv_size: int, n_swa: int,
                 n_ubatch: int, n_seq_max: int = 1, type_k: str = "f32", type_v: str = "f32",
                 swa_full: bool = False, producers=None, xp=None, backend=None):
        base_layers = {il: s for il, s in layers.items() if il not in swa_layers}
        window_layers = {il: s for il, s in layers.items() if il in swa_layers}
        swa_size = kv_size if swa_full else swa_cache_size(kv_size, n_swa, n_seq_max, n_ubatch)
        self.swa_full = swa_full
        self.base = KVCache(base_layers, kv_size, n_seq_max, 1, type_k, type_v, kind="iswa-base",
                            producers=producers, xp=xp, backend=backend)
        self.swa = KVCache(window_layers, swa_size, n_seq_max, 1, type_k, type_v, n_swa=n_swa,
                           swa_layers=window_layers, kind="iswa-window", xp=xp, backend=backend)
        self.children = (self.base, self.swa)

    def seq_capacity(self) -> int:
        return self.base.seq_capacity()  # the window cache wraps around

    def init_batch(self, balloc: BatchAllocator, n_ubatch: int) -> "ISWAContext":
        ubatches = balloc.split_simple(n_ubatch)
        base_slots = self.base.prepare(ubatches)
        swa_slots = self.swa.prepare(ubatches)
        if base_slots is None or swa_slots is None:
            return ISWAContext(self, MemoryStatus.FAILED_PREPARE)
        return ISWAContext(self, MemoryStatus.SUCCESS, ubatches, base_slots, swa_slots)

    def update(self, backend) -> bool:
        return any([child.update(backend) for child in self.children])

    def clear(self) -> None:
        for child in self.children:
            child.clear()

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return all([child.seq_rm(seq, p0, p1) for child in self.children])

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        for child in self.children:
            child.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        for child in self.children:
            child.seq_keep(seq)

    def _check_shift(self) -> None:
        if not self.can_shift:
            raise InvalidInputError("positions cannot be shifted in an iSWA cache whose window cache is smaller "
                                    "than the full one; use --swa-full")

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_shift()
        for child in self.children:
            child.seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self._check_shift()
        for child in self.children:
            child.seq_div(seq, p0, p1, d)

    def seq_pos_min(self, seq: int) -> int:
        return self.swa.seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.swa.seq_pos_max(seq)

    @property
    def can_shift(self) -> bool:
        """Shifting needs both caches to hold the same positions, i.e. --swa-full."""
        return self.base.kv_size == self.swa.kv_size

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.swa.nbytes

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        for child in self.children:
            child.state_write(w, seq)

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        """Both caches are read and placed before either is written, so a load applies whole or not at all."""
        base, window = (child.state_read(r, seq) for child in self.children)
        if base.pos_max != window.pos_max:
            raise r.fail("the full and the window cache end at different positions")
        return LoadedState(lambda: (base.commit(), window.commit()), base.pos_max)


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

    def rollback(self) -> None:
        self.base.rollback()
        self.swa.rollback()

    def layer(self, il: int) -> BoundAttnView:
        return (self.swa if il in self.memory.swa.layers else self.base).layer(il)
