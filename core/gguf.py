"""Read GGUF files: metadata, tensor directory and lazily mapped tensor data.

The `gguf` package supplies the format's constants (value types, tensor types, block sizes,
key names). Its `GGUFReader` parses every array element in Python and takes seconds on a
262k-token vocabulary, so the header is parsed here with one `np.frombuffer` per numeric array;
tensor data stays memory-mapped until a model asks for it. Every malformed input becomes a
`ModelFileError` that names the file and the part that is wrong, quoting at most a short escaped
excerpt of what the file holds.

The engine reads metadata only through the typed getters (`get_int`, `get_float`, `get_bool`,
`get_str`, `get_strs`, `get_numbers`), which check each value's type and range and name the key.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import ModelFileError, UnsupportedError, excerpt

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4
MAX_TENSOR_NAME = 63  # ggml's GGML_MAX_NAME (64) less the terminating NUL
# the fewest bytes an entry can take, to refuse counts the file cannot hold before looping over them
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, dimension count, one dimension, type, offset
MIN_ARRAY_BYTES = 4 + 8  # element type, count
_MISSING = object()
_U64 = struct.Struct("<Q")

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
        return math.prod(self.shape)

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

    def string(self, what: str, max_len: int | None = None, strict: bool = False) -> str:
        """A length-prefixed string; names (`strict`) must be UTF-8, values may hold any bytes."""
        n = self.scalar("<Q", what)
        if max_len is not None and n > max_len:
            raise self.fail(f"{what} is {n} bytes long (at most {max_len})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8", errors="strict" if strict else "surrogateescape")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text ({excerpt(raw)})") from None

    def count(self, what: str, min_bytes: int) -> int:
        """An entry count, refused when the rest of the file cannot hold that many entries."""
        n = self.scalar("<Q", what)
        if n > (len(self.buf) - self.pos) // min_bytes:
            raise self.fail(f"{what} is {n}, more than the file can hold")
        return n

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

    def strings(self, count: int, what: str) -> list[str]:
        """`count` length-prefixed strings (the vocabulary's hot loop, kept tight)."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        unpack = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.need(8, what)
            n = unpack(buf, pos)[0]
            pos += 8
            if n > end - pos:
                self.pos = pos
                self.need(n, what)
            out.append(buf[pos:pos + n].decode("utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out

    def array(self, what: str):
        """A homogeneous list: a NumPy array of numbers, a list of strings or a list of arrays."""
        etype = self.scalar("<I", what)
        if etype == GGUFValueType.STRING:
            return self.strings(self.count(f"the length of {what}", 8), what)
        if etype == GGUFValueType.ARRAY:
            return [self.array(what) for _ in range(self.count(f"the length of {what}", MIN_ARRAY_BYTES))]
        count = self.scalar("<Q", what)
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
            raise cur.fail(f"not a GGUF file (starts with {excerpt(magic)}, expected 'GGUF')")
        cur.pos = 4
        self.version = cur.scalar("<I", "the version")
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version >> 16 in (2, 3):
                raise UnsupportedError(f"{self.path}: big-endian GGUF files are not supported")
            raise UnsupportedError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = cur.count("the tensor count", MIN_TENSOR_INFO_BYTES)
        n_kv = cur.count("the metadata count", MIN_KV_BYTES)
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", strict=True)
            what = f"metadata {excerpt(key)}"
            vtype = cur.scalar("<I", f"the type of {what}")
            if key in self.metadata:
                raise cur.fail(f"{what} appears twice")
            self.metadata[key] = cur.value(vtype, what)
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        alignment = self.get_int("general.alignment", DEFAULT_ALIGNMENT, lo=1, hi=MAX_ALIGNMENT)
        if alignment & (alignment - 1):
            raise cur.fail(f"general.alignment {alignment} is not a power of two")
        self._place_tensors(infos, -(-cur.pos // alignment) * alignment, alignment)

    def _read_tensor_info(self, cur: _Cursor, index: int):
        name = cur.string(f"the name of tensor #{index}", max_len=MAX_TENSOR_NAME, strict=True)
        what = f"tensor {excerpt(name)}"
        n_dims = cur.scalar("<I", f"the dimensions of {what}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"{what} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(int(cur.scalar("<Q", f"the shape of {what}")) for _ in range(n_dims))
        ttype = cur.scalar("<I", f"the type of {what}")
        offset = cur.scalar("<Q", f"the offset of {what}")
        if any(d <= 0 or d >= 1 << 40 for d in shape):
            raise cur.fail(f"{what} has an invalid shape {list(shape)}")
        return name, shape, ttype, offset

    def _place_tensors(self, infos, data_start: int, alignment: int) -> None:
        """llama.cpp's layout rule: tensors lie in directory order, each padded to the alignment,
        and the data ends where the file does (which also catches a wrong general.alignment)."""
        expected = 0
        for name, shape, ttype, rel_offset in infos:
            what = f"tensor {excerpt(name)}"
            if name in self.tensors:
                raise ModelFileError(f"{self.path}: {what} appears twice")
            info = self._tensor_info(what, name, shape, ttype, data_start + rel_offset)
            if rel_offset != expected:
                raise ModelFileError(f"{self.path}: {what} has data offset {rel_offset}, expected {expected} "
                                     f"(tensors follow each other, padded to {alignment} bytes)")
            end = info.offset + info.n_bytes
            if end > len(self._map):
                raise ModelFileError(f"{self.path}: file is truncated: {what} needs bytes up to {end}, "
                                     f"the file has {len(self._map)}")
            self.tensors[name] = info
            expected += -(-info.n_bytes // alignment) * alignment
        data_end = data_start + expected
        if infos and len(self._map) > data_end:
            raise ModelFileError(f"{self.path}: the tensor data ends at byte {data_end} but the file has "
                                 f"{len(self._map)} bytes (is general.alignment {alignment} right?)")

    def _tensor_info(self, what: str, name: str, shape, ttype: int, offset: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(ttype)
        except ValueError:
            raise UnsupportedError(f"{self.path}: {what} has unknown tensor type id {ttype}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if shape[0] % block:
            raise ModelFileError(f"{self.path}: {what} row length {shape[0]} is not a multiple of "
                                 f"the {qtype.name} block size {block}")
        return TensorInfo(name, shape, qtype, offset, math.prod(shape) // block * type_size)

    # ---- metadata access -------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        return self.get_str("general.architecture")

    def get(self, key: str, default=None):
        """The raw value (for display); the engine uses the typed getters below."""
        return self.metadata.get(key, default)

    def _value(self, key: str, default):
        value = self.metadata.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise ModelFileError(f"{self.path}: required metadata {excerpt(key)} is missing")
            return default, False
        return value, True

    def _wrong(self, key: str, want: str, value) -> ModelFileError:
        return ModelFileError(f"{self.path}: metadata {excerpt(key)} should be {want}, not {describe_value(value)}")

    def _out_of_range(self, key: str, value, lo, hi) -> ModelFileError:
        return ModelFileError(f"{self.path}: metadata {excerpt(key)} is {excerpt(value)}, outside {lo}..{hi}")

    def get_int(self, key: str, default=_MISSING, lo: int = 0, hi: int = (1 << 63) - 1,
                per_layer: bool = False) -> int:
        """An integer in [lo, hi]; with `per_layer` also an integer array whose values are all equal."""
        value, present = self._value(key, default)
        if not present:
            return value
        if per_layer and isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.size:
            if np.any(value != value.flat[0]):
                raise UnsupportedError(f"{self.path}: per-layer values for {excerpt(key)} are not supported")
            value = value.flat[0].item()
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong(key, "an integer", value)
        if not lo <= value <= hi:
            raise self._out_of_range(key, value, lo, hi)
        return value

    def get_float(self, key: str, default=_MISSING, lo: float = -math.inf, hi: float = math.inf,
                  positive: bool = False) -> float:
        """A finite number in [lo, hi] (integers accepted), strictly above zero with `positive`."""
        value, present = self._value(key, default)
        if not present:
            return value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._wrong(key, "a number", value)
        value = float(value)
        if not math.isfinite(value) or not lo <= value <= hi or (positive and value <= 0):
            want = "a finite number" + (" above 0" if positive else "")
            if math.isfinite(lo) or math.isfinite(hi):
                want += f" in [{lo:g}, {hi:g}]"
            raise ModelFileError(f"{self.path}: metadata {excerpt(key)} is {excerpt(value)}, not {want}")
        return value

    def get_bool(self, key: str, default=_MISSING) -> bool:
        value, present = self._value(key, default)
        if present and not isinstance(value, bool):
            raise self._wrong(key, "true or false", value)
        return value

    def get_str(self, key: str, default=_MISSING) -> str:
        value, present = self._value(key, default)
        if present and not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        return value

    def get_strs(self, key: str, default=_MISSING) -> list[str]:
        value, present = self._value(key, default)
        if present and not (isinstance(value, list) and (not value or isinstance(value[0], str))):
            raise self._wrong(key, "an array of strings", value)
        return value

    def get_numbers(self, key: str, kinds: str, length: int, default=_MISSING) -> np.ndarray:
        """A numeric array of `length` values whose NumPy kind is in `kinds` ('iu' integers, 'iuf' any)."""
        value, present = self._value(key, default)
        if not present:
            return value
        if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds:
            raise self._wrong(key, "an array of " + ("integers" if "f" not in kinds else "numbers"), value)
        if len(value) != length:
            raise ModelFileError(f"{self.path}: metadata {excerpt(key)} has {len(value)} values, expected {length}")
        return value

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


def describe_value(value) -> str:
    """What a metadata value is, in a few words, for error messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {excerpt(value)}"
    if isinstance(value, str):
        return f"the string {excerpt(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of {value.size} {value.dtype.name} values"
    if isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
        return f"an array of {len(value)} arrays"
    return f"an array of {len(value)} strings"
