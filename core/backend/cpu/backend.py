"""The CPU backend: NumPy ops written for speed (BLAS matmuls, few temporaries).

Shapes follow NumPy order: activations are `(n_tokens, features)`, weights `(n_out, n_in)` as
GGUF stores them, attention tensors `(n_tokens, n_head, head_dim)`. The contract and a plain
reference of every op are in core/ops.py; `llm test-ops -b cpu` checks this file against them.
"""

from __future__ import annotations

import importlib
from functools import lru_cache, partial

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...errors import LLMError
from ...quants import (Q8_1_OFFSET_TYPES, QUANT_32_TYPES, QUANT_K_TYPES, dequantize, ggml_activations, q8_1_offset_error,
                      quantize_rows)
from ..base import OPS, Backend, Yarn, yarn_angles
from ..weights import BlockRows, QuantWeight

# Query rows per attention block: bounds the score matrix and lets causal blocks skip future keys.
ATTN_BLOCK = 128
# Keys per block of the online softmax: very long caches never need a full score row, and f16
# or quantized cache rows are converted a block at a time into a reused buffer.
KV_BLOCK = 1024
# A run of at least this many keys no row of a tile sees is skipped, not multiplied through.
SKIP_GAP = 128
# Query rows up to which attention over an f32/f16 cache runs attention.attend_rows (which reads
# the cache in place) instead of BLAS over converted blocks; measured faster up to here.
FEW_ATTN_ROWS = 2
# Up to this many query rows attend_rows also runs where the rows keep few of the cells between
# them (at most KEPT_DENSITY of the mask): decode steps of several sequences, each row seeing its
# own sequence's cells of a unified cache, or its own stream's where streams sit side by side.
DECODE_ATTN_ROWS = 64
KEPT_DENSITY = 0.5
# Query rows per tile on the sparse path: the tile attends the union of its rows' kept keys, and
# nearby rows choose much the same blocks, so smaller tiles gather fewer keys but call BLAS more.
SPARSE_TILE = 64
# A tile gathers its seen keys only when they fill less than this share of their span.
GATHER_DENSITY = 0.5
# llama.cpp's rule for when gathering the finite columns pays: KV >= max(4096, 2 * n_kv_max).
SPARSE_MIN_KV = 4096
# Activation rows up to which a quantized matmul runs the fused kernel (decode, -np, small
# ubatches); above it each weight tile is dequantized into a reused buffer for BLAS.
FUSED_MAX_ROWS = 8
# Weight rows per dequantized tile: about 2.5 MB of float32 at the models' widths (L2-sized).
TILE_ROWS = 1024
# GGUF types the kernels read directly (matvec_float.MATVEC's keys); matrices of other types become float32.
KERNEL_TYPES = frozenset(int(GGMLQuantizationType[name]) for name in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
# gated activations with a fused kernel in rowwise.py
GATED_KERNELS = {"swiglu": "swiglu_rows", "geglu": "geglu_rows"}
# Rows up to which the row kernels (activations, RoPE) run serially: waking numba's threads costs
# more than a few rows' work.
SERIAL_ROWS = 4
# Kept cells (all rows together) up to which attend_rows runs serially (one chunk; measured: 40 cells 6 µs serial
# against 13 µs parallel, even at 200).
SERIAL_ATTN_CELLS = 128
# Query rows up to which the block top-k mask runs on one thread (a decoded token: waking the
# thread pool costs more than the row).
SERIAL_MASK_ROWS = 2
SQRT_2_OVER_PI = 0.7978845608028654
GELU_COEF_A = 0.044715


@lru_cache(maxsize=64)
def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slope per head (all ones when max_bias is 0), as ggml computes them; read-only
    (one array per head count, shared by every call)."""
    slopes = _alibi_slopes(n_head, max_bias)
    slopes.flags.writeable = False
    return slopes


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0:
        return np.ones(n_head, dtype=np.float32)
    n_head_log2 = 2 ** int(np.floor(np.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-max_bias / 2.0 / n_head_log2)
    h = np.arange(n_head)
    return np.where(h < n_head_log2, m0 ** (h + 1), m1 ** (2 * (h - n_head_log2) + 1)).astype(np.float32)


# the cache row types the fused BLOCK_BOUNDS reads in place (quantized rows take the array path)
IN_PLACE_ROW_TYPES = ("f32", "f16")


class CPUBackend(Backend):
    name = "cpu"
    xp = np
    reads_value_views = False  # attention reads f16/f32 cache rows in place only when they are whole rows

    def __init__(self, attn_path: str = "auto", numerics: str | None = None):
        self.attn_path = attn_path  # "auto", "dense" or "sparse" (forced where the hint allows it)
        from .. import default_numerics

        self.numerics = numerics or default_numerics("cpu")  # "ggml": matmul activations rounded as ggml-cpu does
        self._buffers: dict[str, np.ndarray] = {}
        self.notes: list[str] = []  # fallbacks taken while loading, for -v

    def configured(self, attn_path: str | None = None, numerics: str | None = None) -> "CPUBackend":
        other = super().configured(attn_path, numerics)
        if other is not self:
            other._buffers = {}  # scratch buffers are per backend object (a context's own)
        return other

    def supports(self, op: str, types: tuple[str, ...] = ()) -> bool:
        """Every op, on every type the GGUF reader knows; the fused block bounds read f32/f16 rows."""
        if op == "BLOCK_BOUNDS":
            return all(t in IN_PLACE_ROW_TYPES for t in types)
        return op in OPS

    def _buffer(self, slot: str, shape: tuple[int, ...]) -> np.ndarray:
        """Scratch memory reused across calls (fresh memory costs a page fault per 4 KiB)."""
        n = int(np.prod(shape))
        if slot not in self._buffers or self._buffers[slot].size < n:
            self._buffers[slot] = np.empty(n, dtype=np.float32)
        return self._buffers[slot][:n].reshape(shape)

    def _rows_f32(self, x, cells: slice | np.ndarray, slot: str) -> np.ndarray:
        """Cache rows `cells` (a range, or gathered indices) as float32 (cells, heads, d): a view
        of a range of f32 rows, else a reused buffer; f16 rows and q8_0/q4_0 blocks are converted
        by a kernel a KV block at a time, so attention never makes a full-size float32 copy of
        the cache."""
        _, n_head, head_dim = x.shape
        if isinstance(x, BlockRows):
            raw, qtype = x.raw, x.qtype
        elif x.dtype == np.float16:
            raw, qtype = x.reshape(len(x), -1).view(np.uint8), int(GGMLQuantizationType.F16)
        elif isinstance(cells, slice) or not x.flags.c_contiguous:
            return x[cells].astype(np.float32, copy=False)
        else:
            out = self._buffer(slot, (len(cells), n_head * head_dim))
            np.take(x.reshape(len(x), -1), cells, axis=0, out=out)
            return out.reshape(len(cells), n_head, head_dim)
        idx = np.arange(cells.start, cells.stop) if isinstance(cells, slice) else cells
        out = self._buffer(slot, (len(idx), n_head * head_dim))
        dequant().DEQUANT[qtype](raw, idx, out)
        return out.reshape(len(idx), n_head, head_dim)

    @staticmethod
    def synchronize() -> None:
        """Nothing runs asynchronously on the CPU."""

    def describe(self) -> str:
        blas = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
        text = f"NumPy {np.__version__} ({blas.get('name', 'BLAS')} {blas.get('version', '')})".strip()
        if self.numerics != "ggml":
            return text
        ints = matvec_int()
        dots = (("AVX2 integer dots" + (" (Q6_K on AVX-512)" if ints.WIDE else "")) if ints.AVAILABLE
                else "no integer dots (float kernels)")
        isa = gemm_int8().ISA
        return f"{text}; ggml numerics: {dots}, " + (f"8-bit GEMM on {isa}" if isa else "no 8-bit GEMM (BLAS over rounded rows)")

    @staticmethod
    def asarray(x):
        return np.asarray(x)

    @staticmethod
    def to_numpy(x) -> np.ndarray:
        return np.asarray(x)

    # ---- weights -------------------------------------------------------------------------

    def load_weight(self, raw: np.ndarray, qtype, shape: tuple[int, ...], name: str = ""):
        """A matrix stays in its GGUF type (a view of the file) for the quantized kernels; a vector
        (norms, biases) becomes float32, and so does a matrix of a type without a kernel (noted
        for -v; a type nothing here can read is an UnsupportedError naming the tensor)."""
        if len(shape) == 2 and int(qtype) in KERNEL_TYPES:
            return QuantWeight.from_raw(raw, qtype, shape)
        out = dequantize(raw, qtype, int(np.prod(shape)), name=name).reshape(shape)
        if len(shape) == 2:
            self.notes.append(f"tensor '{name}' ({GGMLQuantizationType(qtype).name}) has no cpu kernel: "
                              "expanded to f32 at load")
        return out

    def _note_float_path(self, qtype: int) -> None:
        """For -v, once per type: a quantized type ggml numerics cannot take in integers."""
        name = GGMLQuantizationType(qtype).name
        note = f"{name} matrices have no integer kernel: ggml numerics multiply them in floats over rounded activations"
        if (rounding_family(qtype) in ("q8_32", "q8_k") and not (matvec_int().AVAILABLE and qtype in matvec_int().MATVEC)
                and note not in self.notes):
            self.notes.append(note)

    def prepare(self, weight_types, state_space: bool = False, cache_types=("f16",)) -> None:
        """Compile (the first time on a machine) or load from numba's cache the kernels a model
        with these weight types (and, for a recurrent model, the state-space ops) needs: each one
        runs once on a one-block weight. Decode attention is warmed for the cache types given
        (f16 and f32 caches are read in place by one compiled variant each, the block types by one
        kernel for them all), and the integer dots under ggml numerics."""
        numerics = self.numerics
        kernels = matvec_float()
        x = np.ones((1, 256), dtype=np.float32)
        try:
            for qtype in {int(t) for t in weight_types} & KERNEL_TYPES:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
                w = np.zeros((1, 256 // block * type_size), dtype=np.uint8)
                w.flags.writeable = False  # as the mapped file's weights are (numba compiles per flag)
                kernels.MATVEC[qtype](w, x, np.empty((1, 1), np.float32))
                if qtype in kernels.MULTI_PART:  # stacked weights: q|k|v (3 parts), gate|up (2)
                    for n_parts in (2, 3):
                        kernels.MATVEC[qtype]((w,) * n_parts, x, np.empty((1, n_parts), np.float32))
                dequant().DEQUANT[qtype](w, np.zeros(1, np.int64), np.empty((1, 256), np.float32))
                if numerics == "ggml":
                    self._note_float_path(qtype)
                    self._ggml_rounded(x, qtype, {})  # a prompt's activations, for the float path
                if numerics == "ggml" and self._integer_dots(QuantWeight.from_raw(w, qtype, (1, 256))):
                    for parts in (w, (w, w), (w, w, w)):
                        matvec_int().MATVEC[qtype](parts, x, np.empty((1, 3), np.float32))
                if numerics == "ggml" and qtype in gemm_int8().GEMM:
                    for parts in (w, (w, w), (w, w, w)):
                        gemm_int8().GEMM[qtype](parts, x, np.empty((1, 3), np.float32), 0, 1)
            if numerics == "ggml" and matvec_int().AVAILABLE:
                rowwise().geglu_table_rows(np.zeros((1, 2), np.float32), _gelu_f16_table(), np.empty((1, 1), np.float32))
            dequant().DEQUANT[int(GGMLQuantizationType.F16)](np.zeros((1, 64), np.uint8), np.zeros(1, np.int64),
                                                            np.empty((1, 32), np.float32))  # f16 cache rows
            for rows in (1, SERIAL_ROWS + 1):  # the serial and the parallel variant of each row kernel
                for kernel in GATED_KERNELS.values():
                    getattr(rowwise(), kernel + serial_suffix(rows))(np.zeros((rows, 2), np.float32),
                                                                     np.empty((rows, 1), np.float32))
                q = np.zeros((rows, 1, 4), np.float32)
                for neox in (False, True):
                    self.rope(q, (np.ones((rows, 1), np.float32), np.zeros((rows, 1), np.float32)), neox)
                self.rms_norm(q, None, 1e-5)
                self.rms_norm(q, np.ones(4, np.float32), 1e-5)
            q = np.zeros((1, 1, 32), np.float32)
            in_place = [dtype for name, dtype in (("f16", np.float16), ("f32", np.float32)) if name in cache_types]
            one = np.zeros(1, np.float32)
            attention().softmax_block(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), np.float32(1),
                                      np.float32(0), alibi_slopes(1, 0.0), one, one.copy(), one.copy())  # prompt tiles
            blocks = [t for t in cache_types if t not in ("f16", "f32")][:1]  # one kernel reads every block type
            for cells in (1, SERIAL_ATTN_CELLS + 1):
                caches = [np.zeros((cells, 1, 4), dtype) for dtype in in_place]
                caches += [BlockRows(np.zeros((cells, 34), np.uint8), int(GGMLQuantizationType.Q8_0), 1, 32)
                           for _ in blocks]
                for cache in caches:
                    self._attend_rows(q[..., :cache.shape[2]], cache, cache, np.zeros((1, cells), np.float32), 1.0, 0.0,
                                      None, alibi_slopes(1, 0.0))
            if state_space:
                one, seq = np.zeros((1, 1), np.float32), np.zeros(1, np.int64)
                self.ssm_conv(one, np.zeros((1, 1, 1), np.float32), np.zeros((1, 2), np.float32), seq)
                for a in (np.zeros((1, 1), np.float32), np.zeros((1, 2), np.float32)):
                    self.ssm_scan(np.zeros((1, 1, 1, a.shape[1]), np.float32), one[:, :, None], one, a,
                                  np.zeros((1, 1, a.shape[1]), np.float32), np.zeros((1, 1, a.shape[1]), np.float32), seq)
        except LLMError:
            raise
        except Exception as e:  # numba's compile errors are long; the first line says what failed
            raise LLMError(f"numba failed to compile the cpu kernels: {str(e).strip().splitlines()[0]}") from None

    @staticmethod
    def concatenate(arrays, axis: int = 0):
        if axis == 0 and all(isinstance(a, QuantWeight) for a in arrays):
            return QuantWeight.stack(arrays)
        return np.concatenate([dequantize_all(a) for a in arrays], axis=axis)

    @staticmethod
    def take_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return x[rows]

    # ---- dense algebra -------------------------------------------------------------------

    def matmul(self, x: np.ndarray, w, out: np.ndarray | None = None) -> np.ndarray:
        """x @ w.T for a weight stored (n_out, n_in), float32 or quantized; into `out` when given."""
        if not isinstance(w, QuantWeight):
            return np.matmul(x, w.T, out=out)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if out is None:
            out = np.empty((len(x), w.shape[0]), dtype=np.float32)
        if self.numerics == "ggml":
            return self._matmul_ggml(x, w, out)
        return self._matmul_quant(x, w, out)

    def _matmul_ggml(self, x: np.ndarray, w: QuantWeight, out: np.ndarray) -> np.ndarray:
        """ggml numerics: a few rows take ggml's integer dots (matvec_int), more rows the 8-bit GEMM
        (gemm_int8) run by run of same-type parts; what neither covers takes the float path."""
        if len(x) <= FUSED_MAX_ROWS:
            if self._integer_dots(w):
                return self._matmul_q8(x, w, out)
            return self._matmul_ggml_float(x, w, out)
        gemm = gemm_int8()
        for qtype, raws, first, end in w.runs():
            if gemm.fits(qtype, w.n_in, len(x)):
                gemm.GEMM[qtype](raws[0] if len(raws) == 1 else raws, x, out, first, gemm_tasks())
            else:
                parts = tuple(part for part, col in w.spans() if first <= col < end)
                self._matmul_ggml_float(x, QuantWeight(parts, w.n_in), out[:, first:end])
        return out

    def _matmul_ggml_float(self, x: np.ndarray, w: QuantWeight, out: np.ndarray) -> np.ndarray:
        """ggml numerics without integer kernels: the rounded activations times the weights as f32
        numerics take them, plus Q4_1/Q5_1's q8_1 sum term (quants.q8_1_offset_error times the
        block minimums)."""
        rounded: dict = {}
        if len({rounding_family(part.qtype) for part in w.parts}) > 1:  # a product per part
            for part, col in w.spans():
                target = out[:, col:col + part.n_out]
                x_type, offset_error = self._ggml_rounded(x, part.qtype, rounded)
                self._matmul_quant(x_type, QuantWeight((part,), w.n_in), target)
                if part.qtype in Q8_1_OFFSET_TYPES:
                    target += offset_error @ part.block_mins.T
            return out
        x_type, offset_error = self._ggml_rounded(x, w.parts[0].qtype, rounded)
        if not any(part.qtype in Q8_1_OFFSET_TYPES for part in w.parts):
            return self._matmul_quant(x_type, w, out)
        if len(x) > FUSED_MAX_ROWS:  # the sum term added tile by tile, while the tile's outputs are in cache
            self._tiled_matmul(dequant(), w, x_type, out, offset_error)
            return out
        self._matmul_quant(x_type, w, out)
        out += offset_error @ w.block_mins  # (stored transposed: n_in // 32, n_out)
        return out

    @staticmethod
    def _ggml_rounded(x: np.ndarray, qtype: int, done: dict) -> tuple[np.ndarray, np.ndarray | None]:
        """x rounded as ggml-cpu rounds it for a `qtype` weight, and for q8_1 the offset error of
        q8_1_offset_error; `done` keeps what a stacked weight's earlier parts rounded. Rounded by
        numba on one thread (q8.py) where the integer dots run, by NumPy elsewhere."""
        family = rounding_family(qtype)
        if family not in done:
            if matvec_int().AVAILABLE and family == "q8_32":
                rounded, error = np.empty_like(x), np.empty((len(x), x.shape[1] // 32), np.float32)
                q8().round_q8_rows(x, rounded, error)
            elif matvec_int().AVAILABLE and family == "q8_k":
                rounded, error = np.empty_like(x), None
                q8().round_q8_k_rows(x, rounded)
            else:
                rounded = ggml_activations(x, qtype)
                error = q8_1_offset_error(x) if family == "q8_32" else None
            done[family] = rounded, error
        return done[family]

    @staticmethod
    def _integer_dots(w: QuantWeight) -> bool:
        """Whether matvec_int (ggml's integer dots) cover every part of w on this CPU."""
        kernels = matvec_int()
        return kernels.AVAILABLE and all(run[0] in kernels.MATVEC for run in w.runs())

    @staticmethod
    def _matmul_q8(x: np.ndarray, w: QuantWeight, out: np.ndarray) -> np.ndarray:
        """ggml numerics for a few rows: each run of same-type parts rounds the activations to
        q8 blocks and takes ggml's integer dots, in one launch."""
        kernels = matvec_int()
        for qtype, raws, first, end in w.runs():
            kernels.MATVEC[qtype](raws[0] if len(raws) == 1 else raws, x, out[:, first:end])
        return out

    def _matmul_quant(self, x: np.ndarray, w: QuantWeight, out: np.ndarray) -> np.ndarray:
        kernels = matvec_float()
        if len(x) > FUSED_MAX_ROWS:
            self._tiled_matmul(dequant(), w, x, out)
            return out
        for qtype, raws, first, end in w.runs():
            kernel = kernels.MATVEC[qtype]
            if len(raws) == 1:
                kernel(raws[0], x, out[:, first:end])
            elif qtype in kernels.MULTI_PART:
                kernel(raws, x, out[:, first:end])  # one launch for q|k|v or gate|up
            else:
                col = first
                for raw in raws:
                    kernel(raw, x, out[:, col:col + len(raw)])
                    col += len(raw)
        return out

    def _tiled_matmul(self, kernels, w: QuantWeight, x: np.ndarray, out: np.ndarray,
                      offset_error: np.ndarray | None = None) -> None:
        """Many activation rows: dequantize TILE_ROWS weight rows at a time (across parts) into
        one reused buffer and let BLAS multiply. Measured faster here than any fused kernel once
        the rows amortize the tile; the dequantization runs on one thread, so numba's workers do
        not spin against BLAS's. `offset_error` (ggml numerics, Q4_1/Q5_1): each tile's outputs
        also get offset_error times the tile rows' block minimums."""
        n_out = w.shape[0]
        for r0 in range(0, n_out, TILE_ROWS):
            r1 = min(r0 + TILE_ROWS, n_out)
            tile = self._buffer("weight_tile", (r1 - r0, w.n_in))
            for part, col in w.spans():
                lo, hi = max(r0, col), min(r1, col + part.n_out)
                if lo < hi:
                    kernels.DEQUANT[part.qtype](part.raw, np.arange(lo - col, hi - col), tile[lo - r0:hi - r0])
            target = out[:, r0:r1]
            if target.flags.c_contiguous:
                np.matmul(x, tile.T, out=target)
            else:  # BLAS writes contiguous rows; numpy would loop slowly into a strided out
                target[:] = np.matmul(x, tile.T, out=self._buffer("tile_out", (len(x), r1 - r0)))
            if offset_error is not None:
                target += offset_error @ w.block_mins[:, r0:r1]

    def mul_mat(self, raw_w: np.ndarray, w_type, shape: tuple[int, int], x: np.ndarray) -> np.ndarray:
        """x @ W.T for a weight given as raw GGUF data of any type."""
        return self.matmul(x, self.load_weight(raw_w, w_type, shape))

    @staticmethod
    def get_rows(table, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a table; a quantized one is dequantized row by row, only those rows."""
        if not isinstance(table, QuantWeight):
            return table[ids]
        (part,) = table.parts
        out = np.empty((len(ids), table.n_in), dtype=np.float32)
        dequant().DEQUANT[part.qtype](part.raw, np.asarray(ids, dtype=np.int64), out)
        return out

    def get_rows_raw(self, raw: np.ndarray, w_type, shape: tuple[int, int], ids: np.ndarray) -> np.ndarray:
        """Rows of a raw (possibly quantized) table."""
        return self.get_rows(self.load_weight(raw, w_type, shape), ids)

    @staticmethod
    def set_rows(dst: np.ndarray, ids: np.ndarray, src: np.ndarray, qtype=None) -> np.ndarray:
        """dst with rows ids replaced by src, stored in dst's type (ggml blocks when qtype is set)."""
        out = dst.copy()
        out[ids] = src if qtype is None else quantize_rows(src, qtype)
        return out

    @staticmethod
    def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        """x / sqrt(mean(x²) + eps) over the last axis, times weight: one (d,) vector, or one per
        group of a (…, n_group, d) x (a (n_group, d) weight)."""
        d = x.shape[-1]
        if weight is None:
            rows = np.empty((0, d), dtype=np.float32)
        elif weight.shape == (d,) or (x.ndim >= 2 and weight.shape == x.shape[-2:]):
            rows = np.ascontiguousarray(weight, dtype=np.float32).reshape(-1, d)
        else:
            raise ValueError(f"rms_norm weight of shape {weight.shape} does not fit x of shape {x.shape}")
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, d)
        out = np.empty(x2.shape, dtype=np.float32)
        rowwise().rms_norm_rows(x2, rows, np.float32(eps), out)
        return out.reshape(x.shape)

    @staticmethod
    def norm(x: np.ndarray, eps: float) -> np.ndarray:
        """Layer norm without affine: (x - mean) / sqrt(var + eps)."""
        centred = x - x.mean(axis=-1, keepdims=True, dtype=np.float32)
        var = np.mean(np.square(centred), axis=-1, keepdims=True, dtype=np.float32)
        return centred / np.sqrt(var + np.float32(eps))

    # ---- activations ---------------------------------------------------------------------

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """GELU, tanh approximation (ggml's GELU); with ggml numerics through ggml-cpu's f16 table."""
        if self.numerics == "ggml":
            return ggml_gelu(x)
        inner = SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)
        return 0.5 * x * (1.0 + np.tanh(inner))

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.silu(gate) * up

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.gelu(gate) * up

    def gated_ffn(self, h: np.ndarray, act: str) -> np.ndarray:
        """act(gate) * up over a fused gate|up activation (n_tokens, 2 * n_ff): one parallel numba
        pass (rowwise.swiglu_rows/geglu_rows), 7-17x faster than NumPy's chain of temporaries at
        prompt sizes. Other activations, dtypes or layouts take the NumPy path."""
        n_ff = h.shape[-1] // 2
        kernel = GATED_KERNELS.get(act)
        if act == "geglu" and self.numerics == "ggml" and matvec_int().AVAILABLE and h.dtype == np.float32 \
                and h.flags.c_contiguous:  # GELU from ggml-cpu's f16 table, in numba
            out = np.empty((len(h), n_ff), dtype=np.float32)
            rowwise().geglu_table_rows(h, _gelu_f16_table(), out)
            return out
        if kernel is None or h.dtype != np.float32 or not h.flags.c_contiguous or \
                (act == "geglu" and self.numerics == "ggml"):
            return getattr(self, act)(h[:, :n_ff], h[:, n_ff:])
        out = np.empty((len(h), n_ff), dtype=np.float32)
        getattr(rowwise(), kernel + serial_suffix(len(h)))(h, out)
        return out

    # ---- rotary embeddings ---------------------------------------------------------------

    @staticmethod
    def rope_cache(pos: np.ndarray, n_rot: int, freq_base: float, freq_scale: float = 1.0, scaling: Yarn | None = None):
        """cos/sin tables (n_tokens, n_rot/2), with ggml's float32 angle recurrence (and YaRN's ramp)."""
        theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_rot)
        steps = np.empty((len(pos), n_rot // 2), dtype=np.float32)
        steps[:, 0] = pos
        steps[:, 1:] = theta_scale
        theta = yarn_angles(np.cumprod(steps, axis=1, dtype=np.float32), freq_scale, scaling)
        if scaling is None or scaling.mscale == 1.0:
            return np.cos(theta), np.sin(theta)
        mscale = np.float32(scaling.mscale)
        return np.cos(theta) * mscale, np.sin(theta) * mscale

    @staticmethod
    def rope(x: np.ndarray, table, neox: bool) -> np.ndarray:
        """Rotate the first n_rot dims of x (n_tokens, n_head, head_dim) by a rope_cache table.

        Normal mode rotates adjacent pairs (x[2i], x[2i+1]); NEOX mode rotates (x[i], x[i + n_rot/2]).
        """
        cos, sin = table
        out = np.empty(x.shape, dtype=np.float32)
        kernel = getattr(rowwise(), "rope_rows" + serial_suffix(len(x)))
        kernel(np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(cos, dtype=np.float32),
               np.ascontiguousarray(sin, dtype=np.float32), bool(neox), out)
        return out

    # ---- softmax and attention -----------------------------------------------------------

    @staticmethod
    def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
        m = np.max(x, axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(x - m)
        s = np.sum(e, axis=axis, keepdims=True)
        return e / np.where(s > 0, s, 1.0)

    @staticmethod
    def soft_max_ext(x: np.ndarray, mask: np.ndarray | None, scale: float, max_bias: float = 0.0,
                     sinks: np.ndarray | None = None) -> np.ndarray:
        """softmax(x * scale + slope_h * mask) over the last axis of x (n_head, rows, cols);
        a sink adds exp(sink_h) to the denominator only."""
        s = x * np.float32(scale)
        if mask is not None:
            s = s + alibi_slopes(x.shape[0], max_bias)[:, None, None] * mask
        m = s.max(axis=-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[:, None, None])
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m)
        total = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sinks[:, None, None] - m)
        return e / np.where(total > 0, total, 1.0)

    @staticmethod
    def cache_rows_f32(x) -> np.ndarray:
        return as_float(x)

    @staticmethod
    def block_topk_mask(q, base, pos, cell_pos, lo, hi, topk: int, block: int, local: int) -> np.ndarray:
        """One compiled pass per row (attention.block_topk_mask; serial for a decoded token's rows)."""
        rows, n_kv = base.shape
        out = np.empty((rows, n_kv), dtype=np.float32)
        kernel = attention().block_topk_mask if rows > SERIAL_MASK_ROWS else attention().block_topk_mask_serial
        kernel(np.ascontiguousarray(q, dtype=np.float32), np.ascontiguousarray(base, dtype=np.float32),
               np.asarray(pos), np.asarray(cell_pos), lo, hi, topk, block, local, out)
        return out

    @staticmethod
    def block_bounds(keys, cell_pos, seen_pos, stale, block: int, n_blocks: int, lo, hi) -> None:
        attention().refresh_block_bounds(cache_bits(keys), cell_pos, seen_pos, stale, block, n_blocks, lo, hi)

    @staticmethod
    def attn_soft_max(q, k, v, mask, scale: float) -> np.ndarray:
        """softmax(q·kᵀ·scale + mask)·v unfused, as llama.cpp computes attention that has a KQ bias
        (T5's position bias): mask (n_head or 1, n_tokens, n_kv) carries the bias as well. GQA;
        k/v may be cache rows of any type; a fully masked row yields zeros."""
        k, v = as_float(k), as_float(v)
        group = q.shape[1] // k.shape[1]
        qh = np.ascontiguousarray(q.transpose(1, 0, 2), dtype=np.float32)
        kh = np.repeat(k.transpose(1, 2, 0), group, axis=0)  # (n_head, d_k, n_kv)
        vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)  # (n_head, n_kv, d_v)
        scores = np.matmul(qh, kh) * np.float32(scale) + mask
        return np.matmul(CPUBackend.softmax(scores), vh).transpose(1, 0, 2)

    def flash_attn_ext(self, q, k, v, mask=None, scale: float = 1.0, softcap: float = 0.0, sinks=None,
                       max_bias: float = 0.0, n_kv_max: int = 0, path: str | None = None) -> np.ndarray:
        """softmax(softcap(q·kᵀ·scale) + slope·mask)·v with GQA, sinks and an optional sparse hint.

        q (n_tokens, n_head, d_k), k (n_kv, n_head_kv, d_k), v (n_kv, n_head_kv, d_v),
        mask (n_tokens, n_kv) or None; returns (n_tokens, n_head, d_v). n_kv_max > 0 promises
        that no mask row has more finite entries; where that pays (or when forced), each tile of
        query rows attends only the gathered union of its rows' finite columns. A fully masked
        row yields zeros. `path` ("auto", "dense", "sparse") overrides the backend's --attn
        choice for this call.
        """
        n_kv = k.shape[0]
        if mask is None:
            mask = np.zeros((q.shape[0], n_kv), dtype=np.float32)
        slopes = alibi_slopes(q.shape[1], max_bias)
        path = path or self.attn_path
        sparse = n_kv_max > 0 and path != "dense" and (path == "sparse" or n_kv >= max(SPARSE_MIN_KV, 2 * n_kv_max))
        args = (q, k, v, mask, scale, softcap, sinks, slopes)
        self.last_attn_path = "sparse" if sparse else "dense"
        if len(q) <= DECODE_ATTN_ROWS and in_place_rows(k) and in_place_rows(v):
            mask = np.ascontiguousarray(mask, dtype=np.float32)
            kept = attention().kept_cells(mask)
            if len(q) <= FEW_ATTN_ROWS or kept[1].sum() <= KEPT_DENSITY * mask.size:
                return self._attend_rows(*args[:3], mask, *args[4:], kept=kept)  # in place, the kept cells only
        if sparse:
            return self._attend_tiles(*args, tile=SPARSE_TILE, gather=True)
        return self._attend_tiles(*args)

    @staticmethod
    def _attend_rows(q, k, v, mask, scale, softcap, sinks, slopes, kept=None) -> np.ndarray:
        """A few query rows, or rows that each keep few cells (several sequences' decode steps):
        one numba kernel reads the cache in place (f32/f16 rows as they are, blocks unpacked a few
        cells at a time), only the cells each row keeps (`kept`: attention.kept_cells of the mask,
        listed here when not given)."""
        kernels = attention()
        mask = np.ascontiguousarray(mask, dtype=np.float32)
        cells, count = kept if kept is not None else kernels.kept_cells(mask)
        serial = int(count.sum()) <= SERIAL_ATTN_CELLS  # one short job: waking the threads costs more
        n_head_kv = k.shape[1]
        if isinstance(k, BlockRows) or isinstance(v, BlockRows):
            kernel = kernels.attend_blocks_serial if serial else kernels.attend_blocks
            k_rows, v_rows = row_bytes(k), row_bytes(v)
            n_head_kv = np.array([row_type(k), row_type(v), n_head_kv], dtype=np.int64)
        else:
            kernel = kernels.attend_rows_serial if serial else kernels.attend_rows
            k_rows, v_rows = cache_bits(k), cache_bits(v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=np.float32)
        use_sinks = sinks is not None
        sinks = np.asarray(sinks, dtype=np.float32) if use_sinks else slopes  # slopes: any (H,) array
        kernel(np.ascontiguousarray(q, dtype=np.float32), k_rows, v_rows, n_head_kv, mask, cells, count,
               np.float32(scale), np.float32(softcap), slopes, sinks, use_sinks, attention_tasks(), out)
        return out

    def _attend_tiles(self, q, k, v, mask, scale, softcap, sinks, slopes, tile: int = ATTN_BLOCK,
                      gather: bool = False) -> np.ndarray:
        """Query tiles × key blocks with an online softmax. The query heads sharing a KV head are
        stacked into one matrix (one BLAS call per KV head), and the score block is reused and
        updated in place. A prompt of several tiles converts the f16/quantized rows it sees once
        for all (from the first cell any row sees to the last).

        Keys no row of a tile sees are skipped: outside the span from the first to the last seen
        key always, and inside it too when `gather` is set and the seen keys fill less than
        GATHER_DENSITY of the span. Those keys (the union of the tile's sparse selections) are
        then gathered into the key blocks, so a top-k mask costs its union, not the context."""
        finite = np.isfinite(mask)
        if len(q) > ATTN_BLOCK:  # the cells some row sees, converted once for all tiles
            seen = np.flatnonzero(finite.any(axis=0))
            if len(seen):
                span = slice(seen[0], seen[-1] + 1)
                k, v = self._rows_f32(k, span, "attn_k_span"), self._rows_f32(v, span, "attn_v_span")
                mask, finite = mask[:, span], finite[:, span]
        n_tokens, n_head, d_k = q.shape
        n_kv, n_head_kv, d_v = v.shape
        g = n_head // n_head_kv
        out = np.empty((n_tokens, n_head, d_v), dtype=np.float32)
        for t0 in range(0, n_tokens, tile):
            t1 = min(t0 + tile, n_tokens)
            rows = t1 - t0
            cols = np.flatnonzero(finite[t0:t1].any(axis=0))
            if len(cols) == 0:
                out[t0:t1] = 0.0
                continue
            # (h_kv, g·rows, d_k): a KV head's query heads stacked, head-major
            qg = q[t0:t1].reshape(rows, n_head_kv, g, d_k).transpose(1, 2, 0, 3).reshape(n_head_kv, g * rows, d_k)
            m = np.full((n_head_kv, g * rows), -np.inf, dtype=np.float32)
            l = np.zeros_like(m)
            alpha = np.empty_like(m)
            acc = self._buffer("attn_acc", (n_head_kv, g * rows, d_v))
            for b, sel in enumerate(_key_blocks(cols, gather)):
                keys = self._rows_f32(k, sel, "attn_k").transpose(1, 2, 0)  # (h_kv, d_k, cells)
                values = self._rows_f32(v, sel, "attn_v").transpose(1, 0, 2)  # (h_kv, cells, d_v)
                n_sel = keys.shape[-1]
                s = np.matmul(qg, keys, out=self._buffer("attn_s", (n_head_kv, g * rows, n_sel)))
                attention().softmax_block(s.reshape(-1, n_sel), np.ascontiguousarray(mask[t0:t1, sel]),
                                          np.float32(scale), np.float32(softcap), slopes, m.reshape(-1),
                                          l.reshape(-1), alpha.reshape(-1))
                if b == 0:
                    np.matmul(s, values, out=acc)
                else:
                    acc *= alpha[..., None]
                    acc += np.matmul(s, values, out=self._buffer("attn_pv", acc.shape))
            if sinks is not None:
                sink = np.repeat(sinks.astype(np.float32).reshape(n_head_kv, g), rows, axis=1)
                l = l + np.exp(sink - np.where(np.isfinite(m), m, 0.0))
            np.divide(acc.reshape(n_head_kv, g, rows, d_v), np.where(l > 0, l, 1.0).reshape(n_head_kv, g, rows, 1),
                      out=out[t0:t1].reshape(rows, n_head_kv, g, d_v).transpose(1, 2, 0, 3))  # back to token-major
        return out

    # ---- state-space ops (Mamba) ---------------------------------------------------------

    @staticmethod
    def ssm_conv(x: np.ndarray, state: np.ndarray, w: np.ndarray, seq_index: np.ndarray):
        """Depthwise causal conv over tokens in ubatch order: x (T, C), state (S, d_conv - 1, C) the
        last inputs of each sequence, w (C, d_conv), seq_index (T,) each token's state row.
        Returns (out (T, C), the new states)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        state = np.array(state, dtype=np.float32, order="C")  # updated in place: a copy
        out = np.empty_like(x)
        kernels = ssm()
        conv = kernels.ssm_conv_rows_serial if len(x) <= SERIAL_ROWS else kernels.ssm_conv_rows
        conv(x, state, np.ascontiguousarray(w, dtype=np.float32), np.ascontiguousarray(seq_index, dtype=np.int64), out)
        return out, state

    @staticmethod
    def ssm_scan(state: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray,
                 C: np.ndarray, seq_index: np.ndarray):
        """The selective scan (Mamba-1 with A (H, N), Mamba-2 with A (H, 1)): state (S, H, P, N),
        x (T, H, P), dt (T, H) before softplus, B and C (T, G, N). Returns (y (T, H, P), the new
        states); see ssm.ssm_scan_rows."""
        state = np.array(state, dtype=np.float32, order="C")
        f32 = [np.ascontiguousarray(a, dtype=np.float32) for a in (x, dt, A, B, C)]
        y = np.empty(f32[0].shape, dtype=np.float32)
        ssm().ssm_scan_rows(state, *f32, np.ascontiguousarray(seq_index, dtype=np.int64), y)
        return y, state

    # ---- sampling -------------------------------------------------------------------------

    @staticmethod
    def argmax(x: np.ndarray) -> int:
        return int(np.argmax(x))

    @staticmethod
    def sample_cdf(probs: np.ndarray, ids: np.ndarray, u: float) -> int:
        """The candidate where the running sum of unnormalized probs first reaches u * total."""
        cum = np.cumsum(probs, dtype=np.float64)
        return int(ids[min(int(np.searchsorted(cum, u * cum[-1], side="left")), len(ids) - 1)])

    @staticmethod
    def top_k(x: np.ndarray, k: int) -> np.ndarray:
        """Indices of the k largest values of each row, largest first (lower index on ties)."""
        part = np.argpartition(-x, k - 1, axis=-1)[..., :k]
        vals = np.take_along_axis(x, part, axis=-1)
        order = np.lexsort((part, -vals), axis=-1)
        return np.take_along_axis(part, order, axis=-1).astype(np.int32)


def _key_blocks(cols: np.ndarray, gather: bool):
    """The key blocks covering the seen columns `cols` (ascending): ranges over their runs (a gap
    of SKIP_GAP unseen keys or more splits a run: a sliding window's ring cache wraps, so a
    tile's keys lie at both ends), or, when gathering pays, the columns themselves KV_BLOCK at a
    time."""
    span = cols[-1] + 1 - cols[0]
    if gather and len(cols) < GATHER_DENSITY * span:
        return [cols[j:j + KV_BLOCK] for j in range(0, len(cols), KV_BLOCK)]
    gaps = np.flatnonzero(np.diff(cols) > SKIP_GAP)
    starts, ends = np.append(cols[0], cols[gaps + 1]), np.append(cols[gaps] + 1, cols[-1] + 1)
    return [slice(c0, min(c0 + KV_BLOCK, end)) for start, end in zip(starts, ends) for c0 in range(start, end, KV_BLOCK)]


@lru_cache(maxsize=None)
def _kernel_module(name: str, what: str):
    """A numba kernel module, imported (compiled, or loaded from numba's cache) on first use;
    later calls cost a dictionary lookup (a decoded token asks some two hundred times)."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:
        raise LLMError(f"the cpu backend needs numba for its {what} kernels ({e}); pip install numba") from None


# the kernel modules by role: matvec_float() is core.backend.cpu.matvec_float, and so on
matvec_float = partial(_kernel_module, "matvec_float", "quantized")
dequant = partial(_kernel_module, "dequant", "quantized")
matvec_int = partial(_kernel_module, "matvec_int", "integer (--numerics ggml)")
q8 = partial(_kernel_module, "q8", "q8 rounding (--numerics ggml)")
gemm_int8 = partial(_kernel_module, "gemm_int8", "8-bit GEMM (--numerics ggml)")
attention = partial(_kernel_module, "attention", "attention")
rowwise = partial(_kernel_module, "rowwise", "row")
ssm = partial(_kernel_module, "ssm", "state-space")


@lru_cache(maxsize=1)
def _gelu_f16_table() -> np.ndarray:
    """ggml-cpu's GELU table (GGML_GELU_FP16): the GELU of every f16 value, taken in float32 as
    ggml_gelu_f32 takes it, rounded to f16 (as float32, indexed by the f16 bits)."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):  # nan and inf bit patterns: never looked up in range
        inner = np.float32(SQRT_2_OVER_PI) * x * (np.float32(1) + np.float32(GELU_COEF_A) * x * x)
        gelu = np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))
    return gelu.astype(np.float16).astype(np.float32)


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """GELU as ggml-cpu takes it for float32 rows: the table at x rounded to f16 for −10 < x < 10,
    0 below and x above."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):  # beyond f16's range the table is not used
        table = _gelu_f16_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, table))


def rounding_family(qtype: int):
    """Which rounding ggml-cpu gives the activations of a `qtype` weight: q8 blocks of 32, q8_K
    blocks of 256, or one of its own (f16, bf16, none)."""
    return "q8_32" if qtype in QUANT_32_TYPES else "q8_k" if qtype in QUANT_K_TYPES else qtype


@lru_cache(maxsize=1)
def attention_tasks() -> int:
    """Chunks attend_rows cuts a long cache into: two per numba thread (asked once: numba's
    get_num_threads costs microseconds a call)."""
    from numba import get_num_threads
    return 2 * get_num_threads()


def gemm_tasks() -> int:
    """Weight tiles the 8-bit GEMM cuts a matrix into (at most): four per numba thread, so that
    threads finish together."""
    return 2 * attention_tasks()


def serial_suffix(n_rows: int) -> str:
    """The name suffix of a row kernel's serial variant when n_rows is small enough for it."""
    return "_serial" if n_rows <= SERIAL_ROWS else ""


def in_place_rows(x) -> bool:
    """Cache rows attend_rows can read where they lie: contiguous f32 or f16 (cells, heads, d), or
    contiguous rows of blocks."""
    if isinstance(x, BlockRows):
        return x.raw.flags.c_contiguous
    return isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float16) and x.flags.c_contiguous


def row_type(x) -> int:
    """The ggml type id of cache rows (BlockRows, or an f32/f16 array)."""
    if isinstance(x, BlockRows):
        return int(x.qtype)
    return int(GGMLQuantizationType.F16 if x.dtype == np.float16 else GGMLQuantizationType.F32)


def row_bytes(x) -> np.ndarray:
    """Cache rows as (cells, bytes of a row): what attention.attend_blocks reads."""
    rows = x.raw if isinstance(x, BlockRows) else x.reshape(len(x), -1)
    return rows.view(np.uint8)


def cache_bits(x: np.ndarray) -> np.ndarray:
    """Cache rows as (cells, heads·d): f32 as they are, f16 as their bits (uint16)."""
    rows = x.reshape(len(x), -1)
    return rows.view(np.uint16) if rows.dtype == np.float16 else rows


def as_float(x) -> np.ndarray:
    """Cache rows (an f32/f16 array or BlockRows) as float32 (n, heads, head_dim)."""
    if isinstance(x, BlockRows):
        return x.to_float()
    return x.astype(np.float32, copy=False)


def dequantize_all(w) -> np.ndarray:
    """A weight as one float32 matrix (for the rare paths that need it whole)."""
    if not isinstance(w, QuantWeight):
        return w
    return np.concatenate([dequantize(p.raw.reshape(-1), GGMLQuantizationType(p.qtype), p.n_out * w.n_in)
                           .reshape(p.n_out, w.n_in) for p in w.parts])
