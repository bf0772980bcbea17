"""Activations rounded to q8 blocks as ggml-cpu rounds them before a quantized matmul (x86).

`quantize_q8` and `quantize_q8_k` (quantize_row_q8_1 and quantize_row_q8_K) give the codes, scales
and sums the integer mat-vecs (matvec_int.py) and the 8-bit GEMM (gemm_int8.py) take;
`round_q8_rows` and `round_q8_k_rows` give a prompt's rounded rows as floats for the float path
(BLAS). The f16 roundings need F16C (matvec_int.AVAILABLE says where they run).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .cache import cached
from .ir import F32


@intrinsic
def round_to_half(typingctx, x):
    """A float32 rounded to the nearest IEEE half (to even), back as float32 (F16C)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), F32)

    return types.float32(x), codegen


@njit(inline="always")
def quantize_q8(x, q, d, s):
    """ggml's quantize_row_q8_1 (x86) for each row of x (n, n_in): per 32 values the codes
    round-to-even(x · 127/amax) into q, the scale amax/127 as an f16 into d and the f16 of
    amax/127 · Σcodes into s (as floats). No fast-math: the rounding must be IEEE's."""
    n, n_in = x.shape
    for i in range(n):
        for b in range(n_in // 32):
            amax = np.float32(0)
            for j in range(b * 32, b * 32 + 32):
                amax = max(amax, abs(x[i, j]))
            scale = amax / np.float32(127)
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            total = 0
            for j in range(b * 32, b * 32 + 32):
                code = np.int32(np.rint(x[i, j] * inv))
                q[i, j] = code
                total += code
            d[i, b] = round_to_half(scale)
            s[i, b] = round_to_half(scale * np.float32(total))


@njit(inline="always")
def quantize_q8_k(x, q, d, bsums):
    """ggml's quantize_row_q8_K: per 256 values, the value of largest magnitude (the first such)
    sets iscale = −127/max, codes min(127, round-to-even(iscale·x)), the f32 scale 1/iscale, and
    the sums of each 16 codes."""
    n, n_in = x.shape
    for i in range(n):
        for b in range(n_in // 256):
            amax, signed = np.float32(0), np.float32(0)
            for j in range(b * 256, b * 256 + 256):
                if abs(x[i, j]) > amax:
                    amax, signed = abs(x[i, j]), x[i, j]
            iscale = np.float32(-127) / signed if amax != 0 else np.float32(0)
            d[i, b] = np.float32(1) / iscale if amax != 0 else np.float32(0)
            for g in range(16):
                total = 0
                for j in range(b * 256 + g * 16, b * 256 + g * 16 + 16):
                    code = min(np.int32(127), np.int32(np.rint(iscale * x[i, j])))
                    q[i, j] = code
                    total += code
                bsums[i, b * 16 + g] = total


@njit(inline="always")
def _rounded(x, quantize, per_scale, per_sum, sum_type):
    n, n_in = x.shape
    q = np.empty((n, n_in), dtype=np.int8)
    d = np.empty((n, n_in // per_scale), dtype=np.float32)
    sums = np.empty((n, n_in // per_sum), dtype=sum_type)
    quantize(x, q, d, sums)
    return q, d, sums


@njit(inline="always")
def q8_blocks(x):
    """x (n, n_in) rounded to q8_1 blocks: the codes (n, n_in) int8, and per block its f16 scale
    and f16 sum (n, n_in // 32)."""
    return _rounded(x, quantize_q8, 32, 32, np.float32)


@njit(inline="always")
def q8_k_blocks(x):
    """x (n, n_in) rounded to q8_K blocks: the codes (n, n_in) int8, an f32 scale per 256 values
    and the int32 sums of each 16 codes."""
    return _rounded(x, quantize_q8_k, 256, 16, np.int32)


@cached()
def round_q8_rows(x, out, offset_error):
    """Many rows (a prompt): x rounded to q8_0/q8_1 blocks as floats (code · f16 scale) into out,
    and per block f16(d·Σq) − f16(d)·Σq into offset_error (what Q4_1/Q5_1's m·s8 adds beyond the
    rounded values). The products then go to BLAS: one thread, as the weight tiles (numba's
    spinning workers would slow BLAS's)."""
    n, n_in = x.shape
    for i in range(n):
        q, d, s = q8_blocks(x[i:i + 1])
        for b in range(n_in // 32):
            total = 0
            for j in range(b * 32, b * 32 + 32):
                out[i, j] = np.float32(q[0, j]) * d[0, b]
                total += q[0, j]
            offset_error[i, b] = s[0, b] - d[0, b] * np.float32(total)


@cached()
def round_q8_k_rows(x, out):
    """Many rows: x rounded to q8_K blocks as floats (code · scale) into out (one thread)."""
    n, n_in = x.shape
    for i in range(n):
        q, d, _ = q8_k_blocks(x[i:i + 1])
        for j in range(n_in):
            out[i, j] = np.float32(q[0, j]) * d[0, j // 256]
