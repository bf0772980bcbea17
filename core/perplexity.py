"""Perplexity and KL-divergence the way llama-perplexity computes them.

The text is tokenized whole (BOS as the model adds it) and cut into non-overlapping chunks of
n_ctx tokens. Each chunk is decoded from an empty memory with its first token replaced by BOS
(when the model adds one); only the second half is scored: the logits at positions
n_ctx/2 .. n_ctx-2 predict the next token. Several chunks run as parallel sequences when the
batch holds them (n_seq = n_batch / n_ctx).

KL-divergence base files (`--kl-divergence-base`) are this project's own format, version 1:

    b"LLMKLBAS"  u32 version  u32 n_ctx  u32 n_vocab  u32 n_chunk
    u32 len + utf-8 vocabulary fingerprint   u32 len + utf-8 model name   u32 len + model fingerprint
    i32 tokens[n_chunk * n_ctx]
    per chunk, per scored position (n_ctx - 1 - n_ctx/2 rows): the row of llama.cpp's
    `_logits_` files — f32 scale, f32 min_log_prob, then n_vocab uint16 q (padded to even) with
    log p_i = scale * q_i + min_log_prob (q = 0 below max_logit - 16).
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from .batch import Batch
from .context import Context, check_status
from .errors import InvalidInputError, Interrupted
from .vocab import Vocab

KL_MAGIC, KL_VERSION = b"LLMKLBAS", 1
KL_FLOOR = -16.0  # log-probabilities below max - 16 are stored as the floor


@dataclass
class ChunkPlan:
    n_ctx: int  # tokens per chunk
    n_chunk: int
    n_seq: int  # chunks decoded together
    n_batch: int

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        return self.n_ctx - 1 - self.first


def plan_chunks(n_tokens: int, n_ctx: int, n_batch: int, chunks: int = -1) -> ChunkPlan:
    if n_ctx < 4:
        raise InvalidInputError("perplexity needs a context (-c) of at least 4 tokens")
    if n_tokens < 2 * n_ctx:
        raise InvalidInputError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                                f"{n_ctx}; the data file you provided tokenizes to only {n_tokens} tokens")
    n_seq = max(1, n_batch // n_ctx)
    if n_batch > n_ctx and n_batch % n_ctx:
        n_batch = n_seq * n_ctx  # llama-perplexity asserts n_batch < n_ctx or a multiple of it
    n_chunk_max = n_tokens // n_ctx
    n_chunk = n_chunk_max if chunks < 0 else min(chunks, n_chunk_max)
    if n_chunk <= 0:
        raise InvalidInputError("--chunks must be positive (or -1 for all)")
    return ChunkPlan(n_ctx, n_chunk, min(n_seq, n_chunk), min(n_batch, n_seq * n_ctx))


def chunk_logits(ctx: Context, tokens: np.ndarray, plan: ChunkPlan) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(chunk index, logits of the scored positions (n_scored, n_vocab), the tokens they predict)."""
    vocab = ctx.model.vocab
    bos = vocab.bos if vocab.add_bos else None
    n_batch, first = plan.n_batch, plan.first
    for i in range(0, plan.n_chunk, plan.n_seq):
        n_seq = min(plan.n_seq, plan.n_chunk - i)
        ctx.clear()
        rows: list[list[np.ndarray]] = [[] for _ in range(n_seq)]
        for batch_start in range(0, plan.n_ctx, n_batch):
            size = min(plan.n_ctx - batch_start, n_batch)
            chunk_tokens = np.stack([tokens[(i + s) * plan.n_ctx + batch_start:][:size] for s in range(n_seq)])
            if bos is not None and batch_start == 0:
                chunk_tokens[:, 0] = bos
            pos = np.tile(np.arange(batch_start, batch_start + size, dtype=np.int32), n_seq)
            batch = Batch(chunk_tokens.reshape(-1).astype(np.int32), pos=pos,
                          seq_id=np.repeat(np.arange(n_seq, dtype=np.int32), size), output=pos >= first)
            check_status(ctx, ctx.decode(batch))
            if len(ctx.logits):  # the context reuses its buffer: copy when a chunk takes several decodes
                logits = ctx.backend.to_numpy(ctx.logits)
                per_seq = logits.reshape(n_seq, -1, logits.shape[1])
                for s in range(n_seq):
                    rows[s].append(per_seq[s] if plan.n_ctx <= n_batch else per_seq[s].copy())
        for s in range(n_seq):
            start = (i + s) * plan.n_ctx
            logits = (rows[s][0] if len(rows[s]) == 1 else np.concatenate(rows[s]))[: plan.n_scored]
            yield i + s, logits, tokens[start + first + 1: start + plan.n_ctx]


ROW_BLOCK = 32  # rows per block: keeps the exp temporaries in cache for 262k-token vocabularies


def log_softmax_parts(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the max logit and log(sum(exp(l - max))), exps in f32 summed in f64 like llama.cpp."""
    m = logits.max(axis=1)
    lse = np.empty(len(logits), dtype=np.float64)
    for r in range(0, len(logits), ROW_BLOCK):
        block = logits[r:r + ROW_BLOCK] - m[r:r + ROW_BLOCK, None]
        lse[r:r + ROW_BLOCK] = np.log(np.exp(block, out=block).sum(axis=1, dtype=np.float64))
    return m.astype(np.float64), lse


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    m, lse = log_softmax_parts(logits)
    return m + lse - logits[np.arange(len(targets)), targets]


# ---- perplexity ---------------------------------------------------------------------------

@dataclass
class PerplexityResult:
    plan: ChunkPlan
    running_ppl: list[float] = field(default_factory=list)
    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0
    seconds: float = 0.0

    def snapshot(self) -> "PerplexityResult":
        return replace(self, running_ppl=list(self.running_ppl))

    def add(self, nll: np.ndarray) -> float:
        self.nll += float(nll.sum())
        self.nll2 += float(np.square(nll).sum())
        self.count += len(nll)
        self.running_ppl.append(math.exp(self.nll / self.count))
        return self.running_ppl[-1]

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def ppl_error(self) -> float:
        """llama.cpp's error: sqrt(var(nll) / (count - 1)) * ppl."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        return math.sqrt(var / (self.count - 1)) * self.ppl if var > 0 and self.count > 1 else float("nan")


def perplexity_tokens(model, text: str) -> list[int]:
    """The text as llama-perplexity tokenizes it: BOS where the model adds one, special tokens as text."""
    return model.vocab.tokenize(text, add_special=True, parse_special=False)


def perplexity_context(model, plan: ChunkPlan, params) -> Context:
    """A context for `plan`: n_seq chunks side by side, each in a sequence of its own, n_batch
    tokens a decode (ContextParams `params` give the rest)."""
    return Context(model, replace(params, n_ctx=plan.n_seq * plan.n_ctx, n_batch=plan.n_batch,
                                  n_ubatch=min(params.n_ubatch, plan.n_batch), n_seq_max=plan.n_seq))


def perplexity(ctx: Context, tokens: list[int], plan: ChunkPlan, on_chunk: Callable[[int, float], None] | None = None,
               kl_base: BinaryIO | None = None) -> PerplexityResult:
    """Score every chunk; with `kl_base`, also write the base log-probabilities there. Ctrl-C
    raises Interrupted with the result of the chunks done."""
    tokens_arr = np.asarray(tokens, dtype=np.int32)
    result = done = PerplexityResult(plan)
    if kl_base is not None:
        write_kl_header(kl_base, ctx, tokens_arr[: plan.n_chunk * plan.n_ctx], plan)
    t0 = time.perf_counter()
    try:
        for index, logits, targets in chunk_logits(ctx, tokens_arr, plan):
            value = result.add(token_nll(logits, targets))
            if kl_base is not None:
                kl_base.write(quantize_log_probs(logits).tobytes())
            result.seconds = time.perf_counter() - t0
            done = result.snapshot()
            if on_chunk:
                on_chunk(index, value)
    except KeyboardInterrupt:
        raise Interrupted(done) from None
    return result


# ---- KL-divergence ------------------------------------------------------------------------

def vocab_fingerprint(vocab: Vocab) -> str:
    return hashlib.sha256("\x00".join(vocab.tokens).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def row_width(n_vocab: int) -> int:
    """uint16 per stored row: two f32 then n_vocab values, padded to an even count (llama.cpp's nv)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _pack_str(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<I", len(data)) + data


def write_kl_header(f: BinaryIO, ctx: Context, tokens: np.ndarray, plan: ChunkPlan) -> None:
    model = ctx.model
    f.write(KL_MAGIC + struct.pack("<IIII", KL_VERSION, plan.n_ctx, model.hparams.n_vocab, plan.n_chunk))
    f.write(_pack_str(vocab_fingerprint(model.vocab)) + _pack_str(model.name) + _pack_str(model.fingerprint))
    f.write(tokens.astype("<i4").tobytes())


def quantize_log_probs(logits: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities as llama.cpp stores them: 16-bit steps over [max - 16, max]."""
    n_rows, n_vocab = logits.shape
    m, lse = log_softmax_parts(logits)
    max_logit = m.astype(np.float32)
    min_logit = np.maximum(logits.min(axis=1), max_logit - np.float32(16))
    min_log_prob = (min_logit - max_logit - lse.astype(np.float32)).astype(np.float32)
    scale = ((max_logit - min_logit) / np.float32(65535)).astype(np.float32)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.where(logits > min_logit[:, None], np.rint(inv[:, None] * (logits - min_logit[:, None])), 0)
    out = np.zeros((n_rows, row_width(n_vocab)), dtype=np.uint16)
    out[:, :4] = np.stack([scale, min_log_prob], axis=1).astype("<f4").view(np.uint16)
    out[:, 4:4 + n_vocab] = q.astype(np.uint16)
    return out


@dataclass
class KLBase:
    n_ctx: int
    n_vocab: int
    n_chunk: int
    vocab_fp: str
    model_name: str
    model_fp: str
    tokens: np.ndarray
    rows: np.ndarray  # (n_chunk, n_scored, row_width) uint16, memory-mapped

    def log_probs(self, chunk: int) -> np.ndarray:
        """(n_scored, n_vocab) float32 base log-probabilities of one chunk."""
        stored = self.rows[chunk]
        head = np.ascontiguousarray(stored[:, :4]).view("<f4")
        return head[:, :1] * stored[:, 4:4 + self.n_vocab].astype(np.float32) + head[:, 1:2]


def read_kl_base(path: Path) -> KLBase:
    what = f"{path}"
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except FileNotFoundError:
        raise InvalidInputError(f"{what}: no such KL-divergence base file") from None
    except (ValueError, OSError):
        raise InvalidInputError(f"{what}: cannot read it as a KL-divergence base file (empty or not a file)") from None
    raw = data.tobytes()[:4096] if len(data) < 4096 else bytes(data[:4096])
    if raw[:8] != KL_MAGIC:
        raise InvalidInputError(f"{what}: not a KL-divergence base file of llmsuite (bad magic)")
    try:
        version, n_ctx, n_vocab, n_chunk = struct.unpack_from("<IIII", raw, 8)
        pos, strings = 24, []
        for _ in range(3):
            (n,) = struct.unpack_from("<I", raw, pos)
            strings.append(raw[pos + 4: pos + 4 + n].decode())
            pos += 4 + n
    except (struct.error, UnicodeDecodeError):
        raise InvalidInputError(f"{what}: the header is truncated or corrupt") from None
    if version != KL_VERSION:
        raise InvalidInputError(f"{what}: KL base version {version} is not supported (this build reads {KL_VERSION})")
    plan_rows = n_ctx - 1 - n_ctx // 2
    expected = pos + 4 * n_chunk * n_ctx + 2 * n_chunk * plan_rows * row_width(n_vocab)
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "longer than its header says"
        raise InvalidInputError(f"{what}: the file is {state} ({len(data)} bytes, expected {expected})")
    tokens = np.frombuffer(data, dtype="<i4", count=n_chunk * n_ctx, offset=pos)
    rows = np.ndarray((n_chunk, plan_rows, row_width(n_vocab)), dtype="<u2", buffer=data,
                      offset=pos + 4 * n_chunk * n_ctx)
    return KLBase(n_ctx, n_vocab, n_chunk, strings[0], strings[1], strings[2], tokens.astype(np.int32), rows)


@dataclass
class KLStats:
    """llama.cpp's kl_divergence_result, plus the per-token values for percentiles."""
    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def snapshot(self) -> "KLStats":
        return replace(self, kld_values=list(self.kld_values), p_diff_values=list(self.p_diff_values))

    def add(self, logits: np.ndarray, base_logp: np.ndarray, targets: np.ndarray) -> None:
        rows = np.arange(len(targets))
        m, lse = log_softmax_parts(logits)
        logp = logits - (m + lse).astype(np.float32)[:, None]
        nll = -logp[rows, targets].astype(np.float64)
        nll_base = -base_logp[rows, targets].astype(np.float64)
        kept = base_logp > np.float32(KL_FLOOR)
        kld = np.where(kept, np.exp(base_logp) * (base_logp - logp), 0).sum(axis=1, dtype=np.float64)
        same_top = np.argmax(logits, axis=1) == np.argmax(base_logp, axis=1)
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        self.sum_nll += nll.sum()
        self.sum_nll2 += np.square(nll).sum()
        self.sum_nll_base += nll_base.sum()
        self.sum_nll_base2 += np.square(nll_base).sum()
        self.sum_nll_nll_base += (nll * nll_base).sum()
        self.sum_kld += kld.sum()
        self.sum_kld2 += np.square(kld).sum()
        self.sum_p_diff += p_diff.sum()
        self.sum_p_diff2 += np.square(p_diff).sum()
        self.sum_p_diff4 += np.power(p_diff, 4).sum()
        self.n_same_top += int(same_top.sum())
        self.count += len(targets)
        self.kld_values.append(kld)
        self.p_diff_values.append(p_diff)

    def mean_and_uncertainty(self, total: float, total2: float) -> tuple[float, float]:
        if self.count < 1:
            return 0.0, 0.0
        f = total / self.count
        df = total2 / self.count - f * f
        return f, (math.sqrt(df / (self.count - 1)) if df > 0 and self.count > 10 else 0.0)

    def covariance(self) -> float:
        if self.count < 10:
            return 0.0
        n = self.count
        return (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1)


def kl_divergence(ctx: Context, base: KLBase, plan: ChunkPlan,
                  on_chunk: Callable[[int, KLStats], None] | None = None) -> KLStats:
    """KL-divergence against the base, chunk by chunk; Ctrl-C raises Interrupted with the
    statistics of the chunks done."""
    stats = done = KLStats()
    try:
        for index, logits, targets in chunk_logits(ctx, base.tokens, plan):
            stats.add(logits, base.log_probs(index), targets)
            done = stats.snapshot()
            if on_chunk:
                on_chunk(index, stats)
    except KeyboardInterrupt:
        raise Interrupted(done) from None
    return stats


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's interpolation at fraction * (n - 1)."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = fraction * (len(sorted_values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, len(sorted_values) - 1)])


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]) if n % 2 == 0 else sorted_values[n // 2])
