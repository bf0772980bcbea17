"""Block top-k sparse attention: the producer's selection against a plain re-derivation, the bound
it promises, the block bounds through cache edits, dense equivalence, and the flags' refusals."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import TINY_GEMMA3, TINY_SSM, tiny_gemma3
from llmsuite.core.backend import get_backend
from llmsuite.core.batch import Batch
from llmsuite.core.memory import AttnSpec, KVCache, RopeSpec
from llmsuite.core.memory.masks import BlockTopK, KeyBounds, MaskInput, SparseParams
from llmsuite.core.statefile import StateReader, StateWriter
from test_memory_real import greedy as greedy_run

LLM = [sys.executable, "-m", "llmsuite.cli.main"]


def causal_base(pos, cell_pos):
    return np.where(cell_pos[None, :] <= pos[:, None], np.float32(0), np.float32(-np.inf))


def expected_selection(q, keys, base, pos, cell_pos, topk, block, local):
    """Each row's kept cells, derived loop by loop from the definition."""
    rows, n_kv = base.shape
    n_head, n_head_kv = q.shape[1], keys.shape[1]
    keep = np.zeros_like(base, dtype=bool)
    for r in range(rows):
        visible = np.isfinite(base[r])
        if visible.sum() <= topk:
            keep[r] = visible
            continue
        blocks = [b for b in range(-(-n_kv // block)) if visible[b * block:(b + 1) * block].any()]
        scores = {}
        for b in blocks:
            k = keys[b * block:(b + 1) * block]
            lo, hi = k.min(axis=0), k.max(axis=0)  # (n_head_kv, d)
            scores[b] = sum(np.maximum(q[r, h] * lo[h * n_head_kv // n_head], q[r, h] * hi[h * n_head_kv // n_head]).sum()
                            for h in range(n_head))
        far = [b for b in blocks[1:] if (visible & (pos[r] - cell_pos >= local))[b * block:(b + 1) * block].any()]
        chosen = [blocks[0]] + sorted(far, key=lambda b: -scores[b])[:topk // block - 1]
        for b in chosen:
            keep[r, b * block:(b + 1) * block] = True
        keep[r] |= (pos[r] - cell_pos) < local
        keep[r] &= visible
    return keep


@pytest.mark.parametrize("path", ["mask", "fused_mask"])
@pytest.mark.parametrize("topk, block, local", [(32, 8, 8), (64, 16, 0), (16, 16, 16)])
def test_block_topk_keeps_exactly_its_selection_within_the_bound(topk, block, local, path):
    """Both the array reference (the CuPy path) and the compiled CPU kernel."""
    rng = np.random.default_rng(topk + block + local)
    n_kv, rows, n_head, n_head_kv, d = 200, 40, 6, 2, 16
    keys = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    q = rng.standard_normal((rows, n_head, d)).astype(np.float32)
    pos = np.sort(rng.choice(n_kv, rows, replace=False)).astype(np.int32)
    cell_pos = np.arange(n_kv, dtype=np.int32)
    base = causal_base(pos, cell_pos)
    producer = BlockTopK(topk, block, local)
    inp = MaskInput(2, q, base, pos, cell_pos, extra={"bounds": KeyBounds(keys, block)}, backend=get_backend("cpu"))
    mask, n_kv_max = getattr(producer, path)(inp), producer.n_kv_max
    want = expected_selection(q, keys, base, pos, cell_pos, topk, block, local)
    np.testing.assert_array_equal(np.isfinite(mask), want)
    assert n_kv_max == topk + local and np.isfinite(mask).sum(axis=1).max() <= n_kv_max
    assert (np.isfinite(mask).sum(axis=1) < np.isfinite(base).sum(axis=1)).any()  # it did drop cells
    last = MaskInput(2, q[-1:], base[-1:], pos[-1:], cell_pos, extra=inp.extra, backend=inp.backend)  # one row: serial
    np.testing.assert_array_equal(getattr(producer, path)(last), mask[-1:])


@pytest.mark.parametrize("cache_type", ["f32", "f16", "q8_0"])
def test_block_bounds_follow_every_edit(cache_type):
    """Bounds equal the min and max over occupied cells after stores, seq_rm, a K-shift and a state
    load; f32 and f16 rows are read in place by a kernel, q8_0 through the array code."""
    spec = {0: AttnSpec(2, 16, 16, rope=RopeSpec(16, 10000.0, 1.0, True))}
    backend = get_backend("cpu")  # its fused BLOCK_BOUNDS for the f32/f16 rows
    cache = KVCache(spec, kv_size=64, producers={0: BlockTopK(16, 8, 8)}, type_k=cache_type, type_v=cache_type,
                    backend=backend)
    rng = np.random.default_rng(0)

    def commit(n, p0):
        from llmsuite.core.batch import BatchAllocator
        balloc = BatchAllocator(1000, 1)
        balloc.init(Batch.from_tokens(np.arange(n), pos0=p0), cache)
        mctx = cache.init_batch(balloc, 64)
        mctx.apply()
        k = rng.standard_normal((n, 2, 16)).astype(np.float32)
        mctx.layer(0).store(k, k)

    def check():
        cells, bounds = cache.cells[0], cache.bounds[0]
        bounds.refresh(0, cache.k[0], cells.pos, bounds.lo.shape[1])
        keys = cache.k[0].to_float(cache.k[0].raw(0, np.arange(64)))
        for b in range(8):
            occ = cells.pos[b * 8:(b + 1) * 8] >= 0
            if occ.any():
                np.testing.assert_array_equal(bounds.lo[0, b], keys[b * 8:(b + 1) * 8][occ].min(axis=0))
                np.testing.assert_array_equal(bounds.hi[0, b], keys[b * 8:(b + 1) * 8][occ].max(axis=0))

    commit(40, 0)
    check()
    cache.seq_rm(0, 5, 20)
    check()
    cache.seq_add(0, 20, -1, -15)
    cache.update(backend)
    check()
    commit(10, 25)
    check()
    w = StateWriter()
    cache.state_write(w)
    saved = w.getvalue()
    cache.clear()
    commit(30, 0)
    cache.state_read(StateReader(saved, "state")).commit()
    check()


def greedy(kv, steps=12, **sparse):
    """Greedy steps after a 150-token prompt on tiny Gemma 3 (window 8), selection forced."""
    return greedy_run(tiny_gemma3(), list(range(1000, 1150)), steps=steps, n_ctx=256, kv=kv, attn="sparse",
                      sparse=SparseParams(**sparse))


@pytest.mark.parametrize("kv", ["unified", "split", "iswa", "none"])
def test_sparse_with_k_covering_the_context_equals_dense(kv):
    dense_tokens, dense = greedy(kv)
    tokens, logits = greedy(kv, topk=256, block=16, local=16, layers="all")
    assert tokens == dense_tokens and np.abs(logits - dense).max() <= 1e-5


def test_small_k_selects_and_no_row_exceeds_the_bound(monkeypatch):
    """K = 32 over 160 cells: the global layer keeps less than it sees, never more than K + L per row."""
    from llmsuite.core.backend.cpu import CPUBackend

    seen = []
    original = CPUBackend.flash_attn_ext

    def spy(self, q, k, v, mask=None, scale=1.0, softcap=0.0, sinks=None, max_bias=0.0, n_kv_max=0, path=None):
        if n_kv_max == 40:
            seen.append(int(np.isfinite(mask).sum(axis=1).max()))
        return original(self, q, k, v, mask, scale, softcap, sinks, max_bias, n_kv_max, path)

    monkeypatch.setattr(CPUBackend, "flash_attn_ext", spy)
    dense_tokens, dense = greedy("unified")
    tokens, logits = greedy("unified", topk=32, block=8, local=8, layers="all")
    assert seen and max(seen) <= 40 and np.abs(logits - dense).max() > 0


def llm(*args):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, env=dict(os.environ), timeout=300)


@pytest.mark.parametrize("args, fragment", [
    (["--sparse-topk", "-64"], "--sparse-topk must be 0 (dense) or a positive number"),
    (["--sparse-topk", "100"], "is not a multiple of --sparse-block 16"),
    (["--sparse-topk", "96", "--sparse-block", "48"], "--sparse-block must be a power of two"),
    (["--sparse-topk", "64", "--sparse-local", "128"], "--sparse-local 128 must be between 0 and --sparse-topk 64"),
    (["--sparse-topk", "64", "--sparse-layers", "9-"], "names none of gemma3's full-attention layers"),
    (["--sparse-topk", "64", "-m", str(TINY_SSM["mamba"])], "mamba has no attention layers"),
])
def test_bad_sparse_flags_get_one_sentence(args, fragment):
    if "-m" not in args:
        args = ["-m", str(TINY_GEMMA3)] + args
    r = llm("generate", "-p", "hi", "-n", "1", *args)
    assert r.returncode == 1 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bench_sweeps_sparse_topk_with_speedup_column():
    r = llm("bench", "-m", str(TINY_GEMMA3), "pp16@d64", "-r", "1", "--sparse-topk", "0,16", "--sparse-block", "8",
            "--sparse-local", "8", "--attn", "sparse", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "t/s sparse_topk=0" in r.stdout and "t/s sparse_topk=16" in r.stdout and "speedup 16" in r.stdout


def test_verbose_generate_reports_attention_per_layer():
    r = llm("-v", "generate", "-m", str(TINY_GEMMA3), "-p", "a b c d e f g h i j k l m n o p q r s t", "-n", "4",
            "--temp", "0", "--sparse-topk", "8", "--sparse-block", "4", "--sparse-local", "4", "--attn", "sparse",
            "--sparse-layers", "all")
    assert r.returncode == 0, r.stderr
    assert "layer   5: top-k" in r.stderr and "layer   0: window" in r.stderr and "ms in attention" in r.stderr


def test_gemma3_unified_greedy_tokens_equal_dense_on_the_fixture_prompts(topk=1024):
    """The issue's check: Gemma 3 on one unified cache, window layers by their window and global
    layers by --sparse-topk 1024 under --attn sparse, gives dense's first 16 greedy tokens. The
    fixture prompts are short, so no row sees more than K cells here and the check guards the
    plumbing, not the selection's quality (docs/sparse-attention.md measures that after a long
    prefix, where Gemma's global layers are sensitive to it)."""
    from conftest import load_fixture, real_model

    model = real_model("gemma3-270m")
    for case in load_fixture("real/gemma3-270m.greedy.json")["cases"]:
        dense, _ = greedy_run(model, case["prompt_ids"], steps=16, n_ctx=256, kv="unified", attn="dense")
        sparse, _ = greedy_run(model, case["prompt_ids"], steps=16, n_ctx=256, kv="unified", attn="sparse",
                               sparse=SparseParams(topk))
        assert sparse == dense, case["prompt"]


def test_auto_leaves_short_contexts_dense():
    """Under --attn auto a selection below max(4096 cells, 5·(K+L)) is skipped: logits equal
    dense's exactly, where --attn sparse with the same K changes them (the test above)."""
    dense_tokens, dense = greedy_run(tiny_gemma3(), list(range(1000, 1150)), steps=4, n_ctx=256, kv="unified",
                                     attn="auto")
    tokens, logits = greedy_run(tiny_gemma3(), list(range(1000, 1150)), steps=4, n_ctx=256, kv="unified",
                                attn="auto", sparse=SparseParams(32, 8, 8, "all"))
    assert tokens == dense_tokens and np.array_equal(logits, dense)
