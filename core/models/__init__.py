"""Architectures, one module each, and `load_model` which picks one by GGUF architecture name."""

from __future__ import annotations

from pathlib import Path

from ..backend import get_backend
from ..errors import UnsupportedError
from ..gguf import GGUFFile
from . import bert, deepseek2, deepseek4, deepseek32, gemma3, glm_dsa, granitehybrid, lfm2, llama, mamba, mamba2, qwen3, t5  # noqa: F401
from .base import HParams, Model, ProgressFn
from .registry import ARCHITECTURES


def load_model(path: str | Path, progress: ProgressFn | None = None, backend: str = "cpu",
               numerics: str | None = None) -> Model:
    """The model in `path`, its weights placed and typed for `backend` with these numerics (None: the
    backend's default); a backend lacking an op the architecture calls is refused before loading."""
    compute = get_backend(backend, numerics=numerics)
    gguf = GGUFFile(path)
    try:
        arch = gguf.architecture
        cls = ARCHITECTURES.get(arch)
        if cls is None:
            known = ", ".join(sorted(ARCHITECTURES))
            raise UnsupportedError(f"{gguf.path}: unknown architecture '{arch}' (this engine runs: {known})")
        cls.check_backend(gguf, compute)
        return cls(gguf, progress, compute)
    finally:
        gguf.close()


__all__ = ["load_model", "Model", "HParams", "ARCHITECTURES"]
