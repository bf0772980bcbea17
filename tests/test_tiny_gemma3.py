"""Gemma 3 on a tiny random-weight model (6 layers, window 8): llama.cpp's outputs, and the
sliding-window cache rolling over many times without changing a logit."""

from functools import lru_cache

import numpy as np
import pytest

from conftest import load_fixture, tiny_gemma3
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams


@lru_cache(maxsize=None)
def reference():
    return load_fixture("tiny/tiny-gemma3-swa.json")


def decode_all(tokens, **params) -> tuple[np.ndarray, dict, Context]:
    """Logits of every position, decoding `tokens` as one batch split into -ub micro-batches."""
    seen = {}
    ctx = Context(tiny_gemma3(), ContextParams(**params), observer=lambda name, ub, x: seen.setdefault(name, []).append(x))
    assert ctx.decode(Batch.from_tokens(tokens, all_outputs=True)) == 0, ctx.last_error
    return ctx.logits.copy(), {k: np.concatenate(v) for k, v in seen.items()}, ctx


def test_hparams_follow_the_gguf():
    hp = tiny_gemma3().hparams
    assert hp.n_swa == 8 and hp.rope_neox
    assert sorted(hp.swa_layers) == [0, 1, 2, 3, 4]
    assert hp.rope_base(0) == 10000.0 and hp.rope_base(5) == hp.rope_freq_base


def test_matches_llama_cpp():
    ref = reference()
    logits, hidden, _ = decode_all(ref["ids"], n_ctx=2048, swa_full=True)
    for pos, top in enumerate(ref["top"]):
        ids = [t[0] for t in top]
        assert int(np.argmax(logits[pos])) == ids[0]
        # llama.cpp's own runs (FA on/off, ubatch 16/512) differ by up to 0.01 on these logits
        assert np.abs(logits[pos, ids] - [t[1] for t in top]).max() < 0.03
    for name, values in ref["debug"]["hidden"].items():
        expected = np.array(values)
        assert np.abs(hidden[name] - expected).max() / np.abs(expected).max() < 5e-3, name


@pytest.mark.float_reference
def test_window_cache_rolls_over_exactly():
    """700 tokens through a 256-cell window cache in 22 micro-batches equal one full-cache pass."""
    tokens = np.random.default_rng(1).integers(0, 49152, 700)
    full, _, _ = decode_all(tokens, n_ctx=1024, n_batch=1024, n_ubatch=1024, swa_full=True)
    windowed, _, ctx = decode_all(tokens, n_ctx=1024, n_batch=1024, n_ubatch=32)
    assert ctx.memory.swa.kv_size == 256 and ctx.memory.seq_pos_min(0) > 0  # old positions were evicted
    np.testing.assert_allclose(windowed, full, atol=2e-4, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("n_ubatch", [1, 7, 96])
def test_ubatch_size_does_not_change_logits(n_ubatch):
    ids = reference()["ids"]
    one_pass, _, _ = decode_all(ids, n_ctx=256, n_ubatch=96)
    split, _, _ = decode_all(ids, n_ctx=256, n_ubatch=n_ubatch)
    np.testing.assert_allclose(split, one_pass, atol=2e-4, rtol=0)
