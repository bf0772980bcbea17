"""Context.decode: status codes, outputs only where asked, and llama.cpp's rollback rules."""

import numpy as np
import pytest

from conftest import tiny_gemma3
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError


def test_ubatch_larger_than_batch_is_refused():
    with pytest.raises(InvalidInputError, match="cannot exceed the batch"):
        Context(tiny_gemma3(), ContextParams(n_ctx=64, n_batch=16, n_ubatch=32))


def test_invalid_batch_returns_minus_one_and_keeps_memory():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64))
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == DecodeStatus.OK
    before = ctx.state_bytes()
    assert ctx.decode(Batch.from_tokens([4], pos0=7)) == DecodeStatus.INVALID_BATCH
    assert "continue at 3" in ctx.last_error
    assert ctx.decode(Batch.from_tokens([4], seq_id=1)) == DecodeStatus.INVALID_BATCH
    assert "out of range" in ctx.last_error
    assert ctx.state_bytes() == before


def test_no_slot_returns_one_and_keeps_memory():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=16, swa_full=True))
    assert ctx.decode(Batch.from_tokens(list(range(10)))) == DecodeStatus.OK
    before = ctx.state_bytes()
    assert ctx.decode(Batch.from_tokens(list(range(8)))) == DecodeStatus.NO_SLOT
    assert ctx.state_bytes() == before


def test_batch_over_n_batch_is_invalid():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64, n_batch=8, n_ubatch=8))
    assert ctx.decode(Batch.from_tokens(list(range(9)))) == DecodeStatus.INVALID_BATCH


def test_lm_head_runs_on_output_rows_only():
    seen = {}
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64), observer=lambda n, ub, x: seen.__setitem__(n, x.shape))
    batch = Batch.from_tokens(list(range(6)))
    batch.output = np.array([0, 1, 0, 0, 1, 0], bool)
    assert ctx.decode(batch) == DecodeStatus.OK
    assert ctx.logits.shape == (2, 49152) and seen["result_norm"] == (2, 64)
    np.testing.assert_array_equal(ctx.get_logits(4), ctx.logits[1])
    with pytest.raises(InvalidInputError, match="did not request logits"):
        ctx.get_logits(3)


def fail_on_ubatch(n: int):
    """An observer that raises MemoryError when the n-th ubatch reaches the output norm."""
    calls = {"n": 0}

    def observer(name, ub, x):
        if name == "result_norm":
            calls["n"] += 1
            if calls["n"] == n:
                raise MemoryError("simulated")
    return observer


def test_failure_in_a_ubatch_keeps_earlier_ubatches():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64, n_ubatch=4), observer=fail_on_ubatch(3))
    batch = Batch.from_tokens(list(range(12)), all_outputs=True)
    assert ctx.decode(batch) == DecodeStatus.COMPUTE_FAILED
    assert ctx.memory.seq_pos_max(0) == 7  # ubatches 0 and 1 stay, ubatch 2's positions are gone
    ctx.observer = None
    assert ctx.decode(Batch.from_tokens(list(range(8, 12)), all_outputs=True)) == DecodeStatus.OK
    clean = Context(tiny_gemma3(), ContextParams(n_ctx=64, n_ubatch=4))
    assert clean.decode(batch) == DecodeStatus.OK
    np.testing.assert_allclose(ctx.logits, clean.logits[8:], atol=1e-5, rtol=0)


def test_outputs_of_a_failed_decode_cannot_be_read():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64, n_ubatch=4), observer=fail_on_ubatch(2))
    assert ctx.decode(Batch.from_tokens([1, 2, 3], all_outputs=True)) == DecodeStatus.OK
    assert ctx.decode(Batch.from_tokens(list(range(3, 11)), all_outputs=True)) == DecodeStatus.COMPUTE_FAILED
    for i in (0, -1):
        with pytest.raises(InvalidInputError, match="the last decode failed"):
            ctx.get_logits(i)
    assert ctx.decode(Batch.from_tokens([1, 2], pos0=99)) == DecodeStatus.INVALID_BATCH
    with pytest.raises(InvalidInputError, match="the last decode failed"):
        ctx.get_logits(0)
