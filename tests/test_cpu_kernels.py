"""The CPU backend's weights stay in their GGUF types, and its numba kernels read them exactly."""

import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, quants

from conftest import TINY_GEMMA3, real_model
from llmsuite.core.backend import CPUBackend
from llmsuite.core.backend.cpu import dequant, matvec_float, matvec_int
from llmsuite.core.backend.cpu.backend import attention
from llmsuite.core.backend.weights import QuantWeight
from llmsuite.core.errors import LLMError
from llmsuite.core.ops import WEIGHT_TYPES, ggml_type, random_weight
from llmsuite.core.quants import dequantize


@pytest.mark.parametrize("type_name", WEIGHT_TYPES)
def test_kernels_read_every_type_exactly(type_name):
    """Dequantized rows equal gguf-compatible dequantization bit for bit; the fused matvec equals
    x @ W.T of those values for 1 to 8 activation rows."""
    qtype, rng = ggml_type(type_name), np.random.default_rng(7)
    raw = np.ascontiguousarray(random_weight(rng, type_name, 40, 512)).reshape(40, -1).view(np.uint8)
    expected = dequantize(raw.reshape(-1), qtype, 40 * 512).reshape(40, 512)
    rows = np.array([3, 0, 39, 3])
    out = np.empty((len(rows), 512), np.float32)
    dequant.DEQUANT[int(qtype)](raw, rows, out)
    np.testing.assert_array_equal(out.view(np.uint32), expected[rows].view(np.uint32))
    for n in (1, 2, 8):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        got = np.empty((n, 40), np.float32)
        matvec_float.MATVEC[int(qtype)](raw, x, got)
        ref = x.astype(np.float64) @ expected.T.astype(np.float64)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_every_kernel_type_has_both_kernels():
    from llmsuite.core.backend.cpu import KERNEL_TYPES

    assert set(matvec_float.MATVEC) == KERNEL_TYPES == {int(ggml_type(t)) for t in WEIGHT_TYPES}
    assert set(dequant.DEQUANT) == KERNEL_TYPES | {int(ggml_type("iq4_nl"))}  # a cache type, not a weight kernel


def test_real_model_weights_stay_mapped():
    model = real_model("smollm2-135m")
    layer = model.layers[0]
    for weight in (layer.wqkv, layer.wo, layer.ffn_gate_up, layer.ffn_down, model.output):
        assert isinstance(weight, QuantWeight)
        assert all(not p.raw.flags.owndata and not p.raw.flags.writeable for p in weight.parts)  # file views
    assert layer.wqkv.type_names == ["Q4_1"] * 3 and model.output.type_names == ["Q8_0"]
    ids = np.array([5, 49151, 5])
    rows = model.backend.get_rows(model.token_embd, ids)
    info_bytes = model.token_embd.parts[0].raw[ids].reshape(-1)
    np.testing.assert_array_equal(rows, dequantize(info_bytes, T.Q8_0, 3 * 576).reshape(3, 576))


def test_matrix_without_kernel_is_expanded_and_noted():
    backend = CPUBackend()
    values = np.random.default_rng(0).uniform(-1, 1, (4, 256)).astype(np.float32)
    raw = quants.quantize(values, T.TQ2_0)
    w = backend.load_weight(raw, T.TQ2_0, (4, 256), "blk.0.odd.weight")
    assert isinstance(w, np.ndarray) and w.dtype == np.float32
    np.testing.assert_array_equal(w, quants.dequantize(raw, T.TQ2_0))
    assert backend.notes == ["tensor 'blk.0.odd.weight' (TQ2_0) has no cpu kernel: expanded to f32 at load"]
    x = np.ones((2, 256), np.float32)
    np.testing.assert_allclose(backend.matmul(x, w), x @ w.T, rtol=1e-6)


def test_a_quantized_type_without_integer_dots_is_noted_once_under_ggml_numerics():
    rng = np.random.default_rng(2)
    raw = np.ascontiguousarray(random_weight(rng, "Q3_K", 4, 256)).view(np.uint8)
    ggml, f32 = CPUBackend(numerics="ggml"), CPUBackend(numerics="f32")
    for backend in (ggml, f32):
        backend.prepare({T.Q3_K, T.Q4_K})
        backend.prepare({T.Q3_K})
    assert isinstance(ggml.load_weight(raw, T.Q3_K, (4, 256)), QuantWeight)
    assert ggml.notes == ["Q3_K matrices have no integer kernel: ggml numerics multiply them in floats over "
                          "rounded activations"] and f32.notes == []
    assert "8-bit GEMM on" in ggml.describe() and "ggml" not in f32.describe()


def test_a_kernel_that_fails_to_compile_is_one_sentence(monkeypatch):
    from numba.core.errors import TypingError

    def broken(*args):
        raise TypingError("Failed in nopython mode pipeline (step: nopython frontend)\nmore detail\n")

    monkeypatch.setitem(matvec_float.MATVEC, int(T.Q4_0), broken)
    with pytest.raises(LLMError, match=r"^numba failed to compile the cpu kernels: Failed in nopython mode "
                                       r"pipeline \(step: nopython frontend\)$"):
        CPUBackend().prepare({T.Q4_0})


def test_without_numba_generate_says_so_in_one_sentence():
    script = ("import sys; sys.modules['numba'] = None\n"
              "from llmsuite.cli.main import run\n"
              f"sys.exit(run(['generate', '-m', {str(TINY_GEMMA3)!r}, '-p', 'hi', '-n', '1']))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: the cpu backend needs numba for its quantized kernels (import of numba halted; None in "
        "sys.modules); pip install numba"]


def test_half_widening_equals_numpy_for_every_bit_pattern():
    from numba import njit

    from llmsuite.core.backend.cpu.scalar import widen_half

    @njit
    def widen_all(bits, out):
        for i in range(bits.size):
            out[i] = widen_half(bits[i])

    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(bits.size, np.float32)
    widen_all(bits, got)
    expected = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], expected.view(np.uint32)[~nan])
    assert np.isnan(got[nan]).all()


@pytest.mark.parametrize("cache_type", [np.float16, np.float32])
def test_few_row_attention_kernel_matches_the_blas_path(cache_type):
    """Chunks where every cell is masked, a fully masked row, sinks, softcap and ALiBi slopes:
    the in-place kernel agrees with the BLAS path over converted blocks."""
    rng = np.random.default_rng(3)
    n_kv, n_head, n_head_kv, d = 700, 8, 2, 64
    q = rng.standard_normal((3, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(cache_type)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(cache_type)
    mask = np.full((3, n_kv), -np.inf, np.float32)
    mask[0, 37:45] = 0.0  # all in the first chunk
    mask[1, :] = rng.uniform(-2, 0, n_kv)  # row 2 stays fully masked
    backend = CPUBackend()
    slopes = np.linspace(0.25, 1.0, n_head).astype(np.float32)
    sinks = rng.uniform(-2, 2, n_head).astype(np.float32)
    for softcap, sink in ((0.0, None), (10.0, sinks)):
        args = (q, k, v, mask, 0.125, softcap, sink, slopes)
        got, expected = backend._attend_rows(*args), backend._attend_tiles(*args)
        np.testing.assert_allclose(got, expected, atol=2e-6)
        assert not got[2].any()


@pytest.mark.parametrize("k_type,v_type", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q4_1", "q4_1"), ("q5_0", "q5_0"),
                                            ("q5_1", "q5_1"), ("iq4_nl", "iq4_nl"), ("bf16", "bf16"), ("q8_0", "f16"),
                                            ("f32", "iq4_nl")])
@pytest.mark.parametrize("d", [64, 40])
def test_block_caches_are_read_in_place_and_equal_their_values(k_type, v_type, d, monkeypatch):
    """Decode attention reads a block cache's bytes itself (the block kernel, a few cells unpacked
    at a time, never the BLAS tiles over converted rows) and gives what the in-place float kernel
    gives on the blocks' values (to float rounding: the kernels are built with fastmath, and LLVM
    may order a sum differently in each); K and V of different types too, head sizes with and
    without the vector code, chunks of 32 cells cut mid-way, sinks, softcap and slopes."""
    from llmsuite.core.backend.weights import BlockRows
    from llmsuite.core.quants import dequantize_rows, quantize_rows

    rng = np.random.default_rng(6)
    n_kv, n_head, n_head_kv = 613, 8, 4

    def cache(type_name):
        x = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float32)
        if type_name in ("f32", "f16"):
            rows = x.astype({"f32": np.float32, "f16": np.float16}[type_name]).reshape(n_kv, n_head_kv, d)
            return rows, rows.astype(np.float32)
        raw = quantize_rows(x, ggml_type(type_name))
        return BlockRows(raw, int(ggml_type(type_name)), n_head_kv, d), \
            dequantize_rows(raw, ggml_type(type_name)).reshape(n_kv, n_head_kv, d)

    (k, k_values), (v, v_values) = cache(k_type), cache(v_type)
    q = rng.standard_normal((3, n_head, d)).astype(np.float32)
    mask = np.where(rng.random((3, n_kv)) < 0.3, -np.inf, rng.uniform(-1, 0, (3, n_kv))).astype(np.float32)
    mask[2, 5:] = -np.inf  # alone, a row of a few cells: the serial kernel
    backend, kernels, calls = CPUBackend(), attention(), []
    for name in ("attend_blocks", "attend_blocks_serial"):
        monkeypatch.setattr(kernels, name, lambda *a, _k=getattr(kernels, name), _n=name: calls.append(_n) or _k(*a))
    monkeypatch.setattr(backend, "_attend_tiles", None)  # the BLAS path would fail
    slopes = np.linspace(0.25, 1.0, n_head).astype(np.float32)
    sinks = rng.uniform(-2, 2, n_head).astype(np.float32)
    for rows, softcap, sink in ((slice(0, 3), 0.0, None), (slice(0, 3), 10.0, sinks), (slice(2, 3), 10.0, sinks)):
        got = backend.flash_attn_ext(q[rows], k, v, mask[rows], 0.125, softcap, sink)
        expected = backend._attend_rows(q[rows], k_values, v_values, mask[rows], 0.125, softcap, sink,
                                        np.ones(n_head, np.float32))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        got = backend._attend_rows(q[rows], k, v, mask[rows], 0.125, softcap, sink, slopes)
        expected = backend._attend_rows(q[rows], k_values, v_values, mask[rows], 0.125, softcap, sink, slopes)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert calls == ["attend_blocks"] * 4 + ["attend_blocks_serial"] * 2


def test_attention_of_many_sequences_rows_reads_each_rows_own_cells(monkeypatch):
    """Decode rows of several sequences (each keeping its own few cells of a wide mask) take the
    in-place kernel, not BLAS over every cell, and agree with the BLAS path; rows keeping most of
    the cells still take BLAS."""
    rng = np.random.default_rng(4)
    n_rows, n_kv, n_head, n_head_kv, d = 16, 16 * 96, 9, 3, 64
    q = rng.standard_normal((n_rows, n_head, d)).astype(np.float32)
    k, v = (rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float16) for _ in range(2))
    mask = np.full((n_rows, n_kv), -np.inf, np.float32)
    for row in range(n_rows):  # row r sees its sequence's cells, a stream of 96 each, partly filled
        mask[row, row * 96:row * 96 + 40 + row] = 0.0
    backend, kernels, calls = CPUBackend(), attention(), []
    monkeypatch.setattr(kernels, "attend_rows", lambda *a, _k=kernels.attend_rows: calls.append(a) or _k(*a))
    got = backend.flash_attn_ext(q, k, v, mask, 0.125)
    assert len(calls) == 1
    backend.flash_attn_ext(q, k, v, np.zeros_like(mask), 0.125)
    assert len(calls) == 1  # every cell kept: the BLAS tiles
    slopes = np.ones(n_head, np.float32)
    np.testing.assert_allclose(got, backend._attend_tiles(q, k, v, mask, 0.125, 0.0, None, slopes), atol=2e-6)


def test_fast_exp_is_close_to_exp_and_zero_below_the_normal_range():
    from numba import njit

    from llmsuite.core.backend.cpu.scalar import fast_exp

    @njit
    def exp_all(x, out):
        for i in range(x.size):
            out[i] = fast_exp(x[i])

    x = np.concatenate([np.linspace(-87.29, 88.37, 200_001), [0.0, -0.0]]).astype(np.float32)
    got = np.empty_like(x)
    exp_all(x, got)
    expected = np.exp(x.astype(np.float64))
    assert (np.abs(got - expected) / expected).max() < 3e-7
    edges = np.array([-np.inf, -88.0, -1e4, 1e4, np.inf], np.float32)
    got = np.empty_like(edges)
    exp_all(edges, got)
    assert got[0] == got[1] == got[2] == 0.0 and np.isfinite(got[3:]).all() and got[3] > 2e38


@pytest.mark.parametrize("qtype", sorted(matvec_float.MULTI_PART))
def test_stacked_parts_take_one_launch_and_equal_each_part(qtype):
    """A tuple of same-type parts (q|k|v) fills each part's columns exactly as one call per part."""
    name = T(qtype).name
    rng = np.random.default_rng(qtype)
    parts = tuple(np.ascontiguousarray(random_weight(rng, name, n, 512)).reshape(n, -1).view(np.uint8)
                  for n in (70, 5, 33))
    x = rng.standard_normal((2, 512)).astype(np.float32)
    stacked = np.full((2, 108), np.nan, np.float32)
    matvec_float.MATVEC[qtype](parts, x, stacked)
    col = 0
    for raw in parts:
        alone = np.empty((2, len(raw)), np.float32)
        matvec_float.MATVEC[qtype](raw, x, alone)
        np.testing.assert_array_equal(stacked[:, col:col + len(raw)], alone)
        col += len(raw)


def test_matmul_of_mixed_type_parts_equals_the_dense_product():
    """Runs of one type take one launch; a part of another type its own."""
    rng = np.random.default_rng(11)
    names = ("Q4_1", "Q4_1", "Q8_0", "Q6_K")
    weights = [QuantWeight.from_raw(random_weight(rng, n, rows, 256), ggml_type(n), (rows, 256))
               for n, rows in zip(names, (40, 24, 8, 16))]
    w = QuantWeight.stack(weights)
    assert [run[0] for run in w.runs()] == [int(T.Q4_1), int(T.Q8_0), int(T.Q6_K)]
    x = rng.standard_normal((3, 256)).astype(np.float32)
    dense = np.concatenate([dequantize(p.raw.reshape(-1), p.qtype, p.n_out * 256).reshape(p.n_out, 256)
                            for p in w.parts])
    got = CPUBackend(numerics="f32").matmul(x, w)  # the float product (ggml numerics round x first)
    ref = x.astype(np.float64) @ dense.T.astype(np.float64)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_vector_kernels_widen_halves_in_integers_without_f16c(monkeypatch):
    """Without F16C the intrinsics widen halves with integer ops: fresh (uncached) kernels built
    that way equal the F16C ones, for weight scales and for f16 cache rows with subnormal,
    negative, zero and infinite values."""
    from numba import njit

    from llmsuite.core.backend.cpu import attention, ir

    rng = np.random.default_rng(5)
    raw = np.ascontiguousarray(random_weight(rng, "Q4_1", 48, 256)).reshape(48, -1).view(np.uint8)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with_f16c = np.empty((1, 48), np.float32)
    matvec_float.MATVEC[int(T.Q4_1)](raw, x, with_f16c)
    rows = rng.standard_normal((6, 32)).astype(np.float16)
    rows[0, :4] = [6e-8, -3e-6, 0.0, -0.0]  # subnormal halves and signed zeros
    rows[5, 7] = np.inf
    q = rng.standard_normal((2, 32)).astype(np.float32)
    cells = np.arange(6, dtype=np.int32)

    monkeypatch.setattr(ir, "HAS_F16C", False)  # read when an intrinsic is compiled
    dot = matvec_float.row_dot("Q4_1", matvec_float._q4_1)
    scores = attention._scores_intrinsic(2)

    @njit
    def matvec(w, x, out):
        sums = matvec_float.group_sums(x)
        for r in range(w.shape[0]):
            out[0, r] = dot(w[r], x[0], sums[0])

    @njit
    def all_scores(s, q, rows, cells):
        scores(s, q, 0, rows, cells, 0, len(cells), 0, 0)

    without = np.empty((1, 48), np.float32)
    matvec(raw, x, without)
    np.testing.assert_allclose(without, with_f16c, rtol=1e-6, atol=1e-6)
    s = np.empty((2, 6), np.float32)
    all_scores(s, q, rows.view(np.uint16), cells)
    expected = q.astype(np.float64) @ rows.astype(np.float64).T
    np.testing.assert_allclose(s[:, :5], expected[:, :5], rtol=1e-5, atol=1e-5)
    assert np.isinf(s[:, 5]).all()


def test_iq4_nl_levels_without_ssse3_equal_the_byte_shuffle(monkeypatch):
    """Where there is no SSSE3 byte shuffle, IQ4_NL's levels come from a tree of selects: a fresh
    unpacker built that way reads every code as the reference does."""
    from numba import njit

    from llmsuite.core.quants import dequantize_rows, quantize_rows

    rows = np.random.default_rng(8).standard_normal((16, 64)).astype(np.float32)
    raw = quantize_rows(rows, T.IQ4_NL)
    raw[0, 2:18] = np.arange(16, dtype=np.uint8) * 17  # every code, low and high nibbles
    monkeypatch.setattr(dequant, "HAS_SSSE3", False)  # read when the intrinsic is compiled
    unpack = dequant.row_unpack("IQ4_NL", dequant._iq4_nl_values)

    @njit
    def unpack_all(raw, out):
        for r in range(raw.shape[0]):
            unpack(raw[r], out[r])

    out = np.empty_like(rows)
    unpack_all(raw, out)
    np.testing.assert_array_equal(out, dequantize_rows(raw, T.IQ4_NL))


@pytest.mark.skipif(not matvec_int.AVAILABLE, reason="the integer dots need AVX2 and F16C")
@pytest.mark.parametrize("qtype", sorted(matvec_int.MATVEC), ids=lambda t: T(t).name)
def test_integer_dots_equal_the_rounded_float_product(qtype, monkeypatch):
    """ggml numerics for a few rows (matvec_int: q8 codes, integer dots) equal the float product of
    the rounded activations (the path many rows take), for single and stacked weights."""
    rng = np.random.default_rng(qtype)
    name = T(qtype).name
    parts = [QuantWeight.from_raw(np.ascontiguousarray(random_weight(rng, name, n, 512)).view(np.uint8), T(qtype),
                                  (n, 512)) for n in (40, 24)]
    ggml = CPUBackend(numerics="ggml")
    for w in (parts[0], CPUBackend.concatenate(parts)):
        for n_rows in (1, 2, 8):
            x = rng.standard_normal((n_rows, 512)).astype(np.float32)
            x[0, :32] *= 50  # one block dominated by an outlier, as real activations have
            fast = ggml.matmul(x, w)
            with monkeypatch.context() as m:
                m.setattr(matvec_int, "AVAILABLE", False)
                rounded = ggml.matmul(x, w)
            np.testing.assert_allclose(fast, rounded, rtol=0, atol=2e-6 * np.abs(rounded).max())


@pytest.mark.skipif(not matvec_int.AVAILABLE, reason="the integer dots need AVX2 and F16C")
@pytest.mark.parametrize("qtype", sorted(matvec_int.MATVEC), ids=lambda t: T(t).name)
def test_integer_dots_of_several_rows_equal_each_row_alone_bit_for_bit(qtype):
    """Activation rows taken four and two at a time (one weight block decoded for all of them)
    give exactly what each row gives alone: the same integers summed in the same order. A row
    alone takes a 32-value type's weight rows four at a time (43 rows: tasks of 32 and 11, so the
    rows left after the fours as well), and gives what a stacked pair of activations gives it."""
    rng = np.random.default_rng(qtype + 1)
    w = np.ascontiguousarray(random_weight(rng, T(qtype).name, 43, 512)).view(np.uint8)
    for n_rows in (2, 3, 4, 5, 7):
        x = rng.standard_normal((n_rows, 512)).astype(np.float32)
        x[-1, :32] *= 50
        together = np.empty((n_rows, 43), np.float32)
        matvec_int.MATVEC[qtype](w, x, together)
        for i in range(n_rows):
            alone = np.empty((1, 43), np.float32)
            matvec_int.MATVEC[qtype](w, x[i:i + 1], alone)
            np.testing.assert_array_equal(together[i], alone[0])


@pytest.mark.skipif(not matvec_int.WIDE, reason="the 64-value emitters need AVX-512 BW")
@pytest.mark.parametrize("name", sorted(matvec_int.EMIT_WIDE))
def test_wide_integer_dots_equal_the_32_value_ones_bit_for_bit(name):
    """The AVX-512 emitter of a K-quant sums the same integers in the same float lanes as the AVX2
    one, so the mat-vecs agree exactly, outlier blocks and stacked rows included."""
    rng = np.random.default_rng(7)
    qtype = int(T[name])
    w = np.ascontiguousarray(random_weight(rng, name, 96, 1024)).view(np.uint8)
    assert matvec_int.MATVEC[qtype] is not matvec_int.MATVEC_AVX2[qtype]
    for n_rows in (1, 3):
        x = rng.standard_normal((n_rows, 1024)).astype(np.float32)
        x[0, 256:288] *= 80
        wide, narrow = np.empty((n_rows, 96), np.float32), np.empty((n_rows, 96), np.float32)
        matvec_int.MATVEC[qtype](w, x, wide)
        matvec_int.MATVEC_AVX2[qtype](w, x, narrow)
        np.testing.assert_array_equal(wide, narrow)
        assert np.abs(wide).max() > 0


def test_integer_dots_cover_the_types_real_models_use():
    assert set(matvec_int.MATVEC) == {int(t) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)}


@pytest.mark.skipif(not matvec_int.AVAILABLE, reason="the numba rounding runs where the integer dots do")
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_1", "Q8_0", "Q4_K", "Q6_K"])
def test_prompt_rows_round_in_numba_exactly_as_in_numpy(name, monkeypatch):
    """Many rows on ggml numerics' float path (rows the 8-bit GEMM does not take) round in
    parallel numba (q8.round_q8_rows/_k_rows): the products equal those of
    quants.ggml_activations' NumPy rounding bit for bit."""
    rng = np.random.default_rng(3)
    w = QuantWeight.from_raw(np.ascontiguousarray(random_weight(rng, name, 40, 512)).view(np.uint8), T[name], (40, 512))
    x = rng.standard_normal((20, 512)).astype(np.float32)
    x[3, :32] *= 60
    ggml = CPUBackend(numerics="ggml")
    fast = ggml._matmul_ggml_float(x, w, np.empty((20, 40), np.float32))
    monkeypatch.setattr(matvec_int, "AVAILABLE", False)
    np.testing.assert_array_equal(fast, ggml._matmul_ggml_float(x, w, np.empty((20, 40), np.float32)))


@pytest.mark.parametrize("numba_kernel", [True, False])
def test_ggml_numerics_take_gelu_from_the_f16_table(numba_kernel, monkeypatch):
    """ggml-cpu's GELU for float32 rows (GGML_GELU_FP16): the f16 table at x rounded to f16, 0 at
    x <= -10 and x at x >= 10; f32 numerics compute the formula. GEGLU takes it in numba
    (rowwise.geglu_table_rows) or, without AVX2/F16C, in NumPy."""
    if not numba_kernel:
        monkeypatch.setattr(matvec_int, "AVAILABLE", False)
    x = np.array([-12.0, -10.0, -3.3, -0.0, 1e-3, 0.7, 2.71828, 9.99, 10.0, 30.0], dtype=np.float32)
    x16 = x.astype(np.float16).astype(np.float32)
    formula = 0.5 * x16 * (1 + np.tanh(np.float32(0.7978845608028654) * x16 * (1 + np.float32(0.044715) * x16 * x16)))
    want = np.where(x <= -10, 0, np.where(x >= 10, x, formula.astype(np.float16).astype(np.float32)))
    np.testing.assert_array_equal(CPUBackend(numerics="ggml").gelu(x), want)
    assert not np.array_equal(CPUBackend(numerics="f32").gelu(x), want)
    h = np.concatenate([x, np.full_like(x, 2.0)])[None, :]
    np.testing.assert_array_equal(CPUBackend(numerics="ggml").gated_ffn(h, "geglu")[0], want * 2)
