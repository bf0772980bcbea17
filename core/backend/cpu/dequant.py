"""Dequantization: rows of a weight (or of a quantized KV cache) as float32, on one thread.

`DEQUANT[type](w, rows, out)` writes the rows `rows` of W as float32 into `out`: the tiles of a
BLAS matmul for many activation rows, embedding lookups, and f16 or block cache rows for
attention a block at a time. One thread: the tiles feed BLAS, whose threads would spin against
numba's. Exact (no fused multiply-add), so the values equal `quants.dequantize` bit for bit.

The block types real models use unpack as vector code: matvec_float.py's block emitters with
each dot written out as values (about 0.1 ns a value; numba's scalar decoders took 0.6-0.7);
the float rows and Q2_K/Q3_K take matvec_float.py's scalar converters and decoders. One kernel
per type, like the mat-vecs: numba caches top-level functions.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...quants import IQ4_NL_VALUES
from .blocks import block_size, each_block
from .cache import per_type
from .ir import F32, FEATURES, I16, I32, I64, LANES, V16I8, VF32, VI32, arrays, call, contiguous, pointer, splat
from .matvec_float import DECODERS, EMIT, FLOAT_ROWS, Block, nibbles, with_fifth_bits


HAS_SSSE3 = bool(FEATURES.get("ssse3", False))


class Unpack(Block):
    """The same block emitters, writing the block's float32 values instead of dotting them:
    `dot` stores scale * q at the values' place in the output row and `offset` adds a group's
    offset to its 32 values, with ggml's arithmetic (the products of a half scale and small
    integers are exact, so the values equal ggml's dequantization bit for bit)."""

    def __init__(self, builder: ir.IRBuilder, row, out, at, xo):
        super().__init__(builder, row, out, None, at, xo, None, None, None)

    def _out(self, offset):
        return pointer(self.b, self.x, self.xo, offset, VF32)

    def dot(self, scale, terms):
        for q, offset in terms:
            self.b.store(self.b.fmul(self.floats(q), splat(self.b, scale)), self._out(offset), align=4)

    def offset(self, terms):
        for m, group in terms:
            for h in (0, 16):
                p = self._out(32 * group + h)
                self.b.store(self.b.fadd(self.b.load(p, align=4), splat(self.b, m)), p, align=4)


def row_unpack(name: str, emit_block):
    """A numba intrinsic `unpack(row, out)`: one weight row's blocks of GGUF type `name`
    (C-contiguous uint8) as float32 values into `out` (C-contiguous, a whole number of blocks long)."""
    block_values, block_bytes = block_size(name)

    @intrinsic
    def unpack(typingctx, row, out):
        if not (contiguous(row, types.uint8) and contiguous(out, types.float32)):
            return None

        def codegen(context, builder, signature, args):
            row_arr, out_arr = arrays(context, builder, signature.args, args)
            n_blocks = builder.udiv(builder.extract_value(out_arr.shape, 0), ir.Constant(I64, block_values))
            with each_block(builder, n_blocks, block_bytes, block_values) as (_, at, xo):
                emit_block(Unpack(builder, row_arr.data, out_arr.data, at, xo))
            return context.get_dummy_value()

        return types.none(row, out), codegen

    return unpack


def _q4_0_values(e: Block):
    """Q4_0 and Q5_0 unpack as ggml computes them, (q - bias) · d, so a zero keeps d's sign."""
    lo, hi = nibbles(e, 2)
    e.dot(e.half(0), [(e.sub(lo, 8), 0), (e.sub(hi, 8), 16)])


def _iq4_nl_values(e: Block):
    """IQ4_NL: each nibble picks one of 16 fixed levels, times the block's half scale."""
    lo, hi = nibbles(e, 2)
    e.dot(e.half(0), [(_levels(e, lo), 0), (_levels(e, hi), 16)])


def _levels(e: Block, codes):
    """The IQ4_NL levels of 16 codes (0-15). LLVM has no vector table lookup of its own: with SSSE3
    one byte shuffle of the 16 levels (as ggml does it), else a tree of selects on the codes' bits
    (about 1.5x the time per value)."""
    if HAS_SSSE3:
        table = ir.Constant(V16I8, [int(v) for v in IQ4_NL_VALUES])
        picked = call(e.b, "llvm.x86.ssse3.pshuf.b.128", V16I8, [table, e.b.trunc(codes, V16I8)])
        return e.b.sext(picked, codes.type)
    choices = [e.lanes(int(v)) for v in IQ4_NL_VALUES]
    for bit in range(4):
        set_ = e.b.icmp_unsigned("!=", e.mask(codes, 1 << bit), e.lanes(0))
        choices = [e.b.select(set_, choices[i + 1], choices[i]) for i in range(0, len(choices), 2)]
    return choices[0]


def _q5_0_values(e: Block):
    lo, hi = with_fifth_bits(e, 2, *nibbles(e, 6))
    e.dot(e.half(0), [(e.sub(lo, 16), 0), (e.sub(hi, 16), 16)])


@intrinsic
def unpack_bf16(typingctx, row, out):
    """A BF16 row (its bytes) as float32 into out: each value's 16 bits moved to the top of a
    float's, 16 values per vector (numba's own loop over a short row cost twice as much)."""
    if not (contiguous(row, types.uint8) and contiguous(out, types.float32)):
        return None

    def codegen(context, builder, signature, args):
        row_arr, out_arr = arrays(context, builder, signature.args, args)
        n = builder.extract_value(out_arr.shape, 0)
        n_vectors = builder.udiv(n, ir.Constant(I64, LANES))
        halves = builder.bitcast(row_arr.data, I16.as_pointer())

        def widen(at, ty, lanes):
            bits = builder.load(builder.bitcast(builder.gep(halves, [at]), ty.as_pointer()), align=2)
            shift = ir.Constant(VI32, [16] * LANES) if lanes else ir.Constant(I32, 16)
            value = builder.bitcast(builder.shl(builder.zext(bits, VI32 if lanes else I32), shift), VF32 if lanes else F32)
            builder.store(value, builder.bitcast(builder.gep(out_arr.data, [at]), value.type.as_pointer()), align=4)

        with cgutils.for_range(builder, n_vectors) as loop:
            widen(builder.mul(loop.index, ir.Constant(I64, LANES)), ir.VectorType(I16, LANES), True)
        with cgutils.for_range_slice(builder, builder.mul(n_vectors, ir.Constant(I64, LANES)), n,
                                     ir.Constant(I64, 1)) as (at, _):
            widen(at, I16, False)
        return context.get_dummy_value()

    return types.none(row, out), codegen


def decoded_rows(decode):
    """A row converter from a block decoder (Q2_K, Q3_K): the row's 256-value blocks in turn."""

    @njit(inline="always")
    def convert(row, out):
        for b in range(out.shape[0] // 256):
            decode(row, b, out, b * 256)

    return convert


UNPACK = None  # each kernel's own row converter, in its copy of _dequant (cache.per_type)


def _dequant(w, rows, out):
    """Float rows take one view of each row for the whole row (a view per 32 values costs more than
    the conversion)."""
    for i in range(len(rows)):
        UNPACK(w[rows[i]], out[i])


CONVERTERS = {**FLOAT_ROWS, "BF16": unpack_bf16, **{name: decoded_rows(decode) for name, decode in DECODERS.items()},
              **{name: row_unpack(name, emit) for name, emit in {**EMIT, "Q4_0": _q4_0_values, "Q5_0": _q5_0_values,
                                                                  "IQ4_NL": _iq4_nl_values}.items()}}
DEQUANT = per_type(_dequant, "dequant", {name: {"UNPACK": convert} for name, convert in CONVERTERS.items()})
