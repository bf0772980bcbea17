"""A stand-in for CuPy on a machine without a GPU, to test the CUDA backend's host side.

Arrays are NumPy arrays dressed as CuPy's. Every kernel launch is checked against the kernel's C
signature, parsed from its cuda/*.cu source: one argument per parameter, a C-contiguous array of
the pointee's type (or a null pointer) for each pointer, the exact NumPy scalar type for each
value, and a grid, block and shared-memory size the GPU accepts. A launch then zeroes the
kernel's output buffers (its non-const pointers) instead of computing them. cuBLAS's gemmEx
computes through the raw pointers, column-major as cuBLAS does, so the matmul mapping is real.
What this cannot test is the kernels' arithmetic: that needs a GPU (pytest -m cuda).
"""

from __future__ import annotations

import ctypes
import importlib
import re
import sys
import types
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

POINTEE = {"float": np.float32, "__half": np.float16, "int": np.int32, "long long": np.int64,
           "unsigned char": np.uint8, "unsigned short": np.uint16}
SCALAR = {"int": np.int32, "long long": np.int64, "float": np.float32}
KERNEL = r'extern "C" __global__ void (?:__launch_bounds__\(\w+\)\s*)?([\w#]+)\s*\(([^)]*)\)'
DEFAULT_SMEM = 48 * 1024


class FakeArray(np.ndarray):
    """A NumPy array with the bits of cupy.ndarray's interface the backend uses."""

    def get(self) -> np.ndarray:
        return np.array(self)

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def device(x):
    if isinstance(x, np.ndarray) and not isinstance(x, FakeArray):
        return x.view(FakeArray)
    if isinstance(x, tuple):
        return tuple(device(v) for v in x)
    return x


def asarray(x, dtype=None):
    """An upload copies (as cudaMemcpy does); a device array of the right type is returned as is."""
    if isinstance(x, FakeArray) and (dtype is None or np.dtype(dtype) == x.dtype):
        return x
    return np.array(x, dtype=dtype, copy=True).view(FakeArray)


def ascontiguousarray(x, dtype=None):
    return device(np.ascontiguousarray(x, dtype=dtype))


# ---- kernels ------------------------------------------------------------------------------------


def kernel_signatures(source: str) -> dict[str, list[tuple[str, bool, bool]]]:
    """name → [(base C type, is pointer, is const)] for every extern "C" kernel, macros expanded."""
    text = source.replace("\\\n", " ")
    objects = dict(re.findall(r"#define (\w+)[ \t]+([^\n]*)", text))
    found: dict[str, str] = {}
    for name, params in re.findall(KERNEL, text):
        if "##" not in name:
            found[name] = params
    for macro, formal, body in re.findall(r"#define (\w+)\(([^)]*)\)([^\n]*)", text):
        kernel = re.search(KERNEL, body)
        if not kernel:
            continue
        formal = [f.strip() for f in formal.split(",")]
        for actual in re.findall(rf"^{macro}\(([^)]*)\)", text, re.M):
            values = dict(zip(formal, (a.strip() for a in actual.split(","))))
            name = re.sub(r"\w+", lambda m: values.get(m.group(0), m.group(0)), kernel.group(1)).replace("##", "")
            found[name] = kernel.group(2)
    return {name: _parse_params(params, objects) for name, params in found.items()}


def _parse_params(params: str, objects: dict[str, str]) -> list[tuple[str, bool, bool]]:
    for name, body in objects.items():
        params = re.sub(rf"\b{name}\b", body, params)
    out = []
    for param in (p.strip() for p in params.split(",") if p.strip()):
        const = param.startswith("const ")
        words = param.replace("const ", "").replace("*", " * ").split()
        pointer = "*" in words
        base = " ".join(w for w in words[:-1] if w != "*")
        out.append((base, pointer, const))
    return out


class FakeKernel:
    def __init__(self, name: str, signature, launches: list):
        self.name, self.signature, self.launches = name, signature, launches
        self.max_dynamic_shared_size_bytes = DEFAULT_SMEM

    def __call__(self, grid, block, args, shared_mem: int = 0):
        where = f"{self.name}{tuple(grid)}"
        assert len(args) == len(self.signature), f"{where}: {len(args)} arguments for {len(self.signature)} parameters"
        for i, ((base, pointer, const), arg) in enumerate(zip(self.signature, args)):
            what = f"{where} argument {i} ({'const ' if const else ''}{base}{' *' if pointer else ''})"
            if pointer:
                if isinstance(arg, np.uint64) and arg == 0:
                    continue
                assert isinstance(arg, FakeArray), f"{what}: got {type(arg).__name__}"
                assert arg.dtype == POINTEE[base], f"{what}: got an array of {arg.dtype}"
                assert arg.flags.c_contiguous, f"{what}: not contiguous"
            else:
                assert type(arg) is SCALAR[base], f"{what}: got {type(arg).__name__}"
        assert 1 <= len(grid) <= 3 and all(type(g) is int and g >= 1 for g in grid), f"{where}: grid {grid}"
        assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), f"{where}: grid {grid}"
        assert all(type(b) is int for b in block) and 1 <= int(np.prod(block)) <= 1024, f"{where}: block {block}"
        assert shared_mem <= self.max_dynamic_shared_size_bytes, f"{where}: {shared_mem} bytes of shared memory"
        for (_, pointer, const), arg in zip(self.signature, args):
            if pointer and not const and isinstance(arg, FakeArray):
                arg[...] = 0
        self.launches.append(self.name)


class RawModule:
    launches: list[str] = []

    def __init__(self, code: str, options=()):
        self.code, self.options = code, options
        self.signatures: dict | None = None

    def compile(self):
        self.signatures = kernel_signatures(self.code)

    def get_function(self, name: str) -> FakeKernel:
        if name not in (self.signatures or {}):
            raise KeyError(f"no kernel named {name} in this module")
        return FakeKernel(name, self.signatures[name], RawModule.launches)


# ---- cuBLAS -------------------------------------------------------------------------------------

CUDA_TYPES = {0: np.float32, 2: np.float16}


def _matrix(ptr: int, dtype, rows: int, cols: int, ld: int) -> np.ndarray:
    """A column-major rows x cols matrix with leading dimension ld, viewed in place."""
    dtype = np.dtype(dtype)
    raw = (ctypes.c_char * (ld * cols * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype).reshape(cols, ld)[:, :rows].T


def gemm_ex(handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc,
            compute_type, algo):
    op_a = _matrix(a, CUDA_TYPES[a_type], k, m, lda).T if transa == 1 else _matrix(a, CUDA_TYPES[a_type], m, k, lda)
    op_b = _matrix(b, CUDA_TYPES[b_type], n, k, ldb).T if transb == 1 else _matrix(b, CUDA_TYPES[b_type], k, n, ldb)
    out = _matrix(c, CUDA_TYPES[c_type], m, n, ldc)
    alpha_v = np.frombuffer((ctypes.c_char * 4).from_address(alpha), np.float32)[0]
    beta_v = np.frombuffer((ctypes.c_char * 4).from_address(beta), np.float32)[0]
    product = alpha_v * (op_a.astype(np.float32) @ op_b.astype(np.float32))
    out[...] = product if beta_v == 0 else product + beta_v * out  # beta 0: C is not read


# ---- the modules ----------------------------------------------------------------------------------


def _module_getattr(name):
    value = getattr(np, name)
    if callable(value) and not isinstance(value, type):
        return lambda *args, **kwargs: device(value(*args, **kwargs))
    return value


def fake_modules() -> dict[str, types.ModuleType]:
    """sys.modules entries for cupy and cupy_backends.cuda.libs.cublas."""
    cp = types.ModuleType("cupy")
    cp.__getattr__ = _module_getattr
    cp.__version__ = "fake"
    cp.ndarray = FakeArray
    cp.asarray, cp.ascontiguousarray, cp.asnumpy = asarray, ascontiguousarray, lambda x: np.array(x)
    cp.RawModule, cp.RawKernel = RawModule, FakeKernel
    stream = SimpleNamespace(ptr=0, synchronize=lambda: None)
    cp.cuda = SimpleNamespace(
        Device=lambda *a: SimpleNamespace(id=0, attributes={"MultiProcessorCount": 132}),
        runtime=SimpleNamespace(CUDA_R_32F=0, CUDA_R_16F=2, getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13000,
                                memGetInfo=lambda: (140 << 30, 141 << 30),  # an H200's free and total bytes
                                getDeviceProperties=lambda i: {"name": b"fake GPU"}),
        get_current_stream=lambda: stream,
        device=SimpleNamespace(get_cublas_handle=lambda: 0),
        compiler=SimpleNamespace(CompileException=type("CompileException", (Exception,), {})))
    cublas = types.ModuleType("cupy_backends.cuda.libs.cublas")
    cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T = 0, 1
    cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT, cublas.CUBLAS_POINTER_MODE_HOST = 68, -1, 0
    cublas.setStream = cublas.setPointerMode = lambda *a: None
    cublas.gemmEx = gemm_ex
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.cublas = cublas
    backends = types.ModuleType("cupy_backends")
    backends.cuda = types.ModuleType("cupy_backends.cuda")
    backends.cuda.libs = libs
    return {"cupy": cp, "cupy_backends": backends, "cupy_backends.cuda": backends.cuda,
            "cupy_backends.cuda.libs": libs, "cupy_backends.cuda.libs.cublas": cublas}


@contextmanager
def fake_cuda_backend():
    """The CUDA backend module imported against the fakes; sys.modules is restored afterwards."""
    names = [*fake_modules(), "llmsuite.core.backend.cuda"]
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    sys.modules.update(fake_modules())
    try:
        yield importlib.import_module("llmsuite.core.backend.cuda")
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
