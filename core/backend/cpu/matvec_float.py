"""Float mat-vec kernels: a weight kept in its GGUF type times a few float32 activation rows.

`MATVEC[type](w, x, out)`: `out[i, r] = x[i] · W[r]` for a few activation rows, parallel over W's
rows; a weight row is read from memory once and never written out as float32. `w` is its raw
bytes as a `(n_out, row_bytes)` uint8 array; for the types in MULTI_PART it may also be a tuple
of same-type parts stacked along the output (q|k|v, gate|up), multiplied in one launch.

The block types real models use (Q4_0 … Q8_0, Q4_K … Q6_K) are numba intrinsics that emit LLVM
vector code themselves. numba would compile their block loops into scalar code: LLVM cannot tell
the weight bytes, the activations and the accumulators apart, so it either keeps every partial
sum in memory or vectorizes across blocks and gathers bytes one by one (about 6 GB/s on Q4_1
here). The row dots here emit one block per loop iteration, 16-float vectors (LLVM lowers them to
one AVX-512 register or two AVX2 ones), the accumulators in registers (a vector for the scaled
dots, a scalar for the block offsets), one horizontal sum per row. The bytes are unpacked as ggml
packs them; activations stay float32, so a dot differs from the exact sum only by float rounding.
Measured with scripts/kernel_speed.py (docs/performance.md).

The float rows (F32, F16, BF16) are converted a row at a time, and Q2_K/Q3_K decoded a block at a
time into a buffer, in numba's own scalar code; dequant.py reuses those converters and decoders,
and the vector block emitters. Each kernel is its own small numba function (a copy of one of the
templates below, cache.per_type): numba caches top-level functions on disk, and a single kernel
switching on the type would take many minutes to compile. Type ids are ggml's
(`GGMLQuantizationType`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .blocks import BlockReader, block_size, each_block, k_codes, k_scale_min, q6_k_codes
from .cache import per_type
from .ir import F32, I16, I32, I64, LANES, VF32, VI8, VI32, arrays, contiguous, fma, pointer, reduce_add, splat
from .matvec import ROWS_PER_TASK, as_parts, count_tasks, matvec_rows, task_rows
from .scalar import FAST

RUN = 32  # values dotted at a time for float types


class Block(BlockReader):
    """Emits the IR for one block of one weight row against one activation row: loads relative to
    the block's first byte (`at`), its first activation (`xo`) and its first 32-value sum of the
    activations (`so`), and the two accumulator updates every type is made of: `dot` adds
    scale * (q · x) to a vector, `offset` adds m * sum(x) to a scalar (the sums are taken once per
    activation row, not once per weight row). Codes are 16 lanes of i32."""

    def __init__(self, builder: ir.IRBuilder, row, x, sums, at, xo, so, acc, acc_offset):
        super().__init__(builder, row, at)
        self.x, self.sums, self.xo, self.so, self.acc, self.acc_offset = x, sums, xo, so, acc, acc_offset

    def bytes(self, offset):
        """16 bytes at `offset` as <16 x i32>, unsigned."""
        return self.b.zext(self.load(offset, VI8), VI32)

    def signed_bytes(self, offset):
        return self.b.sext(self.load(offset, VI8), VI32)

    def floats(self, v):
        return self.b.sitofp(v, VF32)

    def xs(self, offset):
        """16 activations from x[xo + offset]."""
        return self.b.load(pointer(self.b, self.x, self.xo, offset, VF32), align=4)

    def dot(self, scale, terms):
        """acc += scale * sum(q_i * x[offset_i:offset_i + 16]) for terms (q_i as <16 x i32>, offset_i)."""
        total = None
        for q, offset in terms:
            qf, xv = self.floats(q), self.xs(offset)
            total = self.b.fmul(qf, xv) if total is None else fma(self.b, qf, xv, total)
        self.b.store(fma(self.b, splat(self.b, scale), total, self.b.load(self.acc)), self.acc)

    def offset(self, terms):
        """acc_offset += sum(m_i * sum(x of the block's 32-value group g_i)) for terms (m_i, g_i),
        added as a tree (K blocks have eight)."""
        products = []
        for m, group in terms:
            p = self.b.gep(self.sums, [self.b.add(self.so, ir.Constant(I64, group))])
            products.append(self.b.fmul(m, self.b.load(p)))
        while len(products) > 1:
            products = [self.b.fadd(*products[i:i + 2]) if i + 1 < len(products) else products[i]
                        for i in range(0, len(products), 2)]
        self.b.store(self.b.fadd(self.b.load(self.acc_offset), products[0]), self.acc_offset)


def row_dot(name: str, emit_block):
    """A numba intrinsic `dot(row, x, sums) -> float32`: one weight row's blocks of GGUF type
    `name` (C-contiguous uint8) against one activation row (C-contiguous float32) whose 32-value
    groups sum to `sums` (read only by types with an offset); `emit_block(Block)` emits one block."""
    block_values, block_bytes = block_size(name)

    @intrinsic
    def dot(typingctx, row, x, sums):
        if not (contiguous(row, types.uint8) and contiguous(x, types.float32) and contiguous(sums, types.float32)):
            return None

        def codegen(context, builder, signature, args):
            row_arr, x_arr, sums_arr = arrays(context, builder, signature.args, args)
            n_blocks = builder.udiv(builder.extract_value(x_arr.shape, 0), ir.Constant(I64, block_values))
            acc = cgutils.alloca_once_value(builder, ir.Constant(VF32, None))
            acc_offset = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
            with each_block(builder, n_blocks, block_bytes, block_values) as (index, at, xo):
                so = builder.mul(index, ir.Constant(I64, block_values // 32))
                emit_block(Block(builder, row_arr.data, x_arr.data, sums_arr.data, at, xo, so, acc, acc_offset))
            return builder.fadd(reduce_add(builder, builder.load(acc)), builder.load(acc_offset))

        return types.float32(row, x, sums), codegen

    return dot


# ---- one block of each type, as ggml packs it -----------------------------------------------------

def nibbles(e: Block, offset):
    q = e.bytes(offset)
    return e.mask(q, 15), e.shr(q, 4)


def _q4_0(e: Block):
    """d·(q - 8)·x taken as d·(q·x) - 8d·sum(x): the subtraction leaves the vector loop."""
    lo, hi = nibbles(e, 2)
    d = e.half(0)
    e.dot(d, [(lo, 0), (hi, 16)])
    e.offset([(e.b.fmul(d, ir.Constant(F32, -8.0)), 0)])


def _q4_1(e: Block):
    lo, hi = nibbles(e, 4)
    e.dot(e.half(0), [(lo, 0), (hi, 16)])
    e.offset([(e.half(2), 0)])


def with_fifth_bits(e: Block, qh_at, lo, hi):
    """Nibbles of values 0-15 and 16-31 with their fifth bits (the u32 at qh_at) set: each half
    of the word becomes a 16-lane mask, selecting nibble | 16 (AVX-512 does it as a masked or)."""
    qh = e.word(qh_at)
    out = []
    for nibbles_, shift in ((lo, 0), (hi, 16)):
        half_word = e.b.trunc(e.b.lshr(qh, ir.Constant(I32, shift)), I16)
        bits = e.b.bitcast(half_word, ir.VectorType(ir.IntType(1), LANES))
        out.append(e.b.select(bits, e.or_(nibbles_, e.lanes(16)), nibbles_))
    return out


def _q5_0(e: Block):
    """d·(q - 16)·x taken as d·(q·x) - 16d·sum(x)."""
    lo, hi = with_fifth_bits(e, 2, *nibbles(e, 6))
    d = e.half(0)
    e.dot(d, [(lo, 0), (hi, 16)])
    e.offset([(e.b.fmul(d, ir.Constant(F32, -16.0)), 0)])


def _q5_1(e: Block):
    lo, hi = with_fifth_bits(e, 4, *nibbles(e, 8))
    e.dot(e.half(0), [(lo, 0), (hi, 16)])
    e.offset([(e.half(2), 0)])


def _q8_0(e: Block):
    e.dot(e.half(0), [(e.signed_bytes(2), 0), (e.signed_bytes(18), 16)])


def _k_sub_blocks(e: Block, q5: bool):
    """Q4_K and Q5_K: 8 sub-blocks of 32 values, value = d * scale * q - dmin * min."""
    b = e.b
    d, dmin = e.half(0), e.half(2)
    mins = []
    for j in range(8):
        sc, mn = (b.sitofp(v, F32) for v in k_scale_min(e, j))
        e.dot(b.fmul(d, sc), [(k_codes(e, j, q5, h), 32 * j + h) for h in (0, 16)])
        mins.append((b.fneg(b.fmul(dmin, mn)), j))
    e.offset(mins)


def _q4_k(e: Block):
    _k_sub_blocks(e, q5=False)


def _q5_k(e: Block):
    _k_sub_blocks(e, q5=True)


def _q6_k(e: Block):
    """Two halves of 128 values; each 16 values have their own int8 scale."""
    d = e.half(208)
    for n in range(2):
        for k in range(4):
            for h in range(2):
                codes = q6_k_codes(e, n, k, 16 * h)
                scale = e.b.fmul(d, e.b.sitofp(e.signed_byte(192 + 8 * n + 2 * k + h), F32))
                e.dot(scale, [(e.sub(codes, 32), 128 * n + 32 * k + 16 * h)])


EMIT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
        "Q6_K": _q6_k}


@njit(inline="always")
def group_sums(x):
    """Each row's sums of 32 consecutive activations (n, n_in // 32)."""
    n, n_in = x.shape
    sums = np.empty((n, n_in // 32), dtype=np.float32)
    for i in range(n):
        for g in range(n_in // 32):
            total = np.float32(0)
            for j in range(32):
                total += x[i, g * 32 + j]
            sums[i, g] = total
    return sums


# ---- float rows, and Q2_K/Q3_K decoded into a buffer (numba's scalar code) --------------------

# every half's value, indexed by its bits (numba compiles this table into the kernels)
_HALF = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always")
def _b(row, i):
    """A byte as int32 (numba would type uint8-with-int64 arithmetic as float)."""
    return np.int32(row[i])


@njit(inline="always")
def half(row, at):
    """The IEEE half stored little-endian at row[at], row[at + 1] (one lookup in a 256 KB table)."""
    return _HALF[_b(row, at) | (_b(row, at + 1) << 8)]


# ---- block decoders: (row bytes, block index, out, first value) --------------------------------

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


@njit(inline="always")
def _dot_decoded(row, x, lanes, vals, decoder, run):
    """Decode each block into vals, then accumulate per lane."""
    lanes[:] = 0.0
    for b in range(x.shape[0] // run):
        decoder(row, b, vals, 0)
        for j in range(run):
            lanes[j] += vals[j] * x[b * run + j]
    return lanes.sum()


# ---- float rows converted whole -----------------------------------------------------------------

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


# ---- the kernels: each type's copy of a template (cache.per_type), the placeholders set per copy ----

DOT = CONVERT = DECODE = None


def _matvec(w, x, out):
    """The block types: one row dot of vector code per weight row and activation row."""
    matvec_rows(w, (x, group_sums(x)), out, DOT)


def _matvec_floats(w, x, out):
    """Float rows: each row converted whole into a buffer (one view per row, any length), then
    dotted with every activation row in RUN lanes and a tail."""
    parts, n_in = as_parts(w), x.shape[1]
    n_full = n_in - n_in % RUN
    for task in prange(count_tasks(parts, ROWS_PER_TASK)):
        part, col, r0, r1 = task_rows(parts, task, ROWS_PER_TASK)
        values = np.empty(n_in, dtype=np.float32)
        lanes = np.empty(RUN, dtype=np.float32)
        for r in range(r0, r1):
            CONVERT(part[r], values)
            for i in range(x.shape[0]):
                lanes[:] = 0.0
                for b in range(0, n_full, RUN):
                    for j in range(RUN):
                        lanes[j] += values[b + j] * x[i, b + j]
                total = lanes.sum()
                for j in range(n_full, n_in):
                    total += values[j] * x[i, j]
                out[i, col + r] = total


def _matvec_decoded(w, x, out):
    """Q2_K/Q3_K: each block decoded into a buffer, then dotted in 256 lanes."""
    parts = as_parts(w)
    for task in prange(count_tasks(parts, ROWS_PER_TASK)):
        part, col, r0, r1 = task_rows(parts, task, ROWS_PER_TASK)
        lanes = np.empty(256, dtype=np.float32)
        vals = np.empty(256, dtype=np.float32)
        for r in range(r0, r1):
            for i in range(x.shape[0]):
                out[i, col + r] = _dot_decoded(part[r], x[i], lanes, vals, DECODE, 256)


FLOAT_ROWS = {"F32": _row_f32, "F16": _row_f16, "BF16": _row_bf16}
DECODERS = {"Q2_K": _q2_k, "Q3_K": _q3_k}
# the block types' MATVEC also takes a tuple of same-type parts (one launch for q|k|v, gate|up)
MULTI_PART = per_type(_matvec, "matvec", {n: {"DOT": row_dot(n, emit)} for n, emit in EMIT.items()}, parallel=True)
MATVEC = {**per_type(_matvec_floats, "matvec", {n: {"CONVERT": c} for n, c in FLOAT_ROWS.items()},
                     parallel=True, fastmath=FAST),
          **per_type(_matvec_decoded, "matvec", {n: {"DECODE": d} for n, d in DECODERS.items()},
                     parallel=True, fastmath=FAST),
          **MULTI_PART}
