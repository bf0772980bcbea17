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
and the vector block emitters. Each kernel is its own small numba function: numba caches
top-level functions on disk, and a single kernel switching on the type would take many minutes
to compile. Type ids are ggml's (`GGMLQuantizationType`).
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

F32, I8, I16, I32, I64 = ir.FloatType(), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
LANES = 16
VF32, VI32, VI8 = ir.VectorType(F32, LANES), ir.VectorType(I32, LANES), ir.VectorType(I8, LANES)
ROWS_PER_TASK = 32  # weight rows a worker takes at a time
# numba compiles for this machine's CPU: with F16C a half converts in one instruction, without it
# LLVM would call a runtime helper numba may not link, so the conversion is done in integers.
HAS_F16C = bool(llvm.get_host_cpu_features().get("f16c", False))


def widen_halves(builder: ir.IRBuilder, bits):
    """IEEE halves (an i16, or a vector of them) as floats. With F16C one conversion; without it,
    in integers: exponent and mantissa moved into a float's bits and rescaled by 2**112 (exact for
    every finite half, subnormals included), inf and nan rebuilt, the sign put back."""
    n = bits.type.count if isinstance(bits.type, ir.VectorType) else None
    vector = (lambda t: t) if n is None else (lambda t: ir.VectorType(t, n))  # noqa: E731
    i32, f32 = vector(I32), vector(F32)
    if HAS_F16C:
        return builder.fpext(builder.bitcast(bits, vector(ir.HalfType())), f32)

    def const(ty, value):
        return ir.Constant(ty, value if n is None else [value] * n)

    h = builder.zext(bits, i32)
    body = builder.shl(builder.and_(h, const(i32, 0x7FFF)), const(i32, 13))
    finite = builder.fmul(builder.bitcast(body, f32), const(f32, float(2 ** 112)))
    special = builder.icmp_unsigned("==", builder.and_(h, const(i32, 0x7C00)), const(i32, 0x7C00))
    x = builder.select(special, builder.bitcast(builder.or_(body, const(i32, 0x7F800000)), f32), finite)
    sign = builder.shl(builder.and_(h, const(i32, 0x8000)), const(i32, 16))
    return builder.bitcast(builder.or_(builder.bitcast(x, i32), sign), f32)


def splat(builder: ir.IRBuilder, value):
    """A scalar in every lane."""
    v = builder.insert_element(ir.Constant(ir.VectorType(value.type, LANES), ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(VI32, [0] * LANES))


def fma(builder: ir.IRBuilder, a, b, c):
    """a * b + c on float vectors, one rounding."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF32, [VF32] * 3), "llvm.fma.v16f32")
    return builder.call(fn, [a, b, c])


class Block:
    """Emits the IR for one block of one weight row: loads relative to the block's first byte
    (`at`), its first activation (`xo`) and its first 32-value sum of the activations (`so`),
    and the two accumulator updates every type is made of: `dot` adds scale * (q · x) to a
    vector, `offset` adds m * sum(x) to a scalar (the sums are taken once per activation row,
    not once per weight row)."""

    def __init__(self, builder: ir.IRBuilder, row, x, sums, at, xo, so, acc, acc_offset):
        self.b, self.row, self.x, self.sums, self.at, self.xo, self.so = builder, row, x, sums, at, xo, so
        self.acc, self.acc_offset = acc, acc_offset

    def const(self, value, ty=I32):
        return ir.Constant(ty, value)

    def _ptr(self, offset, ty):
        return self.b.bitcast(self.b.gep(self.row, [self.b.add(self.at, self.const(offset, I64))]), ty.as_pointer())

    def byte(self, offset):
        """The byte at `offset` as an i32 (unsigned)."""
        return self.b.zext(self.b.load(self._ptr(offset, I8)), I32)

    def signed_byte(self, offset):
        return self.b.sext(self.b.load(self._ptr(offset, I8)), I32)

    def word(self, offset):
        """A little-endian u32 (Q5's high bits)."""
        return self.b.load(self._ptr(offset, I32), align=1)

    def half(self, offset):
        """The IEEE half at `offset` as a float."""
        return widen_halves(self.b, self.b.load(self._ptr(offset, I16), align=1))

    def bytes(self, offset):
        """16 bytes at `offset` as <16 x i32>, unsigned."""
        return self.b.zext(self.b.load(self._ptr(offset, VI8), align=1), VI32)

    def signed_bytes(self, offset):
        return self.b.sext(self.b.load(self._ptr(offset, VI8), align=1), VI32)

    def splat(self, value):
        return splat(self.b, value)

    def lanes(self, values):
        return ir.Constant(VI32, list(values))

    def shr(self, v, bits):
        return self.b.lshr(v, self.lanes([bits] * LANES))

    def mask(self, v, m):
        return self.b.and_(v, self.lanes([m] * LANES))

    def sub(self, v, k):
        return self.b.sub(v, self.lanes([k] * LANES))

    def or_(self, a, c):
        return self.b.or_(a, c)

    def shl(self, v, bits):
        return self.b.shl(v, self.lanes([bits] * LANES))

    def floats(self, v):
        return self.b.sitofp(v, VF32)

    def xs(self, offset):
        """16 activations from x[xo + offset]."""
        p = self.b.gep(self.x, [self.b.add(self.xo, self.const(offset, I64))])
        return self.b.load(self.b.bitcast(p, VF32.as_pointer()), align=4)

    def fma(self, a, c, d):
        return fma(self.b, a, c, d)

    def dot(self, scale, terms):
        """acc += scale * sum(q_i * x[offset_i:offset_i + 16]) for terms (q_i as <16 x i32>, offset_i)."""
        total = None
        for q, offset in terms:
            qf, xv = self.floats(q), self.xs(offset)
            total = self.b.fmul(qf, xv) if total is None else self.fma(qf, xv, total)
        self.b.store(self.fma(self.splat(scale), total, self.b.load(self.acc)), self.acc)

    def offset(self, terms):
        """acc_offset += sum(m_i * sum(x of the block's 32-value group g_i)) for terms (m_i, g_i),
        added as a tree (K blocks have eight)."""
        products = []
        for m, group in terms:
            p = self.b.gep(self.sums, [self.b.add(self.so, self.const(group, I64))])
            products.append(self.b.fmul(m, self.b.load(p)))
        while len(products) > 1:
            products = [self.b.fadd(*products[i:i + 2]) if i + 1 < len(products) else products[i]
                        for i in range(0, len(products), 2)]
        self.b.store(self.b.fadd(self.b.load(self.acc_offset), products[0]), self.acc_offset)


def reduce_add(builder: ir.IRBuilder, v):
    """The sum of a float vector's lanes, as a tree of halvings."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(I32, 0))


def _contiguous(a, dtype) -> bool:
    return isinstance(a, types.Array) and a.dtype == dtype and a.layout == "C"


def row_dot(block_bytes: int, block_values: int, emit_block):
    """A numba intrinsic `dot(row, x, sums) -> float32`: one weight row's blocks (C-contiguous
    uint8) against one activation row (C-contiguous float32) whose 32-value groups sum to `sums`
    (read only by types with an offset); `emit_block(Block)` emits one block."""

    @intrinsic
    def dot(typingctx, row, x, sums):
        if not (_contiguous(row, types.uint8) and _contiguous(x, types.float32) and _contiguous(sums, types.float32)):
            return None

        def codegen(context, builder, signature, args):
            row_arr, x_arr, sums_arr = (context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args))
            n_blocks = builder.udiv(builder.extract_value(x_arr.shape, 0), ir.Constant(I64, block_values))
            acc = cgutils.alloca_once_value(builder, ir.Constant(VF32, None))
            acc_offset = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
            with cgutils.for_range(builder, n_blocks) as loop:
                at = builder.mul(loop.index, ir.Constant(I64, block_bytes))
                xo = builder.mul(loop.index, ir.Constant(I64, block_values))
                so = builder.mul(loop.index, ir.Constant(I64, block_values // 32))
                emit_block(Block(builder, row_arr.data, x_arr.data, sums_arr.data, at, xo, so, acc, acc_offset))
            return builder.fadd(reduce_add(builder, builder.load(acc)), builder.load(acc_offset))

        return types.float32(row, x, sums), codegen

    return dot


# ---- one block of each type, as ggml packs it -----------------------------------------------------

def _nibbles(e: Block, offset):
    q = e.bytes(offset)
    return e.mask(q, 15), e.shr(q, 4)


def _q4_0(e: Block):
    """d·(q - 8)·x taken as d·(q·x) - 8d·sum(x): the subtraction leaves the vector loop."""
    lo, hi = _nibbles(e, 2)
    d = e.half(0)
    e.dot(d, [(lo, 0), (hi, 16)])
    e.offset([(e.b.fmul(d, ir.Constant(F32, -8.0)), 0)])


def _q4_1(e: Block):
    lo, hi = _nibbles(e, 4)
    e.dot(e.half(0), [(lo, 0), (hi, 16)])
    e.offset([(e.half(2), 0)])


def _with_fifth_bits(e: Block, qh_at, lo, hi):
    """Nibbles of values 0-15 and 16-31 with their fifth bits (the u32 at qh_at) set: each half
    of the word becomes a 16-lane mask, selecting nibble | 16 (AVX-512 does it as a masked or)."""
    qh = e.word(qh_at)
    out = []
    for nibbles, shift in ((lo, 0), (hi, 16)):
        bits = e.b.bitcast(e.b.trunc(e.b.lshr(qh, e.const(shift)), I16), ir.VectorType(ir.IntType(1), LANES))
        out.append(e.b.select(bits, e.or_(nibbles, e.lanes([16] * LANES)), nibbles))
    return out


def _q5_0(e: Block):
    """d·(q - 16)·x taken as d·(q·x) - 16d·sum(x)."""
    lo, hi = _with_fifth_bits(e, 2, *_nibbles(e, 6))
    d = e.half(0)
    e.dot(d, [(lo, 0), (hi, 16)])
    e.offset([(e.b.fmul(d, ir.Constant(F32, -16.0)), 0)])


def _q5_1(e: Block):
    lo, hi = _with_fifth_bits(e, 4, *_nibbles(e, 8))
    e.dot(e.half(0), [(lo, 0), (hi, 16)])
    e.offset([(e.half(2), 0)])


def _q8_0(e: Block):
    e.dot(e.half(0), [(e.signed_bytes(2), 0), (e.signed_bytes(18), 16)])


def _k_scale_min(e: Block, j: int):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes at offset 4, as floats."""
    b = e.b
    if j < 4:
        sc, mn = b.and_(e.byte(4 + j), e.const(63)), b.and_(e.byte(8 + j), e.const(63))
    else:
        high = e.byte(8 + j)
        sc = b.or_(b.and_(high, e.const(15)), b.shl(b.lshr(e.byte(j), e.const(6)), e.const(4)))
        mn = b.or_(b.lshr(high, e.const(4)), b.shl(b.lshr(e.byte(4 + j), e.const(6)), e.const(4)))
    return b.sitofp(sc, F32), b.sitofp(mn, F32)


def _k_sub_blocks(e: Block, qs_at: int, qh_at: int | None):
    """Q4_K and Q5_K: 8 sub-blocks of 32 values, value = d * scale * q - dmin * min."""
    b = e.b
    d, dmin = e.half(0), e.half(2)
    mins = []
    for j in range(8):
        sc, mn = _k_scale_min(e, j)
        qs, shift = qs_at + (j // 2) * 32, 4 * (j % 2)
        terms = []
        for h in (0, 16):
            q = e.mask(e.shr(e.bytes(qs + h), shift), 15)
            if qh_at is not None:
                q = e.or_(q, e.shl(e.mask(e.shr(e.bytes(qh_at + h), j), 1), 4))
            terms.append((q, 32 * j + h))
        e.dot(b.fmul(d, sc), terms)
        mins.append((b.fneg(b.fmul(dmin, mn)), j))
    e.offset(mins)


def _q4_k(e: Block):
    _k_sub_blocks(e, 16, None)


def _q5_k(e: Block):
    _k_sub_blocks(e, 48, 16)


def _q6_k(e: Block):
    """Two halves of 128 values; each 16 values have their own int8 scale."""
    d = e.half(208)
    for n in range(2):
        for k in range(4):
            for h in range(2):
                low = e.mask(e.shr(e.bytes(64 * n + 32 * (k % 2) + 16 * h), 4 * (k // 2)), 15)
                high = e.shl(e.mask(e.shr(e.bytes(128 + 32 * n + 16 * h), 2 * k), 3), 4)
                scale = e.b.fmul(d, e.b.sitofp(e.signed_byte(192 + 8 * n + 2 * k + h), F32))
                e.dot(scale, [(e.sub(e.or_(low, high), 32), 128 * n + 32 * k + 16 * h)])


dot_q4_0 = row_dot(18, 32, _q4_0)
dot_q4_1 = row_dot(20, 32, _q4_1)
dot_q5_0 = row_dot(22, 32, _q5_0)
dot_q5_1 = row_dot(24, 32, _q5_1)
dot_q8_0 = row_dot(34, 32, _q8_0)
dot_q4_k = row_dot(144, 256, _q4_k)
dot_q5_k = row_dot(176, 256, _q5_k)
dot_q6_k = row_dot(210, 256, _q6_k)


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


def as_parts(w):
    """A weight as a tuple of parts: one (n_out, row_bytes) array, or a tuple of them."""


@overload(as_parts)
def _as_parts(w):
    if isinstance(w, types.Array):
        return lambda w: (w,)
    if isinstance(w, types.UniTuple):
        return lambda w: w
    return None


@njit(inline="always")
def _tasks(part):
    return (part.shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK


@njit(inline="always")
def _matvec(w, x, out, dot):
    """Parts stacked along out's columns share one parallel loop (one launch for q|k|v). A task
    finds its part by walking the parts: no task tables to allocate (a decoded token makes 120
    such calls on SmolLM2, and two small allocations were a third of a small call's overhead)."""
    parts = as_parts(w)
    n_tasks = 0
    for p in range(len(parts)):
        n_tasks += _tasks(parts[p])
    sums = group_sums(x)
    for task in prange(n_tasks):
        p, col = 0, 0
        t = task + 0  # numba forbids writing the loop index itself
        while t >= _tasks(parts[p]):
            t -= _tasks(parts[p])
            col += parts[p].shape[0]
            p += 1
        part = parts[p]
        r0 = t * ROWS_PER_TASK
        for r in range(r0, min(r0 + ROWS_PER_TASK, part.shape[0])):
            for i in range(x.shape[0]):
                out[i, col + r] = dot(part[r], x[i], sums[i])


@njit(parallel=True, cache=True)
def matvec_q4_0(w, x, out):
    _matvec(w, x, out, dot_q4_0)


@njit(parallel=True, cache=True)
def matvec_q4_1(w, x, out):
    _matvec(w, x, out, dot_q4_1)


@njit(parallel=True, cache=True)
def matvec_q5_0(w, x, out):
    _matvec(w, x, out, dot_q5_0)


@njit(parallel=True, cache=True)
def matvec_q5_1(w, x, out):
    _matvec(w, x, out, dot_q5_1)


@njit(parallel=True, cache=True)
def matvec_q8_0(w, x, out):
    _matvec(w, x, out, dot_q8_0)


@njit(parallel=True, cache=True)
def matvec_q4_k(w, x, out):
    _matvec(w, x, out, dot_q4_k)


@njit(parallel=True, cache=True)
def matvec_q5_k(w, x, out):
    _matvec(w, x, out, dot_q5_k)


@njit(parallel=True, cache=True)
def matvec_q6_k(w, x, out):
    _matvec(w, x, out, dot_q6_k)


# ---- float rows, and Q2_K/Q3_K decoded into a buffer (numba's scalar code) --------------------

RUN = 32  # values dotted at a time for float types

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


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_f16(w, x, out):
    _matvec_floats(w, x, out, _row_f16)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_bf16(w, x, out):
    _matvec_floats(w, x, out, _row_bf16)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_q2_k(w, x, out):
    _matvec_decoded(w, x, out, _q2_k, 256)


@njit(parallel=True, cache=True, fastmath=_FAST)
def matvec_q3_k(w, x, out):
    _matvec_decoded(w, x, out, _q3_k, 256)


# ggml type ids
MATVEC = {0: matvec_f32, 1: matvec_f16, 30: matvec_bf16, 10: matvec_q2_k, 11: matvec_q3_k,
          2: matvec_q4_0, 3: matvec_q4_1, 6: matvec_q5_0, 7: matvec_q5_1, 8: matvec_q8_0,
          12: matvec_q4_k, 13: matvec_q5_k, 14: matvec_q6_k}
# types whose MATVEC also takes a tuple of same-type parts (one launch for q|k|v, gate|up)
MULTI_PART = frozenset((2, 3, 6, 7, 8, 12, 13, 14))
