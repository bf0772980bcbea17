"""llama-cli's conversation over one context: every turn renders the whole history with the chat
template and decodes only the text that is new since the last render (the cache keeps earlier
turns), then samples the answer until end-of-generation, a reverse prompt or the token budget.

`-i` (interactive, no template) is the same loop over raw text: the history is the prompt and
each input and answer appended to it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .batch import Batch
from .chat import ChatTemplate, render_for
from .context import Context
from .errors import InvalidInputError
from .generation import PROMPT_MARGIN, decode_or_raise, prefill
from .sampling import Sampler


@dataclass
class Turn:
    text: str  # the answer as shown
    tokens: list[int] = field(default_factory=list)
    stop: str = "length"  # "eog", "length", "reverse prompt", "interrupted" or "context"


class Conversation:
    """The history of one conversation and the context that holds it. `template` None: raw text
    (interactive mode); else the model's chat template (or the one given)."""

    def __init__(self, ctx: Context, sampler: Sampler, template: ChatTemplate | str | None, system: str = "",
                 prompt: str = ""):
        self.ctx, self.sampler, self.template = ctx, sampler, template
        self.vocab = ctx.model.vocab
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.raw = prompt  # interactive mode: the text so far
        self.cached_text = ""  # the text whose tokens the cache holds, in order
        self.tokens: list[int] = []  # those tokens
        self.t_sample = 0.0  # seconds spent sampling, for the timing summary

    # ---- rendering ---------------------------------------------------------------------------

    def render(self, add_generation_prompt: bool) -> str:
        if self.template is None:
            return self.raw
        return render_for(self.vocab, self.template, self.messages, add_generation_prompt)

    def add_user(self, text: str) -> None:
        if self.template is None:
            self.raw += text
        else:
            self.messages.append({"role": "user", "content": text})

    # ---- one turn ----------------------------------------------------------------------------

    def feed(self) -> int:
        """Decode what the history holds beyond the cache; returns how many tokens that was. A
        template that rewrites earlier turns (so the cached text is no longer a prefix) costs a
        fresh decode of the whole history."""
        text = self.render(add_generation_prompt=True)
        if not text.startswith(self.cached_text):
            self.ctx.clear()
            self.cached_text, self.tokens = "", []
        first = not self.tokens
        new = self.vocab.tokenize(text[len(self.cached_text):], add_special=first, parse_special=True)
        if first and not new:
            raise InvalidInputError("the conversation is empty and the model adds no BOS token")
        room = self.ctx.n_ctx - PROMPT_MARGIN - len(self.tokens)
        if len(new) > room:
            raise InvalidInputError(f"the context is full: this turn needs {len(new)} tokens and -c "
                                    f"{self.ctx.n_ctx} has room for {max(room, 0)} (give a larger -c)")
        prefill(self.ctx, new)
        for tok in new:
            self.sampler.accept(tok)
        self.cached_text, self.tokens = text, self.tokens + new
        return len(new)

    def answer(self, n_predict: int = -1, reverse_prompts: tuple[str, ...] = (),
               on_text: Callable[[str], None] | None = None, interrupted: Callable[[], bool] = lambda: False) -> Turn:
        """Sample the answer after `feed()`; its tokens stay in the cache and in the history."""
        turn = Turn("")
        self.sampler.reset_grammar()  # each answer follows the grammar from its start
        streamer = self.vocab.streamer()
        logits = self.ctx.get_logits()
        while n_predict < 0 or len(turn.tokens) < n_predict:
            if interrupted():
                turn.stop = "interrupted"
                break
            t0 = time.perf_counter()
            tok = self.sampler.sample(logits)
            self.sampler.accept(tok)
            self.t_sample += time.perf_counter() - t0
            if self.vocab.is_eog(tok):
                turn.stop = "eog"
                break
            piece = streamer.push(tok)
            turn.tokens.append(tok)
            turn.text += piece
            if on_text and piece:
                on_text(piece)
            if len(self.tokens) + len(turn.tokens) >= self.ctx.n_ctx:
                turn.stop = "context"
                break
            self._decode_one(tok, len(self.tokens) + len(turn.tokens) - 1)
            logits = self.ctx.get_logits()
            if any(turn.text.endswith(r) for r in reverse_prompts):
                turn.stop = "reverse prompt"
                break
        tail = streamer.flush()
        turn.text += tail
        if on_text and tail:
            on_text(tail)
        self._keep(turn)
        return turn

    def _decode_one(self, tok: int, pos: int) -> None:
        decode_or_raise(self.ctx, Batch.from_tokens(np.array([tok], np.int32), pos0=pos))

    def _keep(self, turn: Turn) -> None:
        """The answer joins the history; the cache holds its tokens (the last one sampled is not
        decoded yet where the answer stopped before decoding it)."""
        decoded = self.ctx.memory.seq_pos_max(0) + 1 - len(self.tokens)
        kept = turn.tokens[:decoded]
        text = self.vocab.detokenize(kept)
        if self.template is None:
            self.raw += turn.text
        else:
            self.messages.append({"role": "assistant", "content": turn.text})
        self.cached_text += text
        self.tokens += kept
