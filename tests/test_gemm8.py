"""The 8-bit prompt GEMM (core/backend/cpu/gemm_int8.py) against ggml's integer dots (matvec_int.py), which
test_quants.py checks against the exact-integer model: the same products to float rounding."""

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llmsuite.core.backend import CPUBackend
from llmsuite.core.backend.cpu import gemm_int8, matvec_int
from llmsuite.core.backend.weights import QuantWeight
from llmsuite.core.ops import random_weight

pytestmark = pytest.mark.skipif(gemm_int8.ISA is None, reason="the 8-bit GEMM needs AVX2")
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]


def raw_weight(rng, qtype: T, n_out: int, n_in: int) -> np.ndarray:
    return np.ascontiguousarray(random_weight(rng, qtype.name, n_out, n_in)).view(np.uint8).reshape(n_out, -1)


def activations(rng, n: int, n_in: int) -> np.ndarray:
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    x[0, :32] *= 50  # a block dominated by an outlier, as real activations have
    x[1, 256:512] = 0  # an empty q8 block
    return x


def integer_dots(raw: np.ndarray, qtype: T, x: np.ndarray) -> np.ndarray:
    out = np.empty((len(x), len(raw)), np.float32)
    matvec_int.MATVEC[int(qtype)](raw, x, out)
    return out


def test_the_gemm_covers_the_types_of_the_integer_dots():
    assert set(gemm_int8.GEMM) == set(matvec_int.MATVEC) == {int(t) for t in TYPES}


@pytest.mark.parametrize("n_in", [1024, 768])  # 768: padded to whole groups of units
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemm_equals_the_integer_dots_of_each_row(qtype, n_in):
    """Stacked parts of uneven lengths (tiles and register blocks cut short) written from a
    column offset, activation rows not a whole number of register blocks."""
    rng = np.random.default_rng(int(qtype) * n_in)
    parts = (raw_weight(rng, qtype, 45, n_in), raw_weight(rng, qtype, 23, n_in))
    x = activations(rng, 11, n_in)
    want = np.concatenate([integer_dots(p, qtype, x) for p in parts], axis=1)
    got = np.full((11, 5 + 68), np.nan, np.float32)
    gemm_int8.GEMM[int(qtype)](parts, x, got, 5, 4)
    assert np.isnan(got[:, :5]).all()
    np.testing.assert_allclose(got[:, 5:], want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_backend_takes_the_gemm_run_by_run_for_mixed_types(monkeypatch):
    """A Q4_K_M-style q|k|v (Q4_K, Q4_K, Q6_K) with a prompt's rows: each run in the GEMM, the
    result that of the integer dots; a width the GEMM would pad too much takes the float path."""
    rng = np.random.default_rng(5)
    types = (T.Q4_K, T.Q4_K, T.Q6_K)
    raws = [raw_weight(rng, t, n, 512) for t, n in zip(types, (64, 16, 16))]
    w = CPUBackend.concatenate([QuantWeight.from_raw(r, t, r.shape[:1] + (512,)) for r, t in zip(raws, types)])
    x = activations(rng, 20, 512)
    want = np.concatenate([integer_dots(r, t, x) for r, t in zip(raws, types)], axis=1)
    calls = []
    for qtype in (int(T.Q4_K), int(T.Q6_K)):
        monkeypatch.setitem(gemm_int8.GEMM, qtype, lambda *a, _k=gemm_int8.GEMM[qtype]: calls.append(a) or _k(*a))
    got = CPUBackend(numerics="ggml").matmul(x, w)
    assert [len(c[0]) if isinstance(c[0], tuple) else 1 for c in calls] == [2, 1]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert gemm_int8.fits(int(T.Q4_K), 2048, 512) and gemm_int8.fits(int(T.Q4_K), 576, gemm_int8.FEW_ROWS)
    if gemm_int8.LANES == 16:  # 576 values pad to 1024: a prompt takes the float path, a few rows the GEMM
        assert not gemm_int8.fits(int(T.Q4_K), 576, gemm_int8.FEW_ROWS + 1)


NARROWER = [isa for isa in ("avx2", "vnni256") if isa != gemm_int8.ISA and
            ("avx2", "vnni256", "vnni512").index(isa) < ("avx2", "vnni256", "vnni512").index(gemm_int8.native_isa())]
SCRIPT = """
import numpy as np
from gguf import GGMLQuantizationType as T
from llmsuite.core.backend.cpu import gemm_int8, matvec_int
from llmsuite.core.ops import random_weight
rng = np.random.default_rng(1)
for qtype in gemm_int8.GEMM:
    raw = np.ascontiguousarray(random_weight(rng, T(qtype).name, 30, 512)).view(np.uint8).reshape(30, -1)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    want, got = np.empty((7, 30), np.float32), np.empty((7, 30), np.float32)
    matvec_int.MATVEC[qtype](raw, x, want)
    gemm_int8.GEMM[qtype](raw, x, got, 0, 4)
    print(gemm_int8.ISA, T(qtype).name, float(np.abs(got - want).max() / np.abs(want).max()))
"""


@pytest.mark.parametrize("isa", NARROWER)
def test_narrower_paths_give_the_same_products(isa):
    """The 8-lane paths (AVX-VNNI's dot, AVX2's pmaddubsw/pmaddwd), chosen by LLMSUITE_GEMM8_ISA."""
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "LLMSUITE_GEMM8_ISA": isa})
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    assert {r[0] for r in rows} == {isa} and len(rows) == len(TYPES)
    assert max(float(r[2]) for r in rows) < 2e-6


def test_an_unknown_or_unsupported_path_is_refused_naming_the_paths_this_cpu_runs():
    result = subprocess.run([sys.executable, "-c", "from llmsuite.core.backend.cpu import gemm_int8"], capture_output=True,
                            text=True, env={**os.environ, "LLMSUITE_GEMM8_ISA": "sse2"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].endswith(
        "LLMSUITE_GEMM8_ISA='sse2': this CPU runs " + ", ".join(("avx2", "vnni256", "vnni512")[
            :("avx2", "vnni256", "vnni512").index(gemm_int8.native_isa()) + 1]))
