import numpy as np
import pytest

from llmsuite.core.sampling import CHAIN, Sampler, SamplerParams


def logits_with(values: dict[int, float], n: int = 100) -> np.ndarray:
    out = np.full(n, -5.0, np.float32)
    for i, v in values.items():
        out[i] = v
    return out


def test_temp_zero_is_argmax():
    s = Sampler(SamplerParams(temp=0.0, seed=1))
    assert s.sample(logits_with({7: 3.0, 8: 2.9})) == 7


def test_seeded_runs_repeat_and_differ_across_seeds():
    logits = np.random.default_rng(0).standard_normal(500).astype(np.float32)

    def runs(seed):
        sampler = Sampler(SamplerParams(seed=seed, top_k=0, top_p=1.0, min_p=0.0))
        return [sampler.sample(logits) for _ in range(20)]

    assert runs(42) == runs(42)
    assert runs(42) != runs(43)


def test_top_k_limits_candidates():
    logits = logits_with({1: 5.0, 2: 4.9, 3: 4.8})
    s = Sampler(SamplerParams(seed=3, top_k=2, top_p=1.0, min_p=0.0, temp=100.0))
    assert {s.sample(logits) for _ in range(200)} == {1, 2}


def test_min_p_drops_unlikely_tokens():
    logits = logits_with({1: 5.0, 2: 5.0 + np.log(0.2), 3: 5.0 + np.log(0.01)})
    s = Sampler(SamplerParams(seed=3, top_k=0, top_p=1.0, min_p=0.05, temp=1.0))
    assert {s.sample(logits) for _ in range(300)} == {1, 2}


def test_top_p_keeps_smallest_prefix():
    logits = logits_with({1: np.log(0.6), 2: np.log(0.3), 3: np.log(0.1)}, n=4)
    logits[0] = -np.inf
    s = Sampler(SamplerParams(seed=5, top_k=0, top_p=0.85, min_p=0.0, temp=1.0))
    assert {s.sample(logits) for _ in range(300)} == {1, 2}


def test_repeat_penalty_follows_llama_cpp():
    s = Sampler(SamplerParams(temp=0.0, repeat_penalty=2.0, repeat_last_n=4))
    for tok in (1, 2):
        s.accept(tok)
    _, out = s._penalties(np.arange(100), logits_with({1: 4.0, 2: -1.0, 3: 2.5}))
    assert out[1] == 2.0 and out[2] == -2.0 and out[3] == 2.5
    assert s.sample(logits_with({1: 4.0, 3: 2.5})) == 3


def test_frequency_and_presence_penalties_subtract_per_count():
    s = Sampler(SamplerParams(temp=0.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=8))
    for tok in (1, 1, 1, 2):
        s.accept(tok)
    _, out = s._penalties(np.array([3, 1, 2]), np.array([2.0, 4.0, 1.0], np.float32))  # candidates in any order
    np.testing.assert_allclose(out, [2.0, 4.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25])


def test_logit_bias_and_ignore_eos():
    banned = Sampler(SamplerParams(temp=0.0, logit_bias=((7, -np.inf),)))
    assert banned.sample(logits_with({7: 3.0, 8: 2.9})) == 8
    assert "logit-bias" in banned.describe()


def test_samplers_flag_orders_and_prunes_the_chain():
    from llmsuite.core.errors import InvalidInputError
    from llmsuite.core.sampling import parse_samplers

    assert parse_samplers("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature") == \
        CHAIN  # llama.cpp's default chain
    assert parse_samplers("temp;top-k") == ("temperature", "top_k")
    with pytest.raises(InvalidInputError, match="unknown sampler 'mirostat9'"):
        parse_samplers("top_k;mirostat9")
    # top-p before top-k: it sorts the candidates itself; without top-k all 4 tokens stay possible
    logits = logits_with({0: np.log(0.4), 1: np.log(0.3), 2: np.log(0.2), 3: np.log(0.1)}, n=4)
    only_top_p = Sampler(SamplerParams(seed=2, top_p=0.65, min_p=0.0, temp=1.0, chain=("top_p", "temperature")))
    assert {only_top_p.sample(logits) for _ in range(300)} == {0, 1}
    no_top_k = Sampler(SamplerParams(seed=2, top_k=1, top_p=1.0, min_p=0.0, temp=1.0, chain=("temperature",)))
    assert {no_top_k.sample(logits) for _ in range(300)} == {0, 1, 2, 3}
    assert no_top_k.describe() == "logits -> temp-ext -> dist"


@pytest.mark.parametrize("params, chain", [
    (SamplerParams(), "logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical -> top-p -> min-p -> ?xtc "
                      "-> temp-ext -> dist"),
    (SamplerParams(repeat_penalty=1.1, top_k=0, typ_p=0.9, top_n_sigma=1.0, xtc_probability=0.5),
     "logits -> penalties -> ?dry -> top-n-sigma -> ?top-k -> typical -> top-p -> min-p -> xtc -> temp-ext -> dist"),
])
def test_chain_description(params, chain):
    assert Sampler(params).describe() == chain


# ---- llama.cpp's other samplers, against hand-made distributions ----------------------------------

PROBS = np.log(np.array([0.5, 0.2, 0.2, 0.1], np.float32))  # entropy 1.2206; surprises 0.69, 1.61, 1.61, 2.30


def step(name, values, **params):
    sampler = Sampler(SamplerParams(seed=5, **params))
    ids, out = getattr(sampler, name)(np.arange(len(values)), np.asarray(values, np.float32))
    return [int(i) for i in ids], out


def test_typical_keeps_the_tokens_whose_surprise_is_nearest_the_entropy():
    # |surprise - entropy|: 0.53, 0.39, 0.39, 1.08 -> tokens 1, 2, 0, 3 with running sums 0.2, 0.4, 0.9, 1.0
    assert step("_typical", PROBS, typ_p=0.3)[0] == [1, 2]  # 0.4 > 0.3
    assert step("_typical", PROBS, typ_p=0.5)[0] == [1, 2, 0]  # 0.9 > 0.5
    assert step("_typical", PROBS, typ_p=1.0)[0] == [0, 1, 2, 3]  # off


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_largest():
    logits = [4.0, 3.0, 1.0, 0.0, -np.inf]  # finite: mean 2, standard deviation sqrt(2.5) = 1.58
    assert step("_top_n_sigma", logits, top_n_sigma=1.0)[0] == [0, 1]  # above 4 - 1.58
    assert step("_top_n_sigma", logits, top_n_sigma=2.0)[0] == [0, 1, 2]  # above 4 - 3.16
    assert step("_top_n_sigma", logits, top_n_sigma=-1.0)[0] == [0, 1, 2, 3, 4]  # off


def test_xtc_drops_the_top_choices_but_the_least_likely_of_them():
    probs = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32))
    assert step("_xtc", probs, xtc_probability=1.0, xtc_threshold=0.25)[0] == [1, 2, 3]  # 0.4 and 0.3 reach it
    assert step("_xtc", probs, xtc_probability=1.0, xtc_threshold=0.35)[0] == [0, 1, 2, 3]  # only one: kept
    assert step("_xtc", probs, xtc_probability=0.0, xtc_threshold=0.25)[0] == [0, 1, 2, 3]  # off
    sometimes = Sampler(SamplerParams(seed=5, xtc_probability=0.5, xtc_threshold=0.25))
    kept = {len(sometimes._xtc(np.arange(4), probs)[0]) for _ in range(200)}
    assert kept == {3, 4}  # half the time, as its own draw says


def test_dynamic_temperature_follows_the_entropy():
    probs = np.exp(PROBS.astype(np.float64))
    entropy = -(probs * np.log(probs)).sum()
    for exponent in (1.0, 2.0):
        temp = 0.5 + 1.0 * (entropy / np.log(4)) ** exponent  # --temp 1 ± 0.5: from 0.5 to 1.5
        _, out = step("_temperature", PROBS, temp=1.0, dynatemp_range=0.5, dynatemp_exponent=exponent)
        np.testing.assert_allclose(out, PROBS / temp, rtol=1e-5)
    _, flat = step("_temperature", np.zeros(4), temp=1.0, dynatemp_range=0.5)  # the largest entropy: 1.5
    _, peaked = step("_temperature", [0.0, -1e4, -1e4, -1e4], temp=1.0, dynatemp_range=0.5)  # none: 0.5
    np.testing.assert_allclose(peaked[1:], -1e4 / 0.5, rtol=1e-5)
    assert step("_temperature", [0.0, -1e4], temp=0.2, dynatemp_range=0.5)[0] == [0]  # 0 at no entropy: the largest


def test_mirostat_v2_keeps_the_tokens_within_its_surprise_bound_and_moves_it():
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float32))  # surprises 1, 2, 3, 3 bits
    fixed = Sampler(SamplerParams(seed=1, temp=1.0, mirostat=2, mirostat_tau=1.0, mirostat_eta=0.0))
    assert fixed.mu == 2.0 and {fixed.sample(logits) for _ in range(300)} == {0, 1}  # mu = 2 tau: surprise <= 2
    learning = Sampler(SamplerParams(seed=1, temp=1.0, mirostat=2, mirostat_tau=1.0, mirostat_eta=0.5))
    token = learning.sample(logits)
    kept = {0: 2 / 3, 1: 1 / 3}[token]  # the two kept, renormalized
    assert learning.mu == pytest.approx(2.0 - 0.5 * (-np.log2(kept) - 1.0), rel=1e-5)


def test_mirostat_v1_keeps_the_top_k_of_its_zipf_estimate():
    ranks = np.arange(1, 1001)
    logits = (-2.0 * np.log(ranks)).astype(np.float32)  # Zipf, exponent 2: the estimate is exactly 2
    for tau in (4.0, 3.0):  # k = 16, 8
        sampler = Sampler(SamplerParams(seed=2, temp=1.0, mirostat=1, mirostat_tau=tau, mirostat_eta=0.0))
        k = int((1.0 * 2 ** (2 * tau) / (1 - 1000.0 ** -1.0)) ** 0.5)  # ((s-1)·2^mu / (1 - n^-(s-1)))^(1/s)
        drawn = {sampler.sample(logits) for _ in range(2000)}
        assert max(drawn) == k - 1  # the k-th token is drawn, none after it
    assert Sampler(SamplerParams(mirostat=2)).describe() == "logits -> temp -> mirostat-v2"


class CharVocab:
    """One token per character of `chars`."""

    def __init__(self, chars):
        self.chars, self.n_tokens = chars, len(chars)

    def token_to_piece(self, token, special=False):
        return self.chars[token].encode()

    def tokenize(self, text, add_special=False, parse_special=False):
        return [self.chars.index(c) for c in text]


def dry_after(history: str, breakers=("\n",), **params):
    vocab = CharVocab("abcyx\n")
    settings = dict(dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=2, dry_sequence_breakers=breakers) | params
    sampler = Sampler(SamplerParams(**settings), vocab=vocab)
    for ch in history:
        sampler.accept(vocab.chars.index(ch))
    _, values = sampler._dry(np.arange(6), np.zeros(6, np.float32))
    return dict(zip(vocab.chars, (-values).tolist()))


def test_dry_penalizes_what_would_extend_a_repetition():
    # llama.cpp's own example: after "abccbcyabc", "abc" repeats from the start (3 tokens: 'c' would
    # make it 4) and "bc" from the middle (2 tokens: 'y' would make it 3); 'b' would extend only "c"
    penalties = dry_after("abccbcyabc")
    assert penalties == pytest.approx({"a": 0, "b": 0, "c": 0.8 * 2.0 ** (3 - 2), "y": 0.8 * 2.0 ** 0, "x": 0,
                                       "\n": 0})
    assert dry_after("abccbcyabc", dry_multiplier=0.0) == dict.fromkeys("abcyx\n", 0.0)  # off


def test_dry_stops_a_repetition_at_a_breaker():
    assert dry_after("abcxabc")["x"] == pytest.approx(0.8 * 2.0)  # "abc" repeats: 'x' would extend it
    assert dry_after("abc\nabc")["\n"] == 0  # a breaker is never penalized itself
    assert all(v == 0 for v in dry_after("abcxabc", breakers=("ab",)).values())  # "a" then "b": a breaker
    assert dry_after("abcxabc", dry_penalty_last_n=3)["x"] == 0  # only the last three tokens are scanned


def test_greedy_runs_the_steps_that_can_move_the_arg_max():
    probs = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32))
    assert Sampler(SamplerParams(temp=0.0)).sample(probs) == 0
    assert Sampler(SamplerParams(temp=0.0, xtc_probability=1.0, xtc_threshold=0.25)).sample(probs) == 1  # 0 dropped
    assert Sampler(SamplerParams(temp=0.0, typ_p=0.3)).sample(PROBS) == 1  # the typical set is tokens 1 and 2
