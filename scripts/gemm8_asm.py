"""The instructions the 8-bit GEMM's hot loop compiles to (numba's inspect_asm), for docs/performance.md.

    python scripts/gemm8_asm.py [--type Q4_K] [--listing]

Compiles gemm_int8.GEMM[type] for one weight and finds the innermost loop that holds the 8-bit dots
(vpdpbusd, or AVX2's vpmaddubsw): prints its instruction counts by mnemonic, and with --listing the
loop itself. Set LLMSUITE_GEMM8_ISA=avx2|vnni256 to see a narrower path.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections import Counter

# compiled here, not loaded from numba's cache: the cache keeps no assembly of the parallel loops
os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="gemm8-asm-")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from llmsuite.core.backend.cpu import gemm_int8  # noqa: E402
from llmsuite.core.ops import random_weight  # noqa: E402

DOTS = ("vpdpbusd", "vpmaddubsw")


def hot_loop(asm: str) -> list[str]:
    """The instructions from the loop label before the first 8-bit dot to the backward jump to it."""
    lines = [line.strip() for line in asm.splitlines()]
    first_dot = next(i for i, line in enumerate(lines) if line.split(" ")[0].split("\t")[0] in DOTS)
    label_at = max(i for i in range(first_dot) if re.match(r"^\.?L\w+:", lines[i]))
    label = lines[label_at].rstrip(":")
    end = next(i for i in range(first_dot, len(lines)) if re.search(rf"\bj\w+\s+{re.escape(label)}$", lines[i]))
    return [line for line in lines[label_at + 1:end + 1] if line and not line.startswith((".", "#"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="Q4_K", choices=[T(t).name for t in gemm_int8.GEMM])
    ap.add_argument("--listing", action="store_true")
    args = ap.parse_args()
    qtype = T[args.type]
    raw = np.ascontiguousarray(random_weight(np.random.default_rng(0), qtype.name, 8, 512)).view(np.uint8)
    kernel = gemm_int8.GEMM[int(qtype)]
    call = (raw.reshape(8, -1), np.ones((8, 512), np.float32), np.empty((8, 8), np.float32), 0, 4)
    kernel(*call)
    asm = kernel.inspect_asm(tuple(numba.typeof(a) for a in call))
    loop = hot_loop(asm)
    counts = Counter(line.split()[0] for line in loop)
    print(f"{qtype.name} on {gemm_int8.ISA}, R={gemm_int8.R} weight rows x C={gemm_int8.C} activation rows, "
          f"{gemm_int8.LANES} lanes: {len(loop)} instructions in the loop")
    print(", ".join(f"{name} {n}" for name, n in counts.most_common()))
    if args.listing:
        print("\n".join(loop))


if __name__ == "__main__":
    main()
