// State-space ops (Mamba): the causal depthwise conv and the selective scan, tokens in ubatch order
// with seq_index[t] the state row of token t's sequence. Both update the states in place; a thread
// owns one channel (conv) or one (head, head_dim) row of the scan and walks the tokens in order.
#include "common.cuh"

// x (T, C), state (S, K - 1, C), w (C, K), out (T, C): out[t, c] = sum_k window[k] * w[c, k] over
// window = (state[s, :, c], x[t, c]); then the window slides into state[s].
extern "C" __global__ void ssm_conv_f32(const float * x, float * state, const float * w, const long long * seq_index,
                                        float * out, int n_tokens, int n_ch, int d_conv) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_ch) return;
    const int k_last = d_conv - 1;
    for (int t = 0; t < n_tokens; ++t) {
        float * st = state + seq_index[t] * (long long) k_last * n_ch + c;
        const float xt = x[(long long) t * n_ch + c];
        float acc = 0.0f;
        for (int k = 0; k < k_last; ++k) acc += st[(long long) k * n_ch] * w[(long long) c * d_conv + k];
        acc += xt * w[(long long) c * d_conv + k_last];
        out[(long long) t * n_ch + c] = acc;
        for (int k = 0; k + 1 < k_last; ++k) st[(long long) k * n_ch] = st[(long long) (k + 1) * n_ch];
        if (k_last > 0) st[(long long) (k_last - 1) * n_ch] = xt;
    }
}

__device__ __forceinline__ float softplus_f32(float x) {
    return x > 20.0f ? x : logf(1.0f + expf(x));
}

// state (S, H, P, N), x (T, H, P), dt (T, H), A (H, a_cols) with a_cols N (Mamba-1) or 1 (Mamba-2),
// B and C (T, G, N), y (T, H, P). One thread per (h, p) row; the N state values stay in its registers
// between tokens of one sequence and go back to memory when the sequence changes.
extern "C" __global__ void ssm_scan_f32(float * state, const float * x, const float * dt, const float * A,
                                        const float * B, const float * C, const long long * seq_index, float * y,
                                        int n_tokens, int n_head, int head_dim, int n_state, int n_group, int a_cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;  // h * head_dim + p
    if (row >= n_head * head_dim) return;
    const int h = row / head_dim;
    const int g = h / (n_head / n_group);
    const long long rows = (long long) n_head * head_dim;
    for (int t = 0; t < n_tokens; ++t) {
        float * st = state + (seq_index[t] * rows + row) * n_state;
        const float delta = softplus_f32(dt[(long long) t * n_head + h]);
        const float x_dt = x[(long long) t * rows + row] * delta;
        const float * bt = B + ((long long) t * n_group + g) * n_state;
        const float * ct = C + ((long long) t * n_group + g) * n_state;
        float acc = 0.0f;
        for (int n = 0; n < n_state; ++n) {
            const float decay = expf(delta * A[(long long) h * a_cols + (a_cols == 1 ? 0 : n)]);
            const float v = st[n] * decay + bt[n] * x_dt;
            st[n] = v;
            acc += v * ct[n];
        }
        y[(long long) t * rows + row] = acc;
    }
}
