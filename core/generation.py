"""The completion loop behind `llm generate`: prompt in n_batch chunks, then sample and decode
one token at a time until end-of-generation, the token budget or a full context."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .batch import Batch
from .context import Context, DecodeStatus
from .errors import InvalidInputError, LLMError
from .sampling import Sampler

PROMPT_MARGIN = 4  # llama-completion keeps 4 cells free beyond the prompt


@dataclass
class GenerationResult:
    tokens: list[int]
    stop: str  # "eog", "length" or "context"
    t_sample: float = 0.0


def check_prompt(ctx: Context, tokens: list[int]) -> None:
    if not tokens:
        raise InvalidInputError("the prompt is empty and the model adds no BOS token")
    limit = ctx.n_ctx - PROMPT_MARGIN
    if len(tokens) > limit:
        raise InvalidInputError(f"the prompt is too long ({len(tokens)} tokens, the context -c {ctx.n_ctx} "
                                f"allows {limit})")


def decode_or_raise(ctx: Context, batch: Batch) -> None:
    status = ctx.decode(batch)
    if status != DecodeStatus.OK:
        raise LLMError(f"decode failed ({status.name.lower().replace('_', ' ')}): {ctx.last_error}")


def prefill(ctx: Context, tokens: list[int], seq_id: int = 0) -> None:
    """Decode the prompt in -b sized chunks; only the last token asks for logits."""
    n_batch = ctx.params.n_batch
    start = max(ctx.memory.seq_pos_max(seq_id) + 1, 0)
    for i in range(0, len(tokens), n_batch):
        chunk = np.asarray(tokens[i:i + n_batch], dtype=np.int32)
        decode_or_raise(ctx, Batch.from_tokens(chunk, pos0=start + i, seq_id=seq_id))


def generate(ctx: Context, sampler: Sampler, prompt: list[int], n_predict: int = -1,
             on_token: Callable[[int], None] | None = None) -> GenerationResult:
    """Complete `prompt`; n_predict -1 means until end-of-generation or a full context."""
    check_prompt(ctx, prompt)
    vocab = ctx.model.vocab
    prefill(ctx, prompt)
    for tok in prompt:
        sampler.accept(tok)
    out: list[int] = []
    n_past = len(prompt)
    t_sample = 0.0
    while n_predict < 0 or len(out) < n_predict:
        t0 = time.perf_counter()
        tok = sampler.sample(ctx.get_logits())
        sampler.accept(tok)
        t_sample += time.perf_counter() - t0
        if vocab.is_eog(tok):
            return GenerationResult(out, "eog", t_sample)
        out.append(tok)
        if on_token:
            on_token(tok)
        if len(out) == n_predict:
            break
        if n_past >= ctx.n_ctx:
            return GenerationResult(out, "context", t_sample)
        decode_or_raise(ctx, Batch.from_tokens([tok], pos0=n_past))
        n_past += 1
    return GenerationResult(out, "length", t_sample)
