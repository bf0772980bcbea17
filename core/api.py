"""The Python API (`import llmsuite`): load a model, generate, stream, score, bench. The CLI's
commands are layers over these same functions (and the core functions they call), so a result
from Python equals the CLI's for the same settings.

Keyword options take the engine's own names: ContextParams' for the context (n_ctx, kv, n_seq_max,
type_k, sparse, ...; the CLI's -c, --kv, -np, -ctk, ...) and SamplerParams' for sampling (temp,
top_k, top_p, min_p, seed, ...); `samplers` takes --samplers' text."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from . import bench as _bench
from . import hub
from .context import Context, context_params
from .errors import InvalidInputError
from .generation import stream_text
from .models import Model, load_model
from .plugins import load_installed
from .perplexity import PerplexityResult, perplexity as _perplexity, perplexity_context, perplexity_tokens, plan_chunks
from .sampling import Sampler, SamplerParams, parse_samplers

DEFAULT_MODEL = "smollm2-135m"
_SAMPLING = {f.name for f in fields(SamplerParams)} - {"chain"}


def load(model: str | Path | None = None, *, backend: str = "cpu", numerics: str | None = None,
         cache_types: Iterable[str] = ("f16",), reporter: hub.Reporter | None = None,
         progress: Callable[[int, int], None] | None = None) -> Model:
    """A known model's name (pulled when not cached) or a GGUF path, loaded for `backend` with its
    kernels readied for these KV-cache types (`llm generate -m MODEL`'s load)."""
    load_installed()  # an installed plugin may register the architecture
    path = hub.resolve_model(None if model is None else str(model), reporter)
    loaded = load_model(path, progress, backend, numerics=numerics)  # None: the backend's own numerics
    loaded.backend.prepare(loaded.weight_types, state_space=loaded.is_recurrent, cache_types=tuple(cache_types))
    return loaded


def sampler(model_or_ctx: Model | Context, samplers: str | None = None, **options) -> Sampler:
    """A sampler with SamplerParams' options (temp, top_k, seed, ...), where the logits live."""
    params = SamplerParams(**options)
    if samplers is not None:
        params = replace(params, chain=parse_samplers(samplers))
    vocab = model_or_ctx.vocab if isinstance(model_or_ctx, Model) else model_or_ctx.model.vocab
    return Sampler(params, model_or_ctx.backend, vocab)


def stream_generate(model: Model | Context, prompt: str, n_predict: int = -1, *, special: bool = False,
                    ignore_eos: bool = False, samplers: str | None = None, stop: Iterable[str] = (),
                    **options) -> Iterator[str]:
    """The completion of `prompt` as text pieces, each as soon as it is whole UTF-8 (`llm generate
    -p PROMPT`'s stream, the prompt not echoed), ending before the first of the `stop` strings
    (`-r`). A Context given is cleared and used as it is."""
    ctx, sampling = _context(model, options)
    if ignore_eos:
        vocab = ctx.model.vocab
        sampling["logit_bias"] = tuple((t, -np.inf) for t in range(vocab.n_tokens) if vocab.is_eog(t))
    chain = sampler(ctx, samplers, **sampling)
    tokens = ctx.model.vocab.tokenize(prompt, add_special=True, parse_special=True)
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in stops):
        raise InvalidInputError("a stop string cannot be empty")
    yield from stream_text(ctx, chain, tokens, n_predict, special, stops)


def generate(model: Model | Context, prompt: str, n_predict: int = -1, **options) -> str:
    """The completion of `prompt` as one string; options as stream_generate's."""
    return "".join(stream_generate(model, prompt, n_predict, **options))


def perplexity(model: Model, text: str, *, n_ctx: int = 512, chunks: int = -1, on_chunk=None,
               **options) -> PerplexityResult:
    """llama-perplexity over `text`: the result's `ppl`, `ppl_error` and `running_ppl` are what
    `llm perplexity -f FILE -c N_CTX` prints."""
    if n_ctx <= 0:
        raise InvalidInputError("perplexity needs a context size n_ctx > 0")
    params = context_params(model, None, options)
    tokens = perplexity_tokens(model, text)
    plan = plan_chunks(len(tokens), n_ctx, params.n_batch, chunks)
    return _perplexity(perplexity_context(model, plan, params), tokens, plan, on_chunk)


def bench(model: str | Path | None = None, tests: Iterable[str] = ("pp512", "tg128"), *, repetitions: int = 5,
          warmup: bool = True, **axes) -> list[_bench.Result]:
    """llama-bench's tests (pp512, tg128, pp512+tg128, tg32@d8192) on a model name or path; each
    axis (kv, attn_mask, sparse_topk, n_threads, type_k, ...: core.bench.AXES) a value or a list,
    swept in llama-bench's order; the other Instance fields (kv_budget, sparse) fixed. Each Result
    has avg_ts and stddev_ts, as `llm bench` prints them."""
    name = DEFAULT_MODEL if model is None else str(model)
    sweep = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in axes.items() if k in _bench.AXES}
    fixed = {k: v for k, v in axes.items() if k not in _bench.AXES}
    runs = _bench.instances([name], [_bench.parse_spec(t) for t in tests], sweep, **fixed)
    runner = _bench.Runner(_bench.loader({name: hub.resolve_model(name)}), repetitions, warmup)
    return [runner.run(inst) for inst in runs]


def _context(model: Model | Context, options: dict) -> tuple[Context, dict]:
    """The context to generate in (a new one from the context options, or the one given, cleared)
    and the sampling options."""
    sampling = {k: options.pop(k) for k in list(options) if k in _SAMPLING}
    if isinstance(model, Context):
        if options:
            raise TypeError(f"context options ({', '.join(sorted(options))}) apply to a new context, not one given")
        model.clear()
        return model, sampling
    return Context(model, **options), sampling
