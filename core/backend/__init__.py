"""Backends: an array module plus the ops the models call. `cpu` is NumPy; `cuda` comes with CuPy."""

from ..errors import InvalidInputError
from .cpu import CPUBackend

BACKENDS = ("cpu",)


def get_backend(name: str = "cpu"):
    if name == "cpu":
        return CPUBackend()
    raise InvalidInputError(f"unknown backend '{name}' (available: {', '.join(BACKENDS)})")
