"""The CUDA sources and how they compile, shared by the CuPy backend and the CPU-only compile check.

`cuda/` is found by path (it must not be a package: see cuda/README.md). `common.cuh` is pasted
into each source, so editing the header changes every kernel's cache key. `nvrtc_compile` calls
NVRTC through ctypes: it needs only the compiler library and the CUDA headers (the
`nvidia-cuda-nvrtc` and `nvidia-cuda-runtime` wheels), no CuPy and no GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as T

from ..errors import InvalidInputError

KERNEL_DIR = Path(__file__).resolve().parents[2] / "cuda"
KERNEL_FILES = ("elementwise.cu", "dequant.cu", "fattn.cu", "ssm.cu")
COMMON_HEADER = "common.cuh"
KERNEL_FILE_BY_PREFIX = (("fattn_", "fattn.cu"), ("mask_to_indices", "fattn.cu"), ("dequant_", "dequant.cu"),
                         ("convert_", "dequant.cu"), ("ssm_", "ssm.cu"))

# (d_k, d_v) → query heads per block of the split-KV kernel (which also gathers sparse lists)
GATHER_SHAPES = {(64, 64): 16, (128, 128): 8, (256, 256): 4, (512, 512): 4, (576, 512): 2}
PREFILL_DIMS = (64, 128, 256)  # the WMMA kernel needs d_k == d_v
PF_ROWS = PF_TILE = 64
# Kernels that expand ggml blocks to f16: name, threads per block of data.
DEQUANT_KERNELS = {T.Q4_0: ("dequant_q4_0", 1), T.Q4_1: ("dequant_q4_1", 1), T.Q5_0: ("dequant_q5_0", 1),
                   T.Q5_1: ("dequant_q5_1", 1), T.Q8_0: ("dequant_q8_0", 1), T.Q4_K: ("dequant_q4_K", 8),
                   T.Q5_K: ("dequant_q5_K", 8), T.Q6_K: ("dequant_q6_K", 8)}
GENERATED_KERNELS = [f"fattn_decode_{d}_{dv}_{hg}" for (d, dv), hg in GATHER_SHAPES.items()] + \
    [f"fattn_prefill_{d}" for d in PREFILL_DIMS]


def kernel_file(kernel_name: str) -> str:
    return next((f for prefix, f in KERNEL_FILE_BY_PREFIX if kernel_name.startswith(prefix)), "elementwise.cu")


def prefill_smem_bytes(d: int) -> int:
    """Dynamic shared memory of fattn_prefill_<d>: Q/K/V/P tiles in f16, S, O, m, l in f32, columns."""
    return PF_ROWS * d * 2 * 3 + PF_ROWS * PF_TILE * 2 + PF_ROWS * PF_TILE * 4 + PF_ROWS * d * 4 + PF_ROWS * 4 * 2 \
        + PF_TILE * 4


@dataclass(frozen=True)
class Param:
    """One kernel parameter as its C declaration reads: base type, pointer or value, const."""
    base: str
    pointer: bool
    const: bool


@dataclass(frozen=True)
class KernelSignature:
    params: tuple[Param, ...]
    max_threads: int  # __launch_bounds__, or the device's 1024


_KERNEL = r'extern "C" __global__ void (?:__launch_bounds__\((\w+)\)\s*)?([\w#]+)\s*\(([^)]*)\)'


def kernel_signatures(source: str) -> dict[str, KernelSignature]:
    """Every extern "C" kernel of a source by name, the kernels that macros generate included."""
    text = source.replace("\\\n", " ")
    objects = dict(re.findall(r"#define (\w+)[ \t]+([^\n]*)", text))
    found: dict[str, tuple[str, str]] = {}
    for bounds, name, params in re.findall(_KERNEL, text):
        if "##" not in name:
            found[name] = (bounds, params)
    for macro, formal, body in re.findall(r"#define (\w+)\(([^)]*)\)([^\n]*)", text):
        kernel = re.search(_KERNEL, body)
        if not kernel:
            continue
        formal = [f.strip() for f in formal.split(",")]
        for actual in re.findall(rf"^{macro}\(([^)]*)\)", text, re.M):
            values = dict(zip(formal, (a.strip() for a in actual.split(","))))
            name = re.sub(r"\w+", lambda m: values.get(m.group(0), m.group(0)), kernel.group(2)).replace("##", "")
            found[name] = (kernel.group(1) or "", kernel.group(3))
    return {name: KernelSignature(_parse_params(params, objects), _launch_bound(bounds, objects))
            for name, (bounds, params) in found.items()}


def _launch_bound(bounds: str, objects: dict[str, str]) -> int:
    value = objects.get(bounds, bounds).strip()
    for _ in range(4):  # macros of macros: DECODE_THREADS is a number, PF_THREADS too
        value = re.sub(r"\b([A-Z_]\w*)\b", lambda m: objects.get(m.group(1), m.group(1)), value)
    return int(eval(value, {"__builtins__": {}})) if value else 1024  # noqa: S307 (an integer expression)


def _parse_params(params: str, objects: dict[str, str]) -> tuple[Param, ...]:
    for name, body in objects.items():
        params = re.sub(rf"\b{name}\b", body, params)
    out = []
    for param in (p.strip() for p in params.split(",") if p.strip()):
        const = param.startswith("const ")
        words = param.replace("const ", "").replace("__restrict__", "").replace("*", " * ").split()
        out.append(Param(" ".join(w for w in words[:-1] if w != "*"), "*" in words, const))
    return tuple(out)


class KernelCompileError(InvalidInputError):
    """A CUDA source that NVRTC refused (the message names the file and the first error)."""


def kernel_source(file_name: str) -> str:
    source = (KERNEL_DIR / file_name).read_text()
    return source.replace(f'#include "{COMMON_HEADER}"', (KERNEL_DIR / COMMON_HEADER).read_text())


def _nvidia_wheel_dirs(sub: str) -> list[Path]:
    """`nvidia/cu13/<sub>`-style folders of NVIDIA's pip wheels, newest CUDA first."""
    spec = importlib.util.find_spec("nvidia")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    found = [d / sub for root in roots for d in root.iterdir() if (d / sub).is_dir()]
    return sorted(found, key=lambda d: d.parent.name, reverse=True)


def cuda_include_dirs() -> list[str]:
    """Folders that hold cuda_fp16.h: the pip wheels', $CUDA_PATH's, /usr/local/cuda's."""
    candidates = _nvidia_wheel_dirs("include")
    candidates += [Path(os.environ[v]) / "include" for v in ("CUDA_PATH", "CUDA_HOME") if v in os.environ]
    candidates.append(Path("/usr/local/cuda/include"))
    return [str(d) for d in candidates if (d / "cuda_fp16.h").is_file()]


def compile_options(include_dirs: list[str] | None = None) -> tuple[str, ...]:
    dirs = cuda_include_dirs() if include_dirs is None else include_dirs
    return ("--std=c++17", *(f"-I{d}" for d in dirs))


def _load_nvrtc() -> ctypes.CDLL:
    names = [str(p) for d in _nvidia_wheel_dirs("lib") for p in sorted(d.glob("libnvrtc.so*"))
             if "builtins" not in p.name]
    system = ctypes.util.find_library("nvrtc")
    for name in names + ([system] if system else []):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise KernelCompileError("NVRTC not found (pip install nvidia-cuda-nvrtc, or install the CUDA toolkit)")


def nvrtc_compile(file_name: str, arch: str = "sm_90") -> bytes:
    """Compile one cuda/ source to a cubin for `arch`; a compile error raises KernelCompileError."""
    lib = _load_nvrtc()
    source = kernel_source(file_name).encode()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source, file_name.encode(), 0, None, None), file_name)
    try:
        options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in compile_options())]
        argv = (ctypes.c_char_p * len(options))(*options)
        if lib.nvrtcCompileProgram(prog, len(options), argv) != 0:
            raise KernelCompileError(f"{file_name} does not compile for {arch}: {_first_error(_log(lib, prog))}")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), file_name)
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, cubin), file_name)
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _log(lib, prog) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def _first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line]
    return (errors or lines or ["(no log)"])[0]


def _check(lib, status: int, file_name: str) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise KernelCompileError(f"NVRTC failed on {file_name}: {lib.nvrtcGetErrorString(status).decode()}")
