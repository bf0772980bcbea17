"""Architectures registered by their GGUF `general.architecture` name."""

from __future__ import annotations

from ..plugins import register as _register

ARCHITECTURES: dict[str, type] = {}


def register(arch: str):
    """Register the decorated Model subclass for GGUF files whose general.architecture is `arch`."""
    def wrap(cls):
        _register("architecture", arch, ARCHITECTURES, cls)
        return cls
    return wrap
