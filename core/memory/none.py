"""No cache at all (`--kv none`, `--ctx no-kv`): the memory is each sequence's token history,
and every ubatch recomputes that history with it, attending within the ubatch only.

Slow (quadratic in the sequence length) and simple, which is the point: it is the oracle every
cache is checked against. A position shift is just a change of the stored positions.
"""

from __future__ import annotations

import numpy as np

from ..batch import POS_LIMIT, UBatch
from ..statefile import StateReader, StateWriter
from .base import AttnGroup, BoundAttnView, LoadedState, Memory, MemoryContext, MemoryStatus, open_range
from .compressed import CompressedMemory, first_position_refusal
from .dsv4 import CompressedLayerView
from .masks import BlockTopK, CausalMask, KeyBounds, MaskProducer, WindowMask
from .recurrent import ScratchRecurrentView
from .spec import AttnSpec, RecurrentSpec


class NoKVMemory(Memory):
    kind = "none"

    def __init__(self, n_seq_max: int = 1, n_swa: int = 0, swa_layers=frozenset(), n_vocab: int = 1 << 31,
                 recurrent: dict[int, RecurrentSpec] | None = None, producers: dict | None = None, xp=np,
                 compressed: dict[int, AttnSpec] | None = None):
        self.n_seq_max, self.n_swa, self.swa_layers = n_seq_max, n_swa, frozenset(swa_layers)
        self.compressed = compressed or {}  # DeepSeek-V4's compressed layers: their rows pooled from the history
        self.producers = producers or {}  # layer → mask producer where not the causal or window mask
        self.window, self.causal = WindowMask(n_swa), CausalMask()
        self.n_vocab = n_vocab
        self.recurrent, self.xp = recurrent or {}, xp  # recurrent layers start from zero each ubatch
        self.clear()

    def producer(self, il: int) -> MaskProducer:
        if il in self.producers:
            return self.producers[il]
        return self.window if il in self.swa_layers and self.n_swa > 0 else self.causal

    def start_refusal(self, seq: int, pos: int) -> str:
        return first_position_refusal(seq, pos) if self.compressed else ""

    def prepare(self, ubatches: list[UBatch]) -> bool:
        """A history grows without bound: every batch fits."""
        return True

    def context(self, ubatches: list[UBatch], placement) -> "NoKVContext":
        return NoKVContext(self, MemoryStatus.SUCCESS, ubatches)

    def history(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens[seq], self.pos[seq]

    def append(self, seq: int, tokens: np.ndarray, pos: np.ndarray) -> None:
        self.tokens[seq] = np.concatenate([self.tokens[seq], tokens])
        self.pos[seq] = np.concatenate([self.pos[seq], pos])

    def _keep(self, seq: int, keep: np.ndarray) -> None:
        self.tokens[seq], self.pos[seq] = self.tokens[seq][keep], self.pos[seq][keep]

    def clear(self) -> None:
        self.tokens = [np.empty(0, np.int32) for _ in range(self.n_seq_max)]
        self.pos = [np.empty(0, np.int32) for _ in range(self.n_seq_max)]

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        p0, p1 = open_range(p0, p1)
        for s in (range(self.n_seq_max) if seq < 0 else [seq]):
            self._keep(s, (self.pos[s] < p0) | (self.pos[s] >= p1))
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src == dst:
            return
        p0, p1 = open_range(p0, p1)
        hit = (self.pos[src] >= p0) & (self.pos[src] < p1)
        self.append(dst, self.tokens[src][hit], self.pos[src][hit])
        order = np.argsort(self.pos[dst], kind="stable")
        self._keep(dst, order)

    def seq_keep(self, seq: int) -> None:
        for s in range(self.n_seq_max):
            if s != seq:
                self._keep(s, np.zeros(len(self.pos[s]), bool))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        p0, p1 = open_range(p0, p1)
        hit = (self.pos[seq] >= p0) & (self.pos[seq] < p1)
        self.pos[seq][hit] += delta
        self._keep(seq, self.pos[seq] >= 0)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        p0, p1 = open_range(p0, p1)
        hit = (self.pos[seq] >= p0) & (self.pos[seq] < p1)
        self.pos[seq][hit] //= d

    def seq_pos_min(self, seq: int) -> int:
        return int(self.pos[seq].min()) if len(self.pos[seq]) else -1

    def seq_pos_max(self, seq: int) -> int:
        return int(self.pos[seq].max()) if len(self.pos[seq]) else -1

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes + p.nbytes for t, p in zip(self.tokens, self.pos))

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        for s in (range(self.n_seq_max) if seq is None else [seq]):
            w.array(self.tokens[s])
            w.array(self.pos[s])

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        histories = []
        for s in (range(self.n_seq_max) if seq is None else [seq]):
            tokens = r.array("the token history", np.int32)
            pos = r.array("the position history", np.int32, tokens.shape)
            if tokens.ndim != 1 or np.any((tokens < 0) | (tokens >= self.n_vocab)):
                raise r.fail("the token history is not a list of token ids")
            if np.any((pos < 0) | (pos >= POS_LIMIT)) or len(np.unique(pos)) != len(pos):
                raise r.fail(f"the position history holds a position twice or outside 0..{POS_LIMIT - 1}")
            histories.append((s, tokens, pos))

        def commit():
            if seq is None:
                self.clear()
            for s, tokens, pos in histories:
                self.tokens[s], self.pos[s] = tokens, pos
        return LoadedState(commit, {s: int(pos.max(initial=-1)) for s, _, pos in histories})


class NoKVContext(MemoryContext):
    """Runs each ubatch behind the full history of its sequences (outputs only for new tokens)."""

    def __init__(self, memory: NoKVMemory, status: MemoryStatus, ubatches: list[UBatch]):
        super().__init__(status, ubatches)
        self.memory = memory
        self.expanded: UBatch | None = None
        self.kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._mask = None
        self.compressed = None  # the compressed rows of the history and ubatch, made anew for each ubatch
        self._undo: list[tuple[int, int]] = []  # (sequence, history length before apply)

    @property
    def ubatch(self) -> UBatch:
        return self.expanded if self.expanded is not None else self.ubatches[self.index]

    def next(self) -> bool:
        self.expanded = None
        return super().next()

    def apply(self) -> None:
        ub = self.ubatches[self.index]
        seqs = [int(s) for s in np.unique(ub.seq_id)]
        history = [self.memory.history(s) for s in seqs]
        self._undo = [(s, len(t)) for s, (t, _) in zip(seqs, history)]
        n_hist = sum(len(t) for t, _ in history)
        self.expanded = UBatch(
            tokens=np.concatenate([t for t, _ in history] + [ub.tokens]).astype(np.int32),
            pos=np.concatenate([p for _, p in history] + [ub.pos]).astype(np.int32),
            seq_id=np.concatenate([np.full(len(t), s, np.int32) for s, (t, _) in zip(seqs, history)] + [ub.seq_id]),
            output=np.concatenate([np.zeros(n_hist, bool), ub.output]),
            batch_idx=np.concatenate([np.full(n_hist, -1), ub.batch_idx]),
        )
        for s in seqs:
            mine = ub.seq_id == s
            self.memory.append(s, ub.tokens[mine], ub.pos[mine])
        self.kv, self._mask = {}, None
        if self.memory.compressed:
            scratch = CompressedMemory(self.memory.compressed, self.memory.n_seq_max,
                                       int(self.expanded.pos.max()) + 1, "f32", self.memory.xp)
            self.compressed = scratch.context([self.expanded], True)
            self.compressed.apply()

    def rollback(self) -> None:
        for s, n in self._undo:
            self.memory._keep(s, np.arange(n))
        self._undo, self.expanded = [], None

    def layer(self, il: int):
        if il in self.memory.recurrent:
            return ScratchRecurrentView(self.memory.recurrent[il], self.expanded.seq_id, self.memory.xp)
        if il in self.memory.compressed:
            return CompressedLayerView(BoundAttnView(self, il), self.compressed, il, self.memory.xp)
        return BoundAttnView(self, il)

    def store(self, il: int, k: np.ndarray, v: np.ndarray | None = None, indexer_k: np.ndarray | None = None) -> None:
        self.kv[il] = (k, k if v is None else v, indexer_k)

    def groups(self, il: int) -> list[AttnGroup]:
        ub = self.expanded
        if self._mask is None:
            allowed = (ub.seq_id[:, None] == ub.seq_id[None, :]) & (ub.pos[None, :] <= ub.pos[:, None])
            self._mask = self.memory.xp.asarray(np.where(allowed, np.float32(0.0), np.float32(-np.inf)))
        k, v, indexer_k = self.kv[il]
        producer = self.memory.producer(il)
        extra = {"bounds": KeyBounds(k, producer.block, self.memory.xp)} if isinstance(producer, BlockTopK) else {}
        if indexer_k is not None:
            extra["indexer_keys"] = indexer_k.reshape(len(indexer_k), 1, -1)
        return [AttnGroup(slice(None), k, v, self._mask, ub.pos, ub.pos, producer, extra)]
