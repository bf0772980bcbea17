"""Dequantize ggml block formats with vectorised NumPy.

Each `_dequant_<type>` takes a `(n_blocks, type_size)` uint8 array and returns `(n_blocks, block)`
float32, with ggml's arithmetic order (so results match `gguf.quants.dequantize` bit for bit).
Types without a fast path here fall back to `gguf.quants`, which is correct but slow.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from .errors import UnsupportedError

CHUNK_BLOCKS = 1 << 16


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 field at byte `start` of each block, as a float32 column."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) packed bytes → (n, 32): low nibbles first, then high nibbles (ggml's Q4 order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh_bytes: np.ndarray) -> np.ndarray:
    """(n, 4) little-endian bit field → (n, 32) bits, bit j for element j."""
    return np.unpackbits(qh_bytes, axis=1, bitorder="little")


def _dequant_q4_0(b):
    d = _f16(b, 0)
    return (_nibbles(b[:, 2:18]).astype(np.int8) - 8).astype(np.float32) * d


def _dequant_q4_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    return _nibbles(b[:, 4:20]).astype(np.float32) * d + m


def _dequant_q5_0(b):
    d = _f16(b, 0)
    q = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)
    return (q.astype(np.int8) - 16).astype(np.float32) * d


def _dequant_q5_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q.astype(np.float32) * d + m


IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def _dequant_iq4_nl(b):
    return IQ4_NL_VALUES[_nibbles(b[:, 2:18])].astype(np.float32) * _f16(b, 0)


def _dequant_q8_0(b):
    d = _f16(b, 0)
    return b[:, 2:34].view(np.int8).astype(np.float32) * d


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte 6-bit scales/mins of Q4_K and Q5_K into two (n, 8) arrays."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _dequant_q4_k(b):
    n = len(b)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, 256)


def _dequant_q5_k(b):
    n = len(b)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = q + (high << 4)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, 256)


def _dequant_q6_k(b):
    n = len(b)
    ql = b[:, 0:128].reshape(n, 2, 2, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # (n, half, 4, 32): k = 0..3
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = ((low | (high << 4)).astype(np.int8) - 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q.reshape(n, 16, 16)).reshape(n, 256)


def _dequant_q2_k(b):
    n = len(b)
    scales = b[:, 0:16]
    qs = b[:, 16:80].reshape(n, 2, 1, 2, 16)
    d, dmin = _f16(b, 80), _f16(b, 82)
    q = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None, None]) & 3
    dl = d * (scales & 0x0F).astype(np.float32)
    ml = dmin * (scales >> 4).astype(np.float32)
    return (dl[:, :, None] * q.reshape(n, 16, 16) - ml[:, :, None]).reshape(n, 256)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    hi_src = s[:, 8:12]
    hi = np.concatenate([(hi_src >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1)
    return (lo | (hi << 4)).astype(np.int8).astype(np.float32) - 32


def _dequant_q3_k(b):
    n = len(b)
    hmask = b[:, 0:32].reshape(n, 1, 1, 2, 16)
    qs = b[:, 32:96].reshape(n, 2, 1, 2, 16)
    sc = _q3_k_scales(b[:, 96:108])
    d = _f16(b, 108)
    shifts = np.arange(4, dtype=np.uint8)[None, None, :, None, None]
    q = ((qs >> (2 * shifts)) & 3).astype(np.int8)
    bit = (4 * np.arange(2, dtype=np.uint8))[None, :, None, None, None] + shifts
    q = q - np.where((hmask >> bit) & 1, 0, 4).astype(np.int8)
    return ((d * sc)[:, :, None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _dequant_bf16(b):
    return (b.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


_FAST = {
    T.BF16: _dequant_bf16,
    T.Q4_0: _dequant_q4_0, T.Q4_1: _dequant_q4_1,
    T.Q5_0: _dequant_q5_0, T.Q5_1: _dequant_q5_1,
    T.Q8_0: _dequant_q8_0, T.IQ4_NL: _dequant_iq4_nl,
    T.Q2_K: _dequant_q2_k, T.Q3_K: _dequant_q3_k,
    T.Q4_K: _dequant_q4_k, T.Q5_K: _dequant_q5_k, T.Q6_K: _dequant_q6_k,
}
FAST_TYPES = frozenset(_FAST) | {T.F32, T.F16, T.BF16}


def dequantize(raw: np.ndarray, qtype: T, n_elements: int, name: str = "", dtype=np.float32) -> np.ndarray:
    """Flat `dtype` array of `n_elements` values from the raw bytes of one tensor."""
    if qtype == T.F32:
        return raw.view(np.float32)[:n_elements].astype(dtype, copy=True)
    if qtype == T.F16:
        return raw.view(np.float16)[:n_elements].astype(dtype)
    if qtype == T.BF16:
        return (raw.view(np.uint16)[:n_elements].astype(np.uint32) << 16).view(np.float32).astype(dtype, copy=False)
    block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, type_size)
    kernel = _FAST.get(qtype) or _gguf_fallback(qtype, name)
    out = np.empty((len(blocks), block), dtype=dtype)
    for start in range(0, len(blocks), CHUNK_BLOCKS):
        out[start:start + CHUNK_BLOCKS] = kernel(blocks[start:start + CHUNK_BLOCKS])
    return out.reshape(-1)[:n_elements]


def _gguf_fallback(qtype: T, name: str):
    from gguf import quants

    block, _ = GGML_QUANT_SIZES[qtype]

    def kernel(blocks: np.ndarray) -> np.ndarray:
        try:
            return quants.dequantize(blocks, qtype).reshape(len(blocks), block)
        except NotImplementedError:
            raise UnsupportedError(f"tensor '{name}' uses type {qtype.name}, which cannot be dequantized") from None

    return kernel



# ---- quantization of cache rows (the block cache types), with ggml's reference rounding -----------

def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _quantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = _round_half_away(blocks * inv).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)


def _quantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    signed_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    d = signed_max / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.trunc(blocks * inv + np.float32(8.5)), 15).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([d.astype(np.float16).view(np.uint8), packed], axis=1)


def _min_scale(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1/Q5_1's block minimum, scale (max - min) / levels and its inverse (0 where the block is flat)."""
    low, high = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
    d = (high - low) / np.float32(levels)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    return low, d, inv


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of a block's 32 codes as the little-endian u32 qh (bit j for value j)."""
    bits = ((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)
    return np.bitwise_or.reduce(bits, axis=1).astype("<u4")[:, None].view(np.uint8)


def _quantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    low, d, inv = _min_scale(blocks, 15)
    q = np.minimum(np.trunc((blocks - low) * inv + np.float32(0.5)), 15).astype(np.uint8)
    halves = [x.astype(np.float16).view(np.uint8) for x in (d, low)]
    return np.concatenate([*halves, q[:, :16] | (q[:, 16:] << 4)], axis=1)


def _quantize_q5_0(blocks: np.ndarray) -> np.ndarray:
    signed_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    d = signed_max / np.float32(-16)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.trunc(blocks * inv + np.float32(16.5)), 31).astype(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), _fifth_bits(q),
                           (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)], axis=1)


def _quantize_q5_1(blocks: np.ndarray) -> np.ndarray:
    low, d, inv = _min_scale(blocks, 31)
    q = np.trunc((blocks - low) * inv + np.float32(0.5)).astype(np.uint8)  # ggml does not clamp here
    halves = [x.astype(np.float16).view(np.uint8) for x in (d, low)]
    return np.concatenate([*halves, _fifth_bits(q), (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)], axis=1)


def _quantize_bf16(values: np.ndarray) -> np.ndarray:
    """ggml's f32 → bf16: round to nearest even, a NaN kept quiet (blocks of one value)."""
    bits = values.view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 64, rounded).astype(np.uint16).view(np.uint8)


_IQ4_NL_LEVELS_DOWN = IQ4_NL_VALUES[::-1].astype(np.float32)


def _quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_ref: no scale search (ntry = -1). Each value takes the level
    nearest x·(-127/max) (a tie goes to the upper level, as best_index_int8 picks it: argmin over
    the levels from the top down); the stored scale is the weighted least-squares one for those
    levels (weights x²), its two sums taken in ggml's order (cumsum is sequential). A block under
    GROUP_MAX_EPS gets scale 0 (ggml leaves its codes as they were; here they are whatever the
    tiny values give)."""
    signed_max = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)][:, None]
    d = signed_max / np.float32(-127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    codes = (15 - np.abs((blocks * inv)[..., None] - _IQ4_NL_LEVELS_DOWN).argmin(axis=-1)).astype(np.uint8)
    q = IQ4_NL_VALUES[codes].astype(np.float32)
    wq = blocks * blocks * q
    sum_qx, sum_q2 = np.cumsum(np.stack([wq * blocks, wq * q]), axis=2, dtype=np.float32)[:, :, -1:]
    scale = np.divide(sum_qx, sum_q2, out=np.zeros_like(sum_qx), where=(sum_q2 > 0) & (np.abs(signed_max) >= 1e-15))
    return np.concatenate([scale.astype(np.float16).view(np.uint8), codes[:, :16] | (codes[:, 16:] << 4)], axis=1)


# ggml-cpu's from_float for a cache row is the reference quantizer of ggml-quants.c for these types
_QUANTIZE = {T.BF16: _quantize_bf16, T.Q8_0: _quantize_q8_0, T.Q4_0: _quantize_q4_0, T.Q4_1: _quantize_q4_1, T.Q5_0: _quantize_q5_0,
             T.Q5_1: _quantize_q5_1, T.IQ4_NL: _quantize_iq4_nl}
QUANTIZABLE_TYPES = frozenset(_QUANTIZE)


def quantize_rows(rows: np.ndarray, qtype: T) -> np.ndarray:
    """(n, dim) float → (n, dim / block * type_size) uint8 ggml blocks (bf16: blocks of one value)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = len(rows)
    blocks = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, block)
    return _QUANTIZE[qtype](blocks).reshape(n, -1)


def dequantize_rows(raw: np.ndarray, qtype: T) -> np.ndarray:
    """(n, row_bytes) uint8 ggml blocks → (n, dim) float32."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    n = len(raw)
    return _FAST[qtype](raw.reshape(-1, type_size)).reshape(n, -1)


# ---- ggml's activation rounding (`--numerics ggml`) --------------------------------------------
# ggml-cpu converts a matmul's activations to its weight type's `vec_dot_type` before the dot
# product: F16/BF16 rows for F16/BF16 weights, 8-bit blocks for quantized ones (q8_0/q8_1 blocks
# of 32 with an f16 scale for the 32-blocks, q8_K blocks of 256 with an f32 scale for K-quants).
# The integer dot product equals the float product of the rounded activations and the weights, but
# for Q4_1/Q5_1's block offsets, which take q8_1's f16 block sum (q8_1_offset_error).

def _q8_32_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_0/q8_1 (x86): per 32 values, q = round-to-even(x · 127/amax) and
    the float scale d = amax/127 (stored as f16). The multiplier is 127/amax, not 1/d: the two
    differ in the last bit, and that flips roundings."""
    blocks = x.reshape(len(x), -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    return np.round(blocks * inv), amax / np.float32(127)


def _as_q8_32(x: np.ndarray) -> np.ndarray:
    q, d = _q8_32_blocks(x)
    return (q * _round_f16(d)).reshape(x.shape)


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _as_q8_k(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(len(x), -1, 256)
    signed_max = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)
    inv = np.divide(np.float32(-127), signed_max, out=np.zeros_like(signed_max), where=signed_max != 0)
    d = np.divide(np.float32(1), inv, out=np.zeros_like(inv), where=inv != 0)
    return (np.minimum(np.round(blocks * inv), 127) * d).reshape(x.shape)


def _as_bf16(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)  # to nearest even
    return rounded.view(np.float32)


QUANT_32_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)  # their activations: q8_0/q8_1 blocks of 32
QUANT_K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)  # q8_K blocks of 256

_ACTIVATION_ROUNDING = {
    T.F16: _round_f16,
    T.BF16: _as_bf16,
    **{t: _as_q8_32 for t in QUANT_32_TYPES},
    **{t: _as_q8_k for t in QUANT_K_TYPES},
}


Q8_1_OFFSET_TYPES = (T.Q4_1, T.Q5_1)  # weights whose dot takes the q8_1 block sums: m·s8


def q8_1_offset_error(x: np.ndarray) -> np.ndarray:
    """(n, n_in // 32): what a Q4_1/Q5_1 dot adds, per unit of block minimum, beyond the product
    of the rounded activations and the weights: a q8_1 block keeps s = d·Σq rounded to f16, and
    the dot takes the offset as m·s, where the rounded activations give m·f16(d)·Σq."""
    q, d = _q8_32_blocks(np.ascontiguousarray(x, dtype=np.float32))
    sums, d = q.sum(axis=-1), d[..., 0]
    return _round_f16(d * sums) - _round_f16(d) * sums


def block_mins(raw: np.ndarray, weight_type: int) -> np.ndarray:
    """A Q4_1/Q5_1 weight's block minimums m, (n_out, n_in // 32) floats."""
    _, type_size = GGML_QUANT_SIZES[T(int(weight_type))]
    return raw.reshape(len(raw), -1, type_size)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)


def ggml_activations(x: np.ndarray, weight_type: int) -> np.ndarray:
    """(n, n_in) float32 activations as ggml-cpu rounds them for a weight of `weight_type`
    (unchanged for F32 and types without a rule)."""
    rounding = _ACTIVATION_ROUNDING.get(T(int(weight_type)))
    return x if rounding is None else rounding(np.ascontiguousarray(x, dtype=np.float32))
