"""Architectures registered by their GGUF `general.architecture` name."""

from __future__ import annotations

ARCHITECTURES: dict[str, type] = {}


def register(arch: str):
    def wrap(cls):
        ARCHITECTURES[arch] = cls
        return cls
    return wrap
