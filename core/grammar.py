"""Constrained output: a GBNF grammar (llama.cpp's format) or a JSON schema, compiled by llguidance.

llguidance is the grammar engine llama.cpp itself can be built with: it reads GBNF and JSON
schemas, and for each step gives the set of tokens that keep the text inside the grammar as a
bitmask over the vocabulary (a few microseconds for 49k tokens). The sampler sets the logits of
every other token to -inf before its chain, and advances the grammar with each token it picks;
end-of-generation is allowed exactly where the grammar may end.

`compile_grammar` checks the text before any model loads (a GBNF error names its line and column);
`Grammar.matcher(vocab)` makes the per-sequence state once the vocabulary is known.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import InvalidInputError


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar (llguidance's text form) and what it was made from, for messages."""
    compiled: str
    origin: str

    def matcher(self, vocab) -> "GrammarMatcher":
        import llguidance

        matcher = llguidance.LLMatcher(_tokenizer(vocab), self.compiled)
        if matcher.is_error():
            raise InvalidInputError(f"{self.origin}: {_first_line(matcher.get_error())}")
        return GrammarMatcher(matcher, vocab.n_tokens)


def compile_grammar(gbnf: str | None = None, json_schema: str | None = None, origin: str = "--grammar") -> Grammar:
    """A GBNF grammar or a JSON schema (text), checked and compiled; refused in one sentence."""
    import llguidance

    if json_schema is not None:
        try:
            json.loads(json_schema)
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"{origin}: not JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
        kind, text = "json_schema", json_schema
    else:
        kind, text = "gbnf", gbnf or ""
    try:
        compiled = llguidance.grammar_from(kind, text)
    except ValueError as e:
        raise InvalidInputError(f"{origin}: {_located(str(e), text)}") from None
    ok, message = _validate(compiled)
    if not ok:
        raise InvalidInputError(f"{origin}: {_first_line(message)}")
    return Grammar(compiled, origin)


class GrammarMatcher:
    """One sequence's place in the grammar: the tokens allowed next, and a step per token."""

    def __init__(self, matcher, n_tokens: int):
        import llguidance.numpy as lnp

        self._lnp, self._matcher, self.n_tokens = lnp, matcher, n_tokens
        self._bits = lnp.allocate_token_bitmask(1, n_tokens)

    def allowed(self) -> np.ndarray:
        """A bool per token of the vocabulary: may it come next."""
        self._lnp.fill_next_token_bitmask(self._matcher, self._bits, 0)
        return np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")[:self.n_tokens].astype(bool)

    def consume(self, token: int) -> None:
        self._matcher.consume_token(int(token))

    def reset(self) -> None:
        self._matcher.reset()


def _validate(compiled: str) -> tuple[bool, str]:
    """llguidance's check of a compiled grammar without a tokenizer (a JSON schema's types...)."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, None)
    return (False, "; ".join(messages) or "the grammar is invalid") if failed else (True, "")


def _located(message: str, text: str) -> str:
    """llguidance's GBNF error (`… at line N, '<text before>' ^ '<text after>'`) as `line N, column C: …`."""
    message = message.removeprefix("Failed to convert the grammar from GBNF to Lark: ")
    found = re.match(r"(.*) at line (\d+), '(.*)' \^ '(.*)'$", message, flags=re.S)
    if not found:
        return _first_line(message)
    what, line = found.group(1), int(found.group(2))
    before = found.group(3).replace("\\n", "\n").replace("\\t", "\t").replace("\\'", "'").replace('\\"', '"')
    at = text.find(before) + len(before) if before and before in text else None
    if at is None:
        return f"line {line}: {what}"
    row = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"line {row}, column {column}: {what}"


def _first_line(message: str) -> str:
    return " ".join(message.strip().splitlines()[:1]) or "the grammar is invalid"


@lru_cache(maxsize=4)
def _tokenizer(vocab):
    """llguidance's view of a vocabulary: every token's bytes, end-of-sequence, and tokenization."""
    import llguidance

    class View:
        def __init__(self):
            self.tokens = [vocab.token_to_piece(t, True) for t in range(vocab.n_tokens)]
            self.eos_token_id = vocab.eos if vocab.eos is not None and vocab.eos >= 0 else next(
                t for t in range(vocab.n_tokens) if vocab.is_eog(t))
            self.bos_token_id = None
            self.special_token_ids = [t for t in range(vocab.n_tokens) if vocab.is_eog(t)]

        def __call__(self, text):
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            return vocab.tokenize(text, add_special=False, parse_special=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(View()))
