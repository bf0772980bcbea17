"""GLM-DSA (GLM-5's DSA: DeepSeek-3.2 with per-layer indexer types, NORM indexer RoPE, an indexer
LayerNorm without epsilon, sigmoid gating by default) on a tiny random-weight model, against
llama.cpp (fixture README §5 "tiny-glm-dsa"). Layers 0 and 2 are full (their own indexer, top_k 12);
layers 1 and 3 are shared: they attend with the selection of layer 0 / 2.

As in test_tiny_deepseek.py the comparisons with llama.cpp run as it does (--numerics ggml, f16
cache): the top-k sits on score gaps down to 5e-4."""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from conftest import decode_observed, tiny_model, tiny_path, tiny_reference
from gguf_mutants import Tensor, mutant_file, renamed
from llmsuite.core.backend import get_backend
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import ModelFileError
from llmsuite.core.graph import Graph, IndexerInput
from llmsuite.core.memory import AttnGroup
from llmsuite.core.memory.masks import IndexerTopK, indexer_scores, top_k_mask
from llmsuite.core.models import load_model
from test_tiny_deepseek import AS_LLAMA_CPP, compare_logits, dsa_flips, fragile_positions

NAME = "glm-dsa"
TYPES_KEY = "glm-dsa.attention.indexer.types"
LLAMA_UB16_FLIPS = {67}  # llama.cpp's own -ub 16 run flipped layer 2's selection there (gap 1.2e-3)


# measured (--numerics ggml, f16 cache, ub 512): no selection differs from llama.cpp's, top-10 max |Δ| 0.0055
# (position 13), last_logits 0.0021, hidden states ≤ 2.1e-3 of their max (result_norm). The same model with
# NEOX indexer RoPE: 80 selections of 96 differ per full layer and logits move by up to 6.1.
def test_logits_match_llama_cpp():
    ref = tiny_reference(NAME)
    logits, seen = decode_observed(NAME, ref["ids"], **AS_LLAMA_CPP)
    flipped = dsa_flips(seen, NAME)  # none measured; a near-tie may flip with the summation order
    assert len(flipped) <= 1 and flipped <= fragile_positions(NAME)
    assert compare_logits(logits, ref["top"], 0.03, skip=flipped) >= 60
    assert np.abs(logits[-1] - np.array(ref["last_logits"])).max() <= 0.01  # all 49152
    for tensor, values in ref["debug"]["hidden"].items():
        expected = np.array(values)
        rows = [p for p in range(len(expected)) if p not in flipped]
        assert np.abs(seen[tensor][rows] - expected[rows]).max() / np.abs(expected).max() < 1e-2, tensor


def test_gating_is_sigmoid_by_default():
    """The file has no expert_gating_func: sigmoid, as in llama.cpp (the routing itself is checked
    against llama.cpp's in test_tiny_deepseek.py: margins ≥ 1.8e-3, all positions)."""
    assert tiny_model(tiny_path(NAME)).hparams.moe.gating == "sigmoid"


def test_micro_batch_size_agrees_with_llama_cpps_alt_run():
    """-ub 16 against llama.cpp's -ub 16 run (measured: top-10 max |Δ| 0.012 away from its flip at 67,
    last_logits 0.012), and against our -ub 512 (max |Δ| 0.010)."""
    ref = tiny_reference(NAME)
    small, seen = decode_observed(NAME, ref["ids"], n_ubatch=16, **AS_LLAMA_CPP)
    alt = ref["alt_ubatch"]
    ours = dsa_flips(seen, NAME)
    assert len(ours) <= 1
    compare_logits(small, alt["top"], 0.03, skip=LLAMA_UB16_FLIPS | ours)
    assert np.abs(small[-1] - np.array(alt["last_logits"])).max() <= 0.03
    large, seen_large = decode_observed(NAME, ref["ids"], **AS_LLAMA_CPP)
    same = [p for p in range(len(small)) if p not in ours | dsa_flips(seen_large, NAME)]
    assert len(same) >= 90
    np.testing.assert_allclose(small[same], large[same], atol=0.02, rtol=0)


@pytest.mark.float_reference
@pytest.mark.parametrize("seqs", [1, 2])
def test_the_cache_less_oracle_agrees(seqs):
    """--kv none recomputes every prefix (its indexer scores the batch's own keys; shared layers reuse
    the full layers' selections all the same): the same logits as --kv dsa, two batches in, one
    sequence or two side by side in each batch."""
    ids = tiny_reference(NAME)["ids"]
    model = tiny_model(tiny_path(NAME))

    def batch(lo: int, hi: int) -> Batch:
        tokens = np.concatenate([ids[s * 40 + lo:s * 40 + hi] for s in range(seqs)]).astype(np.int32)
        return Batch(tokens, np.tile(np.arange(lo, hi, dtype=np.int32), seqs),
                     np.repeat(np.arange(seqs, dtype=np.int32), hi - lo), np.ones(len(tokens), bool))
    cached = Context(model, ContextParams(n_ctx=128, n_seq_max=seqs, type_k="f32", type_v="f32"))
    oracle = Context(model, ContextParams(n_ctx=128, n_seq_max=seqs, kv="none"))
    assert cached.memory.kind == "dsa" and sorted(cached.memory.idx) == [0, 2]  # full layers only
    for ctx in (cached, oracle):
        assert ctx.decode(batch(0, 30)) == 0, ctx.last_error
        assert ctx.decode(batch(30, 40)) == 0, ctx.last_error
    np.testing.assert_allclose(oracle.logits, cached.logits, atol=1e-4, rtol=0)


@pytest.mark.float_reference
def test_shifted_cache_equals_a_fresh_decode():
    """seq_add re-rotates the full layers' cached indexer keys (Hadamard basis) in NORM mode, as the
    graph rotated them."""
    ids = tiny_reference(NAME)["ids"][:40]
    model = tiny_model(tiny_path(NAME))
    params = ContextParams(n_ctx=128, type_k="f32", type_v="f32")
    shifted = Context(model, params)
    assert shifted.decode(Batch.from_tokens(ids[:39])) == 0
    shifted.memory.seq_add(0, 0, -1, 7)
    assert shifted.decode(Batch.from_tokens([ids[39]], pos0=46)) == 0
    fresh = Context(model, params)
    assert fresh.decode(Batch.from_tokens(ids, pos0=7)) == 0
    np.testing.assert_allclose(shifted.logits, fresh.logits, atol=2e-4, rtol=0)


def test_a_shared_layer_reuses_each_groups_selection():
    """Two groups of query rows over their own cells (as a cache with streams hands them): the
    graph keeps the full layer's selection per group and the shared layer attends with it."""
    rng = np.random.default_rng(7)
    n_kv, d, n_idx_head = 24, 8, 2
    ub = SimpleNamespace(n_tokens=4, output=np.ones(4, bool), pos=np.arange(20, 24, dtype=np.int32))
    idx_keys = rng.standard_normal((n_kv, 1, d)).astype(np.float32)

    def group(rows):
        keys = rng.standard_normal((n_kv, 1, d)).astype(np.float32)
        return AttnGroup(rows, keys, keys, np.zeros((len(rows), n_kv), np.float32), ub.pos[rows],
                         np.arange(n_kv, dtype=np.int32), IndexerTopK(6), {"indexer_keys": idx_keys})
    groups = [group(np.array([0, 2])), group(np.array([1, 3]))]
    view = SimpleNamespace(store=lambda k, v=None, **extra: None, groups=lambda: groups)
    seen = {}
    graph = Graph(SimpleNamespace(hparams=None), SimpleNamespace(ubatch=ub, layer=lambda il: view), get_backend("cpu"),
                  observer=lambda name, _, x: seen.setdefault(name, []).append(np.asarray(x).copy()))
    q = rng.standard_normal((4, 2, d)).astype(np.float32)
    q_idx = rng.standard_normal((4, n_idx_head, d)).astype(np.float32)
    w = rng.standard_normal((4, n_idx_head)).astype(np.float32)
    k_new = np.zeros((4, 1, d), np.float32)
    graph.attn(0, q, k_new, None, 1.0, v_dim=d, indexer=IndexerInput(np.zeros((4, d), np.float32), q_idx, w))
    graph.attn(1, q, k_new, None, 1.0, v_dim=d, indexer=IndexerInput.reusing(0))
    for group, full, shared in zip(groups, seen["dsa_mask-0"], seen["dsa_mask-1"]):
        expected = top_k_mask(indexer_scores(q_idx[group.rows], w[group.rows], idx_keys), group.mask, 6)
        np.testing.assert_array_equal(full, expected)
        np.testing.assert_array_equal(shared, full)
    assert not np.array_equal(*seen["dsa_mask-0"])  # each group's own selection, not one for all
    with pytest.raises(RuntimeError, match="layer 3 reuses the indexer selection of layer 2"):
        graph.attn(3, q, k_new, None, 1.0, v_dim=d, indexer=IndexerInput.reusing(2))


def with_copies(img, prefixes: dict[str, str]):
    """The image with a copy of every tensor named under a key of `prefixes`, renamed to its value."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = bytearray(img.data)
    for t in list(img.tensors):
        src = next((p for p in prefixes if t.name.decode().startswith(p)), None)
        if src is not None:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
            data += bytes(-len(data) % img.alignment)
            img.tensors.append(Tensor(t.name.decode().replace(src, prefixes[src]).encode(), t.dims, t.type, len(data)))
            data += img.data[t.offset:t.offset + int(np.prod(t.dims)) // block * size]
    img.data = bytes(data)
    return img


def types(*full: bool):
    return lambda img: img.set(TYPES_KEY, VT.ARRAY, (VT.BOOL, np.array(full)))


@pytest.mark.parametrize("edit, message", [
    (types(False, True, True, False), f"metadata {TYPES_KEY} makes layer 0 shared"),
    (types(True, False, True), f"metadata {TYPES_KEY} has 3 values but block_count is 4"),
    (lambda img: img.set(TYPES_KEY, VT.ARRAY, (VT.FLOAT32, np.ones(4))), f"{TYPES_KEY} should be an array of booleans"),
    (types(True, True, True, False), r"tensor 'blk.1.indexer.attn_q_b.weight' is missing \(.* makes layer 1 full"),
    (lambda img: renamed(img, "blk.2.indexer.proj.weight"), "tensor 'blk.2.indexer.proj.weight' is missing"),
])
def test_a_broken_indexer_layout_is_one_clear_error_before_any_weight_loads(tmp_path, edit, message):
    loaded = []
    with pytest.raises(ModelFileError, match=message) as err:
        load_model(mutant_file(tiny_path(NAME), tmp_path, edit), progress=lambda done, total: loaded.append(done))
    assert "\n" not in str(err.value)
    assert not loaded


@pytest.mark.parametrize("edit, full", [
    (lambda img: img.drop(TYPES_KEY), [True] * 4),  # GLM-5/5.1 files: every layer full
    (lambda img: img.drop(TYPES_KEY).set("glm-dsa.context_length", VT.UINT32, 1 << 20), [True, True, True, False]),
    (lambda img: img.set(TYPES_KEY, VT.BOOL, True), [True] * 4),  # one value for every layer
])
def test_indexer_types_default_as_in_llama_cpp(tmp_path, edit, full):
    """Without the key: all full below a 1M training context, else GLM-5.2's pattern (layers 0, 1 and
    every fourth from 2). Files that make a layer full with no indexer tensors are refused, so layers 1
    and 3 get indexers borrowed from layers 0 and 2 here."""
    def with_indexers(img):
        return with_copies(edit(img), {f"blk.{src}.indexer.": f"blk.{src + 1}.indexer." for src in (0, 2)})
    model = load_model(mutant_file(tiny_path(NAME), tmp_path, with_indexers))
    assert list(model.full_indexer) == full
    assert [il for il, layer in model.memory_spec().layers.items() if layer.indexer] == \
        [il for il, f in enumerate(full) if f]
