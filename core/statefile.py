"""Binary state files: little-endian fields written in order, read back with bounds checks.

Readers raise `StateFileError` with a sentence naming what is wrong; nothing is applied until a
whole file has been read and checked.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import LLMError


class StateFileError(LLMError):
    """A state file that is truncated, corrupt, or was saved from something else."""


class StateWriter:
    def __init__(self):
        self.parts: list[bytes] = []

    def u32(self, value: int) -> None:
        self.parts.append(struct.pack("<I", value))

    def str(self, value: str) -> None:
        data = value.encode()
        self.u32(len(data))
        self.parts.append(data)

    def array(self, values: np.ndarray) -> None:
        """dtype, shape and bytes, so the reader can check all three."""
        values = np.ascontiguousarray(values)
        self.str(values.dtype.str)
        self.u32(values.ndim)
        for d in values.shape:
            self.u32(d)
        self.parts.append(values.tobytes())

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class StateReader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = memoryview(data), 0, what

    def fail(self, message: str) -> StateFileError:
        return StateFileError(f"{self.what}: {message}")

    def _take(self, n: int, field: str) -> memoryview:
        if self.pos + n > len(self.data):
            raise self.fail(f"the file is truncated (while reading {field})")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u32(self, field: str) -> int:
        return struct.unpack("<I", self._take(4, field))[0]

    def str(self, field: str) -> str:
        n = self.u32(field)
        try:
            return bytes(self._take(n, field)).decode()
        except UnicodeDecodeError:
            raise self.fail(f"{field} is not text; the file is corrupt") from None

    def array(self, field: str, dtype=None, shape: tuple | None = None) -> np.ndarray:
        stored = self.str(field)
        try:
            dt = np.dtype(stored)
        except TypeError:
            raise self.fail(f"{field} has an unknown element type {stored!r}") from None
        dims = tuple(self.u32(field) for _ in range(self.u32(field)))
        if dtype is not None and dt != np.dtype(dtype):
            raise self.fail(f"{field} holds {dt} values, expected {np.dtype(dtype)}")
        if shape is not None and dims != tuple(shape):
            raise self.fail(f"{field} has shape {list(dims)}, expected {list(shape)}")
        n = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
        return np.frombuffer(self._take(n, field), dtype=dt).reshape(dims).copy()

    def expect(self, field: str, got, want) -> None:
        if got != want:
            raise self.fail(f"{field} is {got!r} but this context has {want!r}")

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} unexpected bytes after the end")
