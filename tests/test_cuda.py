"""The CUDA backend. Without a GPU: every kernel source compiles for sm_90 with NVRTC, every kernel
the backend launches exists in the binary of the file it is looked up in, and asking for the
backend fails with one clear sentence. With a GPU (`pytest -m cuda`): test-ops on the device and
a real model's logits against llama.cpp's."""

from __future__ import annotations

import re
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from llmsuite.core.backend import cuda_unavailable_reason, default_cache_type, get_backend, kernels
from conftest import REAL_MODELS, TINY_GEMMA3, load_fixture
from llmsuite.core.bench import Instance, parse_spec
from llmsuite.core.errors import InvalidInputError

CUDA_BACKEND_SOURCE = Path(kernels.__file__).with_name("cuda.py").read_text()
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="NVRTC wheels are installed on Linux")


@pytest.fixture(scope="module")
def cubins() -> dict[str, bytes]:
    return {name: kernels.nvrtc_compile(name, "sm_90") for name in kernels.KERNEL_FILES}


@linux_only
@pytest.mark.parametrize("file_name", kernels.KERNEL_FILES)
def test_kernel_source_compiles_for_sm90(cubins, file_name):
    assert cubins[file_name][:4] == b"\x7fELF"


def launched_kernels() -> set[str]:
    """Kernel names the backend launches: literal ones in cuda.py and the generated families."""
    literal = set(re.findall(r'(?:_launch|_unary)\(\s*"(\w+)"', CUDA_BACKEND_SOURCE))
    fused = {f"{act}_fused_f32" for act in ("swiglu", "geglu")}  # launched as f"{act}_fused_f32"
    return literal | fused | set(kernels.GENERATED_KERNELS) | {name for name, _ in kernels.DEQUANT_KERNELS.values()}


@linux_only
def test_every_launched_kernel_is_in_its_files_binary(cubins):
    names = launched_kernels()
    assert {"rms_norm_f32", "silu_f32", "mask_to_indices", "fattn_combine", "convert_bf16", "argmax_f32"} <= names
    missing = [n for n in sorted(names) if n.encode() + b"\0" not in cubins[kernels.kernel_file(n)]]
    assert not missing


@linux_only
def test_compile_error_names_the_file_and_the_error(tmp_path, monkeypatch):
    shutil.copy(kernels.KERNEL_DIR / kernels.COMMON_HEADER, tmp_path)
    (tmp_path / "broken.cu").write_text('#include "common.cuh"\n'
                                        'extern "C" __global__ void f(float * x) { x[0] = no_such_name; }\n')
    monkeypatch.setattr(kernels, "KERNEL_DIR", tmp_path)
    with pytest.raises(kernels.KernelCompileError, match=r"broken\.cu does not compile for sm_90: .*no_such_name"):
        kernels.nvrtc_compile("broken.cu")


def test_prefill_shared_memory_fits_an_sm90_block():
    for d in kernels.PREFILL_DIMS:  # 227 KiB opt-in per block on Hopper, 4 KiB of it static
        assert kernels.prefill_smem_bytes(d) + 4096 <= 227 * 1024


def test_default_cache_type_is_f16_on_every_backend():
    assert (default_cache_type("cpu"), default_cache_type("cuda")) == ("f16", "f16")
    test = parse_spec("tg8")
    assert (Instance("m", test, backend="cuda").type_k, Instance("m", test).type_v) == ("f16", "f16")
    assert Instance("m", test, backend="cuda", type_k="q8_0").type_k == "q8_0"


def test_unavailable_backend_is_one_sentence(monkeypatch):
    import llmsuite.core.backend as backend

    monkeypatch.setattr(backend, "cuda_unavailable_reason", lambda: "no CUDA device is visible")
    with pytest.raises(InvalidInputError, match=r"^backend unavailable: cuda: no CUDA device is visible$"):
        backend.get_backend("cuda")


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a CUDA device is present")
@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["perplexity", "-f", "README.md", "-c", "128"],
                                     ["bench", "tg8"]])
def test_cli_backend_cuda_without_a_device_is_one_sentence(command):
    from test_cli import assert_one_line_error, llm

    assert_one_line_error(llm(*command, "--backend", "cuda"), f"backend unavailable: cuda: {cuda_unavailable_reason()}")


# ---- on a GPU ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda():
    reason = cuda_unavailable_reason()
    if reason:
        pytest.skip(f"no CUDA device: {reason}")
    return get_backend("cuda")


@pytest.mark.cuda
def test_ops_on_the_device(cuda):
    from llmsuite.core.testops import run_test, select_cases

    results = [run_test(cuda, case) for case in select_cases(quick=True)]
    failed = [f"{r.case}: {r.error}" for r in results if r.supported and not r.passed]
    assert not failed
    assert sum(r.supported for r in results) > 300


@pytest.mark.cuda
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_long_cache_attention_paths_agree_with_the_reference(cuda, path):
    from llmsuite.core.ops import OPS, fa_params
    from llmsuite.core.testops import Case, run_test

    params = fa_params(128, 128, 8, 4, 32768, 8, type_kv="f16", n_kv_max=2048, path=path)
    result = run_test(cuda, Case(OPS["FLASH_ATTN_EXT"], params))
    assert result.passed, result.error


def logits_on(backend: str, path: Path, tokens: np.ndarray) -> np.ndarray:
    from llmsuite.core.batch import Batch
    from llmsuite.core.context import Context, ContextParams
    from llmsuite.core.models import load_model

    ctx = Context(load_model(path, backend=backend), ContextParams(n_ctx=1024, n_ubatch=512, backend=backend))
    assert ctx.decode(Batch.from_tokens(tokens.tolist(), all_outputs=True)) == 0
    return np.asarray(ctx.backend.to_numpy(ctx.logits), dtype=np.float64)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", ["smollm2-135m", "gemma3-270m", "tiny-gemma3-swa", "tiny-llama-moe", "tiny-qwen3",
                                   "tiny-deepseek2", "tiny-deepseek32"])
def test_engine_on_the_device_equals_the_cpu_engine(cuda, shape, tmp_path):
    """Whole forward passes (prompt-sized, so the WMMA kernel, and the plain path for head 32 of the
    tiny models, MLA and the DSA indexer; experts routed on the host) against the CPU engine, which the real-model and
    fixture tests tie to llama.cpp."""
    if shape.startswith("tiny-"):
        path = TINY_GEMMA3.parent / f"{shape}.gguf"
    else:
        random_model = runpy.run_path(str(SCRIPTS / "random_model.py"))
        path = random_model["write_random_model"](shape, tmp_path / f"{shape}.gguf")
    tokens = np.random.default_rng(7).integers(0, 40000, 600).astype(np.int32)
    cpu, gpu = logits_on("cpu", path, tokens), logits_on("cuda", path, tokens)
    nmse = float(np.sum((gpu - cpu) ** 2) / np.sum(cpu ** 2))
    assert nmse <= 1e-3, nmse


@pytest.mark.cuda
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_logits_on_the_device(cuda, name):
    """The engine issue's logits tolerances against llama.cpp, with weights, cache and attention on the GPU."""
    from llmsuite.core.hub import cached_path

    if not cached_path(name).exists():
        pytest.skip(f"{name} is not cached here (llm pull {name})")
    fixture = load_fixture(f"real/{name}.logits.json")
    ours = logits_on("cuda", cached_path(name), np.asarray(fixture["ids"], dtype=np.int32))
    diffs = np.concatenate([np.abs(ours[pos, [t[0] for t in top]] - np.array([t[1] for t in top]))
                            for pos, top in enumerate(fixture["top"])])
    assert diffs.mean() <= 0.3 and diffs.max() <= 1.5, (diffs.mean(), diffs.max())
