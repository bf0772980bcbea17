"""Integer mat-vec kernels for `--numerics ggml`: the arithmetic of ggml-cpu's x86 dot products.

With ggml numerics the activations are rounded to q8 blocks before a matmul, as ggml-cpu does
(core/quants.py). A rounded block is small integers times a scale, so a block's dot is an integer
dot (exact) times the two scales, taken as ggml's AVX2 code takes it: the byte products summed in
pairs twice (pmaddubsw, pmaddwd) into 8 lanes, each lane converted to float and accumulated with
the block's d·d8 by one fma, the lanes summed at the end in ggml's order (hsum_float_8), and
Q4_1/Q5_1's block offsets m·s8 summed apart; for these 32-value types that is the order of
ggml_vec_dot_<type>_q8_<0|1>. K-quant super-blocks sum their sub-blocks' integer dots times the
6- or 8-bit sub-block scales in integers, then take one fma with d·d8 (llama.cpp repacks Q4_K on
AVX2 and sums in another order there: the values agree to float rounding). A block costs about a
quarter of the vector operations of the float kernels in matvec_float.py.

`MATVEC[type](w, x, out)` has matvec_float.MATVEC's contract: it rounds the activations x to q8
blocks (q8.py: quantize_row_q8_1, or quantize_row_q8_K for the K-quants: 256 values, an f32 scale and
sums of 16) and takes the integer dots. Needs AVX2 and F16C (`AVAILABLE`); elsewhere ggml
numerics take the float kernels over rounded activations, which give the same values up to float
summation order. The IR helpers come from matvec_float.py; numba's disk cache only notices edits to
this file, so clear __pycache__ after editing those.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .matvec_float import F32, I8, I16, I32, I64, ROWS_PER_TASK, _contiguous, _tasks, as_parts, widen_halves
from .q8 import quantize_q8, quantize_q8_k

_FEATURES = llvm.get_host_cpu_features()
AVAILABLE = bool(_FEATURES.get("avx2", False) and _FEATURES.get("f16c", False))

V8F32, V8I32 = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
# How far ahead of the block being read a row dot asks for the weight bytes. Decode streams the
# weights from DRAM, and without asking a row dot waits on memory: the 1B model's gate|up read at
# 9 GB/s on 2 cores (a plain read: 22 GB/s); 512 bytes ahead 16, 1024 17, 4096 20, 8192 19.
PREFETCH_BYTES = 4096
V16I8, V32I8, V16I16 = ir.VectorType(I8, 16), ir.VectorType(I8, 32), ir.VectorType(I16, 16)


def _call(builder, name: str, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _bytes(value: int, ty=V32I8):
    return ir.Constant(ty, [value] * ty.count)


class IBlock:
    """Emits one block of one weight row against its q8 block: `at` is the block's first weight
    byte, `xo` its first activation code, `b` its index (for d8 and s8)."""

    def __init__(self, builder: ir.IRBuilder, row, q, d8, s8, at, xo, b, acc, summs):
        self.b, self.row, self.q, self.d8, self.s8 = builder, row, q, d8, s8
        self.at, self.xo, self.bi, self.acc, self.summs = at, xo, b, acc, summs

    def _ptr(self, base, offset, ty):
        return self.b.bitcast(self.b.gep(base, [self.b.add(offset[0], ir.Constant(I64, offset[1]))]), ty.as_pointer())

    def half(self, offset):
        return widen_halves(self.b, self.b.load(self._ptr(self.row, (self.at, offset), I16), align=1))

    def weight_bytes(self, offset, ty=V16I8):
        return self.b.load(self._ptr(self.row, (self.at, offset), ty), align=1)

    def nibbles(self, offset):
        """The 32 4-bit codes of 16 packed bytes in ggml's order: low nibbles, then high."""
        raw = self.weight_bytes(offset)
        lo = self.b.and_(raw, _bytes(15, V16I8))
        hi = self.b.lshr(raw, _bytes(4, V16I8))
        return self.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))

    def fifth_bits(self, offset, codes):
        """codes | 16 where bit j of the little-endian u32 at `offset` is set (Q5_0/Q5_1)."""
        qh = self.b.load(self._ptr(self.row, (self.at, offset), I32), align=1)
        mask = self.b.bitcast(qh, ir.VectorType(ir.IntType(1), 32))
        return self.b.select(mask, self.b.or_(codes, _bytes(16)), codes)

    def codes(self):
        """The block's 32 activation codes (int8)."""
        return self.b.load(self._ptr(self.q, (self.xo, 0), V32I8), align=1)

    def lane_sums(self, unsigned, signed, weights=None):
        """8 int32 lanes, lane i the sum of products 4i..4i+3 of u8 × s8 bytes, each pair of
        products times its i16 weight (16 of them; 1 by default): pmaddwd scales as it sums."""
        pairs = _call(self.b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [unsigned, signed])
        weights = ir.Constant(V16I16, [1] * 16) if weights is None else weights
        return _call(self.b, "llvm.x86.avx2.pmadd.wd", V8I32, [pairs, weights])

    def signed_lane_sums(self, weights):
        """lane_sums of int8 weights: |w| × (x with w's sign), as ggml's mul_sum_i8_pairs."""
        x = self.codes()
        magnitude = _call(self.b, "llvm.abs.v32i8", V32I8, [weights, ir.Constant(ir.IntType(1), 0)])
        return self.lane_sums(magnitude, _call(self.b, "llvm.x86.avx2.psign.b", V32I8, [x, weights]))

    def scale(self):
        """The q8 block's f16 scale d8 (as a float)."""
        return self.b.load(self.b.gep(self.d8, [self.bi]))

    def accumulate(self, d, lanes):
        """acc = fma(d, float(lanes), acc), d splatted over the 8 lanes."""
        v = self.b.insert_element(ir.Constant(V8F32, ir.Undefined), d, ir.Constant(I32, 0))
        v = self.b.shuffle_vector(v, ir.Constant(V8F32, ir.Undefined), ir.Constant(V8I32, [0] * 8))
        total = _call(self.b, "llvm.fma.v8f32", V8F32, [v, self.b.sitofp(lanes, V8F32), self.b.load(self.acc)])
        self.b.store(total, self.acc)

    def add_offset(self, m):
        """summs += m · s8 (Q4_1/Q5_1's block minimum times the q8_1 block's f16 sum)."""
        s = self.b.load(self.b.gep(self.s8, [self.bi]))
        self.b.store(_call(self.b, "llvm.fma.f32", F32, [m, s, self.b.load(self.summs)]), self.summs)


def _hsum8(builder: ir.IRBuilder, v):
    """ggml's hsum_float_8: high half + low half, then lanes 0+2 and 1+3, then those two."""
    def pick(vec, idx):
        return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, len(idx)), idx))
    quad = builder.fadd(pick(v, [4, 5, 6, 7]), pick(v, [0, 1, 2, 3]))
    pair = builder.fadd(quad, pick(quad, [2, 3, 2, 3]))
    lane = builder.fadd(pair, pick(pair, [1, 1, 3, 3]))
    return builder.extract_element(lane, ir.Constant(I32, 0))


def prefetch(builder, ptr):
    """Asks for the cache line at ptr (no fault if it is not mapped)."""
    i8p = ir.IntType(8).as_pointer()
    _call(builder, "llvm.prefetch.p0", ir.VoidType(),
          [builder.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def row_dot_q8(block_bytes: int, emit_block, block_values: int = 32, block=IBlock, extra=types.float32):
    """A numba intrinsic `dot(row, q, d8, sums) -> float32`: one weight row against one row of q8
    codes with their block scales and sums: q8_0/q8_1 blocks of 32 with f32 block sums, or (K-quants)
    q8_K blocks of 256 with int32 sums of 16. `emit_block(block(...))` emits one weight block."""

    @intrinsic
    def dot(typingctx, row, q, d8, sums):
        if not (_contiguous(row, types.uint8) and _contiguous(q, types.int8)
                and _contiguous(d8, types.float32) and _contiguous(sums, extra)):
            return None

        def codegen(context, builder, signature, args):
            row_a, q_a, d_a, s_a = (context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args))
            n_blocks = builder.extract_value(d_a.shape, 0)
            acc = cgutils.alloca_once_value(builder, ir.Constant(V8F32, None))
            summs = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
            with cgutils.for_range(builder, n_blocks) as loop:
                at = builder.mul(loop.index, ir.Constant(I64, block_bytes))
                xo = builder.mul(loop.index, ir.Constant(I64, block_values))
                prefetch(builder, builder.gep(row_a.data, [builder.add(at, ir.Constant(I64, PREFETCH_BYTES))]))
                emit_block(block(builder, row_a.data, q_a.data, d_a.data, s_a.data, at, xo, loop.index, acc, summs))
            return builder.fadd(_hsum8(builder, builder.load(acc)), builder.load(summs))

        return types.float32(row, q, d8, sums), codegen

    return dot


# ---- one block of each type: ggml's vec_dot_<type>_q8_<0|1> -------------------------------------

def _scaled(e: IBlock, d):
    return e.b.fmul(d, e.scale())


def _q4_0(e: IBlock):
    codes = e.b.sub(e.nibbles(2), _bytes(8))
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(codes))


def _q4_1(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.lane_sums(e.nibbles(4), e.codes()))
    e.add_offset(e.half(2))


def _q5_0(e: IBlock):
    codes = e.b.sub(e.fifth_bits(2, e.nibbles(6)), _bytes(16))
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(codes))


def _q5_1(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.lane_sums(e.fifth_bits(4, e.nibbles(8)), e.codes()))
    e.add_offset(e.half(2))


def _q8_0(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(e.weight_bytes(2, V32I8)))


dot_q4_0 = row_dot_q8(18, _q4_0)
dot_q4_1 = row_dot_q8(20, _q4_1)
dot_q5_0 = row_dot_q8(22, _q5_0)
dot_q5_1 = row_dot_q8(24, _q5_1)
dot_q8_0 = row_dot_q8(34, _q8_0)


# ---- K-quants against q8_K blocks -----------------------------------------------------------------

class KBlock(IBlock):
    """A K-quant super-block (256 values) against a q8_K block: integer lanes scaled by the
    sub-block scales in `isum`, the mins (or Q6_K's bias) in the integer scalar `imin`; `finish`
    turns them into floats with the block scales."""

    def __init__(self, builder, row, q, d8, bsums, at, xo, b, acc, summs):
        super().__init__(builder, row, q, d8, None, at, xo, b, acc, summs)
        self.bsums = bsums
        self.isum = cgutils.alloca_once_value(builder, ir.Constant(V8I32, None))
        self.imin = cgutils.alloca_once_value(builder, ir.Constant(I32, 0))

    def byte(self, offset):
        return self.b.zext(self.b.load(self._ptr(self.row, (self.at, offset), I8)), I32)

    def codes_at(self, value):
        """The 32 activation codes from value `value` of the block."""
        return self.b.load(self._ptr(self.q, (self.xo, value), V32I8), align=1)

    def bsum(self, group):
        """The sum of the block's activation codes group*16 .. group*16 + 15."""
        return self.b.load(self.b.gep(self.bsums, [self.b.add(self.b.mul(self.bi, ir.Constant(I64, 16)),
                                                              ir.Constant(I64, group))]))

    def add_scaled(self, codes, x, scales):
        """isum += the lanes of codes × x, lanes 0-3 times scales[0] and 4-7 times scales[-1]
        (i32 sub-block scales; the products of the scale and the 16-bit pair sums fit in int32)."""
        halves = [self.b.trunc(s, ir.IntType(16)) for s in scales]
        v = ir.Constant(V16I16, ir.Undefined)
        for k in range(16):
            v = self.b.insert_element(v, halves[0] if k < 8 else halves[-1], ir.Constant(I32, k))
        self.b.store(self.b.add(self.b.load(self.isum), self.lane_sums(codes, x, v)), self.isum)

    def add_min(self, value):
        self.b.store(self.b.add(self.b.load(self.imin), value), self.imin)

    def finish(self, d, dmin):
        """acc += d·d8 · isum; summs += dmin·d8 · imin."""
        d8 = self.scale()
        self.accumulate(self.b.fmul(d8, d), self.b.load(self.isum))
        term = self.b.sitofp(self.b.load(self.imin), F32)
        self.b.store(_call(self.b, "llvm.fma.f32", F32, [self.b.fmul(d8, dmin), term, self.b.load(self.summs)]),
                     self.summs)


def row_dot_q8_k(block_bytes: int, emit_block):
    """row_dot_q8 for a K-quant row against q8_K codes."""
    return row_dot_q8(block_bytes, emit_block, 256, KBlock, types.int32)


def _k_scale_min(e: KBlock, j: int):
    """Sub-block j's 6-bit scale and min from Q4_K/Q5_K's 12 packed bytes at offset 4 (i32s)."""
    b, c = e.b, (lambda v: ir.Constant(I32, v))
    if j < 4:
        return b.and_(e.byte(4 + j), c(63)), b.and_(e.byte(8 + j), c(63))
    high = e.byte(8 + j)
    sc = b.or_(b.and_(high, c(15)), b.shl(b.lshr(e.byte(j), c(6)), c(4)))
    mn = b.or_(b.lshr(high, c(4)), b.shl(b.lshr(e.byte(4 + j), c(6)), c(4)))
    return sc, mn


def _k_sub_blocks(e: KBlock, qh_at: int | None):
    """Q4_K/Q5_K: value = d·sc·q − dmin·m per sub-block of 32, q from nibbles (and a fifth bit)."""
    b = e.b
    for j in range(8):
        sc, mn = _k_scale_min(e, j)
        raw = e.weight_bytes(16 + 32 * (j // 2) + (0 if qh_at is None else 32), V32I8)
        codes = b.and_(b.lshr(raw, _bytes(4 * (j % 2))), _bytes(15))
        if qh_at is not None:
            high = b.and_(b.lshr(e.weight_bytes(qh_at, V32I8), _bytes(j)), _bytes(1))
            codes = b.or_(codes, b.shl(high, _bytes(4)))
        e.add_scaled(codes, e.codes_at(32 * j), [sc])
        e.add_min(b.mul(mn, b.add(e.bsum(2 * j), e.bsum(2 * j + 1))))
    e.finish(e.half(0), e.b.fneg(e.half(2)))


def _q4_k(e: KBlock):
    _k_sub_blocks(e, None)


def _q5_k(e: KBlock):
    _k_sub_blocks(e, 16)


def _q6_k(e: KBlock):
    """Two halves of 128 values; 16 values share an int8 scale; q = 6-bit code − 32, the −32 taken
    through the activation sums."""
    b = e.b
    for n in range(2):
        for k in range(4):
            low = b.and_(b.lshr(e.weight_bytes(64 * n + 32 * (k % 2), V32I8), _bytes(4 * (k // 2))), _bytes(15))
            high = b.shl(b.and_(b.lshr(e.weight_bytes(128 + 32 * n, V32I8), _bytes(2 * k)), _bytes(3)), _bytes(4))
            scales = [b.sext(b.load(e._ptr(e.row, (e.at, 192 + 8 * n + 2 * k + h), I8)), I32) for h in (0, 1)]
            e.add_scaled(b.or_(low, high), e.codes_at(128 * n + 32 * k), scales)
            for h in (0, 1):
                e.add_min(b.mul(b.mul(scales[h], ir.Constant(I32, -32)), e.bsum(8 * n + 2 * k + h)))
    d = e.half(208)
    e.finish(d, d)


dot_q4_k = row_dot_q8_k(144, _q4_k)
dot_q5_k = row_dot_q8_k(176, _q5_k)
dot_q6_k = row_dot_q8_k(210, _q6_k)


@njit(inline="always")
def _matvec(w, x, out, dot):
    """matvec_float._matvec with the activations rounded to q8 blocks first (on one thread: a few
    microseconds): stacked parts share one parallel loop."""
    n, n_in = x.shape
    q = np.empty((n, n_in), dtype=np.int8)
    d = np.empty((n, n_in // 32), dtype=np.float32)
    s = np.empty((n, n_in // 32), dtype=np.float32)
    quantize_q8(x, q, d, s)
    _rows(w, q, d, s, out, dot)


@njit(inline="always")
def _matvec_k(w, x, out, dot):
    """_matvec for K-quants: q8_K codes, an f32 scale per 256 values and sums of 16."""
    n, n_in = x.shape
    q = np.empty((n, n_in), dtype=np.int8)
    d = np.empty((n, n_in // 256), dtype=np.float32)
    bsums = np.empty((n, n_in // 16), dtype=np.int32)
    quantize_q8_k(x, q, d, bsums)
    _rows(w, q, d, bsums, out, dot)


@njit(inline="always")
def _rows(w, q, d, extra, out, dot):
    """matvec_float._matvec's loop over the weight's rows, with the 4-argument dot of q8 codes (numba
    takes no function of either arity in place of the other, hence the copy)."""
    parts = as_parts(w)
    n_tasks = 0
    for p in range(len(parts)):
        n_tasks += _tasks(parts[p])
    for task in prange(n_tasks):
        p, col = 0, 0
        t = task + 0
        while t >= _tasks(parts[p]):
            t -= _tasks(parts[p])
            col += parts[p].shape[0]
            p += 1
        part = parts[p]
        r0 = t * ROWS_PER_TASK
        for r in range(r0, min(r0 + ROWS_PER_TASK, part.shape[0])):
            for i in range(q.shape[0]):
                out[i, col + r] = dot(part[r], q[i], d[i], extra[i])


# numba caches top-level functions only: one per type (as in matvec_float.py)

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
    _matvec_k(w, x, out, dot_q4_k)


@njit(parallel=True, cache=True)
def matvec_q5_k(w, x, out):
    _matvec_k(w, x, out, dot_q5_k)


@njit(parallel=True, cache=True)
def matvec_q6_k(w, x, out):
    _matvec_k(w, x, out, dot_q6_k)


# ggml type ids
MATVEC = {2: matvec_q4_0, 3: matvec_q4_1, 6: matvec_q5_0, 7: matvec_q5_1, 8: matvec_q8_0,
          12: matvec_q4_k, 13: matvec_q5_k, 14: matvec_q6_k}
