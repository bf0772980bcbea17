"""Attention kernels compiled with numba: flash attention for a few query rows, the online-softmax
step of a prompt tile, and the block top-k mask and block bounds of sparse attention.

The cache is read where it lies: f32 rows as they are, f16 rows widened in registers (a shift
and one multiply, branch-free where the values are finite, so LLVM vectorizes it). The cells
are split into chunks, one per task (llama.cpp's flash-decoding split); each chunk keeps its own
max, sum and weighted values per query head, and the chunks are merged at the end. Each K and V
row is widened once and used by every query head of its KV group.

Measured against the NumPy/BLAS path on this project's 2-core machine (one layer, f16 cache):
SmolLM2's shape (9 heads over 3, d 64) at 4096 cells 0.27 ms against 0.97 ms; Gemma 3's (4 over
1, d 256) 0.32 ms against 1.10 ms. The widened values equal NumPy's f16 → f32 cast bit for bit.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .cache import cached, parallel_and_serial, specialize
from .dequant import CONVERTERS
from .ir import I32, I64, LANES, VF32, arrays, fma, prefetch, reduce_add, splat, widen_halves
from .scalar import FAST, as_f32, fast_exp

# Cells per chunk of attend_rows: a whole number of chunks per task (two tasks per thread) where
# the rows keep enough cells.
ATTN_CHUNK_MIN, ATTN_CHUNK_MAX = 64, 512


# ---- vector-coded cache reads (LLVM IR, like matvec_float's row dots) ---------------------------
# A cache row's head segment is read 16 values at a time; segments whose length is not a multiple
# of 16 take the plain loops in _attend_chunk instead.

VI16 = ir.VectorType(ir.IntType(16), LANES)


def _load_values(builder, base, index, dtype):
    """16 cache values at base[index:] as floats: f32 as stored, f16 bits widened."""
    p = builder.gep(base, [index])
    if dtype == types.float32:
        return builder.load(builder.bitcast(p, VF32.as_pointer()), align=4)
    return widen_halves(builder, builder.load(builder.bitcast(p, VI16.as_pointer()), align=2))


def _cell_base(builder, rows, cells, j, col):
    """The flat index of rows[cells[j], col]."""
    c = builder.sext(builder.load(builder.gep(cells.data, [j])), I64)
    return builder.add(builder.mul(c, builder.extract_value(rows.shape, 1)), col)


CELLS_PER_STEP = 4  # cells whose dots run side by side (independent accumulators)


def _element_size(context, dtype) -> int:
    return context.get_abi_sizeof(context.get_data_type(dtype))


def _prefetch_next_slice(builder, rows, base, n_values, size: int):
    """Ask for the n_values (of `size` bytes) after rows' flat element `base`: the next KV head's
    slice of the same cell, which the next pass over the chunk reads. A decode at depth streams the
    cache from DRAM at a row's stride, one head at a time; asked for a pass ahead, the next pass
    finds its slices in cache (LFM2-350M-shaped, 8192 cells: 7-13 GB/s before, 14-18 after)."""
    start = builder.bitcast(builder.gep(rows.data, [builder.add(base, n_values)]), ir.IntType(8).as_pointer())
    n_lines = builder.udiv(builder.add(builder.mul(n_values, ir.Constant(I64, size)), ir.Constant(I64, 63)),
                           ir.Constant(I64, 64))
    with cgutils.for_range(builder, n_lines) as line:
        prefetch(builder, builder.gep(start, [builder.mul(line.index, ir.Constant(I64, 64))]), locality=2)


def _halves(builder, a, b, width):
    """Lanes of a and b paired group by group: the first and the second half of every `width`
    lanes, as two vectors (a's groups, then b's)."""
    n = a.type.count
    first = [g + i for g in range(0, n, width) for i in range(width // 2)]
    second = [g + width // 2 + i for g in range(0, n, width) for i in range(width // 2)]
    pick = lambda idx: builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(idx)), idx))  # noqa: E731
    return pick(first + [n + i for i in first]), pick(second + [n + i for i in second])


def _reduce_four(builder, vectors):
    """The lane sums of four 16-lane vectors as one <4 x float>: pairs folded into each other
    (15 shuffles and adds instead of four separate trees of 8)."""
    a, b, c, d = vectors
    ab = builder.fadd(*_halves(builder, a, b, 16))  # a's 8 partial sums, then b's
    cd = builder.fadd(*_halves(builder, c, d, 16))
    abcd = builder.fadd(*_halves(builder, ab, cd, 8))  # 4 partial sums each
    return _add_adjacent(builder, _add_adjacent(builder, abcd))


def _add_adjacent(builder, v):
    """Lanes 2i and 2i + 1 added: a vector half as long."""
    n = v.type.count // 2
    pick = lambda start: builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(start, 2 * n, 2))))  # noqa: E731
    return builder.fadd(pick(0), pick(1))


MAX_GROUP = 4  # query heads of one KV head handled together (their accumulators fit the registers)


def _row_ptr(builder, arr, row):
    """Pointer to arr[row, 0] of a C-contiguous 2-D float32 array."""
    return builder.gep(arr.data, [builder.mul(row, builder.extract_value(arr.shape, 1))])


def _group_arrays(context, builder, sig, args, n_heads: int):
    """The arrays of a call (out, a, h0, rows, cells, j0, j1, col, origin) of the intrinsics below: out and
    a with the pointers to their rows h0 .. h0 + n_heads - 1, then rows and cells."""
    out, a, rows, cells = arrays(context, builder, [sig.args[i] for i in (0, 1, 3, 4)], [args[i] for i in (0, 1, 3, 4)])
    heads = [builder.add(args[2], ir.Constant(I64, g)) for g in range(n_heads)]
    return out, a, [_row_ptr(builder, out, h) for h in heads], [_row_ptr(builder, a, h) for h in heads], rows, cells


def _scores_intrinsic(n_heads: int):
    @intrinsic
    def scores_into(typingctx, s, q, h0, rows, cells, j0, j1, col, origin):
        """s[h0 + g, j - origin] = q[h0 + g] · rows[cells[j], col:col + D] for g < n_heads and j in
        [j0, j1), D = q.shape[1] a multiple of 16; rows f32 or f16 bits (uint16), C-contiguous.
        Each K slice is widened once for the heads; four cells' dots run side by side."""
        def codegen(context, builder, sig, args):
            s_arr, q_arr, s_rows, q_rows, r_arr, c_arr = _group_arrays(context, builder, sig, args, n_heads)
            j0_, j1_, col_, origin = args[5:9]
            n16 = builder.udiv(builder.extract_value(q_arr.shape, 1), ir.Constant(I64, LANES))
            n_steps = builder.udiv(builder.sub(j1_, j0_), ir.Constant(I64, CELLS_PER_STEP))
            dtype = sig.args[3].dtype

            n_values = builder.extract_value(q_arr.shape, 1)

            def dots(first, count):
                bases = [_cell_base(builder, r_arr, c_arr, builder.add(first, ir.Constant(I64, i)), col_)
                         for i in range(count)]
                for base in bases:
                    _prefetch_next_slice(builder, r_arr, base, n_values, _element_size(context, dtype))
                accs = [[cgutils.alloca_once_value(builder, ir.Constant(VF32, None)) for _ in range(count)]
                        for _ in q_rows]
                with cgutils.for_range(builder, n16) as loop:
                    off = builder.mul(loop.index, ir.Constant(I64, LANES))
                    keys = [_load_values(builder, r_arr.data, builder.add(base, off), dtype) for base in bases]
                    for q_row, head_accs in zip(q_rows, accs):
                        qv = builder.load(builder.bitcast(builder.gep(q_row, [off]), VF32.as_pointer()), align=4)
                        for kv, acc in zip(keys, head_accs):
                            builder.store(fma(builder, kv, qv, builder.load(acc)), acc)
                at = builder.sub(first, origin)
                for s_row, head_accs in zip(s_rows, accs):
                    out = builder.gep(s_row, [at])
                    if count == 1:
                        builder.store(reduce_add(builder, builder.load(head_accs[0])), out)
                    else:
                        sums = _reduce_four(builder, [builder.load(acc) for acc in head_accs])
                        builder.store(sums, builder.bitcast(out, sums.type.as_pointer()), align=4)

            with cgutils.for_range(builder, n_steps) as step:
                dots(builder.add(j0_, builder.mul(step.index, ir.Constant(I64, CELLS_PER_STEP))), CELLS_PER_STEP)
            tail = builder.add(j0_, builder.mul(n_steps, ir.Constant(I64, CELLS_PER_STEP)))
            with cgutils.for_range_slice(builder, tail, j1_, ir.Constant(I64, 1)) as (j, _):
                dots(j, 1)
            return context.get_dummy_value()

        return types.none(s, q, types.int64, rows, cells, types.int64, types.int64, types.int64, types.int64), codegen

    return scores_into


SLICES_PER_PASS = 4  # 16-value slices of the output rows kept in registers over a chunk's cells


def _values_intrinsic(n_heads: int):
    @intrinsic
    def values_into(typingctx, acc, p, h0, rows, cells, j0, j1, col, origin):
        """acc[h0 + g] += sum over j in [j0, j1) of p[h0 + g, j - origin] · rows[cells[j], col:col + Dv]
        for g < n_heads, Dv = acc.shape[1] a multiple of 16. The output rows are held in registers,
        a few slices at a time, and each V slice is widened once for the heads."""
        def codegen(context, builder, sig, args):
            a_arr, p_arr, a_rows, p_rows, r_arr, c_arr = _group_arrays(context, builder, sig, args, n_heads)
            j0_, j1_, col_, origin = args[5:9]
            n16 = builder.udiv(builder.extract_value(a_arr.shape, 1), ir.Constant(I64, LANES))
            n_passes = builder.udiv(n16, ir.Constant(I64, SLICES_PER_PASS))
            dtype = sig.args[3].dtype

            def accumulate(first_slice, count):
                offs = [builder.mul(builder.add(first_slice, ir.Constant(I64, i)), ir.Constant(I64, LANES))
                        for i in range(count)]
                ptrs = [[builder.bitcast(builder.gep(a_row, [o]), VF32.as_pointer()) for o in offs] for a_row in a_rows]
                accs = [[cgutils.alloca_once_value(builder, builder.load(ptr, align=4)) for ptr in head_ptrs]
                        for head_ptrs in ptrs]
                with cgutils.for_range_slice(builder, j0_, j1_, ir.Constant(I64, 1)) as (j, _):
                    base = _cell_base(builder, r_arr, c_arr, j, col_)
                    _prefetch_next_slice(builder, r_arr, base, builder.extract_value(a_arr.shape, 1),
                                         _element_size(context, dtype))
                    values = [_load_values(builder, r_arr.data, builder.add(base, o), dtype) for o in offs]
                    for p_row, head_accs in zip(p_rows, accs):
                        pv = splat(builder, builder.load(builder.gep(p_row, [builder.sub(j, origin)])))
                        for vv, acc in zip(values, head_accs):
                            builder.store(fma(builder, pv, vv, builder.load(acc)), acc)
                for head_ptrs, head_accs in zip(ptrs, accs):
                    for ptr, acc in zip(head_ptrs, head_accs):
                        builder.store(builder.load(acc), ptr, align=4)

            with cgutils.for_range(builder, n_passes) as pass_:
                accumulate(builder.mul(pass_.index, ir.Constant(I64, SLICES_PER_PASS)), SLICES_PER_PASS)
            with cgutils.for_range_slice(builder, builder.mul(n_passes, ir.Constant(I64, SLICES_PER_PASS)), n16,
                                         ir.Constant(I64, 1)) as (sl, _):
                accumulate(sl, 1)
            return context.get_dummy_value()

        return types.none(acc, p, types.int64, rows, cells, types.int64, types.int64, types.int64, types.int64), codegen

    return values_into


scores_1, scores_2, scores_3, scores_4 = (_scores_intrinsic(n) for n in range(1, MAX_GROUP + 1))
values_1, values_2, values_3, values_4 = (_values_intrinsic(n) for n in range(1, MAX_GROUP + 1))


@njit(inline="always")
def _for_group(ops, n, out, a, h0, rows, cells, j0, j1, col, origin):
    """ops[n - 1](out, a, ...) for a group of n query heads, ops the intrinsics for 1..MAX_GROUP
    heads (numba cannot pick an intrinsic from a tuple at run time: one branch per group size)."""
    if n == 4:
        ops[3](out, a, h0, rows, cells, j0, j1, col, origin)
    elif n == 3:
        ops[2](out, a, h0, rows, cells, j0, j1, col, origin)
    elif n == 2:
        ops[1](out, a, h0, rows, cells, j0, j1, col, origin)
    else:
        ops[0](out, a, h0, rows, cells, j0, j1, col, origin)


@cached()
def kept_cells(mask):
    """Each row's finite mask columns, in ascending order: (cells (T, n) padded with 0, count (T,))."""
    T, N = mask.shape
    count = np.zeros(T, dtype=np.int64)
    cells = np.zeros((T, N), dtype=np.int32)
    for t in range(T):
        for c in range(N):
            if mask[t, c] != -np.inf:
                cells[t, count[t]] = c
                count[t] += 1
    return cells[:, :max(1, count.max())].copy(), count  # contiguous: one compiled attend_rows for any rows


@cached()
def _chunk_plan(count, n_tasks, H, Dv):
    """How attend_rows cuts the rows' kept cells (count (T,) of them) into chunks: about n_tasks
    jobs over all the rows, each of ATTN_CHUNK_MIN to ATTN_CHUNK_MAX cells; and each chunk's
    running max, sum and weighted values per query row and head."""
    T = count.shape[0]
    longest = max(1, count.max())
    per_row = max(1, -(-n_tasks // T))  # chunks of a row, so that all the rows make about n_tasks jobs
    rounds = max(1, -(-longest // (per_row * ATTN_CHUNK_MAX)))  # a whole number per task: threads end together
    chunk = max(ATTN_CHUNK_MIN, -(-longest // (per_row * rounds)))
    n_chunks = (longest + chunk - 1) // chunk
    chunk_max = np.full((n_chunks, T, H), -np.inf, dtype=np.float32)
    chunk_sum = np.zeros((n_chunks, T, H), dtype=np.float32)
    chunk_acc = np.zeros((n_chunks, T, H, Dv), dtype=np.float32)
    return chunk, chunk_max, chunk_sum, chunk_acc


@njit(inline="always")
def _widen(rows, c, col, n, out):
    """rows[c, col:col + n] (f32, or f16 bits) as float32 into out[:n]."""
    for d in range(n):
        out[d] = as_f32(rows[c, col + d])


@njit(inline="always")
def _each_group(ops, n_head, group, width, out, a, rows, cells, j0, j1, origin):
    """The intrinsics `ops` over every KV head's `group` query heads, up to MAX_GROUP at a time (the
    KV head's slice of a row starts at its index times `width`)."""
    for h0 in range(0, n_head, group):
        for g0 in range(0, group, MAX_GROUP):
            _for_group(ops, min(MAX_GROUP, group - g0), out, a, h0 + g0, rows, cells, j0, j1, (h0 // group) * width,
                       origin)


@njit(inline="always")
def _chunk_scores(s, q, k, kcells, j0, j1, origin, n_head_kv, row):
    """s[h, j - origin] = q[h] · (row kcells[j] of k, KV head h's slice) for j in [j0, j1): with
    head sizes that are multiples of 16 vector-coded (scores_*: a KV head's query heads, up to
    MAX_GROUP at a time), otherwise plain loops, each K row widened once for its query heads."""
    H, D = q.shape
    G = H // n_head_kv
    if D % 16 == 0:
        _each_group((scores_1, scores_2, scores_3, scores_4), H, G, D, s, q, k, kcells, j0, j1, origin)
        return
    for j in range(j0, j1):
        for hk in range(n_head_kv):
            _widen(k, kcells[j], hk * D, D, row)
            for h in range(hk * G, hk * G + G):
                acc = np.float32(0)
                for d in range(D):
                    acc += q[h, d] * row[d]
                s[h, j - origin] = acc


@njit(inline="always")
def _chunk_values(acc, p, v, vcells, j0, j1, origin, n_head_kv, row):
    """acc[h] += Σ_j p[h, j - origin] · (row vcells[j] of v, KV head h's slice), as _chunk_scores."""
    H, Dv = acc.shape
    G = H // n_head_kv
    if Dv % 16 == 0:
        _each_group((values_1, values_2, values_3, values_4), H, G, Dv, acc, p, v, vcells, j0, j1, origin)
        return
    for j in range(j0, j1):
        for hk in range(n_head_kv):
            _widen(v, vcells[j], hk * Dv, Dv, row)
            for h in range(hk * G, hk * G + G):
                w = p[h, j - origin]
                for d in range(Dv):
                    acc[h, d] += w * row[d]


@njit(inline="always")
def _chunk_softmax(s, mk, n, scale, softcap, slopes, m_out, sum_out):
    """Scale, softcap and slope·mask the n scores of each head's row of s, then make them the
    chunk's softmax numerators; the chunk's max and sum per head into m_out, sum_out (a head
    whose cells are all masked keeps -inf and zeros)."""
    for h in range(s.shape[0]):  # branch-free loops
        if softcap != 0:
            for j in range(n):
                s[h, j] = softcap * np.tanh(s[h, j] * scale / softcap)
        else:
            for j in range(n):
                s[h, j] *= scale
        top = np.float32(-np.inf)
        for j in range(n):
            x = s[h, j] + slopes[h] * mk[j]
            s[h, j] = x
            top = max(top, x)
        if top == -np.inf:
            s[h, :] = 0
            continue
        total = np.float32(0)
        for j in range(n):
            p = fast_exp(s[h, j] - top)
            s[h, j] = p
            total += p
        m_out[h] = top
        sum_out[h] = total


@cached(fastmath=FAST)
def _attend_chunk(t, ci, chunk, q, k, v, n_head_kv, mask, cells, count, scale, softcap, slopes, chunk_max, chunk_sum,
                  chunk_acc):
    """Chunk ci of row t over f32 or f16 rows, read where they lie: scores, the chunk's softmax
    numerators, weighted values (the output rows held in registers over the chunk)."""
    j0 = ci * chunk
    j1 = min(count[t], j0 + chunk)
    if j1 > j0:
        s = np.empty((q.shape[1], chunk), dtype=np.float32)
        mk = np.empty(chunk, dtype=np.float32)
        row = np.empty(max(q.shape[2], chunk_acc.shape[3]), dtype=np.float32)
        kept = cells[t]
        _chunk_scores(s, q[t], k, kept, j0, j1, j0, n_head_kv, row)
        for j in range(j0, j1):  # the kept cells' mask values, gathered once for every head
            mk[j - j0] = mask[t, kept[j]]
        _chunk_softmax(s, mk, j1 - j0, scale, softcap, slopes, chunk_max[ci, t], chunk_sum[ci, t])
        _chunk_values(chunk_acc[ci, t], s, v, kept, j0, j1, j0, n_head_kv, row)


# Cells of a chunk whose block rows are unpacked at a time (a few KiB of floats per KV row: they
# stay in L1/L2 between the unpack and their use).
UNPACK_CELLS = 32
# The row types attend_blocks reads, by ggml type id: the cache's block types, and f32/f16 for a
# K or V cache beside one of them.
ROW_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL")
(unpack_f32, unpack_f16, unpack_bf16, unpack_q8_0, unpack_q4_0, unpack_q4_1, unpack_q5_0, unpack_q5_1,
 unpack_iq4_nl) = (CONVERTERS[name] for name in ROW_TYPES)
F32_, F16_, BF16_, Q8_0_, Q4_0_, Q4_1_, Q5_0_, Q5_1_, IQ4_NL_ = (int(GGMLQuantizationType[name]) for name in ROW_TYPES)


@njit(inline="always")
def _unpack(kind, row, out):
    """One cell's row of ggml type id `kind` (its bytes) as float32 values into out. One kernel
    for every type, the type picked per row: a kernel per type pair would compile for minutes."""
    if kind == Q8_0_:
        unpack_q8_0(row, out)
    elif kind == F16_:
        unpack_f16(row, out)
    elif kind == BF16_:
        unpack_bf16(row, out)
    elif kind == Q4_0_:
        unpack_q4_0(row, out)
    elif kind == Q4_1_:
        unpack_q4_1(row, out)
    elif kind == Q5_0_:
        unpack_q5_0(row, out)
    elif kind == Q5_1_:
        unpack_q5_1(row, out)
    elif kind == IQ4_NL_:
        unpack_iq4_nl(row, out)
    else:
        unpack_f32(row, out)


@cached(fastmath=FAST)
def _attend_chunk_blocks(t, ci, chunk, q, k, v, kinds, mask, cells, count, scale, softcap, slopes, chunk_max,
                         chunk_sum, chunk_acc):
    """_attend_chunk over rows kept as ggml blocks (k, v the bytes of each cell's row, of ggml
    type ids kinds[0] and kinds[1]; kinds[2] the KV heads): the chunk's cells are unpacked
    UNPACK_CELLS at a time into a small float buffer right before the scores or the weighted
    values use them, so the cache is read once, where it lies, and never converted as a whole."""
    j0 = ci * chunk
    j1 = min(count[t], j0 + chunk)
    if j1 > j0:
        H, D, Dv, n_head_kv = q.shape[1], q.shape[2], chunk_acc.shape[3], kinds[2]
        s = np.empty((H, chunk), dtype=np.float32)
        mk = np.empty(chunk, dtype=np.float32)
        row = np.empty(max(D, Dv), dtype=np.float32)
        k_rows = np.empty((UNPACK_CELLS, n_head_kv * D), dtype=np.float32)
        v_rows = np.empty((UNPACK_CELLS, n_head_kv * Dv), dtype=np.float32)
        slot = np.empty(chunk, dtype=np.int32)  # cell j0 + i sits in row slot[i] of the buffers
        for i in range(chunk):
            slot[i] = i % UNPACK_CELLS
        kept = cells[t]
        for a in range(0, j1 - j0, UNPACK_CELLS):
            b = min(j1 - j0, a + UNPACK_CELLS)
            for i in range(a, b):
                _unpack(kinds[0], k[kept[j0 + i]], k_rows[i - a])
            _chunk_scores(s, q[t], k_rows, slot, a, b, 0, n_head_kv, row)
        for j in range(j0, j1):
            mk[j - j0] = mask[t, kept[j]]
        _chunk_softmax(s, mk, j1 - j0, scale, softcap, slopes, chunk_max[ci, t], chunk_sum[ci, t])
        for a in range(0, j1 - j0, UNPACK_CELLS):
            b = min(j1 - j0, a + UNPACK_CELLS)
            for i in range(a, b):
                _unpack(kinds[1], v[kept[j0 + i]], v_rows[i - a])
            _chunk_values(chunk_acc[ci, t], s, v_rows, slot, a, b, 0, n_head_kv, row)


@cached(fastmath=FAST)
def _merge_chunks(chunk_max, chunk_sum, chunk_acc, sinks, use_sinks, out):
    n_chunks, T, H, Dv = chunk_acc.shape
    for t in range(T):
        for h in range(H):
            out[t, h, :] = 0
            m = -np.inf
            for ci in range(n_chunks):
                m = max(m, chunk_max[ci, t, h])
            if m == -np.inf:
                continue
            if use_sinks:
                m = max(m, sinks[h])
            total = np.float32(0)
            for ci in range(n_chunks):
                if chunk_max[ci, t, h] == -np.inf:
                    continue
                a = fast_exp(chunk_max[ci, t, h] - m)
                total += a * chunk_sum[ci, t, h]
                for d in range(Dv):
                    out[t, h, d] += a * chunk_acc[ci, t, h, d]
            if use_sinks:
                total += fast_exp(sinks[h] - m)
            for d in range(Dv):
                out[t, h, d] /= total


ATTEND_CHUNK = _attend_chunk  # the chunk kernel of each attend_rows copy


def attend_rows(q, k, v, n_head_kv, mask, cells, count, scale, softcap, slopes, sinks, use_sinks, n_tasks, out):
    """out (T, H, Dv) = softmax(softcap(q·kᵀ·scale) + slope·mask)·v for q (T, H, D) f32 and cache
    rows k (N, n_head_kv·D), v (N, n_head_kv·Dv) as float32 or f16 bits (uint16); mask (T, N);
    slopes (H,); sinks (H,) join each head's softmax when use_sinks. A fully masked row gives zeros.
    (attend_blocks: the same over rows of ggml blocks, n_head_kv then (K type, V type, KV heads).)

    Only the cells a row keeps are visited: `cells, count` list each row's finite mask columns
    (kept_cells), and every row's list is cut into chunks, so a sparse mask, or rows of several
    sequences side by side, cost what they keep; a job is one chunk of one row, about n_tasks
    jobs in all, so the threads share the work however the kept cells lie."""
    chunk, chunk_max, chunk_sum, chunk_acc = _chunk_plan(count, n_tasks, q.shape[1], out.shape[2])
    n_chunks, T = chunk_max.shape[0], chunk_max.shape[1]
    for job in prange(n_chunks * T):
        ATTEND_CHUNK(job % T, job // T, chunk, q, k, v, n_head_kv, mask, cells, count, scale, softcap, slopes,
                     chunk_max, chunk_sum, chunk_acc)
    _merge_chunks(chunk_max, chunk_sum, chunk_acc, sinks, use_sinks, out)


_template = attend_rows
# the serial twins for short caches (one chunk)
attend_rows, attend_rows_serial = parallel_and_serial(_template, fastmath=FAST)
attend_blocks = specialize(_template, "attend_blocks", {"ATTEND_CHUNK": _attend_chunk_blocks}, parallel=True,
                           fastmath=FAST)
attend_blocks_serial = specialize(_template, "attend_blocks_serial", {"ATTEND_CHUNK": _attend_chunk_blocks},
                                  fastmath=FAST)


# ---- a prompt tile's online-softmax step (the matmuls around it are BLAS) ---------------------

@cached(fastmath=FAST)
def softmax_block(s, mask, scale, softcap, slopes, m, l, alpha):
    """One key block of a query tile, for flash attention's online softmax: s (B, N) raw q·k
    scores of B = H·R rows (head-major, R = mask rows), mask (R, N), slopes (H,); m, l, alpha (B,)
    the running max and sum (updated) and the factor the running output must be scaled by.
    s becomes the block's numerators. One fused pass per row instead of NumPy's eight, on one
    thread: it runs between BLAS calls, and numba's workers would spin against BLAS's."""
    R, N = mask.shape
    for i in range(s.shape[0]):
        r, slope, top = i % R, slopes[i // R], m[i]
        if softcap != 0:
            for c in range(N):
                s[i, c] = softcap * np.tanh(s[i, c] * scale / softcap)
        else:
            for c in range(N):
                s[i, c] *= scale
        for c in range(N):
            x = s[i, c] + slope * mask[r, c]
            s[i, c] = x
            top = max(top, x)
        shift = top if top != -np.inf else np.float32(0)
        total = np.float32(0)
        for c in range(N):
            p = fast_exp(s[i, c] - shift)
            s[i, c] = p
            total += p
        alpha[i] = fast_exp(m[i] - shift)
        l[i] = l[i] * alpha[i] + total
        m[i] = top


# ---- block top-k (memory/masks.py's BlockTopK and BlockBounds, fused for the CPU) -------------

@cached(fastmath=FAST)
def _topk_row(t, q, base, pos, cell_pos, lo, hi, topk, block, local, out):
    """One row of block_topk_mask."""
    H, D = q.shape[1], q.shape[2]
    N = base.shape[1]
    n_blocks = lo.shape[0]
    Hkv = lo.shape[1] // D
    G = H // Hkv
    n_pick = min(topk // block, n_blocks)
    seen = np.zeros(n_blocks, dtype=np.bool_)
    far = np.zeros(n_blocks, dtype=np.bool_)  # has a visible cell outside the local window
    n_visible = 0
    for b in range(n_blocks):  # block by block: no division per cell
        for c in range(b * block, min(N, (b + 1) * block)):
            if base[t, c] != -np.inf:
                n_visible += 1
                seen[b] = True
                if pos[t] - cell_pos[c] >= local:
                    far[b] = True
    if n_visible <= topk:
        out[t, :] = base[t, :]
        return
    q_pos = np.zeros(Hkv * D, dtype=np.float32)
    q_neg = np.zeros(Hkv * D, dtype=np.float32)
    for hk in range(Hkv):
        for g in range(G):
            for d in range(D):
                x = q[t, hk * G + g, d]
                if x > 0:
                    q_pos[hk * D + d] += x
                else:
                    q_neg[hk * D + d] += x
    score = np.full(n_blocks, -np.inf, dtype=np.float32)
    sink = True
    for b in range(n_blocks):
        if not seen[b]:
            continue
        if sink:
            score[b] = np.inf
            sink = False
            continue
        if not far[b]:
            continue  # kept as local cells anyway: no pick spent on it
        acc = np.float32(0)
        for j in range(lo.shape[1]):
            acc += q_pos[j] * hi[b, j] + q_neg[j] * lo[b, j]
        score[b] = acc
    chosen = np.zeros(n_blocks, dtype=np.bool_)
    order = np.argsort(-score, kind="mergesort")  # stable: ties to the lower block
    for i in range(n_pick):
        chosen[order[i]] = seen[order[i]]
    for b in range(n_blocks):
        for c in range(b * block, min(N, (b + 1) * block)):
            keep = chosen[b] or pos[t] - cell_pos[c] < local
            out[t, c] = base[t, c] if keep else -np.inf


def block_topk_mask(q, base, pos, cell_pos, lo, hi, topk, block, local, out):
    """out (T, N) = base (T, N) with the cells each row drops set to -inf, as BlockTopK does it:
    a row that sees ≤ topk cells keeps them all; else it keeps its first visible block (the
    sink), its best topk/block - 1 other visible blocks by Σ_heads,d max(q·lo, q·hi) against the
    block bounds lo, hi (n_blocks, Hkv·D), and the cells less than `local` positions behind it.
    Blocks whose visible cells are all local are not ranked (they are kept anyway).
    q (T, H, D) f32; pos (T,), cell_pos (N,) int; ties go to the lower block."""
    for t in prange(q.shape[0]):
        _topk_row(t, q, base, pos, cell_pos, lo, hi, topk, block, local, out)


# the serial twin for a decoded row or two (waking the pool costs more)
block_topk_mask, block_topk_mask_serial = parallel_and_serial(block_topk_mask, fastmath=FAST)


@cached()
def refresh_block_bounds(keys, cell_pos, seen_pos, stale, block, n_blocks, lo, hi):
    """Bring the block bounds lo, hi (n_blocks_total, W) of one stream up to date: a block is
    stale when marked so (a key write) or when one of its cells changed position since
    `seen_pos` (an edit, a shift, eviction); each stale block among the first n_blocks gets the
    elementwise min and max of keys (N, W) (f32, or f16 bits as uint16) over its occupied cells
    (cell_pos ≥ 0), zeros when it has none. seen_pos and stale are updated in place."""
    N, W = keys.shape
    for c in range(N):
        if cell_pos[c] != seen_pos[c]:
            stale[c // block] = True
            seen_pos[c] = cell_pos[c]
    for b in range(n_blocks):
        if not stale[b]:
            continue
        stale[b] = False
        lo[b, :] = np.inf
        hi[b, :] = -np.inf
        empty = True
        for c in range(b * block, min(N, (b + 1) * block)):
            if cell_pos[c] < 0:
                continue
            empty = False
            for j in range(W):
                x = as_f32(keys[c, j])
                lo[b, j] = min(lo[b, j], x)
                hi[b, j] = max(hi[b, j], x)
        if empty:
            lo[b, :] = 0
            hi[b, :] = 0
