"""`llm embed`: one embedding per input, like llama-embedding (inputs decoded together as separate
sequences; pooled with the model's pooling type or --pooling; normalized as --embd-normalize says)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from llmsuite.core.context import Context
from llmsuite.core.embeddings import POOLING_NAMES, check_normalize, cosine, embed_inputs, normalize
from llmsuite.core.errors import InvalidInputError, Interrupted, excerpt
from llmsuite.core.memory.factory import MAX_SEQ

from . import options as opt
from .common import exit_interrupted, open_model, progress_display, read_text_file

# "default" is llama-embedding's layout without --embd-output-format ("" and "plain" name it too)
OUTPUT_FORMATS = ("default", "raw", "json", "json+", "array")
DEFAULT_ALIASES = ("", "plain")


# as llama-embedding unless given: a batch is one micro-batch (-ub is -b), and holds every input it can (-np)
MicroBatch = Annotated[Optional[int], typer.Option("-ub", "--ubatch-size", help="physical micro-batch size "
                       "(default: -b); an encoder takes a batch whole, so -ub caps its batches")]
Sequences = Annotated[Optional[int], typer.Option("-np", "--parallel", help="inputs decoded together "
                      f"(default: all of them, at most {MAX_SEQ})")]


@opt.with_context_options(ubatch_size=opt.Flag(MicroBatch, None), parallel=opt.Flag(Sequences, None))
def embed(
    texts: Annotated[Optional[list[str]], typer.Argument(help="texts to embed, one vector each")] = None,
    model: opt.Model = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="texts to embed, split at "
                      "--embd-separator (llama-embedding's input; \\n and the like are read as escapes)")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="embed each line (or separated part) of a file")] = None,
    pooling: Annotated[str, typer.Option("--pooling", help=f"auto (the model's) | {' | '.join(POOLING_NAMES)}")] = "auto",
    embd_normalize: Annotated[int, typer.Option("--embd-normalize", help="-1 none, 0 max absolute (int16 range), "
                                                "1 taxicab, 2 euclidean, >2 p-norm")] = 2,
    output_format: Annotated[str, typer.Option("-o", "--embd-output-format", help="default (llama-embedding's "
                             "layout) | raw (one vector a line) | json | json+ | array")] = "default",
    separator: Annotated[str, typer.Option("--embd-separator", help="what separates the inputs of -p and -f")] = "\n",
    *,
    context: opt.ContextOptions,
) -> None:
    """Embed texts (llama-embedding): the vectors go to stdout, nothing until all are made."""
    inputs = _inputs(texts or [], prompt, file, separator)
    check_normalize(embd_normalize)
    output_format = "default" if output_format in DEFAULT_ALIASES else output_format
    if output_format not in OUTPUT_FORMATS:
        raise InvalidInputError(f"unknown --embd-output-format '{output_format}' (choose from {', '.join(OUTPUT_FORMATS)})")
    context = context.apply_llama_cpp_flags()
    ubatch = context.batch_size if context.ubatch_size is None else context.ubatch_size
    n_seq = min(len(inputs), MAX_SEQ) if context.parallel is None else context.parallel
    params = context.params(n_ubatch=ubatch, n_seq_max=n_seq, embeddings=True, pooling=pooling)
    lm, _ = open_model(model, context.backend, (params.type_k, params.type_v), context.numerics)
    if lm.embeddings_refusal:
        raise InvalidInputError(lm.embeddings_refusal)
    if pooling == "auto" and not lm.hparams.pooling:
        raise InvalidInputError(f"{lm.name} ({lm.arch}) has no pooling type: give --pooling mean or last "
                                "(or none for one vector per token)")
    ctx = Context(lm, params)
    tokens = [_tokenize(lm, text, i, ctx.prompt_batch) for i, text in enumerate(inputs)]
    with progress_display() as progress:
        task = progress.add_task(f"embedding {len(inputs)} inputs", total=len(inputs))
        try:
            vectors, interrupted = embed_inputs(ctx, tokens, on_batch=lambda n: progress.advance(task, n)), False
        except Interrupted as stop:
            vectors, interrupted = stop.partial, True
    done = len(vectors)
    if done:
        labels = inputs[:done] if ctx.pooling != "none" else []
        if ctx.pooling == "none":
            vectors = [row for per_token in vectors for row in per_token]
        vectors = [normalize(v, embd_normalize) for v in vectors]
        sys.stdout.write(format_embeddings(vectors, output_format, embd_normalize == 0, labels, ctx.pooling == "none"))
    if interrupted:
        exit_interrupted(f"{done} of {len(inputs)} inputs embedded, and only those printed")
    sys.stdout.flush()


def _inputs(texts: list[str], prompt: str | None, file: Path | None, separator: str) -> list[str]:
    if not separator:
        raise InvalidInputError("--embd-separator cannot be empty")
    inputs = list(texts)
    if prompt is not None:  # llama-embedding's -p: escapes on (its -e default), then split
        inputs += opt.process_escapes(prompt).split(separator)
    if file is not None:
        inputs += read_text_file(file).split(separator)
    if not inputs:
        raise InvalidInputError("nothing to embed: give texts as arguments, -p TEXT or -f FILE")
    for i, text in enumerate(inputs):
        if not text:
            raise InvalidInputError(f"input {i + 1} is empty" + (" (an empty line in -f?)" if file else ""))
    return inputs


def _tokenize(lm, text: str, i: int, n_batch: int) -> list[int]:
    tokens = lm.vocab.tokenize(text, add_special=True, parse_special=True)
    if len(tokens) > n_batch:
        raise InvalidInputError(f"input {i + 1} ({excerpt(text, 40)}) has {len(tokens)} tokens, more than the batch "
                                f"of {n_batch} (-b, at most -c; an encoder's, at most -ub); llama-embedding refuses "
                                "it too")
    return tokens


def format_embeddings(vectors: list[np.ndarray], fmt: str, integral: bool, labels: list[str],
                      per_token: bool = False) -> str:
    """llama-embedding's layouts, to the character: its default (each vector's first 16 values
    when there are several, all of one; per token the first and last three; the cosine matrix of
    several pooled inputs), raw (one vector a line), an OpenAI-style json list (json+ adds the
    cosine matrix) or a bare array of arrays; each followed by the empty line llama-embedding ends with."""
    number = "{:1.0f}" if integral else "{:1.7f}"
    if fmt == "raw":
        return "".join(" ".join(number.format(x) for x in v) + "\n" for v in vectors) + "\n"
    arrays = ["[" + ",".join(number.format(x) for x in v) + "]" for v in vectors]
    if fmt == "array":
        return "[" + ",".join(arrays) + "]\n\n"
    if fmt in ("json", "json+"):
        items = [f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": {a}\n    }}'
                 for j, a in enumerate(arrays)]
        out = '{\n  "object": "list",\n  "data": [\n' + ",\n".join(items) + "\n  ]"
        if fmt == "json+" and len(vectors) > 1:
            rows = ["    [" + ", ".join(f"{cosine(a, b):6.2f}" for b in vectors) + " ]" for a in vectors]
            out += ',\n  "cosineSimilarity": [\n' + ",\n".join(rows) + "\n  ]"
        return out + "\n}\n\n"
    cell = "{:6.0f} " if integral else "{:9.6f} "
    cells = lambda values: "".join(cell.format(x) for x in values)  # noqa: E731
    if per_token:
        lines = [f"embedding {j}: {cells(v[:3])} ... {cells(v[-3:])}" for j, v in enumerate(vectors)]
    else:
        shown = 16 if len(vectors) > 1 else None
        lines = [f"embedding {j}: {cells(v[:shown])}" for j, v in enumerate(vectors)]
    if len(labels) > 1:
        lines += ["", "cosine similarity matrix:", "", "".join(f"{t[:6]:>6} " for t in labels)]
        lines += ["".join(f"{cosine(a, b):6.2f} " for b in vectors) + t[:10] for a, t in zip(vectors, labels)]
    return "\n" + "\n".join(lines) + "\n\n"
