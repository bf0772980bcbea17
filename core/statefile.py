"""Binary state files: little-endian fields written in order, read back with bounds checks,
and a CRC-32 of everything before it as the last four bytes.

Readers raise `StateFileError` with a sentence naming what is wrong; nothing is applied until a
whole file has been read and checked.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

from .errors import LLMError, excerpt


class StateFileError(LLMError):
    """A state file that is truncated, corrupt, or was saved from something else."""


# what arrays a state file may hold; anything else (objects, strings) is refused before NumPy sees it
ARRAY_TYPES = frozenset(np.dtype(t).str for t in ("<i4", "<i8", "<f4", "<f2", "|u1", "|b1"))
MAX_ARRAY_DIMS = 4


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
        """The fields, then their CRC-32."""
        data = b"".join(self.parts)
        return data + struct.pack("<I", zlib.crc32(data))


class StateReader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = memoryview(data), 0, what

    def verify_checksum(self) -> None:
        """Check the trailing CRC-32, then stop reading before it."""
        if len(self.data) < self.pos + 4:
            raise self.fail("the file is truncated (no checksum)")
        body, (stored,) = self.data[:-4], struct.unpack("<I", self.data[-4:])
        if zlib.crc32(body) != stored:
            raise self.fail("the file is truncated or corrupt (its checksum does not match)")
        self.data = body

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
        if stored not in ARRAY_TYPES:
            raise self.fail(f"{field} has an unknown element type {excerpt(stored)}")
        dt = np.dtype(stored)
        ndim = self.u32(field)
        if ndim > MAX_ARRAY_DIMS:
            raise self.fail(f"{field} has {ndim} dimensions (at most {MAX_ARRAY_DIMS})")
        dims = tuple(self.u32(field) for _ in range(ndim))
        if dtype is not None and dt != np.dtype(dtype):
            raise self.fail(f"{field} holds {dt} values, expected {np.dtype(dtype)}")
        if shape is not None and dims != tuple(shape):
            raise self.fail(f"{field} has shape {list(dims)}, expected {list(shape)}")
        n = math.prod(dims) * dt.itemsize
        return np.frombuffer(self._take(n, field), dtype=dt).reshape(dims).copy()

    def expect(self, field: str, got, want) -> None:
        if got != want:
            raise self.fail(f"{field} is {excerpt(got)} but this context has {excerpt(want)}")

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} unexpected bytes after the end")
