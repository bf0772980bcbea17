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
    stop: str = "length"  # "eog", "length", "context" or "stop string"
    t_sample: float = 0.0
    text: str | None = None  # with stop strings: the text to show, cut before the one found


class TextOut:
    """A sequence's text as its tokens arrive, with stop strings (llama-completion's -r outside
    interactive mode): whole UTF-8 only, cut before the first stop string, and holding back only a
    tail that could still become one, so nothing shown is ever taken back. A stop string that is
    one special token (`-r "<|im_end|>"`) is found by its token, whether or not it is shown."""

    def __init__(self, vocab, stops: tuple[str, ...] = (), special: bool = False):
        self.vocab, self.stops = vocab, tuple(stops)
        self._streamer = vocab.streamer(special)
        self._held = ""
        self.shown: list[str] = []
        self.last = ""  # what the last push made safe to show
        self.found = False

    def push(self, token: int) -> str:
        """The text this token makes safe to show ("" once a stop string was found)."""
        if self.found:
            return self._show("")
        text = self._held + self._streamer.push(token)
        cut = min((i for stop in self.stops if (i := text.find(stop)) >= 0), default=-1)
        if cut < 0 and self.vocab.token_to_piece(token, True).decode("utf-8", "replace") in self.stops:
            cut = len(text)
        if cut >= 0:
            self.found, self._held = True, ""
            return self._show(text[:cut])
        hold = max((n for stop in self.stops for n in range(1, min(len(stop), len(text) + 1))
                    if text.endswith(stop[:n])), default=0)
        self._held = text[len(text) - hold:]
        return self._show(text[:len(text) - hold])

    def flush(self) -> str:
        """At the end: what was held back, unless a stop string was found."""
        return self._show("" if self.found else self._held + self._streamer.flush())

    def _show(self, text: str) -> str:
        self.last = text
        if text:
            self.shown.append(text)
        return text

    @property
    def text(self) -> str:
        return "".join(self.shown)


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
             report: Callable[[str], None] | None = None, n_keep: int | None = None,
             stops: tuple[str, ...] = (), special: bool = False) -> list[GenerationResult]:
    """Complete `prompt` once per sampler, all sequences in one batch per step.

    n_predict -1 means until end-of-generation or a full context; `on_token(seq, token)` sees
    every token as it is accepted; `report` gets what --prompt-cache did. `n_keep` (not None)
    shifts a full context, keeping that many prompt tokens (--context-shift --keep). A sequence
    whose text comes to hold one of `stops` ends there, and its result's `text` is what precedes
    it (`special`: special tokens as text).
    """
    n_seqs = 1 if isinstance(samplers, Sampler) else len(samplers)
    outs = [TextOut(ctx.model.vocab, stops, special) for _ in range(n_seqs)] if stops else None
    steps = generate_steps(ctx, samplers, prompt, n_predict, prompt_cache, report, n_keep, outs)
    while True:
        try:
            seq, token = next(steps)
        except StopIteration as done:
            for result, out in zip(done.value, outs or ()):
                out.flush()
                result.text = out.text
            return done.value
        if on_token:
            on_token(seq, token)


def stream_text(ctx: Context, sampler: Sampler, prompt: list[int], n_predict: int = -1, special: bool = False,
                stops: tuple[str, ...] = (), **options) -> Generator[str, None, GenerationResult]:
    """One completion as text pieces, each as soon as it is whole UTF-8 and cannot be the start
    of one of `stops` (the completion ends before the first stop string); returns the result.
    `options` as generate's (prompt_cache, report, n_keep)."""
    out = TextOut(ctx.model.vocab, stops, special)
    steps = generate_steps(ctx, [sampler], prompt, n_predict, outs=[out], **options)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            tail = out.flush()
            if tail:
                yield tail
            result = done.value[0]
            result.text = out.text if stops else None
            return result
        if out.last:
            yield out.last


def generate_steps(ctx: Context, samplers: list[Sampler] | Sampler, prompt: list[int], n_predict: int = -1,
                   prompt_cache: Path | None = None, report: Callable[[str], None] | None = None,
                   n_keep: int | None = None, outs: list[TextOut] | None = None
                   ) -> Generator[tuple[int, int], None, list[GenerationResult]]:
    """generate() as a generator: yields (sequence, token) as each token is accepted, and returns
    the results. With `outs` (a TextOut per sequence) each accepted token is pushed to its
    sequence's before it is yielded, and a sequence whose TextOut found a stop string ends."""
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
    return (yield from _decode_loop(ctx, samplers, len(prompt), n_predict, n_keep, outs))


def shift_context(ctx: Context, n_past: int, n_keep: int) -> int:
    """llama.cpp's context shift: keep the first n_keep tokens, drop half of the rest and move the
    other half down (the memory re-rotates their keys). Returns the new n_past."""
    n_discard = (n_past - n_keep) // 2
    if n_discard <= 0 or not ctx.memory.seq_rm(0, n_keep, n_keep + n_discard):
        raise InvalidInputError(ctx.memory.refusal or f"--context-shift cannot free cells: --keep {n_keep} holds "
                                f"the context -c {ctx.n_ctx}")
    ctx.memory.seq_add(0, n_keep + n_discard, n_past, -n_discard)
    return n_past - n_discard


def _decode_loop(ctx, samplers, n_past, n_predict, n_keep=None, outs=None
                 ) -> Generator[tuple[int, int], None, list[GenerationResult]]:
    """One token per active sequence per step. With `n_keep` (--context-shift, one sequence) a
    full context is shifted instead of ending the generation; with `outs`, see generate_steps."""
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
            if outs is not None:
                outs[seq].push(tok)
            yield seq, tok
            if outs is not None and outs[seq].found:
                results[seq].stop = "stop string"
                continue
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
