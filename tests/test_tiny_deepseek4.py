"""DeepSeek-V4 (`deepseek4`, --kv dsv4) on the tiny random-weight model, against llama.cpp (fixture
README §5 "tiny-deepseek4": ratios 0/0/4/128, window 32, indexer top-k 8, hash routing in layer 0,
160 positions so that the ratio-128 layer sees its first compressed row at 127), and against itself.

llama.cpp caches f16 rows and rounds matmul activations (§4), so the comparisons with it run as it
does (--numerics ggml, f16 cache). Its indexer keeps 8 of the visible compressed rows of layer 2 and
flips a choice where the 8th and 9th scores are within ~4e-3 (§4: its own -ub 16 run flips 37, 107,
125 and 155): those positions are excused by llama.cpp's own gaps, named below."""

import json

import numpy as np
import pytest

from conftest import decode_observed, tiny_model, tiny_path, tiny_reference
from gguf import GGUFValueType as VT
from gguf_mutants import mutant_file, renamed
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError, ModelFileError, UnsupportedError
from llmsuite.core.models import load_model
from llmsuite.core.models.deepseek4 import DeepSeek4

AS_LLAMA_CPP = dict(numerics="ggml", type_k="f16", type_v="f16")
F32 = dict(type_k="f32", type_v="f32")
MARGIN = 5e-2  # top-1 must agree where llama.cpp's best two logits are this far apart
FRAGILE = 4e-3  # an indexer choice this close to its boundary may fall either way (llama.cpp's own runs flip there)
CSA_LAYER = 2


def ids() -> list[int]:
    return tiny_reference("deepseek4")["ids"]


def fragile_positions() -> set[int]:
    """Where llama.cpp's own top-8 of layer 2 is within FRAGILE of its boundary (15 of 160)."""
    gaps = tiny_reference("deepseek4")["debug"]["dsa"][str(CSA_LAYER)]["boundary_gap_per_position"]
    return {p for p, gap in enumerate(gaps) if gap is not None and gap < FRAGILE}


def selections(seen: dict) -> list[list[int]]:
    """The compressed rows of layer 2 each position kept: the mask's last columns, one per row the
    ubatch's last position sees (the window's cells come first)."""
    masks = seen[f"dsa_mask-{CSA_LAYER}"]
    out = []
    for mask in masks if isinstance(masks, list) else [masks]:
        n_rows = (len(out) + len(mask)) // 4
        out += [np.flatnonzero(np.isfinite(row[mask.shape[1] - n_rows:])).tolist() for row in mask]
    return out


def joined(parts: list[tuple[list[int], int, int, bool]]) -> Batch:
    """One batch of (tokens, sequence, first position, all outputs) parts; else the last token outputs."""
    return Batch(np.concatenate([np.asarray(t, np.int32) for t, _, _, _ in parts]),
                 np.concatenate([np.arange(p, p + len(t), dtype=np.int32) for t, _, p, _ in parts]),
                 np.concatenate([np.full(len(t), s, np.int32) for t, s, _, _ in parts]),
                 np.concatenate([np.ones(len(t), bool) if every else np.arange(len(t)) == len(t) - 1
                                 for t, _, _, every in parts]))


def top10_errors(logits: np.ndarray, top) -> np.ndarray:
    return np.array([np.abs(logits[p, [t[0] for t in row]] - np.array([t[1] for t in row])).max()
                     for p, row in enumerate(top)])


def decisive_argmax_agree(logits: np.ndarray, top, skip=frozenset()) -> int:
    decisive = 0
    for pos, row in enumerate(top):
        if pos not in skip and row[0][1] - row[1][1] >= MARGIN:
            assert int(np.argmax(logits[pos])) == row[0][0], pos
            decisive += 1
    return decisive


# measured (AMD EPYC, ggml numerics, f16 cache): top-10 max |Δ| 0.0107 away from the fragile positions
# (0.0102 at 51, 0.0107 at 154, everything else below 0.01: the 0.01 is missed at these two),
# 0.043 at 155 (gap 1.9e-3, the one selection that flips here); last_logits 0.012.
def test_logits_match_llama_cpp():
    ref = tiny_reference("deepseek4")
    logits, seen = decode_observed("deepseek4", ref["ids"], **AS_LLAMA_CPP)
    errors = top10_errors(logits, ref["top"])
    excused = fragile_positions()
    kept = [p for p in range(len(errors)) if p not in excused]
    assert errors[kept].max() <= 0.015
    assert (errors[kept] <= 0.01).sum() >= len(kept) - 3
    assert errors.max() <= 0.1  # a flipped selection moves a position by llama.cpp's own spread (0.077)
    assert decisive_argmax_agree(logits, ref["top"]) >= 100
    assert np.abs(logits[-1] - np.array(ref["last_logits"])).max() <= 0.02


def test_indexer_keeps_llama_cpps_rows():
    """Layer 2's kept compressed rows equal llama.cpp's wherever its gap (8th against 9th score)
    is not fragile; a query that sees at most 8 rows keeps them all (p < 35)."""
    info = tiny_reference("deepseek4")["debug"]["dsa"][str(CSA_LAYER)]
    for n_ubatch in (512, 16):
        _, seen = decode_observed("deepseek4", ids(), n_ubatch=n_ubatch, **AS_LLAMA_CPP)
        got = selections(seen)
        for pos, (rows, gap) in enumerate(zip(info["selected_keys"], info["boundary_gap_per_position"])):
            if gap is None:
                assert got[pos] == list(range((pos + 1) // 4)), pos
            elif gap >= FRAGILE:
                assert got[pos] == rows, (n_ubatch, pos)
            assert len(got[pos]) == min((pos + 1) // 4, 8)


def test_each_layer_matches_llama_cpp_from_its_input(monkeypatch):
    """Every layer run on llama.cpp's own input streams gives its output streams within 2e-3 of
    their largest value (measured 6.0e-4 / 3.0e-4 / 2.5e-4 / 1.5e-3, median 1e-7: f16 roundings
    that fall the other way); chained from the embeddings the four stay within 5e-3 away from the
    flipped selection at 155 (measured 6e-4, 6e-4, 1.4e-3, 3.2e-3: the model's gains amplify them)."""
    ref = tiny_reference("deepseek4")
    hidden = {name: np.array(v, dtype=np.float32) for name, v in ref["debug"]["hidden"].items()}
    chained_logits, chained = decode_observed("deepseek4", ref["ids"], **AS_LLAMA_CPP)
    block = DeepSeek4.block

    def from_llama_cpp(self, g, il, layer, streams):
        return block(self, g, il, layer, hidden[f"l_last-{il - 1}"][g.ub.pos] if il else streams)

    monkeypatch.setattr(DeepSeek4, "block", from_llama_cpp)
    _, alone = decode_observed("deepseek4", ref["ids"], **AS_LLAMA_CPP)
    rows = [p for p in range(160) if p != 155]
    for il in range(4):
        expected = hidden[f"l_last-{il}"]
        scale = np.abs(expected).max()
        assert np.abs(alone[f"l_last-{il}"] - expected).max() / scale < 2e-3, il
        assert np.abs(chained[f"l_last-{il}"][rows] - expected[rows]).max() / scale < 5e-3, il
    for name in ("hc_head", "result_norm"):
        assert np.abs(chained[name][rows] - hidden[name][rows]).max() / np.abs(hidden[name]).max() < 5e-3, name


def test_routing_matches_llama_cpp():
    """Layer 0 routes by token id (llama.cpp's table, exactly); layers 1-3 by sqrt(softplus) plus
    the selection bias, equal wherever llama.cpp's margin is at least 1e-3 (all but 4 positions)."""
    ref = tiny_reference("deepseek4")
    _, seen = decode_observed("deepseek4", ref["ids"], **AS_LLAMA_CPP)
    for il, info in ref["debug"]["moe"].items():
        experts, weights = seen[f"ffn_moe_topk-{il}"], seen[f"ffn_moe_weights-{il}"]
        margins = info.get("expert_margin_per_position", [1.0] * 160)
        checked = [p for p, m in enumerate(margins) if m >= 1e-3]
        assert len(checked) >= 150
        for p in checked:
            assert sorted(experts[p]) == sorted(info["selected_experts"][p]), (il, p)
        if il == "0":
            np.testing.assert_allclose(weights, info["expert_weights"]["values"], atol=2e-3)


def test_micro_batches_match_llama_cpps_own():
    """-ub 16 (ten ubatches, blocks finished in a later ubatch than they started) against llama.cpp's
    own -ub 16 run, away from the positions where that run's selection flipped (37, 107, 125, 155:
    this engine's -ub 16 does not flip them, its -ub 16 equals its -ub 160 to 1e-5)."""
    alt = tiny_reference("deepseek4")["alt_ubatch"]
    logits, _ = decode_observed("deepseek4", ids(), n_ubatch=16, **AS_LLAMA_CPP)
    errors = top10_errors(logits, alt["top"])
    errors[[37, 107, 125, 155]] = 0
    assert errors.max() <= 0.03  # measured 0.020 (at 136, whose window holds the flipped 107 and 125)
    assert np.abs(logits[-1] - np.array(alt["last_logits"])).max() <= 0.02


def test_perplexity_matches_llama_cpp():
    """llama-perplexity on hamlet.md, -c 128 --chunks 6 and -c 256 --chunks 3 (where the ratio-128
    layer sees its rows at more than one position per chunk), within 0.5 %."""
    from conftest import FIXTURES, load_fixture
    from llmsuite.core.perplexity import perplexity, plan_chunks

    model = tiny_model(tiny_path("deepseek4"))
    text = (FIXTURES / "hamlet.md").read_text()
    tokens = model.vocab.tokenize(text[:-1] if text.endswith("\n") else text, add_special=True)
    expected = load_fixture("tiny/perplexity-hamlet.json")
    for n_ctx, chunks, want in ((128, 6, expected["final"]["tiny-deepseek4"]),
                                (256, 3, expected["final_c256_chunks3"]["tiny-deepseek4"])):
        plan = plan_chunks(len(tokens), n_ctx, 2048, chunks)
        ctx = Context(model, ContextParams(n_ctx=plan.n_seq * n_ctx, n_batch=plan.n_batch, n_seq_max=plan.n_seq,
                                           type_k="f16", type_v="f16"))
        result = perplexity(ctx, tokens, plan)
        assert abs(result.ppl / want - 1) < 5e-3, (n_ctx, result.ppl, want)


# ---- the engine against itself (f32 numerics and cache) ---------------------------------------

def context(**params) -> Context:
    return Context(tiny_model(tiny_path("deepseek4")), ContextParams(**{"n_ctx": 512, **F32, **params}))


def decoded(tokens, **params) -> tuple[np.ndarray, Context]:
    ctx = context(**params)
    assert ctx.decode(Batch.from_tokens(tokens, all_outputs=True)) == 0, ctx.last_error
    return ctx.logits.copy(), ctx


def close(a, b, rel=1e-5):
    """Equal to `rel` of the logits' scale (max |logit| ≈ 4)."""
    assert np.abs(a - b).max() <= rel * np.abs(b).max(), np.abs(a - b).max()


@pytest.mark.float_reference
def test_micro_batches_and_the_cacheless_oracle_agree():
    """-ub 16 against one ubatch of 160 (measured 1.1e-5 absolute, 2.7e-6 of the scale), and --kv
    none, which recomputes every compressed row from the tokens, against --kv dsv4."""
    whole, _ = decoded(ids())
    small, _ = decoded(ids(), n_ubatch=16)
    close(small, whole)
    for n_ubatch in (160, 16):
        none, _ = decoded(ids(), kv="none", n_ubatch=n_ubatch)
        np.testing.assert_allclose(none, whole, atol=1e-4, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("n_ubatch, unified", [(512, False), (12, False), (512, True), (12, True)])
def test_a_sequence_in_a_batch_of_three_equals_it_alone(n_ubatch, unified):
    """Three sequences of different lengths decoded together (one ubatch, or a ubatch boundary
    inside blocks; the window a stream per sequence, or one shared), then a step of all three,
    equal each sequence decoded alone."""
    prompts = [ids()[:140], ids()[20:150], ids()[5:60]]
    ctx = context(n_seq_max=3, n_ubatch=n_ubatch, n_ctx=3 * 256, kv_unified=unified)
    batch = joined([(p, s, 0, True) for s, p in enumerate(prompts)])
    assert ctx.decode(batch) == 0, ctx.last_error
    together = np.split(ctx.logits.copy(), np.cumsum([len(p) for p in prompts])[:-1])
    step = joined([([7 + s], s, len(p), True) for s, p in enumerate(prompts)])
    assert ctx.decode(step) == 0
    stepped = ctx.logits.copy()
    for s, p in enumerate(prompts):
        alone, single = decoded(p, n_ctx=256)
        close(together[s], alone)
        assert single.decode(Batch.from_tokens([7 + s], pos0=len(p))) == 0
        close(stepped[s], single.logits[0])


@pytest.mark.float_reference
@pytest.mark.parametrize("seq", [None, 1])
def test_save_load_continue_equals_an_uninterrupted_run(seq):
    """A state saved mid-block (position 130: an unfinished ratio-4 block, 3 tokens of the second
    ratio-128 block in the ring) and loaded into a fresh context continues exactly as the original."""
    prompt, rest = ids()[:131], ids()[131:]
    _, live = decoded(ids(), n_seq_max=2, n_ctx=1024)
    whole = live.logits[131:].copy()
    ctx = context(n_seq_max=2, n_ctx=1024)
    s = 0 if seq is None else seq
    assert ctx.decode(Batch.from_tokens(prompt, seq_id=s)) == 0
    data = ctx.state_bytes(prompt, seq=seq)
    fresh = context(n_seq_max=2, n_ctx=1024)
    if seq is None:
        assert fresh.load_state_bytes(data) == prompt
    else:
        assert fresh.load_state_bytes(data, seq=seq) == prompt
    assert fresh.decode(Batch.from_tokens(rest, seq_id=s, pos0=len(prompt), all_outputs=True)) == 0
    close(fresh.logits, whole)


@pytest.mark.float_reference
def test_whole_sequence_copy_and_removal():
    """seq_cp copies a whole sequence (window, rows and compressor rings): both continue alike; a
    removed sequence starts again from 0 as a fresh one."""
    ctx = context(n_seq_max=2)
    assert ctx.decode(Batch.from_tokens(ids()[:130])) == 0
    ctx.memory.seq_cp(0, 1)
    step = joined([([11], s, 130, True) for s in (0, 1)])
    assert ctx.decode(step) == 0
    np.testing.assert_array_equal(ctx.logits[0], ctx.logits[1])
    assert ctx.memory.seq_rm(1) and ctx.memory.seq_pos_max(1) == -1
    assert ctx.decode(Batch.from_tokens(ids()[:40], seq_id=1, all_outputs=True)) == 0
    alone, _ = decoded(ids()[:40])
    close(ctx.logits, alone)


def test_a_failed_ubatch_rolls_back_the_compressor_states(monkeypatch):
    """A ubatch that fails after its graph wrote the window, rows and rings (positions 30..35 finish
    ratio-4 block 7 and start block 8) leaves the memory as it was, byte for byte."""
    ctx = context()
    assert ctx.decode(Batch.from_tokens(ids()[:30])) == 0
    before = ctx.state_bytes()
    m = ctx.model

    def failing(g):
        type(m).forward(m, g)
        raise MemoryError("out of memory")

    monkeypatch.setattr(m, "forward", failing)
    assert ctx.decode(Batch.from_tokens(ids()[30:36], pos0=30)) == DecodeStatus.COMPUTE_FAILED
    assert ctx.state_bytes() == before


def test_sequence_edits_the_memory_cannot_do_are_refused_and_change_nothing():
    ctx = context(n_seq_max=2)
    assert ctx.decode(Batch.from_tokens(ids()[:50])) == 0
    mem, before = ctx.memory, ctx.state_bytes()
    assert not mem.seq_rm(0, 10, 20) and "whole sequence" in mem.refusal
    assert not mem.seq_rm(0, 40, -1) and "whole sequence" in mem.refusal
    assert mem.seq_rm(0, 50, -1)  # past the end: nothing to remove
    with pytest.raises(InvalidInputError, match="positions cannot move"):
        mem.seq_add(0, 0, -1, 5)
    with pytest.raises(InvalidInputError, match="whole sequence"):
        mem.seq_cp(0, 1, 0, 20)
    assert ctx.state_bytes() == before
    assert "cannot" in mem.shift_refusal or "no part" in mem.shift_refusal
    assert ctx.decode(Batch.from_tokens(ids()[:5], seq_id=1, pos0=3)) == DecodeStatus.INVALID_BATCH
    assert "position 0" in ctx.last_error


@pytest.mark.parametrize("flags, message", [
    (dict(kv="unified"), "--kv dsv4"), (dict(kv="split"), "--kv dsv4"), (dict(kv="iswa"), "--kv dsv4"),
    (dict(kv="mla"), "--kv dsv4"), (dict(kv="dsa"), "--kv dsv4"), (dict(type_k="f16", type_v="q8_0"), "-ctk f16"),
])
def test_memory_kinds_that_cannot_serve_it_are_refused(flags, message):
    with pytest.raises(InvalidInputError, match=message) as err:
        Context(tiny_model(tiny_path("deepseek4")), ContextParams(n_ctx=256, **flags))
    assert "\n" not in str(err.value)


def test_the_default_memory_is_dsv4_and_its_size_is_known_before_allocation():
    from llmsuite.core.memory.factory import MEMORY_KINDS

    for unified in (False, True):
        ctx = context(n_seq_max=2, n_ctx=1024, kv_unified=unified)
        assert ctx.memory.kind == "dsv4" and ctx.memory.raw.n_stream == (1 if unified else 2)
        spec = ctx.model.memory_spec()
        assert MEMORY_KINDS["dsv4"].nbytes(spec, ctx.params) == ctx.memory.nbytes


def _with_array(key: str, values: list[int]):
    return lambda img: img.set(key, VT.ARRAY, (VT.INT32, np.array(values)))


def _tensor_bytes(name: str, edit):
    def change(img):
        index = next(i for i, t in enumerate(img.tensors) if t.name == name.encode())
        t = img.tensors[index]
        data = bytearray(img.data)
        edit(data, t.offset)
        img = img.with_tensor(index)
        img.data = bytes(data)
        return img
    return change


def _typed(name: str, type_id: int):
    def change(img):
        index = next(i for i, t in enumerate(img.tensors) if t.name == name.encode())
        return img.with_tensor(index, type=type_id)
    return change


@pytest.mark.parametrize("edit, error, message", [
    (_with_array("deepseek4.attention.compress_ratios", [0, 0, 4, 8]), UnsupportedError, "compresses by 0, 4, 128 only"),
    (_with_array("deepseek4.attention.compress_ratios", [0, 0, 128, 128]), ModelFileError, "no ratio-4 layer"),
    (lambda img: img.set("deepseek4.hyper_connection.count", VT.UINT32, 3), UnsupportedError, "hyper_connection.count"),
    (lambda img: img.set("deepseek4.expert_gating_func", VT.UINT32, 1), UnsupportedError, "expert_gating_func"),
    (lambda img: img.set("deepseek4.attention.head_count_kv", VT.UINT32, 2), UnsupportedError, "head_count_kv"),
    (lambda img: img.set("deepseek4.attention.indexer.key_length", VT.UINT32, 64), ModelFileError,
     "indexer.key_length equals"),
    (lambda img: img.set("deepseek4.attention.indexer.key_length", VT.UINT32, 96), ModelFileError,
     "not a multiple of 64"),
    (_typed("blk.0.ffn_gate_tid2eid.weight", 0), ModelFileError, "must be I32"),
    (_tensor_bytes("blk.0.ffn_gate_tid2eid.weight", lambda d, at: d.__setitem__(slice(at, at + 4),
                                                                                 (9).to_bytes(4, "little"))),
     ModelFileError, "expert id outside 0..3"),
    (lambda img: renamed(img, "blk.2.indexer_compressor_ape.weight"), ModelFileError,
     "'blk.2.indexer_compressor_ape.weight' is missing"),
    (lambda img: renamed(img, "output.weight"), ModelFileError, "'output.weight' is missing"),
])
def test_a_broken_deepseek4_file_is_one_clear_error(tmp_path, monkeypatch, edit, error, message):
    """Each refused before any weight is read."""
    reads = []
    monkeypatch.setattr(DeepSeek4, "weight", lambda self, *a, **k: reads.append(a) or 1 / 0)
    with pytest.raises(error, match=message) as err:
        load_model(mutant_file(tiny_path("deepseek4"), tmp_path, edit))
    assert "\n" not in str(err.value) and not reads


# ---- the tools -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, embed_refusal", [("deepseek4", "deepseek4 gives no embeddings"),
                                                  ("glm-dsa", "has no pooling type")])
def test_the_tools_run_it(tmp_path, name, embed_refusal):
    """generate (several sequences, a prompt cache reused), perplexity with a KL-divergence base,
    bench with the attention path as an axis, batched-bench; embed refused with its reason."""
    from test_cli import assert_one_line_error, llm
    from test_perplexity import HAMLET

    model = str(tiny_path(name))
    prompt = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    first = llm("generate", "-m", model, "-p", prompt, "-n", "8", "--temp", "0", "-np", "2")
    assert first.returncode == 0, first.stderr
    cache = tmp_path / "prompt.cache"
    runs = [llm("generate", "-m", model, "-p", prompt, "-n", "8", "--temp", "0", "--prompt-cache", str(cache))
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs) and runs[0].stdout == runs[1].stdout, runs[1].stderr
    base = tmp_path / "base.kld"
    ppl = ["perplexity", "-m", model, "-c", "128", "--chunks", "3"]
    assert llm(*ppl, "-f", str(HAMLET), "--kl-divergence-base", str(base)).returncode == 0
    kld = llm(*ppl, "--kl-divergence-base", str(base), "--kl-divergence")
    assert kld.returncode == 0 and any(ln.startswith("Same top p:") for ln in kld.stdout.splitlines()), kld.stderr
    bench = llm("bench", "-m", model, "-p", "64", "-n", "4", "-d", "0,96", "-r", "1", "--attn", "dense,sparse",
                "-o", "json")
    assert bench.returncode == 0, bench.stderr
    assert len(json.loads(bench.stdout)) == 8  # 2 tests × 2 depths × 2 paths
    batched = llm("batched-bench", "-m", model, "-c", "512", "-npp", "16", "-ntg", "4", "-npl", "1,2")
    assert batched.returncode == 0, batched.stderr
    assert_one_line_error(llm("embed", "-m", model, "-p", "hello"), embed_refusal)


def test_corrupt_state_files_are_refused_and_change_nothing():
    """Truncated anywhere, or a field rewritten with a valid checksum (the compressed part's token
    count, cache type, layer table and ring shapes): refused in one sentence, the memory unchanged."""
    from llmsuite.core.statefile import StateFileError
    from test_state import layout, sealed

    donor = context(n_seq_max=2)
    assert donor.decode(Batch.from_tokens(ids()[:70], seq_id=1)) == 0
    data = donor.state_bytes(ids()[:70], seq=1)
    reads = layout(donor.params, data, 1, donor.model)
    target = context(n_seq_max=2)
    assert target.decode(Batch.from_tokens(ids()[:9], seq_id=1)) == 0
    before = target.state_bytes()

    def refused(bad: bytes) -> None:
        with pytest.raises((StateFileError, InvalidInputError)) as err:
            target.load_state_bytes(bad, seq=1)
        assert "\n" not in str(err.value)
        assert target.state_bytes() == before

    for cut in np.linspace(1, len(data) - 1, 12).astype(int):
        refused(data[:cut])
    # the fields that describe (not the floats they hold, any of which is a valid state)
    edited = [(f, at, n) for f, at, n in reads if n <= 8 and any(k in f for k in ("token count", "compressed",
                                                                                  "compressor"))]
    assert len(edited) >= 6
    for field, at, n in edited:
        bad = bytearray(data)
        bad[at:at + n] = bytes(b ^ 0x5A for b in bad[at:at + n])
        refused(sealed(bad))


def test_yarn_scales_the_compressed_layers_only(tmp_path):
    """rope.scaling yarn (factor 16 over 64 positions): the window-only layers 0-1 rotate as before,
    the compressed layers 2-3 by YaRN's angles (the ROPE cases of test-ops check the angles themselves)."""
    edit = lambda img: (img.set("deepseek4.rope.scaling.type", VT.STRING, b"yarn")  # noqa: E731
                        .set("deepseek4.rope.scaling.factor", VT.FLOAT32, 16.0)
                        .set("deepseek4.rope.scaling.original_context_length", VT.UINT32, 64))
    scaled = load_model(mutant_file(tiny_path("deepseek4"), tmp_path, edit))
    assert scaled.v4.compress_scale == 1 / 16 and scaled.v4.yarn.ext_factor == 1.0
    seen = {}
    for name, model in (("plain", tiny_model(tiny_path("deepseek4"))), ("yarn", scaled)):
        ctx = Context(model, ContextParams(n_ctx=256, **F32),
                      observer=lambda t, ub, x, name=name: seen.setdefault((name, t), np.asarray(x).copy()))
        assert ctx.decode(Batch.from_tokens(ids()[:100], all_outputs=True)) == 0
    for il in (0, 1):
        np.testing.assert_array_equal(seen[("plain", f"l_last-{il}")], seen[("yarn", f"l_last-{il}")])
    assert np.abs(seen[("plain", "l_last-2")] - seen[("yarn", "l_last-2")]).max() > 1e-2


def test_a_batch_that_asks_for_no_outputs_decodes():
    """As llm bench's prompts do: the head mixes the streams of no rows."""
    ctx = context()
    batch = Batch.from_tokens(ids()[:40])
    batch.output = np.zeros(40, bool)
    assert ctx.decode(batch) == DecodeStatus.OK and ctx.memory.seq_pos_max(0) == 39
