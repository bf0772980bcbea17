"""Memory classes on their own: planning, masks, sequence edits, shifts and state round trips."""

import numpy as np
import pytest

from llmsuite.core.backend.cpu import as_float
from llmsuite.core.batch import Batch, BatchAllocator
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import CACHE_TYPES, AttnSpec, KVCache, KVCacheISWA, MemoryStatus, NoKVMemory, RopeSpec
from llmsuite.core.statefile import StateReader, StateWriter

LAYERS = {0: AttnSpec(1, 32, 32), 1: AttnSpec(1, 32, 32)}


def snapshot(memory) -> bytes:
    w = StateWriter()
    memory.state_write(w)
    return w.getvalue()


def commit(memory, tokens, seq_id=0, n_seq_max=4, n_ubatch=512, kv=None):
    """Decode-less commit: plan, apply every ubatch, write K/V rows equal to the token ids."""
    balloc = BatchAllocator(n_vocab=1000, n_seq_max=n_seq_max)
    balloc.init(Batch.from_tokens(tokens, seq_id=seq_id), memory)
    mctx = memory.init_batch(balloc, n_ubatch)
    assert mctx.status == MemoryStatus.SUCCESS
    while True:
        mctx.apply()
        for il in LAYERS:
            rows = np.repeat(mctx.ubatch.tokens[:, None, None], 32, axis=2).astype(np.float32)
            mctx.layer(il).store(rows, rows)
        if mctx.index + 1 == len(mctx.ubatches):
            return mctx
        mctx.next()


def visible(mctx, il=0, row=0):
    """Positions a query row can see, per the mask of its group."""
    group = mctx.layer(il).groups()[0]
    mask, _ = group.produce_mask(il, None)
    cells = mctx.cache.cells[0] if hasattr(mctx, "cache") else None
    return sorted(cells.pos[: mask.shape[1]][np.isfinite(mask[row])])


def test_planning_does_not_touch_the_cache():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, [1, 2, 3])
    before = snapshot(cache), list(cache.heads)
    balloc = BatchAllocator(1000, 4)
    balloc.init(Batch.from_tokens([4, 5, 6, 7, 8]), cache)
    mctx = cache.init_batch(balloc, n_ubatch=2)
    assert mctx.status == MemoryStatus.SUCCESS and len(mctx.ubatches) == 3
    assert (snapshot(cache), cache.heads) == before


def test_no_slot_leaves_cache_unchanged():
    cache = KVCache(LAYERS, kv_size=8)
    commit(cache, [1, 2, 3, 4, 5])
    before = snapshot(cache)
    balloc = BatchAllocator(1000, 4)
    balloc.init(Batch.from_tokens([6, 7, 8, 9]), cache)
    assert cache.init_batch(balloc, n_ubatch=2).status == MemoryStatus.FAILED_PREPARE
    assert snapshot(cache) == before


def test_mask_is_causal_per_sequence():
    cache = KVCache(LAYERS, kv_size=16, n_seq_max=2)
    commit(cache, [1, 2, 3], seq_id=0, n_seq_max=2)
    mctx = commit(cache, [4, 5], seq_id=1, n_seq_max=2)
    mask = mctx.layer(0).groups()[0].mask  # tokens of sequence 1 at positions 0 and 1
    np.testing.assert_array_equal(np.isfinite(mask), [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])


def test_window_cache_reuses_cells():
    cache = KVCache(LAYERS, kv_size=6, n_swa=3, swa_layers={0, 1})
    for tok in range(10):  # one token at a time through a 6-cell window cache
        mctx = commit(cache, [tok])
        assert visible(mctx) == list(range(max(0, tok - 2), tok + 1))
    assert cache.seq_pos_max(0) == 9 and cache.seq_pos_min(0) > 0


def test_window_cache_reuses_shared_cells_out_of_every_owners_window():
    """Sequence 1 shares positions 0..5 of sequence 0. With a window of 4, sequence 0 (next
    position 8) no longer sees 0..4 but sequence 1 (next 6) still sees 3..5: three cells are free."""
    cache = KVCache(LAYERS, kv_size=8, n_seq_max=2, n_swa=4, swa_layers={0, 1})
    commit(cache, list(range(8)), n_seq_max=2)
    cache.seq_cp(0, 1, 0, 6)
    before = snapshot(cache)
    balloc = BatchAllocator(1000, 2)
    balloc.init(Batch.from_tokens([10, 11, 12, 13]), cache)
    assert cache.init_batch(balloc, n_ubatch=4).status == MemoryStatus.FAILED_PREPARE
    assert snapshot(cache) == before
    commit(cache, [10, 11, 12], n_seq_max=2)
    assert sorted(cache.cells[0].pos[cache.cells[0].seq[:, 1]]) == [3, 4, 5]
    assert (cache.seq_pos_min(0), cache.seq_pos_max(0)) == (3, 10)


def test_unified_cache_masks_window_layers_only():
    cache = KVCache(LAYERS, kv_size=16, n_swa=2, swa_layers={1})
    mctx = commit(cache, list(range(5)))
    assert visible(mctx, il=0, row=4) == [0, 1, 2, 3, 4]
    assert visible(mctx, il=1, row=4) == [3, 4]


def test_seq_rm_partial_and_whole():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, list(range(8)))
    assert cache.seq_rm(0, 5, -1)
    assert cache.seq_pos_max(0) == 4 and cache.cells[0].used() == 5
    assert cache.seq_rm(0, -1, -1)
    assert cache.seq_pos_max(0) == -1 and cache.cells[0].used() == 0


def test_seq_cp_shares_cells_and_seq_keep_drops_the_rest():
    cache = KVCache(LAYERS, kv_size=16, n_seq_max=3)
    commit(cache, [1, 2, 3, 4], n_seq_max=3)
    cache.seq_cp(0, 1, -1, -1)
    cache.seq_cp(0, 2, 0, 2)
    assert cache.cells[0].used() == 4  # no new cells
    assert (cache.seq_pos_max(1), cache.seq_pos_max(2)) == (3, 1)
    cache.seq_keep(2)
    assert cache.cells[0].used() == 2 and cache.seq_pos_max(0) == -1 and cache.seq_pos_max(2) == 1


def test_split_streams_copy_whole_sequences():
    cache = KVCache(LAYERS, kv_size=8, n_seq_max=2, n_stream=2, kind="split")
    commit(cache, [7, 8, 9], n_seq_max=2)
    cache.seq_cp(0, 1)
    assert cache.seq_pos_max(1) == 2 and cache.cells[1].used() == 3
    np.testing.assert_array_equal(cache.k[0].read(1, 3, 1)[:, 0, 0], [7, 8, 9])
    with pytest.raises(InvalidInputError, match="whole sequence"):
        cache.seq_cp(0, 1, 0, 2)


def test_split_batch_groups_sequences_per_stream():
    cache = KVCache(LAYERS, kv_size=8, n_seq_max=2, n_stream=2, kind="split")
    balloc = BatchAllocator(1000, 2)
    balloc.init(Batch(np.array([1, 2, 3, 4], np.int32), seq_id=np.array([0, 1, 0, 1], np.int32)), cache)
    mctx = cache.init_batch(balloc, 512)
    ub = mctx.ubatch
    np.testing.assert_array_equal(ub.seq_id, [0, 0, 1, 1])
    mctx.apply()
    stream_masks = mctx._stream_masks()
    assert [list(rows) for _, rows, _, _ in stream_masks] == [[0, 1], [2, 3]]
    # under a causal mask the streams are attended side by side in one call: stream 1 from cell 8
    [group] = mctx.groups(0)
    assert group.keys.shape[0] == 8 + 2 and group.rows == slice(None)
    kept = [np.flatnonzero(np.isfinite(row)).tolist() for row in group.mask]
    assert kept == [[0], [0, 1], [8], [8, 9]]
    np.testing.assert_array_equal(group.cell_pos[[0, 1, 8, 9]], [0, 1, 0, 1])


class RecordingRope:
    """A backend whose rope records, per call, the position deltas it is asked to rotate by (its
    table is the deltas themselves)."""

    def __init__(self):
        self.deltas = []

    def rope_cache(self, delta, n_rot, base, freq_scale):
        return np.asarray(delta).copy()

    def rope(self, keys, table, neox):
        self.deltas.append(table)
        return keys


def test_seq_add_and_div_shift_lazily():
    roped = {il: AttnSpec(1, 32, 32, rope=RopeSpec(32, 10000.0)) for il in LAYERS}
    cache = KVCache(roped, kv_size=16)
    commit(cache, list(range(6)))
    cache.seq_add(0, 3, -1, -2)  # positions 3,4,5 -> 1,2,3; cells at 1,2 collide in position, as in llama.cpp
    assert cache.seq_pos_max(0) == 3
    np.testing.assert_array_equal(cache.cells[0].shift[:6], [0, 0, 0, -2, -2, -2])
    cache.seq_div(0, 0, -1, 2)
    np.testing.assert_array_equal(cache.cells[0].pos[:6], [0, 0, 1, 0, 1, 1])
    backend = RecordingRope()
    assert cache.update(backend)
    assert len(backend.deltas) == 2  # once per layer, with the cells' accumulated deltas
    np.testing.assert_array_equal(backend.deltas[0], [-1, -1, -3, -3, -4])  # the keys of cells 1..5 move
    assert not cache.cells[0].shift.any() and not cache.update(backend)


def test_keys_without_rope_are_not_rotated():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, list(range(4)))
    cache.seq_add(0, -1, -1, 3)
    backend = RecordingRope()
    assert cache.update(backend) and backend.deltas == [] and cache.seq_pos_max(0) == 6


def test_seq_add_below_zero_frees_cells():
    cache = KVCache(LAYERS, kv_size=8)
    commit(cache, [1, 2, 3, 4])
    cache.seq_add(0, -1, -1, -2)
    assert cache.cells[0].used() == 2 and cache.seq_pos_min(0) == 0


@pytest.mark.parametrize("type_name", CACHE_TYPES)
def test_state_round_trip(type_name):
    cache = KVCache(LAYERS, kv_size=16, type_k=type_name, type_v=type_name)
    commit(cache, [3, 1, 4, 1, 5])
    data = snapshot(cache)
    other = KVCache(LAYERS, kv_size=16, type_k=type_name, type_v=type_name)
    other.state_read(StateReader(data, "test")).commit()
    assert snapshot(other) == data
    np.testing.assert_allclose(as_float(other.k[1].read(0, 5, 1))[:, 0, 0], [3, 1, 4, 1, 5], rtol=0.1)


def test_state_of_other_shape_is_refused_and_changes_nothing():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, [1, 2, 3])
    other = KVCache(LAYERS, kv_size=16, type_k="f16")
    commit(other, [9])
    before = snapshot(other)
    with pytest.raises(Exception, match="K cache type"):
        other.state_read(StateReader(snapshot(cache), "test"))
    with pytest.raises(Exception, match="truncated"):
        cache.state_read(StateReader(snapshot(cache)[:-10], "test"))
    assert snapshot(other) == before


def test_iswa_sizes_and_routing():
    layers = {il: AttnSpec(1, 4, 4) for il in range(6)}
    mem = KVCacheISWA(layers, {0, 1, 2, 3, 4}, kv_size=4096, n_swa=512, n_ubatch=512)
    assert mem.base.kv_size == 4096 and mem.swa.kv_size == 1024 and not mem.can_shift
    assert set(mem.swa.k) == {0, 1, 2, 3, 4} and set(mem.base.k) == {5}
    full = KVCacheISWA(layers, {0, 1, 2, 3, 4}, kv_size=4096, n_swa=512, n_ubatch=512, swa_full=True)
    assert full.swa.kv_size == 4096 and full.nbytes > mem.nbytes and full.can_shift


def test_no_kv_memory_keeps_histories():
    mem = NoKVMemory(n_seq_max=2)
    commit(mem, [5, 6, 7], n_seq_max=2)
    mem.seq_cp(0, 1, 0, 2)
    mem.seq_add(0, 1, -1, 10)
    assert mem.history(0)[1].tolist() == [0, 11, 12] and mem.history(1)[0].tolist() == [5, 6]
    assert mem.seq_rm(0, 11, 12) and mem.history(0)[0].tolist() == [5, 7]
    data = snapshot(mem)
    fresh = NoKVMemory(n_seq_max=2)
    fresh.state_read(StateReader(data, "test")).commit()
    assert snapshot(fresh) == data
