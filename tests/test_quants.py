"""Every fast dequantization path is bit-exact with gguf-py's reference implementation."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants

from llmsuite.core.quants import FAST_TYPES, dequantize

# byte offsets of the f16 scale fields in each block (random bytes there could be inf/nan)
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82],
              T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0]}


def random_blocks(qtype: T, n_blocks: int, rng) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16, T.BF16):
        values = rng.standard_normal(n_blocks * type_size // 4 * 4).astype(np.float32)
        if qtype == T.F16:
            return values[: n_blocks * type_size // 2].astype(np.float16).view(np.uint8).reshape(n_blocks, type_size)
        if qtype == T.BF16:
            half = (values[: n_blocks * type_size // 2].view(np.uint32) >> 16).astype(np.uint16)
            return half.view(np.uint8).reshape(n_blocks, type_size)
        return values[: n_blocks * type_size // 4].view(np.uint8).reshape(n_blocks, type_size)
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for at in F16_FIELDS.get(qtype, []):
        blocks[:, at:at + 2] = rng.standard_normal(n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("qtype", sorted(FAST_TYPES | {T.IQ4_NL}, key=lambda t: t.value), ids=lambda t: t.name)
def test_dequantize_matches_gguf(qtype):
    rng = np.random.default_rng(qtype.value)
    blocks = random_blocks(qtype, 300, rng)
    block, _ = GGML_QUANT_SIZES[qtype]
    ours = dequantize(blocks.reshape(-1), qtype, 300 * block)
    ref = quants.dequantize(blocks, qtype).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_required_types_have_fast_paths():
    required = {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K}
    assert required <= FAST_TYPES


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_quantize_rows_matches_gguf(qtype):
    from llmsuite.core.quants import dequantize_rows, quantize_rows

    rows = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32) * 3
    rows[0] = 0.0  # an all-zero block
    ours = quantize_rows(rows, qtype)
    np.testing.assert_array_equal(ours.reshape(-1), quants.quantize(rows, qtype).reshape(-1))
    np.testing.assert_array_equal(dequantize_rows(ours, qtype), quants.dequantize(ours, qtype).reshape(64, 256))
