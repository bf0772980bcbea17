"""The CPU backend: NumPy ops written for speed (BLAS matmuls, few temporaries).

Shapes follow NumPy order: activations are `(n_tokens, features)`, weights `(n_out, n_in)` as
GGUF stores them, attention tensors `(n_tokens, n_head, head_dim)`.
"""

from __future__ import annotations

import numpy as np

# Query rows per attention block: bounds the score matrix and lets causal blocks skip future keys.
ATTN_BLOCK = 128
SQRT_2_OVER_PI = 0.7978845608028654
GELU_COEF_A = 0.044715


class CPUBackend:
    name = "cpu"
    xp = np

    # ---- dense algebra -------------------------------------------------------------------

    @staticmethod
    def matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x @ w.T for a weight stored (n_out, n_in); into `out` when given."""
        return np.matmul(x, w.T, out=out)

    @staticmethod
    def get_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return table[ids]

    @staticmethod
    def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
        out = x * scale
        if weight is not None:
            out *= weight
        return out

    # ---- activations ---------------------------------------------------------------------

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    @staticmethod
    def gelu(x: np.ndarray) -> np.ndarray:
        """GELU, tanh approximation (ggml's GELU)."""
        inner = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)
        return 0.5 * x * (1.0 + np.tanh(inner))

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.silu(gate) * up

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.gelu(gate) * up

    # ---- rotary embeddings ---------------------------------------------------------------

    @staticmethod
    def rope_cache(pos: np.ndarray, n_rot: int, freq_base: float, freq_scale: float = 1.0):
        """cos/sin tables (n_tokens, n_rot/2), with ggml's float32 angle recurrence."""
        theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_rot)
        steps = np.empty((len(pos), n_rot // 2), dtype=np.float32)
        steps[:, 0] = pos
        steps[:, 1:] = theta_scale
        theta = np.cumprod(steps, axis=1, dtype=np.float32) * np.float32(freq_scale)
        return np.cos(theta), np.sin(theta)

    @staticmethod
    def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
        """Rotate the first n_rot dims of x (n_tokens, n_head, head_dim).

        Normal mode rotates adjacent pairs (x[2i], x[2i+1]); NEOX mode rotates (x[i], x[i + n_rot/2]).
        """
        n_rot = 2 * cos.shape[1]
        c, s = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        if neox:
            x0, x1 = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]
            out[..., : n_rot // 2] = x0 * c - x1 * s
            out[..., n_rot // 2: n_rot] = x0 * s + x1 * c
        else:
            x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = x0 * c - x1 * s
            out[..., 1:n_rot:2] = x0 * s + x1 * c
        return out

    # ---- attention -----------------------------------------------------------------------

    @staticmethod
    def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
        m = np.max(x, axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(x - m)
        s = np.sum(e, axis=axis, keepdims=True)
        return e / np.where(s > 0, s, 1.0)

    def flash_attn_ext(self, q, k, v, mask, scale: float, softcap: float = 0.0) -> np.ndarray:
        """softmax(q·kᵀ·scale + mask)·v with GQA; returns (n_tokens, n_head, head_dim_v).

        q (n_tokens, n_head, d_k), k (n_kv, n_head_kv, d_k), v (n_kv, n_head_kv, d_v),
        mask (n_tokens, n_kv) of 0 / -inf. Query rows go in blocks; each block reads only the
        key columns its mask leaves finite (causal and sliding-window blocks skip the rest).
        A fully masked row yields zeros.
        """
        n_tokens, n_head, d_k = q.shape
        n_kv, n_head_kv, d_v = v.shape
        group = n_head // n_head_kv
        keys = k.astype(np.float32, copy=False).transpose(1, 2, 0)  # (h_kv, d_k, n_kv)
        values = v.astype(np.float32, copy=False).transpose(1, 0, 2)  # (h_kv, n_kv, d_v)
        out = np.empty((n_tokens, n_head, d_v), dtype=np.float32)
        finite = np.isfinite(mask)
        for t0 in range(0, n_tokens, ATTN_BLOCK):
            t1 = min(t0 + ATTN_BLOCK, n_tokens)
            cols = np.flatnonzero(finite[t0:t1].any(axis=0))
            if len(cols) == 0:
                out[t0:t1] = 0.0
                continue
            c0, c1 = cols[0], cols[-1] + 1
            # (h_kv, group * rows, d_k): the query heads that share a KV head are stacked
            qb = q[t0:t1].reshape(t1 - t0, n_head_kv, group, d_k).transpose(1, 2, 0, 3)
            qb = qb.reshape(n_head_kv, group * (t1 - t0), d_k)
            scores = np.matmul(qb, keys[:, :, c0:c1]) * np.float32(scale)
            if softcap:
                scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
            scores = scores.reshape(n_head_kv, group, t1 - t0, c1 - c0) + mask[t0:t1, c0:c1]
            probs = self.softmax(scores).reshape(n_head_kv, group * (t1 - t0), c1 - c0)
            ctx = np.matmul(probs, values[:, c0:c1])  # (h_kv, group * rows, d_v)
            out[t0:t1] = ctx.reshape(n_head_kv, group, t1 - t0, d_v).transpose(2, 0, 1, 3).reshape(
                t1 - t0, n_head, d_v)
        return out
