// Flash attention over an f16 KV cache: a split-KV "decode" kernel that packs the query heads sharing
// a KV head into one block (used for 1-8 query rows, and for sparse lists at any row count), the
// combine kernel that merges its splits, a FlashAttention-2-style WMMA prefill kernel for dense
// masks, and the sparse compaction kernel: each mask row to its ascending list of finite columns.
//
// Layouts (NumPy order): q (n_q, n_head, D) f32; k (n_kv, n_head_kv, D) and v (n_kv, n_head_kv, DV)
// f16 with row strides in elements; mask (n_q, n_kv) f32 of 0 / -inf (or ALiBi distances);
// sinks (n_head) f32; out (n_q, n_head, DV) f32. A fully masked row gives 0.
#include "common.cuh"
#include <mma.h>

#define DECODE_THREADS 128
#define DECODE_WARPS (DECODE_THREADS / WARP_SIZE)

struct AttnParams {
    int n_q, n_kv, n_head, n_head_kv;
    long long k_row, v_row;  // elements between consecutive KV rows
    float scale, softcap, max_bias, m0, m1;
    int n_head_log2;
};

// Kernel entry points take the parameters as scalars (what cupy.RawKernel passes) and pack them.
#define ATTN_PARAM_ARGS                                                                                   \
    int n_q, int n_kv, int n_head, int n_head_kv, long long k_row, long long v_row, float scale,          \
        float softcap, float max_bias, float m0, float m1, int n_head_log2
#define ATTN_PARAMS {n_q, n_kv, n_head, n_head_kv, k_row, v_row, scale, softcap, max_bias, m0, m1, n_head_log2}

// Score of one key for one head: softcap(q.k * scale) + slope * mask.
__device__ __forceinline__ float finish_score(float dot, const AttnParams & p, float slope, float mask_v) {
    float s = dot * p.scale;
    if (p.softcap != 0.0f) s = p.softcap * tanhf(s / p.softcap);
    return s + slope * mask_v;
}

// One block per (split, KV head, query row, head group): the HG query heads of the group read each
// K/V row of the split once. Each warp takes every 4th row; a lane holds D/32 and DV/32 dims.
// Partials (unnormalized acc, max, sum) go to part_acc/part_ml for fattn_combine. With `indices`
// (one list of `n_sel` cache rows per query row, -1 padded) the split walks list slots instead.
template <int D, int DV, int HG>
__device__ void decode_block(const float * q, const __half * k, const __half * v, const float * mask,
                             const int * indices, int n_sel, float * part_acc, float * part_ml,
                             const AttnParams p, int n_split) {
    static_assert(D % WARP_SIZE == 0 && DV % WARP_SIZE == 0, "head sizes are multiples of 32");
    constexpr int DL = D / WARP_SIZE, VL = DV / WARP_SIZE;
    __shared__ float q_s[HG][D];
    __shared__ float m_s[DECODE_WARPS][HG], l_s[DECODE_WARPS][HG];
    __shared__ float acc_s[DECODE_WARPS][HG][DV];

    // grid: x = KV split * head groups, y = KV head, z = query row
    const int hkv = blockIdx.y, row = blockIdx.z;
    const int group = p.n_head / p.n_head_kv;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int n_groups = (group + HG - 1) / HG;
    const int hg = blockIdx.x % n_groups;            // head group handled by this block
    const int s = blockIdx.x / n_groups;             // KV split index
    const int h_first = hkv * group + hg * HG;
    const int n_heads_here = min(HG, group - hg * HG);

    for (int i = threadIdx.x; i < HG * D; i += DECODE_THREADS) {
        const int g = i / D, d = i % D;
        q_s[g][d] = g < n_heads_here ? q[((long long) row * p.n_head + h_first + g) * D + d] : 0.0f;
    }
    __syncthreads();

    const int n_rows = indices ? n_sel : p.n_kv;
    const int per_split = (n_rows + n_split - 1) / n_split;
    const int r0 = s * per_split, r1 = min(n_rows, r0 + per_split);

    float slope[HG], m[HG], l[HG], acc[HG][VL];
#pragma unroll
    for (int g = 0; g < HG; ++g) {
        slope[g] = alibi_slope(h_first + g, p.max_bias, p.m0, p.m1, p.n_head_log2);
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < VL; ++j) acc[g][j] = 0.0f;
    }
    const float * mrow = mask ? mask + (long long) row * p.n_kv : nullptr;
    for (int r = r0 + warp; r < r1; r += DECODE_WARPS) {
        const int c = indices ? indices[(long long) row * n_sel + r] : r;
        const float mv = c < 0 ? -INFINITY : (mrow ? mrow[c] : 0.0f);
        if (mv == -INFINITY) continue;  // uniform across the warp
        const __half * krow = k + c * p.k_row + hkv * D;
        const __half * vrow = v + c * p.v_row + hkv * DV;
        float kv[DL];
#pragma unroll
        for (int j = 0; j < DL; ++j) kv[j] = __half2float(krow[lane + j * WARP_SIZE]);
        float vv[VL];
#pragma unroll
        for (int j = 0; j < VL; ++j) vv[j] = __half2float(vrow[lane + j * WARP_SIZE]);
#pragma unroll
        for (int g = 0; g < HG; ++g) {
            if (g >= n_heads_here) break;  // a group smaller than HG (SmolLM2's 3 of 16): no dots for absent heads
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < DL; ++j) dot += q_s[g][lane + j * WARP_SIZE] * kv[j];
            const float sc = finish_score(warp_sum(dot), p, slope[g], mv);
            const float m_new = fmaxf(m[g], sc);
            const float alpha = expf(m[g] - m_new);  // exp(-inf) = 0 on the first key
            const float pr = expf(sc - m_new);
            l[g] = l[g] * alpha + pr;
#pragma unroll
            for (int j = 0; j < VL; ++j) acc[g][j] = acc[g][j] * alpha + pr * vv[j];
            m[g] = m_new;
        }
    }
    // merge the warps of the block
#pragma unroll
    for (int g = 0; g < HG; ++g) {
        if (lane == 0) { m_s[warp][g] = m[g]; l_s[warp][g] = l[g]; }
#pragma unroll
        for (int j = 0; j < VL; ++j) acc_s[warp][g][lane + j * WARP_SIZE] = acc[g][j];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < HG * DV; i += DECODE_THREADS) {
        const int g = i / DV, d = i % DV;
        if (g >= n_heads_here) continue;
        float mx = -INFINITY;
        for (int w = 0; w < DECODE_WARPS; ++w) mx = fmaxf(mx, m_s[w][g]);
        float sum = 0.0f, a = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w) {
            const float f = mx == -INFINITY ? 0.0f : expf(m_s[w][g] - mx);
            sum += l_s[w][g] * f;
            a += acc_s[w][g][d] * f;
        }
        const long long slot = ((long long) row * p.n_head + h_first + g) * n_split + s;
        part_acc[slot * DV + d] = a;
        if (d == 0) { part_ml[slot * 2] = mx; part_ml[slot * 2 + 1] = sum; }
    }
}

#define DECODE_KERNEL(D, DV, HG)                                                                          \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                                         \
    fattn_decode_##D##_##DV##_##HG(const float * q, const __half * k, const __half * v, const float * mask, \
                                   const int * indices, int n_sel, float * part_acc, float * part_ml,     \
                                   int n_split, ATTN_PARAM_ARGS) {                                        \
        decode_block<D, DV, HG>(q, k, v, mask, indices, n_sel, part_acc, part_ml, ATTN_PARAMS, n_split); \
    }

// head sizes 64, 128, 256, 512 (DeepSeek-V4's one K=V head) and 576/512 (MLA); HG heads per block keep
// HG * DV / 32 floats per lane
DECODE_KERNEL(64, 64, 16)
DECODE_KERNEL(128, 128, 8)
DECODE_KERNEL(256, 256, 4)
DECODE_KERNEL(512, 512, 4)
DECODE_KERNEL(576, 512, 2)

// Merge the splits of each (query row, head): out = sum_i e^(m_i - M) acc_i / (sum_i e^(m_i - M) l_i
// + e^(sink - M)). One block per (row, head), DV threads (DV <= 1024).
extern "C" __global__ void fattn_combine(const float * part_acc, const float * part_ml, const float * sinks,
                                         float * out, int n_head, int n_split, int dv) {
    const long long rh = blockIdx.x;  // row * n_head + head
    const int head = rh % n_head;
    float mx = sinks ? sinks[head] : -INFINITY;
    for (int s = 0; s < n_split; ++s) mx = fmaxf(mx, part_ml[(rh * n_split + s) * 2]);
    float sum = sinks && mx != -INFINITY ? expf(sinks[head] - mx) : 0.0f;
    for (int s = 0; s < n_split; ++s) {
        const float ms = part_ml[(rh * n_split + s) * 2];
        sum += ms == -INFINITY ? 0.0f : part_ml[(rh * n_split + s) * 2 + 1] * expf(ms - mx);
    }
    for (int d = threadIdx.x; d < dv; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_split; ++s) {
            const float ms = part_ml[(rh * n_split + s) * 2];
            if (ms != -INFINITY) a += part_acc[(rh * n_split + s) * dv + d] * expf(ms - mx);
        }
        out[rh * dv + d] = sum > 0.0f ? a / sum : 0.0f;
    }
}

// Sparse compaction: for each group of `group` query rows, the ascending list of columns that any
// row of the group can see (finite mask), written to indices[list * cap ...] and padded with -1 to
// the capacity `cap`; counts[list] = min(found, cap). 256 threads: each warp ballots 32 columns at a
// time, warp totals are scanned in shared memory.
extern "C" __global__ void mask_to_indices(const float * mask, int n_q, int n_kv, int group, int cap,
                                           int * indices, int * counts) {
    __shared__ int warp_count[8];
    __shared__ int base;
    const int list = blockIdx.x, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int q0 = list * group, q1 = min(n_q, q0 + group);
    int * out = indices + (long long) list * cap;
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    for (int c0 = 0; c0 < n_kv; c0 += 256) {
        const int c = c0 + threadIdx.x;
        int selected = 0;
        if (c < n_kv) {
            for (int r = q0; r < q1 && !selected; ++r) selected = isfinite(mask[(long long) r * n_kv + c]);
        }
        const unsigned int ballot = __ballot_sync(FULL_MASK, selected);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int offset = base;
        for (int w = 0; w < warp; ++w) offset += warp_count[w];
        const int pos = offset + __popc(ballot & ((1u << lane) - 1));
        if (selected && pos < cap) out[pos] = c;
        __syncthreads();
        if (threadIdx.x == 0) for (int w = 0; w < 8; ++w) base += warp_count[w];
        __syncthreads();
    }
    const int found = min(base, cap);
    for (int i = found + threadIdx.x; i < cap; i += blockDim.x) out[i] = -1;  // branch-free padding for readers
    if (threadIdx.x == 0) counts[list] = found;
}

// ---- prefill: FlashAttention-2 tiles on tensor cores (WMMA 16x16x16, f16 in, f32 accumulate) ----
//
// One block per (64 query rows, head); each of the 4 warps owns 16 query rows. Per KV tile of 64
// rows: S = Q K^T (WMMA into shared memory), an online softmax per row, O = O * alpha + P V (WMMA,
// the running O kept in shared memory). Tiles whose mask is -inf for all 64 rows are skipped
// (the causal upper triangle). Sparse masks go to the decode kernel instead, one list per query row
// (a 64-row tile's union of random per-row lists is nearly the whole cache).

#define PF_ROWS 64
#define PF_TILE 64
#define PF_THREADS 128

using namespace nvcuda;

template <int D>
__device__ void prefill_block(const float * q, const __half * k, const __half * v, const float * mask,
                              const float * sinks, float * out, const AttnParams p) {
    extern __shared__ unsigned char smem_raw[];
    __half * q_s = reinterpret_cast<__half *>(smem_raw);      // [PF_ROWS][D]
    __half * k_s = q_s + PF_ROWS * D;                         // [PF_TILE][D]
    __half * v_s = k_s + PF_TILE * D;                         // [PF_TILE][D]
    __half * p_s = v_s + PF_TILE * D;                         // [PF_ROWS][PF_TILE]
    float * s_s = reinterpret_cast<float *>(p_s + PF_ROWS * PF_TILE);  // [PF_ROWS][PF_TILE]
    float * o_s = s_s + PF_ROWS * PF_TILE;                    // [PF_ROWS][D]
    float * m_s = o_s + PF_ROWS * D;                          // [PF_ROWS]
    float * l_s = m_s + PF_ROWS;                              // [PF_ROWS]
    int * col_s = reinterpret_cast<int *>(l_s + PF_ROWS);     // [PF_TILE]

    const int tile_q = blockIdx.x, head = blockIdx.y;
    const int hkv = head / (p.n_head / p.n_head_kv);
    const int row0 = tile_q * PF_ROWS;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const float slope = alibi_slope(head, p.max_bias, p.m0, p.m1, p.n_head_log2);

    for (int i = threadIdx.x; i < PF_ROWS * D; i += PF_THREADS) {
        const int r = i / D, d = i % D;
        const int qr = row0 + r;
        q_s[i] = __float2half(qr < p.n_q ? q[((long long) qr * p.n_head + head) * D + d] : 0.0f);
        o_s[i] = 0.0f;
    }
    for (int r = threadIdx.x; r < PF_ROWS; r += PF_THREADS) { m_s[r] = -INFINITY; l_s[r] = 0.0f; }
    __syncthreads();

    for (int t0 = 0; t0 < p.n_kv; t0 += PF_TILE) {
        // which cache rows this tile covers, and whether any query row of the block sees one of them
        for (int c = threadIdx.x; c < PF_TILE; c += PF_THREADS) {
            col_s[c] = t0 + c < p.n_kv ? t0 + c : -1;
        }
        __syncthreads();
        int live = 0;
        for (int i = threadIdx.x; i < PF_ROWS * PF_TILE; i += PF_THREADS) {
            const int r = i / PF_TILE, c = col_s[i % PF_TILE], qr = row0 + r;
            const float mv = (c < 0 || qr >= p.n_q) ? -INFINITY : (mask ? mask[(long long) qr * p.n_kv + c] : 0.0f);
            s_s[i] = mv;  // the mask value, until the scores are added below
            live |= mv != -INFINITY;
        }
        if (!__syncthreads_or(live)) continue;  // a barrier too: every thread takes the same branch
        for (int i = threadIdx.x; i < PF_TILE * D; i += PF_THREADS) {
            const int c = col_s[i / D], d = i % D;
            k_s[i] = c < 0 ? __float2half(0.0f) : k[c * p.k_row + hkv * D + d];
            v_s[i] = c < 0 ? __float2half(0.0f) : v[c * p.v_row + hkv * D + d];
        }
        __syncthreads();

        // S(16 rows of this warp x 64) = Q K^T, then add softcap(s * scale) to the mask values in s_s
        for (int n = 0; n < PF_TILE / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < D / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                wmma::load_matrix_sync(a, q_s + (warp * 16) * D + kk * 16, D);
                wmma::load_matrix_sync(b, k_s + (n * 16) * D + kk * 16, D);
                wmma::mma_sync(acc, a, b, acc);
            }
            __shared__ __align__(32) float tile_tmp[PF_THREADS / WARP_SIZE][16 * 16];
            wmma::store_matrix_sync(tile_tmp[warp], acc, 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += WARP_SIZE) {
                const int r = warp * 16 + e / 16, c = n * 16 + e % 16;
                float & cell = s_s[r * PF_TILE + c];
                cell = cell == -INFINITY ? -INFINITY : finish_score(tile_tmp[warp][e], p, slope, cell);
            }
            __syncwarp();
        }

        // online softmax per row (each warp: its 16 rows, two columns per lane)
        for (int rr = 0; rr < 16; ++rr) {
            const int r = warp * 16 + rr;
            const float a = s_s[r * PF_TILE + lane], b = s_s[r * PF_TILE + lane + 32];
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(a, b)));
            const float safe = m_new == -INFINITY ? 0.0f : m_new;
            const float pa = expf(a - safe), pb = expf(b - safe);
            p_s[r * PF_TILE + lane] = __float2half(pa);
            p_s[r * PF_TILE + lane + 32] = __float2half(pb);
            const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - safe);
            const float rowsum = warp_sum(pa + pb);
            for (int d = lane; d < D; d += WARP_SIZE) o_s[r * D + d] *= alpha;
            __syncwarp();
            if (lane == 0) { l_s[r] = l_s[r] * alpha + rowsum; m_s[r] = m_new; }
        }
        __syncwarp();

        // O(16 x D) += P(16 x 64) V(64 x D), accumulated in shared memory
        for (int n = 0; n < D / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, o_s + (warp * 16) * D + n * 16, D, wmma::mem_row_major);
            for (int kk = 0; kk < PF_TILE / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                wmma::load_matrix_sync(a, p_s + (warp * 16) * PF_TILE + kk * 16, PF_TILE);
                wmma::load_matrix_sync(b, v_s + (kk * 16) * D + n * 16, D);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(o_s + (warp * 16) * D + n * 16, acc, D, wmma::mem_row_major);
        }
        __syncthreads();
    }

    // normalize (sink in the denominator) and write the rows this block owns
    for (int i = threadIdx.x; i < PF_ROWS * D; i += PF_THREADS) {
        const int r = i / D, d = i % D, qr = row0 + r;
        if (qr >= p.n_q) continue;
        float sum = l_s[r];
        float mx = m_s[r];
        float scale_o = 1.0f;
        if (sinks) {
            const float sk = sinks[head];
            const float m_all = fmaxf(mx, sk);
            scale_o = mx == -INFINITY ? 0.0f : expf(mx - m_all);
            sum = sum * scale_o + expf(sk - m_all);
        }
        out[((long long) qr * p.n_head + head) * D + d] = sum > 0.0f ? o_s[i] * scale_o / sum : 0.0f;
    }
}

#define PREFILL_KERNEL(D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(PF_THREADS)                                             \
    fattn_prefill_##D(const float * q, const __half * k, const __half * v, const float * mask,           \
                      const float * sinks, float * out, ATTN_PARAM_ARGS) {                                 \
        prefill_block<D>(q, k, v, mask, sinks, out, ATTN_PARAMS);                                         \
    }

PREFILL_KERNEL(64)
PREFILL_KERNEL(128)
PREFILL_KERNEL(256)
