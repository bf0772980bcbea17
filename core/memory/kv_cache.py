"""The standard attention cache (llama_kv_cache): cell metadata on the host, per-layer K/V rows.

Each layer keeps K and V as `[stream, cell, row]` (see storage.py). One stream (`unified`) holds
every sequence, a cell can belong to several (a shared prefix); `split` gives each sequence its
own stream. A ubatch's tokens go to the cells `find_slot` picks, which need not be contiguous.
Layers listed in `swa_layers` see only the last `n_swa` positions; when every layer of the cache
is windowed, cells that all future tokens mask out are reused (the window cache of iSWA).
A layer whose V is a view of K (MLA) stores no V rows; a layer with an indexer (DSA) keeps its
indexer keys in the same cells, so every cell operation covers them.
"""

from __future__ import annotations

import functools

import numpy as np

from ..batch import POS_LIMIT, UBatch
from ..errors import InvalidInputError
from ..statefile import StateReader, StateWriter
from .base import AttnGroup, BoundAttnView, LoadedState, Memory, MemoryContext, MemoryStatus, open_range
from .masks import BlockBounds, BlockTopK, CausalMask, MaskProducer, WindowMask, hadamard
from .spec import AttnSpec
from .storage import KVStorage


class KVCells:
    """Position, sequence membership and pending shift of every cell of one stream."""

    def __init__(self, size: int, n_seq_max: int):
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.shift = np.zeros(size, dtype=np.int32)

    @property
    def size(self) -> int:
        return len(self.pos)

    def snapshot(self):
        return self.pos.copy(), self.seq.copy(), self.shift.copy()

    def restore(self, snap) -> None:
        self.pos[:], self.seq[:], self.shift[:] = snap

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

    def free(self, idxs) -> None:
        self.pos[idxs] = -1
        self.seq[idxs] = False
        self.shift[idxs] = 0

    def clear(self) -> None:
        self.free(slice(None))

    def in_range(self, seq: int, p0: int, p1: int) -> np.ndarray:
        hit = (self.pos >= p0) & (self.pos < p1)
        return hit & (self.seq.any(axis=1) if seq < 0 else self.seq[:, seq])

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        hit = self.in_range(seq, p0, p1)
        if seq < 0:
            self.seq[hit] = False
        else:
            self.seq[hit, seq] = False
        self.free(hit & ~self.seq.any(axis=1))


class KVCache(Memory):
    # an evicting cache (a plugin's) sets this: new tokens take the lowest free cells, so where they
    # go depends only on which cells are held, not on the order of earlier writes (a state loaded
    # whole continues as the original did, and the cells attention reads stay packed at the front)
    fills_lowest_free: bool = False

    def __init__(self, layers: dict[int, AttnSpec], kv_size: int, n_seq_max: int = 1, n_stream: int = 1,
                 type_k: str = "f32", type_v: str = "f32", n_swa: int = 0, swa_layers=frozenset(),
                 kind: str = "unified", producers: dict[int, MaskProducer] | None = None, xp=None, backend=None):
        xp = backend.xp if backend is not None and xp is None else xp
        self.kind = kind
        self.layers = layers
        self.kv_size, self.n_seq_max, self.n_stream = kv_size, n_seq_max, n_stream
        self.type_k, self.type_v = type_k, type_v
        self.n_swa, self.swa_layers = n_swa, frozenset(swa_layers) & frozenset(layers)
        self.reuses_cells = n_swa > 0 and bool(layers) and self.swa_layers == frozenset(layers)
        self.k = {il: KVStorage(n_stream, kv_size, s.k_width, type_k, xp) for il, s in layers.items()}
        self.v = {il: KVStorage(n_stream, kv_size, s.v_width, type_v, xp) for il, s in layers.items() if s.v_width}
        # indexer keys are stored like K (llama.cpp keeps them f16 beside the latent cache)
        self.idx = {il: KVStorage(n_stream, kv_size, s.indexer.head_dim, type_k, xp)
                    for il, s in layers.items() if s.indexer is not None}
        self.cells = [KVCells(kv_size, n_seq_max) for _ in range(n_stream)]
        self.heads = [0] * n_stream
        self.xp = xp if xp is not None else np
        self.backend = backend  # the fused mask ops of the block bounds, where it has them
        window, causal = WindowMask(n_swa), CausalMask()  # one each, so layers share their masks
        self.producers = {il: (producers or {}).get(il) or (window if il in self.swa_layers else causal)
                          for il in layers}
        self.bounds = {il: self._bounds_for(il, p) for il, p in self.producers.items() if isinstance(p, BlockTopK)}

    def seq_capacity(self) -> int | None:
        """A sequence's stream: the whole cache, or with one stream per sequence (--kv split) its own;
        no bound where cells out of the window are reused (iSWA's window cache wraps around)."""
        return None if self.reuses_cells else self.kv_size

    def _bounds_for(self, il: int, producer: "BlockTopK") -> BlockBounds:
        """Block bounds of layer il's keys, kept stale-marked by every write to its K storage."""
        store = self.k[il]
        bounds = BlockBounds(self.n_stream, self.kv_size, store.dim, producer.block, self.xp, self.backend)
        store.on_write = bounds.touch
        return bounds

    def layer_stores(self, il: int) -> list[tuple[str, KVStorage]]:
        """Layer il's stores in their state-file order: keys, values (unless a view), indexer keys."""
        named = (("keys", self.k), ("values", self.v), ("indexer keys", self.idx))
        return [(name, stores[il]) for name, stores in named if il in stores]

    @property
    def stores(self) -> list[KVStorage]:
        return [store for il in self.layers for _, store in self.layer_stores(il)]

    def stream_of(self, seq: int) -> int:
        return seq if self.n_stream > 1 else 0

    def _streams(self, seq: int) -> list[int]:
        return list(range(self.n_stream)) if seq < 0 else [self.stream_of(seq)]

    # ---- planning ------------------------------------------------------------------------

    @property
    def needs_equal_split(self) -> bool:
        return self.n_stream > 1

    def context(self, ubatches: list[UBatch], slots) -> "KVCacheContext":
        return KVCacheContext(self, MemoryStatus.SUCCESS, ubatches, slots)

    def prepare(self, ubatches: list[UBatch]):
        """Dry run: place every ubatch in turn (the (stream, cell) slots of each), then put the cells
        back as they were."""
        saved, saved_heads = [c.snapshot() for c in self.cells], list(self.heads)
        slots = []
        try:
            for ub in ubatches:
                self.make_room(ub)
                slot = self.find_slot(ub)
                if slot is None:
                    return None
                self.apply_ubatch(slot, ub)
                slots.append(slot)
        finally:
            for cells, snap in zip(self.cells, saved):
                cells.restore(snap)
            self.heads = saved_heads
        return slots

    @property
    def makes_room(self) -> bool:
        """This cache's class overrides make_room (it evicts or moves cells before a ubatch)."""
        return type(self).make_room is not KVCache.make_room

    def make_room(self, ub: UBatch) -> None:
        """Called before each ubatch is placed, when planning and again when applying it: where an
        evicting cache (a plugin's) frees cells or moves positions, with cell metadata only. A
        position moved here (`cells.shift`) has its keys re-rotated before the ubatch attends."""

    def extra_snapshot(self):
        """What a rollback restores besides cells and rows, taken before each ubatch is applied:
        statistics a cache of a plugin's keeps (H2O's attention scores); None: nothing."""
        return None

    def extra_restore(self, snapshot) -> None:
        """Put back what extra_snapshot took."""

    def find_slot(self, ub: UBatch) -> tuple[np.ndarray, np.ndarray] | None:
        """(stream, cell) for every token of the ubatch, or None when a stream is full."""
        streams = ub.seq_id.copy() if self.n_stream > 1 else np.zeros(ub.n_tokens, dtype=np.int32)
        cells = np.empty(ub.n_tokens, dtype=np.int64)
        for st in np.unique(streams):
            rows = np.flatnonzero(streams == st)
            idxs = self._find_cells(int(st), len(rows))
            if idxs is None:
                return None
            cells[rows] = idxs
        return streams, cells

    def _find_cells(self, st: int, n: int) -> np.ndarray | None:
        """Scan from the stream's head, wrapping, taking every usable cell."""
        cells, size = self.cells[st], self.kv_size
        if n > size:
            return None
        head = 0 if self.fills_lowest_free or self.heads[st] > cells.used() + 2 * n else self.heads[st]
        usable = cells.pos < 0
        if self.reuses_cells:
            usable |= self._out_of_window(cells)
        order = np.concatenate([np.arange(head, size), np.arange(0, head)])
        idxs = order[usable[order]][:n]
        return idxs if len(idxs) == n else None

    def _out_of_window(self, cells: KVCells) -> np.ndarray:
        """Cells that the next token of every sequence holding them already masks out of the window
        (never a sequence's last cell, which says where it continues)."""
        occupied = cells.pos >= 0
        next_pos = np.array([cells.seq_pos_max(s) + 1 for s in range(self.n_seq_max)], dtype=np.int64)
        nearest = np.where(cells.seq, next_pos[None, :], np.iinfo(np.int64).max).min(axis=1)
        return occupied & (nearest - cells.pos >= max(self.n_swa, 2))

    def apply_ubatch(self, slot, ub: UBatch) -> None:
        streams, cell_idx = slot
        for st in np.unique(streams):
            rows = streams == st
            self._place(int(st), cell_idx[rows], ub.pos[rows], ub.seq_id[rows])

    def _place(self, st: int, idxs: np.ndarray, pos: np.ndarray, seq: np.ndarray) -> None:
        cells = self.cells[st]
        evicted = idxs[cells.pos[idxs] >= 0]
        owners, where = np.nonzero(cells.seq[evicted].T)  # every (sequence, evicted cell) pair
        evicted_max = {int(s): int(cells.pos[evicted[where[owners == s]]].max()) for s in np.unique(owners)}
        cells.free(idxs)
        cells.pos[idxs] = pos
        cells.seq[idxs, seq] = True
        # keep every sequence's [pos_min, pos_max] dense: drop what precedes an evicted position
        for owner, pmax in evicted_max.items():
            pmin = cells.seq_pos_min(owner)
            if 0 <= pmin <= pmax:
                cells.seq_rm(owner, pmin, pmax + 1)
        self.heads[st] = int(idxs[-1]) + 1

    # ---- sequence operations -------------------------------------------------------------

    def clear(self) -> None:
        for cells in self.cells:
            cells.clear()
        self.heads = [0] * self.n_stream

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        p0, p1 = open_range(p0, p1)
        for st in self._streams(seq):
            self.cells[st].seq_rm(seq, p0, p1)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src == dst:
            return
        s_src, s_dst = self.stream_of(src), self.stream_of(dst)
        if s_src == s_dst:  # share the cells
            cells = self.cells[s_src]
            cells.seq[cells.in_range(src, *open_range(p0, p1)), dst] = True
            return
        if p0 >= 0 or p1 >= 0:
            raise InvalidInputError("with --kv split a sequence copy takes the whole sequence (no position range)")
        self._copy_stream(s_src, src, s_dst, dst)

    def _copy_stream(self, s_src: int, src: int, s_dst: int, dst: int) -> None:
        """Copy sequence src (cells and K/V rows) into the empty stream of dst."""
        source, target = self.cells[s_src], self.cells[s_dst]
        target.clear()
        idxs = np.flatnonzero(source.seq[:, src])
        target.pos[idxs], target.shift[idxs] = source.pos[idxs], source.shift[idxs]
        target.seq[idxs, dst] = True
        for store in self.stores:
            store.set_raw(s_dst, idxs, store.raw(s_src, idxs))
        self.heads[s_dst] = self.heads[s_src]

    def seq_keep(self, seq: int) -> None:
        for cells in self.cells:
            keep = cells.seq[:, seq].copy()
            cells.seq[:] = False
            cells.seq[keep, seq] = True
            cells.free(~keep)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        if delta == 0:
            return
        for st in self._streams(seq):
            cells = self.cells[st]
            hit = cells.in_range(seq, *open_range(p0, p1))
            cells.pos[hit] += delta
            cells.shift[hit] += delta
            cells.free(hit & (cells.pos < 0))

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        if d == 1:
            return
        for st in self._streams(seq):
            cells = self.cells[st]
            hit = cells.in_range(seq, *open_range(p0, p1))
            new_pos = cells.pos[hit] // d
            cells.shift[hit] += new_pos - cells.pos[hit]  # the rotation still owed to the keys
            cells.pos[hit] = new_pos

    def update(self, backend) -> bool:
        """The K-shift: rotate every cached key by its cell's accumulated position change, as its
        layer's rope spec says (RoPE composes: R(p + d) = R(d) R(p)); layers without rope keep theirs."""
        done = False
        for st, cells in enumerate(self.cells):
            idxs = np.flatnonzero((cells.shift != 0) & (cells.pos >= 0))
            if len(idxs):
                delta = cells.shift[idxs].astype(np.float32)
                tables = {}  # layers with the same rope share its table of the deltas
                for il, spec in self.layers.items():
                    if spec.rope is not None:
                        self._rotate(backend, st, idxs, self.k[il], spec.n_head_kv, spec.rope, delta, tables)
                    if spec.indexer is not None and spec.indexer.rope is not None:
                        basis = hadamard(spec.indexer.head_dim) if spec.indexer.hadamard else None
                        self._rotate(backend, st, idxs, self.idx[il], 1, spec.indexer.rope, delta, tables, basis)
                done = True
            cells.shift[:] = 0
        return done

    @staticmethod
    def _rotate(backend, st: int, idxs: np.ndarray, store: KVStorage, n_head: int, rope, delta: np.ndarray,
                tables: dict, basis: np.ndarray | None = None) -> None:
        """Rotate dims [offset, offset + n_rot) of every head of the cells' stored keys; keys stored
        in an orthonormal symmetric `basis` are taken out of it first and put back after."""
        keys = store.to_float(store.rows(st, idxs)).reshape(len(idxs), n_head, -1)
        keys = keys.astype(np.float32)  # a copy: the rope part is rotated in place
        if basis is not None:
            keys = keys @ backend.asarray(basis)
        key = (rope.n_rot, rope.base, rope.freq_scale)
        if key not in tables:
            tables[key] = backend.rope_cache(delta, rope.n_rot, rope.base, rope.freq_scale)
        table = tables[key]
        keys[..., rope.offset:] = backend.rope(keys[..., rope.offset:], table, neox=rope.neox)
        if basis is not None:
            keys = keys @ backend.asarray(basis)
        store.write(np.full(len(idxs), st), idxs, keys.reshape(len(idxs), -1))

    def seq_pos_min(self, seq: int) -> int:
        return self.cells[self.stream_of(seq)].seq_pos_min(seq)

    def seq_pos_max(self, seq: int) -> int:
        return self.cells[self.stream_of(seq)].seq_pos_max(seq)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.stores)

    # ---- state ---------------------------------------------------------------------------

    def _write_header(self, w: StateWriter) -> None:
        w.u32(self.n_stream)
        w.u32(self.kv_size)
        w.str(self.type_k)
        w.str(self.type_v)
        w.array(np.array(sorted(self.layers), dtype=np.int32))

    def _check_header(self, r: StateReader, seq: int | None) -> None:
        r.expect("the stream count", r.u32("the stream count"), self.n_stream)
        kv_size = r.u32("the cache size")
        if seq is None:
            r.expect("the cache size", kv_size, self.kv_size)
        r.expect("the K cache type", r.str("the K cache type"), self.type_k)
        r.expect("the V cache type", r.str("the V cache type"), self.type_v)
        layers = r.array("the layer list", np.int32)
        r.expect("the cached layers", layers.tolist(), sorted(self.layers))

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        if any(np.any(cells.shift[cells.pos >= 0]) for cells in self.cells):
            raise RuntimeError("a K-shift is pending: apply it (update) before writing the state")
        self._write_header(w)
        for st in (range(self.n_stream) if seq is None else [self.stream_of(seq)]):
            cells = self.cells[st]
            idxs = np.flatnonzero(cells.pos >= 0 if seq is None else cells.seq[:, seq])
            w.array(idxs.astype(np.int32))
            w.array(cells.pos[idxs])
            w.array(cells.seq[idxs] if seq is None else np.ones((len(idxs), 1), bool))
            for il in sorted(self.layers):
                for _, store in self.layer_stores(il):
                    w.array(store.raw(st, idxs))

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        """Read and check every stream; for one sequence also choose its cells now, so that the
        commit only writes."""
        self._check_header(r, seq)
        streams = [self._read_stream(r, st, seq) for st in (range(self.n_stream) if seq is None
                                                             else [self.stream_of(seq)])]
        if seq is None:
            pos_max = {s: max((int(pos[member[:, s]].max(initial=-1)) for _, _, pos, member, _ in streams),
                              default=-1) for s in range(self.n_seq_max)}
            return LoadedState(lambda: self._commit_full(streams), pos_max)
        st, _, pos, _, rows = streams[0]
        idxs = self._cells_for_sequence(st, seq, len(pos))
        return LoadedState(lambda: self._commit_seq(st, seq, idxs, pos, rows),
                           {seq: int(pos.max(initial=-1))})

    def _read_stream(self, r: StateReader, st: int, seq: int | None):
        idxs = r.array("the cell indices", np.int32)
        if idxs.ndim != 1:
            raise r.fail("the cell indices are not a list")
        n = len(idxs)
        pos = r.array("the cell positions", np.int32, (n,))
        member = r.array("the cell sequences", bool, (n, self.n_seq_max if seq is None else 1))
        check_cells(r, idxs, pos, member, self.kv_size if seq is None else None)
        if seq is None and self.n_stream > 1 and np.delete(member, st, axis=1).any():
            raise r.fail(f"stream {st} holds cells of other sequences")
        return st, idxs, pos, member, self._read_rows(r, n)

    def _cells_for_sequence(self, st: int, seq: int, n: int) -> np.ndarray:
        """Where a loaded sequence's n cells go: its own old cells, free ones, and (in a window
        cache) cells out of every owner's window; InvalidInputError when they do not fit."""
        cells = self.cells[st]
        snap = cells.snapshot()
        try:
            cells.seq_rm(seq, 0, np.iinfo(np.int32).max)
            usable = cells.pos < 0
            if self.reuses_cells:
                usable |= self._out_of_window(cells)
            idxs = np.flatnonzero(usable)[:n]
        finally:
            cells.restore(snap)
        if len(idxs) < n:
            raise InvalidInputError(f"no room for the {n} saved cells of sequence {seq} "
                                    f"({len(idxs)} usable cells)")
        return idxs

    def _read_rows(self, r: StateReader, n: int) -> dict[int, list[np.ndarray]]:
        return {il: [r.array(f"layer {il} {name}", store.data.dtype, (n, store.data.shape[2]))
                     for name, store in self.layer_stores(il)]
                for il in sorted(self.layers)}

    def _commit_full(self, streams) -> None:
        self.clear()
        for st, idxs, pos, member, rows in streams:
            cells = self.cells[st]
            cells.pos[idxs], cells.seq[idxs] = pos, member
            self._write_rows(st, idxs, rows)
            self.heads[st] = int(idxs[-1]) + 1 if len(idxs) else 0
        self._refresh_bounds()

    def _commit_seq(self, st: int, seq: int, idxs: np.ndarray, pos: np.ndarray, rows) -> None:
        self.cells[st].seq_rm(seq, 0, np.iinfo(np.int32).max)
        if len(idxs):
            self._place(st, idxs, pos, np.full(len(idxs), seq))
        self._write_rows(st, idxs, rows)
        self._refresh_bounds()

    def _refresh_bounds(self) -> None:
        """Block bounds of a loaded state are computed with the load, not by the first decode after it."""
        for il, bounds in self.bounds.items():
            for st, cells in enumerate(self.cells):
                bounds.refresh(st, self.k[il], cells.pos, bounds.lo.shape[1])

    def _write_rows(self, st: int, idxs: np.ndarray, rows) -> None:
        for il, arrays in rows.items():
            for (_, store), raw in zip(self.layer_stores(il), arrays):
                store.set_raw(st, idxs, raw)


def check_cells(r: StateReader, idxs: np.ndarray, pos: np.ndarray, member: np.ndarray, kv_size: int | None) -> None:
    """A stream's saved cells must be distinct cells of the cache, at valid positions, each held by
    a sequence that holds no other cell at the same position."""
    if len(np.unique(idxs)) != len(idxs):
        raise r.fail("a cell index appears twice")
    if np.any(idxs < 0) or (kv_size is not None and np.any(idxs >= kv_size)):
        raise r.fail("a cell index is outside the cache")
    if np.any((pos < 0) | (pos >= POS_LIMIT)):
        raise r.fail(f"a cell position is outside 0..{POS_LIMIT - 1}")
    if len(member) and not member.any(axis=1).all():
        raise r.fail("a cell belongs to no sequence")
    for s in range(member.shape[1]):
        held = pos[member[:, s]]
        if len(np.unique(held)) != len(held):
            raise r.fail("a sequence holds two cells at the same position")


class KVCacheContext(MemoryContext):
    def __init__(self, cache: KVCache, status: MemoryStatus, ubatches=None, slots=None):
        super().__init__(status, ubatches)
        self.cache, self.slots = cache, slots or []
        self._groups: list = []
        self._merged = None  # (cells, mask, cell positions) of the streams side by side
        self._undo = None

    def apply(self) -> None:
        """Commit the ubatch: make room (an evicting cache's choice may rest on statistics the
        ubatches before this one changed, so its slot is found again here; the count of free cells,
        which planning checked, is the same), re-rotate moved keys, place the tokens."""
        streams = np.unique(self.slots[self.index][0])
        self._undo = ([(int(st), self.cache.cells[st].snapshot(), self.cache.heads[st]) for st in streams], [],
                      self.cache.extra_snapshot())
        slot = self.slots[self.index]
        if self.cache.makes_room:  # a built-in cache's planned slot stands: nothing changed since planning
            self.cache.make_room(self.ubatch)
            slot = self.cache.find_slot(self.ubatch)
            if slot is None:
                raise RuntimeError(f"{self.cache.kind}: make_room left less room applying a ubatch than planning it")
            self.slots[self.index] = slot
        self._keep_rows(slot)
        if self.cache.makes_room:
            self._shift_keys()
        self.cache.apply_ubatch(slot, self.ubatch)
        self._groups, self._merged = [], None

    def _keep_rows(self, slot) -> None:
        """For a rollback: the rows of the cells the ubatch takes that held tokens before this apply
        (a window cache reuses cells; an evicting one frees them in make_room)."""
        streams, cells = slot
        for st, snap, _ in self._undo[0]:
            idxs = cells[streams == st]
            idxs = idxs[snap[0][idxs] >= 0]
            if len(idxs):
                self._undo[1].extend((store, st, idxs, store.raw(st, idxs)) for store in self.cache.stores)

    def _shift_keys(self) -> None:
        """Re-rotate the keys of cells make_room moved, keeping their rows for a rollback."""
        moved = [(st, np.flatnonzero((c.shift != 0) & (c.pos >= 0))) for st, c in enumerate(self.cache.cells)]
        moved = [(st, idxs) for st, idxs in moved if len(idxs)]
        if moved:
            self._undo[1].extend((store, st, idxs, store.raw(st, idxs)) for st, idxs in moved
                                 for store in self.cache.stores)
            self.cache.update(self.cache.backend)

    def rollback(self) -> None:
        if self._undo is None:
            return
        streams, rows, extra = self._undo
        if extra is not None:
            self.cache.extra_restore(extra)
        for st, snap, head in streams:
            self.cache.cells[st].restore(snap)
            self.cache.heads[st] = head
        for store, st, idxs, raw in rows:
            store.set_raw(st, idxs, raw)
        self._undo, self._groups, self._merged = None, [], None

    def layer(self, il: int) -> BoundAttnView:
        return BoundAttnView(self, il)

    def store(self, il: int, k: np.ndarray, v: np.ndarray | None = None, indexer_k: np.ndarray | None = None) -> None:
        """Write the ubatch's K/V rows (n_tokens, n_head_kv, head_dim) into its cells (no V where
        it is a view of K), and the indexer keys (n_tokens, head_dim) of an indexer layer."""
        streams, cells = self.slots[self.index]
        self.cache.k[il].write(streams, cells, k.reshape(len(cells), -1))
        if il in self.cache.v:
            self.cache.v[il].write(streams, cells, v.reshape(len(cells), -1))
        if il in self.cache.idx:
            if indexer_k is None:
                raise ValueError(f"layer {il} keeps indexer keys: store() needs them")
            self.cache.idx[il].write(streams, cells, indexer_k.reshape(len(cells), -1))

    def groups(self, il: int) -> list[AttnGroup]:
        """Per stream of the ubatch: its query rows, the cached K/V views, the causal mask and
        what the layer's mask producer needs. Rows of several streams under a positional mask
        (causal or window) make one group instead: the streams' cells side by side."""
        shape, producer, bounds = self.cache.layers[il], self.cache.producers[il], self.cache.bounds.get(il)
        if self._mergeable(il):
            return [self._merged_group(il)]
        out = []
        for st, rows, n_kv, mask in self._stream_masks():
            cells = self.cache.cells[st]
            k = self.cache.k[il].read(st, n_kv, shape.n_head_kv)
            v = self.cache.v[il].read(st, n_kv, shape.n_head_kv) if il in self.cache.v else k
            extra = {} if bounds is None else {"bounds": bounds.view(st, self.cache.k[il], cells.pos)}
            if il in self.cache.idx:
                extra["indexer_keys"] = self.cache.idx[il].read(st, n_kv, 1)
            observe = functools.partial(self.cache.observe_attention, il, st) if self.cache.observes_attention else None
            out.append(AttnGroup(rows, k, v, mask, self.ubatch.pos[rows], cells.pos[:n_kv], producer, extra, observe))
        return out

    def _mergeable(self, il: int) -> bool:
        """One attention call can serve the ubatch's streams together: their rows lie side by side
        in the storage, and the layer's mask depends on positions only (no statistics kept, no
        per-stream bounds or indexer keys). Block-quantized rows (q8_0, q4_0) stay per stream:
        attention converts what a call spans, and one call would span every stream."""
        return (self.cache.n_stream > 1 and type(self.cache.producers[il]) in (CausalMask, WindowMask)
                and il not in self.cache.bounds and il not in self.cache.idx and not self.cache.observes_attention
                and self.cache.k[il].qtype is None and len(self._stream_masks()) > 1)

    def _merged_group(self, il: int) -> AttnGroup:
        """Streams 0..s_last of layer il as one run of cells (stream s's cell c at s·kv_size + c),
        each row masked to its own stream's cells."""
        n_flat, mask, cell_pos = self._merged_mask()
        shape = self.cache.layers[il]
        k = self.cache.k[il].read_flat(n_flat, shape.n_head_kv)
        v = self.cache.v[il].read_flat(n_flat, shape.n_head_kv) if il in self.cache.v else k
        return AttnGroup(slice(None), k, v, mask, self.ubatch.pos, cell_pos, self.cache.producers[il])

    def _merged_mask(self):
        """The ubatch's streams' masks side by side (built once per ubatch, as the streams' own)."""
        if self._merged is None:
            kv_size, xp = self.cache.kv_size, self.cache.xp
            groups = self._stream_masks()
            last, _, n_last, _ = groups[-1]
            n_flat = last * kv_size + n_last
            mask = xp.full((self.ubatch.n_tokens, n_flat), -np.inf, dtype=np.float32)
            cell_pos = np.full(n_flat, -1, dtype=np.int32)
            for st, rows, n_kv, stream_mask in groups:
                mask[xp.asarray(rows)[:, None], xp.arange(st * kv_size, st * kv_size + n_kv)[None, :]] = stream_mask
                cell_pos[st * kv_size:st * kv_size + n_kv] = self.cache.cells[st].pos[:n_kv]
            self._merged = (n_flat, mask, cell_pos)
        return self._merged

    def _stream_masks(self):
        """Masks depend only on the ubatch and the cells, so each is built once per ubatch."""
        if not self._groups:
            streams, _ = self.slots[self.index]
            ub, groups = self.ubatch, []
            for st in np.unique(streams):
                rows = slice(None) if self.cache.n_stream == 1 else np.flatnonzero(streams == st)
                cells = self.cache.cells[int(st)]
                n_kv = cells.used_max_p1()
                mask = self.cache.xp.asarray(causal_mask(cells, ub.pos[rows], ub.seq_id[rows], n_kv))
                groups.append((int(st), rows, n_kv, mask))
            self._groups, self._merged = groups, None
        return self._groups


def causal_mask(cells: KVCells, pos: np.ndarray, seq_id: np.ndarray, n_kv: int) -> np.ndarray:
    """(n_tokens, n_kv): a token sees the cells of its own sequence at its position or before."""
    cell_pos = cells.pos[:n_kv]
    allowed = cells.seq[:n_kv][:, seq_id].T & (cell_pos[None, :] <= pos[:, None])
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))
