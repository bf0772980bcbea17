"""`Graph`: one ubatch in flight. A model's forward pass is written against these helpers; the
doors to the memory are `attn` (attention layers) and `rs` (recurrent layers), and every numeric
op goes through the backend."""

from __future__ import annotations

import numpy as np


class Graph:
    def __init__(self, model, mctx, backend, observer=None, logits_out: np.ndarray | None = None):
        self.hp = model.hparams
        self.observer = observer
        self.logits_out = logits_out  # where the output rows' logits go, if the caller has a buffer
        self.mctx = mctx
        self.ub = mctx.ubatch
        self.ops = backend
        self.n_tokens = self.ub.n_tokens
        self.out_rows = np.flatnonzero(self.ub.output)
        self._rope_tables: dict[tuple[float, float], object] = {}

    def cb(self, name: str, il: int, x: np.ndarray) -> np.ndarray:
        """Show a named intermediate tensor to the observer, if any (llama.cpp's cb_eval)."""
        if self.observer is not None:
            self.observer(f"{name}-{il}" if il >= 0 else name, self.ub, x)
        return x

    def inp_embd(self, table: np.ndarray, scale: float | None = None) -> np.ndarray:
        x = self.ops.get_rows(table, self.ub.tokens)
        if scale is not None:
            x *= np.float32(scale)
        return x

    def norm(self, x: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
        return self.ops.rms_norm(x, weight, self.hp.rms_eps)

    def linear(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return self.ops.matmul(x, weight)

    def rope(self, x: np.ndarray, il: int) -> np.ndarray:
        """RoPE at the ubatch positions with layer il's frequency base."""
        key = (self.hp.rope_base(il), self.hp.rope_freq_scale)
        if key not in self._rope_tables:
            self._rope_tables[key] = self.ops.rope_cache(self.ub.pos, self.hp.n_rot, *key)
        return self.ops.rope(x, self._rope_tables[key], neox=self.hp.rope_neox)

    def attn(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
        """Store this ubatch's K/V for layer il, attend over the memory; returns (n_tokens, n_head*d_v)."""
        view = self.mctx.layer(il)
        view.store(k, v)
        groups = view.groups()
        if len(groups) == 1:
            g = groups[0]
            return self.ops.flash_attn_ext(q, g.keys, g.values, g.mask, scale, n_kv_max=g.n_kv_max).reshape(len(q), -1)
        out = self.ops.xp.empty((len(q), q.shape[1], v.shape[2]), dtype=np.float32)
        for g in groups:  # one per cache stream
            rows = g.rows if isinstance(g.rows, slice) else self.ops.asarray(g.rows)
            out[rows] = self.ops.flash_attn_ext(q[rows], g.keys, g.values, g.mask, scale, n_kv_max=g.n_kv_max)
        return out.reshape(len(q), -1)

    def rs(self, il: int):
        """Layer il's recurrent states for this ubatch (a RecurrentView: read, write, seq_index)."""
        return self.mctx.layer(il)

    def ffn(self, x: np.ndarray, gate_up: np.ndarray, down: np.ndarray, act: str) -> np.ndarray:
        """Gated feed-forward with the gate and up projections fused into one weight."""
        return self.ops.matmul(self.ops.gated_ffn(self.ops.matmul(x, gate_up), act), down)

    def select_outputs(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep only the rows that produce outputs (done before the last layer's FFN)."""
        if len(self.out_rows) == self.n_tokens:
            return xs
        return tuple(self.ops.take_rows(x, self.out_rows) for x in xs)

    def logits(self, x: np.ndarray, norm_weight: np.ndarray, head: np.ndarray) -> np.ndarray:
        return self.ops.matmul(self.cb("result_norm", -1, self.norm(x, norm_weight)), head, out=self.logits_out)
