"""Scalar helpers the kernels inline: numba's fastmath flags, a vectorizable exp, half widening.

numba's own exp is a scalar libm call (no SVML here), six times slower than NumPy's; `fast_exp`
is a polynomial LLVM vectorizes (relative error ≤ 3e-7 over float32's normal range).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

F16_RESCALE = np.float32(2.0 ** 112)  # half exponent bias 15 → float bias 127
# fastmath without "nnan"/"ninf": masked cells are -inf and the kernels test for it
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _f32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.uint32), codegen


@njit(inline="always")
def widen_half(h):
    """IEEE half bits → float32: the exponent and mantissa shifted into place and rescaled by
    2^112 (right for subnormals too); an all-ones exponent (inf, nan) is rebuilt as such."""
    h = np.uint32(h)
    body = (h & np.uint32(0x7FFF)) << np.uint32(13)
    x = _f32_from_bits(body) * F16_RESCALE
    if (h & np.uint32(0x7C00)) == np.uint32(0x7C00):
        x = _f32_from_bits(body | np.uint32(0x7F800000))
    return -x if h & np.uint32(0x8000) else x


@njit(inline="always")
def fast_exp(x):
    """e^x in float32: 2^n · e^r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial and 2^n
    built in the exponent bits. Below -87.3 (e^x under float32's normal range) it is 0."""
    y = min(max(x, np.float32(-87.3)), np.float32(88.37))  # 2^n stays finite
    n = np.floor(y * np.float32(1.4426950408889634) + np.float32(0.5))
    r = y - n * np.float32(0.693145751953125) - n * np.float32(1.428606765330187e-06)  # ln2 split hi/lo
    p = np.float32(1.0 / 720)
    for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * r + np.float32(c)
    e = p * _f32_from_bits(np.uint32((np.int32(n) + 127) << 23))
    return e if x > np.float32(-87.3) else np.float32(0)


def as_f32(x):
    """A cache element as float32 (compiled per element type below)."""


@overload(as_f32)
def _as_f32(x):
    if x == types.uint16:
        return lambda x: widen_half(x)
    if isinstance(x, types.Float):
        return lambda x: np.float32(x)
    return None
