"""`--backend cuda-emu`: the CUDA backend over a CuPy-shaped host module.

Device arrays are NumPy arrays in host memory (`DeviceArray`: NumPy with the bits of
cupy.ndarray's interface the backend uses); every RawKernel launch runs the host build of its
`cuda/*.cu` source (core/backend/hostcuda.py), thread by thread; cuBLAS's gemmEx computes as
cuBLAS defines it, column-major through the raw pointers, with the requested compute type. The
device it stands for is an H200 (132 SMs), so the backend picks the launch shapes it would pick
there. Slow, and exact about what the kernels compute: test-ops and the tiny models check the
CUDA sources on any machine with a C++ compiler.
"""

from __future__ import annotations

import ctypes
import os
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..errors import InvalidInputError
from . import hostcuda

N_SM = 132  # an H200's streaming multiprocessors: the split-KV kernel's launch shapes follow them


class DeviceArray(np.ndarray):
    """A host array dressed as cupy.ndarray: `.get()` copies to NumPy, `.data.ptr` is its address."""

    def get(self) -> np.ndarray:
        return np.array(self)

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def device(x):
    if isinstance(x, np.ndarray) and not isinstance(x, DeviceArray):
        return x.view(DeviceArray)
    if isinstance(x, tuple):
        return tuple(device(v) for v in x)
    return x


def asarray(x, dtype=None):
    """An upload copies (as cudaMemcpy does); a device array of the right type is returned as is."""
    if isinstance(x, DeviceArray) and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return np.array(x, dtype=dtype, copy=True).view(DeviceArray)


def ascontiguousarray(x, dtype=None):
    return device(np.ascontiguousarray(x, dtype=dtype))


def asnumpy(x) -> np.ndarray:
    return np.array(x)


# ---- cuBLAS ---------------------------------------------------------------------------------------

CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC = 68, 69
CUDA_TYPES = {CUDA_R_32F: np.float32, CUDA_R_16F: np.float16}


def _matrix(ptr: int, dtype, rows: int, cols: int, ld: int) -> np.ndarray:
    """A column-major rows x cols matrix with leading dimension ld, viewed in place."""
    dtype = np.dtype(dtype)
    if ld < max(1, rows):
        raise InvalidInputError(f"cuBLAS: leading dimension {ld} < {rows} rows")
    raw = (ctypes.c_char * (ld * (cols - 1) * dtype.itemsize + rows * dtype.itemsize)).from_address(ptr)
    return np.lib.stride_tricks.as_strided(np.frombuffer(raw, dtype=dtype), (rows, cols),
                                           (dtype.itemsize, ld * dtype.itemsize))


def gemm_ex(handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc,
            compute_type, algo):
    """C = alpha op(A) op(B) + beta C, column-major; f16 or f32 inputs, f32 output. With a 32F compute
    type the products of f16 inputs are exact and the sums f32, which is what float32 BLAS gives."""
    if compute_type not in (CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC):
        raise InvalidInputError(f"cuda-emu: cuBLAS compute type {compute_type} is not emulated")
    op_a = _matrix(a, CUDA_TYPES[a_type], k, m, lda).T if transa == 1 else _matrix(a, CUDA_TYPES[a_type], m, k, lda)
    op_b = _matrix(b, CUDA_TYPES[b_type], n, k, ldb).T if transb == 1 else _matrix(b, CUDA_TYPES[b_type], k, n, ldb)
    out = _matrix(c, CUDA_TYPES[c_type], m, n, ldc)
    alpha_v = np.frombuffer((ctypes.c_char * 4).from_address(alpha), np.float32)[0]
    beta_v = np.frombuffer((ctypes.c_char * 4).from_address(beta), np.float32)[0]
    product = alpha_v * (op_a.astype(np.float32) @ op_b.astype(np.float32))
    out[...] = product if beta_v == 0 else product + beta_v * out  # beta 0: C is not read


def cublas_module() -> types.ModuleType:
    cublas = types.ModuleType("cuda_emu.cublas")
    cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T = 0, 1
    cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT, cublas.CUBLAS_POINTER_MODE_HOST = CUBLAS_COMPUTE_32F, -1, 0
    cublas.setStream = cublas.setPointerMode = lambda *a: None
    cublas.gemmEx = gemm_ex
    return cublas


# ---- the cupy module ------------------------------------------------------------------------------


def _module_getattr(name):
    value = getattr(np, name)
    if callable(value) and not isinstance(value, type):
        return lambda *args, **kwargs: device(value(*args, **kwargs))
    return value


def cupy_module() -> types.ModuleType:
    """What the backend uses of `cupy`: NumPy's functions returning device arrays, and cupy.cuda."""
    cp = types.ModuleType("cuda_emu.cupy")
    cp.__getattr__ = _module_getattr
    cp.__version__ = "host emulation"
    cp.ndarray = DeviceArray
    cp.asarray, cp.ascontiguousarray, cp.asnumpy = asarray, ascontiguousarray, asnumpy
    stream = SimpleNamespace(ptr=0, synchronize=lambda: None)
    cp.cuda = SimpleNamespace(
        Device=lambda *a: SimpleNamespace(id=0, attributes={"MultiProcessorCount": N_SM}),
        runtime=SimpleNamespace(CUDA_R_32F=CUDA_R_32F, CUDA_R_16F=CUDA_R_16F, getDeviceCount=lambda: 1,
                                runtimeGetVersion=lambda: 13000, memGetInfo=lambda: (140 << 30, 141 << 30),
                                getDeviceProperties=lambda i: {"name": b"H200 (emulated on the host)"}),
        get_current_stream=lambda: stream,
        device=SimpleNamespace(get_cublas_handle=lambda: 0))
    return cp


class EmulatedRuntime:
    """The CUDA backend's runtime (see cuda.CupyRuntime): CuPy-shaped arrays, host-built kernels."""

    name = "cuda-emu"

    def __init__(self):
        self.cp = cupy_module()
        self.cublas = cublas_module()
        self.launches: list[str] = []  # kernel names in launch order (tests and -v read them)

    def load_modules(self, file_names, progress=None) -> dict:
        paths = hostcuda.build_all(list(file_names), progress)
        return {name: hostcuda.HostModule(name, path, self.launches) for name, path in paths.items()}

    def describe(self) -> str:
        cxx = hostcuda.compiler() or "no compiler"
        schedule = os.environ.get("LLMSUITE_CUDA_EMU_SCHEDULE", "forward")
        return (f"cuda/*.cu emulated on the host (built by {Path(cxx).name}; every GPU thread a fiber, "
                f"{schedule} schedule{', ASan/UBSan' if hostcuda.sanitizing() else ''}): not a GPU")

