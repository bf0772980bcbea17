"""Dequantization: rows of a weight (or of a quantized KV cache) as float32, on one thread.

`DEQUANT[type](w, rows, out)` writes the rows `rows` of W as float32 into `out`: the tiles of a
BLAS matmul for many activation rows, embedding lookups, and f16 or q8_0/q4_0 cache rows for
attention a block at a time. One thread: the tiles feed BLAS, whose threads would spin against
numba's. Exact (no fused multiply-add), so the values equal `quants.dequantize` bit for bit.

The block types real models use unpack as vector code: matvec_float.py's block emitters with
each dot written out as values (about 0.1 ns a value; numba's scalar decoders took 0.6-0.7);
the float rows and Q2_K/Q3_K take matvec_float.py's scalar converters and decoders. One
function per type, like the mat-vecs: numba caches top-level functions.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .matvec_float import (I64, VF32, Block, _contiguous, _nibbles, _q2_k, _q3_k, _q4_1, _q4_k, _q5_1, _q5_k, _q6_k,
                           _q8_0, _row_bf16, _row_f16, _row_f32, _with_fifth_bits)


class Unpack(Block):
    """The same block emitters, writing the block's float32 values instead of dotting them:
    `dot` stores scale * q at the values' place in the output row and `offset` adds a group's
    offset to its 32 values, with ggml's arithmetic (the products of a half scale and small
    integers are exact, so the values equal ggml's dequantization bit for bit)."""

    def __init__(self, builder: ir.IRBuilder, row, out, at, xo):
        super().__init__(builder, row, out, None, at, xo, None, None, None)

    def _out(self, offset):
        p = self.b.gep(self.x, [self.b.add(self.xo, self.const(offset, I64))])
        return self.b.bitcast(p, VF32.as_pointer())

    def dot(self, scale, terms):
        for q, offset in terms:
            self.b.store(self.b.fmul(self.floats(q), self.splat(scale)), self._out(offset), align=4)

    def offset(self, terms):
        for m, group in terms:
            for h in (0, 16):
                p = self._out(32 * group + h)
                self.b.store(self.b.fadd(self.b.load(p, align=4), self.splat(m)), p, align=4)


def row_unpack(block_bytes: int, block_values: int, emit_block):
    """A numba intrinsic `unpack(row, out)`: one weight row's blocks (C-contiguous uint8) as
    float32 values into `out` (C-contiguous, a whole number of blocks long)."""

    @intrinsic
    def unpack(typingctx, row, out):
        if not (_contiguous(row, types.uint8) and _contiguous(out, types.float32)):
            return None

        def codegen(context, builder, signature, args):
            row_arr, out_arr = (context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args))
            n_blocks = builder.udiv(builder.extract_value(out_arr.shape, 0), ir.Constant(I64, block_values))
            with cgutils.for_range(builder, n_blocks) as loop:
                at = builder.mul(loop.index, ir.Constant(I64, block_bytes))
                xo = builder.mul(loop.index, ir.Constant(I64, block_values))
                emit_block(Unpack(builder, row_arr.data, out_arr.data, at, xo))
            return context.get_dummy_value()

        return types.none(row, out), codegen

    return unpack


def _q4_0_values(e: Block):
    """Q4_0 and Q5_0 unpack as ggml computes them, (q - bias) · d, so a zero keeps d's sign."""
    lo, hi = _nibbles(e, 2)
    e.dot(e.half(0), [(e.sub(lo, 8), 0), (e.sub(hi, 8), 16)])


def _q5_0_values(e: Block):
    lo, hi = _with_fifth_bits(e, 2, *_nibbles(e, 6))
    e.dot(e.half(0), [(e.sub(lo, 16), 0), (e.sub(hi, 16), 16)])


unpack_q4_0 = row_unpack(18, 32, _q4_0_values)
unpack_q4_1 = row_unpack(20, 32, _q4_1)
unpack_q5_0 = row_unpack(22, 32, _q5_0_values)
unpack_q5_1 = row_unpack(24, 32, _q5_1)
unpack_q8_0 = row_unpack(34, 32, _q8_0)
unpack_q4_k = row_unpack(144, 256, _q4_k)
unpack_q5_k = row_unpack(176, 256, _q5_k)
unpack_q6_k = row_unpack(210, 256, _q6_k)


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


@njit(cache=True)
def dequant_f32(w, rows, out):
    _dequant_floats(w, rows, out, _row_f32)


@njit(cache=True)
def dequant_f16(w, rows, out):
    _dequant_floats(w, rows, out, _row_f16)


@njit(cache=True)
def dequant_bf16(w, rows, out):
    _dequant_floats(w, rows, out, _row_bf16)


@njit(cache=True)
def dequant_q2_k(w, rows, out):
    _dequant(w, rows, out, _q2_k, 256)


@njit(cache=True)
def dequant_q3_k(w, rows, out):
    _dequant(w, rows, out, _q3_k, 256)


@njit(inline="always")
def _unpack_rows(w, rows, out, unpack):
    for i in range(len(rows)):
        unpack(w[rows[i]], out[i])


@njit(cache=True)
def dequant_q4_0(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q4_0)


@njit(cache=True)
def dequant_q4_1(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q4_1)


@njit(cache=True)
def dequant_q5_0(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q5_0)


@njit(cache=True)
def dequant_q5_1(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q5_1)


@njit(cache=True)
def dequant_q8_0(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q8_0)


@njit(cache=True)
def dequant_q4_k(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q4_k)


@njit(cache=True)
def dequant_q5_k(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q5_k)


@njit(cache=True)
def dequant_q6_k(w, rows, out):
    _unpack_rows(w, rows, out, unpack_q6_k)


# ggml type ids
DEQUANT = {0: dequant_f32, 1: dequant_f16, 30: dequant_bf16, 10: dequant_q2_k, 11: dequant_q3_k,
           2: dequant_q4_0, 3: dequant_q4_1, 6: dequant_q5_0, 7: dequant_q5_1, 8: dequant_q8_0,
           12: dequant_q4_k, 13: dequant_q5_k, 14: dequant_q6_k}
