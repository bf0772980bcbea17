// Dequantization of ggml block formats to f16, one thread per 32 values, so that weights can be
// uploaded as the raw GGUF bytes and expanded on the device. Layouts are ggml's (see core/quants.py).
#include "common.cuh"

#define QK 32
#define QK_K 256

// q4_0: f16 d, 16 bytes of nibbles; x = (q - 8) * d. Low nibbles are values 0..15, high nibbles 16..31.
extern "C" __global__ void dequant_q4_0(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long b = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const unsigned char * blk = src + b * 18;
    const float d = load_f16(blk);
    __half * out = dst + b * QK;
    for (int j = 0; j < 16; ++j) {
        out[j] = __float2half(((blk[2 + j] & 0x0F) - 8) * d);
        out[j + 16] = __float2half(((blk[2 + j] >> 4) - 8) * d);
    }
}

// q4_1: f16 d, f16 m, nibbles; x = q * d + m.
extern "C" __global__ void dequant_q4_1(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long b = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const unsigned char * blk = src + b * 20;
    const float d = load_f16(blk), m = load_f16(blk + 2);
    __half * out = dst + b * QK;
    for (int j = 0; j < 16; ++j) {
        out[j] = __float2half((blk[4 + j] & 0x0F) * d + m);
        out[j + 16] = __float2half((blk[4 + j] >> 4) * d + m);
    }
}

__device__ __forceinline__ unsigned int load_u32_bytes(const unsigned char * p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned int) p[3] << 24);
}

// q5_0: f16 d, 32 high bits, nibbles; x = ((q | h << 4) - 16) * d.
extern "C" __global__ void dequant_q5_0(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long b = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const unsigned char * blk = src + b * 22;
    const float d = load_f16(blk);
    const unsigned int qh = load_u32_bytes(blk + 2);
    __half * out = dst + b * QK;
    for (int j = 0; j < 16; ++j) {
        const int lo = (blk[6 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const int hi = (blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = __float2half((lo - 16) * d);
        out[j + 16] = __float2half((hi - 16) * d);
    }
}

// q5_1: f16 d, f16 m, 32 high bits, nibbles; x = (q | h << 4) * d + m.
extern "C" __global__ void dequant_q5_1(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long b = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const unsigned char * blk = src + b * 24;
    const float d = load_f16(blk), m = load_f16(blk + 2);
    const unsigned int qh = load_u32_bytes(blk + 4);
    __half * out = dst + b * QK;
    for (int j = 0; j < 16; ++j) {
        const int lo = (blk[8 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const int hi = (blk[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = __float2half(lo * d + m);
        out[j + 16] = __float2half(hi * d + m);
    }
}

// q8_0: f16 d, 32 int8; x = q * d.
extern "C" __global__ void dequant_q8_0(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long b = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const unsigned char * blk = src + b * 34;
    const float d = load_f16(blk);
    __half * out = dst + b * QK;
    for (int j = 0; j < 32; ++j) out[j] = __float2half((float) (signed char) blk[2 + j] * d);
}

// The 6-bit scale and min of sub-block j of a q4_K / q5_K super-block.
__device__ __forceinline__ void k_scale_min(int j, const unsigned char * q, int & sc, int & mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// q4_K and q5_K: 256 values as 8 sub-blocks of 32; thread t handles sub-block t % 8 of super-block
// t / 8. q5_K adds one high bit per value (bit j of qh[l]) between the scales and the nibbles.
template <bool HIGH_BIT>
__device__ __forceinline__ void dequant_k_nibbles(const unsigned char * src, __half * dst, long long n_blocks) {
    constexpr int BLOCK_BYTES = HIGH_BIT ? 176 : 144, QS_OFFSET = HIGH_BIT ? 48 : 16;
    const long long t = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_blocks * 8) return;
    const long long b = t / 8;
    const int j = t % 8;
    const unsigned char * blk = src + b * BLOCK_BYTES;
    const float d = load_f16(blk), dmin = load_f16(blk + 2);
    int sc, mn;
    k_scale_min(j, blk + 4, sc, mn);
    const unsigned char * qh = blk + 16;
    const unsigned char * qs = blk + QS_OFFSET + (j / 2) * 32;
    __half * out = dst + b * QK_K + j * 32;
    const float d1 = d * sc, m1 = dmin * mn;
    for (int l = 0; l < 32; ++l) {
        const int q = (j % 2 ? qs[l] >> 4 : qs[l] & 0x0F) + (HIGH_BIT ? ((qh[l] >> j) & 1) << 4 : 0);
        out[l] = __float2half(d1 * q - m1);
    }
}

extern "C" __global__ void dequant_q4_K(const unsigned char * src, __half * dst, long long n_blocks) {
    dequant_k_nibbles<false>(src, dst, n_blocks);
}

extern "C" __global__ void dequant_q5_K(const unsigned char * src, __half * dst, long long n_blocks) {
    dequant_k_nibbles<true>(src, dst, n_blocks);
}

// q6_K: 128 low-nibble bytes, 64 high-2-bit bytes, 16 int8 scales, f16 d. Value y (0..255) sits in
// half n = y / 128, quarter k = (y % 128) / 32, lane l = y % 32; its scale index is y / 16.
extern "C" __global__ void dequant_q6_K(const unsigned char * src, __half * dst, long long n_blocks) {
    const long long t = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_blocks * 8) return;
    const long long b = t / 8;
    const int part = t % 8;  // 32 values: half n = part / 4, quarter k = part % 4
    const int n = part / 4, k = part % 4;
    const unsigned char * blk = src + b * 210;
    const unsigned char * ql = blk + n * 64;
    const unsigned char * qh = blk + 128 + n * 32;
    const signed char * sc = reinterpret_cast<const signed char *>(blk + 192);
    const float d = load_f16(blk + 208);
    __half * out = dst + b * QK_K + n * 128 + k * 32;
    for (int l = 0; l < 32; ++l) {
        const int low = (k % 2 ? ql[l + 32] : ql[l]);
        const int nib = k < 2 ? (low & 0x0F) : (low >> 4);
        const int q = (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        const int y = n * 128 + k * 32 + l;
        out[l] = __float2half(d * sc[y / 16] * q);
    }
}

// f16 and bf16 rows become f16 too (bf16 through f32).
extern "C" __global__ void convert_bf16(const unsigned short * src, __half * dst, long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2half(__uint_as_float(((unsigned int) src[i]) << 16));
}
