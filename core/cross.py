"""`CrossInput`: what an encoder-decoder context keeps from its last encode (llama.cpp's
`llama_cross`): the encoder output and the sequence of each of its tokens. Decoder layers read it
through `Graph.cross_attn`; each layer's K/V projection of it is made once per encode."""

from __future__ import annotations

import numpy as np

from .statefile import StateReader, StateWriter


class CrossInput:
    def __init__(self, output: np.ndarray, seq_id: np.ndarray, xp=np):
        self.output = output  # (n_enc, n_embd), after the encoder's output norm
        self.seq_id = np.asarray(seq_id, dtype=np.int32)
        self.xp = xp
        self._kv: dict[int, tuple] = {}
        self._masks: dict[bytes, object] = {}

    def kv(self, il: int, project):
        """Layer il's cross-attention K and V, projected on first use."""
        if il not in self._kv:
            self._kv[il] = project(self.output)
        return self._kv[il]

    def mask(self, seq_id: np.ndarray):
        """(n_tokens, n_enc): 0 where the encoder token belongs to the decoder token's sequence."""
        key = seq_id.tobytes()
        if key not in self._masks:
            allowed = np.asarray(seq_id)[:, None] == self.seq_id[None, :]
            self._masks = {key: self.xp.asarray(np.where(allowed, np.float32(0.0), np.float32(-np.inf)))}
        return self._masks[key]

    def state_write(self, w: StateWriter) -> None:
        w.array(np.asarray(self.xp.asnumpy(self.output) if self.xp is not np else self.output, np.float32))
        w.array(self.seq_id)

    @staticmethod
    def write_none(w: StateWriter, n_embd: int) -> None:
        """What a context that has not encoded yet saves."""
        w.array(np.empty((0, n_embd), np.float32))
        w.array(np.empty(0, np.int32))

    @classmethod
    def state_read(cls, r: StateReader, n_embd: int, n_seq_max: int, xp=np) -> "CrossInput | None":
        output = r.array("the encoder output", np.float32)
        seq_id = r.array("the encoder sequence ids", np.int32)
        if output.ndim != 2 or output.shape[1] != n_embd or seq_id.shape != output.shape[:1]:
            raise r.fail(f"the encoder output is not (tokens, {n_embd}) with one sequence id per token")
        if np.any((seq_id < 0) | (seq_id >= n_seq_max)) or not np.all(np.isfinite(output)):
            raise r.fail("the encoder output holds sequence ids out of range or non-finite values")
        return cls(xp.asarray(output), seq_id, xp) if len(output) else None
