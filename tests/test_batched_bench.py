"""llm batched-bench: llama-batched-bench's loop, figures and outputs; many sequences decoding as one
batch, over one unified buffer or a stream per sequence; its refusals."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import TINY_BERT, real_model
from llmsuite.core import batched_bench as bb
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.sampling import Sampler, SamplerParams

LLM = [sys.executable, "-m", "llmsuite.cli.main", "batched-bench"]
LLAMA_FIELDS = ["n_kv_max", "n_batch", "n_ubatch", "flash_attn", "is_pp_shared", "n_gpu_layers", "n_threads",
                "n_threads_batch", "pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"]


def llm(*args):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, env=dict(os.environ), timeout=600)


def test_cases_run_in_llamas_order():
    assert bb.cases([128, 256], [64], [1, 4]) == [bb.Case(128, 64, 1), bb.Case(128, 64, 4), bb.Case(256, 64, 1),
                                                   bb.Case(256, 64, 4)]


def test_cells_a_case_fills():
    case = bb.Case(128, 64, 4)
    assert case.n_kv(shared=False, cells_shared=True) == case.n_kv(shared=False, cells_shared=False) == 4 * 192
    assert case.n_kv(shared=True, cells_shared=True) == 128 + 4 * 64  # one copy of the prompt, shared
    assert case.n_kv(shared=True, cells_shared=False) == 4 * 128 + 4 * 64  # a copy per stream


def test_figures_are_computed_as_llama_computes_them():
    setup = bb.Setup("m")
    row = bb.Row(setup, "split", bb.Case(128, 64, 4), 768, t_pp=2.0, t_tg=4.0, shared=False, n_kv_max=4096,
                 n_threads=2, n_threads_batch=2)
    assert (row.speed_pp, row.speed_tg, row.t, row.speed) == (4 * 128 / 2.0, 4 * 64 / 4.0, 6.0, (512 + 256) / 6.0)
    shared = bb.Row(setup, "unified", bb.Case(128, 64, 4), 384, 2.0, 4.0, True, 4096, 2, 2)
    assert (shared.speed_pp, shared.speed) == (128 / 2.0, (128 + 256) / 6.0)
    assert bb.Row(setup, "split", bb.Case(8, 0, 2), 16, 1.0, 0.0, False, 64, 2, 2).speed_tg == 0.0


def test_generation_steps_are_one_batch_of_every_sequence_or_one_sequence_at_a_time():
    ctx = SimpleNamespace(model=SimpleNamespace(hparams=SimpleNamespace(n_vocab=100)))
    together = list(bb.Runner(None, bb.Options(), 3)._steps(ctx, bb.Case(10, 2, 3)))
    assert [b.seq_id.tolist() for b in together] == [[0, 1, 2]] * 2
    assert [b.pos.tolist() for b in together] == [[10] * 3, [11] * 3]
    separate = list(bb.Runner(None, bb.Options(separate_tg=True), 3)._steps(ctx, bb.Case(10, 2, 3)))
    assert [(b.seq_id.tolist(), b.pos.tolist()) for b in separate] == [
        ([s], [p]) for s in range(3) for p in (10, 11)]


@pytest.mark.parametrize("lists, message", [
    (([1], [1], [0]), "-npl 0: the number of parallel sequences must be at least 1"),
    (([1], [1], [-2]), "-npl -2"),
    (([1], [1], []), "-npl needs at least one value"),
    (([1], [1], [300]), "holds at most 256 sequences"),
    (([0], [1], [1]), "-npp 0: a prompt needs at least one token"),
    (([1], [-1], [1]), "-ntg -1"),
])
def test_lists_that_cannot_run_are_refused(lists, message):
    with pytest.raises(InvalidInputError, match=message):
        bb.check_lists(*lists, max_seq=256)


@pytest.mark.parametrize("args, message", [
    (["-npl", "0"], "-npl 0: the number of parallel sequences must be at least 1"),
    (["-npl", ""], "-npl needs at least one value"),
    (["-npl", "-3"], "-npl -3"),
    (["-npl", "1,300"], "-npl 300: the memory holds at most 256 sequences"),
    (["-npl", "2", "-kvu", "--kv", "split"], "-kvu asks for one unified KV buffer; it contradicts --kv split"),
    (["-npl", "2", "-o", "xml"], "unknown output format 'xml'"),
    (["-npl", "2", "--kv", "paged"], "unknown --kv value 'paged'"),
])
def test_bad_input_is_one_line_before_any_model_loads(args, message):
    r = llm("-m", "/nonexistent/model.gguf", "-npp", "8", "-ntg", "4", *args)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"error: {r.stderr.strip().removeprefix('error: ')}"]
    assert message in r.stderr and "nonexistent" not in r.stderr


def test_jsonl_rows_carry_llamas_fields_then_the_engines():
    r = llm("-npp", "8", "-ntg", "4", "-npl", "1,2", "-c", "64", "-o", "jsonl", "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [list(row)[:len(LLAMA_FIELDS)] for row in rows] == [LLAMA_FIELDS] * 2
    assert [(row["pl"], row["n_kv"], row["kv"], row["is_pp_shared"]) for row in rows] == [(1, 12, "split", 0),
                                                                                          (2, 24, "split", 0)]
    for row in rows:  # llama's default: a stream per sequence; the figures from the times
        assert row["speed_pp"] == pytest.approx(row["pl"] * 8 / row["t_pp"], rel=1e-4)
        assert row["speed_tg"] == pytest.approx(row["pl"] * 4 / row["t_tg"], rel=1e-4)
        assert row["speed"] == pytest.approx(row["pl"] * 12 / row["t"], rel=1e-4)
        assert row["n_kv_max"] == 64 and row["n_batch"] == 2048 and row["n_ubatch"] == 512


def test_a_shared_prompt_is_held_once_in_a_unified_buffer_and_per_stream_in_split_ones():
    r = llm("-npp", "8", "-ntg", "2", "-npl", "3", "-c", "96", "-pps", "--kv", "unified,split", "-o", "json",
            "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = {row["kv"]: row for row in json.loads(r.stdout)}
    assert (rows["unified"]["n_kv"], rows["split"]["n_kv"]) == (8 + 3 * 2, 3 * 8 + 3 * 2)
    assert all(row["is_pp_shared"] == 1 and row["speed_pp"] == pytest.approx(8 / row["t_pp"], rel=1e-4)
               for row in rows.values())


def table_rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("|")]


def test_markdown_compares_setups_with_the_first():
    r = llm("-npp", "8", "-ntg", "2", "-npl", "1,2", "-c", "40", "--kv", "unified,split", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("main: n_kv_max = 40, n_batch = 2048, n_ubatch = 512, flash_attn = -1, "
                                       "is_pp_shared = 0, is_tg_separate = 0")
    header, _, *body = table_rows(r.stdout)
    assert header == ["kv", "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s",
                      "S_PP x", "S_TG x"]
    assert [(row[0], row[3], row[4]) for row in body] == [("unified", "1", "10"), ("unified", "2", "20"),
                                                          ("split", "1", "10"), ("split", "2", "20")]
    assert [row[-2:] for row in body[:2]] == [["1.00x", "1.00x"]] * 2
    ratio = float(body[2][8]) / float(body[0][8])  # split's S_TG over unified's, at B = 1 (printed to 0.01)
    assert float(body[2][-1].removesuffix("x")) == pytest.approx(ratio, abs=0.02)


def test_cases_that_do_not_fit_are_skipped_with_a_note():
    r = llm("-npp", "8", "-ntg", "2", "-npl", "1,4", "-c", "36", "--kv", "unified,split", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert [(row[0], row[3]) for row in table_rows(r.stdout)[2:]] == [("unified", "1")]
    assert "kv=unified" in r.stderr and "skipped PP 8, TG 2, B 4: N_KV 40 exceeds the context (-c 36)" in r.stderr
    assert "skipped PP 8, TG 2, B 1: a sequence needs 10 cells and its stream holds 9 (-c 36 split into 4 " \
           "streams)" in r.stderr


def test_nothing_that_fits_is_an_error():
    r = llm("-npp", "64", "-ntg", "8", "-npl", "2", "-c", "64", "--no-progress")
    assert r.returncode == 1
    assert r.stderr.startswith("error: nothing to run:") and "N_KV 144 exceeds the context (-c 64)" in r.stderr


def test_an_encoder_is_refused():
    r = llm("-m", str(TINY_BERT), "-npp", "4", "-ntg", "2", "-npl", "1", "--no-progress")
    assert r.returncode == 1
    assert "batched-bench times a decoder's prompts and generation; bert is an encoder" in r.stderr


NO_COPY_PLUGIN = '''
import llmsuite
from llmsuite.core.memory.factory import attention_refusal, kv_bytes
from llmsuite.core.memory.kv_cache import KVCache
from llmsuite.core.memory.spec import AttnSpec


class OwnCells(KVCache):
    copy_refusal = "each cell belongs to one sequence for good"


@llmsuite.memory_kind("owncells", refuses=attention_refusal("owncells"),
                      nbytes=lambda spec, p: kv_bytes(spec, p, p.n_ctx))
def own_cells(spec, p, backend):
    return OwnCells(spec.of(AttnSpec), p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="owncells", backend=backend)
'''


def test_a_shared_prompt_needs_a_memory_that_copies_sequences(tmp_path):
    plugin = tmp_path / "own_cells.py"
    plugin.write_text(NO_COPY_PLUGIN)
    r = llm("--plugin", str(plugin), "-npp", "8", "-ntg", "2", "-npl", "2", "-c", "64", "--kv", "owncells", "-pps",
            "--no-progress")
    assert r.returncode == 1
    assert "-pps copies the prompt to the other sequences, but --kv owncells cannot: each cell belongs to one " \
           "sequence for good" in r.stderr
    r = llm("--plugin", str(plugin), "-npp", "8", "-ntg", "2", "-npl", "2", "-c", "64", "--kv", "owncells", "-o",
            "jsonl", "--no-progress")
    assert r.returncode == 0, r.stderr  # without -pps nothing is copied
    assert json.loads(r.stdout.splitlines()[0])["kv"] == "owncells"


def decode_together(model, kv: str, prompts: list[list[int]], steps: int, seeds: list[int]) -> list[list[int]]:
    """The prompts as one batch, then `steps` steps each decoding one sampled token of every
    sequence as one batch (a sampler of its own seed for each sequence)."""
    ctx = Context(model, ContextParams(n_ctx=64 * len(prompts), n_seq_max=len(prompts), kv=kv))
    tokens = np.concatenate(prompts).astype(np.int32)
    pos = np.concatenate([np.arange(len(p)) for p in prompts]).astype(np.int32)
    seq = np.concatenate([np.full(len(p), s) for s, p in enumerate(prompts)]).astype(np.int32)
    out = np.zeros(len(tokens), bool)
    out[np.cumsum([len(p) for p in prompts]) - 1] = True
    assert ctx.decode(Batch(tokens, pos, seq, out)) == DecodeStatus.OK, ctx.last_error
    samplers = [Sampler(SamplerParams(seed=seed, temp=0.8)) for seed in seeds]
    logits = [ctx.get_logits(i) for i in np.flatnonzero(out)]
    generated = [[] for _ in prompts]
    for step in range(steps):
        picks = [samplers[s].sample(logits[s]) for s in range(len(prompts))]
        for s, tok in enumerate(picks):
            samplers[s].accept(tok)
            generated[s].append(tok)
        batch = Batch(np.array(picks, np.int32), np.array([len(p) + step for p in prompts], np.int32),
                      np.arange(len(prompts), dtype=np.int32), np.ones(len(prompts), bool))
        assert ctx.decode(batch) == DecodeStatus.OK, ctx.last_error
        logits = [ctx.get_logits(i) for i in range(len(prompts))]
    return generated


@pytest.mark.float_reference
def test_unified_and_split_give_the_same_tokens_as_each_sequence_alone():
    """Four sequences of different lengths decoding together: one unified buffer (each row masked
    to its sequence's cells) and a stream per sequence (the streams attended side by side in one
    call) give the tokens each sequence gives decoded alone, for the same seeds."""
    model = real_model("smollm2-135m")
    texts = ["The capital of France is", "Once upon a time there was", "def fibonacci(n):", "Water boils at"]
    prompts = [model.vocab.tokenize(t, add_special=True) for t in texts]
    seeds = [100, 101, 102, 103]
    unified = decode_together(model, "unified", prompts, 10, seeds)
    split = decode_together(model, "split", prompts, 10, seeds)
    alone = [decode_together(model, "unified", [p], 10, [seed])[0] for p, seed in zip(prompts, seeds)]
    assert unified == split == alone
    assert len({tuple(t) for t in unified}) == 4
