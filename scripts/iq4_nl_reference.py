"""Cache rows quantized to IQ4_NL by llama.cpp's own ggml (quantize_row_iq4_nl_ref, the from_float
ggml-cpu takes for an IQ4_NL cache), saved as data for tests/test_quants.py: gguf-py has no IQ4_NL
quantizer to test against.

    python scripts/iq4_nl_reference.py --lib $LLAMACPP_BIN/libggml-base.so

writes tests/fixtures/llama/iq4_nl_rows.npz (rows, their blocks as ggml wrote them).
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llama" / "iq4_nl_rows.npz"


def sample_rows(rng) -> np.ndarray:
    """Rows of the shapes a cache holds and the edges of the quantizer: plain normal values, scales
    over many orders of magnitude, rare outliers, uniform values, exact levels, a constant row and
    values near GROUP_MAX_EPS. Every block has a value above zero: ggml leaves an all-zero block's
    codes as its previous block left them."""
    n = 128
    normal = rng.standard_normal((16, n))
    return np.concatenate([
        normal,
        normal * rng.lognormal(0, 4, (16, 1)),
        np.where(rng.random((16, n)) < 0.03, 50.0, 1.0) * rng.standard_normal((16, n)),
        rng.uniform(-1, 1, (16, n)),
        rng.integers(-127, 114, (8, n)) / 9.0,
        np.full((2, n), 0.37),
        rng.standard_normal((4, n)) * 1e-14,
    ]).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="llama.cpp's libggml-base.so")
    args = parser.parse_args()
    quantize = ctypes.CDLL(args.lib).quantize_row_iq4_nl_ref
    quantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    rows = sample_rows(np.random.default_rng(4))
    blocks = np.zeros((len(rows), rows.shape[1] // 32 * 18), dtype=np.uint8)
    for row, out in zip(rows, blocks):
        quantize(row.ctypes.data, out.ctypes.data, len(row))
    np.savez_compressed(OUT, rows=rows, blocks=blocks)
    print(f"{OUT}: {len(rows)} rows of {rows.shape[1]} values")


if __name__ == "__main__":
    main()
