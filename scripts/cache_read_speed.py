"""What reading the KV cache costs a decoded token, per cache type: one query row's attention over
every layer's cache at a given depth, as a decode step runs it (the caches together are larger
than the CPU's caches, so each layer's is read from memory).

    python scripts/cache_read_speed.py [--depth 4096] [--layers 30] [--heads 9 --kv-heads 3 --head-dim 64] [-r 15]

Each round times every type once, in turn (the machine's noise then touches them alike); the table
gives each type's median over the rounds, in ms per token, and its ratio to f16. `q8_0 (tiles)` is
the way a block cache was read before attention.attend_blocks: BLAS over rows converted a key block
at a time (the backend's prompt path, run here for one row).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType

from llmsuite.core.backend import CPUBackend
from llmsuite.core.backend.cpu import alibi_slopes
from llmsuite.core.backend.weights import BlockRows
from llmsuite.core.memory import CACHE_TYPES
from llmsuite.core.quants import quantize_rows


def layer_caches(type_name: str, layers: int, depth: int, n_head_kv: int, head_dim: int, rng):
    """Per layer, K and V of `depth` cells in the cache type, as a KV cache hands them to attention."""
    out = []
    for _ in range(layers):
        pair = []
        for _ in range(2):
            x = rng.standard_normal((depth, n_head_kv * head_dim)).astype(np.float32)
            if type_name in ("f32", "f16"):
                pair.append(x.astype(type_name.replace("f", "float")).reshape(depth, n_head_kv, head_dim))
            else:
                qtype = GGMLQuantizationType[type_name.upper()]
                pair.append(BlockRows(quantize_rows(x, qtype), int(qtype), n_head_kv, head_dim))
        out.append(pair)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    backend = CPUBackend()
    q = rng.standard_normal((1, args.heads, args.head_dim)).astype(np.float32)
    mask = np.zeros((1, args.depth), np.float32)
    slopes = alibi_slopes(args.heads, 0.0)
    runs = {name: layer_caches(name, args.layers, args.depth, args.kv_heads, args.head_dim, rng) for name in CACHE_TYPES}

    def one_token(name):
        if name == "q8_0 (tiles)":
            for k, v in runs["q8_0"]:
                backend._attend_tiles(q, k, v, mask, 0.125, 0.0, None, slopes)
        else:
            for k, v in runs[name]:
                backend.flash_attn_ext(q, k, v, mask, 0.125)

    names = [*CACHE_TYPES, "q8_0 (tiles)"]
    times = {name: [] for name in names}
    for name in names:
        one_token(name)  # compile or load the kernels
    for _ in range(args.rounds):
        for name in names:
            start = time.perf_counter()
            one_token(name)
            times[name].append(time.perf_counter() - start)
    f16 = np.median(times["f16"])
    print(f"one query row, {args.heads} heads over {args.kv_heads}, head size {args.head_dim}, depth {args.depth}, "
          f"{args.layers} layers; median of {args.rounds} rounds\n")
    print("| cache | ms per token | vs f16 |\n| --- | ---: | ---: |")
    for name in names:
        median = np.median(times[name])
        print(f"| {name} | {median * 1e3:.2f} | {median / f16:.2f}x |")


if __name__ == "__main__":
    main()
