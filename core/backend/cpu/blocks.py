"""GGUF blocks read as LLVM IR: what the float mat-vecs (and dequant), the integer mat-vecs and the
8-bit GEMM share about how ggml packs a block of one weight row."""

from __future__ import annotations

from contextlib import contextmanager

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from llvmlite import ir
from numba.core import cgutils

from .ir import I8, I16, I32, I64, VI32, constant_lanes, pointer, widen_halves

# the block types with vector-coded kernels (every mat-vec, dequant and the GEMM)
VECTOR_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def block_size(name: str) -> tuple[int, int]:
    """(values, bytes) of one block of GGUF type `name`."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


@contextmanager
def each_block(builder: ir.IRBuilder, n_blocks, block_bytes: int, block_values: int):
    """A loop over a row's blocks: yields the block's index, first byte and first value."""
    with cgutils.for_range(builder, n_blocks) as loop:
        at = builder.mul(loop.index, ir.Constant(I64, block_bytes))
        yield loop.index, at, builder.mul(loop.index, ir.Constant(I64, block_values))


class BlockReader:
    """Loads from one block of one weight row (`row` the row's first byte, `at` the block's) and
    does lane arithmetic on its codes, vectors of type CODES: the float kernels widen 16 codes to
    i32 lanes, the integer ones keep 32 bytes."""

    CODES = VI32

    def __init__(self, builder: ir.IRBuilder, row, at):
        self.b, self.row, self.at = builder, row, at

    def _ptr(self, offset, ty):
        return pointer(self.b, self.row, self.at, offset, ty)

    def load(self, offset, ty):
        """A `ty` at byte `offset`, unaligned."""
        return self.b.load(self._ptr(offset, ty), align=1)

    def byte(self, offset):
        """The byte at `offset` as an i32 (unsigned)."""
        return self.b.zext(self.b.load(self._ptr(offset, I8)), I32)

    def signed_byte(self, offset):
        return self.b.sext(self.b.load(self._ptr(offset, I8)), I32)

    def word(self, offset):
        """A little-endian u32 (Q5's high bits)."""
        return self.load(offset, I32)

    def half(self, offset):
        """The IEEE half at `offset` as a float."""
        return widen_halves(self.b, self.load(offset, I16))

    def bytes(self, offset):
        """The codes vector of the bytes at `offset`."""
        raise NotImplementedError

    def lanes(self, value):
        return constant_lanes(self.CODES, value)

    def shr(self, v, bits):
        return self.b.lshr(v, self.lanes(bits))

    def shl(self, v, bits):
        return self.b.shl(v, self.lanes(bits))

    def mask(self, v, m):
        return self.b.and_(v, self.lanes(m))

    def sub(self, v, k):
        return self.b.sub(v, self.lanes(k))

    def or_(self, a, c):
        return self.b.or_(a, c)


def k_scale_min(e: BlockReader, j: int):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes at offset 4, as i32s."""
    b, c = e.b, (lambda v: ir.Constant(I32, v))
    if j < 4:
        return b.and_(e.byte(4 + j), c(63)), b.and_(e.byte(8 + j), c(63))
    high = e.byte(8 + j)
    sc = b.or_(b.and_(high, c(15)), b.shl(b.lshr(e.byte(j), c(6)), c(4)))
    mn = b.or_(b.lshr(high, c(4)), b.shl(b.lshr(e.byte(4 + j), c(6)), c(4)))
    return sc, mn


def k_scale_min_words(e: BlockReader):
    """Q4_K/Q5_K's 8 scales and 8 mins, 6 bits each in 12 bytes at offset 4, as four u32 words of
    one byte per sub-block (scales 0-3, 4-7, mins 0-3, 4-7): three loads and a few masks for the
    whole super-block, as ggml's AVX2 dot unpacks them (k_scale_min, one sub-block, agrees)."""
    b, c = e.b, (lambda v: ir.Constant(I32, v))
    u0, u1, u2 = (e.word(4 + 4 * i) for i in range(3))
    low6, low4, top2 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    scales_hi = b.or_(b.and_(u2, low4), b.shl(b.and_(b.lshr(u0, c(6)), top2), c(4)))
    mins_hi = b.or_(b.and_(b.lshr(u2, c(4)), low4), b.shl(b.and_(b.lshr(u1, c(6)), top2), c(4)))
    return b.and_(u0, low6), scales_hi, b.and_(u1, low6), mins_hi


def k_codes(e: BlockReader, j: int, q5: bool, h: int = 0):
    """Q4_K/Q5_K sub-block j's codes from its byte h on: a nibble, and Q5_K's fifth bit (bit j of
    the 32 bytes at offset 16)."""
    q = e.mask(e.shr(e.bytes(16 + (32 if q5 else 0) + 32 * (j // 2) + h), 4 * (j % 2)), 15)
    if q5:
        q = e.or_(q, e.shl(e.mask(e.shr(e.bytes(16 + h), j), 1), 4))
    return q


def q6_k_codes(e: BlockReader, n: int, k: int, h: int = 0):
    """Q6_K's 6-bit codes (0..63) of values 128n + 32k + h on: four low bits and two high ones."""
    low = e.mask(e.shr(e.bytes(64 * n + 32 * (k % 2) + h), 4 * (k // 2)), 15)
    high = e.shl(e.mask(e.shr(e.bytes(128 + 32 * n + h), 2 * k), 3), 4)
    return e.or_(low, high)
