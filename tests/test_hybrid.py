"""Hybrid models (Granite 4.0-H's `granitehybrid`, `lfm2`) on tiny random-weight models: llama.cpp's
outputs, and the hybrid memory (an attention cache and recurrent states side by side) behind the
memory protocol: ubatches, several sequences, rollback, sequence edits, shifts and state files."""

from functools import lru_cache

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from conftest import FIXTURES, load_fixture, tiny_model
from gguf_mutants import mutant_file, renamed
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError, ModelFileError, UnsupportedError
from llmsuite.core.models import load_model
from llmsuite.core.statefile import StateFileError

ARCHS = ["granite-hybrid", "lfm2"]
OK = DecodeStatus.OK


def path(name):
    return FIXTURES / "tiny" / f"tiny-{name}.gguf"


def model(name):
    return tiny_model(path(name))


@lru_cache(maxsize=None)
def reference(name):
    return load_fixture(f"tiny/tiny-{name}.json")


def decode(name, tokens, observer=None, **params) -> tuple[np.ndarray, Context]:
    """Logits of every position of `tokens` (sequence 0), one batch split into -ub micro-batches."""
    ctx = Context(model(name), ContextParams(**{"n_ctx": 2048, **params}), observer=observer)
    assert ctx.decode(Batch.from_tokens(tokens, all_outputs=True)) == OK, ctx.last_error
    return ctx.logits.copy(), ctx


def step(ctx, token, pos, seq=0) -> np.ndarray:
    assert ctx.decode(Batch(np.array([token], np.int32), pos=np.array([pos], np.int32),
                            seq_id=np.array([seq], np.int32), output=np.ones(1, bool))) == OK, ctx.last_error
    return ctx.get_logits().copy()


# ---- the models -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, conv, ssm", [("granite-hybrid", (3, 192), (8, 16, 16)), ("lfm2", (2, 64), (0,))])
def test_layer_kinds_come_from_the_per_layer_head_count_kv(name, conv, ssm):
    """[0, 0, 2, 0, 0, 2]: layers 2 and 5 attend, the others are recurrent (LFM2's short
    convolution keeps a conv state and no SSM state: a recurrent spec like any other)."""
    m = model(name)
    assert m.hparams.recurrent_layers == {0, 1, 3, 4} and m.hparams.n_head_kv == 2
    spec = m.memory_spec()
    assert sorted(spec.of(type(spec.layers[2]))) == [2, 5]
    recurrent = spec.layers[0]
    assert recurrent.conv_shape == conv and recurrent.ssm_shape == ssm


@pytest.mark.parametrize("name", ARCHS)
def test_matches_llama_cpp(name):
    """ggml numerics (the default), one ubatch of 96 tokens: at llama.cpp's top-10 ids within 0.01
    (the tolerance of the other tiny decoders; llama.cpp's own ubatch 16 and FA-off runs differ
    from its main run by up to 0.0073 here), the same top-1 wherever llama.cpp's top-2 margin is at
    least 0.05, and every layer's output within 5e-3 of its largest value."""
    ref, seen = reference(name), {}
    logits, ctx = decode(name, ref["ids"], observer=lambda t, ub, x: seen.setdefault(t, []).append(np.array(x)))
    assert ctx.memory.kind == "hybrid" and [c.kind for c in ctx.memory.children] == ["unified", "recurrent"]
    for pos, top in enumerate(ref["top"]):
        ids, values = [t[0] for t in top], np.array([t[1] for t in top])
        assert np.abs(logits[pos, ids] - values).max() < 0.01, pos
        if values[0] - values[1] >= 0.05:
            assert int(np.argmax(logits[pos])) == ids[0], pos
    assert np.abs(logits[-1] - ref["last_logits"]).max() < 0.01
    for tensor, values in ref["debug"]["hidden"].items():
        expected = np.array(values)
        assert np.abs(np.concatenate(seen[tensor]) - expected).max() / np.abs(expected).max() < 5e-3, tensor


@pytest.mark.parametrize("name", ARCHS)
def test_memory_size_is_llama_cpps(name):
    """llama.cpp: a 0.50 MiB f16 KV cache (2048 cells, 2 layers) plus float32 states for 4 layers."""
    ctx = Context(model(name), ContextParams(n_ctx=2048))
    attention, recurrent = ctx.memory.children
    assert attention.nbytes == 2048 * 2 * 2 * 32 * 2
    spec = ctx.memory.layers[0]
    assert recurrent.nbytes == 4 * 4 * (np.prod(spec.conv_shape) + np.prod(spec.ssm_shape))
    assert ctx.memory.nbytes == attention.nbytes + recurrent.nbytes


# ---- the hybrid memory ----------------------------------------------------------------------------

@pytest.mark.float_reference
@pytest.mark.parametrize("name", ARCHS)
def test_ubatch_size_does_not_change_logits(name):
    ids = reference(name)["ids"]
    one_pass, _ = decode(name, ids, n_ubatch=96)
    split, _ = decode(name, ids, n_ubatch=16)
    # float order only: 1e-5 of the logits' scale (an AMD EPYC's kernels differ by 1.2e-5 absolute where
    # the largest logits are near 5; an Intel Xeon's stayed under 1e-5)
    assert np.abs(split - one_pass).max() <= 1e-5 * np.abs(one_pass).max()


@pytest.mark.float_reference
@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("kv", ["unified", "split"])
def test_a_sequence_alone_equals_it_in_a_batch_of_three(name, kv):
    ids = reference(name)["ids"]
    alone, _ = decode(name, ids[:40])
    seqs = [ids[:40], ids[40:70], ids[10:90]]  # unequal lengths: several equal-split ubatches
    batch = Batch(np.concatenate(seqs).astype(np.int32), seq_id=np.repeat([0, 1, 2], [len(s) for s in seqs]),
                  output=np.ones(150, bool))
    ctx = Context(model(name), ContextParams(n_ctx=2048 * 3 if kv == "split" else 2048, n_seq_max=3, n_ubatch=32,
                                             kv=kv))
    assert ctx.memory.attention.kind == kv
    assert ctx.decode(batch) == OK, ctx.last_error
    np.testing.assert_allclose(ctx.logits[:40], alone, atol=1e-5, rtol=0)
    assert [ctx.memory.seq_pos_max(s) for s in range(3)] == [39, 29, 79]


@pytest.mark.parametrize("name", ARCHS)
def test_save_load_continue_equals_an_uninterrupted_run(name):
    """The same batches with and without a save and load between them (one 96-token pass instead
    would take other kernels: under ggml numerics their roundings differ by up to 6e-3 on an AMD EPYC)."""
    ids = reference(name)["ids"]
    _, first = decode(name, ids[:50])
    data = first.state_bytes(ids[:50])
    assert first.decode(Batch.from_tokens(ids[50:], pos0=50, all_outputs=True)) == OK
    ctx = Context(model(name), ContextParams(n_ctx=2048))
    assert ctx.load_state_bytes(data) == ids[:50]
    assert ctx.decode(Batch.from_tokens(ids[50:], pos0=50, all_outputs=True)) == OK
    np.testing.assert_allclose(ctx.logits, first.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ARCHS)
def test_a_sequence_state_moves_between_sequences(name):
    ids = reference(name)["ids"]
    _, ctx = decode(name, ids[:30], n_seq_max=2)
    ctx.load_state_bytes(ctx.state_bytes(ids[:30], seq=0), seq=1)
    assert ctx.memory.seq_pos_max(1) == 29
    np.testing.assert_array_equal(step(ctx, ids[30], 30, seq=1), step(ctx, ids[30], 30, seq=0))


@pytest.mark.parametrize("name", ARCHS)
def test_a_failed_ubatch_leaves_both_parts_as_before(name, monkeypatch):
    ids = reference(name)["ids"]
    _, ctx = decode(name, ids[:20], n_ubatch=8)
    before = ctx.state_bytes()
    m = ctx.model

    def failing(g):
        type(m).forward(m, g)  # writes keys, values and states, then fails
        raise MemoryError("out of memory")

    monkeypatch.setattr(m, "forward", failing)
    assert ctx.decode(Batch.from_tokens(ids[20:28], pos0=20)) == DecodeStatus.COMPUTE_FAILED
    assert ctx.state_bytes() == before


def test_partial_removal_is_refused_by_the_recurrent_part_and_changes_nothing():
    _, ctx = decode("lfm2", reference("lfm2")["ids"][:20], n_seq_max=2)
    mem, before = ctx.memory, ctx.state_bytes()
    assert not mem.seq_rm(0, 10, -1)
    assert "removed whole" in mem.refusal and "10..end" in mem.refusal
    assert not mem.seq_rm(-1, 0, 5)
    assert ctx.state_bytes() == before and mem.attention.seq_pos_max(0) == 19
    assert mem.seq_rm(0, 25, -1) and ctx.state_bytes() == before  # past the end: nothing to remove
    assert mem.seq_rm(0, -1, -1)
    assert mem.seq_pos_max(0) == -1 and mem.attention.seq_pos_max(0) == -1 and mem.recurrent.seq_pos_max(0) == -1


def test_copy_keep_and_positions_reach_both_parts():
    _, ctx = decode("granite-hybrid", reference("granite-hybrid")["ids"][:12], n_seq_max=3)
    mem = ctx.memory
    mem.seq_cp(0, 2)
    assert mem.attention.seq_pos_max(2) == mem.recurrent.seq_pos_max(2) == 11
    assert mem.seq_pos_min(2) == 11  # the later of the parts' first positions: a state is only its last
    assert mem.attention.seq_pos_min(2) == 0
    mem.seq_add(2, 0, -1, 5)
    assert (mem.attention.seq_pos_max(2), mem.recurrent.seq_pos_max(2)) == (16, 16)
    mem.seq_div(2, 0, -1, 2)
    assert (mem.attention.seq_pos_max(2), mem.recurrent.seq_pos_max(2)) == (8, 8)
    mem.seq_keep(2)
    assert mem.seq_pos_max(0) == -1 and mem.attention.seq_pos_max(0) == -1 and mem.recurrent.seq_pos_max(0) == -1


@pytest.mark.float_reference
@pytest.mark.parametrize("name", ARCHS)
def test_a_position_shift_moves_both_parts(name):
    """seq_add moves a whole sequence: the attention part re-rotates its keys (RoPE composes), the
    recurrent states only record where they are. Continuing then equals a fresh decode at the
    shifted positions."""
    ids = reference(name)["ids"]
    _, shifted = decode(name, ids[:30])
    shifted.memory.seq_add(0, -1, -1, 7)
    assert shifted.memory.seq_pos_max(0) == 36
    fresh = Context(model(name), ContextParams(n_ctx=2048))
    assert fresh.decode(Batch.from_tokens(ids[:30], pos0=7)) == OK
    np.testing.assert_allclose(step(shifted, ids[30], 37), step(fresh, ids[30], 37), atol=1e-5, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("name", ARCHS)
def test_the_no_kv_oracle_agrees(name):
    """The oracle recomputes each history in one larger pass (other float sums): 3e-5 on std-1 logits."""
    ids = reference(name)["ids"][:24]
    cached, _ = decode(name, ids, n_ubatch=5)
    ctx = Context(model(name), ContextParams(n_ctx=64, kv="none", ctx="no-kv", n_ubatch=5))
    for i, tok in enumerate(ids):
        assert ctx.decode(Batch.from_tokens([tok], pos0=i)) == OK
        np.testing.assert_allclose(ctx.get_logits(), cached[i], atol=3e-5, rtol=0)


def test_a_quantized_cache_types_the_attention_part_only():
    ctx = Context(model("lfm2"), ContextParams(n_ctx=256, type_k="q8_0", type_v="q8_0", cache_types_given=True))
    assert ctx.memory.attention.type_k == "q8_0"
    assert all(a.dtype == np.float32 for a in ctx.memory.recurrent.conv.values())


# ---- state files ----------------------------------------------------------------------------------

def saved(name, **params):
    ids = reference(name)["ids"][:20]
    _, ctx = decode(name, ids, n_seq_max=2, n_ctx=64, **params)
    return ctx, ctx.state_bytes(ids)


def test_a_state_of_another_attention_part_is_refused():
    _, data = saved("lfm2")
    target = Context(model("lfm2"), ContextParams(n_ctx=128, n_seq_max=2, kv="split"))
    with pytest.raises(StateFileError, match="memory kind of a part"):
        target.load_state_bytes(data)
    mamba_like = Context(model("lfm2"), ContextParams(n_ctx=64, n_seq_max=2, kv="none", ctx="no-kv"))
    with pytest.raises(StateFileError, match="memory kind"):
        mamba_like.load_state_bytes(data)


def test_truncated_flipped_and_inconsistent_state_files_change_nothing():
    ctx, data = saved("granite-hybrid")
    before = ctx.state_bytes()
    rng = np.random.default_rng(3)
    for cut in sorted(set(rng.integers(0, len(data), 40).tolist()) | {len(data) - 1}):
        with pytest.raises(StateFileError):
            ctx.load_state_bytes(data[:cut])
    for at in rng.integers(0, len(data), 40).tolist():
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        with pytest.raises(StateFileError):
            ctx.load_state_bytes(bytes(flipped))
    assert ctx.state_bytes() == before
    # the parts must agree where each sequence ends: a state of 20 tokens, its recurrent part from 21
    longer = decode("granite-hybrid", reference("granite-hybrid")["ids"][:21], n_seq_max=2, n_ctx=64)[1]
    attention_part = ctx.state_bytes()
    recurrent_part = longer.state_bytes()
    split_at = _part_offset(attention_part, "recurrent")
    mixed = attention_part[:split_at] + recurrent_part[_part_offset(recurrent_part, "recurrent"):-4]
    with pytest.raises(StateFileError, match="unified and recurrent parts end at different positions"):
        ctx.load_state_bytes(_resealed(mixed))
    assert ctx.state_bytes() == before


def _part_offset(data: bytes, kind: str) -> int:
    """Where the part tagged `kind` starts (its length-prefixed tag)."""
    tag = kind.encode()
    return data.index(len(tag).to_bytes(4, "little") + tag)


def _resealed(body: bytes) -> bytes:
    import struct
    import zlib
    return body + struct.pack("<I", zlib.crc32(body))


# ---- flags and files it refuses -------------------------------------------------------------------

@pytest.mark.parametrize("params, message", [
    (dict(kv="recurrent"), "--kv recurrent holds recurrent states; lfm2 has attention layers \\(use --kv hybrid\\)"),
    (dict(kv="mla"), "--kv mla caches the latent of multi-head latent attention"),
    (dict(kv="iswa"), "--kv iswa needs sliding-window layers; lfm2 has none"),
    (dict(kv="none", type_k="q8_0", cache_types_given=True), "lfm2's recurrent states are float32"),
    (dict(swa_full=True), "--swa-full applies to sliding-window models; lfm2 has none"),
])
def test_flags_that_cannot_apply_to_a_hybrid_are_refused(params, message):
    with pytest.raises(InvalidInputError, match=message):
        Context(model("lfm2"), ContextParams(n_ctx=64, **params))


def test_hybrid_memory_on_other_models_is_refused():
    from conftest import tiny_gemma3
    with pytest.raises(InvalidInputError, match="--kv hybrid pairs an attention cache with recurrent states; "
                                                "gemma3 has attention layers only"):
        Context(tiny_gemma3(), ContextParams(n_ctx=64, kv="hybrid"))


def test_context_shift_is_refused_before_any_output():
    from llmsuite.core.generation import check_context_shift
    ctx = Context(model("granite-hybrid"), ContextParams(n_ctx=64))
    with pytest.raises(InvalidInputError, match=r"--kv hybrid cannot: its recurrent layers \(0, 1, 3, 4\) hold states"):
        check_context_shift(ctx, 1)


def test_a_context_too_large_is_refused_before_allocation(monkeypatch):
    from llmsuite.core.memory import factory
    monkeypatch.setattr(factory, "available_memory", lambda xp: 1 << 20)
    with pytest.raises(InvalidInputError, match="a context of 8192 cells"):
        Context(model("lfm2"), ContextParams(n_ctx=8192))


def _kv_array(values):
    return lambda img: img.set(f"{img.arch()}.attention.head_count_kv", VT.ARRAY, (VT.INT32, np.array(values)))


@pytest.mark.parametrize("name, edit, message", [
    ("lfm2", _kv_array([0, 0, 2, 0, 0]), "head_count_kv has 5 values but block_count is 6"),
    ("granite-hybrid", _kv_array([0, 0, 2, 0, 0, 2, 0]), "head_count_kv has 7 values but block_count is 6"),
    ("lfm2", _kv_array([0, 0, 0, 0, 0, 0]), "makes every layer recurrent"),
    ("lfm2", lambda img: renamed(img, "blk.3.shortconv.conv.weight"),
     r"'blk.3.shortconv.conv.weight' is missing \(layer 3 is recurrent \(head_count_kv 0\)\)"),
    ("granite-hybrid", lambda img: renamed(img, "blk.1.ssm_conv1d.weight"),
     r"'blk.1.ssm_conv1d.weight' is missing \(layer 1 is recurrent"),
    ("granite-hybrid", lambda img: renamed(img, "blk.4.ssm_a"), r"'blk.4.ssm_a' is missing \(layer 4 is recurrent"),
    ("granite-hybrid", lambda img: renamed(img, "blk.5.attn_q.weight"),
     r"'blk.5.attn_q.weight' is missing \(layer 5 is an attention layer\)"),
    ("lfm2", lambda img: renamed(img, "blk.2.attn_v.weight"), r"'blk.2.attn_v.weight' is missing \(layer 2 is an attention"),
    ("lfm2", _kv_array([0, 0, 2, 0, 0, 4]), "runs hybrids whose attention layers share one count"),
    ("granite-hybrid", lambda img: img.set("granitehybrid.expert_count", VT.UINT32, 8),
     "granitehybrid with a mixture of experts \\(8 experts\\) is not supported yet"),
])
def test_a_broken_hybrid_gguf_is_one_clear_sentence(tmp_path, name, edit, message):
    with pytest.raises((ModelFileError, UnsupportedError), match=message) as err:
        load_model(mutant_file(path(name), tmp_path, edit))
    assert "\n" not in str(err.value)


# ---- the tools ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_perplexity_and_kl_divergence(name, tmp_path):
    """llama-perplexity -c 128 --chunks 6 on hamlet.md within 0.5 % (measured: granite 1e-6, lfm2
    9e-5 relative), over several sequences at once; then the KL-divergence against its own base."""
    from llmsuite.core.perplexity import kl_divergence, perplexity, plan_chunks, read_kl_base

    text = (FIXTURES / "hamlet.md").read_text()
    m = model(name)
    tokens = m.vocab.tokenize(text[:-1] if text.endswith("\n") else text, add_special=True)
    plan = plan_chunks(len(tokens), 128, 2048, 6)
    ctx = Context(m, ContextParams(n_ctx=plan.n_seq * 128, n_batch=plan.n_batch, n_seq_max=plan.n_seq))
    with open(tmp_path / "base.kld", "wb") as f:
        result = perplexity(ctx, tokens, plan, kl_base=f)
    expected = load_fixture("tiny/perplexity-hamlet.json")["final"][f"tiny-{name}"]
    assert plan.n_seq > 1 and abs(result.ppl / expected - 1) < 5e-3, (result.ppl, expected)
    same = kl_divergence(ctx, read_kl_base(tmp_path / "base.kld"), plan)
    assert same.n_same_top == same.count and abs(same.sum_kld / same.count) < 0.5 * 16 / 65535


@pytest.mark.parametrize("name", ARCHS)
def test_parallel_completions_each_equal_one_alone(name):
    from llmsuite.core.generation import generate
    from llmsuite.core.sampling import Sampler, SamplerParams

    prompt = reference(name)["ids"][:20]
    alone = generate(Context(model(name), ContextParams(n_ctx=128)), Sampler(SamplerParams(seed=7)), prompt,
                     n_predict=8)[0].tokens
    ctx = Context(model(name), ContextParams(n_ctx=128, n_seq_max=3))
    results = generate(ctx, [Sampler(SamplerParams(seed=s)) for s in (7, 7, 8)], prompt, n_predict=8)
    assert results[0].tokens == alone and results[1].tokens == alone and len(results[2].tokens) == 8


def test_prompt_cache_reuses_a_prefix_and_never_steps_back(tmp_path):
    """A saved hybrid state is reused where the new prompt extends it; where the prompt ends inside
    it, the recurrent part cannot step back and the prompt is decoded anew (as for Mamba)."""
    from llmsuite.core.generation import generate
    from llmsuite.core.sampling import Sampler, SamplerParams

    ids, cache = reference("lfm2")["ids"], tmp_path / "prompt.state"
    greedy = lambda: Sampler(SamplerParams(temp=0.0))  # noqa: E731
    fresh = generate(Context(model("lfm2"), ContextParams(n_ctx=128)), greedy(), ids[:30], n_predict=4)[0]
    generate(Context(model("lfm2"), ContextParams(n_ctx=128)), greedy(), ids[:20], n_predict=1, prompt_cache=cache)
    longer = Context(model("lfm2"), ContextParams(n_ctx=128))
    assert generate(longer, greedy(), ids[:30], n_predict=4, prompt_cache=cache)[0].tokens == fresh.tokens
    assert longer.perf.n_p_eval == 10
    same = Context(model("lfm2"), ContextParams(n_ctx=128))
    assert generate(same, greedy(), ids[:30], n_predict=4, prompt_cache=cache)[0].tokens == fresh.tokens
    assert same.perf.n_p_eval == 30


def llm(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "llmsuite.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_embed_pools_each_text_over_its_tokens():
    """llm embed --pooling mean: each text's vector is the mean of its per-token hidden states."""
    import json

    texts = ["To be, or not to be", "that is the question"]
    pooled = llm("embed", "-m", path("lfm2"), "--pooling", "mean", "--embd-normalize", "-1", "-o", "json", *texts)
    tokens = llm("embed", "-m", path("lfm2"), "--pooling", "none", "--embd-normalize", "-1", "-o", "json", *texts)
    assert pooled.returncode == 0 and tokens.returncode == 0, pooled.stderr + tokens.stderr
    means = [np.array(d["embedding"]) for d in json.loads(pooled.stdout)["data"]]
    rows = np.array([d["embedding"] for d in json.loads(tokens.stdout)["data"]])  # every token, text after text
    counts = [len(model("lfm2").vocab.tokenize(t, add_special=True)) for t in texts]
    assert len(means) == 2 and len(rows) == sum(counts) and min(counts) > 1
    for mean, own in zip(means, np.split(rows, np.cumsum(counts)[:-1])):
        assert np.abs(own.mean(axis=0) - mean).max() < 1e-5


def test_generate_chat_and_refusals_on_the_command_line():
    r = llm("generate", "-m", path("granite-hybrid"), "-p", "To be", "-n", "4", "-np", "2", "--temp", "0")
    assert r.returncode == 0, r.stderr
    r = llm("generate", "-m", path("lfm2"), "--chat", "--chat-template", "chatml", "-p", "hi", "-n", "3", "--temp", "0",
            "-v")
    assert r.returncode == 0 and "memory: hybrid" in r.stderr, r.stderr
    r = llm("generate", "-m", path("lfm2"), "-p", "To be", "-n", "4", "--context-shift")
    assert r.returncode != 0 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "--context-shift drops the middle of a sequence" in r.stderr
    r = llm("generate", "-m", path("lfm2"), "-p", "To be", "-n", "4", "--kv", "recurrent")
    assert r.returncode != 0 and r.stdout == "" and "use --kv hybrid" in r.stderr
