"""The completion loop behind `llm generate`: prompt in n_batch chunks, then sample and decode
one token per sequence per step until end-of-generation, the token budget or a full context.

With several samplers the prompt is decoded once on sequence 0 and shared with the others
through `seq_cp` (the same cells in a unified cache, a copy per stream in a split one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generator

import numpy as np

from .batch import Batch
from .context import Context, DecodeStatus, check_status
from .errors import InvalidInputError
from .sampling import Sampler

PROMPT_MARGIN = 4  # llama-completion keeps 4 cells free beyond the prompt


@dataclass
class GenerationResult:
    tokens: list[int] = field(default_factory=list)
    stop: str = "length"  # "eog", "length" or "context"
    t_sample: float = 0.0


def check_prompt(ctx: Context, tokens: list[int]) -> None:
    """Refuse a prompt the context cannot take with room left to generate."""
    ctx.check_prompt(tokens, PROMPT_MARGIN)


def check_context_shift(ctx: Context, n_seqs: int) -> None:
    if n_seqs > 1:
        raise InvalidInputError("--context-shift moves one sequence's cached keys: drop -np")
    if ctx.memory.shift_refusal:
        raise InvalidInputError(f"--context-shift drops the middle of a sequence and moves the rest down; "
                                f"--kv {ctx.memory.kind} cannot: {ctx.memory.shift_refusal}")


def decode_or_raise(ctx: Context, batch: Batch) -> None:
    check_status(ctx, ctx.decode(batch))


def prefill(ctx: Context, tokens: list[int], seq_id: int = 0) -> None:
    """Decode tokens after what the sequence holds, in -b sized chunks; the last one asks for logits."""
    n_batch = ctx.params.n_batch
    start = max(ctx.memory.seq_pos_max(seq_id) + 1, 0)
    for i in range(0, len(tokens), n_batch):
        chunk = np.asarray(tokens[i:i + n_batch], dtype=np.int32)
        decode_or_raise(ctx, Batch.from_tokens(chunk, pos0=start + i, seq_id=seq_id))


def reuse_prompt_cache(ctx: Context, path: Path, prompt: list[int], report=None) -> tuple[int, bool]:
    """Load a saved prompt state and keep the part that matches `prompt` (llama-completion's
    --prompt-cache). Returns how many prompt tokens need no decoding (the last one is always
    decoded again, for its logits) and whether the file held the whole prompt."""
    report = report or (lambda message: None)
    if not path.exists():
        report(f"prompt cache: {path} does not exist yet: the prompt state will be saved to it")
        return 0, False
    saved = ctx.load_state(path)
    n_match = 0
    while n_match < min(len(saved), len(prompt)) and saved[n_match] == prompt[n_match]:
        n_match += 1
    keep = min(n_match, len(prompt) - 1)
    if not ctx.memory.seq_rm(0, keep, -1):  # a recurrent state cannot drop its tail: start over
        ctx.memory.clear()
        keep = 0
    report(f"prompt cache: loaded {len(saved)} tokens from {path}; {n_match} of the prompt's {len(prompt)} match, "
           f"{keep} reused")
    return keep, n_match == len(prompt)


def generate(ctx: Context, samplers: list[Sampler] | Sampler, prompt: list[int], n_predict: int = -1,
             on_token: Callable[[int, int], None] | None = None, prompt_cache: Path | None = None,
             report: Callable[[str], None] | None = None, n_keep: int | None = None) -> list[GenerationResult]:
    """Complete `prompt` once per sampler, all sequences in one batch per step.

    n_predict -1 means until end-of-generation or a full context; `on_token(seq, token)` sees
    every token as it is accepted; `report` gets what --prompt-cache did. `n_keep` (not None)
    shifts a full context, keeping that many prompt tokens (--context-shift --keep).
    """
    steps = generate_steps(ctx, samplers, prompt, n_predict, prompt_cache, report, n_keep)
    while True:
        try:
            seq, token = next(steps)
        except StopIteration as done:
            return done.value
        if on_token:
            on_token(seq, token)


def stream_text(ctx: Context, sampler: Sampler, prompt: list[int], n_predict: int = -1, special: bool = False,
                **options) -> Generator[str, None, GenerationResult]:
    """One completion as text pieces, each as soon as it is whole UTF-8; returns the result.
    `options` as generate's (prompt_cache, report, n_keep)."""
    streamer = ctx.model.vocab.streamer(special)
    steps = generate_steps(ctx, [sampler], prompt, n_predict, **options)
    while True:
        try:
            _, token = next(steps)
        except StopIteration as done:
            tail = streamer.flush()
            if tail:
                yield tail
            return done.value[0]
        piece = streamer.push(token)
        if piece:
            yield piece


def generate_steps(ctx: Context, samplers: list[Sampler] | Sampler, prompt: list[int], n_predict: int = -1,
                   prompt_cache: Path | None = None, report: Callable[[str], None] | None = None,
                   n_keep: int | None = None) -> Generator[tuple[int, int], None, list[GenerationResult]]:
    """generate() as a generator: yields (sequence, token) as each token is accepted, and returns
    the results."""
    samplers = [samplers] if isinstance(samplers, Sampler) else samplers
    if n_keep is not None:
        check_context_shift(ctx, len(samplers))
    if len(samplers) > ctx.params.n_seq_max:
        raise InvalidInputError(f"{len(samplers)} completions need -np {len(samplers)}")
    check_prompt(ctx, prompt)
    prompt = ctx.start_prompt(prompt, len(samplers), prompt_cache)  # an encoder-decoder encodes it
    n_cached, complete = reuse_prompt_cache(ctx, prompt_cache, prompt, report) if prompt_cache else (0, True)
    prefill(ctx, prompt[n_cached:])
    if not complete:
        ctx.save_state(prompt_cache, prompt)
        if report:
            report(f"prompt cache: saved the state of the {len(prompt)} prompt tokens to {prompt_cache}")
    for seq in range(1, len(samplers)):
        ctx.memory.seq_cp(0, seq, -1, -1)
    for sampler in samplers:
        for tok in prompt:
            sampler.accept(tok)
    if n_keep is not None:
        n_keep = len(prompt) if n_keep < 0 else min(n_keep + (1 if ctx.model.vocab.add_bos else 0), len(prompt))
    return (yield from _decode_loop(ctx, samplers, len(prompt), n_predict, n_keep))


def shift_context(ctx: Context, n_past: int, n_keep: int) -> int:
    """llama.cpp's context shift: keep the first n_keep tokens, drop half of the rest and move the
    other half down (the memory re-rotates their keys). Returns the new n_past."""
    n_discard = (n_past - n_keep) // 2
    if n_discard <= 0 or not ctx.memory.seq_rm(0, n_keep, n_keep + n_discard):
        raise InvalidInputError(ctx.memory.refusal or f"--context-shift cannot free cells: --keep {n_keep} holds "
                                f"the context -c {ctx.n_ctx}")
    ctx.memory.seq_add(0, n_keep + n_discard, n_past, -n_discard)
    return n_past - n_discard


def _decode_loop(ctx, samplers, n_past, n_predict, n_keep=None) -> Generator[tuple[int, int], None, list[GenerationResult]]:
    """One token per active sequence per step. With `n_keep` (--context-shift, one sequence) a
    full context is shifted instead of ending the generation."""
    vocab = ctx.model.vocab
    results = [GenerationResult() for _ in samplers]
    logits = {seq: ctx.get_logits() for seq in range(len(samplers))}  # all share the prompt's last logits
    active = list(range(len(samplers))) if n_predict != 0 else []
    capacity = ctx.seq_capacity()
    while active:
        step = []
        for seq in active:
            t0 = time.perf_counter()
            tok = samplers[seq].sample(logits[seq])
            samplers[seq].accept(tok)
            results[seq].t_sample += time.perf_counter() - t0
            if vocab.is_eog(tok):
                results[seq].stop = "eog"
                continue
            results[seq].tokens.append(tok)
            yield seq, tok
            if len(results[seq].tokens) == n_predict:
                continue
            if n_past >= capacity and n_keep is not None:
                n_past = shift_context(ctx, n_past, n_keep)
            if n_past >= capacity:
                results[seq].stop = "context"
                continue
            step.append((seq, tok))
        active = [seq for seq, _ in step]
        if not step:
            break
        batch = Batch(np.array([t for _, t in step], np.int32), pos=np.full(len(step), n_past, np.int32),
                      seq_id=np.array(active, np.int32), output=np.ones(len(step), bool))
        status = ctx.decode(batch)
        if status == DecodeStatus.NO_SLOT:  # the shared cells ran out
            for seq in active:
                results[seq].stop = "context"
            break
        check_status(ctx, status)
        logits = {seq: ctx.get_logits(i) for i, seq in enumerate(active)}
        n_past += 1
    return results
