"""Attention within one ubatch and nothing kept: what an encoder runs on (BERT, T5's encoder).

llama.cpp gives such a context no memory at all (`decode` forwards to `encode`); here the ubatch
still goes through a `MemoryContext`, so that the graph's `attn` door is the same for every model.
Each token sees the tokens of its own sequence: all of them (bidirectional), or those at its
position and before when `causal`."""

from __future__ import annotations

import numpy as np

from ..batch import UBatch
from .base import AttnGroup, BoundAttnView, MemoryContext, MemoryStatus


def sequence_mask(q_seq: np.ndarray, k_seq: np.ndarray, q_pos: np.ndarray | None = None,
                  k_pos: np.ndarray | None = None) -> np.ndarray:
    """(n_q, n_k) additive mask: 0 where the key shares the query's sequence (and, given positions,
    comes no later), -inf elsewhere."""
    allowed = q_seq[:, None] == k_seq[None, :]
    if q_pos is not None:
        allowed &= k_pos[None, :] <= q_pos[:, None]
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))


class BatchOnlyContext(MemoryContext):
    """One ubatch whose layers attend only its own keys; apply and rollback have nothing to do."""

    def __init__(self, ubatch: UBatch, causal: bool = False, xp=np):
        super().__init__(MemoryStatus.SUCCESS, [ubatch])
        positions = (ubatch.pos, ubatch.pos) if causal else (None, None)
        self.mask = xp.asarray(sequence_mask(ubatch.seq_id, ubatch.seq_id, *positions))
        self.kv: dict[int, tuple] = {}

    def apply(self) -> None:
        pass

    def rollback(self) -> None:
        self.kv = {}

    def layer(self, il: int) -> BoundAttnView:
        return BoundAttnView(self, il)

    def store(self, il: int, k, v=None) -> None:
        self.kv[il] = (k, k if v is None else v)

    def groups(self, il: int) -> list[AttnGroup]:
        k, v = self.kv[il]
        ub = self.ubatch
        return [AttnGroup(slice(None), k, v, self.mask, ub.pos, ub.pos)]
