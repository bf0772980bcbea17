"""State files: a pending K-shift survives a save, a sequence load applies to every cache or to
none, and corrupt files are refused with the memory unchanged."""

import random
import struct
import zlib
from unittest import mock

import numpy as np
import pytest

from conftest import tiny_gemma3
from llmsuite.core.batch import POS_LIMIT, Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.statefile import StateFileError, StateReader

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


WINDOWED = ContextParams(n_ctx=2048, n_seq_max=2, n_ubatch=16, kv="iswa", type_k="f32", type_v="f32")  # float_reference's


@pytest.mark.float_reference
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


# ---- corrupt state files ------------------------------------------------------------------------

def saved_states():
    """(label, params, file bytes, sequence): whole and per-sequence states of each memory kind,
    with a prefix shared by two sequences so that cells have several owners."""
    for label, kind in (("unified", dict(kv="unified")), ("iswa", dict(kv="iswa")), ("none", dict(kv="none"))):
        params = ContextParams(n_ctx=64, n_seq_max=2, n_ubatch=8, **kind)
        ctx = decoded(params, list(range(500, 520)))
        ctx.memory.seq_cp(0, 1, -1, -1)
        assert ctx.decode(Batch.from_tokens([7, 8], seq_id=1)) == OK
        yield f"{label} whole", params, ctx.state_bytes(list(range(500, 520))), None
        yield f"{label} seq", params, ctx.state_bytes(seq=1), 1


STATES = list(saved_states())


def target(params: ContextParams) -> Context:
    """A context with something in it, to show that a refused load changes nothing."""
    ctx = decoded(params, list(range(900, 910)))
    if params.n_seq_max > 1:
        ctx.memory.seq_cp(0, 1, -1, -1)
    return ctx


def layout(params: ContextParams, data: bytes, seq, model=None) -> list[tuple[str, int, int]]:
    """(field, offset, size) of every read a valid state file takes, in order (tiny Gemma 3's unless
    another model is given)."""
    reads = []
    take = StateReader._take

    def recording_take(self, n, field):
        reads.append((field, self.pos, n))
        return take(self, n, field)

    with mock.patch.object(StateReader, "_take", recording_take):
        Context(model or tiny_gemma3(), params).load_state_bytes(data, seq)
    return reads


def assert_refused(params, data: bytes, seq, match: str | None = None) -> None:
    ctx = target(params)
    before = ctx.state_bytes()
    with pytest.raises((StateFileError, InvalidInputError), match=match):
        ctx.load_state_bytes(data, seq)
    assert ctx.state_bytes() == before


def sealed(data: bytes | bytearray) -> bytes:
    """The payload with a correct checksum: what a careful forger (or a bug) would write."""
    body = bytes(data[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize("label, params, data, seq", STATES, ids=[s[0] for s in STATES])
def test_truncated_and_flipped_state_files_are_refused(label, params, data, seq):
    cuts = sorted({offset for _, offset, _ in layout(params, data, seq)} | {len(data) - 4, len(data) - 1})
    for cut in cuts:
        assert_refused(params, data[:cut], seq)
    rng = random.Random(len(data))
    for at in rng.sample(range(len(data)), 60):
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        assert_refused(params, bytes(flipped), seq)


def overwrite(data: bytes, reads, field: str, part: int, value: bytes, at: int = 0) -> bytes:
    """Overwrite bytes `at` of the part-th read of `field` (-1: its data), then reseal."""
    _, offset, _ = [r for r in reads if r[0] == field][part]
    out = bytearray(data)
    out[offset + at:offset + at + len(value)] = value
    return sealed(out)


I32 = lambda v: struct.pack("<i", v)  # noqa: E731
CELL_EDITS = [  # (field, part, bytes, at, what the refusal says)
    ("the cell positions", -1, I32(-1), 0, "position is outside"),
    ("the cell positions", -1, I32(2**31 - 1), 4, "position is outside"),
    ("the cell positions", -1, I32(3), 0, "same position"),
    ("the cell indices", -1, I32(1), 0, "appears twice"),
    ("the cell indices", -1, I32(-5), 0, "outside the cache"),
    ("the cell positions", 1, b"<f4", 0, "float32 values, expected int32"),
    ("the cell positions", 1, b"|O8", 0, "unknown element type"),
    ("the cell positions", 2, I32(9), 0, "9 dimensions"),
    ("the tokens", -1, I32(10**6), 0, "outside the vocabulary"),
    ("the tokens", -1, I32(-1), 0, "outside the vocabulary"),
]


@pytest.mark.parametrize("label, params, data, seq", [s for s in STATES if not s[0].startswith("none")],
                         ids=[s[0] for s in STATES if not s[0].startswith("none")])
def test_resealed_field_edits_are_refused(label, params, data, seq):
    """Edits a checksum cannot see (the file resealed after the edit) fail the cell checks."""
    reads = layout(params, data, seq)
    for field, part, value, at, match in CELL_EDITS:
        if field == "the tokens" and seq is not None:
            continue  # a sequence file here carries no tokens
        assert_refused(params, overwrite(data, reads, field, part, value, at), seq, match)
    if seq is None:  # a cell held by nobody: the shared prefix's first cell loses both owners
        assert_refused(params, overwrite(data, reads, "the cell sequences", -1, b"\0\0"), seq, "no sequence")


def test_resealed_history_edits_are_refused():
    label, params, data, seq = STATES[4]
    assert label == "none whole"
    reads = layout(params, data, seq)
    for field, value, match in (("the position history", I32(-1), "position history"),
                                ("the position history", I32(1), "position history"),
                                ("the token history", I32(10**6), "token history")):
        assert_refused(params, overwrite(data, reads, field, -1, value), seq, match)


def test_tokens_must_describe_the_sequence():
    params = ContextParams(n_ctx=64)
    ctx = decoded(params, list(range(500, 520)))
    assert_refused(params, ctx.state_bytes(list(range(500, 519))), None, "19 tokens do not match sequence 0")
    assert Context(tiny_gemma3(), params).load_state_bytes(ctx.state_bytes(list(range(500, 520)))) == \
        list(range(500, 520))


def test_a_state_at_the_largest_positions_loads_and_refuses_to_overflow():
    params = ContextParams(n_ctx=64)
    ctx = Context(tiny_gemma3(), params)
    assert ctx.decode(Batch.from_tokens([5, 6], pos0=POS_LIMIT - 2)) == OK
    resumed = Context(tiny_gemma3(), params)
    resumed.load_state_bytes(ctx.state_bytes())
    assert resumed.decode(Batch.from_tokens([7])) == DecodeStatus.INVALID_BATCH
    assert "largest position" in resumed.last_error
