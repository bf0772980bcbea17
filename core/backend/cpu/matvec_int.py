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
sums of 16) and takes the integer dots. Needs AVX2 and F16C (`AVAILABLE`); with AVX-512 BW Q6_K
takes a 64-value emitter with the same sums (`WIDE`, `MATVEC_AVX2` the kernels without it). Elsewhere ggml
numerics take the float kernels over rounded activations, which give the same values up to float
summation order.
"""

from __future__ import annotations

from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .blocks import BlockReader, block_size, each_block, k_codes, k_scale_min_words, q6_k_codes
from .cache import per_type
from .ir import (F32, FEATURES, I8, I16, I32, I64, V8F32, V8I32, V16I8, V16I16, V32I8, arrays, call, constant_lanes,
                 contiguous, fma, pointer, prefetch, splat)
from .matvec import ROWS_PER_TASK, as_parts, count_tasks, task_rows
from .q8 import q8_blocks, q8_k_blocks

AVAILABLE = bool(FEATURES.get("avx2", False) and FEATURES.get("f16c", False))
# With AVX-512 (BW) Q6_K takes 64 values per byte product instead of 32: 74 instructions a block
# instead of 121, 10 against 13 ns from L2 on one thread, and the same integer sums lane for lane
# (see KBlock._fold_wide).
WIDE = AVAILABLE and bool(FEATURES.get("avx512f", False) and FEATURES.get("avx512bw", False))
V64I8, V32I16, V16I32 = ir.VectorType(I8, 64), ir.VectorType(I16, 32), ir.VectorType(I32, 16)
# How far ahead of the block being read a row dot asks for the weight bytes. Decode streams the
# weights from DRAM, and without asking a row dot waits on memory: the 1B model's gate|up read at
# 9 GB/s on 2 cores (a plain read: 22 GB/s); 512 bytes ahead 16, 1024 17, 4096 20, 8192 19.
# Every cache line of a block is asked for: one ask per K-quant block (144-210 bytes) left the
# LFM2-350M-shaped Q6_K head at 28 GB/s on a 2-core EPYC, one per line 37 GB/s. The lines go to
# L2, not L1 (locality 2): the whole LFM2-shaped model's mat-vecs 15.5-16.1 → 17.9-18.8 GB/s on a
# 2-core Xeon (the L1's few miss buffers stay free for the loads themselves).
PREFETCH_BYTES = 4096
PREFETCH_LOCALITY = 2
CACHE_LINE = 64


class IBlock(BlockReader):
    """Emits one block of one weight row against its q8 block: `at` is the block's first weight
    byte, `xo` its first activation code, `b` its index (for d8 and s8). Codes are 32 bytes."""

    CODES = V32I8

    def __init__(self, builder: ir.IRBuilder, row, q, d8, s8, at, xo, b, acc, summs):
        super().__init__(builder, row, at)
        self.q, self.d8, self.s8, self.xo, self.bi, self.acc, self.summs = q, d8, s8, xo, b, acc, summs

    def bytes(self, offset):
        """32 weight bytes at `offset`."""
        return self.load(offset, V32I8)

    def nibbles(self, offset):
        """The 32 4-bit codes of 16 packed bytes in ggml's order: low nibbles, then high."""
        raw = self.load(offset, V16I8)
        lo = self.b.and_(raw, constant_lanes(V16I8, 15))
        hi = self.b.lshr(raw, constant_lanes(V16I8, 4))
        return self.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))

    def fifth_bits(self, offset, codes):
        """codes | 16 where bit j of the little-endian u32 at `offset` is set (Q5_0/Q5_1)."""
        mask = self.b.bitcast(self.word(offset), ir.VectorType(ir.IntType(1), 32))
        return self.b.select(mask, self.or_(codes, self.lanes(16)), codes)

    def codes_at(self, value):
        """The 32 activation codes from value `value` of the block."""
        return self.b.load(pointer(self.b, self.q, self.xo, value, V32I8), align=1)

    def lane_sums(self, unsigned, signed, weights=None):
        """8 int32 lanes, lane i the sum of products 4i..4i+3 of u8 × s8 bytes, each pair of
        products times its i16 weight (16 of them; 1 by default): pmaddwd scales as it sums."""
        pairs = call(self.b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [unsigned, signed])
        weights = ir.Constant(V16I16, [1] * 16) if weights is None else weights
        return call(self.b, "llvm.x86.avx2.pmadd.wd", V8I32, [pairs, weights])

    def signed_lane_sums(self, weights):
        """lane_sums of int8 weights: |w| × (x with w's sign), as ggml's mul_sum_i8_pairs."""
        x = self.codes_at(0)
        magnitude = call(self.b, "llvm.abs.v32i8", V32I8, [weights, ir.Constant(ir.IntType(1), 0)])
        return self.lane_sums(magnitude, call(self.b, "llvm.x86.avx2.psign.b", V32I8, [x, weights]))

    def scale(self):
        """The q8 block's scale d8 (as a float)."""
        return self.b.load(self.b.gep(self.d8, [self.bi]))

    def accumulate(self, d, lanes):
        """acc = fma(d, float(lanes), acc), d splatted over the 8 lanes."""
        total = fma(self.b, splat(self.b, d, 8), self.b.sitofp(lanes, V8F32), self.b.load(self.acc))
        self.b.store(total, self.acc)

    def add_offset(self, m):
        """summs += m · s8 (Q4_1/Q5_1's block minimum times the q8_1 block's f16 sum)."""
        s = self.b.load(self.b.gep(self.s8, [self.bi]))
        self.b.store(fma(self.b, m, s, self.b.load(self.summs)), self.summs)


def _hsum8(builder: ir.IRBuilder, v):
    """ggml's hsum_float_8: high half + low half, then lanes 0+2 and 1+3, then those two."""
    def pick(vec, idx):
        return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, len(idx)), idx))
    quad = builder.fadd(pick(v, [4, 5, 6, 7]), pick(v, [0, 1, 2, 3]))
    pair = builder.fadd(quad, pick(quad, [2, 3, 2, 3]))
    lane = builder.fadd(pair, pick(pair, [1, 1, 3, 3]))
    return builder.extract_element(lane, ir.Constant(I32, 0))


def row_dot_q8(name: str, emit_block, n_rows: int = 1, n_weights: int = 1):
    """A numba intrinsic `dot(row, q, d8, sums) -> float32`: one weight row of GGUF type `name`
    against one row of q8 codes with their block scales and sums: q8_0/q8_1 blocks of 32 with f32
    block sums, or (K-quants) q8_K blocks of 256 with int32 sums of 16. `emit_block(block)` emits
    one weight block (IBlock, or KBlock for a K-quant).

    With n_rows > 1 the dot takes n_rows activation rows, `dot(row, q0, d0, s0, q1, d1, s1, …)`,
    and returns their n_rows floats: each block is emitted once per activation row in one loop
    body, so LLVM decodes the weight block once for all of them (the same loads and shuffles) and
    only the products and sums repeat. Every row's arithmetic is the one-row dot's, in its order.

    With n_weights = 4 (and one activation row) the dot takes four weight rows, `dot(row0, row1,
    row2, row3, q, d8, sums)`, and returns their four floats: a 32-value block's dot ends in one fma
    into the row's accumulator, so a row waits on that fma's latency block after block; four rows'
    chains interleaved keep the core busy, each row's sum still in its own order."""
    block_values, block_bytes = block_size(name)
    block, extra = (KBlock, types.int32) if block_values == 256 else (IBlock, types.float32)
    n_sums = n_rows * n_weights

    def codegen(context, builder, signature, args):
        arrays_in = arrays(context, builder, signature.args, args)
        rows, acts = arrays_in[:n_weights], arrays_in[n_weights:]
        n_blocks = builder.extract_value(acts[1].shape, 0)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(n_sums)]
        summs = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(n_sums)]
        with each_block(builder, n_blocks, block_bytes, block_values) as (index, at, xo):
            for row_a in rows:
                for line in range(0, block_bytes, CACHE_LINE):  # every line of a K-quant's 144-210 bytes
                    ahead = ir.Constant(I64, PREFETCH_BYTES + line)
                    prefetch(builder, builder.gep(row_a.data, [builder.add(at, ahead)]), PREFETCH_LOCALITY)
            for w, row_a in enumerate(rows):
                for k in range(n_rows):
                    q_a, d_a, s_a = acts[3 * k:3 * k + 3]
                    i = w * n_rows + k
                    emit_block(block(builder, row_a.data, q_a.data, d_a.data, s_a.data, at, xo, index, accs[i],
                                     summs[i]))
        totals = [builder.fadd(_hsum8(builder, builder.load(a)), builder.load(m)) for a, m in zip(accs, summs)]
        if n_sums == 1:
            return totals[0]
        return context.make_tuple(builder, signature.return_type, totals)

    def typed(*args):
        rows, acts = args[:n_weights], args[n_weights:]
        if not (all(contiguous(row, types.uint8) for row in rows) and len(acts) == 3 * n_rows and all(
                contiguous(q, types.int8) and contiguous(d8, types.float32) and contiguous(sums, extra)
                for q, d8, sums in zip(acts[0::3], acts[1::3], acts[2::3]))):
            return None
        result = types.float32 if n_sums == 1 else types.UniTuple(types.float32, n_sums)
        return result(*args), codegen

    if n_weights == 4:
        @intrinsic
        def dot(typingctx, row0, row1, row2, row3, q, d8, sums):
            return typed(row0, row1, row2, row3, q, d8, sums)
    elif n_rows == 1:
        @intrinsic
        def dot(typingctx, row, q, d8, sums):
            return typed(row, q, d8, sums)
    elif n_rows == 2:
        @intrinsic
        def dot(typingctx, row, q0, d0, s0, q1, d1, s1):
            return typed(row, q0, d0, s0, q1, d1, s1)
    else:
        @intrinsic
        def dot(typingctx, row, q0, d0, s0, q1, d1, s1, q2, d2, s2, q3, d3, s3):
            return typed(row, q0, d0, s0, q1, d1, s1, q2, d2, s2, q3, d3, s3)
    return dot


# ---- one block of each type: ggml's vec_dot_<type>_q8_<0|1> -------------------------------------

def _scaled(e: IBlock, d):
    return e.b.fmul(d, e.scale())


def _q4_0(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(e.sub(e.nibbles(2), 8)))


def _q4_1(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.lane_sums(e.nibbles(4), e.codes_at(0)))
    e.add_offset(e.half(2))


def _q5_0(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(e.sub(e.fifth_bits(2, e.nibbles(6)), 16)))


def _q5_1(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.lane_sums(e.fifth_bits(4, e.nibbles(8)), e.codes_at(0)))
    e.add_offset(e.half(2))


def _q8_0(e: IBlock):
    e.accumulate(_scaled(e, e.half(0)), e.signed_lane_sums(e.bytes(2)))


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
        self.wide = None  # the 16 lanes of a 64-value emitter, folded into isum by finish

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
        self.add_weighted(codes, x, v)

    def add_weighted(self, codes, x, weights):
        """isum += the lanes of codes × x, each pair of products times its i16 weight (16 lanes)."""
        self.b.store(self.b.add(self.b.load(self.isum), self.lane_sums(codes, x, weights)), self.isum)

    def mins_dot(self, mins_lo, mins_hi):
        """Σ_j min_j · (bsum 2j + bsum 2j+1): the 8 min bytes of two u32 words against the block's
        16 activation sums, paired."""
        b = self.b
        sums = b.load(b.bitcast(b.gep(self.bsums, [b.mul(self.bi, ir.Constant(I64, 16))]),
                                ir.VectorType(I32, 16).as_pointer()), align=4)
        pick = lambda first: ir.Constant(ir.VectorType(I32, 8), list(range(first, 16, 2)))  # noqa: E731
        pairs = b.add(b.shuffle_vector(sums, sums, pick(0)), b.shuffle_vector(sums, sums, pick(1)))
        mins = b.zext(self.byte_lanes(mins_lo, mins_hi), V8I32)
        return call(b, "llvm.vector.reduce.add.v8i32", I32, [b.mul(mins, pairs)])

    def byte_lanes(self, lo, hi):
        """The 8 bytes of two u32 words as an <8 x i8> vector (lo's bytes first)."""
        b, two = self.b, ir.VectorType(I32, 2)
        words = b.insert_element(b.insert_element(ir.Constant(two, None), lo, ir.Constant(I32, 0)), hi,
                                 ir.Constant(I32, 1))
        return b.bitcast(words, ir.VectorType(ir.IntType(8), 8))

    def add_min(self, value):
        self.b.store(self.b.add(self.b.load(self.imin), value), self.imin)

    def add_wide(self, codes, value, weights):
        """The 16 wide lanes += codes × activation codes `value`.. +63 (64 u8 × s8 products, each
        pair times its i16 weight: 32 of them). Lane i sums products 4i..4i+3."""
        b = self.b
        x = b.load(pointer(b, self.q, self.xo, value, V64I8), align=1)
        pairs = call(b, "llvm.x86.avx512.pmaddubs.w.512", V32I16, [codes, x])
        lanes = call(b, "llvm.x86.avx512.pmaddw.d.512", V16I32, [pairs, weights])
        self.wide = lanes if self.wide is None else b.add(self.wide, lanes)

    def _fold_wide(self):
        """isum += wide lanes 0-7 + lanes 8-15. A wide step covers two 32-value runs, its lanes
        0-7 the first and 8-15 the second, so lane i + lane i+8 is what the 32-value emitter's
        lane i adds up for those runs: the integers, and so the floats, equal it bit for bit."""
        b, w = self.b, self.wide
        half = [b.shuffle_vector(w, w, ir.Constant(ir.VectorType(I32, 8), list(range(k, k + 8)))) for k in (0, 8)]
        b.store(b.add(b.load(self.isum), b.add(half[0], half[1])), self.isum)

    def spread(self, small, copies):
        """The i16 lanes of `small` (a vector of n), each repeated `copies` times."""
        n = small.type.count
        return self.b.shuffle_vector(small, small, ir.Constant(ir.VectorType(I32, n * copies),
                                                                [k // copies for k in range(n * copies)]))

    def finish(self, d, dmin):
        """acc += d·d8 · isum; summs += dmin·d8 · imin."""
        if self.wide is not None:
            self._fold_wide()
        d8 = self.scale()
        self.accumulate(self.b.fmul(d8, d), self.b.load(self.isum))
        term = self.b.sitofp(self.b.load(self.imin), F32)
        self.b.store(fma(self.b, self.b.fmul(d8, dmin), term, self.b.load(self.summs)), self.summs)


def _k_sub_blocks(e: KBlock, q5: bool):
    """Q4_K/Q5_K: value = d·sc·q − dmin·m per sub-block of 32, q from nibbles (and a fifth bit).
    The mins meet the activation sums in one vector product per super-block."""
    b = e.b
    scales_lo, scales_hi, mins_lo, mins_hi = k_scale_min_words(e)
    scales = b.zext(e.byte_lanes(scales_lo, scales_hi), ir.VectorType(ir.IntType(16), 8))
    for j in range(8):  # sub-block j's scale in all 16 lanes: a shuffle in vector registers
        weights = b.shuffle_vector(scales, scales, ir.Constant(ir.VectorType(I32, 16), [j] * 16))
        e.add_weighted(k_codes(e, j, q5), e.codes_at(32 * j), weights)
    e.add_min(e.mins_dot(mins_lo, mins_hi))
    e.finish(e.half(0), e.b.fneg(e.half(2)))


def _q4_k(e: KBlock):
    _k_sub_blocks(e, q5=False)


def _q5_k(e: KBlock):
    _k_sub_blocks(e, q5=True)


def _q6_k(e: KBlock):
    """Two halves of 128 values; 16 values share an int8 scale; q = 6-bit code − 32, the −32 taken
    through the activation sums."""
    for n in range(2):
        for k in range(4):
            codes = q6_k_codes(e, n, k)
            scales = [e.signed_byte(192 + 8 * n + 2 * k + h) for h in (0, 1)]
            e.add_scaled(codes, e.codes_at(128 * n + 32 * k), scales)
    e.add_min(_q6_k_bias(e))
    d = e.half(208)
    e.finish(d, d)


def _q6_k_bias(e: KBlock):
    """−32 · Σ_g scale_g · (sum of activation codes 16g .. 16g+15): the codes' offset of 32, taken
    for the whole super-block in one vector product of its 16 int8 scales and 16 sums."""
    b, v16 = e.b, ir.VectorType(I32, 16)
    scales = b.sext(e.load(192, ir.VectorType(I8, 16)), v16)
    sums = b.load(b.bitcast(b.gep(e.bsums, [b.mul(e.bi, ir.Constant(I64, 16))]), v16.as_pointer()), align=4)
    return b.mul(call(b, "llvm.vector.reduce.add.v16i32", I32, [b.mul(scales, sums)]), ir.Constant(I32, -32))


# ---- Q6_K 64 values at a time (AVX-512 BW) ---------------------------------------------------

def _twice(e: KBlock, offset):
    """The 32 bytes at `offset` in both halves of a 64-byte vector."""
    raw = e.load(offset, V32I8)
    return e.b.shuffle_vector(raw, raw, ir.Constant(ir.VectorType(I32, 64), list(range(32)) * 2))


def _shift_halves(e: KBlock, v, low: int, high: int):
    """The bytes of v's first half shifted right by `low` bits and of its second by `high` (in
    16-bit lanes: the caller masks off what crosses a byte)."""
    b = e.b
    amounts = ir.Constant(V32I16, [low] * 16 + [high] * 16)
    return b.bitcast(b.lshr(b.bitcast(v, V32I16), amounts), V64I8)


def _bytes_mask(e: KBlock, v, m):
    return e.b.and_(v, constant_lanes(V64I8, m))


def _q6_k_wide(e: KBlock):
    """_q6_k 64 values at a time: values 128n + 64p .. +63 take the low (p = 0) or high (p = 1)
    nibbles of the 64 bytes at 64n, bits 4p and 4p+2 of the 32 high-bit bytes, and four scales."""
    b = e.b
    for n in range(2):
        for p in range(2):
            low = _bytes_mask(e, b.lshr(e.load(64 * n, V64I8), constant_lanes(V64I8, 4 * p)), 15)
            high = _bytes_mask(e, _shift_halves(e, _twice(e, 128 + 32 * n), 4 * p, 4 * p + 2), 3)
            codes = b.or_(low, b.shl(high, constant_lanes(V64I8, 4)))
            scales = b.sext(e.load(192 + 8 * n + 4 * p, ir.VectorType(I8, 4)), ir.VectorType(I16, 4))
            e.add_wide(codes, 128 * n + 64 * p, e.spread(scales, 8))
    e.add_min(_q6_k_bias(e))
    d = e.half(208)
    e.finish(d, d)


EMIT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
        "Q6_K": _q6_k}
# Q4_K and Q5_K 64 values at a time ran slower than 32 (9.9 against 8.6 ns a Q4_K block from L2,
# one thread, on an AVX-512 Xeon: the 512-bit shifts and byte permutes cost more than they save)
EMIT_WIDE = {"Q6_K": _q6_k_wide}

# Whether a single activation row takes the weight rows four at a time (DOT_W4): for the 32-value
# types, whose dots wait on one fma chain per row (SmolLM2's Q4_1 rows of 576 values: gate|up and
# q|k|v about 20 % faster); not for the K-quants, whose longer blocks keep the core busy anyway
# (the 1B model's Q4_K/Q6_K mat-vecs: no faster, some slower).
FOUR_WEIGHT_ROWS = False
ROUND = DOT = DOT2 = DOT4 = DOT_W4 = None  # each kernel's own, in its copy of _matvec (cache.per_type)


def _matvec(w, x, out):
    """matvec_float's contract with the activations rounded to q8 blocks first (on one thread: a
    few microseconds): q8_1 blocks of 32, or q8_K blocks for the K-quants. Activation rows go four
    at a time through DOT4 (each weight block decoded once for the four), then two through DOT2,
    a last one through DOT; a single activation row takes the weight rows four at a time where
    FOUR_WEIGHT_ROWS (DOT_W4)."""
    q, d8, s = ROUND(x)
    parts = as_parts(w)
    n = out.shape[0]
    fours, pair = n - n % 4, n % 4 >= 2
    for task in prange(count_tasks(parts, ROWS_PER_TASK)):
        part, col, r0, r1 = task_rows(parts, task, ROWS_PER_TASK)
        if n == 1 and FOUR_WEIGHT_ROWS:
            end = r1 - (r1 - r0) % 4
            for r in range(r0, end, 4):
                out[0, col + r], out[0, col + r + 1], out[0, col + r + 2], out[0, col + r + 3] = DOT_W4(
                    part[r], part[r + 1], part[r + 2], part[r + 3], q[0], d8[0], s[0])
            for r in range(end, r1):
                out[0, col + r] = DOT(part[r], q[0], d8[0], s[0])
            continue
        for r in range(r0, r1):
            for i in range(0, fours, 4):
                a, b, c, e = DOT4(part[r], q[i], d8[i], s[i], q[i + 1], d8[i + 1], s[i + 1],
                                  q[i + 2], d8[i + 2], s[i + 2], q[i + 3], d8[i + 3], s[i + 3])
                out[i, col + r], out[i + 1, col + r], out[i + 2, col + r], out[i + 3, col + r] = a, b, c, e
            if pair:
                a, b = DOT2(part[r], q[fours], d8[fours], s[fours], q[fours + 1], d8[fours + 1], s[fours + 1])
                out[fours, col + r], out[fours + 1, col + r] = a, b
            if n % 2:
                out[n - 1, col + r] = DOT(part[r], q[n - 1], d8[n - 1], s[n - 1])


def _kernels(prefix: str, emitters: dict) -> dict:
    return per_type(_matvec, prefix, {name: {"ROUND": q8_k_blocks if name.endswith("_K") else q8_blocks,
                                             "DOT": row_dot_q8(name, emit), "DOT2": row_dot_q8(name, emit, 2),
                                             "DOT4": row_dot_q8(name, emit, 4),
                                             "DOT_W4": row_dot_q8(name, emit, 1, n_weights=4),
                                             "FOUR_WEIGHT_ROWS": block_size(name)[0] == 32}
                                      for name, emit in emitters.items()}, parallel=True)


# MATVEC_AVX2: the 32-value emitters only, where MATVEC takes a wide one (a test holds them equal)
MATVEC_AVX2 = _kernels("matvec", EMIT)
MATVEC = {**MATVEC_AVX2, **_kernels("matvec_wide", EMIT_WIDE)} if WIDE else MATVEC_AVX2
