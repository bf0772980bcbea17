"""What one __syncthreads costs the emulated device: a 128-thread block crossing 20,000 barriers.

    python scripts/cuda_emu_switch_cost.py

Builds a probe kernel for the host (as cuda/*.cu are built) and prints nanoseconds per barrier
and per thread arrival. With LLMSUITE_CUDA_EMU_CXXFLAGS=-DEMU_UCONTEXT the threads switch with
ucontext instead of the hand-written x86-64 switch (docs/cuda-emu.md compares them, and OS threads).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from llmsuite.core.backend import hostcuda, kernels
from llmsuite.core.backend.cuda_emu import DeviceArray

PROBE = r"""
#include "common.cuh"
extern "C" __global__ void barriers(float * out, int rounds) {
    float v = 0.0f;
    for (int r = 0; r < rounds; ++r) { v += 1.0f; __syncthreads(); }
    out[threadIdx.x] = v;
}
"""


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    shutil.copy(kernels.KERNEL_DIR / kernels.COMMON_HEADER, folder)
    (folder / "switch_cost.cu").write_text(PROBE)
    hostcuda.KERNEL_DIR = folder
    kernel = hostcuda.HostModule("switch_cost.cu", hostcuda.build("switch_cost.cu")).get_function("barriers")
    out, rounds = np.zeros(128, np.float32).view(DeviceArray), 20000
    t0 = time.perf_counter()
    kernel((1,), (128,), (out, np.int32(rounds)))
    seconds = time.perf_counter() - t0
    assert (out == rounds).all()
    print(f"128 fibers: {seconds / rounds * 1e6:.2f} us per __syncthreads, {seconds / rounds / 128 * 1e9:.0f} ns per arrival")
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
