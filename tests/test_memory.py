"""KV cache planning, masks and sequence edits, on the cache classes directly."""

import numpy as np

from llmsuite.core.batch import Batch, BatchAllocator
from llmsuite.core.memory import KVCache, KVCacheISWA, LayerShape, MemoryStatus

LAYERS = {0: LayerShape(1, 4, 4), 1: LayerShape(1, 4, 4)}


def allocate(cache, tokens, pos0=None, seq_id=0, n_seq_max=1):
    balloc = BatchAllocator(n_vocab=100, n_seq_max=n_seq_max)
    balloc.init(Batch.from_tokens(tokens, pos0=pos0, seq_id=seq_id), cache)
    return balloc


def commit(cache, tokens, n_ubatch=512, seq_id=0, n_seq_max=1):
    mctx = cache.init_batch(allocate(cache, tokens, seq_id=seq_id, n_seq_max=n_seq_max), n_ubatch)
    assert mctx.status == MemoryStatus.SUCCESS
    mctx.apply()
    while mctx.index + 1 < len(mctx.ubatches):
        mctx.next()
        mctx.apply()
    return mctx


def test_planning_does_not_touch_the_cache():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, [1, 2, 3])
    before = cache.cells.snapshot(), cache.head
    mctx = cache.init_batch(allocate(cache, [4, 5, 6, 7, 8]), n_ubatch=2)
    assert mctx.status == MemoryStatus.SUCCESS and len(mctx.ubatches) == 3
    np.testing.assert_array_equal(cache.cells.pos, before[0][0])
    np.testing.assert_array_equal(cache.cells.seq, before[0][1])
    assert cache.head == before[1]


def test_no_slot_leaves_cache_unchanged():
    cache = KVCache(LAYERS, kv_size=8)
    commit(cache, [1, 2, 3, 4, 5])
    pos, seq = cache.cells.snapshot()
    mctx = cache.init_batch(allocate(cache, [6, 7, 8, 9]), n_ubatch=2)
    assert mctx.status == MemoryStatus.FAILED_PREPARE
    np.testing.assert_array_equal(cache.cells.pos, pos)
    np.testing.assert_array_equal(cache.cells.seq, seq)


def test_mask_is_causal_per_sequence():
    cache = KVCache(LAYERS, kv_size=16, n_seq_max=2)
    commit(cache, [1, 2, 3], seq_id=0, n_seq_max=2)
    mctx = commit(cache, [4, 5], seq_id=1, n_seq_max=2)
    mask = mctx.mask  # tokens of sequence 1 at positions 0 and 1
    assert mask.shape == (2, 5)
    np.testing.assert_array_equal(np.isfinite(mask), [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]])


def test_sliding_window_mask_and_reuse():
    cache = KVCache(LAYERS, kv_size=6, n_swa=3)
    for tok in range(10):  # one token at a time through a 6-cell window cache
        mctx = commit(cache, [tok])
        visible = cache.cells.pos[: mctx.n_kv][np.isfinite(mctx.mask[0])]
        assert sorted(visible) == list(range(max(0, tok - 2), tok + 1))
    assert cache.seq_pos_max(0) == 9 and cache.seq_pos_min(0) > 0


def test_seq_rm_partial_and_whole():
    cache = KVCache(LAYERS, kv_size=16)
    commit(cache, list(range(8)))
    assert cache.seq_rm(0, 5, -1)
    assert cache.seq_pos_max(0) == 4 and cache.cells.used() == 5
    assert cache.seq_rm(0, -1, -1)
    assert cache.seq_pos_max(0) == -1 and cache.cells.used() == 0


def test_iswa_sizes_and_routing():
    layers = {il: LayerShape(1, 4, 4) for il in range(6)}
    mem = KVCacheISWA(layers, {0, 1, 2, 3, 4}, kv_size=4096, n_swa=512, n_ubatch=512)
    assert mem.base.kv_size == 4096 and mem.swa.kv_size == 1024
    assert set(mem.swa.k) == {0, 1, 2, 3, 4} and set(mem.base.k) == {5}
    full = KVCacheISWA(layers, {0, 1, 2, 3, 4}, kv_size=4096, n_swa=512, n_ubatch=512, swa_full=True)
    assert full.swa.kv_size == 4096 and full.nbytes > mem.nbytes
