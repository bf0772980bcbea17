"""DeepSeek-2 (MLA, naive or latent by --attn-impl) and DeepSeek-3.2 (DSA: the lightning indexer's
top-k as the attention mask) on tiny random-weight models, against llama.cpp (fixture README §5).

llama.cpp caches f16 keys and rounds matmul activations (§4); DSA's top-k sits on score gaps as
small as 1e-4, so the selection tests run as llama.cpp does: --numerics ggml with an f16 cache."""

import numpy as np
import pytest

from conftest import decode_observed, tiny_model, tiny_path, tiny_reference
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory.masks import SparseParams

MARGIN = 5e-2  # top-1 must agree where llama.cpp's best two logits are this far apart
GAP = 1e-3  # discrete choices (experts, groups, keys) must agree where llama.cpp's margin is this wide
# DSA selections flip with the summation order up to gaps of about 4e-3 (fixture README §4: llama.cpp's
# own -ub 16 and -fa off runs flip there); which ones flip here depends on the CPU's kernels (an AMD EPYC
# flips position 44, gap 2.0e-3, where an Intel Xeon did not)
FRAGILE = 5e-3
AS_LLAMA_CPP = dict(numerics="ggml", type_k="f16", type_v="f16")


def dsa_selections(seen: dict, il: int) -> list[list[int]]:
    """The cells each query kept in layer il (all positions, in order)."""
    masks = seen[f"dsa_mask-{il}"]
    rows = [row for mask in masks for row in mask] if isinstance(masks, list) else masks
    return [np.flatnonzero(np.isfinite(row)).tolist() for row in rows]


def fragile_positions(name: str = "deepseek32") -> set[int]:
    """Positions where some layer's llama.cpp selection sits within FRAGILE of its boundary."""
    ref = tiny_reference(name)["debug"]["dsa"]
    return {pos for info in ref.values() for pos, gap in enumerate(info["boundary_gap_per_position"])
            if gap is not None and gap < FRAGILE}


def dsa_flips(seen: dict, name: str = "deepseek32") -> set[int]:
    """Positions where some layer's selection differs from llama.cpp's."""
    ref = tiny_reference(name)["debug"]["dsa"]
    return {pos for il, info in ref.items() for pos, (got, want) in
            enumerate(zip(dsa_selections(seen, int(il)), info["selected_keys"])) if got != want}


def compare_logits(logits, top, tolerance, skip=frozenset()) -> int:
    """Check llama.cpp's top-10 values and its decisive top-1 at every position not in `skip`;
    return how many positions were decisive."""
    decisive = 0
    for pos, row in enumerate(top):
        if pos in skip:
            continue
        ids, values = [t[0] for t in row], np.array([t[1] for t in row])
        assert np.abs(logits[pos, ids] - values).max() <= tolerance, pos
        if values[0] - values[1] >= MARGIN:
            assert int(np.argmax(logits[pos])) == ids[0], pos
            decisive += 1
    return decisive


# measured top-10 max |Δ|: deepseek2 0.019 (f32) / 0.016 (ggml, f16 cache); deepseek32 0.007 away from
# the one near-tie DSA flip (position 67, gap 5e-4). llama.cpp's own runs differ by up to 0.039 and 0.098.
@pytest.mark.parametrize("name,params,tolerance", [
    ("deepseek2", {}, 0.03), ("deepseek2", AS_LLAMA_CPP, 0.03), ("deepseek2", {"attn_impl": "naive"}, 0.03),
    ("deepseek32", AS_LLAMA_CPP, 0.03)])
def test_logits_match_llama_cpp(name, params, tolerance):
    ref = tiny_reference(name)
    logits, seen = decode_observed(name, ref["ids"], **params)
    flipped = dsa_flips(seen) if name == "deepseek32" else set()
    assert len(flipped) <= 2 and flipped <= fragile_positions()  # only near-ties flip
    assert compare_logits(logits, ref["top"], tolerance, skip=flipped) >= 60
    assert np.abs(logits[-1] - np.array(ref["last_logits"])).max() <= tolerance * 1.5  # all 49152, not 10
    for tensor, values in ref["debug"]["hidden"].items():
        expected = np.array(values)
        rows = [p for p in range(len(expected)) if p not in flipped]
        assert np.abs(seen[tensor][rows] - expected[rows]).max() / np.abs(expected).max() < 1e-2, tensor


@pytest.mark.float_reference
def test_naive_and_latent_attention_agree():
    """The absorbed (mla) and expanded (naive) forms compute the same attention: with an f32 cache
    the logits agree to 1e-4 relative (measured 1.7e-6)."""
    ids = tiny_reference("deepseek2")["ids"]
    f32 = dict(type_k="f32", type_v="f32")
    latent, _ = decode_observed("deepseek2", ids, attn_impl="mla", **f32)
    naive, _ = decode_observed("deepseek2", ids, attn_impl="naive", **f32)
    assert np.abs(latent - naive).max() / np.abs(naive).max() <= 1e-4


@pytest.mark.parametrize("name", ["deepseek2", "deepseek32", "glm-dsa"])
def test_routing_matches_llama_cpp(name):
    ref = tiny_reference(name)
    _, seen = decode_observed(name, ref["ids"], **AS_LLAMA_CPP)
    for il, info in ref["debug"]["moe"].items():
        experts = seen[f"ffn_moe_topk-{il}"]
        checked = [pos for pos, m in enumerate(info["expert_margin_per_position"]) if m >= GAP]
        assert len(checked) >= 90
        for pos in checked:
            assert sorted(experts[pos]) == sorted(info["selected_experts"][pos]), (il, pos)
        if "selected_groups" in info:
            groups = seen[f"ffn_moe_groups-{il}"]
            for pos, m in enumerate(info["group_margin_per_position"]):
                if m >= GAP:
                    assert sorted(groups[pos]) == sorted(info["selected_groups"][pos]), (il, pos)


@pytest.mark.parametrize("n_ubatch", [512, 16])
@pytest.mark.parametrize("name, top_k", [("deepseek32", 16), ("glm-dsa", 12)])
def test_indexer_selects_llama_cpps_keys(name, top_k, n_ubatch):
    """Every indexer layer's selected key set per query equals llama.cpp's wherever its boundary gap
    (top_k-th against the next score) is at least FRAGILE (glm-dsa: equal at all 96 positions);
    queries that see at most top_k keys keep them all; GLM's shared layers attend with the selection
    of their full layer."""
    ref = tiny_reference(name)
    _, seen = decode_observed(name, ref["ids"], n_ubatch=n_ubatch, **AS_LLAMA_CPP)
    for il, info in ref["debug"]["dsa"].items():
        got = dsa_selections(seen, int(il))
        for pos, (keys, gap) in enumerate(zip(info["selected_keys"], info["boundary_gap_per_position"])):
            if gap is None:
                assert got[pos] == list(range(pos + 1))
            elif gap >= FRAGILE:
                assert got[pos] == keys, (il, pos)
            assert len(got[pos]) == min(pos + 1, top_k)
        for shared in info.get("used_by_layers", []):
            assert dsa_selections(seen, shared) == got, (il, shared)


def test_micro_batch_size_agrees_with_llama_cpps_alt_run():
    """-ub 16 against llama.cpp's own -ub 16 run, and against -ub 512 away from the near-tie flips."""
    ref = tiny_reference("deepseek32")
    small, seen = decode_observed("deepseek32", ref["ids"], n_ubatch=16, **AS_LLAMA_CPP)
    alt = ref["alt_ubatch"]
    compare_logits(small, alt["top"], 0.03, skip={26, 67})  # llama.cpp's -ub 16 run flipped these two
    assert np.abs(small[-1] - np.array(alt["last_logits"])).max() <= 0.03
    large, seen_large = decode_observed("deepseek32", ref["ids"], **AS_LLAMA_CPP)
    same = [p for p in range(len(small)) if p not in dsa_flips(seen) | dsa_flips(seen_large)]
    assert len(same) >= 90
    np.testing.assert_allclose(small[same], large[same], atol=0.02, rtol=0)


@pytest.mark.float_reference  # under ggml numerics the two paths round in other orders (1.4e-4 seen)
@pytest.mark.parametrize("attn", ["dense", "sparse"])
def test_the_mask_is_the_truth_whatever_the_path(attn):
    ids = tiny_reference("deepseek32")["ids"]
    auto, _ = decode_observed("deepseek32", ids)
    forced, _ = decode_observed("deepseek32", ids, attn=attn)
    np.testing.assert_allclose(forced, auto, atol=1e-4, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("name,params", [("deepseek2", {}), ("deepseek2", {"attn_impl": "naive"}),
                                         ("deepseek32", {"type_k": "f32", "type_v": "f32"})])
def test_shifted_cache_equals_a_fresh_decode(name, params):
    """seq_add moves cached keys by RoPE's composition: MLA's rope part is the tail of each K row,
    the indexer keys (stored in the Hadamard basis) are rotated on their first dims."""
    ids = tiny_reference(name)["ids"][:40]
    model = tiny_model(tiny_path(name))
    shifted = Context(model, ContextParams(n_ctx=128, **params))
    assert shifted.decode(Batch.from_tokens(ids[:39])) == 0
    shifted.memory.seq_add(0, 0, -1, 7)
    assert shifted.decode(Batch.from_tokens([ids[39]], pos0=46)) == 0
    fresh = Context(model, ContextParams(n_ctx=128, **params))
    assert fresh.decode(Batch.from_tokens(ids, pos0=7)) == 0
    np.testing.assert_allclose(shifted.logits, fresh.logits, atol=2e-4, rtol=0)


def test_dsa_state_and_rollback_cover_the_indexer_keys():
    """A state file carries the indexer keys with the latent; a decode interrupted inside a layer
    leaves the memory as before it, so the same batch then gives the same logits."""
    ids = tiny_reference("deepseek32")["ids"][:48]
    model = tiny_model(tiny_path("deepseek32"))
    ctx = Context(model, ContextParams(n_ctx=64))
    assert ctx.decode(Batch.from_tokens(ids[:40])) == 0
    assert ctx.memory.kind == "dsa" and ctx.memory.idx
    state = ctx.state_bytes(ids[:40])

    def interrupt(tensor, ub, x):
        if tensor == "dsa_mask-2":
            raise KeyboardInterrupt
    ctx.observer = interrupt
    assert ctx.decode(Batch.from_tokens(ids[40:], pos0=40)) != 0
    assert ctx.memory.seq_pos_max(0) == 39
    ctx.observer = None
    assert ctx.decode(Batch.from_tokens(ids[40:], pos0=40)) == 0
    restored = Context(model, ContextParams(n_ctx=64))
    restored.load_state_bytes(state)
    assert restored.decode(Batch.from_tokens(ids[40:], pos0=40)) == 0
    np.testing.assert_array_equal(restored.logits, ctx.logits)


@pytest.mark.parametrize("name,params,message", [
    ("deepseek2", dict(kv="unified", attn_impl="mla"), "--kv unified caches K and V per head"),
    ("deepseek2", dict(kv="dsa"), "has no indexer"),
    ("deepseek2", dict(kv="mla", attn_impl="naive"), "--attn-impl naive caches K and V per head"),
    ("deepseek32", dict(attn_impl="naive"), "dsa cache"),
    ("deepseek32", dict(kv="mla"), "use --kv dsa"),
    ("llama-moe", dict(attn_impl="mla"), "llama has none"),
    ("llama-moe", dict(kv="mla"), "llama has none"),
    ("deepseek32", dict(sparse=SparseParams(topk=64)), "selects its own with its indexer"),
])
def test_invalid_attention_choices_are_refused(name, params, message):
    with pytest.raises(InvalidInputError, match=message) as err:
        Context(tiny_model(tiny_path(name)), ContextParams(n_ctx=64, **params))
    assert "\n" not in str(err.value)


def test_memory_kinds_follow_the_attention_implementation():
    model = tiny_model(tiny_path("deepseek2"))
    latent = Context(model, ContextParams(n_ctx=256)).memory
    naive = Context(model, ContextParams(n_ctx=256, attn_impl="naive")).memory
    assert (latent.kind, naive.kind) == ("mla", "unified")
    assert not latent.v  # V is a view of the latent
    assert latent.nbytes * 4 == naive.nbytes  # 48 floats a cell against 4 heads × (32 + 16)
    assert Context(model, ContextParams(n_ctx=256, kv="unified")).memory.kind == "unified"  # auto → naive


def combined_kv_b_model(tmp_path):
    """tiny-deepseek2 as older GGUFs store it: one attn_kv_b per layer (per head, the K up-projection
    rows then the V rows) instead of attn_k_b/attn_v_b, with per-head key/value lengths."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
    from gguf_mutants import GGUFImage, Tensor

    img = GGUFImage.parse(tiny_path("deepseek2").read_bytes())

    def payload(t: Tensor) -> bytes:
        block, size = GGML_QUANT_SIZES[T(t.type)]
        return img.data[t.offset:t.offset + int(np.prod(t.dims)) // block * size]

    contents = {t.name.decode(): (t, payload(t)) for t in img.tensors}
    for il in range(3):
        k_b, v_b = (np.frombuffer(contents.pop(f"blk.{il}.attn_{w}_b.weight")[1], np.float16).reshape(4, -1, shape)
                    for w, shape in (("k", 16), ("v", 32)))
        kv_b = np.concatenate([np.concatenate([k.T, v]) for k, v in zip(k_b, v_b)])  # (4·(16 + 16), 32)
        contents[f"blk.{il}.attn_kv_b.weight"] = (Tensor(b"", [32, 128], int(T.F16), 0), kv_b.tobytes())
    data, img.tensors = bytearray(), []
    for name, (t, raw) in contents.items():  # tensors packed one after another, aligned
        data += bytes(-len(data) % img.alignment)
        img.tensors.append(Tensor(name.encode(), t.dims, t.type, len(data)))
        data += raw
    img.data = bytes(data)
    for key in ("key_length_mla", "value_length_mla"):
        img = img.drop(f"deepseek2.attention.{key}")
    img = img.set("deepseek2.attention.key_length", 4, 32).set("deepseek2.attention.value_length", 4, 16)
    out = tmp_path / "tiny-deepseek2-kv_b.gguf"
    out.write_bytes(img.serialize())
    return out


@pytest.mark.float_reference
@pytest.mark.parametrize("attn_impl", ["mla", "naive"])
def test_a_combined_kv_b_tensor_gives_the_same_model(tmp_path, attn_impl):
    from llmsuite.core.models import load_model

    ids = tiny_reference("deepseek2")["ids"][:32]
    params = ContextParams(n_ctx=64, attn_impl=attn_impl)
    split = Context(tiny_model(tiny_path("deepseek2")), params)
    combined = Context(load_model(combined_kv_b_model(tmp_path)), params)
    for ctx in (split, combined):
        assert ctx.decode(Batch.from_tokens(ids, all_outputs=True)) == 0
    np.testing.assert_allclose(combined.logits, split.logits, atol=1e-4, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("name", ["deepseek2", "deepseek32"])
def test_the_cache_less_oracle_agrees(name):
    """--kv none recomputes every prefix (the indexer then scores the batch's own keys): the same
    logits as the latent caches, two batches in."""
    ids = tiny_reference(name)["ids"][:40]
    model = tiny_model(tiny_path(name))
    cached = Context(model, ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
    oracle = Context(model, ContextParams(n_ctx=64, kv="none"))
    for ctx in (cached, oracle):
        assert ctx.decode(Batch.from_tokens(ids[:30])) == 0
        assert ctx.decode(Batch.from_tokens(ids[30:], pos0=30)) == 0
    np.testing.assert_allclose(oracle.logits, cached.logits, atol=1e-4, rtol=0)
