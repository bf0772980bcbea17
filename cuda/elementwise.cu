// Row-wise and element-wise ops of a transformer layer: RMSNorm, RoPE, softmax, gated activations,
// rows in and out of tables and caches, and the arg-max that greedy sampling needs.
#include "common.cuh"

// y = x / sqrt(mean(x^2) + eps) * w, one block per row (w may be null). w holds w_rows rows of ncols:
// row r uses w's row r % w_rows (grouped norms: x (tokens, groups, ncols), w (groups, ncols)).
extern "C" __global__ void rms_norm_f32(const float * x, const float * w, float * y, int ncols, int w_rows, float eps) {
    __shared__ float scratch[32];
    const float * row = x + (long long) blockIdx.x * ncols;
    float * out = y + (long long) blockIdx.x * ncols;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += row[i] * row[i];
    const float scale = rsqrtf(block_sum(sum, scratch) / ncols + eps);
    const float * wrow = w ? w + (long long) (blockIdx.x % w_rows) * ncols : nullptr;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) out[i] = row[i] * scale * (wrow ? wrow[i] : 1.0f);
}

// Layer norm without affine: (x - mean) / sqrt(var + eps).
extern "C" __global__ void norm_f32(const float * x, float * y, int ncols, float eps) {
    __shared__ float scratch[32];
    const float * row = x + (long long) blockIdx.x * ncols;
    float * out = y + (long long) blockIdx.x * ncols;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) sum += row[i];
    const float mean = block_sum(sum, scratch) / ncols;
    float var = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) var += (row[i] - mean) * (row[i] - mean);
    const float scale = rsqrtf(block_sum(var, scratch) / ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) out[i] = (row[i] - mean) * scale;
}

// RoPE on x (n_tokens, n_head, head_dim): the first n_rot dims rotate by pos * freq_scale * base^(-2i/n_rot);
// normal mode pairs (2i, 2i+1), NEOX mode pairs (i, i + n_rot/2). One block per (token, head).
// YaRN (ext_factor != 0, ggml's rope_yarn): pair i's angle mixes the interpolated and the extrapolated
// one by ext_factor times a ramp falling from 1 to 0 over the pairs corr_lo..corr_hi; cos and sin times mscale.
extern "C" __global__ void rope_f32(const float * x, float * y, const int * pos, int n_head, int head_dim,
                                    int n_rot, float freq_base, float freq_scale, int neox, float ext_factor,
                                    float corr_lo, float corr_hi, float mscale) {
    const int token = blockIdx.x / n_head;
    const float * src = x + (long long) blockIdx.x * head_dim;
    float * dst = y + (long long) blockIdx.x * head_dim;
    const float p = (float) pos[token];
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        float theta = p * freq_scale * powf(freq_base, -2.0f * i / n_rot);
        if (ext_factor != 0.0f) {
            const float extrap = p * powf(freq_base, -2.0f * i / n_rot);
            const float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, (i - corr_lo) / fmaxf(0.001f, corr_hi - corr_lo)));
            const float mix = ramp * ext_factor;
            theta = freq_scale * extrap * (1.0f - mix) + extrap * mix;
        }
        float s, c;
        sincosf(theta, &s, &c);
        s *= mscale;
        c *= mscale;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
        const float a = src[i0], b = src[i1];
        dst[i0] = a * c - b * s;
        dst[i1] = a * s + b * c;
    }
    for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = src[i];
}

// softmax(x * scale + slope_h * mask) per row, rows grouped by head (x is (n_head, rows, ncols));
// a sink adds exp(sink_h) to the denominator only. mask (rows, ncols) and sinks may be null.
extern "C" __global__ void soft_max_f32(const float * x, const float * mask, const float * sinks, float * y,
                                        int rows, int ncols, float scale, float max_bias, float m0, float m1,
                                        int n_head_log2) {
    __shared__ float scratch[32];
    const int head = blockIdx.x / rows, r = blockIdx.x % rows;
    const float * row = x + (long long) blockIdx.x * ncols;
    const float * mrow = mask ? mask + (long long) r * ncols : nullptr;
    float * out = y + (long long) blockIdx.x * ncols;
    const float slope = alibi_slope(head, max_bias, m0, m1, n_head_log2);
    float m = -INFINITY;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = row[i] * scale + (mrow ? slope * mrow[i] : 0.0f);
        out[i] = v;
        m = fmaxf(m, v);
    }
    m = block_max(m, scratch);
    if (sinks) m = fmaxf(m, sinks[head]);
    if (m == -INFINITY) m = 0.0f;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float e = expf(out[i] - m);
        out[i] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    if (sinks) sum += expf(sinks[head] - m);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) out[i] *= inv;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

// Gated activations over a fused gate|up row: y[r, i] = act(h[r, i]) * h[r, n_ff + i].
extern "C" __global__ void swiglu_fused_f32(const float * h, float * y, int n_ff, long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / n_ff, c = i % n_ff;
    y[i] = silu(h[r * 2 * n_ff + c]) * h[r * 2 * n_ff + n_ff + c];
}

extern "C" __global__ void geglu_fused_f32(const float * h, float * y, int n_ff, long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / n_ff, c = i % n_ff;
    y[i] = gelu(h[r * 2 * n_ff + c]) * h[r * 2 * n_ff + n_ff + c];
}

extern "C" __global__ void silu_f32(const float * x, float * y, long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = silu(x[i]);
}

extern "C" __global__ void gelu_f32(const float * x, float * y, long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(x[i]);
}

// Rows of an f16 table as f32 (token embeddings): one block per requested row.
extern "C" __global__ void get_rows_f16(const __half * table, const int * ids, float * out, int ncols) {
    const __half * src = table + (long long) ids[blockIdx.x] * ncols;
    float * dst = out + (long long) blockIdx.x * ncols;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) dst[i] = __half2float(src[i]);
}

// f32 rows written into an f16 cache at row indices (the K/V store of a ubatch).
extern "C" __global__ void set_rows_f16(const float * src, const long long * idx, __half * dst, int ncols) {
    const float * row = src + (long long) blockIdx.x * ncols;
    __half * out = dst + idx[blockIdx.x] * ncols;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) out[i] = __float2half(row[i]);
}

// Index of the largest value of each row (first one on ties): greedy sampling without a host copy.
extern "C" __global__ void argmax_f32(const float * x, int ncols, int * out) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float * row = x + (long long) blockIdx.x * ncols;
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        if (row[i] > v) { v = row[i]; idx = i; }
    }
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, o);
        const int oi = __shfl_xor_sync(FULL_MASK, idx, o);
        if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
        v = lane < n_warps ? best_v[lane] : -INFINITY;
        idx = lane < n_warps ? best_i[lane] : 0x7fffffff;
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, v, o);
            const int oi = __shfl_xor_sync(FULL_MASK, idx, o);
            if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
        }
        if (lane == 0) out[blockIdx.x] = idx;
    }
}

// Inverse-CDF draw from unnormalized probabilities p of a candidate list: the first index whose
// running sum reaches u * total (one block; serial over warps of 1024 candidates at most per step).
extern "C" __global__ void sample_cdf_f32(const float * p, const int * ids, int n, float u, int * out) {
    __shared__ float scratch[32];
    __shared__ float base;
    __shared__ int found;
    float total = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) total += p[i];
    total = block_sum(total, scratch);
    const float target = u * total;
    if (threadIdx.x == 0) { base = 0.0f; found = n - 1; }
    __syncthreads();
    for (int start = 0; start < n; start += blockDim.x) {
        const int i = start + threadIdx.x;
        const float v = i < n ? p[i] : 0.0f;
        // inclusive scan of this chunk: warp shuffles, then warp totals through shared memory
        float x = v;
        const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
#pragma unroll
        for (int o = 1; o < WARP_SIZE; o <<= 1) {
            const float y = __shfl_up_sync(FULL_MASK, x, o);
            if (lane >= o) x += y;
        }
        __syncthreads();
        if (lane == WARP_SIZE - 1) scratch[warp] = x;
        __syncthreads();
        float warp_prefix = 0.0f;
        for (int w = 0; w < warp; ++w) warp_prefix += scratch[w];
        const float cum = base + warp_prefix + x;
        const int hit = i < n && cum >= target && cum - v < target;
        if (hit) atomicMin(&found, i);
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) base = cum;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = ids ? ids[found] : found;
}
