"""The 8-bit prompt GEMM against the float path it replaced, on one weight of a real shape.

    python scripts/gemm8_speed.py [--rows 512] [-r 3] [--shapes Q4_K:2048x8192,Q6_K:8192x2048,...]

For each TYPE:N_INxN_OUT (a random weight of that type), ggml numerics' product of `--rows`
activation rows both ways: gemm_int8.GEMM (integer codes, tiles unpacked once) and the float path
(activations rounded to q8 blocks, weight tiles dequantized for BLAS; CPUBackend._matmul_ggml_float).
Prints the fastest of -r runs of each, in ms and GMAC/s, and their largest difference relative to
the largest output.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from llmsuite.core.backend import CPUBackend
from llmsuite.core.backend.cpu import gemm_int8, gemm_tasks
from llmsuite.core.backend.weights import QuantWeight
from llmsuite.core.ops import random_weight

SHAPES = "Q4_K:2048x8192,Q6_K:8192x2048,Q8_0:2048x8192,Q4_1:1536x576,Q5_0:640x2048"


def fastest(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    backend = CPUBackend(numerics="ggml")
    print(f"8-bit GEMM on {gemm_int8.ISA}, {args.rows} rows\n")
    print("| type | n_in x n_out | gemm8 ms | GMAC/s | float path ms | GMAC/s | speedup | max rel diff |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.shapes.split(","):
        name, dims = spec.split(":")
        n_in, n_out = (int(v) for v in dims.split("x"))
        raw = np.ascontiguousarray(random_weight(rng, name, n_out, n_in)).view(np.uint8).reshape(n_out, -1)
        w = QuantWeight.from_raw(raw, T[name], (n_out, n_in))
        x = rng.standard_normal((args.rows, n_in)).astype(np.float32)
        ours, theirs = np.empty((args.rows, n_out), np.float32), np.empty((args.rows, n_out), np.float32)
        t_gemm = fastest(lambda: gemm_int8.GEMM[int(T[name])](raw, x, ours, 0, gemm_tasks()), args.reps)  # noqa: B023
        t_float = fastest(lambda: backend._matmul_ggml_float(x, w, theirs), args.reps)  # noqa: B023
        macs = args.rows * n_in * n_out / 1e9
        diff = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"| {name} | {n_in} x {n_out} | {t_gemm * 1e3:.1f} | {macs / t_gemm:.0f} | {t_float * 1e3:.1f} | "
              f"{macs / t_float:.0f} | {t_float / t_gemm:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
