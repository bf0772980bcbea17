"""State files: a pending K-shift survives a save, a sequence load applies to every cache or to
none, and corrupt files are refused with the memory unchanged."""

import numpy as np
import pytest

from conftest import tiny_gemma3
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError

OK = DecodeStatus.OK


def decoded(params: ContextParams, tokens, seq: int = 0) -> Context:
    ctx = Context(tiny_gemma3(), params)
    assert ctx.decode(Batch.from_tokens(tokens, seq_id=seq)) == OK, ctx.last_error
    return ctx


def next_logits(ctx: Context, token: int, seq: int = 0) -> np.ndarray:
    assert ctx.decode(Batch.from_tokens([token], seq_id=seq)) == OK, ctx.last_error
    return ctx.get_logits().copy()


@pytest.mark.parametrize("kind", [dict(kv="unified"), dict(kv="split", n_seq_max=2),
                                  dict(kv="iswa", swa_full=True), dict(kv="none")])
def test_pending_shift_survives_save_and_load(kind):
    params = ContextParams(n_ctx=128, **kind)
    prompt = list(range(1000, 1030))
    reference = decoded(params, prompt)
    reference.memory.seq_add(0, 10, -1, 7)
    expected = next_logits(reference, 1234)

    live = decoded(params, prompt)
    live.memory.seq_add(0, 10, -1, 7)
    data = live.state_bytes()
    resumed = Context(tiny_gemma3(), params)
    resumed.load_state_bytes(data)
    assert resumed.memory.seq_pos_max(0) == 36
    np.testing.assert_allclose(next_logits(resumed, 1234), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(next_logits(live, 1234), expected, atol=1e-5, rtol=0)


WINDOWED = ContextParams(n_ctx=2048, n_seq_max=2, n_ubatch=16, kv="iswa")


def test_sequence_load_reuses_cells_out_of_every_window():
    """Sequence 0 fills the 256-cell window cache; a 16-token sequence still loads into the
    cells that have left its window, in both caches."""
    long_prompt, short_prompt = list(range(1000, 1300)), list(range(2000, 2016))
    ctx = decoded(WINDOWED, long_prompt)
    assert ctx.memory.swa.kv_size == 256 and ctx.memory.swa.cells[0].used() == 256
    donor = decoded(WINDOWED, short_prompt)
    ctx.load_state_bytes(donor.state_bytes(short_prompt, seq=0), seq=1)
    assert ctx.memory.base.seq_pos_max(1) == ctx.memory.swa.seq_pos_max(1) == 15
    np.testing.assert_allclose(next_logits(ctx, 7, seq=1), next_logits(donor, 7), atol=1e-5, rtol=0)
    np.testing.assert_allclose(next_logits(ctx, 7), next_logits(decoded(WINDOWED, long_prompt), 7),
                               atol=1e-5, rtol=0)


def test_sequence_load_that_does_not_fit_changes_neither_cache():
    """A 256-cell sequence fits the full cache but not the window cache, where sequence 0 still
    needs 8 of the 256 cells: refused, and neither cache changed."""
    prompt = list(range(1000, 1300))
    data = decoded(WINDOWED, prompt).state_bytes(seq=0)
    ctx = decoded(WINDOWED, prompt)
    before = ctx.state_bytes()
    with pytest.raises(InvalidInputError, match="no room for the 256 saved cells"):
        ctx.load_state_bytes(data, seq=1)
    assert ctx.state_bytes() == before
    assert ctx.memory.base.seq_pos_max(1) == ctx.memory.swa.seq_pos_max(1) == -1
