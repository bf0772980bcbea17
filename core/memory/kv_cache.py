"""The standard attention cache (llama_kv_cache): cell metadata on the host, per-layer K/V rows.

K and V of layer il are arrays `[stream, cell, n_head_kv * head_dim]`; a ubatch's tokens go to
the cells `find_slot` picks, which need not be contiguous. With `n_swa > 0` the cache is a
sliding-window cache: cells that every future token masks out are reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..batch import BatchAllocator, UBatch
from ..errors import InvalidInputError
from .base import Memory, MemoryContext, MemoryStatus

CACHE_TYPES = {"f32": np.float32, "f16": np.float16}


def cache_dtype(name: str):
    try:
        return CACHE_TYPES[name]
    except KeyError:
        raise InvalidInputError(f"unsupported cache type '{name}' (supported: {', '.join(CACHE_TYPES)})") from None


@dataclass(frozen=True)
class LayerShape:
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int


class KVCells:
    """Position and sequence membership of every cell (-1 = empty)."""

    def __init__(self, size: int, n_seq_max: int):
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)

    @property
    def size(self) -> int:
        return len(self.pos)

    def snapshot(self):
        return self.pos.copy(), self.seq.copy()

    def restore(self, snap) -> None:
        self.pos[:], self.seq[:] = snap

    def used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    def used_max_p1(self) -> int:
        occupied = np.flatnonzero(self.pos >= 0)
        return int(occupied[-1]) + 1 if len(occupied) else 0

    def seq_pos_min(self, seq: int) -> int:
        member = self.seq[:, seq]
        return int(self.pos[member].min()) if member.any() else -1

    def seq_pos_max(self, seq: int) -> int:
        member = self.seq[:, seq]
        return int(self.pos[member].max()) if member.any() else -1

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = False

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        in_range = (self.pos >= p0) & (self.pos < p1)
        if seq < 0:
            self.seq[in_range] = False
        else:
            self.seq[in_range, seq] = False
        self.pos[in_range & ~self.seq.any(axis=1)] = -1


class KVCache(Memory):
    kind = "unified"

    def __init__(self, layers: dict[int, LayerShape], kv_size: int, n_seq_max: int = 1,
                 type_k: str = "f32", type_v: str = "f32", n_swa: int = 0):
        self.layers = layers
        self.kv_size, self.n_seq_max, self.n_swa = kv_size, n_seq_max, n_swa
        self.type_k, self.type_v = type_k, type_v
        dk, dv = cache_dtype(type_k), cache_dtype(type_v)
        self.k = {il: np.zeros((1, kv_size, s.n_head_kv * s.head_dim_k), dk) for il, s in layers.items()}
        self.v = {il: np.zeros((1, kv_size, s.n_head_kv * s.head_dim_v), dv) for il, s in layers.items()}
        self.cells = KVCells(kv_size, n_seq_max)
        self.head = 0

    # ---- planning ------------------------------------------------------------------------

    def init_batch(self, balloc: BatchAllocator, n_ubatch: int, embd_all: bool = False) -> "KVCacheContext":
        ubatches = balloc.split_simple(n_ubatch)
        slots = self.prepare(ubatches)
        if slots is None:
            return KVCacheContext(self, MemoryStatus.FAILED_PREPARE)
        return KVCacheContext(self, MemoryStatus.SUCCESS, ubatches, slots)

    def prepare(self, ubatches: list[UBatch]) -> list[np.ndarray] | None:
        """Dry run: place every ubatch in turn, then put the cells back as they were."""
        saved, saved_head = self.cells.snapshot(), self.head
        slots = []
        try:
            for ub in ubatches:
                idxs = self.find_slot(ub)
                if idxs is None:
                    return None
                self.apply_ubatch(idxs, ub)
                slots.append(idxs)
        finally:
            self.cells.restore(saved)
            self.head = saved_head
        return slots

    def find_slot(self, ub: UBatch) -> np.ndarray | None:
        """Cells for the ubatch's tokens: scan from the head, wrapping, taking every usable cell."""
        n, size = ub.n_tokens, self.kv_size
        if n > size:
            return None
        cells = self.cells
        head = 0 if self.head > cells.used() + 2 * n else self.head
        usable = cells.pos < 0
        if self.n_swa > 0:
            usable |= self._swa_reusable()
        order = np.concatenate([np.arange(head, size), np.arange(0, head)])
        idxs = order[usable[order]][:n]
        return idxs if len(idxs) == n else None

    def _swa_reusable(self) -> np.ndarray:
        """Cells of a single sequence that its next token already masks out of the window."""
        cells = self.cells
        single = (cells.pos >= 0) & (cells.seq.sum(axis=1) == 1)
        reusable = np.zeros(cells.size, dtype=bool)
        if single.any():
            owner = cells.seq[single].argmax(axis=1)
            next_pos = np.array([cells.seq_pos_max(s) + 1 for s in range(self.n_seq_max)])
            reusable[single] = next_pos[owner] - cells.pos[single] >= self.n_swa
        return reusable

    def apply_ubatch(self, idxs: np.ndarray, ub: UBatch) -> None:
        cells = self.cells
        evicted_max: dict[int, int] = {}
        for idx in idxs[cells.pos[idxs] >= 0]:
            owner = int(cells.seq[idx].argmax())
            evicted_max[owner] = max(evicted_max.get(owner, -1), int(cells.pos[idx]))
        cells.pos[idxs] = -1
        cells.seq[idxs] = False
        cells.pos[idxs] = ub.pos
        cells.seq[idxs, ub.seq_id] = True
        # keep every sequence's [pos_min, pos_max] dense: drop what precedes an evicted position
        for seq, pmax in evicted_max.items():
            pmin = cells.seq_pos_min(seq)
            if 0 <= pmin <= pmax:
                cells.seq_rm(seq, pmin, pmax + 1)
        self.head = int(idxs[-1]) + 1

    # ---- sequence operations -------------------------------------------------------------

    def clear(self) -> None:
        self.cells.clear()
        self.head = 0

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        p0 = 0 if p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        self.cells.seq_rm(seq, p0, p1)
        return True

    def seq_pos_min(self, seq: int) -> int:
        return self.cells.seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.cells.seq_pos_max(seq)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k.values()) + sum(a.nbytes for a in self.v.values())


class KVCacheContext(MemoryContext):
    def __init__(self, cache: KVCache, status: MemoryStatus, ubatches=None, slots=None):
        super().__init__(status, ubatches)
        self.cache, self.slots = cache, slots or []
        self.n_kv = 0
        self._mask = None

    def apply(self) -> None:
        self.cache.apply_ubatch(self.slots[self.index], self.ubatch)
        self.n_kv = self.cache.cells.used_max_p1()
        self._mask = None

    def layer(self, il: int) -> "KVCacheContext":
        return self

    def store(self, il: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write the ubatch's K/V rows (n_tokens, n_head_kv, head_dim) into its cells."""
        idxs = self.slots[self.index]
        self.cache.k[il][0, idxs] = k.reshape(len(idxs), -1)
        self.cache.v[il][0, idxs] = v.reshape(len(idxs), -1)

    def kv(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of the first n_kv cells as (n_kv, n_head_kv, head_dim)."""
        shape = self.cache.layers[il]
        k = self.cache.k[il][0, : self.n_kv].reshape(self.n_kv, shape.n_head_kv, shape.head_dim_k)
        v = self.cache.v[il][0, : self.n_kv].reshape(self.n_kv, shape.n_head_kv, shape.head_dim_v)
        return k, v

    @property
    def mask(self) -> np.ndarray:
        """(n_tokens, n_kv): 0 where a token may attend a cell, -inf elsewhere."""
        if self._mask is None:
            self._mask = causal_mask(self.cache.cells, self.ubatch, self.n_kv, self.cache.n_swa)
        return self._mask


def causal_mask(cells: KVCells, ub: UBatch, n_kv: int, n_swa: int = 0) -> np.ndarray:
    pos = cells.pos[:n_kv]
    allowed = cells.seq[:n_kv][:, ub.seq_id].T & (pos[None, :] <= ub.pos[:, None])
    if n_swa > 0:
        allowed &= (ub.pos[:, None] - pos[None, :]) < n_swa
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))
