"""Row-wise kernels compiled with numba: RMS norm, the gated FFN activations and RoPE.

Each activation and RoPE has a parallel kernel for prompts and a serial one for a few rows.
`geglu_table_rows` is ggml numerics' GEGLU, through ggml-cpu's f16 GELU table (needs F16C).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .cache import cached, parallel_and_serial
from .ir import I16, I32, fma
from .scalar import FAST, fast_exp


@cached(fastmath=FAST)
def rms_norm_rows(x, weight, eps, out):
    """out = x / sqrt(mean(x²) + eps) for each row of x (R, d), then times weight[r % W] when
    weight (W, d) has rows. The sum of squares is taken in float64, as ggml takes it. One
    thread: a decoded row is too small to share, and a prompt's rows take microseconds."""
    R, d = x.shape
    W = weight.shape[0]
    for r in range(R):
        total = 0.0
        for j in range(d):
            v = x[r, j]
            total += np.float64(v * v)
        scale = np.float32(1) / np.sqrt(np.float32(total / d) + eps)
        if W == 0:
            for j in range(d):
                out[r, j] = x[r, j] * scale
        else:
            w = weight[r % W]
            for j in range(d):
                out[r, j] = (x[r, j] * scale) * w[j]


@njit(fastmath=FAST, inline="always")
def _swiglu_row(h, out, i):
    n_ff = out.shape[1]
    for j in range(n_ff):
        x = h[i, j]
        out[i, j] = x / (np.float32(1) + fast_exp(-x)) * h[i, n_ff + j]


@njit(fastmath=FAST, inline="always")
def _geglu_row(h, out, i):
    """0.5·x·(1 + tanh(u)) written x / (1 + e^(-2u)): one exp and no tanh."""
    n_ff = out.shape[1]
    for j in range(n_ff):
        x = h[i, j]
        u = np.float32(0.7978845608028654) * x * (np.float32(1) + np.float32(0.044715) * x * x)
        out[i, j] = x / (np.float32(1) + fast_exp(np.float32(-2) * u)) * h[i, n_ff + j]


@intrinsic
def fused_multiply_add(typingctx, a, b, c):
    """a·b + c rounded once (llvm.fma.f32), whatever the compiler would contract."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return fma(builder, *args)

    return types.float32(a, b, c), codegen


@njit(inline="always")
def _rope_row(x, cos, sin, neox, out, t):
    """ggml's rotate_pairs as GCC compiles it: the x1 products rounded, the x0 products fused
    (docs/performance.md). Spelled out, and compiled without fastmath, so that a kernel fresh
    from the compiler and one loaded from numba's cache give the same bits."""
    n, n_head, d = x.shape
    half = cos.shape[1]
    for h in range(n_head):
        out[t, h, 2 * half:] = x[t, h, 2 * half:]
        for i in range(half):
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1, c, s = x[t, h, a], x[t, h, b], cos[t, i], sin[t, i]
            out[t, h, a] = fused_multiply_add(x0, c, -(x1 * s))
            out[t, h, b] = fused_multiply_add(x0, s, x1 * c)


# Each row op is a parallel kernel for prompts and a serial twin (<name>_serial) for a few rows:
# waking numba's threads costs a few microseconds a call, more than a decoded row's work.

def swiglu_rows(h, out):
    """out = silu(gate)·up for h = [gate | up] (n, 2·n_ff), C-contiguous; out (n, n_ff)."""
    for i in prange(h.shape[0]):
        _swiglu_row(h, out, i)


def geglu_rows(h, out):
    """out = gelu(gate)·up, GELU's tanh form, for h = [gate | up] (n, 2·n_ff); out (n, n_ff)."""
    for i in prange(h.shape[0]):
        _geglu_row(h, out, i)


def rope_rows(x, cos, sin, neox, out):
    """out = x (n, heads, d) with its first 2·len(cos[0]) dims of each head rotated by the
    per-token angles: pairs (2i, 2i+1), or (i, i + n_rot/2) in NEOX mode; the rest copied."""
    for t in prange(x.shape[0]):
        _rope_row(x, cos, sin, neox, out, t)


# error_model="numpy": a float division by zero gives inf, as in C, instead of raising; without the
# check for it the loops vectorize (decode's swiglu over 4608 values: 15 µs → a few)
swiglu_rows, swiglu_rows_serial = parallel_and_serial(swiglu_rows, fastmath=FAST, error_model="numpy")
geglu_rows, geglu_rows_serial = parallel_and_serial(geglu_rows, fastmath=FAST, error_model="numpy")
rope_rows, rope_rows_serial = parallel_and_serial(rope_rows)


@intrinsic
def half_bits(typingctx, x):
    """A float32 rounded to the nearest IEEE half (to even), as its 16 bits (F16C)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), I16), I32)

    return types.int32(x), codegen


@cached()
def geglu_table_rows(h, table, out):
    """ggml-cpu's GEGLU for float32 rows (GGML_GELU_FP16) over a fused gate|up h (n, 2·n_ff):
    out = table[f16 bits of gate] · up, 0 where gate <= −10 and gate · up where gate >= 10."""
    n_ff = out.shape[1]
    for i in range(h.shape[0]):
        for j in range(n_ff):
            x, up = h[i, j], h[i, n_ff + j]
            if x <= -10:
                out[i, j] = 0
            elif x >= 10:
                out[i, j] = x * up
            else:
                out[i, j] = table[half_bits(x)] * up
