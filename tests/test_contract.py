"""The engine's seams: the backend contract, the resolved plan, the context kinds."""

import pytest

from conftest import TINY_BERT, TINY_GEMMA3, TINY_T5, tiny_gemma3, tiny_model, tiny_ssm
from llmsuite.core.backend import default_cache_type, get_backend
from llmsuite.core.backend.base import OPS, Backend
from llmsuite.core.backend.cpu import CPUBackend
from llmsuite.core.context import (Context, ContextParams, DecoderContext, EncoderContext, EncoderDecoderContext,
                                   NoKVContext)
from llmsuite.core.errors import InvalidInputError, UnsupportedError
from llmsuite.core.gguf import GGUFFile
from llmsuite.core.models import ARCHITECTURES, load_model


class WithoutOp(CPUBackend):
    """The cpu backend pretending to lack one op (a backend that does not have it yet)."""
    name = "partial"

    def __init__(self, missing: str):
        super().__init__()
        self.missing = missing

    def supports(self, op: str, types: tuple[str, ...] = ()) -> bool:
        return op != self.missing and super().supports(op, types)


def test_every_architecture_declares_ops_of_the_contract():
    for arch, cls in ARCHITECTURES.items():
        assert set(cls.ops) <= set(OPS), arch


def test_backends_implement_the_whole_contract():
    assert not CPUBackend.__abstractmethods__
    from llmsuite.core.backend.cuda import CUDABackend
    assert not CUDABackend.__abstractmethods__ and issubclass(CUDABackend, Backend)


def test_a_missing_op_is_refused_before_loading_naming_op_and_types():
    gguf = GGUFFile(TINY_BERT)
    try:
        ARCHITECTURES["bert"].check_backend(gguf, WithoutOp("SET_ROWS"))  # bert never stores K/V
        with pytest.raises(UnsupportedError, match=r"^bert needs NORM, which the partial backend does not support"):
            ARCHITECTURES["bert"].check_backend(gguf, WithoutOp("NORM"))
        with pytest.raises(UnsupportedError, match=r"bert needs MUL_MAT on f16, f32, q4_0, q8_0, which the partial backend"):
            ARCHITECTURES["bert"].check_backend(gguf, WithoutOp("MUL_MAT"))
    finally:
        gguf.close()


def test_cache_types_a_backend_cannot_store_are_refused_when_the_context_is_built():
    model = load_model(TINY_GEMMA3)  # not the shared one: its backend is replaced
    model.backend = WithoutOp("SET_ROWS")
    with pytest.raises(InvalidInputError, match="a q8_0/f16 cache .* needs SET_ROWS on q8_0, f16, which the partial"):
        Context(model, ContextParams(n_ctx=64, backend="partial", type_k="q8_0"))


def test_the_library_defaults_are_the_clis():
    p = ContextParams()
    assert (p.type_k, p.type_v) == (default_cache_type("cpu"),) * 2


def test_context_kinds_are_the_plans_classes():
    gemma = tiny_gemma3()
    assert type(Context(gemma, ContextParams(n_ctx=64))) is DecoderContext
    assert type(Context(gemma, ContextParams(n_ctx=64, kv="none"))) is NoKVContext
    assert type(Context(tiny_model(TINY_BERT), ContextParams(n_ctx=64))) is EncoderContext
    assert type(Context(tiny_model(TINY_T5), ContextParams(n_ctx=64))) is EncoderDecoderContext
    with pytest.raises(InvalidInputError, match="makes a decoder context, not an EncoderContext"):
        EncoderContext(gemma, ContextParams(n_ctx=64))


def test_sequence_capacity_comes_from_the_memory():
    gemma = tiny_gemma3()
    assert Context(gemma, ContextParams(n_ctx=64, n_seq_max=4, kv="split")).seq_capacity() == 16
    assert Context(gemma, ContextParams(n_ctx=64, n_seq_max=4)).seq_capacity() == 64
    assert Context(tiny_ssm("mamba"), ContextParams(n_ctx=48, n_seq_max=2)).seq_capacity() == 48


def test_a_context_has_one_backend_with_its_numerics():
    model = load_model(TINY_GEMMA3)  # its own copy: a float_reference test may have loaded the shared one under f32
    ctx = Context(model, ContextParams(n_ctx=64, numerics="f32", attn="dense"))
    assert (ctx.backend.numerics, ctx.backend.attn_path) == ("f32", "dense")
    assert (model.backend.numerics, model.backend.attn_path) == ("ggml", "auto")  # the model's is untouched
    assert Context(model, ContextParams(n_ctx=64)).backend is model.backend  # nothing to change: the same object
    with pytest.raises(InvalidInputError, match="implemented on the cpu backend only"):
        get_backend("cuda-emu", numerics="ggml")
