"""Read GGUF files: metadata, tensor directory and lazily mapped tensor data.

The `gguf` package supplies the format's constants (value types, tensor types, block sizes,
key names). Its `GGUFReader` parses every array element in Python and takes seconds on a
262k-token vocabulary, so the header is parsed here with one `np.frombuffer` per numeric array;
tensor data stays memory-mapped until a model asks for it. Every malformed input becomes a
`ModelFileError` that names the file and the part that is wrong.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import ModelFileError, UnsupportedError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

_NUMPY_TYPES = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous (row) dimension
    type: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))


class _Cursor:
    """Bounds-checked little-endian reader over the mapped file."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"file is truncated while reading {what} (needs {n} bytes at offset {self.pos}, "
                            f"file has {len(self.buf)})")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, what: str):
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what)
        try:
            dtype = np.dtype(_NUMPY_TYPES[GGUFValueType(vtype)])
        except (ValueError, KeyError):
            raise self.fail(f"{what} has unknown value type {vtype}") from None
        self.need(dtype.itemsize, what)
        value = np.frombuffer(self.buf, dtype=dtype, count=1, offset=self.pos)[0].item()
        self.pos += dtype.itemsize
        return value

    def array(self, what: str):
        etype = self.scalar("<I", what)
        count = self.scalar("<Q", what)
        if etype == GGUFValueType.STRING:
            if count > len(self.buf) - self.pos:  # every string needs at least 8 bytes
                raise self.fail(f"{what} claims {count} strings, more than the file can hold")
            return [self.string(what) for _ in range(count)]
        if etype == GGUFValueType.ARRAY:
            return [self.array(what) for _ in range(count)]
        try:
            dtype = np.dtype(_NUMPY_TYPES[GGUFValueType(etype)])
        except (ValueError, KeyError):
            raise self.fail(f"{what} is an array of unknown value type {etype}") from None
        self.need(count * dtype.itemsize, what)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += count * dtype.itemsize
        return values


class GGUFFile:
    """A memory-mapped GGUF file: `metadata` (key → value) and `tensors` (name → TensorInfo)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self.path.stat().st_size
                if size == 0:
                    raise ModelFileError(f"{self.path}: file is empty, not a GGUF model")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise ModelFileError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise ModelFileError(f"{self.path}: is a directory, not a GGUF file") from None
        except PermissionError:
            raise ModelFileError(f"{self.path}: permission denied") from None
        self.metadata: dict[str, object] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _parse(self) -> None:
        cur = _Cursor(self._map, self.path)
        cur.need(4, "the magic number")
        magic = bytes(self._map[:4])
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.scalar("<I", "the version")
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version >> 16 in (2, 3):
                raise UnsupportedError(f"{self.path}: big-endian GGUF files are not supported")
            raise UnsupportedError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.scalar("<I", f"the type of '{key}'")
            if key in self.metadata:
                raise cur.fail(f"duplicate metadata key '{key}'")
            self.metadata[key] = cur.value(vtype, f"metadata '{key}'")
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment {alignment} is not a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        for name, shape, ttype, rel_offset in infos:
            self.tensors[name] = self._place_tensor(name, shape, ttype, rel_offset, data_start, alignment)

    def _read_tensor_info(self, cur: _Cursor, index: int):
        name = cur.string(f"tensor name #{index}")
        n_dims = cur.scalar("<I", f"the dimensions of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(int(cur.scalar("<Q", f"the shape of tensor '{name}'")) for _ in range(n_dims))
        ttype = cur.scalar("<I", f"the type of tensor '{name}'")
        offset = cur.scalar("<Q", f"the offset of tensor '{name}'")
        if any(d <= 0 or d >= 1 << 40 for d in shape):
            raise cur.fail(f"tensor '{name}' has an invalid shape {list(shape)}")
        return name, shape, ttype, offset

    def _place_tensor(self, name, shape, ttype, rel_offset, data_start, alignment) -> TensorInfo:
        if name in self.tensors:
            raise ModelFileError(f"{self.path}: duplicate tensor '{name}'")
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise UnsupportedError(f"{self.path}: tensor '{name}' has unknown tensor type id {ttype}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if shape[0] % block:
            raise ModelFileError(f"{self.path}: tensor '{name}' row length {shape[0]} is not a multiple of "
                                 f"the {qtype.name} block size {block}")
        n_bytes = int(np.prod(shape, dtype=object)) // block * type_size
        if rel_offset % alignment:
            raise ModelFileError(f"{self.path}: tensor '{name}' data offset {rel_offset} is not aligned to {alignment}")
        offset = data_start + rel_offset
        if offset + n_bytes > len(self._map):
            raise ModelFileError(f"{self.path}: file is truncated: tensor '{name}' needs bytes up to "
                                 f"{offset + n_bytes}, the file has {len(self._map)}")
        return TensorInfo(name, shape, qtype, offset, n_bytes)

    # ---- metadata access -------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(f"{self.path}: metadata 'general.architecture' is missing")
        return arch

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise ModelFileError(f"{self.path}: required metadata '{key}' is missing")
        return self.metadata[key]

    # ---- tensor access ---------------------------------------------------------------------

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path}: required tensor '{name}' is missing") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file."""
        info = self.tensor_info(name)
        return np.frombuffer(self._map, dtype=np.uint8, count=info.n_bytes, offset=info.offset)

    def load(self, name: str, dtype=np.float32) -> np.ndarray:
        """The tensor dequantized to `dtype`, in NumPy order (reversed ggml shape)."""
        from .quants import dequantize

        info = self.tensor_info(name)
        flat = dequantize(self.raw(name), info.type, info.n_elements, name=name, dtype=dtype)
        return flat.reshape(info.numpy_shape)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # arrays still view the map; it is released with them
            pass
