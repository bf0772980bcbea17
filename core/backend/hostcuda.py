"""cuda/*.cu built for the host and run there, thread by thread, as a GPU would run them.

`cuda/host/cuda_host.h` supplies CUDA's device model in C++ (every thread of a block a fiber,
barriers and warp collectives that really wait, IEEE f16, wmma); this module builds each source
with the system C++ compiler into a shared library, once per source hash (cached beside the
models, in `$LLMSUITE_HOME/cuda-emu`), and launches its kernels with cuLaunchKernel's checks:
the arguments against the kernel's C signature, the grid, block and shared memory against what
an sm_90 device accepts. A kernel that deadlocks, or runs past the time limit, is stopped and
reported with its name and launch shape.

Environment: `LLMSUITE_CUDA_EMU_TIMEOUT` (seconds a launch may run, default 120),
`LLMSUITE_CUDA_EMU_SCHEDULE` (`forward`, `reverse` or `shuffle`: the order a block's threads
run in), `LLMSUITE_CUDA_EMU_SANITIZE=1` (an AddressSanitizer/UBSan build; the process must start
with the ASan runtime preloaded, see scripts/cuda_emu_sanitize.sh), `CXX` (the compiler),
`LLMSUITE_CUDA_EMU_CXXFLAGS` (more flags: `-DEMU_UCONTEXT` switches threads with ucontext).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InvalidInputError, LLMError
from .kernels import COMMON_HEADER, KERNEL_DIR, KernelCompileError, KernelSignature, kernel_signatures

HOST_DIR = KERNEL_DIR / "host"
MAX_DYNAMIC_SHARED = 232448  # sm_90: 227 KiB per block when a kernel opts in
DEFAULT_DYNAMIC_SHARED = 48 * 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
SCHEDULES = {"forward": 0, "reverse": 1, "shuffle": 2}
POINTEE = {"float": np.float32, "__half": np.float16, "int": np.int32, "long long": np.int64,
           "unsigned char": np.uint8, "unsigned short": np.uint16, "unsigned int": np.uint32}
SCALAR = {"int": (np.int32, ctypes.c_int32), "long long": (np.int64, ctypes.c_int64),
          "float": (np.float32, ctypes.c_float), "unsigned int": (np.uint32, ctypes.c_uint32)}
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;")


class KernelFault(LLMError):
    """An emulated kernel that deadlocked, ran too long, or broke a rule the device enforces."""


def compiler() -> str | None:
    """The C++ compiler to build with: $CXX, else g++, clang++ or c++ on the PATH."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def unavailable_reason() -> str | None:
    return None if compiler() else "no C++ compiler found (install g++, or set CXX)"


def sanitizing() -> bool:
    return os.environ.get("LLMSUITE_CUDA_EMU_SANITIZE", "") not in ("", "0")


def timeout_seconds() -> float:
    value = os.environ.get("LLMSUITE_CUDA_EMU_TIMEOUT", "120")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InvalidInputError(f"LLMSUITE_CUDA_EMU_TIMEOUT is '{value}' (a number of seconds above 0)")
    return seconds


def build_flags() -> list[str]:
    flags = ["-std=c++20", "-fPIC", "-shared", "-Wno-unknown-pragmas", "-ffp-contract=fast", "-fno-math-errno",
             "-fno-extern-tls-init"]  # `extern __shared__` arrays are thread_local ones without initializers
    if _cpu_has("fma"):  # nvcc contracts a * b + c into one rounding, as --fmad=true does by default
        flags.append("-mfma")
    flags += os.environ.get("LLMSUITE_CUDA_EMU_CXXFLAGS", "").split()  # e.g. -DEMU_UCONTEXT: ucontext's switches
    if sanitizing():
        return flags + ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    return flags + ["-O2"]


@lru_cache(maxsize=None)
def _cpu_has(flag: str) -> bool:
    try:
        return any(line.startswith("flags") and f" {flag} " in f"{line} " for line in open("/proc/cpuinfo"))
    except OSError:
        return False


# ---- the build -----------------------------------------------------------------------------------


def host_source(file_name: str) -> tuple[str, dict[str, KernelSignature]]:
    """The source as the host compiler reads it: common.cuh pasted in with #line markers (errors
    name the right file and line), then a generated appendix: an entry point per kernel that takes
    cuLaunchKernel's argument array; and before it, the storage of every `extern __shared__` array."""
    text = (KERNEL_DIR / file_name).read_text()
    header = (KERNEL_DIR / COMMON_HEADER).read_text()
    include = f'#include "{COMMON_HEADER}"'
    if include in text:
        before, after = text.split(include, 1)
        line = before.count("\n") + 1
        text = f'{before}#line 1 "{COMMON_HEADER}"\n{header}\n#line {line + 1} "{file_name}"{after}'
    signatures = kernel_signatures(text)
    # the dynamic shared arrays are defined before the source: an `extern thread_local` array the
    # compiler has not seen defined is reached through an initialization hook it may leave null
    shared = {name: ctype for ctype, name in _EXTERN_SHARED.findall(text)}
    prelude = ['#include "cuda_host.h"']
    for name, ctype in shared.items():
        prelude.append(f"thread_local {ctype} {name}[emu::kMaxDynamicShared / sizeof({ctype})] __attribute__((aligned(1024)));")
    poison = " ".join(f"memset({name}, 0xff, n);" for name in shared)
    prelude.append(f"static void emu_poison(size_t n) {{ {poison} }}")
    prelude.append("static const int emu_poison_set = (emu::g_poison_dynamic_shared = emu_poison, 0);")
    appendix = ['#line 1 "<host appendix>"']
    for name in signatures:
        appendix.append(f'extern "C" __attribute__((visibility("default"))) void emu_entry_{name}(void ** a) '
                        f"{{ emu::entry<&{name}>(a); }}")
    return "\n".join(prelude) + f'\n#line 1 "{file_name}"\n{text}\n' + "\n".join(appendix) + "\n", signatures


def cache_dir() -> Path:
    from ..hub import home

    return home() / "cuda-emu"


def library_path(file_name: str, cxx: str) -> tuple[Path, str]:
    source, _ = host_source(file_name)
    headers = "".join(p.read_text() for p in sorted(HOST_DIR.glob("*.h")))
    key = hashlib.sha256("\0".join([source, headers, cxx, _compiler_version(cxx), *build_flags()]).encode())
    stem = Path(file_name).stem
    return cache_dir() / f"{stem}-{key.hexdigest()[:16]}{'-asan' if sanitizing() else ''}.so", source


@lru_cache(maxsize=None)  # part of every cache key: one `--version` run per process, not per lookup
def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def build(file_name: str, cxx: str | None = None) -> Path:
    """Compile one source for the host (or find it compiled); a compile error names file and line."""
    cxx = cxx or compiler()
    if cxx is None:
        raise InvalidInputError(f"backend unavailable: cuda-emu: {unavailable_reason()}")
    target, source = library_path(file_name, cxx)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.{os.getpid()}")
    command = [cxx, *build_flags(), "-I", str(HOST_DIR), "-I", str(KERNEL_DIR), "-x", "c++", "-", "-o", str(scratch)]
    done = subprocess.run(command, input=source, capture_output=True, text=True)
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        raise KernelCompileError(f"{file_name} does not build for the host: {_first_error(done.stderr)}")
    os.replace(scratch, target)  # atomic: a concurrent build of the same source writes the same bytes
    return target


def _first_error(log: str) -> str:
    for line in log.splitlines():
        match = re.match(r"(?:\S*/)?([^/:\s]+):(\d+):(?:\d+:)? (?:fatal )?error: (.*)", line)
        if match:
            return f"{match.group(1)} line {match.group(2)}: {match.group(3)}"
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return lines[0] if lines else "the compiler failed without a message"


def build_all(file_names, progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Build the sources (in parallel); `progress` hears of each build that is not cached yet."""
    cxx = compiler()
    if cxx is None:
        raise InvalidInputError(f"backend unavailable: cuda-emu: {unavailable_reason()}")
    missing = [f for f in file_names if not library_path(f, cxx)[0].exists()]
    if missing and progress:
        progress(f"building {', '.join(missing)} for the host with {Path(cxx).name} (once per source)")
    with ThreadPoolExecutor(max_workers=max(1, min(len(file_names), os.cpu_count() or 1))) as pool:
        return dict(zip(file_names, pool.map(lambda f: build(f, cxx), file_names)))


# ---- loading and launching ---------------------------------------------------------------------------


class HostModule:
    """One built source: its kernels by name (cupy.RawModule's get_function)."""

    def __init__(self, file_name: str, path: Path, launches: list | None = None):
        self.file_name, self.launches = file_name, launches
        if sanitizing() and "asan" not in os.environ.get("LD_PRELOAD", ""):
            raise InvalidInputError("LLMSUITE_CUDA_EMU_SANITIZE needs the ASan runtime loaded first: run under "
                                    "scripts/cuda_emu_sanitize.sh (it sets LD_PRELOAD)")
        self.lib = ctypes.CDLL(str(path))
        self.lib.emu_launch.restype = ctypes.c_int
        self.lib.emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_uint] * 6, ctypes.c_ulonglong,
                                        ctypes.c_double, ctypes.c_char_p, ctypes.c_ulonglong]
        order = os.environ.get("LLMSUITE_CUDA_EMU_SCHEDULE", "forward")
        if order not in SCHEDULES:
            raise InvalidInputError(f"LLMSUITE_CUDA_EMU_SCHEDULE is '{order}' (choose from {', '.join(SCHEDULES)})")
        self.lib.emu_set_schedule(SCHEDULES[order], ctypes.c_ulonglong(0x5EED))
        self.signatures = kernel_signatures(host_source(file_name)[0])

    def get_function(self, name: str) -> "HostKernel":
        if name not in self.signatures:
            raise KeyError(f"no kernel named {name} in {self.file_name}")
        entry = ctypes.cast(getattr(self.lib, f"emu_entry_{name}"), ctypes.c_void_p).value
        return HostKernel(name, self.signatures[name], self.lib, entry, self.launches)


class HostKernel:
    """A kernel of a host build, called as cupy.RawKernel is: kernel(grid, block, args, shared_mem=)."""

    def __init__(self, name: str, signature: KernelSignature, lib, entry: int, launches: list | None = None):
        self.name, self.signature, self.lib, self.entry, self.launches = name, signature, lib, entry, launches
        self._max_dynamic = DEFAULT_DYNAMIC_SHARED

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        if not 0 <= value <= MAX_DYNAMIC_SHARED:
            raise KernelFault(f"{self.name}: {value} bytes of dynamic shared memory (an sm_90 block takes at most "
                              f"{MAX_DYNAMIC_SHARED})")
        self._max_dynamic = value

    def __call__(self, grid, block, args, shared_mem: int = 0, stream=None) -> None:
        grid, block = _dims(grid), _dims(block)
        where = f"{self.name} grid {grid} block {block}"
        self._check_shape(grid, block, shared_mem, where)
        values = self._marshal(args, where)
        if self.launches is not None:
            self.launches.append(self.name)
        exact = _exact_copies(args, values, self.signature) if sanitizing() else []
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        error = ctypes.create_string_buffer(1024)
        status = self.lib.emu_launch(self.entry, pointers, *grid, *block, shared_mem, timeout_seconds(), error, 1024)
        for arg, copy, writable in exact:
            if writable:
                ctypes.memmove(arg.__array_interface__["data"][0], copy.ctypes.data, copy.nbytes)
        if status:
            raise KernelFault(f"cuda-emu: {where}: {error.value.decode(errors='replace')}")

    def _check_shape(self, grid, block, shared_mem: int, where: str) -> None:
        threads = block[0] * block[1] * block[2]
        if any(not 1 <= b <= m for b, m in zip(block, MAX_BLOCK)) or threads > self.signature.max_threads:
            raise KernelFault(f"cuda-emu: {where}: the device refuses a block of {threads} threads "
                              f"(this kernel takes at most {self.signature.max_threads})")
        if any(not 1 <= g <= m for g, m in zip(grid, MAX_GRID)):
            raise KernelFault(f"cuda-emu: {where}: the device refuses this grid")
        if not 0 <= shared_mem <= self._max_dynamic:
            raise KernelFault(f"cuda-emu: {where}: {shared_mem} bytes of dynamic shared memory, over the kernel's "
                              f"limit of {self._max_dynamic}")

    def _marshal(self, args, where: str) -> list:
        params = self.signature.params
        if len(args) != len(params):
            raise KernelFault(f"cuda-emu: {where}: {len(args)} arguments for {len(params)} parameters")
        values = []
        for i, (param, arg) in enumerate(zip(params, args)):
            what = f"cuda-emu: {where}: argument {i} ({'const ' if param.const else ''}{param.base}" \
                   f"{' *' if param.pointer else ''})"
            if param.pointer:
                values.append(ctypes.c_void_p(_pointer(arg, param, what)))
            else:
                kind, ctype = SCALAR[param.base]
                if type(arg) is not kind:  # what CuPy would pass differently: a Python int is 8 bytes
                    raise KernelFault(f"{what}: got {type(arg).__name__}")
                values.append(ctype(arg.item()))
        return values


def _exact_copies(args, values: list, signature: KernelSignature) -> list:
    """Under the sanitizer each array argument is copied to an allocation of exactly its extent, and
    the kernel gets the copy: a read past what the launch was given (a K/V row past the cache's
    view, a mask row past its end) is then past an allocation, which ASan reports."""
    copies = []
    for i, (param, arg) in enumerate(zip(signature.params, args)):
        if not param.pointer or not isinstance(arg, np.ndarray) or arg.size == 0:
            continue
        if any(s < 0 for s in arg.strides):
            raise KernelFault("cuda-emu: a negative stride cannot be a kernel argument")
        extent = sum((n - 1) * s for n, s in zip(arg.shape, arg.strides)) + arg.itemsize
        copy = np.empty(extent, np.uint8)
        ctypes.memmove(copy.ctypes.data, arg.__array_interface__["data"][0], extent)
        values[i] = ctypes.c_void_p(copy.ctypes.data)
        copies.append((arg, copy, not param.const))
    return copies


def _dims(d) -> tuple[int, int, int]:
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if not 1 <= len(d) <= 3 or any(type(v) is not int for v in d):
        raise KernelFault(f"cuda-emu: launch dimensions {d} are not 1 to 3 ints")
    return (*d, *(1,) * (3 - len(d)))


def _pointer(arg, param, what: str) -> int | None:
    if isinstance(arg, np.uint64) and arg == 0:
        return None
    if not isinstance(arg, np.ndarray):
        raise KernelFault(f"{what}: got {type(arg).__name__}")
    if arg.dtype != POINTEE[param.base]:
        raise KernelFault(f"{what}: got an array of {arg.dtype}")
    address = arg.__array_interface__["data"][0]
    if address % arg.dtype.itemsize:
        raise KernelFault(f"{what}: misaligned address")
    return address
