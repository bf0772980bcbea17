"""8-bit GEMM for prompts under `--numerics ggml`: many activation rows against a quantized weight.

ggml-cpu rounds a prompt's activations to q8 blocks and multiplies their integer codes with the
weights' codes block by block. This file does the same arithmetic as a tiled GEMM. A worker takes a
tile of weight rows and unpacks it once into 8-bit codes; every activation row then meets the tile
in a register-blocked micro-kernel (`R` weight rows by `C` activation rows at a time) built on the
CPU's 8-bit dot: AVX-512 VNNI's `vpdpbusd` (16 lanes), AVX-VNNI's (8 lanes), or AVX2's
`pmaddubsw` + `pmaddwd` (8 lanes). Each int32 lane sums four u8 × s8 products.

The layout makes one lane hold one *unit*, the run of values sharing a weight scale: a block of 32
(Q4_0 … Q8_0), a sub-block of 32 (Q4_K, Q5_K) or of 16 (Q6_K). A group of L units is stored
word-interleaved, word t of every unit side by side, so that G/4 dot instructions leave each lane
with its unit's whole integer dot, exactly. Per group and (row, activation row) pair that is then
one conversion to float, one product of the two scales and one fma (and one more fma for the
types with a minimum): the float work of a block is shared by L blocks.

  - codes: the weight codes unsigned (what Q4/Q5/Q6 store, Q8_0's plus 128 for the VNNI dots);
    the constant offset (8, 16, 32 or 128) is taken out exactly by starting each lane's integer
    sum at −offset · Σ(activation codes of the unit).
  - scales: the unit's float weight scale: d, or d · (6/8-bit sub-block scale) for the K-quants
    (exact in f32); the activation side has its q8 block scale per unit.
  - mins: Q4_1/Q5_1 add m · s8 (the q8_1 block's f16 sum, as ggml), Q4_K/Q5_K −dmin·m ·
    d8·Σcodes.

Integer sums are exact, as in ggml's vec_dot; the float steps come in another order (per unit
rather than per super-block for K-quants), so values agree with ggml's to float rounding — the
contract of matvec_int.py. Without AVX2 (`ISA is None`) the caller keeps its float path.
`LLMSUITE_GEMM8_ISA=avx2|vnni256|vnni512` picks a narrower path (tests); only the native one is
cached on disk.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...errors import LLMError
from .blocks import block_size, each_block, k_codes, k_scale_min, q6_k_codes
from .cache import per_type
from .ir import F32, FEATURES, I8, I32, I64, arrays, call, contiguous, fma, reduce_add
from .matvec import as_parts, count_tasks, task_rows
from .matvec_int import IBlock
from .q8 import q8_blocks, q8_k_blocks

# path: (lanes, weight rows R, activation rows C per micro-kernel). R·C int32 and R·C float
# accumulators; on AVX-512 4 × 4 measured fastest although the float ones then live on the stack.
SHAPES = {"vnni512": (16, 4, 4), "vnni256": (8, 2, 3), "avx2": (8, 2, 3)}


def native_isa() -> str | None:
    f = FEATURES
    if f.get("avx512vnni") and f.get("avx512bw") and f.get("avx512f"):
        return "vnni512"
    if f.get("avxvnni") or (f.get("avx512vnni") and f.get("avx512vl")):
        return "vnni256"
    return "avx2" if f.get("avx2") and f.get("f16c") else None


def _chosen_isa() -> str | None:
    asked = os.environ.get("LLMSUITE_GEMM8_ISA")
    if not asked:
        return native_isa()
    order, native = ("avx2", "vnni256", "vnni512"), native_isa()
    runs = order[:order.index(native) + 1] if native else ()
    if asked not in runs:
        raise LLMError(f"LLMSUITE_GEMM8_ISA={asked!r}: this CPU runs {', '.join(runs) or 'no 8-bit GEMM'}")
    return asked


ISA = _chosen_isa()
LANES, R, C = SHAPES.get(ISA, (8, 2, 3))
CACHE = ISA == native_isa()
# Q8_0's codes are signed; the VNNI dots take them plus 128 (and the offset back through the
# activation sums), AVX2's pmaddubsw would saturate on that, so it takes |w| against sign(x, w).
Q8_0_SIGNED = ISA == "avx2"


# ---- the weight side: one row unpacked into its tile row ----------------------------------------

class TileRow:
    """Stores a weight row's units in the interleaved layout: word t of unit u at byte
    (u // L)·G·L + t·4L + (u % L)·4 of the row's codes, its scale (and min) at index u."""

    def __init__(self, builder, codes, scales, mins, unit_values: int):
        self.b, self.codes, self.scales, self.mins, self.g = builder, codes, scales, mins, unit_values

    def put(self, unit, values, scale, minimum=None):
        b, lanes, words = self.b, LANES, self.g // 4
        group, lane = b.udiv(unit, ir.Constant(I64, lanes)), b.urem(unit, ir.Constant(I64, lanes))
        base = b.add(b.mul(group, ir.Constant(I64, words * lanes)), lane)
        as_words = b.bitcast(values, ir.VectorType(I32, words))
        word_ptr = b.bitcast(self.codes, I32.as_pointer())
        for t in range(words):
            at = b.add(base, ir.Constant(I64, t * lanes))
            b.store(b.extract_element(as_words, ir.Constant(I32, t)), b.gep(word_ptr, [at]), align=4)
        b.store(scale, b.gep(self.scales, [unit]))
        if minimum is not None:
            b.store(minimum, b.gep(self.mins, [unit]))


def unpack_row(name: str, unit_values: int, emit_block):
    """A numba intrinsic `unpack(row, codes, scales, mins)`: one weight row (uint8 blocks of GGUF
    type `name`) into a tile row of units of `unit_values`. `emit_block(e, put)` decodes one block
    (e: a matvec_int.IBlock over the block's bytes) and calls put(unit index in the block, codes,
    scale, min)."""
    block_values, block_bytes = block_size(name)
    units_per_block = block_values // unit_values

    @intrinsic
    def unpack(typingctx, row, codes, scales, mins):
        if not (contiguous(row, types.uint8) and contiguous(codes, types.uint8)
                and contiguous(scales, types.float32) and contiguous(mins, types.float32)):
            return None

        def codegen(context, builder, signature, args):
            row_a, codes_a, scales_a, mins_a = arrays(context, builder, signature.args, args)
            out = TileRow(builder, codes_a.data, scales_a.data, mins_a.data, unit_values)
            n_blocks = builder.udiv(builder.extract_value(row_a.shape, 0), ir.Constant(I64, block_bytes))
            with each_block(builder, n_blocks, block_bytes, units_per_block) as (index, at, first):
                e = IBlock(builder, row_a.data, None, None, None, at, None, index, None, None)

                def put(j, values, scale, minimum=None):
                    out.put(builder.add(first, ir.Constant(I64, j)), values, scale, minimum)

                emit_block(e, put)
            return context.get_dummy_value()

        return types.none(row, codes, scales, mins), codegen

    return unpack


def _to_float(e, v):
    return e.b.sitofp(v, F32)


def _q4_0(e, put):
    put(0, e.nibbles(2), e.half(0))


def _q4_1(e, put):
    put(0, e.nibbles(4), e.half(0), e.half(2))


def _q5_0(e, put):
    put(0, e.fifth_bits(2, e.nibbles(6)), e.half(0))


def _q5_1(e, put):
    put(0, e.fifth_bits(4, e.nibbles(8)), e.half(0), e.half(2))


def _q8_0(e, put):
    codes = e.bytes(2)
    put(0, codes if Q8_0_SIGNED else e.b.xor(codes, e.lanes(0x80)), e.half(0))


def _k_units(e, put, q5: bool):
    """Q4_K/Q5_K: sub-block j's codes with scale d·sc_j and min −dmin·m_j."""
    b, d, dmin = e.b, e.half(0), e.half(2)
    for j in range(8):
        sc, mn = k_scale_min(e, j)
        put(j, k_codes(e, j, q5), b.fmul(d, _to_float(e, sc)), b.fneg(b.fmul(dmin, _to_float(e, mn))))


def _q4_k(e, put):
    _k_units(e, put, q5=False)


def _q5_k(e, put):
    _k_units(e, put, q5=True)


def _q6_k(e, put):
    """Units of 16 values, each with its int8 scale; codes 0..63 (the −32 through the sums)."""
    b, d = e.b, e.half(208)
    for n in range(2):
        for k in range(4):
            codes = q6_k_codes(e, n, k)
            for h in range(2):
                unit = 8 * n + 2 * k + h
                half = b.shuffle_vector(codes, codes, ir.Constant(ir.VectorType(I32, 16), list(range(16 * h, 16 * h + 16))))
                put(unit, half, b.fmul(d, _to_float(e, e.signed_byte(192 + unit))))


EMIT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
        "Q6_K": _q6_k}


# ---- the micro-kernel: R tile rows × C activation rows over the whole width ---------------------

def _dot(builder, acc, w, x, signed_weights: bool):
    """acc + the 4-byte dots of u8 w and s8 x, lane by lane (int32 lanes)."""
    n = acc.type.count
    if signed_weights:  # |w| against x with w's sign, as ggml's mul_sum_i8_pairs
        x = call(builder, "llvm.x86.avx2.psign.b", x.type, [x, w])
        w = call(builder, "llvm.abs.v32i8", w.type, [w, ir.Constant(ir.IntType(1), 0)])
    if ISA == "avx2":
        pairs = call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(ir.IntType(16), 16), [w, x])
        quads = call(builder, "llvm.x86.avx2.pmadd.wd", acc.type, [pairs, ir.Constant(pairs.type, [1] * 16)])
        return builder.add(acc, quads)
    words = ir.VectorType(I32, n)
    name = "llvm.x86.avx512.vpdpbusd.512" if n == 16 else "llvm.x86.avx512.vpdpbusd.256"
    return call(builder, name, words, [acc, builder.bitcast(w, words), builder.bitcast(x, words)])


def tile_dot(unit_values: int, with_mins: bool, with_offset: bool, signed_weights: bool = False):
    """A numba intrinsic `dot(codes, scales, mins, r0, xq, sx, xo, xinit, i0, res)`: tile rows
    r0..r0+R against activation rows i0..i0+C, res[c·R + r] their dots. codes (tile rows, width)
    uint8 and xq (rows, width) int8 in the interleaved layout; scales, mins, sx, xo (·, units)
    float32; xinit (rows, units) int32, each lane's starting integer sum."""
    lanes, steps = LANES, unit_values // 4
    vf, vi = ir.VectorType(F32, lanes), ir.VectorType(I32, lanes)
    vbytes = ir.VectorType(I8, 4 * lanes)

    @intrinsic
    def dot(typingctx, codes, scales, mins, r0, xq, sx, xo, xinit, i0, res):
        if not (contiguous(codes, types.uint8) and contiguous(xq, types.int8)
                and all(contiguous(a, types.float32) for a in (scales, mins, sx, xo, res))
                and contiguous(xinit, types.int32)):
            return None

        def codegen(context, builder, signature, args):
            b = builder
            arrays = {name: context.make_array(signature.args[k])(context, b, args[k])
                      for k, name in enumerate(("codes", "scales", "mins", "", "xq", "sx", "xo", "xinit"))
                      if name}
            width = b.extract_value(arrays["codes"].shape, 1)
            n_units = b.extract_value(arrays["scales"].shape, 1)

            def rows(name, first, count, stride):
                data = arrays[name].data
                return [b.gep(data, [b.mul(b.add(first, ir.Constant(I64, k)), stride)]) for k in range(count)]

            w_rows = rows("codes", args[3], R, width)
            x_rows = rows("xq", args[8], C, width)
            sw_rows, mw_rows = rows("scales", args[3], R, n_units), rows("mins", args[3], R, n_units)
            sx_rows, xo_rows = rows("sx", args[8], C, n_units), rows("xo", args[8], C, n_units)
            init_rows = rows("xinit", args[8], C, n_units)

            def load(ptr, offset, ty):
                return b.load(b.bitcast(b.gep(ptr, [offset]), ty.as_pointer()), align=1)

            sums = [[cgutils.alloca_once_value(b, ir.Constant(vf, None)) for _ in range(C)] for _ in range(R)]
            n_groups = b.udiv(width, ir.Constant(I64, unit_values * lanes))
            with cgutils.for_range(b, n_groups) as loop:
                unit0 = b.mul(loop.index, ir.Constant(I64, lanes))
                byte0 = b.mul(loop.index, ir.Constant(I64, unit_values * lanes))
                start = [load(init_rows[c], unit0, vi) if with_offset else ir.Constant(vi, None) for c in range(C)]
                acc = [[start[c] for c in range(C)] for _ in range(R)]
                for t in range(steps):
                    at = b.add(byte0, ir.Constant(I64, 4 * lanes * t))
                    w = [load(w_rows[r], at, vbytes) for r in range(R)]
                    for c in range(C):
                        x = load(x_rows[c], at, vbytes)
                        for r in range(R):
                            acc[r][c] = _dot(b, acc[r][c], w[r], x, signed_weights)
                sw = [load(sw_rows[r], unit0, vf) for r in range(R)]
                mw = [load(mw_rows[r], unit0, vf) for r in range(R)] if with_mins else None
                for c in range(C):
                    sx, xo = load(sx_rows[c], unit0, vf), (load(xo_rows[c], unit0, vf) if with_mins else None)
                    for r in range(R):
                        total = fma(b, b.sitofp(acc[r][c], vf), b.fmul(sw[r], sx), b.load(sums[r][c]))
                        if with_mins:
                            total = fma(b, mw[r], xo, total)
                        b.store(total, sums[r][c])
            res_a = context.make_array(signature.args[9])(context, b, args[9])
            for c in range(C):
                for r in range(R):
                    b.store(reduce_add(b, b.load(sums[r][c])), b.gep(res_a.data, [ir.Constant(I64, c * R + r)]))
            return context.get_dummy_value()

        return types.none(codes, scales, mins, r0, xq, sx, xo, xinit, i0, res), codegen

    return dot


dot_plain = tile_dot(32, with_mins=False, with_offset=True)          # Q4_0, Q5_0, Q8_0 (VNNI)
dot_mins = tile_dot(32, with_mins=True, with_offset=False)           # Q4_1, Q5_1, Q4_K, Q5_K
dot_16 = tile_dot(16, with_mins=False, with_offset=True)             # Q6_K
DOT_Q8_0 = tile_dot(32, with_mins=False, with_offset=False, signed_weights=True) if Q8_0_SIGNED else dot_plain
Q8_0_OFFSET = 0 if Q8_0_SIGNED else 128


# ---- the activation side -------------------------------------------------------------------------

@njit(inline="always")
def _padded(n, multiple):
    return (n + multiple - 1) // multiple * multiple


@njit(inline="always")
def _interleave(codes, unit_values, xq_row):
    """One row of codes (n_in int8) into the interleaved layout of xq_row."""
    words, into = codes.view(np.uint32), xq_row.view(np.uint32)
    per_unit = unit_values // 4
    for u in range(len(codes) // unit_values):
        base = (u // LANES) * per_unit * LANES + u % LANES
        for t in range(per_unit):
            into[base + t * LANES] = words[u * per_unit + t]


@njit(inline="always")
def _activation_arrays(x, unit_values):
    n, n_in = x.shape
    width = _padded(n_in, unit_values * LANES)
    n_rows = _padded(n, C)
    n_units = width // unit_values
    return (np.zeros((n_rows, width), np.int8), np.zeros((n_rows, n_units), np.float32),
            np.zeros((n_rows, n_units), np.float32), np.zeros((n_rows, n_units), np.int32))


@njit(inline="always")
def prepare_q8_32(x, offset):
    """x rounded to q8_1 blocks (ggml's quantize_row_q8_1) in the interleaved layout: per unit its
    f16 scale d8, its f16 sum s8 and −offset·Σcodes."""
    n, n_in = x.shape
    xq, sx, xo, xinit = _activation_arrays(x, 32)
    for i in prange(n):
        q, d, s = q8_blocks(x[i:i + 1])
        _interleave(q[0], 32, xq[i])
        for u in range(n_in // 32):
            total = 0
            for j in range(32 * u, 32 * u + 32):
                total += q[0, j]
            sx[i, u], xo[i, u], xinit[i, u] = d[0, u], s[0, u], -offset * total
    return xq, sx, xo, xinit


@njit(inline="always")
def prepare_q8_k(x, unit_values, offset):
    """x rounded to q8_K blocks (quantize_row_q8_K) in the interleaved layout: per unit of 16 or 32
    the block's f32 scale d8, d8·Σcodes and −offset·Σcodes."""
    n, n_in = x.shape
    xq, sx, xo, xinit = _activation_arrays(x, unit_values)
    sums_per_unit = unit_values // 16
    for i in prange(n):
        q, d, bsums = q8_k_blocks(x[i:i + 1])
        _interleave(q[0], unit_values, xq[i])
        for u in range(n_in // unit_values):
            total = 0
            for k in range(u * sums_per_unit, (u + 1) * sums_per_unit):
                total += bsums[0, k]
            scale = d[0, u * unit_values // 256]
            sx[i, u], xo[i, u], xinit[i, u] = scale, scale * np.float32(total), -offset * total
    return xq, sx, xo, xinit


# ---- the driver ------------------------------------------------------------------------------------

TILE_BYTES = 1024 * 1024  # a tile's codes: kept in L2 while every activation row passes
# Rows are padded with zero units to whole groups; beyond this much the float path over rounded
# activations is faster (scripts/gemm8_speed.py, 512 rows: Gemma 3's 640-wide Q5_0, padded to 1024,
# 1.15-1.44x the float path's speed; SmolLM2's 576-wide Q4_1, padded to 1024, 0.71x).
MAX_PADDING = 1.6
# Up to FEW_ROWS activation rows padding up to FEW_ROWS_PADDING pays: the float path would
# dequantize the whole weight for a few rows (SmolLM2's 576-wide Q4_1, padded to 1024, at 16 rows,
# decode steps of 16 sequences: the GEMM 0.2-0.6 ms a matrix, dequantize + BLAS 0.5-2.3 ms).
FEW_ROWS, FEW_ROWS_PADDING = 64, 2.0


@njit(inline="always")
def _tile_rows(width, n_rows, tasks):
    """Weight rows per task: what fits TILE_BYTES, at most 256, and few enough to make about
    `tasks` tiles (SmolLM2's 576 rows made three tiles for two threads)."""
    balanced = -(-n_rows // tasks)
    return max(R, min(256, TILE_BYTES // width, -(-balanced // R) * R) // R * R)


@njit(inline="always")
def _gemm(w, acts, out, first, tasks, unpack, dot):
    """out[i, first + col + r] = the ggml dot of activation row i with weight row r of each part
    (parts stacked along out's columns from column `first`), a tile of weight rows per task, about
    `tasks` of them (the caller's: a few per thread)."""
    xq, sx, xo, xinit = acts
    n, width, n_units = out.shape[0], xq.shape[1], sx.shape[1]
    parts = as_parts(w)
    n_rows = 0
    for p in range(len(parts)):
        n_rows += parts[p].shape[0]
    tile = _tile_rows(width, n_rows, tasks)
    for task in prange(count_tasks(parts, tile)):
        part, col, r0, r1 = task_rows(parts, task, tile)
        col += first
        n_here = r1 - r0
        codes = np.zeros((tile, width), np.uint8)
        scales = np.zeros((tile, n_units), np.float32)
        mins = np.zeros((tile, n_units), np.float32)
        for r in range(n_here):
            unpack(part[r0 + r], codes[r], scales[r], mins[r])
        res = np.empty(R * C, np.float32)
        for i0 in range(0, xq.shape[0], C):
            for rr in range(0, n_here, R):
                dot(codes, scales, mins, rr, xq, sx, xo, xinit, i0, res)
                for c in range(min(C, n - i0)):
                    for r in range(min(R, n_here - rr)):
                        out[i0 + c, col + r0 + rr + r] = res[c * R + r]


UNIT = OFFSET = UNPACK = DOT = None  # each kernel's own, in its copy of a template (cache.per_type)


def _gemm_q8_32(w, x, out, first, tasks):
    """The 32-value block types, against q8_1 blocks."""
    _gemm(w, prepare_q8_32(x, OFFSET), out, first, tasks, UNPACK, DOT)


def _gemm_q8_k(w, x, out, first, tasks):
    """The K-quants, against q8_K blocks in units of UNIT values."""
    _gemm(w, prepare_q8_k(x, UNIT, OFFSET), out, first, tasks, UNPACK, DOT)


# per type: units of 32 or 16 values, the codes' constant offset, the micro-kernel
LAYOUTS = {"Q4_0": (32, 8, dot_plain), "Q4_1": (32, 0, dot_mins), "Q5_0": (32, 16, dot_plain),
           "Q5_1": (32, 0, dot_mins), "Q8_0": (32, Q8_0_OFFSET, DOT_Q8_0), "Q4_K": (32, 0, dot_mins),
           "Q5_K": (32, 0, dot_mins), "Q6_K": (16, 32, dot_16)}


def _kernels() -> dict:
    constants = {name: {"UNIT": unit, "OFFSET": offset, "UNPACK": unpack_row(name, unit, EMIT[name]), "DOT": dot}
                 for name, (unit, offset, dot) in LAYOUTS.items()}
    k_quants = {name: c for name, c in constants.items() if name.endswith("_K")}
    blocks_32 = {name: c for name, c in constants.items() if name not in k_quants}
    return {**per_type(_gemm_q8_32, "gemm", blocks_32, parallel=True, cache=CACHE),
            **per_type(_gemm_q8_k, "gemm", k_quants, parallel=True, cache=CACHE)}


def fits(qtype: int, n_in: int, n_rows: int) -> bool:
    """Whether GEMM[qtype] takes n_rows activation rows n_in wide: padded to whole groups no more
    than MAX_PADDING (FEW_ROWS_PADDING for a few rows)."""
    group = (16 if qtype == 14 else 32) * LANES  # Q6_K's units are 16 values
    padding = FEW_ROWS_PADDING if n_rows <= FEW_ROWS else MAX_PADDING
    return qtype in GEMM and -(-n_in // group) * group <= padding * n_in


# ggml type ids
GEMM = _kernels() if ISA else {}
