"""Plugins (issue: a Python API and plugins): a file or an installed package registers a memory kind,
a mask producer, a sampler or an architecture, and every tool takes the name; bad plugins get one
sentence naming the file and the name. The StreamingLLM example runs through generate, perplexity
and bench, and keeps the memory protocol's promises (rollback, state files, seq_rm)."""

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import llmsuite
from conftest import TINY_GEMMA3, real_model, tiny_path
from gguf_mutants import mutant_file
from llmsuite.core import plugins
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, DecodeStatus
from llmsuite.core.memory import factory
from llmsuite.core.memory.masks import CausalMask
from llmsuite.core.models import registry
from llmsuite.core.sampling import SAMPLERS, Sampler, SamplerParams

ROOT = Path(__file__).resolve().parents[1]
STREAMING = ROOT / "docs" / "examples" / "streaming_llm.py"
LLM = [sys.executable, "-m", "llmsuite.cli.main"]


def llm(*args, env=None):
    return subprocess.run(LLM + [str(a) for a in args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 1, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    assert "Traceback" not in result.stderr


@pytest.fixture
def registries():
    """Plugins loaded in this process are forgotten after the test."""
    tables = [factory.MEMORY_KINDS, factory.MASK_PRODUCERS, SAMPLERS, registry.ARCHITECTURES, plugins._origins]
    saved = [dict(t) for t in tables]
    loaded = set(plugins._loaded)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


def plugin_file(tmp_path, body: str, name: str = "myplugin.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


# ---- the API --------------------------------------------------------------------------------

def test_api_generate_equals_the_cli():
    model = llmsuite.load("smollm2-135m")
    text = llmsuite.generate(model, "The capital of France is", n_predict=8, temp=0)
    r = llm("generate", "-p", "The capital of France is", "-n", "8", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The capital of France is" + text + "\n"
    pieces = list(llmsuite.stream_generate(model, "The capital of France is", n_predict=8, temp=0))
    assert len(pieces) > 1 and "".join(pieces) == text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = llm("generate", "-p", "The capital of France is", "-n", "8", "--temp", "0", "-r", stop)
    stopped = llmsuite.generate(model, "The capital of France is", n_predict=8, temp=0, stop=stop)
    assert r.stdout == "The capital of France is" + stopped + "\n" and stopped == text[:text.find(stop)]


def test_api_context_takes_the_flags_names():
    model = llmsuite.load("smollm2-135m")
    ctx = llmsuite.Context(model, kv="split", n_ctx=256, n_seq_max=2)
    assert ctx.memory.kind == "split" and ctx.params.n_seq_max == 2 and ctx.n_ctx == 256
    assert llmsuite.generate(ctx, "The capital of France is", n_predict=4, temp=0) == \
        llmsuite.generate(model, "The capital of France is", n_predict=4, temp=0, n_ctx=256)
    with pytest.raises(TypeError, match="n_cxt"):
        llmsuite.Context(model, n_cxt=256)


def test_api_perplexity_equals_the_cli():
    model = llmsuite.load("smollm2-135m")
    text = (ROOT / "tests" / "fixtures" / "hamlet.md").read_text()[:6000]
    result = llmsuite.perplexity(model, text, n_ctx=128, chunks=3)
    path = ROOT / "tests" / "fixtures" / "hamlet.md"
    r = llm("perplexity", "-f", path, "-c", "128", "--chunks", "3", "-o", "json")
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    # the CLI reads the whole file; the first chunks are the same tokens
    assert cli["chunks"] == [round(v, 6) for v in result.running_ppl]


def test_api_bench_sweeps_an_axis():
    results = llmsuite.bench("smollm2-135m", ["tg2"], repetitions=1, warmup=False, kv=["unified", "split"])
    assert [r.instance.kv for r in results] == ["unified", "split"]
    assert all(r.avg_ts > 0 and len(r.samples_ns) == 1 for r in results)


# ---- registering, and bad plugins -----------------------------------------------------------

def test_plugin_names_appear_in_help_and_are_taken():
    r = llm("generate", "--plugin", STREAMING, "--help")
    assert r.returncode == 0 and "streaming" in r.stdout
    r = llm("bench", "--help")
    assert r.returncode == 0 and "streaming" not in r.stdout
    r = llm("bench", "--plugin", STREAMING, "--help")
    assert "streaming" in r.stdout
    assert_one_line_error(llm("generate", "--kv", "streaming", "-p", "x"), "unknown --kv 'streaming'")


@pytest.mark.parametrize("body, fragments", [
    ("import no_such_module_here\n", ["bad.py failed to load", "ModuleNotFoundError", "no_such_module_here"]),
    ("def broken(:\n", ["bad.py failed to load", "SyntaxError"]),
    ("import llmsuite\nraise RuntimeError('not today')\n", ["bad.py failed to load", "not today"]),
    ("import llmsuite\nllmsuite.memory_kind('unified')(lambda spec, p, backend: None)\n",
     ["bad.py", "memory kind 'unified'", "already exists", "built-in"]),
    ("import llmsuite\nllmsuite.sampler_step('top_k')(lambda s, ids, logits: (ids, logits))\n",
     ["bad.py", "sampler 'top_k'", "already exists"]),
    ("import llmsuite\nllmsuite.architecture('llama')(object)\n", ["bad.py", "architecture 'llama'", "already exists"]),
    ("import llmsuite\nllmsuite.mask_producer('no way')(lambda p: None)\n", ["bad.py", "'no way'", "non-empty word"]),
])
def test_bad_plugins_are_one_sentence_naming_the_file(tmp_path, body, fragments):
    path = plugin_file(tmp_path, body, "bad.py")
    assert_one_line_error(llm("generate", "--plugin", path, "-p", "x", "-n", "1"), *fragments)


def test_a_missing_plugin_and_a_name_registered_twice(tmp_path):
    assert_one_line_error(llm("tokenize", "--plugin", tmp_path / "nope.py", "-p", "x"), "nope.py", "no such file")
    first = plugin_file(tmp_path, "import llmsuite\nllmsuite.memory_kind('mine')(lambda spec, p, b: None)\n", "a.py")
    second = plugin_file(tmp_path, "import llmsuite\nllmsuite.memory_kind('mine')(lambda spec, p, b: None)\n", "b.py")
    assert_one_line_error(llm("models", "--plugin", first, "--plugin", second), "b.py", "'mine'", "from", "a.py")


def test_an_installed_plugin_registers_through_its_entry_point(tmp_path):
    package = tmp_path / "site"
    (package / "demo_plugin").mkdir(parents=True)
    (package / "demo_plugin" / "__init__.py").write_text(textwrap.dedent("""
        import llmsuite

        @llmsuite.sampler_step("keep_two")
        def keep_two(sampler, ids, logits):
            order = logits.argsort()[::-1][:2]
            return ids[order], logits[order]
    """))
    info = package / "demo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[llmsuite.plugins]\ndemo = demo_plugin\n")
    env = {"PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])}
    r = llm("generate", "--help", env=env)
    assert r.returncode == 0 and "keep_two" in r.stdout
    r = llm("generate", "-p", "Once", "-n", "3", "--samplers", "keep_two;temperature", "-s", "1", env=env)
    assert r.returncode == 0, r.stderr
    (package / "demo_plugin" / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    assert_one_line_error(llm("models", env=env), "installed plugin demo", "broken on purpose")


def test_a_sampler_plugin_runs_in_the_chain(registries, tmp_path):
    llmsuite.load_plugin(plugin_file(tmp_path, """
        import llmsuite

        @llmsuite.sampler_step("no_argmax")
        def no_argmax(sampler, ids, logits):
            keep = logits < logits.max()
            return ids[keep], logits[keep]
    """))
    logits = np.array([0.0, 3.0, 1.0, 2.0], np.float32)
    greedy = Sampler(SamplerParams(temp=0, chain=("no_argmax",)))
    assert greedy.sample(logits) == 3  # the best but one, in greedy too
    sampled = Sampler(SamplerParams(temp=1, seed=3, top_k=0, top_p=1, min_p=0, chain=("no_argmax", "temperature")))
    assert {sampled.sample(logits) for _ in range(50)} <= {0, 2, 3}
    assert "no_argmax" in sampled.describe()


def test_a_failing_sampler_names_its_plugin(registries, tmp_path):
    llmsuite.load_plugin(plugin_file(tmp_path, """
        import llmsuite

        @llmsuite.sampler_step("empty")
        def empty(sampler, ids, logits):
            return ids[:0], logits[:0]
    """, "empty.py"))
    with pytest.raises(llmsuite.core.errors.LLMError, match="sampler 'empty' \\(plugin empty.py\\)"):
        Sampler(SamplerParams(temp=0, chain=("empty",))).sample(np.zeros(4, np.float32))


def test_a_mask_producer_plugin_is_taken_by_attn_mask(registries, tmp_path):
    llmsuite.load_plugin(plugin_file(tmp_path, """
        import llmsuite

        CALLS = []

        class Everything:
            kind, uses_queries = "everything", True

            def __call__(self, inp):
                CALLS.append(inp.il)
                return inp.base, 0

        @llmsuite.mask_producer("everything")
        def make(params):
            return Everything()
    """, "masks.py"))
    calls = sys.modules["llmsuite_plugin_masks"].CALLS
    model = real_model("smollm2-135m")
    prompt = model.vocab.tokenize("The capital of France is", add_special=True)
    outputs = {}
    for mask in ("auto", "everything"):
        ctx = Context(model, n_ctx=64, attn_mask=mask, sparse=factory.SparseParams(layers="all"))
        assert ctx.decode(Batch.from_tokens(prompt)) == DecodeStatus.OK, ctx.last_error
        outputs[mask] = ctx.get_logits().copy()
    assert sorted(set(calls)) == list(range(model.hparams.n_layer))
    assert np.array_equal(outputs["auto"], outputs["everything"])


def test_an_architecture_plugin_runs_its_ggufs(tmp_path):
    def rename(img):  # tiny-qwen3 as an architecture nobody registered
        img = copy.copy(img)
        img.kvs = [[b"myqwen" + k[5:] if k.startswith(b"qwen3.") else k, vtype,
                    b"myqwen" if k == b"general.architecture" else value] for k, vtype, value in img.kvs]
        return img

    path = mutant_file(tiny_path("qwen3"), tmp_path, rename)
    plugin = plugin_file(tmp_path, """
        import llmsuite
        from llmsuite.core.models.qwen3 import Qwen3

        @llmsuite.architecture("myqwen")
        class MyQwen(Qwen3):
            arch = "myqwen"
    """, "arch.py")
    assert_one_line_error(llm("generate", "-m", path, "-p", "hi", "-n", "4"), "unknown architecture 'myqwen'")
    ran = llm("generate", "--plugin", plugin, "-m", path, "-p", "hi", "-n", "4", "--temp", "0", "--ignore-eos")
    original = llm("generate", "-m", tiny_path("qwen3"), "-p", "hi", "-n", "4", "--temp", "0", "--ignore-eos")
    assert ran.returncode == 0 and original.returncode == 0, ran.stderr
    assert ran.stdout == original.stdout


BROKEN_MEMORY = """
    import llmsuite
    from llmsuite.core.memory import KVCache, AttnSpec

    class WrongShape:
        kind, uses_queries = "wrong", False

        def __call__(self, inp):
            return (inp.base[:, :-1] if inp.pos.max() >= 10 else inp.base), 0

    class Broken(KVCache):
        def make_room(self, ub):
            if ub.pos[0] >= 30:
                raise ValueError("no room for you")

    @llmsuite.memory_kind("broken")
    def broken(spec, p, backend):
        layers = spec.of(AttnSpec)
        return Broken(layers, p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="broken", backend=backend,
                      producers={il: WrongShape() for il in layers})
"""


def test_a_plugin_memory_that_breaks_is_rolled_back_and_named(registries, tmp_path):
    llmsuite.load_plugin(plugin_file(tmp_path, BROKEN_MEMORY, "broken.py"))
    model = real_model("smollm2-135m")
    ctx = Context(model, n_ctx=64, n_ubatch=4, n_batch=16, kv="broken")
    assert ctx.decode(Batch.from_tokens(np.arange(1, 7))) == DecodeStatus.OK
    before = ctx.state_bytes()
    # the second ubatch (positions 10..13) gets a mask of the wrong shape; the first (6..9) stays,
    # as llama.cpp keeps the ubatches done before a failure
    assert ctx.decode(Batch.from_tokens(np.arange(1, 9))) == DecodeStatus.COMPUTE_FAILED
    assert "memory kind 'broken' (plugin broken.py) failed: " in ctx.last_error
    assert ctx.memory.seq_pos_max(0) == 9
    assert ctx.memory.seq_rm(0, 6, -1)
    assert ctx.state_bytes() == before
    # a failure while planning changes nothing at all
    ctx = Context(model, n_ctx=64, n_ubatch=4, n_batch=32, kv="broken", type_k="f32", type_v="f32")
    ctx.memory.producers = dict.fromkeys(ctx.memory.producers, CausalMask())  # right shapes: only planning fails
    assert ctx.decode(Batch.from_tokens(np.arange(1, 21))) == DecodeStatus.OK
    before = ctx.state_bytes()
    assert ctx.decode(Batch.from_tokens(np.arange(1, 17))) == DecodeStatus.COMPUTE_FAILED
    assert "no room for you" in ctx.last_error and ctx.state_bytes() == before
    r = llm("generate", "--plugin", tmp_path / "broken.py", "--kv", "broken", "-p", "one two three four five six seven",
            "-n", "8", "-ub", "4", "-b", "4")
    assert_one_line_error(r, "memory kind 'broken' (plugin broken.py) failed")


# ---- the examples: StreamingLLM and H2O ------------------------------------------------------

EXAMPLES = {"streaming": STREAMING, "h2o": ROOT / "docs" / "examples" / "h2o.py"}


def test_streaming_example_is_short():
    assert len(STREAMING.read_text().splitlines()) <= 80


@pytest.fixture
def examples(registries):
    for path in EXAMPLES.values():
        llmsuite.load_plugin(path)


def decode_greedy(ctx, prompt, steps):
    prefill(ctx, prompt)
    tokens, logits = [], []
    for _ in range(steps):
        logits.append(ctx.get_logits().copy())
        tokens.append(int(np.argmax(logits[-1])))
        assert ctx.decode(Batch.from_tokens([tokens[-1]])) == DecodeStatus.OK, ctx.last_error
    return tokens, np.array(logits)


def prefill(ctx, tokens):
    """Decode after what sequence 0 holds, -b tokens at a time."""
    step = ctx.params.n_batch
    for i in range(0, len(tokens), step):
        assert ctx.decode(Batch.from_tokens(tokens[i:i + step])) == DecodeStatus.OK, ctx.last_error


def hamlet_tokens(model, n):
    text = (ROOT / "tests" / "fixtures" / "hamlet.md").read_text()[:20000]
    return model.vocab.tokenize(text, add_special=True)[:n]


@pytest.mark.float_reference
@pytest.mark.parametrize("kv", list(EXAMPLES))
def test_an_example_within_its_budget_equals_the_unified_cache(examples, kv):
    model = real_model("smollm2-135m")
    prompt = hamlet_tokens(model, 60)
    ref = decode_greedy(Context(model, n_ctx=256, kv="unified"), prompt, 20)
    got = decode_greedy(Context(model, n_ctx=256, kv=kv, kv_budget=128), prompt, 20)
    assert got[0] == ref[0]
    assert np.abs(got[1] - ref[1]).max() < 1e-4


def run_past_the_budget(kv: str, n_tokens: int = 300):
    """A context of --kv-budget 64 fed n_tokens: 200 as a prompt, then one at a time."""
    model = real_model("smollm2-135m")
    ctx = Context(model, n_ctx=512, kv=kv, kv_budget=64, n_ubatch=32, n_batch=64)
    prompt = hamlet_tokens(model, n_tokens)
    prefill(ctx, prompt[:200])
    for token in prompt[200:]:
        assert ctx.decode(Batch.from_tokens([token])) == DecodeStatus.OK
    return ctx, prompt


def test_streaming_keeps_the_sinks_and_the_window(examples):
    ctx, prompt = run_past_the_budget("streaming")
    cells = ctx.memory.cells[0]
    held = np.sort(cells.pos[cells.pos >= 0])
    window = 64 - 4
    last = len(prompt) - 1
    # the window the last token saw, and the sinks just before it: the budget exactly
    assert held.tolist() == list(range(last + 1 - window - 4, last + 1))
    assert ctx.memory.seq_pos_max(0) == last and not np.any(cells.shift)


def test_h2o_keeps_the_window_and_the_heaviest_older_tokens(examples):
    ctx, prompt = run_past_the_budget("h2o")
    model, cells = ctx.model, ctx.memory.cells[0]
    held = cells.pos >= 0
    recent = cells.pos >= len(prompt) - 32
    assert recent.sum() == 32 and (held & ~recent).sum() == 32
    assert 0 in cells.pos[held]  # the first token draws attention from everything after it
    # the mass attention handed out: each of the last decode's rows gives 1 per head and layer
    last = Context(model, n_ctx=512, kv="h2o", kv_budget=64)
    assert last.decode(Batch.from_tokens(prompt[:10])) == DecodeStatus.OK
    total = model.hparams.n_layer * model.hparams.n_head * 10
    assert last.memory.score[0].sum() == pytest.approx(total, rel=1e-4)
    # the eviction rule on scores set by hand: of the tokens older than the window, the lightest goes
    small = Context(model, n_ctx=64, kv="h2o", kv_budget=8, n_ubatch=4, n_batch=4)
    prefill(small, prompt[:8])
    memory, cells = small.memory, small.memory.cells[0]
    weight = {0: 5.0, 1: 1.0, 2: 4.0, 3: 3.0, 4: 2.0}
    for i, p in enumerate(cells.pos):
        if int(p) in weight:
            memory.score[0, i] = weight[int(p)]
    prefill(small, prompt[8:12])  # the window of position 8 starts at 5: 0..4 are older, four may stay
    assert sorted(int(p) for p in cells.pos if p >= 0) == [0, 2, 3, 4, *range(5, 12)]


@pytest.mark.parametrize("kv", list(EXAMPLES))
def test_an_example_keeps_rollback_state_files_and_seq_rm(examples, tmp_path, kv):
    model = real_model("smollm2-135m")
    prompt = hamlet_tokens(model, 150)
    params = dict(n_ctx=512, kv=kv, kv_budget=48, n_ubatch=16, n_batch=64, n_seq_max=2)
    ctx = Context(model, **params)
    prefill(ctx, prompt[:100])
    before = ctx.state_bytes()
    bad = Batch.from_tokens(prompt[100:140])
    bad.tokens[-1] = model.hparams.n_vocab + 5  # refused before any ubatch
    assert ctx.decode(bad) == DecodeStatus.INVALID_BATCH
    assert ctx.state_bytes() == before
    ctx.save_state(tmp_path / "s.state", prompt[:100])
    ctx.save_seq_state(tmp_path / "seq.state", 0, prompt[:100])
    held = sorted(int(p) for p in ctx.memory.cells[0].pos if p >= 0)
    uninterrupted = decode_greedy(ctx, prompt[100:110], 8)[0]
    resumed = Context(model, **params)
    resumed.load_state(tmp_path / "s.state")  # the same cells: it continues exactly as the original
    saved = _held_scores(resumed.memory, 0)
    assert decode_greedy(resumed, prompt[100:110], 8)[0] == uninterrupted
    one = Context(model, **params)
    one.load_seq_state(tmp_path / "seq.state", 1)  # into another sequence: other cells, the same contents
    assert sorted(_held_scores(one.memory, 1)) == held
    assert _held_scores(one.memory, 1) == saved  # H2O's attention scores travel with their cells
    assert one.decode(Batch.from_tokens(prompt[100:110], seq_id=1)) == DecodeStatus.OK
    assert resumed.memory.seq_rm(0, 105, -1)
    assert resumed.memory.seq_pos_max(0) == 104
    assert resumed.decode(Batch.from_tokens(prompt[105:110])) == DecodeStatus.OK


def _held_scores(memory, stream) -> dict:
    """Position -> attention score of a stream's cells (H2O); position -> None for a cache without scores."""
    cells = memory.cells[stream]
    scores = memory.scores(stream) if hasattr(memory, "scores") else [None] * cells.size
    return {int(p): (None if s is None else float(s)) for p, s in zip(cells.pos, scores) if p >= 0}


@pytest.mark.parametrize("kv", list(EXAMPLES))
def test_an_example_rolls_back_a_ubatch_that_fails(examples, monkeypatch, kv):
    """The second ubatch fails after make_room evicted cells and moved the sinks (their keys
    re-rotated): the memory is then exactly as after the first ubatch alone."""
    model = real_model("smollm2-135m")
    prompt = hamlet_tokens(model, 140)
    params = dict(n_ctx=512, kv=kv, kv_budget=48, n_ubatch=16, n_batch=32)
    ctx, reference = Context(model, **params), Context(model, **params)
    for c in (ctx, reference):
        prefill(c, prompt[:100])
    prefill(reference, prompt[100:116])
    forward, calls = model.forward, []

    def fail_second(graph):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return forward(graph)

    monkeypatch.setattr(model, "forward", fail_second)
    assert ctx.decode(Batch.from_tokens(prompt[100:132])) == DecodeStatus.ABORTED
    monkeypatch.setattr(model, "forward", forward)
    assert ctx.state_bytes() == reference.state_bytes()
    if kv == "h2o":  # failing halfway through the layers: the scores of the layers before go too
        observe, seen = ctx.memory.observe_attention, []

        def fail_at_layer_ten(il, stream, mass):
            seen.append(il)
            if len(seen) == model.hparams.n_layer + 10:
                raise RuntimeError("stop")
            observe(il, stream, mass)

        monkeypatch.setattr(ctx.memory, "observe_attention", fail_at_layer_ten)
        assert ctx.decode(Batch.from_tokens(prompt[116:148])) == DecodeStatus.COMPUTE_FAILED
        assert "h2o" in ctx.last_error and "stop" in ctx.last_error
        prefill(reference, prompt[116:132])
        assert ctx.state_bytes() == reference.state_bytes()


@pytest.mark.parametrize("kv", list(EXAMPLES))
def test_an_example_runs_through_generate_perplexity_and_bench(kv):
    plugin = ["--plugin", EXAMPLES[kv], "--kv", kv, "--kv-budget", "64"]
    r = llm("generate", *plugin, "-p", "Once upon a time", "-n", "80", "--temp", "0", "-c", "48", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) > 200  # past -c 48 without a context shift
    r = llm("perplexity", *plugin, "-f", ROOT / "tests" / "fixtures" / "hamlet.md", "-c", "256", "--chunks", "2")
    assert r.returncode == 0 and "Final estimate: PPL" in r.stdout, r.stderr
    r = llm("bench", "--plugin", EXAMPLES[kv], "--kv", f"unified,{kv}", "--kv-budget", "64", "-p", "0", "-n", "4",
            "-d", "128", "-r", "1")
    assert r.returncode == 0, r.stderr
    assert f"t/s kv={kv}" in r.stdout and f"speedup {kv}" in r.stdout


def test_kv_budget_needs_a_kind_that_evicts():
    assert_one_line_error(llm("generate", "--kv-budget", "64", "-p", "x"), "--kv-budget", "--kv unified keeps every cell")


@pytest.mark.parametrize("kv", list(EXAMPLES))
def test_an_example_refuses_models_it_cannot_serve(examples, kv):
    from llmsuite.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=f"--kv {kv}"):
        Context(llmsuite.load(TINY_GEMMA3.parent / "tiny-mamba.gguf"), kv=kv)
