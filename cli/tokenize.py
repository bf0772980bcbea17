"""`llm tokenize`: show how a model tokenizes text (llama-tokenize)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from llmsuite.core.errors import InvalidInputError
from llmsuite.core.gguf import GGUFFile
from llmsuite.core.vocab import Vocab

from .common import resolve


def tokenize(
    text: Annotated[str, typer.Argument(help="text to tokenize")],
    model: Annotated[Optional[str], typer.Option("-m", "--model", help="GGUF path or known model name")] = None,
    ids: Annotated[bool, typer.Option("--ids", help="print only the ids, as one JSON list")] = False,
    pieces: Annotated[bool, typer.Option("--pieces", help="print only the pieces, as one JSON list")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print [{id, piece}, ...] as JSON")] = False,
    no_bos: Annotated[bool, typer.Option("--no-bos", help="do not add BOS/EOS even if the model does")] = False,
    no_parse_special: Annotated[bool, typer.Option("--no-parse-special",
                                                   help="treat control-token text as plain text")] = False,
) -> None:
    """Tokenize TEXT; BOS is added when the model adds it."""
    if sum((ids, pieces, as_json)) > 1:
        raise InvalidInputError("choose one of --ids, --pieces and --json")
    vocab = Vocab(GGUFFile(resolve(model)))
    tokens = vocab.tokenize(text, add_special=not no_bos, parse_special=not no_parse_special)
    texts = [vocab.token_to_piece(t, special=True).decode("utf-8", errors="replace") for t in tokens]
    if ids:
        typer.echo(json.dumps(tokens))
    elif pieces:
        typer.echo(json.dumps(texts, ensure_ascii=False))
    elif as_json:
        typer.echo(json.dumps([{"id": t, "piece": p} for t, p in zip(tokens, texts)], ensure_ascii=False))
    else:
        for t, p in zip(tokens, texts):
            typer.echo(f"{t:6d} -> '{p}'")
