"""Every fast dequantization path is bit-exact with gguf-py's reference implementation."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants
from conftest import FIXTURES

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


# ---- --numerics ggml: ggml-cpu's q8_0/q8_1 activations and its Q4_1/Q5_1 dot ---------------------

def ggml_q8_blocks(x: np.ndarray):
    """quantize_row_q8_1 as ggml-cpu's x86 code runs it: per 32 values the multiplier 127/amax,
    round to even, the f16 scale of amax/127 and s = f16(amax/127 · Σq)."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    q = np.round(blocks * (np.float32(127) / amax)[:, None]).astype(np.int64)
    d = amax / np.float32(127)
    return q, d.astype(np.float16), (d * q.sum(axis=1)).astype(np.float32).astype(np.float16)


def ggml_dot_1(row_blocks: np.ndarray, qtype: T, x: np.ndarray) -> float:
    """ggml_vec_dot_q4_1_q8_1 / q5_1_q8_1 in exact arithmetic: Σ d·d8·(q·q8) + m·s8."""
    q8, d8, s8 = ggml_q8_blocks(x)
    weights = quants.dequantize(row_blocks, qtype).reshape(-1, 32).astype(np.float64)
    d = row_blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    m = row_blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
    q = np.rint((weights - m[:, None]) / d[:, None])  # the integer codes back from the values
    return float((d * d8 * (q * q8).sum(axis=1) + m * s8).sum())


def boundary_blocks(rng, n: int) -> np.ndarray:
    """Blocks whose rounding differs between x·(127/amax) and x·(1/(amax/127)): where an
    emulation that divides by the scale flips a value ggml does not."""
    found = []
    while len(found) < n:
        x = rng.standard_normal((4096, 32)).astype(np.float32)
        amax = np.abs(x).max(axis=1, keepdims=True)
        exact = np.round(x * (np.float32(127) / amax))
        divided = np.round(x * (np.float32(1) / (amax / np.float32(127))))
        found.extend(x[(exact != divided).any(axis=1)])
    return np.array(found[:n], dtype=np.float32)


@pytest.mark.parametrize("n_rows", [3, 12])  # 3: the integer kernels (matvec_int); 12: rounding, then BLAS
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_ggml_numerics_equal_ggml_integer_dot(qtype, n_rows):
    from llmsuite.core.backend import get_backend
    from llmsuite.core.backend.weights import QuantWeight

    rng = np.random.default_rng(7)
    n_in, n_out = 256, 24
    blocks = random_blocks(qtype, n_out * n_in // 32, rng)
    blocks[:, 2:4] = (rng.standard_normal(len(blocks)) * 4).astype(np.float16).view(np.uint8).reshape(-1, 2)
    x = np.concatenate([boundary_blocks(rng, 8).reshape(1, -1),
                        3 + rng.standard_normal((n_rows - 1, n_in), np.float32)])
    w = QuantWeight.from_raw(blocks, qtype, (n_out, n_in))
    ours = get_backend("cpu", numerics="ggml").matmul(x, w)
    rows = blocks.reshape(n_out, n_in // 32, -1)
    want = np.array([[ggml_dot_1(rows[r], qtype, xi) for r in range(n_out)] for xi in x])
    np.testing.assert_allclose(ours, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype", [T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_cache_rows_quantize_as_ggml_bit_for_bit(qtype):
    """A cache row is stored as ggml-cpu stores it (ggml-quants.c's reference quantizers, which
    gguf-py's quantize mirrors): flat blocks, constant blocks and large values included."""
    from llmsuite.core.quants import dequantize_rows, quantize_rows

    rows = np.random.default_rng(int(qtype)).standard_normal((24, 256)).astype(np.float32)
    rows[1, :32], rows[2, 32:64], rows[3] = 0.0, 1.5, rows[3] * 300
    if qtype == T.BF16:
        rows[4, :3] = np.nan, np.inf, 1.00390625  # a NaN stays one, a tie rounds to even
    np.testing.assert_array_equal(quantize_rows(rows, qtype), quants.quantize(rows, qtype))
    assert np.array_equal(dequantize_rows(quantize_rows(rows, qtype), qtype),
                          quants.dequantize(quants.quantize(rows, qtype), qtype), equal_nan=True)


def test_iq4_nl_cache_rows_quantize_as_llama_cpp_bit_for_bit():
    """IQ4_NL (gguf-py has no quantizer for it) against the blocks llama.cpp's own
    quantize_row_iq4_nl_ref wrote (scripts/iq4_nl_reference.py): the levels from max/-127, the
    weighted least-squares scale, ties between levels going up."""
    from llmsuite.core.quants import dequantize_rows, quantize_rows

    reference = np.load(FIXTURES / "llama" / "iq4_nl_rows.npz")
    ours = quantize_rows(reference["rows"], T.IQ4_NL)
    np.testing.assert_array_equal(ours, reference["blocks"])
    np.testing.assert_array_equal(dequantize_rows(ours, T.IQ4_NL),
                                  quants.dequantize(reference["blocks"], T.IQ4_NL).reshape(ours.shape[0], -1))


def test_iq4_nl_all_zero_block_is_zero():
    from llmsuite.core.quants import dequantize_rows, quantize_rows

    rows = np.zeros((1, 64), dtype=np.float32)
    rows[0, 32:] = np.linspace(-1, 1, 32)
    values = dequantize_rows(quantize_rows(rows, T.IQ4_NL), T.IQ4_NL)
    assert not values[0, :32].any() and np.abs(values[0, 32:] - rows[0, 32:]).max() < 0.12  # half the widest level gap
