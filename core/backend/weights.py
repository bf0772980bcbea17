"""`QuantWeight`: a matmul weight kept in its GGUF type on the CPU, as views of the mapped file.

A weight is one or more parts stacked along the output dimension (q|k|v, gate|up), each part a
`(n_out_i, row_bytes)` uint8 array of ggml blocks and its type id. Parts are never copied or
joined: the kernels write each part's outputs into its columns of the result, so the file's pages
are the only copy of the weights in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..quants import Q8_1_OFFSET_TYPES, block_mins


@dataclass(frozen=True)
class WeightPart:
    raw: np.ndarray  # (n_out, row_bytes) uint8
    qtype: int
    n_out: int

    @cached_property
    def block_mins(self) -> np.ndarray:
        """The block minimums (n_out, n_in // 32) as floats of a Q4_1/Q5_1 part, zeros for other
        32-value types: read once (ggml numerics' q8_1 sum term needs them on every prompt matmul)."""
        if self.qtype in Q8_1_OFFSET_TYPES:
            return block_mins(self.raw, self.qtype)
        return np.zeros((self.n_out, self.raw.shape[1] // GGML_QUANT_SIZES[GGMLQuantizationType(self.qtype)][1]),
                        dtype=np.float32)


@dataclass(frozen=True)
class QuantWeight:
    parts: tuple[WeightPart, ...]
    n_in: int

    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> "QuantWeight":
        """A (n_out, n_in) weight from its raw bytes (any array whose bytes are the tensor's)."""
        n_out, n_in = shape
        block, type_size = GGML_QUANT_SIZES[qtype]
        rows = np.asarray(raw).reshape(-1).view(np.uint8).reshape(n_out, n_in // block * type_size)
        return cls((WeightPart(rows, int(qtype), n_out),), n_in)

    @classmethod
    def stack(cls, weights: list["QuantWeight"]) -> "QuantWeight":
        n_in = {w.n_in for w in weights}
        if len(n_in) != 1:
            raise ValueError(f"stacked weights need one input size, not {sorted(n_in)}")
        return cls(tuple(p for w in weights for p in w.parts), n_in.pop())

    def __post_init__(self):  # a decoded token asks for these some two hundred times
        offsets = np.cumsum([0] + [p.n_out for p in self.parts]).tolist()
        object.__setattr__(self, "_spans", tuple(zip(self.parts, offsets)))
        object.__setattr__(self, "_shape", (offsets[-1], self.n_in))
        runs = []  # consecutive parts of one type: (type, raw arrays, first column, end column)
        for part, col in self._spans:
            if runs and runs[-1][0] == part.qtype:
                qtype, raws, first, _ = runs[-1]
                runs[-1] = (qtype, raws + (part.raw,), first, col + part.n_out)
            else:
                runs.append((part.qtype, (part.raw,), col, col + part.n_out))
        object.__setattr__(self, "_runs", tuple(runs))

    @cached_property
    def block_mins(self) -> np.ndarray:
        """The parts' block minimums stacked (n_out, n_in // 32): see WeightPart.block_mins."""
        return np.ascontiguousarray(np.concatenate([p.block_mins for p in self.parts]).T)

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    @property
    def nbytes(self) -> int:
        return sum(p.raw.nbytes for p in self.parts)

    @property
    def type_names(self) -> list[str]:
        return [GGMLQuantizationType(p.qtype).name for p in self.parts]

    def spans(self) -> tuple[tuple[WeightPart, int], ...]:
        """(part, first output column) for every part."""
        return self._spans

    def runs(self) -> tuple[tuple[int, tuple[np.ndarray, ...], int, int], ...]:
        """Consecutive parts of one type: (type, their raw arrays, first column, end column)."""
        return self._runs


@dataclass(frozen=True)
class BlockRows:
    """Cache rows stored as ggml blocks (q8_0, q4_0): `raw` (n, row_bytes), each row holding
    `n_head` heads of `head_dim` values. Kernels read them as they are; `to_float` expands them."""
    raw: np.ndarray
    qtype: int
    n_head: int
    head_dim: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.raw), self.n_head, self.head_dim

    def to_float(self) -> np.ndarray:
        from ..quants import dequantize_rows

        return dequantize_rows(self.raw, GGMLQuantizationType(self.qtype)).reshape(self.shape)
