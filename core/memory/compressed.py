"""DeepSeek-V4's compressed rows (llama_kv_cache_dsv4's CSA, HCA and indexer caches with their
compressor states), as a memory of their own beside a window cache (memory/dsv4.py).

Per layer and kind of row ("attn"; "indexer" where the layer has a lightning indexer) each sequence
keeps its compressed rows, row j pooling the tokens of block j (positions ratio·j … ratio·j +
ratio − 1; the ratio-4 kind the block before as well), in the cache type; and a ring of its latest
`state_size` per-token projections (kv and gate score), where the tokens of an unfinished block wait
for the ubatch that finishes it. A query of the sequence at position p sees row j when
j < (p + 1) // ratio: the token that completes a block sees it.

Everything is a pure function of the sequence's tokens: positions are token counts (a sequence
starts at 0), and only whole sequences are removed or copied. The memory knows no weights: the
model projects the ubatch's tokens, asks `compressor_input` for the candidates of each block the
ubatch completes, pools and normalises them and gives the rows to `store_rows`; `extend` then sets
a layer's visible rows beside the keys of a window-cache group (keys concatenated, masks side by
side), with the indexer's top-k as the mask producer where the layer has one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend.weights import BlockRows
from ..batch import UBatch
from ..errors import InvalidInputError
from ..statefile import StateReader, StateWriter
from .base import AttnGroup, LoadedState, Memory, MemoryContext, MemoryStatus
from .masks import NEG_INF, CausalMask, MaskInput, indexer_scores, top_k_mask
from .spec import AttnSpec, CompressSpec
from .storage import KVStorage


@dataclass
class Blocks:
    """The blocks a ubatch completes for one layer and kind of row: each one's sequence and row,
    the position its rope takes (the block's first), and its candidates, kv and gate scores
    (n_blocks, n_candidates, width): the model pools them with a softmax over the candidates."""
    seq: np.ndarray
    row: np.ndarray
    pos: np.ndarray
    kv: object
    score: object


class CompressorStore:
    """One layer's rows of one kind for every sequence, and its compressor's ring."""

    def __init__(self, ratio: int, width: int, overlap: bool, n_seq: int, n_rows: int, type_k: str, xp):
        self.ratio, self.width, self.overlap = ratio, width, overlap
        self.state_size = 2 * ratio if overlap else ratio
        proj = 2 * width if overlap else width
        self.rows = KVStorage(n_seq, n_rows, width, type_k, xp)
        self.ring_kv = xp.zeros((n_seq, self.state_size, proj), dtype=np.float32)
        self.ring_score = xp.zeros((n_seq, self.state_size, proj), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.ring_kv.nbytes + self.ring_score.nbytes

    def n_rows(self, n_pos: int) -> int:
        """Rows a sequence of n_pos tokens has completed."""
        return n_pos // self.ratio


def layer_stores(spec: CompressSpec) -> dict[str, tuple[int, int, bool]]:
    """(ratio, width, overlap) of each kind of row a compressed layer keeps."""
    kinds = {"attn": (spec.ratio, spec.width, spec.overlap)}
    if spec.indexer is not None:
        kinds["indexer"] = (spec.ratio, spec.indexer.head_dim, spec.overlap)
    return kinds


class CompressedMemory(Memory):
    """The compressed rows and compressor rings of every compressed layer, per sequence."""
    kind = "dsv4-compressed"
    refusal_subject = "DeepSeek-V4's compressed rows"

    def __init__(self, layers: dict[int, AttnSpec], n_seq_max: int, n_ctx_seq: int, type_k: str = "f32", xp=np):
        self.layers, self.n_seq_max, self.capacity, self.type_k, self.xp = layers, n_seq_max, n_ctx_seq, type_k, xp
        self.stores = {(il, kind): CompressorStore(ratio, width, overlap, n_seq_max, -(-n_ctx_seq // ratio), type_k, xp)
                       for il, spec in sorted(layers.items()) for kind, (ratio, width, overlap)
                       in layer_stores(spec.compress).items()}
        self.n_pos = np.zeros(n_seq_max, dtype=np.int64)  # tokens each sequence holds: its next position

    # ---- planning ------------------------------------------------------------------------

    def prepare(self, ubatches: list[UBatch]):
        """Every ubatch continues its sequences within their capacity (None: one does not fit)."""
        n_pos = self.n_pos.copy()
        for ub in ubatches:
            for s in np.unique(ub.seq_id):
                pos = ub.pos[ub.seq_id == s]
                if int(pos[0]) != n_pos[s] or int(pos[-1]) >= self.capacity:
                    return None
                n_pos[s] = int(pos[-1]) + 1
        return True

    def context(self, ubatches: list[UBatch], placement) -> "CompressedContext":
        return CompressedContext(self, ubatches)

    def start_refusal(self, seq: int, pos: int) -> str:
        return first_position_refusal(seq, pos) if self.n_pos[seq] == 0 else ""

    # ---- sequence operations -------------------------------------------------------------

    def clear(self) -> None:
        self.n_pos[:] = 0

    def removal_refusal(self, seq: int, p0: int = -1, p1: int = -1) -> str:
        """Only whole sequences go (a removal past a sequence's end removes nothing)."""
        p0 = max(p0, 0)
        if p1 < 0 and p0 == 0:
            return ""
        ends = self.n_pos if seq < 0 else self.n_pos[seq:seq + 1]
        if p1 < 0 and np.all(p0 >= ends):
            return ""
        return (f"{self.refusal_subject} are pooled from whole blocks of a sequence and its compressor holds the "
                f"latest tokens, so only a whole sequence can be removed, not positions {p0}..{'end' if p1 < 0 else p1 - 1}")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        self.refusal = self.removal_refusal(seq, p0, p1)
        if self.refusal:
            return False
        if max(p0, 0) == 0:
            self.n_pos[slice(None) if seq < 0 else seq] = 0
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if p0 > 0 or p1 >= 0:
            raise InvalidInputError(f"{self.refusal_subject} copy a whole sequence, not a range of positions")
        if src == dst:
            return
        for store in self.stores.values():
            n = store.n_rows(int(self.n_pos[src]))
            cells = np.arange(n)
            store.rows.set_raw(dst, cells, store.rows.raw(src, cells))
            store.ring_kv[dst], store.ring_score[dst] = store.ring_kv[src], store.ring_score[src]
        self.n_pos[dst] = self.n_pos[src]

    def seq_keep(self, seq: int) -> None:
        kept = self.n_pos[seq]
        self.n_pos[:] = 0
        self.n_pos[seq] = kept

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        if delta:
            raise InvalidInputError(f"{self.refusal_subject} are indexed by position: positions cannot move")

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        if d != 1:
            raise InvalidInputError(f"{self.refusal_subject} are indexed by position: positions cannot move")

    def seq_pos_min(self, seq: int) -> int:
        """The last position, as llama.cpp says: no earlier position can be restarted from."""
        return self.seq_pos_max(seq)

    def seq_pos_max(self, seq: int) -> int:
        return int(self.n_pos[seq]) - 1

    def seq_capacity(self) -> int | None:
        return self.capacity

    @property
    def shift_refusal(self) -> str:
        return (f"{self.refusal_subject} pool whole blocks of positions and their compressors hold the latest "
                "tokens, so no part of a sequence can be dropped or moved")

    @property
    def nbytes(self) -> int:
        return sum(store.nbytes for store in self.stores.values())

    # ---- state files ---------------------------------------------------------------------

    def _write_header(self, w: StateWriter) -> None:
        w.str(self.type_k)
        w.array(np.array([(il, store.ratio, store.width) for (il, _), store in self.stores.items()], dtype=np.int32))

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        self._write_header(w)
        for s in range(self.n_seq_max) if seq is None else [seq]:
            n_pos = int(self.n_pos[s])
            w.array(np.array([n_pos], dtype=np.int64))
            for store in self.stores.values():
                w.array(store.rows.raw(s, np.arange(store.n_rows(n_pos))))
                w.array(_host(store.ring_kv[s]))
                w.array(_host(store.ring_score[s]))

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        r.expect("the compressed rows' cache type", r.str("the compressed rows' cache type"), self.type_k)
        layout = r.array("the compressed layers", np.int32)
        r.expect("the compressed layers", layout.tolist(),
                 [[il, store.ratio, store.width] for (il, _), store in self.stores.items()])
        parts = [(s, *self._read_sequence(r, s)) for s in (range(self.n_seq_max) if seq is None else [seq])]

        def commit():
            if seq is None:
                self.clear()
            for s, n_pos, arrays in parts:
                for store, (rows, ring_kv, ring_score) in zip(self.stores.values(), arrays):
                    store.rows.set_raw(s, np.arange(len(rows)), rows)
                    store.ring_kv[s], store.ring_score[s] = self.xp.asarray(ring_kv), self.xp.asarray(ring_score)
                self.n_pos[s] = n_pos
        return LoadedState(commit, {s: n_pos - 1 for s, n_pos, _ in parts})

    def _read_sequence(self, r: StateReader, s: int):
        n_pos = int(r.array("a sequence's token count", np.int64, (1,))[0])
        if not 0 <= n_pos <= self.capacity:
            raise r.fail(f"sequence {s} holds {n_pos} tokens, more than a sequence's {self.capacity} here")
        arrays = []
        for (il, kind), store in self.stores.items():
            width = store.rows.data.shape[2]
            rows = r.array(f"layer {il}'s {kind} rows", store.rows.data.dtype, (store.n_rows(n_pos), width))
            shape = store.ring_kv.shape[1:]
            arrays.append((rows, r.array(f"layer {il}'s {kind} compressor kv", np.float32, shape),
                           r.array(f"layer {il}'s {kind} compressor scores", np.float32, shape)))
        return n_pos, arrays


def first_position_refusal(seq: int, pos: int) -> str:
    """Why a sequence of compressed layers cannot start at `pos` ("": it can)."""
    if pos == 0:
        return ""
    return (f"sequence {seq} starts at position {pos}: DeepSeek-V4's compressed rows index a sequence's tokens "
            "from position 0 (each row pools one block of positions)")


def _host(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


class CompressedContext(MemoryContext):
    """One batch through the compressed rows: apply() advances the ubatch's sequences; the graph
    then reads candidates and writes rows and rings, each write kept for a rollback."""

    def __init__(self, memory: CompressedMemory, ubatches: list[UBatch]):
        super().__init__(MemoryStatus.SUCCESS, ubatches)
        self.memory = memory
        self._undo = None

    def apply(self) -> None:
        ub = self.ubatch
        self._undo = (self.memory.n_pos.copy(), [])
        for s in np.unique(ub.seq_id):
            self.memory.n_pos[s] = int(ub.pos[ub.seq_id == s][-1]) + 1

    def rollback(self) -> None:
        if self._undo is None:
            return
        n_pos, writes = self._undo
        for restore in reversed(writes):
            restore()
        self.memory.n_pos[:] = n_pos
        self._undo = None

    def layer(self, il: int):
        raise RuntimeError("compressed rows are read through a window cache's layer view (memory/dsv4.py)")

    def compressor_input(self, il: int, kind: str, kv, score) -> Blocks | None:
        """The candidates of every block this ubatch completes in layer il's `kind` rows, from the
        ubatch's projections (n_tokens, proj) and the ring; then the ring takes the ubatch's tokens.
        None where no block completes."""
        store, ub, xp = self.memory.stores[(il, kind)], self.ubatch, self.memory.xp
        r = store.ratio
        done = np.flatnonzero((ub.pos + 1) % r == 0)
        blocks = None
        if len(done):
            start = ub.pos[done] + 1 - r
            cand = start[:, None] + np.arange(-r if store.overlap else 0, r)[None, :]
            src = self._sources(store, ub, np.broadcast_to(ub.seq_id[done][:, None], cand.shape), cand)
            kv_all = xp.concatenate([kv, store.ring_kv.reshape(-1, kv.shape[1]), xp.zeros((1, kv.shape[1]), np.float32)])
            score_all = xp.concatenate([score, store.ring_score.reshape(-1, kv.shape[1]),
                                        xp.full((1, kv.shape[1]), NEG_INF, np.float32)])
            ckv, cscore = kv_all[xp.asarray(src)], score_all[xp.asarray(src)]
            if store.overlap:  # the block before gives its first halves, this block its second
                w = store.width
                ckv = xp.concatenate([ckv[:, :r, :w], ckv[:, r:, w:]], axis=1)
                cscore = xp.concatenate([cscore[:, :r, :w], cscore[:, r:, w:]], axis=1)
            blocks = Blocks(ub.seq_id[done].astype(np.int64), ub.pos[done] // r, start.astype(np.int32), ckv, cscore)
        self._keep_in_ring(store, ub, kv, score)
        return blocks

    @staticmethod
    def _sources(store: CompressorStore, ub: UBatch, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Where each candidate's projection is, in [ubatch rows | ring rows | the zero row]: a
        position of the ubatch is its row, an earlier one its ring slot, a negative one (the block
        before the first) the zero row with a -inf score."""
        n_ub, size = ub.n_tokens, store.state_size
        src = np.where(pos < 0, n_ub + store.ring_kv.shape[0] * size, n_ub + seq * size + pos % size)
        for s in np.unique(seq):
            rows = np.flatnonzero(ub.seq_id == s)
            first = int(ub.pos[rows[0]])
            mine = (seq == s) & (pos >= first)
            src[mine] = rows[pos[mine] - first]
        return src

    def _keep_in_ring(self, store: CompressorStore, ub: UBatch, kv, score) -> None:
        """The ring takes each sequence's latest state_size tokens of the ubatch, at slot pos % size."""
        xp = self.memory.xp
        for s in np.unique(ub.seq_id):
            rows = np.flatnonzero(ub.seq_id == s)[-store.state_size:]
            slots = ub.pos[rows] % store.state_size
            old = (store.ring_kv[s, slots].copy(), store.ring_score[s, slots].copy())

            def restore(s=s, slots=slots, old=old):
                store.ring_kv[s, slots], store.ring_score[s, slots] = old
            self._undo[1].append(restore)
            store.ring_kv[s, slots] = kv[xp.asarray(rows)]
            store.ring_score[s, slots] = score[xp.asarray(rows)]

    def store_rows(self, il: int, kind: str, blocks: Blocks, rows) -> None:
        """Write the pooled rows (n_blocks, width) of `blocks` into layer il's `kind` rows."""
        storage = self.memory.stores[(il, kind)].rows
        for s in np.unique(blocks.seq):
            cells = blocks.row[blocks.seq == s]
            old = storage.raw(int(s), cells)
            self._undo[1].append(lambda s=int(s), cells=cells, old=old: storage.set_raw(s, cells, old))
        storage.write(blocks.seq, blocks.row, rows)

    def extend(self, il: int, group: AttnGroup, xp) -> AttnGroup:
        """Layer il's window-cache group with the visible compressed rows of its rows' sequences
        after the window's keys: the window mask beside each row's own sequence's rows j <
        (p + 1) // ratio, and the indexer's top-k over them as the mask where the layer has one."""
        spec = self.memory.layers[il].compress
        raw_mask, raw_bound = group.producer(MaskInput(il, None, group.mask, group.pos, group.cell_pos, xp))
        row_seq, row_pos = self.ubatch.seq_id[group.rows], np.asarray(group.pos)
        visible = (row_pos + 1) // spec.ratio
        segments = [(int(s), int(visible[row_seq == s].max())) for s in np.unique(row_seq)]
        columns = np.concatenate([np.full(n, s) for s, n in segments] + [np.empty(0, np.int64)])
        column_row = np.concatenate([np.arange(n) for _, n in segments] + [np.empty(0, np.int64)])
        seen = (columns[None, :] == row_seq[:, None]) & (column_row[None, :] < visible[:, None])
        mask = xp.concatenate([raw_mask, xp.asarray(np.where(seen, np.float32(0), NEG_INF))], axis=1)
        keys = concat_rows([group.keys, *self._rows(il, "attn", segments)], xp)  # the window's, then each sequence's
        cell_pos = np.concatenate([np.asarray(group.cell_pos), (column_row * spec.ratio).astype(np.int32)])
        extra, producer = {}, CausalMask()
        if spec.indexer is not None:
            producer = CompressedTopK(spec.indexer.top_k)
            extra = {"indexer_keys": concat_rows(self._rows(il, "indexer", segments) or [self._no_rows(il)], xp),
                     "n_raw": group.keys.shape[0], "raw_bound": raw_bound}
        return AttnGroup(group.rows, keys, keys, mask, group.pos, cell_pos, producer, extra)

    def _no_rows(self, il: int):
        """No indexer keys yet (no row is visible), as float rows."""
        return self.memory.xp.zeros((0, 1, self.memory.layers[il].compress.indexer.head_dim), np.float32)

    def _rows(self, il: int, kind: str, segments) -> list:
        storage = self.memory.stores[(il, kind)].rows
        return [storage.read(s, n, 1) for s, n in segments if n]


def concat_rows(parts: list, xp):
    """Cache rows (n_i, n_head, d) as stored, one after another: float arrays, or ggml blocks."""
    if isinstance(parts[0], BlockRows):
        return BlockRows(np.concatenate([p.raw for p in parts]), parts[0].qtype, parts[0].n_head, parts[0].head_dim)
    return xp.concatenate(parts, axis=0)


class CompressedTopK:
    """A CSA layer's mask: the window's keys as they are, and of the compressed rows each query's
    lightning indexer keeps its top_k, score(t, j) = Σ_h w[t, h]·ReLU(q[t, h]·k[j]) over the
    indexer's compressed keys. A row keeps at most the window's bound plus top_k keys."""
    kind, uses_queries = "indexer", True

    def __init__(self, top_k: int):
        self.top_k = top_k

    def __call__(self, inp: MaskInput):
        e, xp = inp.extra, inp.xp
        n_raw = e["n_raw"]
        keys = e["indexer_keys"] if inp.backend is None else inp.backend.cache_rows_f32(e["indexer_keys"])
        scores = indexer_scores(e["indexer_q"], e["indexer_w"], keys, xp)
        kept = top_k_mask(scores, inp.base[:, n_raw:], self.top_k, xp)
        return xp.concatenate([inp.base[:, :n_raw], kept], axis=1), e["raw_bound"] + self.top_k
