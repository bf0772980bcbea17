"""Architectures, one module each, and `load_model` which picks one by GGUF architecture name."""

from __future__ import annotations

from pathlib import Path

from ..errors import UnsupportedError
from ..gguf import GGUFFile
from . import gemma3, llama  # noqa: F401  (registration)
from .base import HParams, Model, ProgressFn
from .registry import ARCHITECTURES


def load_model(path: str | Path, progress: ProgressFn | None = None) -> Model:
    gguf = GGUFFile(path)
    try:
        arch = gguf.architecture
        cls = ARCHITECTURES.get(arch)
        if cls is None:
            known = ", ".join(sorted(ARCHITECTURES))
            raise UnsupportedError(f"{gguf.path}: unknown architecture '{arch}' (this engine runs: {known})")
        return cls(gguf, progress)
    finally:
        gguf.close()


__all__ = ["load_model", "Model", "HParams", "ARCHITECTURES"]
