import numpy as np
import pytest

from llmsuite.core.batch import Batch, BatchAllocator
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import KVCache, AttnSpec


@pytest.fixture
def cache():
    return KVCache({0: AttnSpec(1, 4, 4)}, kv_size=32, n_seq_max=2)


def test_defaults(cache):
    balloc = BatchAllocator(n_vocab=10, n_seq_max=2)
    balloc.init(Batch.from_tokens([1, 2, 3]), cache)
    np.testing.assert_array_equal(balloc.pos, [0, 1, 2])
    np.testing.assert_array_equal(balloc.output, [False, False, True])


@pytest.mark.parametrize("batch, message", [
    (Batch.from_tokens([1, 10]), "outside the vocabulary"),
    (Batch.from_tokens([1], seq_id=2), "out of range"),
    (Batch.from_tokens([1, 2], pos0=-1), "negative position"),
    (Batch(np.array([1, 2], np.int32), pos=np.array([0, 2], np.int32)), "not consecutive"),
    (Batch(np.array([], np.int32)), "empty"),
])
def test_invalid_batches(cache, batch, message):
    balloc = BatchAllocator(n_vocab=10, n_seq_max=2)
    with pytest.raises(InvalidInputError, match=message):
        balloc.init(batch, cache)
    assert balloc.tokens is None  # nothing kept


@pytest.mark.parametrize("pos0", [5, 2])
def test_positions_must_continue_a_sequence(cache, pos0):
    balloc = BatchAllocator(n_vocab=10, n_seq_max=2)
    balloc.init(Batch.from_tokens([1, 2, 3], pos0=0), None)
    mctx = cache.init_batch(balloc, 8)
    mctx.apply()
    with pytest.raises(InvalidInputError, match="must continue at 3"):
        balloc.init(Batch.from_tokens([4], pos0=pos0), cache)


def test_split_simple_keeps_order(cache):
    balloc = BatchAllocator(n_vocab=10, n_seq_max=2)
    balloc.init(Batch.from_tokens(list(range(7)), all_outputs=True), cache)
    ubs = balloc.split_simple(3)
    assert [ub.n_tokens for ub in ubs] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([ub.batch_idx for ub in ubs]), np.arange(7))
