"""How fast the CPU mat-vec kernels read a real model's weights, type by type, as a decoded token
reads them: every matrix once, from memory (the model is larger than the caches).

    python scripts/kernel_speed.py [-m gemma3-270m] [-t 1,2] [-r 10] [--rows 1] [--kernels float|int|int-avx2]

For each GGUF type of the model's matrices, the script runs the chosen mat-vec kernels
(matvec_float.MATVEC, or ggml numerics' integer dots matvec_int.MATVEC, or those with the 32-value
K-quant emitters, matvec_int.MATVEC_AVX2) over all the matrices of that type in model order (a layer's parts one after the other, as the forward pass
does), `-r` times, and keeps the fastest pass. Prints one markdown row per type and thread count:
bytes read, milliseconds per pass, GB/s.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numba
import numpy as np
from gguf import GGMLQuantizationType

from llmsuite.core.backend.cpu import matvec_float, matvec_int
from llmsuite.core.backend.weights import QuantWeight
from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model


def model_weights(model) -> list[QuantWeight]:
    """Every quantized matrix the forward pass multiplies by, layer by layer, then the head."""
    found = []
    for layer in model.layers:
        found += [w for w in vars(layer).values() if isinstance(w, QuantWeight)]
    if isinstance(getattr(model, "output", None), QuantWeight):
        found.append(model.output)
    return found


def parts_by_type(weights) -> dict[int, list]:
    """(raw part, n_in) lists keyed by the part's type, in model order."""
    groups = defaultdict(list)
    for w in weights:
        for part, _ in w.spans():
            groups[part.qtype].append((part.raw, w.n_in))
    return groups


def fastest_pass(kernel, parts, rows: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    xs = {n_in: rng.standard_normal((rows, n_in)).astype(np.float32) for _, n_in in parts}
    outs = [np.empty((rows, raw.shape[0]), np.float32) for raw, _ in parts]

    def one_pass():
        for (raw, n_in), out in zip(parts, outs):
            kernel(raw, xs[n_in], out)

    one_pass()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - t0)
    return best


KERNELS = {"float": matvec_float.MATVEC, "int": matvec_int.MATVEC, "int-avx2": matvec_int.MATVEC_AVX2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-r", "--reps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1, help="activation rows per mat-vec")
    ap.add_argument("--kernels", choices=sorted(KERNELS), default="float")
    args = ap.parse_args()
    kernels = KERNELS[args.kernels]
    model = load_model(resolve_model(args.model))
    groups = parts_by_type(model_weights(model))
    print("| model | kernels | type | threads | rows | MB | ms per pass | GB/s |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for threads in (int(t) for t in args.threads.split(",")):
        numba.set_num_threads(threads)
        for qtype, parts in sorted(groups.items()):
            nbytes = sum(raw.nbytes for raw, _ in parts)
            if qtype not in kernels:
                continue
            best = fastest_pass(kernels[qtype], parts, args.rows, args.reps)
            print(f"| {args.model} | {args.kernels} | {GGMLQuantizationType(qtype).name} | {threads} | {args.rows} | "
                  f"{nbytes / 1e6:.1f} | {best * 1e3:.2f} | {nbytes / best / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
