"""Attention masks from producers. As in llama.cpp, sparsity lives in the mask (0 keep, -inf drop,
shared by every head) plus a bound `n_kv_max` on the kept cells of any row, which lets the
flash-attention op gather only those. A memory view hands the graph one producer per layer:

- `CausalMask`: the causal/sequence mask as it is (bound 0: no promise);
- `WindowMask`: only the last n_swa positions (sliding-window layers);
- `BlockTopK`: training-free block top-k (Quest): the keys of every block of B cells are bounded
  elementwise by their min and max, each query scores a block by the upper bound of q·k over it,
  and keeps its best blocks up to K cells, the first block (attention sink) and the last L positions.

A producer is called with a `MaskInput`; what it needs beyond the queries and the base mask comes
in `extra` (the block bounds here; the DeepSeek-3.2 indexer's keys later). Producers work in the
backend's array module, so on CUDA masks never leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

NEG_INF = np.float32(-np.inf)
# --attn auto applies a top-k selection only where a group attends this many cells or more, and
# at least TOPK_AUTO_RATIO times the cells the selection keeps. Measured with
# scripts/sparse_speed.py -d 2048,4096,8192 -k 0,1024 (docs/sparse-attention.md): pp512 with
# K = 1024 is 0.80x dense at d2048, 0.99x at d4096 (4608 cells, 4x the 1152 kept), 1.32x at d8192.
TOPK_AUTO_MIN_KV = 4096
TOPK_AUTO_RATIO = 5
# --sparse-local when not given (and at most K): a wider window of the latest positions measured
# better than 64 at the same K (docs/sparse-attention.md)
LOCAL_DEFAULT = 128


@dataclass
class MaskInput:
    """What a producer sees for one group of query rows of layer `il`."""
    il: int
    q: object  # (rows, n_head, d_k), after RoPE
    base: object  # (rows, n_kv) causal and sequence mask, 0 / -inf
    pos: np.ndarray  # (rows,) query positions
    cell_pos: np.ndarray  # (n_kv,) position of each cell, -1 for an empty one
    xp: object = np
    extra: dict = field(default_factory=dict)  # stores a producer reads ("bounds": a BlockBounds view)
    backend: object = None  # the context's backend: its fused mask op where it has one


class MaskProducer(Protocol):
    kind: str  # what -v calls it: "dense", "window", "top-k"
    uses_queries: bool  # False: the mask depends on the ubatch and cells only, so it can be shared by layers

    def __call__(self, inp: MaskInput) -> tuple[object, int]:
        """(mask (rows, n_kv), n_kv_max): the base mask with cells dropped, and the most cells any
        row can keep (0: no bound)."""


class CausalMask:
    kind, uses_queries = "dense", False

    def __call__(self, inp: MaskInput):
        return inp.base, 0


class WindowMask:
    kind, uses_queries = "window", False

    def __init__(self, n_swa: int):
        self.n_swa = n_swa

    def __call__(self, inp: MaskInput):
        xp = inp.xp
        inside = (xp.asarray(inp.pos)[:, None] - xp.asarray(inp.cell_pos)[None, :]) < self.n_swa
        return xp.where(inside, inp.base, NEG_INF), self.n_swa


@dataclass(frozen=True)
class SparseParams:
    """--sparse-topk K, --sparse-block B, --sparse-local L, --sparse-layers; topk 0: off."""
    topk: int = 0
    # chosen by scripts/sparse_quality.py on Hamlet at -c 4096 (docs/sparse-attention.md): the
    # tighter bounds of small blocks bring K = 1024 within 2% of dense PPL, where 32 and 64 do not
    block: int = 16
    local: int = -1  # -1: min(LOCAL_DEFAULT, topk)
    layers: str = "2-"  # the layers that select; the first two stay dense by default

    @property
    def n_local(self) -> int:
        """The last positions every selecting row keeps."""
        return min(LOCAL_DEFAULT, self.topk) if self.local < 0 else self.local

    def selects(self, il: int) -> bool:
        return self.topk > 0 and il in parse_layers(self.layers)


def parse_layers(spec: str) -> "LayerSet":
    """'2-' (layer 2 on), '0,3,5-9', 'all' or 'none' as a set of layer indices."""
    from ..errors import InvalidInputError

    spec = spec.strip()
    if spec in ("all", ""):
        return LayerSet([(0, None)])
    if spec == "none":
        return LayerSet([])
    ranges = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first = int(lo)
            last = (None if hi.strip() == "" else int(hi)) if dash else first
        except ValueError:
            raise InvalidInputError(f"--sparse-layers '{spec}': '{part}' is not a layer, a range A-B or an open range A-") from None
        if first < 0 or (last is not None and last < first):
            raise InvalidInputError(f"--sparse-layers '{spec}': '{part}' is not a valid range")
        ranges.append((first, last))
    return LayerSet(ranges)


@dataclass(frozen=True)
class LayerSet:
    ranges: list

    def __contains__(self, il: int) -> bool:
        return any(first <= il and (last is None or il <= last) for first, last in self.ranges)


class BlockTopK:
    """Keep per query row: its best-scoring blocks up to `topk` cells (the first visible block
    always among them), plus the last `local` positions; rows that see at most `topk` cells keep
    them all. A block wholly inside the local window is not ranked, so no pick is spent on it. A row keeps at most topk + local cells, the bound given to the attention op."""
    kind, uses_queries = "top-k", True

    def __init__(self, topk: int, block: int, local: int, min_kv: int = 0):
        self.topk, self.block, self.local = topk, block, local
        self.min_kv = min_kv  # --attn auto: groups over fewer cells stay dense

    @property
    def n_kv_max(self) -> int:
        return self.topk + self.local

    def applies(self, n_kv: int) -> bool:
        return n_kv >= self.min_kv

    def __call__(self, inp: MaskInput):
        if not self.applies(inp.base.shape[1]):
            return inp.base, 0
        fused = inp.backend is not None and inp.backend.supports("BLOCK_TOPK_MASK")
        mask = self.fused_mask(inp) if fused else self.mask(inp)
        return mask, self.n_kv_max

    def mask(self, inp: MaskInput):
        """The selection in array operations: the reference, and the CuPy path."""
        xp, base = inp.xp, inp.base
        visible = xp.isfinite(base)
        dense_rows = visible.sum(axis=1) <= self.topk
        if bool(dense_rows.all()):
            return base
        local = (xp.asarray(inp.pos)[:, None] - xp.asarray(inp.cell_pos)[None, :]) < self.local
        keep = self._chosen_cells(inp, visible, visible & ~local) | local
        keep |= dense_rows[:, None]
        return xp.where(keep, base, NEG_INF)

    def fused_mask(self, inp: MaskInput) -> np.ndarray:
        """The same selection in one pass of the backend's BLOCK_TOPK_MASK (on the CPU forty NumPy
        calls cost more than the attention they save on a decoded token)."""
        n_kv = inp.base.shape[1]
        lo, hi = inp.extra["bounds"].block_bounds(-(-n_kv // self.block))
        return inp.backend.block_topk_mask(inp.q, inp.base, inp.pos, inp.cell_pos, lo, hi, self.topk, self.block,
                                           self.local)

    def _chosen_cells(self, inp: MaskInput, visible, far):
        """(rows, n_kv) True on the cells of each row's chosen blocks. Only blocks with a visible
        cell outside the local window (`far`) are ranked: the others are kept anyway."""
        xp, B = inp.xp, self.block
        rows, n_kv = visible.shape
        n_blocks = -(-n_kv // B)
        seen, ranked = (self._per_block(x, n_blocks, xp) for x in (visible, far))
        scores = upper_bound_scores(inp.q, *inp.extra["bounds"].block_bounds(n_blocks), xp)
        scores = xp.where(ranked, scores, -np.inf)
        scores[xp.arange(rows), xp.argmax(seen, axis=1)] = np.inf  # the sink: each row's first block
        n_pick = min(self.topk // B, n_blocks)
        picked = xp.argpartition(-scores, n_pick - 1, axis=1)[:, :n_pick]
        chosen = xp.zeros((rows, n_blocks), dtype=bool)
        chosen[xp.arange(rows)[:, None], picked] = True
        chosen &= seen
        return xp.repeat(chosen, B, axis=1)[:, :n_kv]

    def _per_block(self, cells, n_blocks: int, xp):
        """(rows, n_blocks): whether any of a block's cells is set."""
        rows, n_kv = cells.shape
        padded = xp.zeros((rows, n_blocks * self.block), dtype=bool)
        padded[:, :n_kv] = cells
        return padded.reshape(rows, n_blocks, self.block).any(axis=2)


class IndexerTopK:
    """DeepSeek-3.2's lightning indexer: each query scores every visible cached indexer key,
    score(t, j) = Σ_h w[t, h]·ReLU(q[t, h]·k[j]), and keeps its top_k keys (all of them while it
    sees at most top_k). Reads `indexer_keys` (n_kv, 1, d) from the memory and `indexer_q`,
    `indexer_w` from the layer's graph."""
    kind, uses_queries = "indexer", True

    def __init__(self, top_k: int):
        self.top_k = top_k

    def __call__(self, inp: MaskInput):
        e, xp = inp.extra, inp.xp
        keys = e["indexer_keys"] if inp.backend is None else inp.backend.cache_rows_f32(e["indexer_keys"])
        scores = indexer_scores(e["indexer_q"], e["indexer_w"], keys, xp)
        return top_k_mask(scores, inp.base, self.top_k, xp), self.top_k


def hadamard(n: int) -> np.ndarray:
    """The n×n Sylvester Hadamard matrix scaled to be orthonormal (and its own inverse); n a power of two."""
    h = np.ones((1, 1), dtype=np.float32)
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.float32(np.sqrt(n))


def indexer_scores(q, w, keys, xp=np):
    """(rows, n_kv): Σ_h w[r, h]·ReLU(q[r, h]·k[j]) for q (rows, n_head, d), w (rows, n_head),
    keys (n_kv, 1, d) as float rows (Backend.cache_rows_f32 of the cached ones), in float32."""
    rows, n_head, d = q.shape
    keys = xp.asarray(keys, dtype=np.float32).reshape(-1, d)
    dots = xp.maximum(xp.asarray(q, dtype=np.float32).reshape(rows * n_head, d) @ keys.T, 0)
    return xp.matmul(xp.asarray(w, dtype=np.float32)[:, None, :], dots.reshape(rows, n_head, -1))[:, 0]


def top_k_mask(scores, base, k: int, xp=np):
    """The base mask (0 / -inf) with each row cut to its k best-scoring visible cells; a row that
    sees at most k cells keeps them all."""
    visible = xp.isfinite(base)
    if len(base) == 0 or int(visible.sum(axis=1).max()) <= k:
        return base
    ranked = xp.where(visible, scores, -np.inf)
    best = xp.argpartition(-ranked, k - 1, axis=1)[:, :k]
    keep = xp.zeros(base.shape, dtype=bool)
    keep[xp.arange(len(base))[:, None], best] = True
    return xp.where(keep & visible, base, NEG_INF)


# ---- block bounds ----------------------------------------------------------------------------

def block_min_max(keys, occupied, block: int, xp):
    """Elementwise (min, max) of keys (n_blocks·block, width) over the occupied rows of each block;
    a block with none gets zeros (its cells are masked anyway)."""
    n = keys.shape[0] // block
    occ = occupied.reshape(n, block, 1)
    k = keys.reshape(n, block, -1)
    lo = xp.where(occ, k, np.inf).min(axis=1)
    hi = xp.where(occ, k, -np.inf).max(axis=1)
    empty = ~occ.any(axis=1)  # (n, 1)
    return xp.where(empty, 0.0, lo).astype(np.float32), xp.where(empty, 0.0, hi).astype(np.float32)


def upper_bound_scores(q, lo, hi, xp):
    """(rows, n_blocks): Σ over query heads and dims of max(q·min, q·max) against the bounds
    (n_blocks, n_head_kv·d) of each query head's KV head. max(q·a, q·b) = q⁺·b + q⁻·a for a ≤ b,
    and the sum over the query heads of a group can be taken before the product."""
    rows, n_head, d = q.shape
    n_head_kv = lo.shape[1] // d
    qg = xp.asarray(q, dtype=np.float32).reshape(rows, n_head_kv, n_head // n_head_kv, d)
    q_pos = xp.maximum(qg, 0).sum(axis=2).reshape(rows, -1)
    q_neg = xp.minimum(qg, 0).sum(axis=2).reshape(rows, -1)
    return q_pos @ hi.T + q_neg @ lo.T


class BlockBounds:
    """Per stream, block of `block` cells and key dim: the min and max of one layer's stored keys
    over the occupied cells. Key writes mark their blocks stale (the storage calls `touch`); cells
    that became empty or full since the last refresh are found by comparing positions, so every
    sequence edit, shift, state load and rollback is covered without hooks of its own. Stale blocks
    are recomputed from the cache when a producer asks."""

    def __init__(self, n_stream: int, kv_size: int, width: int, block: int, xp=np, backend=None):
        self.block, self.kv_size, self.xp = block, kv_size, xp
        self.backend = backend  # its fused BLOCK_BOUNDS where it has one; else array operations
        n_blocks = -(-kv_size // block)
        self.lo = xp.zeros((n_stream, n_blocks, width), dtype=np.float32)
        self.hi = xp.zeros((n_stream, n_blocks, width), dtype=np.float32)
        self.stale = np.ones((n_stream, n_blocks), dtype=bool)
        self.seen_pos = np.full((n_stream, kv_size), -1, dtype=np.int32)

    def touch(self, streams, cells) -> None:
        self.stale[np.asarray(streams), np.asarray(cells) // self.block] = True

    def refresh(self, st: int, store, cell_pos: np.ndarray, n_blocks: int) -> None:
        if self.backend is not None and self.backend.supports("BLOCK_BOUNDS", (store.type_name,)):
            self.backend.block_bounds(store.data[st], cell_pos, self.seen_pos[st], self.stale[st], self.block, n_blocks,
                                      self.lo[st], self.hi[st])  # rows read where they lie, in one call
            return
        changed = np.flatnonzero(cell_pos != self.seen_pos[st])
        self.stale[st, changed // self.block] = True
        self.seen_pos[st] = cell_pos
        blocks = np.flatnonzero(self.stale[st, :n_blocks])
        if not len(blocks):
            return
        cells = (blocks[:, None] * self.block + np.arange(self.block)).reshape(-1)
        inside = cells < self.kv_size
        cells = np.minimum(cells, self.kv_size - 1)
        keys = store.to_float(store.rows(st, cells))
        occupied = self.xp.asarray(inside & (cell_pos[cells] >= 0))
        lo, hi = block_min_max(keys, occupied, self.block, self.xp)
        sel = self.xp.asarray(blocks)
        self.lo[st, sel], self.hi[st, sel] = lo, hi
        self.stale[st, blocks] = False

    def view(self, st: int, store, cell_pos: np.ndarray) -> "StreamBounds":
        return StreamBounds(self, st, store, cell_pos)


@dataclass
class StreamBounds:
    """One stream's bounds, refreshed on first use (a producer that never scores pays nothing)."""
    bounds: BlockBounds
    st: int
    store: object
    cell_pos: np.ndarray

    def block_bounds(self, n_blocks: int):
        """(lo, hi) of the first n_blocks blocks, (n_blocks, n_head_kv·d_k), brought up to date."""
        b = self.bounds
        b.refresh(self.st, self.store, self.cell_pos, n_blocks)
        return b.lo[self.st, :n_blocks], b.hi[self.st, :n_blocks]


@dataclass
class KeyBounds:
    """Bounds computed on the spot from keys at hand (the cache-less context's batch keys)."""
    keys: object  # (n_kv, n_head_kv, d_k)
    block: int
    xp: object = np

    def block_bounds(self, n_blocks: int):
        xp, n = self.xp, self.keys.shape[0]
        keys = xp.zeros((n_blocks * self.block, self.keys[0].size), dtype=np.float32)
        keys[:n] = self.keys.reshape(n, -1)
        occupied = xp.arange(n_blocks * self.block) < n
        return block_min_max(keys, occupied, self.block, xp)
