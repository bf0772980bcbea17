"""CPU kernels over weights kept in their GGUF types, compiled with numba (cached on disk).

A weight is its raw bytes as a `(n_out, row_bytes)` uint8 array. One block decoder per type
writes a block's values as float32 with ggml's arithmetic. Per type, two kernels:

- `MATVEC[type](w, x, out)`: `out[i, r] = x[i] · W[r]` for a few activation rows, parallel over
  W's rows; a weight row is read from memory once and never written out as float32.
- `DEQUANT[type](w, rows, out)`: the rows `rows` of W as float32, on one thread: the tiles of a
  BLAS matmul for many activation rows, and embedding lookups. Exact (no fused multiply-add
  here), so the values equal `quants.dequantize` bit for bit.

The block types real models use have both kernels as vector code in vkernels.py; here remain the
float rows (converted a row at a time) and Q2_K/Q3_K (a block decoded into a buffer).

`DEQUANT` also converts f16 and q8_0/q4_0 KV-cache rows a block at a time for attention.
Each kernel is its own small numba function: numba caches top-level functions on disk, and a
single kernel switching on the type would take many minutes to compile. Type ids are ggml's
(`GGMLQuantizationType`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import vkernels

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
ROWS_PER_TASK = 32  # weight rows a worker takes at a time (its buffers are allocated once per task)
RUN = 32  # values decoded at a time for float types, and the legacy blocks

# every half's value, indexed by its bits (numba compiles this table into the kernels)
_HALF = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@njit(inline="always")
def _b(row, i):
    """A byte as int32 (numba would type uint8-with-int64 arithmetic as float)."""
    return np.int32(row[i])


@njit(inline="always")
def half(row, at):
    """The IEEE half stored little-endian at row[at], row[at + 1] (one lookup in a 256 KB table)."""
    return _HALF[_b(row, at) | (_b(row, at + 1) << 8)]


# ---- block decoders: (row bytes, block index, out) -------------------------------------------

@njit(inline="always")
def _q2_k(row, b, out, o):
    at = b * 84
    d, dmin = half(row, at + 80), half(row, at + 82)
    for n in range(2):
        for shift in range(4):
            for half_ in range(2):
                sc = _b(row, at + n * 8 + shift * 2 + half_)
                dl, ml = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                qs = at + 16 + n * 32 + half_ * 16
                base = n * 128 + shift * 32 + half_ * 16
                for ll in range(16):
                    out[o + base + ll] = dl * np.float32((_b(row, qs + ll) >> (2 * shift)) & 3) - ml


@njit(inline="always")
def _q3_k_scale(row, at, j):
    """Sub-block j's signed 6-bit scale from Q3_K's 12 packed bytes at row[at]."""
    lo = (_b(row, at + j) & 15) if j < 8 else (_b(row, at + j - 8) >> 4)
    hi = (_b(row, at + 8 + j % 4) >> (2 * (j // 4))) & 3
    return np.float32(np.int32(lo | (hi << 4)) - 32)


@njit(inline="always")
def _q3_k(row, b, out, o):
    at = b * 110
    d = half(row, at + 108)
    for n in range(2):
        for shift in range(4):
            for half_ in range(2):
                j = n * 8 + shift * 2 + half_
                scale = d * _q3_k_scale(row, at + 96, j)
                qs = at + 32 + n * 32 + half_ * 16
                bit = 4 * n + shift
                base = n * 128 + shift * 32 + half_ * 16
                for ll in range(16):
                    q = np.int32((_b(row, qs + ll) >> (2 * shift)) & 3)
                    if not (_b(row, at + half_ * 16 + ll) >> bit) & 1:
                        q -= 4
                    out[o + base + ll] = scale * np.float32(q)


@njit(inline="always")
def _f16_values(src, start, n, out, o):
    """n halves src[start:start + n] (uint16 bits) as float32 into out[o:o + n]: a half's sign,
    exponent and mantissa placed in a float's bits and rescaled by 2**112, exact for every finite
    half (subnormals included; inf and nan are not expected in weights or caches), in two loops
    LLVM vectorizes."""
    bits = out.view(np.int32)
    for j in range(n):
        h = np.int32(src[start + j])
        bits[o + j] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
    for j in range(n):
        out[o + j] *= np.float32(5.192296858534828e33)


# ---- dots: one weight row with one activation row ---------------------------------------------

@njit(inline="always")
def _dot_decoded(row, x, lanes, vals, decoder, run):
    """Decode each block into vals, then accumulate per lane."""
    lanes[:] = 0.0
    for b in range(x.shape[0] // run):
        decoder(row, b, vals, 0)
        for j in range(run):
            lanes[j] += vals[j] * x[b * run + j]
    return lanes.sum()


# ---- drivers ------------------------------------------------------------------------------------

@njit(inline="always")
def _matvec_decoded(w, x, out, decoder, run):
    n_out = w.shape[0]
    for c in prange((n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        lanes = np.empty(run, dtype=np.float32)
        vals = np.empty(run, dtype=np.float32)
        for r in range(c * ROWS_PER_TASK, min((c + 1) * ROWS_PER_TASK, n_out)):
            for i in range(x.shape[0]):
                out[i, r] = _dot_decoded(w[r], x[i], lanes, vals, decoder, run)


@njit(inline="always")
def _matvec_floats(w, x, out, convert):
    """Float rows: each row converted whole into a buffer (one view per row, any length), then
    dotted with every activation row in RUN lanes and a tail."""
    n_out, n_in = w.shape[0], x.shape[1]
    n_full = n_in - n_in % RUN
    for c in prange((n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        values = np.empty(n_in, dtype=np.float32)
        lanes = np.empty(RUN, dtype=np.float32)
        for r in range(c * ROWS_PER_TASK, min((c + 1) * ROWS_PER_TASK, n_out)):
            convert(w[r], values)
            for i in range(x.shape[0]):
                lanes[:] = 0.0
                for b in range(0, n_full, RUN):
                    for j in range(RUN):
                        lanes[j] += values[b + j] * x[i, b + j]
                total = lanes.sum()
                for j in range(n_full, n_in):
                    total += values[j] * x[i, j]
                out[i, r] = total


@njit(inline="always")
def _dequant(w, rows, out, decoder, run):
    for i in range(len(rows)):
        row, dst = w[rows[i]], out[i]
        for b in range(out.shape[1] // run):
            decoder(row, b, dst, b * run)


@njit(inline="always")
def _dequant_floats(w, rows, out, convert):
    """Float rows: one view of each row for the whole row (a view per 32 values costs more than
    the conversion)."""
    for i in range(len(rows)):
        convert(w[rows[i]], out[i])


@njit(inline="always")
def _row_f32(row, out):
    out[:] = row.view(np.float32)


@njit(inline="always")
def _row_f16(row, out):
    _f16_values(row.view(np.uint16), 0, out.shape[0], out, 0)


@njit(inline="always")
def _row_bf16(row, out):
    src, bits = row.view(np.uint16), out.view(np.int32)
    for j in range(out.shape[0]):
        bits[j] = np.int32(src[j]) << 16


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_f32(w, x, out):
    _matvec_floats(w, x, out, _row_f32)


@njit(cache=True)
def dequant_f32(w, rows, out):
    _dequant_floats(w, rows, out, _row_f32)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_f16(w, x, out):
    _matvec_floats(w, x, out, _row_f16)


@njit(cache=True)
def dequant_f16(w, rows, out):
    _dequant_floats(w, rows, out, _row_f16)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_bf16(w, x, out):
    _matvec_floats(w, x, out, _row_bf16)


@njit(cache=True)
def dequant_bf16(w, rows, out):
    _dequant_floats(w, rows, out, _row_bf16)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_q2_k(w, x, out):
    _matvec_decoded(w, x, out, _q2_k, 256)


@njit(cache=True)
def dequant_q2_k(w, rows, out):
    _dequant(w, rows, out, _q2_k, 256)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_q3_k(w, x, out):
    _matvec_decoded(w, x, out, _q3_k, 256)


@njit(cache=True)
def dequant_q3_k(w, rows, out):
    _dequant(w, rows, out, _q3_k, 256)


MATVEC = {F32: matvec_f32, F16: matvec_f16, BF16: matvec_bf16, Q2_K: matvec_q2_k, Q3_K: matvec_q3_k,
          **vkernels.MATVEC}
# types whose MATVEC also takes a tuple of same-type parts (one launch for q|k|v, gate|up)
MULTI_PART = frozenset(vkernels.MATVEC)
DEQUANT = {F32: dequant_f32, F16: dequant_f16, BF16: dequant_bf16, Q2_K: dequant_q2_k, Q3_K: dequant_q3_k,
           **vkernels.DEQUANT}
