"""The CUDA backend's host side, on a machine without a GPU: every launch it makes (test-ops cases
and whole forward passes) matches its kernel's C signature, and what it computes without kernels
(cuBLAS matmuls, the plain attention path, rows and selections) equals the references."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import fake_cupy
from llmsuite.core.ops import OPS
from llmsuite.core.testops import run_test, select_cases

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
# ops whose answer comes from cuBLAS, CuPy algebra or plain copies: these must be right here too
COMPUTED_WITHOUT_KERNELS = ("MUL_MAT(type_a=f32", "MUL_MAT(type_a=f16", "GET_ROWS(type=f32", "GET_ROWS(type=f16",
                            "SET_ROWS(type=f32", "ADD(", "MUL(", "SCALE(", "TOP_K(", "FLASH_ATTN_EXT(hsk=40,",
                            "FLASH_ATTN_EXT(hsk=80,", "FLASH_ATTN_EXT(hsk=96,", "FLASH_ATTN_EXT(hsk=192,",
                            "TOP_K_MASK(", "LIGHTNING_INDEXER(", "MOE_ROUTE(")


@pytest.fixture
def cuda():
    with fake_cupy.fake_cuda_backend() as module:
        fake_cupy.RawModule.launches = []
        yield module.CUDABackend()


def test_signatures_are_parsed_from_the_sources():
    from llmsuite.core.backend.kernels import kernel_source

    sigs = fake_cupy.kernel_signatures(kernel_source("fattn.cu"))
    decode = sigs["fattn_decode_128_128_8"]
    assert len(decode) == 9 + 12 and decode[0] == ("float", True, True) and decode[6] == ("float", True, False)
    assert decode[13] == ("long long", False, False) and sigs["fattn_prefill_256"][5] == ("float", True, False)
    assert sigs["mask_to_indices"][-1] == ("int", True, False)


def test_every_op_case_launches_its_kernels_as_declared(cuda):
    results = [run_test(cuda, case) for case in select_cases(quick=True)]
    launched = set(fake_cupy.RawModule.launches)
    assert {"fattn_decode_64_64_16", "fattn_decode_576_512_2", "fattn_prefill_128", "fattn_combine",
            "mask_to_indices", "dequant_q6_K", "soft_max_f32", "rope_f32", "set_rows_f16"} <= launched
    exact = [r for r in results if r.case.startswith(COMPUTED_WITHOUT_KERNELS)]
    assert len(exact) > 40
    assert not [r.case for r in exact if not r.passed]
    assert {"ssm_conv_f32", "ssm_scan_f32"} <= launched
    unsupported = [c for c in select_cases(quick=True) if (c.op.name == "SET_ROWS" and c.params["type"][0] == "q")
                   or c.op.name == "MUL_MAT_GGML"]  # ggml numerics are the cpu backend's
    assert sum(not r.supported for r in results) == len(unsupported)


def test_matmul_maps_row_major_onto_cublas(cuda):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 48), dtype=np.float32), rng.standard_normal((7, 48), dtype=np.float32)
    expected = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T
    out = cuda.matmul(cuda.asarray(x), cuda.asarray(w.astype(np.float16)))
    assert out.shape == (5, 7) and np.allclose(cuda.to_numpy(out), expected, rtol=1e-5, atol=1e-5)
    buffer = cuda.xp.zeros((6, 7), dtype=np.float32)
    cuda.matmul(cuda.asarray(x), cuda.asarray(w.astype(np.float16)), out=buffer[:5])
    assert np.allclose(cuda.to_numpy(buffer[:5]), expected, rtol=1e-5, atol=1e-5) and not buffer[5].any()


@pytest.mark.parametrize("preset, attn", [("smollm2-135m", "auto"), ("gemma3-270m", "sparse")])
def test_forward_passes_launch_as_declared(cuda, tmp_path, preset, attn):
    """A prompt (WMMA prefill, or the sparse gather under --attn sparse) shared by two sequences,
    then decode steps (split-KV kernel; greedy and drawn tokens picked on the device)."""
    from llmsuite.core.context import Context, ContextParams
    from llmsuite.core.generation import generate
    from llmsuite.core.models import load_model
    from llmsuite.core.sampling import Sampler, SamplerParams

    write = runpy.run_path(str(SCRIPTS / "random_model.py"))["write_random_model"]
    extra = {"sliding_window": 8} if attn == "sparse" else {}
    model = load_model(write(preset, tmp_path / "m.gguf", n_layer=2, n_vocab=512, **extra), backend="cuda")
    ctx = Context(model, ContextParams(n_ctx=64, n_ubatch=16, n_seq_max=2, backend="cuda", attn=attn))
    greedy, drawn = Sampler(SamplerParams(temp=0.0), ctx.backend), Sampler(SamplerParams(seed=1), ctx.backend)
    generate(ctx, [greedy, drawn], list(range(3, 40)), n_predict=3)
    head = 64 if preset == "smollm2-135m" else 256
    decode = f"fattn_decode_{head}_{head}_{16 if head == 64 else 4}"
    attention = {"mask_to_indices", decode} if attn == "sparse" else {f"fattn_prefill_{head}", decode}
    assert attention | {"rms_norm_f32", "rope_f32", "get_rows_f16", "fattn_combine", "argmax_f32",
                     "sample_cdf_f32", "swiglu_fused_f32" if head == 64 else "geglu_fused_f32"} \
        <= set(fake_cupy.RawModule.launches)


@pytest.mark.parametrize("name", ["tiny-llama-moe", "tiny-qwen3", "tiny-deepseek2", "tiny-deepseek32"])
def test_tiny_models_launch_as_declared(cuda, name):
    """Mixture of experts (routing on the host, each expert's rows on the device) and Qwen3's
    per-head norms go through the device ops."""
    from conftest import FIXTURES
    from llmsuite.core.batch import Batch
    from llmsuite.core.context import Context, ContextParams
    from llmsuite.core.models import load_model

    model = load_model(FIXTURES / "tiny" / f"{name}.gguf", backend="cuda")
    ctx = Context(model, ContextParams(n_ctx=64, n_ubatch=16, backend="cuda"))
    assert ctx.decode(Batch.from_tokens(list(range(3, 40)), all_outputs=True)) == 0, ctx.last_error
    assert ctx.logits.shape == (37, 49152)
    assert {"rms_norm_f32", "rope_f32", "swiglu_fused_f32"} <= set(fake_cupy.RawModule.launches)


def test_block_topk_makes_its_mask_on_the_device(cuda):
    """Under CuPy the producer runs its array code on device arrays (the mask never visits the
    host) and selects what the CPU's compiled kernel selects."""
    from llmsuite.core.memory.masks import BlockTopK, KeyBounds, MaskInput

    rng = np.random.default_rng(3)
    keys = rng.standard_normal((160, 2, 16)).astype(np.float32)
    q = rng.standard_normal((24, 6, 16)).astype(np.float32)
    pos = np.sort(rng.choice(160, 24, replace=False)).astype(np.int32)
    cell_pos = np.arange(160, dtype=np.int32)
    base = np.where(cell_pos[None, :] <= pos[:, None], np.float32(0), np.float32(-np.inf))
    producer = BlockTopK(32, 8, 8)
    xp = cuda.xp
    on_device = MaskInput(2, xp.asarray(q), xp.asarray(base), pos, cell_pos, xp=xp,
                          extra={"bounds": KeyBounds(xp.asarray(keys), 8, xp)})
    mask, n_kv_max = producer(on_device)
    on_host = MaskInput(2, q, base, pos, cell_pos, extra={"bounds": KeyBounds(keys, 8)})
    assert isinstance(mask, fake_cupy.FakeArray) and n_kv_max == 40
    np.testing.assert_array_equal(np.isfinite(mask.get()), np.isfinite(producer.fused_mask(on_host)))
    assert np.isfinite(mask.get()).sum() < np.isfinite(base).sum()


def test_a_sparse_forward_pass_keeps_masks_and_bounds_on_the_device(cuda, tmp_path):
    """--sparse-topk on the CUDA backend: the cache's block bounds, the masks given to the
    attention op and the op's sparse gather all stay device-side."""
    from llmsuite.core.batch import Batch
    from llmsuite.core.context import Context, ContextParams
    from llmsuite.core.memory.masks import SparseParams
    from llmsuite.core.models import load_model

    write = runpy.run_path(str(SCRIPTS / "random_model.py"))["write_random_model"]
    model = load_model(write("smollm2-135m", tmp_path / "m.gguf", n_layer=2, n_vocab=512), backend="cuda")
    ctx = Context(model, ContextParams(n_ctx=96, n_ubatch=32, backend="cuda", attn="sparse",
                                       sparse=SparseParams(16, 8, 8, "all")))
    masks = []
    attend = cuda.flash_attn_ext.__func__

    def spy(self, q, k, v, mask=None, *args, **kwargs):
        masks.append((type(mask), kwargs.get("n_kv_max", args[5] if len(args) > 5 else 0)))
        return attend(self, q, k, v, mask, *args, **kwargs)

    ctx.backend.flash_attn_ext = spy.__get__(ctx.backend)
    for i in range(0, 64, 32):
        assert ctx.decode(Batch.from_tokens(list(range(3 + i, 35 + i)), pos0=i)) == 0, ctx.last_error
    assert ctx.decode(Batch.from_tokens([7], pos0=64)) == 0, ctx.last_error
    assert masks and all(kind is fake_cupy.FakeArray and bound == 24 for kind, bound in masks)
    assert isinstance(ctx.memory.bounds[0].lo, fake_cupy.FakeArray)
    assert "mask_to_indices" in fake_cupy.RawModule.launches


def test_the_fake_rejects_a_wrong_launch(cuda):
    kernel = cuda.kernels["rms_norm_f32"]
    x = cuda.xp.zeros((2, 64), dtype=np.float32)
    with pytest.raises(AssertionError, match="argument 3"):
        kernel((2,), (64,), (x, fake_cupy.np.uint64(0), x, 64, np.int32(1), np.float32(1e-6)))  # a Python int
    with pytest.raises(AssertionError, match="array of float16"):
        kernel((2,), (64,), (x.astype(np.float16), fake_cupy.np.uint64(0), x, np.int32(64), np.int32(1),
                             np.float32(1e-6)))
    assert OPS  # the op registry is loaded (the fakes need no other state)


HOST_SHIM = r"""
#include <cstdint>
#include <cstring>
struct Index { long long x = 0; };
static Index blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
typedef uint16_t __half;
inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h, 2); return (float) f; }
inline __half __float2half(float x) { _Float16 f = (_Float16) x; __half h; memcpy(&h, &f, 2); return h; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float load_f16(const unsigned char * p) { return __half2float(*reinterpret_cast<const __half *>(p)); }
"""


@pytest.fixture(scope="module")
def dequant_on_host(tmp_path_factory):
    """cuda/dequant.cu built for the CPU (thread indices emulated, __half as IEEE binary16), so its
    arithmetic can be checked without a GPU."""
    import ctypes
    import shutil
    import subprocess

    from llmsuite.core.backend.kernels import KERNEL_DIR

    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to check the dequantization kernels on the host"
    folder = tmp_path_factory.mktemp("dequant")
    source = (KERNEL_DIR / "dequant.cu").read_text().replace('#include "common.cuh"', HOST_SHIM)
    source += 'extern "C" void launch(void (*kernel)(const unsigned char *, __half *, long long), ' \
              'const unsigned char * s, __half * d, long long n, long long threads) {\n' \
              '    blockDim.x = 1;\n    for (long long t = 0; t < threads; ++t) { blockIdx.x = t; kernel(s, d, n); }\n}\n'
    (folder / "dequant.cpp").write_text(source)
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-std=c++17", "-o", str(folder / "dequant.so"),
                    str(folder / "dequant.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(folder / "dequant.so"))


def test_dequant_kernels_expand_exactly_what_gguf_does(dequant_on_host):
    import ctypes

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

    from llmsuite.core.backend.kernels import DEQUANT_KERNELS
    from llmsuite.core.ops import random_weight
    from llmsuite.core.quants import dequantize

    rng = np.random.default_rng(0)
    for qt, (name, threads_per_block) in DEQUANT_KERNELS.items():
        raw = np.ascontiguousarray(random_weight(rng, qt.name.lower().replace("_k", "_K"), 16, 512)).reshape(-1).view(np.uint8)
        n_blocks = 16 * 512 // GGML_QUANT_SIZES[qt][0]
        out = np.zeros(16 * 512, np.float16)
        dequant_on_host.launch(getattr(dequant_on_host, name), raw.ctypes.data_as(ctypes.c_void_p),
                               out.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(n_blocks),
                               ctypes.c_longlong(n_blocks * threads_per_block))
        assert np.array_equal(out, dequantize(raw, qt, out.size).astype(np.float16)), name
    bf16 = (rng.standard_normal(1000).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out = np.zeros(1000, np.float16)
    dequant_on_host.launch(dequant_on_host.convert_bf16, bf16.ctypes.data_as(ctypes.c_void_p),
                           out.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(1000), ctypes.c_longlong(1000))
    assert np.array_equal(out, dequantize(bf16.view(np.uint8), T.BF16, 1000).astype(np.float16))


SSM_LAUNCHERS = """
extern "C" void conv(const float * x, float * state, const float * w, const long long * seq, float * out,
                     int n_tokens, int n_ch, int d_conv) {
    blockDim.x = 1;
    for (int c = 0; c < n_ch; ++c) { blockIdx.x = c; ssm_conv_f32(x, state, w, seq, out, n_tokens, n_ch, d_conv); }
}
extern "C" void scan(float * state, const float * x, const float * dt, const float * A, const float * B,
                     const float * C, const long long * seq, float * y, int n_tokens, int n_head, int head_dim,
                     int n_state, int n_group, int a_cols) {
    blockDim.x = 1;
    for (int r = 0; r < n_head * head_dim; ++r) {
        blockIdx.x = r;
        ssm_scan_f32(state, x, dt, A, B, C, seq, y, n_tokens, n_head, head_dim, n_state, n_group, a_cols);
    }
}
"""


@pytest.fixture(scope="module")
def ssm_on_host(tmp_path_factory):
    """cuda/ssm.cu built for the CPU, one emulated thread at a time."""
    import ctypes
    import shutil
    import subprocess

    from llmsuite.core.backend.kernels import KERNEL_DIR

    folder = tmp_path_factory.mktemp("ssm")
    source = (KERNEL_DIR / "ssm.cu").read_text().replace('#include "common.cuh"', HOST_SHIM + "#include <cmath>\n")
    (folder / "ssm.cpp").write_text(source + SSM_LAUNCHERS)
    subprocess.run([shutil.which("g++"), "-O1", "-shared", "-fPIC", "-std=c++17", "-o", str(folder / "ssm.so"),
                    str(folder / "ssm.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(folder / "ssm.so"))


def _ptr(a):
    import ctypes

    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("mixed", [False, True])
def test_ssm_conv_kernel_computes_the_contract(ssm_on_host, mixed):
    op, params = OPS["SSM_CONV"], dict(d_conv=4, d_inner=40, n_t=5, n_seq=3, mixed=mixed)
    i = op.make(params, np.random.default_rng(2))
    state, out = i["state"].copy(), np.empty_like(i["x"])
    ssm_on_host.conv(_ptr(i["x"]), _ptr(state), _ptr(i["w"]), _ptr(i["seq_index"].astype(np.int64)), _ptr(out),
                     len(i["x"]), 40, 4)
    np.testing.assert_allclose(np.concatenate([out.reshape(-1), state.reshape(-1)]), op.reference(i, params),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mamba, n_head, head_dim, n_group", [(1, 24, 1, 1), (2, 4, 8, 2)])
def test_ssm_scan_kernel_computes_the_contract(ssm_on_host, mamba, n_head, head_dim, n_group):
    op = OPS["SSM_SCAN"]
    params = dict(mamba=mamba, n_head=n_head, head_dim=head_dim, n_group=n_group, d_state=16, n_t=4, n_seq=3, mixed=True)
    i = op.make(params, np.random.default_rng(3))
    state, y = i["state"].copy(), np.empty_like(i["x"])
    ssm_on_host.scan(_ptr(state), *(_ptr(i[k]) for k in ("x", "dt", "A", "B", "C")),
                     _ptr(i["seq_index"].astype(np.int64)), _ptr(y), len(i["x"]), n_head, head_dim, 16, n_group,
                     i["A"].shape[1])
    np.testing.assert_allclose(np.concatenate([y.reshape(-1), state.reshape(-1)]), op.reference(i, params),
                               rtol=1e-4, atol=1e-5)
