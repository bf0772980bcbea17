"""DeepSeek-V4's own array ops, written once in the backend's array module (NumPy, CuPy) and checked
by test-ops against the plain references in core/ops.py, as llama.cpp's fused ggml ops compute them
(ggml_dsv4_hc_pre / _comb / _post and the compressors' softmax pool, all in float32):

- `hc_mix` (HC_MIX): from the streams' mixing logits (n, (2 + S)·S) the sub-block's input weights
  pre = sigmoid(·) + eps, its output weights post = 2·sigmoid(·), and comb[src, dst], a softmax over
  dst then `iterations` rounds of Sinkhorn normalisation (columns, then rows and columns);
- `hc_post` (HC_POST): stream_dst ← post_dst·out + Σ_src comb[src, dst]·stream_src;
- `compress_pool` (COMPRESS_POOL): a block's row as the softmax-over-candidates weighted sum of its
  candidates' projections, per channel;
- `clamped_swiglu` (SWIGLU with a limit): silu(min(gate, limit))·clamp(up, -limit, limit).
"""

from __future__ import annotations

import numpy as np


def sigmoid(x, xp):
    return np.float32(1.0) / (np.float32(1.0) + xp.exp(-x))


def hc_mix(mix, scale, base, n_streams: int, iterations: int, eps: float, xp):
    """(pre (n, S), post (n, S), comb (n, S, S) as [token, src, dst]) from mixing logits (n, (2 + S)·S)."""
    s, eps = n_streams, np.float32(eps)
    pre = sigmoid(mix[:, :s] * scale[0] + base[:s], xp) + eps
    post = 2 * sigmoid(mix[:, s:2 * s] * scale[1] + base[s:2 * s], xp)
    comb = (mix[:, 2 * s:] * scale[2] + base[2 * s:]).reshape(len(mix), s, s)
    comb = xp.exp(comb - comb.max(axis=2, keepdims=True))
    comb = comb / comb.sum(axis=2, keepdims=True) + eps
    comb = comb / (comb.sum(axis=1, keepdims=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(axis=2, keepdims=True) + eps)
        comb = comb / (comb.sum(axis=1, keepdims=True) + eps)
    return pre, post, comb


def hc_post(out, streams, post, comb, xp):
    """The streams after a sub-block: out (n, E) spread by post (n, S), streams (n, S, E) mixed by comb."""
    return post[:, :, None] * out[:, None, :] + xp.matmul(comb.transpose(0, 2, 1), streams)


def compress_pool(kv, score, xp):
    """Rows (n_blocks, width) from candidates kv and gate scores (n_blocks, n_candidates, width):
    per channel a softmax over the candidates (a -inf score weighs nothing)."""
    weights = xp.exp(score - score.max(axis=1, keepdims=True))
    return (weights * kv).sum(axis=1) / weights.sum(axis=1)


def clamped_swiglu(backend, gate, up, limit: float):
    """DeepSeek-V4's SwiGLU: the gate bounded above and the up projection both ways by `limit`."""
    xp, limit = backend.xp, np.float32(limit)
    return backend.swiglu(xp.minimum(gate, limit), xp.clip(up, -limit, limit))
