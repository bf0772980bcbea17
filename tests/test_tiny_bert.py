"""BERT on a tiny random-weight model: the encoder context and `llm embed` against llama.cpp's
pooled and per-token embeddings (README §5 of the fixtures: mean pooling, not normalized)."""

import json
from functools import lru_cache

import numpy as np
import pytest

from conftest import TINY_BERT, TINY_GEMMA3, load_fixture, tiny_model
from test_cli import assert_one_line_error, llm
from llmsuite.cli.embed import format_embeddings
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.embeddings import cosine, normalize
from llmsuite.core.errors import InvalidInputError


@lru_cache(maxsize=None)
def reference():
    return load_fixture("tiny/tiny-bert.json")


def encoder(**params) -> Context:
    return Context(tiny_model(TINY_BERT), ContextParams(**params))


def pooled_alone(ctx: Context, seq) -> np.ndarray:
    assert ctx.decode(Batch.from_tokens(seq)) == DecodeStatus.OK, ctx.last_error
    return ctx.get_embeddings_seq(0).copy()


# measured max |Δ| 3.8e-3 with float32 activations, 1.8e-3 with --numerics ggml (activations
# rounded to f16 before F16 weights and to q8_0 before Q4_0 ones, as ggml-cpu does); llama.cpp's
# flash attention also rounds Q/K/V to f16, which neither emulates
@pytest.mark.parametrize("numerics,tolerance", [("f32", 1e-2), ("ggml", 4e-3)])
def test_pooled_embeddings_match_llama_cpp(numerics, tolerance):
    ref, ctx = reference(), encoder(numerics=numerics)
    assert ctx.kind == "encoder" and ctx.memory is None and ctx.pooling == "mean"
    for seq, expected in zip(ref["seqs"], ref["pooled"]):
        got = pooled_alone(ctx, seq)
        assert cosine(got, expected) >= 0.9999
        assert np.abs(got - expected).max() <= tolerance


@pytest.mark.float_reference
def test_sequences_in_one_batch_equal_each_alone():
    ref, ctx = reference(), encoder(n_seq_max=3)
    alone = [pooled_alone(ctx, seq) for seq in ref["seqs"]]
    tokens = np.concatenate(ref["seqs"])
    seq_id = np.concatenate([np.full(len(s), i) for i, s in enumerate(ref["seqs"])])
    pos = np.concatenate([np.arange(len(s)) for s in ref["seqs"]])
    assert ctx.decode(Batch(tokens, pos, seq_id, np.ones(len(tokens), bool))) == DecodeStatus.OK
    for i in range(3):
        np.testing.assert_allclose(ctx.get_embeddings_seq(i), alone[i], atol=1e-5, rtol=0)


# per token (not averaged): measured max |Δ| 1.7e-2 with float32 activations, 1.04e-2 with ggml's
# (8.2e-3 before ggml numerics took GELU from ggml-cpu's f16 table: the pooled figure stayed 1.8e-3)
@pytest.mark.parametrize("numerics,tolerance", [("f32", 2e-2), ("ggml", 1.5e-2)])
def test_per_token_embeddings_match_llama_cpp(numerics, tolerance):
    ref, ctx = reference(), encoder(pooling="none", numerics=numerics)
    for seq, expected in zip(ref["seqs"], ref["token_embeddings"]["per_seq"]):
        assert ctx.decode(Batch.from_tokens(seq, all_outputs=True)) == DecodeStatus.OK
        got = np.stack([ctx.get_embeddings(i) for i in range(len(seq))])
        assert np.abs(got - np.array(expected)).max() <= tolerance
        assert min(cosine(a, b) for a, b in zip(got, expected)) >= 0.9999
    with pytest.raises(InvalidInputError, match="does not pool"):
        ctx.get_embeddings_seq(0)


def test_encoder_refuses_what_it_cannot_do():
    ctx = encoder(n_ctx=512, n_ubatch=16, n_batch=64)
    assert ctx.decode(Batch.from_tokens(np.arange(20))) == DecodeStatus.INVALID_BATCH
    assert "one micro-batch" in ctx.last_error and "-ub 16" in ctx.last_error
    with pytest.raises(InvalidInputError, match="keeps no state"):
        ctx.state_bytes()
    with pytest.raises(InvalidInputError, match="embeddings, not logits"):
        ctx.get_logits()
    big = encoder(n_ctx=1024, n_batch=1024, n_ubatch=1024)
    assert big.decode(Batch.from_tokens(np.arange(600))) == DecodeStatus.INVALID_BATCH
    assert "512 learned positions" in big.last_error


@pytest.mark.parametrize("params,fragment", [
    ({"ctx": "decoder"}, "is an encoder (use --ctx encoder)"),
    ({"kv": "unified"}, "keeps no memory"),
    ({"ctx": "enc-dec"}, "is an encoder"),
])
def test_flags_that_cannot_apply_to_an_encoder(params, fragment):
    with pytest.raises(InvalidInputError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        encoder(**params)


@pytest.mark.parametrize("ctx_kind,fragment", [("encoder", "needs an encoder model"),
                                               ("enc-dec", "needs a model with an encoder")])
def test_causal_models_refuse_encoder_contexts(ctx_kind, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        Context(tiny_model(TINY_GEMMA3), ContextParams(ctx=ctx_kind))


@pytest.mark.parametrize("mode", [-1, 0, 1, 2, 3])
def test_normalize_follows_llama_cpp(mode):
    v = np.array([3.0, -4.0, 0.5], np.float32)
    got = normalize(v, mode)
    norm = {-1: 1.0, 0: 4.0 / 32760.0, 1: 7.5, 2: np.sqrt(25.25), 3: (27 + 64 + 0.125) ** (1 / 3)}[mode]
    np.testing.assert_allclose(got, v / norm, rtol=1e-6)
    assert not normalize(np.zeros(3, np.float32), mode).any()


# ---- llm embed ---------------------------------------------------------------------------

def test_embed_json_is_each_text_normalized():
    ref = reference()
    r = llm("embed", "-m", str(TINY_BERT), *ref["texts"], "-o", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["object"] == "list" and [d["index"] for d in data["data"]] == [0, 1, 2]
    for d, expected in zip(data["data"], ref["pooled"]):
        expected = np.array(expected) / np.linalg.norm(expected)
        assert np.abs(np.array(d["embedding"]) - expected).max() < 5e-3


def test_embed_file_lines_array_and_plain(tmp_path):
    ref = reference()
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(ref["texts"]) + "\n")
    r = llm("embed", "-m", str(TINY_BERT), "-f", str(path), "-o", "array", "--embd-normalize", "-1", "-b", "16")
    assert r.returncode == 0, r.stderr
    rows = np.array(json.loads(r.stdout))  # -b 16 puts each text in its own batch
    assert rows.shape == (3, 64) and np.abs(rows - np.array(ref["pooled"])).max() < 1e-2
    r = llm("embed", "-m", str(TINY_BERT), "-p", "\\n".join(ref["texts"][:2]))  # \n read as an escape, as there
    lines = r.stdout.split("\n")
    assert r.returncode == 0 and lines[0] == "" and lines[1].startswith("embedding 0: ")
    assert len(lines[1].split()) == 2 + 16 and "cosine similarity matrix:" in lines  # several: the first 16 values
    r = llm("embed", "-m", str(TINY_BERT), "-p", "<#>".join(ref["texts"]), "--embd-separator", "<#>", "-o", "raw",
            "--embd-normalize", "-1")
    raw = np.array([[float(x) for x in line.split(" ")] for line in r.stdout.splitlines() if line])
    assert r.returncode == 0 and r.stdout.endswith("\n\n") and raw.shape == (3, 64)
    assert np.abs(raw - np.array(ref["pooled"])).max() < 1e-2
    one = llm("embed", "-m", str(TINY_BERT), "-p", ref["texts"][0]).stdout.split("\n")
    assert len(one[1].split()) == 2 + 64 and "cosine similarity matrix:" not in one  # one input: all its values


def test_embed_default_layout_is_llama_embeddings_to_the_character():
    vectors = [np.array([0.5, -0.25], np.float32), np.array([1.0, 0.0], np.float32)]
    assert format_embeddings(vectors, "default", False, ["hello world", "hi"]) == (
        "\nembedding 0:  0.500000 -0.250000 \nembedding 1:  1.000000  0.000000 \n\ncosine similarity matrix:\n\n"
        "hello      hi \n  1.00   0.89 hello worl\n  0.89   1.00 hi\n\n")
    tokens = [np.arange(8, dtype=np.float32) - 3]
    assert format_embeddings(tokens, "default", True, [], per_token=True) == \
        "\nembedding 0:     -3     -2     -1  ...      2      3      4 \n\n"
    assert format_embeddings(vectors, "raw", False, []) == "0.5000000 -0.2500000\n1.0000000 0.0000000\n\n"


def test_embed_per_token_with_pooling_none():
    r = llm("embed", "-m", str(TINY_BERT), "To be, or not", "--pooling", "none", "-o", "array")
    assert r.returncode == 0, r.stderr
    rows = np.array(json.loads(r.stdout))
    assert rows.shape == (5, 64) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_embed_a_causal_model_needs_pooling():
    assert_one_line_error(llm("embed", "-m", str(TINY_GEMMA3), "hello"), "has no pooling type")
    r = llm("embed", "-m", str(TINY_GEMMA3), "hello", "there world", "--pooling", "last", "-o", "array")
    assert r.returncode == 0, r.stderr
    assert np.array(json.loads(r.stdout)).shape == (2, 64)


@pytest.mark.parametrize("args,fragment", [
    (["one", ""], "input 2 is empty"),
    ([], "nothing to embed"),
    (["x" * 60, "-b", "8"], "input 1 ('xxxx"),
    (["hi", "--embd-normalize", "-2"], "--embd-normalize -2"),
    (["hi", "-o", "yaml"], "unknown --embd-output-format"),
    (["hi", "--pooling", "rank"], "unknown --pooling"),
    (["hi", "--ctx", "decoder"], "is an encoder"),
])
def test_embed_bad_input(args, fragment):
    r = llm("embed", "-m", str(TINY_BERT), *args)
    assert_one_line_error(r, fragment)
    assert r.stdout == ""


def embed_array(model, *args) -> np.ndarray:
    r = llm("embed", "-m", str(model), *args, "-o", "array", "--numerics", "f32")
    assert r.returncode == 0, r.stderr
    return np.array(json.loads(r.stdout))


def test_embed_takes_the_speed_flags_and_keeps_the_vectors():
    texts = reference()["texts"]
    plain = embed_array(TINY_BERT, *texts)
    # -ub 16 caps an encoder's batches (13 + 9 tokens no longer fit one): each text decodes alone
    flags = embed_array(TINY_BERT, *texts, "-t", "1", "-tb", "1", "-ub", "16", "-np", "2", "--attn", "dense",
                        "--attn-impl", "auto", "-fa", "off", "-ngl", "99", "-dev", "none", "-sm", "none", "-mg", "0",
                        "--no-mmap")
    np.testing.assert_allclose(flags, plain, atol=1e-5, rtol=0)


def test_embed_honours_micro_batches_of_a_causal_model():
    texts = ["hello", "there world"]
    plain = embed_array(TINY_GEMMA3, *texts, "--pooling", "last")
    split = embed_array(TINY_GEMMA3, *texts, "--pooling", "last", "-ub", "2", "-np", "1", "--swa-full")
    np.testing.assert_allclose(split, plain, atol=1e-4, rtol=0)


@pytest.mark.parametrize("args,fragment", [
    (["--sparse-topk", "64"], "--sparse-topk selects cached keys; bert is an encoder and keeps no memory"),
    (["-ub", "8"], "has 13 tokens, more than the batch of 8"),
    (["-fa", "off", "--attn", "sparse"], "contradicts --attn sparse"),
    (["-t", "-1"], "-t and -tb take a thread count"),
    (["--numerics", "f64"], "unknown --numerics 'f64'"),
])
def test_embed_refuses_flags_that_cannot_apply(args, fragment):
    r = llm("embed", "-m", str(TINY_BERT), reference()["texts"][0], *args)
    assert_one_line_error(r, fragment)
    assert r.stdout == ""
