"""The host build of CUDA (cuda/host/cuda_host.h, core/backend/hostcuda.py) computes what a GPU
computes and refuses what a GPU refuses: probe kernels for barriers, warp collectives, f16
rounding, wmma and atomics against NumPy, and the faults (a barrier not every thread reaches,
diverging lanes, a kernel that never ends, launches an sm_90 device refuses, a compile error)
reported in one sentence with the kernel's name and launch shape, never a hang."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from llmsuite.core.backend import hostcuda, kernels
from llmsuite.core.backend.cuda_emu import DeviceArray

pytestmark = pytest.mark.skipif(hostcuda.compiler() is None, reason="no C++ compiler to build cuda/*.cu for the host")

PROBES = r"""
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

// each thread writes its slot, then reads its right neighbour's: right only with the barrier
extern "C" __global__ void neighbour(float * out, int with_barrier) {
    extern __shared__ float slots[];
    slots[threadIdx.x] = (float) threadIdx.x;
    if (with_barrier) __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

extern "C" __global__ void shuffles(const float * x, float * out, int arg, int width) {
    const float v = x[threadIdx.x];
    const int n = blockDim.x;
    out[0 * n + threadIdx.x] = __shfl_sync(FULL_MASK, v, arg, width);
    out[1 * n + threadIdx.x] = __shfl_xor_sync(FULL_MASK, v, arg, width);
    out[2 * n + threadIdx.x] = __shfl_up_sync(FULL_MASK, v, arg, width);
    out[3 * n + threadIdx.x] = __shfl_down_sync(FULL_MASK, v, arg, width);
    out[4 * n + threadIdx.x] = (float) __ballot_sync(FULL_MASK, v > 0.0f);
    out[5 * n + threadIdx.x] = (float) __any_sync(FULL_MASK, v > 0.0f) + 2.0f * __all_sync(FULL_MASK, v > 0.0f);
    out[6 * n + threadIdx.x] = (float) __syncthreads_count(v > 0.0f);
    out[7 * n + threadIdx.x] = (float) __syncthreads_or(v > 100.0f) + 2.0f * __syncthreads_and(v > -100.0f);
    out[8 * n + threadIdx.x] = warp_sum(v);
}

extern "C" __global__ void to_half(const float * x, __half * out, float * back, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = __float2half(x[i]); back[i] = __half2float(out[i]); }
}

// one warp: D = A B + C for 16 x 16 f16 tiles, f32 accumulate
extern "C" __global__ void tile_mma(const __half * a, const __half * b, const float * c, float * d) {
    __shared__ __align__(32) __half a_s[256], b_s[256];
    __shared__ __align__(32) float c_s[256];
    for (int i = threadIdx.x; i < 256; i += 32) { a_s[i] = a[i]; b_s[i] = b[i]; c_s[i] = c[i]; }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a_s, 16);
    wmma::load_matrix_sync(fb, b_s, 16);
    wmma::load_matrix_sync(fc, c_s, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c_s, fc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = threadIdx.x; i < 256; i += 32) d[i] = c_s[i];
}

extern "C" __global__ void count_up(int * total, float * sum) {
    atomicAdd(total, 1);
    atomicAdd(sum, 0.5f);
}

extern "C" __global__ void half_the_block_waits(float * out) {
    if (threadIdx.x < 32) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void two_barriers(float * out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void diverging_lanes(float * out) {
    float v = 1.0f;
    if (threadIdx.x % 2) v = __shfl_xor_sync(FULL_MASK, v, 1);
    else v = __shfl_down_sync(FULL_MASK, v, 1);
    out[threadIdx.x] = v;
}

extern "C" __global__ void spin(int * flag) {
    while (flag[0] == 0) flag[1] += 1;
}

extern "C" __global__ void __launch_bounds__(64) small_blocks(float * out) { out[threadIdx.x] = 0.0f; }

// thread 1 reads one element past the n it was given
extern "C" __global__ void read_past(const float * x, float * out, int n) { out[threadIdx.x] = x[n - 1 + threadIdx.x]; }
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probes")
    shutil.copy(kernels.KERNEL_DIR / kernels.COMMON_HEADER, folder)
    (folder / "probes.cu").write_text(PROBES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hostcuda, "KERNEL_DIR", folder)
        module = hostcuda.HostModule("probes.cu", hostcuda.build("probes.cu"))
    module.folder = folder
    return module


def dev(a) -> DeviceArray:
    return np.ascontiguousarray(a).view(DeviceArray)


def test_a_missing_barrier_shows_in_every_schedule(probes):
    kernel = probes.get_function("neighbour")
    expected = np.tile((np.arange(128) + 1) % 128, 2).astype(np.float32)
    out = dev(np.zeros(256, np.float32))
    kernel((2,), (128,), (out, np.int32(1)), shared_mem=512)
    np.testing.assert_array_equal(out, expected)
    for order in (0, 1, 2):  # without the barrier some thread reads a slot nobody has written yet
        probes.lib.emu_set_schedule(order, 7)
        kernel((2,), (128,), (out, np.int32(0)), shared_mem=512)
        assert np.isnan(out).any(), order
    probes.lib.emu_set_schedule(0, 0)


@pytest.mark.parametrize("arg, width", [(3, 32), (1, 32), (5, 8), (16, 16)])
def test_shuffles_votes_and_block_reductions(probes, arg, width):
    rng = np.random.default_rng(arg)
    x = rng.uniform(-1, 1, 64).astype(np.float32)
    out = dev(np.zeros(9 * 64, np.float32))
    probes.get_function("shuffles")((1,), (64,), (dev(x), out, np.int32(arg), np.int32(width)))
    got = out.reshape(9, 64)
    base = np.arange(64) - np.arange(64) % width
    inside = np.arange(64) - base
    np.testing.assert_array_equal(got[0], x[base + arg % width])
    np.testing.assert_array_equal(got[1], x[np.where((inside ^ arg) < width, base + (inside ^ arg), np.arange(64))])
    np.testing.assert_array_equal(got[2], x[np.where(inside >= arg, np.arange(64) - arg, np.arange(64))])
    np.testing.assert_array_equal(got[3], x[np.where(inside + arg < width, np.arange(64) + arg, np.arange(64))])
    warps = (x > 0).reshape(2, 32)
    ballots = (warps * (1 << np.arange(32, dtype=np.uint64))).sum(axis=1).astype(np.float32)
    np.testing.assert_array_equal(got[4], np.repeat(ballots, 32))
    np.testing.assert_array_equal(got[5], np.repeat(warps.any(axis=1) + 2.0 * warps.all(axis=1), 32))
    assert (got[6] == (x > 0).sum()).all() and (got[7] == 2.0).all()
    np.testing.assert_allclose(got[8], np.repeat(x.reshape(2, 32).sum(axis=1), 32), atol=1e-5)


def test_half_rounds_to_nearest_even_as_ieee_binary16(probes):
    x = np.concatenate([np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 1e3,
                        np.float32([65504, 65520, 65519.99, 1e-8, -6e-5, 2049, 2051, 0.1, np.inf, -np.inf])])
    out, back = dev(np.zeros(len(x), np.float16)), dev(np.zeros(len(x), np.float32))
    probes.get_function("to_half")((-(-len(x) // 256),), (256,), (dev(x), out, back, np.int32(len(x))))
    with np.errstate(over="ignore"):  # NumPy's own cast is the reference: 65520 and up overflow to inf
        expected = x.astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(back, expected.astype(np.float32))


def test_wmma_computes_f16_products_with_f32_sums(probes):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((16, 16)).astype(np.float16) for _ in range(2))
    c = rng.standard_normal((16, 16)).astype(np.float32)
    d = dev(np.zeros(256, np.float32))
    probes.get_function("tile_mma")((1,), (32,), (dev(a), dev(b), dev(c), d))  # b col-major: b_s[n * 16 + k]
    expected = a.astype(np.float64) @ b.astype(np.float64).T + c
    np.testing.assert_allclose(d.reshape(16, 16), expected, rtol=1e-5, atol=1e-5)


def test_atomics_count_every_thread_of_every_block(probes):
    total, acc = dev(np.zeros(1, np.int32)), dev(np.zeros(1, np.float32))
    probes.get_function("count_up")((3, 2), (96,), (total, acc))
    assert total[0] == 3 * 2 * 96 and acc[0] == 288.0


@pytest.mark.parametrize("name, message", [
    ("half_the_block_waits", r"half_the_block_waits grid \(1, 1, 1\) block \(64, 1, 1\): block \(0, 0, 0\): no thread "
                             r"can go on .*threads 0-31 waits at __syncthreads \(probes\.cu:\d+\); threads 32-63 has returned"),
    ("two_barriers", r"two_barriers .*threads wait at different barriers"),
    ("diverging_lanes", r"diverging_lanes .*lanes of warp 0 diverge"),
])
def test_faults_name_the_kernel_and_the_launch(probes, name, message):
    with pytest.raises(hostcuda.KernelFault, match=message):
        probes.get_function(name)((1,), (64,), (dev(np.zeros(64, np.float32)),))


def test_a_kernel_that_never_ends_is_stopped(probes, monkeypatch):
    monkeypatch.setenv("LLMSUITE_CUDA_EMU_TIMEOUT", "0.5")
    with pytest.raises(hostcuda.KernelFault, match=r"spin grid \(2, 1, 1\) block \(32, 1, 1\): ran past the time limit"):
        probes.get_function("spin")((2,), (32,), (dev(np.zeros(2, np.int32)),))
    total = dev(np.zeros(1, np.int32))
    probes.get_function("count_up")((1,), (32,), (total, dev(np.zeros(1, np.float32))))  # the library still works
    assert total[0] == 32


@pytest.mark.parametrize("grid, block, smem, message", [
    ((1,), (2048,), 0, "refuses a block of 2048 threads"),
    ((1,), (32, 1, 65), 0, "refuses a block"),
    ((1, 70000), (32,), 0, "refuses this grid"),
    ((1,), (32,), 60000, "60000 bytes of dynamic shared memory, over the kernel's limit of 49152"),
])
def test_launches_an_sm90_device_refuses_are_refused(probes, grid, block, smem, message):
    with pytest.raises(hostcuda.KernelFault, match=message):
        probes.get_function("neighbour")(grid, block, (dev(np.zeros(64, np.float32)), np.int32(1)), shared_mem=smem)


def test_launch_bounds_and_arguments_are_checked(probes):
    out = dev(np.zeros(128, np.float32))
    with pytest.raises(hostcuda.KernelFault, match=r"block of 128 threads \(this kernel takes at most 64\)"):
        probes.get_function("small_blocks")((1,), (128,), (out,))
    with pytest.raises(hostcuda.KernelFault, match=r"argument 1 \(int\): got int"):
        probes.get_function("neighbour")((1,), (32,), (out, 1))  # a Python int: CuPy would pass 8 bytes
    with pytest.raises(hostcuda.KernelFault, match="array of float16"):
        probes.get_function("neighbour")((1,), (32,), (out.astype(np.float16), np.int32(1)))
    kernel = probes.get_function("neighbour")
    with pytest.raises(hostcuda.KernelFault, match="at most 232448"):
        kernel.max_dynamic_shared_size_bytes = 240 * 1024


def test_a_compile_error_names_the_file_and_line(tmp_path, monkeypatch):
    shutil.copy(kernels.KERNEL_DIR / kernels.COMMON_HEADER, tmp_path)
    (tmp_path / "broken.cu").write_text('#include "common.cuh"\n\n'
                                        'extern "C" __global__ void f(float * x) { x[0] = no_such_name; }\n')
    monkeypatch.setattr(hostcuda, "KERNEL_DIR", tmp_path)
    with pytest.raises(kernels.KernelCompileError,
                       match=r"^broken\.cu does not build for the host: broken\.cu line 3: .*no_such_name"):
        hostcuda.build("broken.cu")


READ_PAST = """
from pathlib import Path
import numpy as np
from llmsuite.core.backend import hostcuda
from llmsuite.core.backend.cuda_emu import DeviceArray
hostcuda.KERNEL_DIR = Path({folder!r})
module = hostcuda.HostModule("probes.cu", hostcuda.build("probes.cu"))
x = np.zeros(100, np.float32).view(DeviceArray)
module.get_function("read_past")((1,), (2,), (x[:64], np.zeros(2, np.float32).view(DeviceArray), np.int32(64)))
"""


def asan_runtime() -> str | None:
    found = subprocess.run([hostcuda.compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True)
    return found.stdout.strip() if os.path.isfile(found.stdout.strip()) else None


@pytest.mark.skipif(asan_runtime() is None, reason="the C++ compiler has no AddressSanitizer runtime")
def test_the_sanitizer_build_reports_a_read_past_what_the_launch_was_given(probes):
    """x[:64] of a 100-value array: the read of x[64] is inside NumPy's allocation, but past the
    argument; under the sanitizer every argument is an allocation of exactly its extent."""
    env = {**os.environ, "LD_PRELOAD": asan_runtime(), "LLMSUITE_CUDA_EMU_SANITIZE": "1",
           "ASAN_OPTIONS": "detect_leaks=0"}
    done = subprocess.run([sys.executable, "-c", READ_PAST.format(folder=str(probes.folder))], capture_output=True,
                          text=True, env=env)
    assert done.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr and "read_past" in done.stderr
