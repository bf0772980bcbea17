"""Embedding outputs as llama.cpp makes them: pooling per sequence (`--pooling`), and
`--embd-normalize` as llama-embedding applies it."""

from __future__ import annotations

import numpy as np

from .batch import Batch
from .errors import InvalidInputError, Interrupted

# llama.cpp's llama_pooling_type values, as GGUF files store them (RANK is not supported here)
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last"}
POOLING_NAMES = ("none", "mean", "cls", "last")
NORMALIZE_MAX_ABS = 32760.0  # -embd-normalize 0 scales the largest component to the int16 range


def pool(hidden: np.ndarray, seq_id: np.ndarray, pos: np.ndarray, kind: str) -> dict[int, np.ndarray]:
    """One vector per sequence of the batch from its tokens' hidden states (rows in batch order):
    their mean, the first token's (cls) or the last one's."""
    pooled = {}
    for s in np.unique(seq_id):
        rows = np.flatnonzero(seq_id == s)
        if kind == "mean":
            pooled[int(s)] = hidden[rows].mean(axis=0, dtype=np.float32)
        elif kind == "cls":
            pooled[int(s)] = hidden[rows[np.argmin(pos[rows])]].copy()
        elif kind == "last":
            pooled[int(s)] = hidden[rows[np.argmax(pos[rows])]].copy()
        else:
            raise ValueError(f"no pooling '{kind}'")
    return pooled


def check_normalize(mode: int) -> None:
    if mode < -1:
        raise InvalidInputError(f"--embd-normalize {mode}: choose -1 (none), 0 (max absolute, int16 range), "
                                "1 (taxicab), 2 (euclidean) or a larger p for the p-norm")


def normalize(v: np.ndarray, mode: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max absolute scaled to 32760, 2 euclidean,
    any other p the p-norm (1: taxicab). The norm is taken in float64; a zero vector stays zero."""
    x = np.asarray(v, dtype=np.float64)
    if mode == -1:
        norm = 1.0
    elif mode == 0:
        norm = np.abs(x).max(initial=0.0) / NORMALIZE_MAX_ABS
    elif mode == 2:
        norm = np.sqrt(np.sum(x * x))
    else:
        norm = np.sum(np.abs(x) ** mode) ** (1.0 / mode)
    scale = np.float32(1.0 / norm) if norm > 0 else np.float32(0.0)
    return np.asarray(v, dtype=np.float32) * scale


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's common_embd_similarity_cos (0 when either vector is zero, 1 when both are)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.sqrt(a @ a), np.sqrt(b @ b)
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def embed_inputs(ctx, inputs: list[list[int]], on_batch=None) -> list[np.ndarray]:
    """llama-embedding's loop: inputs as separate sequences, as many per batch as -b and the
    context's sequences allow, the memory cleared before each batch. Returns one pooled vector per
    input, or with pooling none one (n_tokens, n_embd) array per input. `on_batch(n_inputs)` sees
    each batch done; Ctrl-C raises Interrupted with the results of the inputs done."""
    n_batch, n_seq = ctx.prompt_batch, ctx.params.n_seq_max  # an encoder takes a batch in one micro-batch
    results: list[np.ndarray] = []
    try:
        _embed_groups(ctx, inputs, n_batch, n_seq, results, on_batch)
    except KeyboardInterrupt:
        raise Interrupted(list(results)) from None
    return results


def _embed_groups(ctx, inputs: list[list[int]], n_batch: int, n_seq: int, results: list, on_batch) -> None:
    from .context import check_status  # here: the context module imports this one (pool)
    start = 0
    while start < len(inputs):
        end, n_tokens = start, 0
        while end < len(inputs) and end - start < n_seq and n_tokens + len(inputs[end]) <= n_batch:
            n_tokens += len(inputs[end])
            end += 1
        if end == start:
            raise InvalidInputError(f"input {start + 1} has {len(inputs[start])} tokens, more than the batch "
                                    f"(-b {n_batch})")
        group = inputs[start:end]
        batch = Batch(np.concatenate([np.asarray(t, np.int32) for t in group]),
                      pos=np.concatenate([np.arange(len(t), dtype=np.int32) for t in group]),
                      seq_id=np.concatenate([np.full(len(t), s, np.int32) for s, t in enumerate(group)]),
                      output=np.ones(n_tokens, bool))
        ctx.clear()
        check_status(ctx, ctx.decode(batch))
        if ctx.pooling == "none":
            rows = ctx.backend.to_numpy(ctx.logits)
            offsets = np.cumsum([0] + [len(t) for t in group])
            vectors = [rows[a:b].copy() for a, b in zip(offsets[:-1], offsets[1:])]
        else:
            vectors = [ctx.get_embeddings_seq(s) for s in range(len(group))]
        results += vectors  # in one step: an interrupt sees a group whole or not at all
        if on_batch:
            on_batch(len(group))
        start = end
