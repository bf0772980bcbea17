"""Batches: what a caller decodes (`Batch`), its validation (`BatchAllocator`) and the
micro-batches (`UBatch`) a memory splits it into.

One token belongs to one sequence here; a shared prefix is expressed with `seq_cp` on the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidInputError

# Positions are 32-bit, as in llama.cpp; this bound keeps every position plus a batch or a shift
# clear of overflow.
POS_LIMIT = 1 << 30


@dataclass
class Batch:
    tokens: np.ndarray
    pos: np.ndarray | None = None  # filled from the memory when None
    seq_id: np.ndarray | None = None  # 0 for every token when None
    output: np.ndarray | None = None  # only the last token when None

    @classmethod
    def from_tokens(cls, tokens, pos0: int | None = None, seq_id: int = 0, all_outputs: bool = False) -> "Batch":
        tokens = np.asarray(tokens, dtype=np.int32)
        n = len(tokens)
        pos = None if pos0 is None else np.arange(pos0, pos0 + n, dtype=np.int32)
        output = np.ones(n, dtype=bool) if all_outputs else None
        return cls(tokens, pos, np.full(n, seq_id, dtype=np.int32), output)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class UBatch:
    tokens: np.ndarray
    pos: np.ndarray
    seq_id: np.ndarray
    output: np.ndarray
    batch_idx: np.ndarray  # index of each token in the caller's batch

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())


class BatchAllocator:
    """Validates a batch against the vocabulary and the memory, then splits it (llama_batch_allocr)."""

    def __init__(self, n_vocab: int, n_seq_max: int):
        self.n_vocab, self.n_seq_max = n_vocab, n_seq_max
        self.tokens = self.pos = self.seq_id = self.output = None

    def init(self, batch: Batch, memory, output_all: bool = False) -> None:
        """Fill defaults and check the batch; raises InvalidInputError and keeps nothing on failure."""
        n = len(batch.tokens)
        if n == 0:
            raise InvalidInputError("the batch is empty")
        tokens = np.asarray(batch.tokens, dtype=np.int32)
        seq_id = np.zeros(n, np.int32) if batch.seq_id is None else np.asarray(batch.seq_id, dtype=np.int32)
        bad = np.flatnonzero((tokens < 0) | (tokens >= self.n_vocab))
        if len(bad):
            raise InvalidInputError(f"token {int(tokens[bad[0]])} at batch index {bad[0]} is outside the "
                                    f"vocabulary (0..{self.n_vocab - 1})")
        bad = np.flatnonzero((seq_id < 0) | (seq_id >= self.n_seq_max))
        if len(bad):
            raise InvalidInputError(f"sequence id {int(seq_id[bad[0]])} at batch index {bad[0]} is out of range "
                                    f"(the context holds {self.n_seq_max} sequence(s): 0..{self.n_seq_max - 1})")
        pos = self._positions(batch, seq_id, memory)
        if batch.output is not None:
            output = np.asarray(batch.output, dtype=bool).copy()
        else:
            output = np.zeros(n, dtype=bool)
            output[-1] = True
        if output_all:
            output[:] = True
        self.tokens, self.pos, self.seq_id, self.output = tokens, pos, seq_id, output

    @staticmethod
    def _positions(batch: Batch, seq_id: np.ndarray, memory) -> np.ndarray:
        given = batch.pos is not None
        pos = np.asarray(batch.pos, dtype=np.int32) if given else np.empty(len(seq_id), np.int32)
        for s in np.unique(seq_id):
            idx = np.flatnonzero(seq_id == s)
            last = memory.seq_pos_max(int(s)) if memory is not None else -1
            start = int(pos[idx[0]]) if given else last + 1
            refusal = memory.start_refusal(int(s), start) if memory is not None and last < 0 else ""
            if refusal:
                raise InvalidInputError(refusal)
            if start + len(idx) > POS_LIMIT:
                raise InvalidInputError(f"sequence {s} would pass the largest position {POS_LIMIT - 1}")
            if not given:
                pos[idx] = np.arange(start, start + len(idx))
                continue
            seq_pos = pos[idx]
            if seq_pos[0] < 0:
                raise InvalidInputError(f"sequence {s} starts at the negative position {seq_pos[0]}")
            if last >= 0 and seq_pos[0] != last + 1:
                raise InvalidInputError(
                    f"sequence {s} continues at position {seq_pos[0]}, but the memory holds it up to "
                    f"position {last}; positions must continue at {last + 1}")
            if np.any(np.diff(seq_pos) != 1):
                raise InvalidInputError(f"the positions of sequence {s} in the batch are not consecutive")
        return pos

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def _ubatch(self, idx: np.ndarray) -> UBatch:
        return UBatch(self.tokens[idx], self.pos[idx], self.seq_id[idx], self.output[idx], idx)

    def split_simple(self, n_ubatch: int) -> list[UBatch]:
        """Consecutive tokens in batch order, n_ubatch at a time."""
        idx = np.arange(self.n_tokens)
        return [self._ubatch(idx[i:i + n_ubatch]) for i in range(0, self.n_tokens, n_ubatch)]

    def split_equal(self, n_ubatch: int) -> list[UBatch]:
        """Ubatches of whole sequence groups: each takes the same number of tokens from every
        sequence it holds, grouped by sequence (what per-sequence streams need)."""
        queues = {int(s): list(np.flatnonzero(self.seq_id == s)) for s in np.unique(self.seq_id)}
        ubatches = []
        while queues:
            seqs = sorted(queues)[:n_ubatch]
            n_each = min(min(len(queues[s]) for s in seqs), max(n_ubatch // len(seqs), 1))
            idx = np.concatenate([queues[s][:n_each] for s in seqs])
            for s in seqs:
                del queues[s][:n_each]
                if not queues[s]:
                    del queues[s]
            ubatches.append(self._ubatch(idx))
        return ubatches
