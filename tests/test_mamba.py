"""Mamba and Mamba-2 on tiny random-weight models: llama.cpp's outputs, and the recurrent memory
behind the memory protocol (ubatches, several sequences, rollback, sequence edits, state files)."""

from functools import lru_cache

import numpy as np
import pytest

from conftest import TINY_SSM, load_fixture, tiny_gemma3, tiny_ssm
from gguf_mutants import mutant_file, renamed
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError, ModelFileError
from llmsuite.core.models import load_model
from llmsuite.core.statefile import StateFileError

ARCHS = ["mamba", "mamba2"]
FIXTURE = {"mamba": "tiny/tiny-mamba.json", "mamba2": "tiny/tiny-mamba2.json"}


@lru_cache(maxsize=None)
def reference(arch):
    return load_fixture(FIXTURE[arch])


def decode(arch, tokens, observer=None, **params) -> tuple[np.ndarray, Context]:
    """Logits of every position of `tokens` (sequence 0), one batch split into -ub micro-batches."""
    ctx = Context(tiny_ssm(arch), ContextParams(**{"n_ctx": 2048, **params}), observer=observer)
    assert ctx.decode(Batch.from_tokens(tokens, all_outputs=True)) == DecodeStatus.OK, ctx.last_error
    return ctx.logits.copy(), ctx


def top10_diffs(arch, logits) -> tuple[np.ndarray, list[int]]:
    """|Δ| at llama.cpp's top-10 ids per position, and the positions whose top-1 differs although
    llama.cpp's top-2 margin is at least 1e-2."""
    diffs, flips = [], []
    for pos, top in enumerate(reference(arch)["top"]):
        ids, values = [t[0] for t in top], np.array([t[1] for t in top])
        diffs.append(np.abs(logits[pos, ids] - values))
        if int(np.argmax(logits[pos])) != ids[0] and values[0] - values[1] >= 1e-2:
            flips.append(pos)
    return np.array(diffs), flips


def state_bytes(ctx) -> bytes:
    return ctx.state_bytes()


def test_hparams_are_typed_from_the_gguf():
    hp = tiny_ssm("mamba2").hparams
    assert (hp.d_conv, hp.d_inner, hp.d_state, hp.dt_rank, hp.n_group) == (4, 128, 16, 4, 2)
    spec = tiny_ssm("mamba2").memory_spec().layers[0]
    assert spec.conv_shape == (3, 192) and spec.ssm_shape == (4, 32, 16)
    assert tiny_ssm("mamba").memory_spec().layers[1].ssm_shape == (128, 1, 16)


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_llama_cpp_with_ggml_numerics(arch):
    """With the matmul activations rounded as ggml-cpu rounds them (F16 rows for the F16 weights,
    q8_0 blocks for the Q8_0/Q4_0 ssm_out of layer 1) the logits are llama.cpp's to a few 1e-3:
    what is left is float summation order, amplified where a q8_0 rounding flips."""
    ref = reference(arch)
    seen = {}
    logits, _ = decode(arch, ref["ids"], observer=lambda name, ub, x: seen.setdefault(name, []).append(x),
                       numerics="ggml")
    diffs, flips = top10_diffs(arch, logits)
    assert not flips and diffs.max() < 0.01, (flips, diffs.max())
    assert np.abs(logits[-1] - ref["last_logits"]).max() < 1e-3
    for name, values in ref["debug"]["hidden"].items():
        expected = np.array(values)
        assert np.abs(np.concatenate(seen[name]) - expected).max() / np.abs(expected).max() < 5e-3, name


@pytest.mark.float_reference
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_numerics_differ_by_the_activation_rounding_only(arch):
    """In float32 throughout, the difference is llama.cpp's rounding of the activations (about 0.5 %
    relative per quantized matmul, point 2 of the fixture's README): 0.026 at most on logits of
    std 1, ten times what is left once that rounding is emulated (test above)."""
    ref = reference(arch)
    diffs, _ = top10_diffs(arch, decode(arch, ref["ids"])[0])
    emulated, _ = top10_diffs(arch, decode(arch, ref["ids"], numerics="ggml")[0])
    assert diffs.max() < 0.05 and emulated.max() < diffs.max() / 3


@pytest.mark.float_reference
@pytest.mark.parametrize("arch", ARCHS)
def test_ubatch_size_does_not_change_logits(arch):
    ids = reference(arch)["ids"]
    one_pass, _ = decode(arch, ids, n_ubatch=96)
    split, _ = decode(arch, ids, n_ubatch=16)
    np.testing.assert_allclose(split, one_pass, atol=1e-5, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("arch", ARCHS)
def test_a_sequence_alone_equals_it_in_a_batch_of_three(arch):
    ids = reference(arch)["ids"]
    alone, _ = decode(arch, ids[:40])
    seqs = [ids[:40], ids[40:70], ids[10:90]]  # unequal lengths: several equal-split ubatches
    batch = Batch(np.concatenate(seqs).astype(np.int32), seq_id=np.repeat([0, 1, 2], [len(s) for s in seqs]),
                  output=np.ones(150, bool))
    ctx = Context(tiny_ssm(arch), ContextParams(n_ctx=2048, n_seq_max=3, n_ubatch=32))
    assert ctx.decode(batch) == DecodeStatus.OK
    np.testing.assert_allclose(ctx.logits[:40], alone, atol=1e-5, rtol=0)
    assert [ctx.memory.seq_pos_max(s) for s in range(3)] == [39, 29, 79]


@pytest.mark.parametrize("arch", ARCHS)
def test_save_load_continue_equals_an_uninterrupted_run(arch):
    """The same batches with and without a save and load between them, bit for bit (one 96-token
    pass instead takes other kernels, whose ggml roundings differ on an AMD EPYC)."""
    ids = reference(arch)["ids"]
    _, first = decode(arch, ids[:50])
    saved = first.state_bytes(ids[:50])
    assert first.decode(Batch.from_tokens(ids[50:], all_outputs=True)) == DecodeStatus.OK
    ctx = Context(tiny_ssm(arch), ContextParams(n_ctx=2048))
    assert ctx.load_state_bytes(saved) == ids[:50]
    assert ctx.decode(Batch.from_tokens(ids[50:], all_outputs=True)) == DecodeStatus.OK
    np.testing.assert_array_equal(ctx.logits, first.logits)


def test_a_sequence_state_moves_between_cells():
    ids = reference("mamba")["ids"]
    _, ctx = decode("mamba", ids[:30], n_seq_max=2)
    data = ctx.state_bytes(ids[:30], seq=0)
    ctx.load_state_bytes(data, seq=1)
    batch = Batch(np.array(ids[30:34] * 2, np.int32), pos=np.tile(np.arange(30, 34, dtype=np.int32), 2),
                  seq_id=np.repeat([0, 1], 4), output=np.ones(8, bool))
    assert ctx.decode(batch) == DecodeStatus.OK
    np.testing.assert_array_equal(ctx.logits[:4], ctx.logits[4:])


def test_partial_removal_is_refused_whole_removal_works():
    _, ctx = decode("mamba", reference("mamba")["ids"][:20], n_seq_max=2)
    before = state_bytes(ctx)
    assert not ctx.memory.seq_rm(0, 10, -1)
    assert "removed whole" in ctx.memory.refusal and "10..end" in ctx.memory.refusal
    assert not ctx.memory.seq_rm(0, 19, -1)  # llama.cpp would clear the whole state here
    assert not ctx.memory.seq_rm(-1, 0, 5)
    assert state_bytes(ctx) == before
    assert ctx.memory.seq_rm(0, 25, -1) and state_bytes(ctx) == before  # past the end: nothing to remove
    assert ctx.memory.seq_rm(0, -1, -1) and ctx.memory.seq_pos_max(0) == -1
    assert not any(a.any() for a in ctx.memory.ssm.values())


def test_copy_keep_and_position_moves():
    _, ctx = decode("mamba2", reference("mamba2")["ids"][:12], n_seq_max=3)
    mem = ctx.memory
    mem.seq_cp(0, 2)
    assert mem.seq_pos_max(2) == 11 and all(np.array_equal(a[0], a[2]) for a in mem.ssm.values())
    mem.seq_add(2, 0, -1, 5)
    assert mem.seq_pos_max(2) == 16 and mem.seq_pos_min(2) == 16
    mem.seq_div(2, 0, -1, 2)
    assert mem.seq_pos_max(2) == 8
    mem.seq_keep(2)
    assert mem.seq_pos_max(0) == -1 and not any(a[0].any() for a in mem.conv.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_a_failed_ubatch_leaves_every_cell_as_before(arch, monkeypatch):
    ids = reference(arch)["ids"]
    _, ctx = decode(arch, ids[:20], n_ubatch=8)
    before = state_bytes(ctx)
    model = ctx.model
    calls = []

    def failing(g):
        calls.append(1)
        type(model).forward(model, g)  # writes the states, then fails
        raise MemoryError("out of memory")

    monkeypatch.setattr(model, "forward", failing)
    assert ctx.decode(Batch.from_tokens(ids[20:28])) == DecodeStatus.COMPUTE_FAILED and calls
    assert state_bytes(ctx) == before


@pytest.mark.float_reference
@pytest.mark.parametrize("arch", ARCHS)
def test_the_no_kv_oracle_agrees(arch):
    ids = reference(arch)["ids"][:24]
    cached, _ = decode(arch, ids, n_ubatch=5)
    ctx = Context(tiny_ssm(arch), ContextParams(n_ctx=64, kv="none", ctx="no-kv", n_ubatch=5))
    for i, tok in enumerate(ids):
        assert ctx.decode(Batch.from_tokens([tok])) == DecodeStatus.OK
        np.testing.assert_allclose(ctx.get_logits(), cached[i], atol=1e-5, rtol=0)


@pytest.mark.parametrize("params, message", [
    (dict(kv="unified"), "--kv unified caches attention keys and values; mamba has recurrent layers"),
    (dict(kv="iswa"), "--kv iswa caches attention keys and values"),
    (dict(type_k="q8_0", cache_types_given=True), "mamba's recurrent states are float32"),
])
def test_flags_that_cannot_apply_to_mamba_are_refused(params, message):
    with pytest.raises(InvalidInputError, match=message):
        Context(tiny_ssm("mamba"), ContextParams(n_ctx=64, **params))


def test_recurrent_memory_on_an_attention_model_is_refused():
    with pytest.raises(InvalidInputError, match="--kv recurrent holds recurrent states; gemma3 has attention layers"):
        Context(tiny_gemma3(), ContextParams(n_ctx=64, kv="recurrent"))


def test_state_files_do_not_cross_memory_kinds():
    ids = reference("mamba")["ids"][:8]
    _, mamba = decode("mamba", ids)
    kv = Context(tiny_gemma3(), ContextParams(n_ctx=64))
    assert kv.decode(Batch.from_tokens(ids)) == DecodeStatus.OK
    other_kind = Context(tiny_ssm("mamba"), ContextParams(n_ctx=64, kv="none", ctx="no-kv"))
    before = state_bytes(mamba)
    with pytest.raises(StateFileError, match="saved from another model"):
        mamba.load_state_bytes(kv.state_bytes(ids))
    with pytest.raises(StateFileError, match="memory kind"):
        mamba.load_state_bytes(other_kind.state_bytes())
    with pytest.raises(StateFileError, match="memory kind"):
        other_kind.load_state_bytes(mamba.state_bytes(ids))
    with pytest.raises(StateFileError, match="cell count"):
        Context(tiny_ssm("mamba"), ContextParams(n_ctx=64, n_seq_max=2)).load_state_bytes(mamba.state_bytes(ids))
    assert state_bytes(mamba) == before


@pytest.mark.parametrize("arch, edit, message", [
    ("mamba", lambda img: renamed(img, "blk.1.ssm_x.weight"), "'blk.1.ssm_x.weight'"),
    ("mamba2", lambda img: renamed(img, "blk.0.ssm_norm.weight"), "'blk.0.ssm_norm.weight'"),
    ("mamba", lambda img: img.drop("mamba.ssm.state_size"), "mamba.ssm.state_size"),
    ("mamba", lambda img: img.set("mamba.ssm.conv_kernel", 4, 0), "mamba.ssm.conv_kernel"),
    ("mamba2", lambda img: img.set("mamba2.ssm.state_size", 4, 0), "mamba2.ssm.state_size"),
    ("mamba2", lambda img: img.set("mamba2.ssm.group_count", 4, 3), "do not divide each other"),
])
def test_a_broken_ssm_gguf_is_one_clear_error(tmp_path, arch, edit, message):
    with pytest.raises(ModelFileError, match=message) as err:
        load_model(mutant_file(TINY_SSM[arch], tmp_path, edit))
    assert "\n" not in str(err.value)


def test_parallel_completions_each_equal_one_alone():
    from llmsuite.core.generation import generate
    from llmsuite.core.sampling import Sampler, SamplerParams

    prompt = reference("mamba2")["ids"][:20]
    alone = generate(Context(tiny_ssm("mamba2"), ContextParams(n_ctx=128)), Sampler(SamplerParams(seed=7)), prompt,
                     n_predict=8)[0].tokens
    ctx = Context(tiny_ssm("mamba2"), ContextParams(n_ctx=128, n_seq_max=3))
    results = generate(ctx, [Sampler(SamplerParams(seed=s)) for s in (7, 7, 8)], prompt, n_predict=8)
    assert results[0].tokens == alone and results[1].tokens == alone and len(results[2].tokens) == 8


def test_prompt_cache_reuses_a_prefix_and_recomputes_a_full_match(tmp_path):
    from llmsuite.core.generation import generate
    from llmsuite.core.sampling import Sampler, SamplerParams

    ids, cache = reference("mamba")["ids"], tmp_path / "prompt.state"
    greedy = lambda: Sampler(SamplerParams(temp=0.0))  # noqa: E731
    fresh = generate(Context(tiny_ssm("mamba"), ContextParams(n_ctx=128)), greedy(), ids[:30], n_predict=4)[0]
    generate(Context(tiny_ssm("mamba"), ContextParams(n_ctx=128)), greedy(), ids[:20], n_predict=1, prompt_cache=cache)
    longer = Context(tiny_ssm("mamba"), ContextParams(n_ctx=128))
    assert generate(longer, greedy(), ids[:30], n_predict=4, prompt_cache=cache)[0].tokens == fresh.tokens
    assert longer.perf.n_p_eval == 10  # the saved 20 tokens were reused: its state is a whole prefix
    same = Context(tiny_ssm("mamba"), ContextParams(n_ctx=128))
    assert generate(same, greedy(), ids[:30], n_predict=4, prompt_cache=cache)[0].tokens == fresh.tokens
    assert same.perf.n_p_eval == 30  # the last token's logits need it decoded again: the state cannot step back


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("numerics", ["f32", "ggml"])
def test_perplexity_and_kl_divergence(arch, numerics, tmp_path):
    """llama-perplexity -c 128 --chunks 6 on hamlet.md, within 0.1 % (measured: f32 0.02 % / 0.006 %,
    ggml 0.00004 % / 0.0008 %); then the KL-divergence of the model against its own base."""
    from conftest import FIXTURES
    from llmsuite.core.perplexity import kl_divergence, perplexity, plan_chunks, read_kl_base

    text = (FIXTURES / "hamlet.md").read_text()
    model = tiny_ssm(arch)
    tokens = model.vocab.tokenize(text[:-1] if text.endswith("\n") else text, add_special=True)
    plan = plan_chunks(len(tokens), 128, 2048, 6)
    ctx = Context(model, ContextParams(n_ctx=plan.n_seq * 128, n_batch=plan.n_batch, n_seq_max=plan.n_seq,
                                       numerics=numerics))
    with open(tmp_path / "base.kld", "wb") as f:
        result = perplexity(ctx, tokens, plan, kl_base=f)
    expected = load_fixture("tiny/perplexity-hamlet.json")["final"][f"tiny-{arch}"]
    assert plan.n_seq > 1 and abs(result.ppl / expected - 1) < 1e-3, (result.ppl, expected)
    same = kl_divergence(ctx, read_kl_base(tmp_path / "base.kld"), plan)
    assert same.n_same_top == same.count and abs(same.sum_kld / same.count) < 0.5 * 16 / 65535


def test_bench_refuses_a_cache_type_for_recurrent_states_but_not_the_default():
    from llmsuite.core.bench import Instance, parse_spec

    path = str(TINY_SSM["mamba"])
    Context(tiny_ssm("mamba"), Instance(path, parse_spec("tg4")).context_params())
    with pytest.raises(InvalidInputError, match="recurrent states are float32"):
        Context(tiny_ssm("mamba"), Instance(path, parse_spec("tg4"), type_k="q8_0").context_params())
