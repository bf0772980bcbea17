"""llm test-ops: every op's cpu implementation against its float64 reference, and the tool's CLI."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from llmsuite.core.backend import CPUBackend, cuda_unavailable_reason
from llmsuite.core.backend.cpu.backend import _key_blocks
from llmsuite.core.ops import OPS, sparse_mask
from llmsuite.core.testops import run_test, select_cases

LLM = [sys.executable, "-m", "llmsuite.cli.main"]


@pytest.mark.parametrize("op", sorted(OPS))
def test_cpu_backend_passes_every_case(op):
    backend = CPUBackend(numerics="f32")  # test-ops' references are float products (MUL_MAT_GGML: ggml's)
    cases = select_cases(op, quick=True)
    failures = [(c.name, r.error) for c in cases for r in [run_test(backend, c)] if not r.passed]
    assert cases and not failures


def test_flash_attention_cases_cover_the_contract():
    names = [c.name for c in select_cases("FLASH_ATTN_EXT", quick=True)]
    for fragment in ("hsk=40,", "hsk=256,", "hsk=576,hsv=512", "nr23=[16,1]", "kv=113,", "kv=1025,", "kv=4096,",
                     "nb=1,", "mask=0", "sinks=1", "logit_softcap=10", "max_bias=8", "type_K=q8_0",
                     "n_kv_max=512,path=sparse", "n_kv_max=512,path=dense"):
        assert any(fragment in n for n in names), fragment


def test_sparse_masks_keep_single_entry_rows_within_the_bound():
    mask = sparse_mask(40, 300, 17)
    counts = np.isfinite(mask).sum(axis=1)
    assert counts.max() <= 17 and counts.min() == 1


def test_block_sparse_masks_make_the_cpu_gather_a_tile_union():
    """The 'blocks' masks share a few scattered blocks, as top-k rows do: a tile's union is gathered
    (index arrays), while a random mask's union fills its span and is walked as ranges."""
    blocks = np.isfinite(sparse_mask(32, 4096, 256, blocks=True)).any(axis=0)
    random = np.isfinite(sparse_mask(32, 4096, 256)).any(axis=0)
    assert blocks.sum() <= 512 and all(isinstance(b, np.ndarray) for b in _key_blocks(np.flatnonzero(blocks), True))
    assert all(isinstance(b, slice) for b in _key_blocks(np.flatnonzero(random), True))
    assert all(isinstance(b, slice) for b in _key_blocks(np.flatnonzero(blocks), False))


def test_a_wrong_kernel_is_caught():
    class Broken(CPUBackend):
        def soft_max_ext(self, x, mask, scale, max_bias=0.0, sinks=None):
            return super().soft_max_ext(x, mask, scale * 1.01, max_bias, sinks)

    results = [run_test(Broken(), c) for c in select_cases("SOFT_MAX", quick=True)]
    assert any(not r.passed and r.error.startswith("ERR = ") for r in results)


def llm(*args):
    return subprocess.run(LLM + ["test-ops", *args], capture_output=True, text=True, env=dict(os.environ), timeout=300)


def test_cli_console_report():
    r = llm("-o", "RMS_NORM,ROPE", "-b", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Testing 1 backend(s)" and "Backend 1/1: cpu" in lines
    assert any(ln.startswith("  RMS_NORM(ne=[64,1],eps=0.000001): OK") for ln in lines)
    assert any(ln.endswith(" tests passed") for ln in lines) and lines[-2:] == ["1/1 backends passed", "OK"]


def test_cli_regex_matching_nothing_says_so():
    r = llm("-p", "no-such-parameter", "-b", "cpu")
    assert r.returncode == 0 and "no test case matches" in r.stdout and "0/0 tests passed" in r.stdout


def test_cli_json_csv_perf_and_support():
    doc = json.loads(llm("-o", "SCALE", "-b", "cpu", "--output", "json").stdout)
    assert doc and all(row["passed"] and row["op_name"] == "SCALE" for row in doc)
    csv_out = llm("-o", "SILU", "-b", "cpu", "--output", "csv").stdout.splitlines()
    assert csv_out[0].startswith('"test_time","backend_name","op_name"') and len(csv_out) == 4
    perf = llm("perf", "-o", "MUL_MAT", "-p", "type_a=q4_0.*n=1,", "-b", "cpu").stdout
    assert "runs -" in perf and "FLOP/run" in perf
    support = llm("support", "-o", "TOP_K", "-b", "cpu").stdout
    assert "SUPPORTED" in support


@pytest.mark.parametrize("args, fragment", [
    (["-o", "NOT_AN_OP"], "unknown op 'NOT_AN_OP'"),
    (["-b", "tpu"], "unknown backend 'tpu'"),
    (["bench"], "unknown mode 'bench'"),
    (["-p", "("], "not a valid regular expression"),
])
def test_cli_bad_input(args, fragment):
    r = llm(*args)
    assert r.returncode == 1 and fragment in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a CUDA device is present here")
def test_cli_cuda_asked_for_without_a_device_is_one_sentence():
    r = llm("-b", "cuda")
    assert r.returncode == 1 and not r.stdout
    assert r.stderr == f"error: backend unavailable: cuda: {cuda_unavailable_reason()}\n"
