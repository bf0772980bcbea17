"""llm bench: spec and range parsing, llama-bench's loop order and timing semantics, outputs."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import FIXTURES, TINY_GEMMA3, tiny_gemma3
from llmsuite.core import bench
from llmsuite.core.errors import InvalidInputError

LLM = [sys.executable, "-m", "llmsuite.cli.main", "bench"]
TINY = str(TINY_GEMMA3)


@pytest.mark.parametrize("spec, test", [
    ("pp512", bench.Test(512, 0)), ("tg128", bench.Test(0, 128)), ("pp512+tg128", bench.Test(512, 128)),
    ("pp2048@d32768", bench.Test(2048, 0, 32768)), ("tg32@d4096", bench.Test(0, 32, 4096)),
])
def test_specs(spec, test):
    assert bench.parse_spec(spec) == test
    assert test.name == spec.replace("@", " @ ")


@pytest.mark.parametrize("spec", ["pp", "pp-3", "tg0@d", "xx512", "tg0", "pp512@d", "pp1+tg0"])
def test_malformed_specs(spec):
    with pytest.raises(InvalidInputError, match=re.escape(f"bad test spec '{spec}'")):
        bench.parse_spec(spec)


def test_ranges_like_llama_bench():
    assert bench.parse_int_list("1024-4096*2", "-p") == [1024, 2048, 4096]
    assert bench.parse_int_list("1-5+2,16", "-p") == [1, 3, 5, 16]
    assert bench.parse_int_list("8-10", "-p") == [8, 9, 10]
    with pytest.raises(InvalidInputError, match="invalid range"):
        bench.parse_int_list("5-1", "-p")
    with pytest.raises(InvalidInputError, match="not a number"):
        bench.parse_int_list("a-b", "-p")


def test_loop_order_puts_tests_innermost():
    runs = bench.instances(["m1", "m2"], [bench.Test(8, 0), bench.Test(0, 4)], {"n_batch": [16, 32], "kv": ["unified"]})
    assert [(r.model, r.n_batch, r.test.name) for r in runs] == [
        ("m1", 16, "pp8"), ("m1", 16, "tg4"), ("m1", 32, "pp8"), ("m1", 32, "tg4"),
        ("m2", 16, "pp8"), ("m2", 16, "tg4"), ("m2", 32, "pp8"), ("m2", 32, "tg4")]
    assert bench.varying_axes(runs) == ["n_batch"]


def test_depth_is_prefilled_once_then_restored():
    events = []
    runner = bench.Runner(lambda inst: tiny_gemma3(), repetitions=3, on_event=events.append)
    result = runner.run(bench.Instance("tiny", bench.Test(8, 4, 64), n_batch=32, n_ubatch=32))
    assert events.count("depth") == 1 and events.count("depth (cached)") == 2 and events[0] == "warmup"
    assert len(result.samples_ns) == 3 and result.avg_ts > 0
    assert result.stddev_ts == pytest.approx(float(__import__("numpy").std(result.samples_ts, ddof=1)))


def test_kernels_are_readied_for_the_cache_types_before_the_warmup(monkeypatch):
    """A first repetition at depth must not compile a kernel the depth-0 warm-up never called."""
    from llmsuite.core.backend import CPUBackend

    events = []
    monkeypatch.setattr(CPUBackend, "prepare", lambda self, weight_types, state_space=False, cache_types=():
                        events.append(("prepare", cache_types)))
    runner = bench.Runner(lambda inst: tiny_gemma3(), repetitions=1, on_event=events.append)
    runner.run(bench.Instance("tiny", bench.Test(0, 2, 64), n_ubatch=32, type_k="q8_0"))
    assert events[:2] == [("prepare", ("q8_0", "f16")), "warmup"]


def test_depth_state_is_shared_across_instances_that_differ_only_in_attention():
    """A --sparse-topk or --attn sweep prefills each depth once, not once per value."""
    events = []
    runner = bench.Runner(lambda inst: tiny_gemma3(), repetitions=1, warmup=False, on_event=events.append)
    for inst in bench.instances(["tiny"], [bench.Test(0, 2, 64)], {"attn": ["dense", "sparse"], "n_ubatch": [32]}):
        runner.run(inst)
    assert events.count("depth") == 1 and events.count("depth (cached)") == 1


def test_depth_beyond_the_model_context_warns_and_runs():
    """As llama-bench: the test runs past the training context, with a warning."""
    warnings = []
    runner = bench.Runner(lambda inst: tiny_gemma3(), repetitions=1, warmup=False, on_warning=warnings.append)
    result = runner.run(bench.Instance("tiny", bench.Test(8, 0, 2044)))
    assert len(result.samples_ns) == 1
    assert warnings and "pp8 @ d2044 needs 2052 positions, more than the 2048" in warnings[0]


def llm(*args):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, env=dict(os.environ), timeout=300)


def test_cli_markdown_table():
    r = llm("-m", TINY, "pp16", "tg4", "-r", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("measured on: cpu") and "BLAS threads" in lines[0]
    assert lines[2].startswith("| model ") and lines[2].endswith("|                  t/s |")
    assert "pp16" in lines[4] and "tg4" in lines[5] and lines[-1].startswith("build: ")


def test_cli_one_varying_axis_adds_speedup():
    r = llm("-m", TINY, "tg4@d32", "--attn", "dense,sparse", "--kv", "unified", "-r", "1")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[2]
    assert "t/s attn=dense" in header and "t/s attn=sparse" in header and "speedup sparse" in header


def test_cli_json_jsonl_csv():
    doc = json.loads(llm("-m", TINY, "pp8", "-r", "2", "-o", "json").stdout)
    assert doc[0]["n_prompt"] == 8 and len(doc[0]["samples_ns"]) == 2 and doc[0]["model_type"].startswith("gemma3")
    for key in ("build_commit", "avg_ts", "stddev_ts", "type_k", "kv", "attn", "backend", "n_depth"):
        assert key in doc[0]
    line = json.loads(llm("-m", TINY, "tg2", "-r", "1", "-o", "jsonl").stdout.splitlines()[0])
    assert line["n_gen"] == 2
    csv_lines = llm("-m", TINY, "pp8", "-r", "1", "-o", "csv").stdout.splitlines()
    assert csv_lines[0].startswith("build_commit,build_number") and csv_lines[1].startswith('"')


def test_cli_takes_llama_benchs_fa_lists_nkvo_and_output_err():
    r = llm("-m", TINY, "pp8", "-r", "1", "-fa", "0,1", "-nkvo", "0,1", "-o", "jsonl", "-oe", "json", "-v")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["attn"] for line in r.stdout.splitlines()] == ["dense", "auto"]  # -fa 0 is dense
    again = r.stderr[r.stderr.index("[\n"):]  # -oe: the results again on stderr, as JSON
    assert [row["attn"] for row in json.loads(again)] == ["dense", "auto"]
    assert "-nkvo has no effect" in r.stderr
    for args, fragment in ((["-fa", "0,maybe"], "-fa takes 0, 1, on, off or auto"),
                           (["-fa", "0,1", "--attn", "sparse"], "drop --attn"), (["-oe", "xml"], "unknown -oe")):
        bad = llm("-m", TINY, "pp8", *args)
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and fragment in bad.stderr, bad.stderr


def test_cli_sweeps_the_attention_implementation():
    deepseek2 = str(FIXTURES / "tiny" / "tiny-deepseek2.gguf")
    r = llm("-m", deepseek2, "pp16", "--attn-impl", "mla,naive", "--kv", "unified,mla", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [(row["kv"], row["attn_impl"]) for row in json.loads(r.stdout)] == [("unified", "naive"), ("mla", "mla")]
    assert r.stderr.count("skipped") == 2  # unified cannot cache the latent, mla cannot hold per-head rows


def test_cli_sweeps_the_numerics():
    r = llm("-m", TINY, "tg2", "--numerics", "f32,ggml", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [row["numerics"] for row in json.loads(r.stdout)] == ["f32", "ggml"]
    bad = llm("-m", TINY, "tg2", "--numerics", "int4")
    assert bad.returncode != 0 and bad.stderr.strip() == \
        "error: unknown --numerics value 'int4' (choose from f32, ggml)"


def test_cli_sweep_skips_what_does_not_apply():
    r = llm("-m", "smollm2-135m", "pp8", "--kv", "unified,iswa", "-r", "1")
    assert r.returncode == 0 and "unified" in r.stdout
    assert "skipped:" in r.stderr and "--kv iswa needs sliding-window layers" in r.stderr


@pytest.mark.parametrize("args, fragment", [
    (["pp"], "bad test spec 'pp'"),
    (["xx512"], "bad test spec 'xx512'"),
    (["--kv", "paged", "pp8"], "unknown --kv value 'paged'"),
    (["-m", "smollm2-135m", "pp8", "--kv", "iswa"], "--kv iswa needs sliding-window layers"),
    (["-p", "5-1"], "invalid range"),
])
def test_cli_bad_input(args, fragment):
    r = llm(*args)
    assert r.returncode == 1 and fragment in r.stderr and "Traceback" not in r.stderr
