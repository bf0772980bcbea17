"""Where a cache keeps one layer's K or V rows: `[stream, cell, row]` in the chosen cache type.

f32 and f16 rows are plain arrays; bf16, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl rows are ggml
blocks (so a state file can carry them as they are).
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ..errors import InvalidInputError
from ..backend.weights import BlockRows
from ..quants import dequantize_rows, quantize_rows

FLOAT_TYPES = {"f32": np.float32, "f16": np.float16}
# bf16 is kept as one-value blocks of its bits (NumPy has no bfloat16): attention reads it as it reads
# the block types, converting the cells it sees
BLOCK_TYPES = {"bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1,
               "iq4_nl": T.IQ4_NL}
CACHE_TYPES = tuple(FLOAT_TYPES) + tuple(BLOCK_TYPES)


def check_cache_type(name: str, dim: int | None = None) -> None:
    if name not in CACHE_TYPES:
        raise InvalidInputError(f"unsupported cache type '{name}' (supported: {', '.join(CACHE_TYPES)})")
    if dim is not None and name in BLOCK_TYPES and dim % GGML_QUANT_SIZES[BLOCK_TYPES[name]][0]:
        raise InvalidInputError(f"cache type {name} needs rows that are a multiple of "
                                f"{GGML_QUANT_SIZES[BLOCK_TYPES[name]][0]} values; this model's are {dim}")


def row_bytes(type_name: str, dim: int) -> int:
    """Bytes one cell's row of `dim` values takes in the cache type."""
    if type_name in BLOCK_TYPES:
        block, type_size = GGML_QUANT_SIZES[BLOCK_TYPES[type_name]]
        return dim // block * type_size
    return dim * np.dtype(FLOAT_TYPES[type_name]).itemsize


class KVStorage:
    def __init__(self, n_stream: int, kv_size: int, dim: int, type_name: str, xp=None):
        check_cache_type(type_name, dim)
        self.xp = xp if xp is not None else np
        self.type_name, self.dim = type_name, dim
        self.on_write = None  # called with (streams, cells) after rows change (block bounds listen)
        self.qtype = BLOCK_TYPES.get(type_name)
        if self.qtype is None:
            self.data = self.xp.zeros((n_stream, kv_size, dim), dtype=FLOAT_TYPES[type_name])
        else:
            block, type_size = GGML_QUANT_SIZES[self.qtype]
            self.data = np.zeros((n_stream, kv_size, dim // block * type_size), dtype=np.uint8)
        if self.xp is np:  # commit the pages now, as llama.cpp clears a cache buffer when it makes it:
            self.data.fill(0)  # the process holds its whole cache from the start, not more as cells fill

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def row_bytes(self) -> int:
        return self.data.shape[2] * self.data.itemsize

    def write(self, streams: np.ndarray, cells: np.ndarray, rows) -> None:
        """Store float rows (n, dim) at (streams[i], cells[i])."""
        if self.qtype is not None:
            self.data[streams, cells] = quantize_rows(rows, self.qtype)
        elif len(cells) == 1:  # a decoded token: plain indexing is several times cheaper than fancy
            self.data[int(streams[0]), int(cells[0])] = rows[0]
        else:
            self.data[self.xp.asarray(streams), self.xp.asarray(cells)] = rows
        if self.on_write is not None:
            self.on_write(streams, cells)

    def read(self, stream: int, n: int, n_head: int):
        """The first n cells of a stream as stored, (n, n_head, head_dim): a view of f32/f16 rows,
        or the blocks as `BlockRows` (attention kernels read both without a copy)."""
        rows = self.data[stream, :n]
        if self.qtype is None:
            return rows.reshape(n, n_head, -1)
        return BlockRows(rows, int(self.qtype), n_head, self.dim // n_head)

    def read_flat(self, n: int, n_head: int):
        """The first n cells of the streams taken in order as one run (stream s's cell c is cell
        s·kv_size + c), as `read` gives them: a view, no copy."""
        rows = self.data.reshape(-1, self.data.shape[2])[:n]
        if self.qtype is None:
            return rows.reshape(n, n_head, -1)
        return BlockRows(rows, int(self.qtype), n_head, self.dim // n_head)

    def to_float(self, raw):
        if self.qtype is not None:
            return dequantize_rows(raw, self.qtype)
        return raw.astype(np.float32, copy=False)

    def raw(self, stream: int, cells: np.ndarray) -> np.ndarray:
        """Rows exactly as stored, on the host (for state files and copies)."""
        rows = self.data[stream, self.xp.asarray(cells)]
        return rows if self.xp is np else self.xp.asnumpy(rows)

    def rows(self, stream: int, cells: np.ndarray):
        """Rows as stored, where they live (for the K-shift)."""
        return self.data[stream, self.xp.asarray(cells)]

    def set_raw(self, stream: int, cells: np.ndarray, raw: np.ndarray) -> None:
        self.data[stream, self.xp.asarray(cells)] = self.xp.asarray(raw)
        if self.on_write is not None:
            self.on_write(stream, cells)
