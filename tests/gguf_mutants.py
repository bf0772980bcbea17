"""Structured mutations of a GGUF file for the fuzz tests.

`GGUFImage.parse` splits a file into its header, key/values, tensor directory and data (its own
small parser, independent of the engine's); a mutation changes one thing and `serialize` writes
the file back with the original layout, so a changed `general.alignment` is a lie the reader
must catch, as it would be in a corrupted file. Raw mutations (truncation, flipped bytes,
overwritten length fields) work on the bytes and use the offsets the parser recorded.
"""

from __future__ import annotations

import copy
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as VT

SCALARS = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
           VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}
DTYPES = {t: np.dtype(f) for t, f in SCALARS.items()}

# every key the engine reads, with the kind of value it expects
ENGINE_KEYS = {
    "general.architecture": "str", "general.alignment": "int", "general.name": "str",
    "general.size_label": "str", "general.file_type": "int",
    "{arch}.context_length": "int", "{arch}.embedding_length": "int", "{arch}.block_count": "int",
    "{arch}.feed_forward_length": "int", "{arch}.attention.head_count": "int",
    "{arch}.attention.head_count_kv": "int", "{arch}.attention.key_length": "int",
    "{arch}.attention.value_length": "int", "{arch}.attention.layer_norm_rms_epsilon": "float",
    "{arch}.rope.freq_base": "float", "{arch}.rope.dimension_count": "int", "{arch}.rope.scale_linear": "float",
    "{arch}.vocab_size": "int", "{arch}.attention.sliding_window": "int",
    "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str", "tokenizer.ggml.tokens": "strs",
    "tokenizer.ggml.scores": "floats", "tokenizer.ggml.token_type": "ints", "tokenizer.ggml.merges": "strs",
    "tokenizer.ggml.bos_token_id": "int", "tokenizer.ggml.eos_token_id": "int",
    "tokenizer.ggml.add_bos_token": "bool", "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool", "tokenizer.chat_template": "str",
}

# (label, value type, payload): one value of every type, and the awkward ones
WRONG_VALUES = [
    ("string", VT.STRING, b"abc"), ("string 8k", VT.STRING, b"8k"), ("escape string", VT.STRING, b"\x1b[2J\x07"),
    ("non-utf8 string", VT.STRING, b"\xff\xfe"), ("u8 7", VT.UINT8, 7), ("i32 -1", VT.INT32, -1),
    ("u32 0", VT.UINT32, 0), ("u64 2^63", VT.UINT64, 1 << 63), ("i64 min", VT.INT64, -(1 << 63)),
    ("f32 nan", VT.FLOAT32, float("nan")), ("f32 inf", VT.FLOAT32, float("inf")), ("f64 1e300", VT.FLOAT64, 1e300),
    ("f32 0", VT.FLOAT32, 0.0), ("bool", VT.BOOL, True),
    ("u32 array", VT.ARRAY, (VT.UINT32, np.array([1, 2, 3]))), ("empty array", VT.ARRAY, (VT.UINT32, np.array([]))),
    ("string array", VT.ARRAY, (VT.STRING, [b"a", b"b"])),
    ("nested array", VT.ARRAY, (VT.ARRAY, [(VT.INT32, np.array([1]))])),
]
INT_VALUES = [("0", 0), ("1", 1), ("-1", -1), ("2^31", 1 << 31), ("2^40", 1 << 40), ("2^63", 1 << 63)]
FLOAT_VALUES = [("0", 0.0), ("-1", -1.0), ("nan", float("nan")), ("inf", float("inf")), ("1e30", 1e30),
                ("1e-30", 1e-30)]


@dataclass
class Tensor:
    name: bytes
    dims: list[int]
    type: int
    offset: int


@dataclass
class GGUFImage:
    version: int
    kvs: list[list]  # [key bytes, value type, payload]
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    n_tensors: int | None = None  # header counts; None: the real ones
    n_kv: int | None = None
    offsets: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # section → (offset, label)

    @classmethod
    def parse(cls, data: bytes) -> "GGUFImage":
        r = _Reader(data)
        assert r.take(4) == b"GGUF"
        version, n_tensors, n_kv = r.unpack("<I"), r.unpack("<Q"), r.unpack("<Q")
        offsets = {"header": [(0, "magic"), (4, "version"), (8, "tensor count"), (16, "metadata count")],
                   "kv": [], "lengths": [], "tensors": []}
        kvs = []
        for _ in range(n_kv):
            offsets["kv"].append((r.pos, "key"))
            offsets["lengths"].append((r.pos, "key length"))
            key = r.string()
            vtype = r.unpack("<I")
            if vtype == VT.STRING:
                offsets["lengths"].append((r.pos, f"length of {key.decode()}"))
            kvs.append([key, vtype, r.value(vtype)])
        tensors = []
        for _ in range(n_tensors):
            offsets["tensors"].append((r.pos, "tensor"))
            offsets["lengths"].append((r.pos, "tensor name length"))
            name = r.string()
            dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
            tensors.append(Tensor(name, dims, r.unpack("<I"), r.unpack("<Q")))
        alignment = 32
        for key, vtype, value in kvs:
            if key == b"general.alignment":
                alignment = value
        start = -(-r.pos // alignment) * alignment
        offsets["data"] = [(start, "tensor data")]
        return cls(version, kvs, tensors, data[start:], alignment, offsets=offsets)

    def serialize(self) -> bytes:
        out = [b"GGUF", struct.pack("<IQQ", self.version,
                                    len(self.tensors) if self.n_tensors is None else self.n_tensors,
                                    len(self.kvs) if self.n_kv is None else self.n_kv)]
        for key, vtype, value in self.kvs:
            out += [_string(key), struct.pack("<I", vtype), _value(vtype, value)]
        for t in self.tensors:
            out += [_string(t.name), struct.pack("<I", len(t.dims)), *(struct.pack("<Q", d) for d in t.dims),
                    struct.pack("<IQ", t.type, t.offset)]
        header = b"".join(out)
        return header + bytes(-len(header) % self.alignment) + self.data

    # ---- edits ---------------------------------------------------------------------------

    def arch(self) -> str:
        return next(v for k, _, v in self.kvs if k == b"general.architecture").decode()

    def find(self, key: str) -> list | None:
        return next((kv for kv in self.kvs if kv[0] == key.encode()), None)

    def set(self, key: str, vtype: int, value) -> "GGUFImage":
        img = copy.copy(self)
        img.kvs = [kv for kv in self.kvs if kv[0] != key.encode()] + [[key.encode(), vtype, value]]
        old = self.find(key)
        if old is not None:  # keep the position
            img.kvs = [[key.encode(), vtype, value] if kv[0] == key.encode() else kv for kv in self.kvs]
        return img

    def drop(self, key: str) -> "GGUFImage":
        img = copy.copy(self)
        img.kvs = [kv for kv in self.kvs if kv[0] != key.encode()]
        return img

    def with_tensor(self, index: int, **changes) -> "GGUFImage":
        img = copy.copy(self)
        img.tensors = list(self.tensors)
        img.tensors[index] = Tensor(**{**self.tensors[index].__dict__, **changes})
        return img


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        return self.take(self.unpack("<Q"))

    def value(self, vtype: int):
        if vtype == VT.STRING:
            return self.string()
        if vtype == VT.ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in DTYPES:
                arr = np.frombuffer(self.data, DTYPES[etype], count, self.pos).copy()
                self.pos += arr.nbytes
                return etype, arr
            return etype, [self.value(etype) for _ in range(count)]
        return self.unpack(SCALARS[vtype])


def _string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value) -> bytes:
    if vtype == VT.STRING:
        return _string(value)
    if vtype == VT.ARRAY:
        etype, items = value
        head = struct.pack("<IQ", etype, len(items))
        if etype in DTYPES:
            return head + np.asarray(items).astype(DTYPES[etype]).tobytes()
        return head + b"".join(_value(etype, item) for item in items)
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return struct.pack(SCALARS[vtype], value)
    bits = 8 * struct.calcsize(SCALARS[vtype])
    value = int(value) & ((1 << bits) - 1)  # wrap, as a flipped field would
    return struct.pack(SCALARS[vtype].upper() if vtype != VT.BOOL else "<?", value)


# ---- the catalogue ---------------------------------------------------------------------------

def structured_mutants(img: GGUFImage):
    """(label, GGUFImage) for every structured mutation."""
    arch = img.arch()
    keys = [k.format(arch=arch) for k in ENGINE_KEYS]
    for key in keys:
        for label, vtype, value in WRONG_VALUES:
            yield f"value {key} = {label}", img.set(key, vtype, value)
        if img.find(key) is not None:
            yield f"missing {key}", img.drop(key)
        kind = ENGINE_KEYS[key.replace(arch + ".", "{arch}.", 1)]
        if kind == "int":
            for label, value in INT_VALUES:
                yield f"value {key} = {label}", img.set(key, VT.INT64 if value < 0 else VT.UINT64, value)
        if kind == "float":
            for label, value in FLOAT_VALUES:
                yield f"value {key} = {label}", img.set(key, VT.FLOAT32, value)
    for value in (1, 16, 64, 0, 3, 1 << 31):
        yield f"value general.alignment = {value}", img.set("general.alignment", VT.UINT32, value)
    yield from _vocab_mutants(img)
    yield from _tensor_mutants(img)
    yield from _header_mutants(img)


def _vocab_mutants(img: GGUFImage):
    _, tokens = img.find("tokenizer.ggml.tokens")[2]
    n = len(tokens)
    yield "tokens cut to 1", img.set("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, tokens[:1]))
    yield "tokens cut by one", img.set("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, tokens[:-1]))
    yield "every token BYTE", img.set("tokenizer.ggml.token_type", VT.ARRAY, (VT.INT32, np.full(n, 6)))
    yield "token types cut", img.set("tokenizer.ggml.token_type", VT.ARRAY, (VT.INT32, np.ones(n // 2)))
    yield "token types 99", img.set("tokenizer.ggml.token_type", VT.ARRAY, (VT.INT32, np.full(n, 99)))
    yield "scores as strings", img.set("tokenizer.ggml.scores", VT.ARRAY, (VT.STRING, [b"1.5"] * n))
    yield "scores nan", img.set("tokenizer.ggml.scores", VT.ARRAY, (VT.FLOAT32, np.full(n, np.nan)))
    yield "duplicate token", img.set("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, [tokens[1]] + tokens[1:]))
    yield "empty tokens", img.set("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, [b""] * n))
    yield "merges as u32", img.set("tokenizer.ggml.merges", VT.ARRAY, (VT.UINT32, np.arange(10)))
    yield "bad merges", img.set("tokenizer.ggml.merges", VT.ARRAY, (VT.STRING, [b"", b" ", b"\xff x"]))
    yield "no bytes in vocabulary", img.set("tokenizer.ggml.tokens", VT.ARRAY,
                                            (VT.STRING, [b"<%d>" % i for i in range(n)]))


def _tensor_mutants(img: GGUFImage):
    last = len(img.tensors) - 1
    for i in (0, last // 2, last):
        t = img.tensors[i]
        other = img.tensors[(i + 1) % len(img.tensors)]
        for label, name in (("non-utf8", b"\xff\xfe.weight"), ("empty", b""), ("long", b"x" * 1000),
                            ("duplicate", other.name), ("escape", b"\x1b[2Jblk"), ("renamed", b"blk.99.x.weight")):
            yield f"tensor {i} name {label}", img.with_tensor(i, name=name)
        for label, dims in (("no dims", []), ("5 dims", t.dims + [1] * (5 - len(t.dims))), ("zero", [0] + t.dims[1:]),
                            ("reversed", t.dims[::-1]), ("doubled", [t.dims[0] * 2] + t.dims[1:]),
                            ("2^40", [1 << 40] + t.dims[1:]), ("extra dim", t.dims + [2]),
                            ("1600 dims", [1] * 1600)):
            yield f"tensor {i} dims {label}", img.with_tensor(i, dims=dims)
        for label, ttype in (("unknown 99", 99), ("Q5_K", 13), ("F32", 0), ("F16", 1), ("Q8_0", 8), ("I8", 24)):
            yield f"tensor {i} type {label}", img.with_tensor(i, type=ttype)
        for label, offset in (("+1", t.offset + 1), ("+32", t.offset + 32), ("2^62", 1 << 62),
                              ("-32", max(t.offset - 32, 0) if t.offset else 32)):
            yield f"tensor {i} offset {label}", img.with_tensor(i, offset=offset)


def _header_mutants(img: GGUFImage):
    for version in (1, 4, 0x03000000):
        yield f"version {version}", GGUFImage(**{**img.__dict__, "version": version})
    n_t, n_kv = len(img.tensors), len(img.kvs)
    for count in (0, n_t - 1, n_t + 1, 1 << 63, (1 << 64) - 1):
        yield f"tensor count {count}", GGUFImage(**{**img.__dict__, "n_tensors": count})
    for count in (0, n_kv - 1, n_kv + 1, 1 << 63):
        yield f"metadata count {count}", GGUFImage(**{**img.__dict__, "n_kv": count})


def raw_mutants(data: bytes, img: GGUFImage, rng: random.Random, n_flips: int):
    """(label, bytes): truncations at every section, overwritten lengths, random flipped bytes."""
    header_end = img.offsets["data"][0][0]
    for section, marks in img.offsets.items():
        for offset, label in marks[:3] + marks[-3:]:
            for cut in (offset, offset + 1, offset + 5):
                yield f"truncated in {section} at {cut} ({label})", data[:cut]
    yield "truncated in the last tensor", data[:-1]
    yield "empty file", b""
    yield "magic only", b"GGUF"
    yield "wrong magic", b"GGML" + data[4:]
    for offset, label in img.offsets["lengths"][::max(1, len(img.offsets["lengths"]) // 12)]:
        (length,) = struct.unpack_from("<Q", data, offset)
        for new in (length + 1, length + (1 << 20), 1 << 40, (1 << 64) - 1):
            yield f"{label} {new}", data[:offset] + struct.pack("<Q", new) + data[offset + 8:]
    for i in range(n_flips):
        at = rng.randrange(header_end)
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        yield f"flip {i} at {at}", bytes(flipped)


def mutant_file(source: Path, tmp_path: Path, edit) -> Path:
    """`source` with `edit(GGUFImage)` applied, written under tmp_path."""
    img = edit(GGUFImage.parse(Path(source).read_bytes()))
    out = tmp_path / f"{Path(source).stem}-mutant.gguf"
    out.write_bytes(img.serialize())
    return out


def renamed(img: GGUFImage, tensor: str) -> GGUFImage:
    """The image with tensor `tensor` under another name (so the model misses it)."""
    index = next(i for i, t in enumerate(img.tensors) if t.name == tensor.encode())
    return img.with_tensor(index, name=tensor.encode() + b".renamed")
