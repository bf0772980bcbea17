import numpy as np
import pytest

from conftest import real_model, tiny_gemma3
from llmsuite.core.batch import Batch
from llmsuite.core.chat import chat_prompt, render_chat
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.generation import TextOut, generate, stream_text
from llmsuite.core.vocab import TextStreamer
from llmsuite.core.sampling import Sampler, SamplerParams


def greedy():
    return Sampler(SamplerParams(temp=0.0))


def test_stops_after_n_predict():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64))
    result = generate(ctx, greedy(), [10, 11, 12], n_predict=5)[0]
    assert result.stop == "length" and len(result.tokens) == 5
    assert ctx.memory.seq_pos_max(0) == 3 + 5 - 2  # the last sampled token is never decoded


def test_zero_tokens_requested():
    result = generate(Context(tiny_gemma3(), ContextParams(n_ctx=64)), greedy(), [10, 11], n_predict=0)[0]
    assert result.tokens == [] and result.stop == "length"


def test_stops_at_end_of_generation():
    model = real_model("smollm2-135m")
    prompt = model.vocab.tokenize(chat_prompt(model, "Say hi."), add_special=True, parse_special=True)
    result = generate(Context(model, ContextParams(n_ctx=512)), greedy(), prompt, n_predict=200)[0]
    assert result.stop == "eog" and 0 < len(result.tokens) < 200


def test_stops_when_context_is_full():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=24))
    result = generate(ctx, greedy(), list(range(10, 20)), n_predict=-1)[0]
    assert result.stop == "context" and ctx.memory.seq_pos_max(0) == 23


def test_prompt_longer_than_context_is_refused():
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=16))
    with pytest.raises(InvalidInputError, match="too long"):
        generate(ctx, greedy(), list(range(13)))
    assert ctx.memory.seq_pos_max(0) == -1


def test_empty_prompt_without_bos_is_refused():
    with pytest.raises(InvalidInputError, match="empty"):
        generate(Context(tiny_gemma3(), ContextParams(n_ctx=16)), greedy(), [])


def test_chat_template_renders_smollm2_format():
    text = render_chat(real_model("smollm2-135m").chat_template,
                       [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_model_without_template_is_refused():
    with pytest.raises(InvalidInputError, match="no chat template"):
        render_chat(real_model("gemma3-270m").chat_template, [{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("kv", ["unified", "split"])
def test_parallel_completions_share_the_prompt(kv):
    model = real_model("smollm2-135m")
    prompt = model.vocab.tokenize("The capital of France is", add_special=True)
    # an f32 cache: a step of three rows attends through other kernels than one row does, and over
    # f16 rows their float rounding differs enough to flip a near-tie token of SmolLM2's
    f32 = dict(type_k="f32", type_v="f32")
    alone = generate(Context(model, ContextParams(n_ctx=128, **f32)), greedy(), prompt, n_predict=8)[0].tokens
    ctx = Context(model, ContextParams(n_ctx=384, n_seq_max=3, kv=kv, **f32))
    results = generate(ctx, [greedy() for _ in range(3)], prompt, n_predict=8)
    assert [r.tokens for r in results] == [alone] * 3
    if kv == "unified":  # the prompt's cells are shared, not copied
        assert ctx.memory.cells[0].used() == len(prompt) + 3 * 7


def test_seeded_parallel_completions_differ():
    model = real_model("smollm2-135m")
    prompt = model.vocab.tokenize("Once upon a time", add_special=True)
    samplers = [Sampler(SamplerParams(seed=100 + i, temp=1.0)) for i in range(3)]
    results = generate(Context(model, ContextParams(n_ctx=256, n_seq_max=3)), samplers, prompt, n_predict=12)
    assert len({tuple(r.tokens) for r in results}) > 1


def test_prompt_cache_reuses_the_matching_prefix(tmp_path):
    model = real_model("smollm2-135m")
    cache = tmp_path / "prompt.state"
    prompt = model.vocab.tokenize("The quick brown fox jumps over the lazy dog because", add_special=True)
    first_ctx = Context(model, ContextParams(n_ctx=256))
    generate(first_ctx, greedy(), prompt, n_predict=6, prompt_cache=cache)
    assert cache.exists() and first_ctx.perf.n_p_eval == len(prompt)
    again_ctx = Context(model, ContextParams(n_ctx=256))
    again = generate(again_ctx, greedy(), prompt, n_predict=6, prompt_cache=cache)[0].tokens
    assert again_ctx.perf.n_p_eval + again_ctx.perf.n_eval == 1 + 5  # only the last prompt token
    # The restored run equals a fresh one that evaluates the prompt as it does: the prefix, then the
    # last token alone. (Not necessarily `first`: ggml numerics take a token in a batch of more than
    # 8 rows through the 8-bit GEMM, alone through the integer dots, and this prompt's first
    # continuation is a near-tie, 16.70 against 16.63, that the two summation orders split.)
    fresh = Context(model, ContextParams(n_ctx=256))
    assert fresh.decode(Batch.from_tokens(prompt[:-1])) == 0
    tokens, token = [], prompt[-1]
    for _ in range(6):
        assert fresh.decode(Batch.from_tokens([token])) == 0
        token = int(np.argmax(fresh.get_logits()))
        tokens.append(token)
    assert again == tokens


def test_parallel_sequences_outgrow_the_window_cache():
    """-np 2 over a 300-token prompt on a 256-cell window cache: the shared prompt cells that left
    every sequence's window are reused, and both sequences generate what one would alone."""
    params = dict(n_ctx=1024, n_ubatch=32)
    prompt = list(range(1000, 1300))
    ctx = Context(tiny_gemma3(), ContextParams(n_seq_max=2, **params))
    assert ctx.memory.swa.kv_size == 256
    results = generate(ctx, [greedy(), greedy()], prompt, n_predict=8)
    alone = generate(Context(tiny_gemma3(), ContextParams(**params)), greedy(), prompt, n_predict=8)[0]
    assert [r.stop for r in results] == ["length", "length"]
    assert results[0].tokens == results[1].tokens == alone.tokens


# ---- stop strings (-r outside interactive mode) -------------------------------------------------

class PieceVocab:
    """Token i is pieces[i]; `hidden` tokens show only with special=True (as control tokens)."""

    def __init__(self, pieces, hidden=()):
        self.pieces, self.hidden = [p.encode() for p in pieces], set(hidden)

    def token_to_piece(self, token, special=False):
        return self.pieces[token] if special or token not in self.hidden else b""

    def streamer(self, special=False):
        return TextStreamer(self, special)


def shown_pieces(vocab, tokens, stops):
    out = TextOut(vocab, stops)
    pieces = [out.push(t) for t in tokens]
    return pieces, out.flush(), out


def test_a_stop_string_ends_the_text_before_it_and_nothing_shown_is_taken_back():
    vocab = PieceVocab(["Hello", " Us", "e", "r", ":", " more"])
    pieces, tail, out = shown_pieces(vocab, range(6), ("User:",))
    assert pieces == ["Hello", " ", "", "", "", ""] and tail == ""  # "Us", "Use", "User" held, never shown
    assert out.found and out.text == "Hello "


def test_a_held_tail_that_does_not_become_a_stop_string_is_shown():
    vocab = PieceVocab(["ab", " Us", "eful", " Us"])
    pieces, tail, out = shown_pieces(vocab, range(4), ("User:",))
    assert pieces == ["ab", " ", "Useful", " "] and tail == "Us"  # the end shows what was held
    assert not out.found and out.text == "ab Useful Us"


def test_the_first_stop_string_in_the_text_wins_and_a_special_token_stops_by_itself():
    vocab = PieceVocab(["x. y! z", "<|im_end|>"], hidden={1})
    assert shown_pieces(vocab, [0], ("!", "."))[2].text == "x"
    pieces, tail, out = shown_pieces(vocab, [0, 1], ("<|im_end|>",))
    assert out.found and out.text == "x. y! z"


def test_generation_stops_at_a_stop_string_streamed_and_in_a_batch():
    model = real_model("smollm2-135m")
    prompt = model.vocab.tokenize("The capital of France is", add_special=True)
    full = generate(Context(model, ContextParams(n_ctx=256)), greedy(), prompt, n_predict=24)[0]
    text = model.vocab.detokenize(full.tokens)
    stop = text[len(text) // 2:len(text) // 2 + 4]
    assert stop.strip() and text.find(stop) > 0
    expected = text[:text.find(stop)]
    pieces = stream_text(Context(model, ContextParams(n_ctx=256)), greedy(), prompt, 24, stops=(stop,))
    streamed = []
    while True:
        try:
            streamed.append(next(pieces))
        except StopIteration as done:
            result = done.value
            break
    assert "".join(streamed) == result.text == expected and result.stop == "stop string"
    assert full.tokens[:len(result.tokens)] == result.tokens and len(result.tokens) < len(full.tokens)
    assert stop in model.vocab.detokenize(result.tokens) and stop not in model.vocab.detokenize(result.tokens[:-1])
    batch = generate(Context(model, ContextParams(n_ctx=256, n_seq_max=2)), [greedy(), greedy()], prompt, 24,
                     stops=("never appears", stop))
    assert [(r.text, r.tokens, r.stop) for r in batch] == [(expected, result.tokens, "stop string")] * 2
