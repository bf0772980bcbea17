"""The flags llama.cpp users type, with llama.cpp's spellings and meanings (or accepted and reported
as having no effect here)."""

import json
import re

import numba
import numpy as np
import pytest

from conftest import TINY_GEMMA3, load_fixture, tiny_model
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from test_cli import assert_one_line_error, llm

TINY = str(TINY_GEMMA3)


def generate(*args):
    return llm("generate", "-m", TINY, "--temp", "0", *args)


def test_escapes_are_processed_unless_no_escape():
    escaped = generate("-p", r"one\ttwo\nthree \"four\" \x41", "-n", "0")
    assert escaped.returncode == 0 and escaped.stdout.startswith('one\ttwo\nthree "four" A'), escaped.stdout
    raw = generate("-p", r"one\ttwo", "-n", "0", "--no-escape")
    assert raw.stdout.startswith(r"one\ttwo")


def test_special_tokens_show_only_with_special():
    plain = generate("--chat", "-p", "hi", "-n", "1")
    special = generate("--chat", "-p", "hi", "-n", "1", "--special")
    assert plain.returncode == special.returncode == 0
    assert "<|im_start|>" not in plain.stdout and plain.stdout.startswith("user\nhi")  # as llama-completion shows it
    assert special.stdout.startswith("<|im_start|>user\nhi<|im_end|>")


def test_verbose_after_the_subcommand_and_the_sampler_flags():
    r = generate("-p", "hi", "-n", "1", "-v", "--samplers", "top_k;dry;temperature", "--ignore-eos",
                 "--presence-penalty", "0.5", "--frequency-penalty", "0.25")
    assert r.returncode == 0, r.stderr
    assert "sampler chain: logits -> logit-bias -> top-k -> ?dry -> temp-ext -> dist" in r.stderr
    r = generate("-p", "hi", "-n", "2", "-v", "--temp", "0.8", "-s", "3", "--typical", "0.9", "--top-nsigma", "1.5",
                 "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--dynatemp-range", "0.3", "--dynatemp-exp", "1.5")
    assert r.returncode == 0, r.stderr
    assert "-> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc -> temp-ext -> dist" in r.stderr
    r = generate("-p", "hi", "-n", "2", "-v", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "\\n",
                 "--dry-sequence-breaker", "none", "--dry-penalty-last-n", "32")
    assert r.returncode == 0 and "logits -> ?penalties -> dry -> ?top-n-sigma" in r.stderr, r.stderr
    assert_one_line_error(generate("-p", "hi", "--dry-penalty-last-n", "-1"), "--dry-penalty-last-n must be >= 0")
    r = generate("-p", "hi", "-n", "1", "-v", "--presence-penalty", "0.5")
    assert "logits -> penalties -> ?dry -> ?top-n-sigma -> top-k" in r.stderr


@pytest.mark.parametrize("flags, note", [
    (["-ngl", "99"], "-ngl has no effect here"), (["-dev", "CUDA0"], "-dev has no effect here"),
    (["-sm", "row"], "-sm has no effect here"), (["-mg", "1"], "-mg has no effect here"),
    (["--no-mmap"], "--no-mmap has no effect here"), (["-fa", "off"], "attention takes the dense path"),
])
def test_gpu_build_flags_are_accepted_and_reported(flags, note):
    r = generate("-p", "hi", "-n", "1", "-v", *flags)
    assert r.returncode == 0 and note in r.stderr, r.stderr


@pytest.mark.parametrize("args, fragment", [
    (["-fa", "maybe"], "-fa takes on, off or auto, not 'maybe'"),
    (["-fa", "off", "--attn", "sparse"], "contradicts --attn sparse"),
    (["--samplers", "top_k;mirostat9"], "unknown sampler 'mirostat9'"),
    (["-t", "-1"], "-t and -tb take a thread count"),
])
def test_bad_llama_flags_are_one_sentence(args, fragment):
    assert_one_line_error(generate("-p", "hi", *args), fragment)


def test_threads_follow_t_for_one_token_and_tb_for_batches(monkeypatch):
    from llmsuite.core import context, threads

    asked = []
    monkeypatch.setattr(context, "use_threads", asked.append)
    ctx = Context(tiny_model(TINY_GEMMA3), ContextParams(n_ctx=64, n_threads=1, n_threads_batch=3))
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    assert ctx.decode(Batch.from_tokens([4], pos0=3)) == 0
    assert asked == [3, 1]
    monkeypatch.undo()
    threads.use_threads(1)  # numba's pool and NumPy's OpenBLAS both take the count
    assert numba.get_num_threads() == 1 and threads.describe() == ""
    threads.use_threads(numba.config.NUMBA_NUM_THREADS)
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


def test_bench_sweeps_threads():
    r = llm("bench", "-m", TINY, "pp16", "-t", "1,2", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [row["n_threads"] for row in json.loads(r.stdout)] == [1, 2]


def test_perplexity_takes_threads_and_gpu_flags():
    r = llm("perplexity", "-m", TINY, "-f", str(TINY_GEMMA3.parent.parent / "hamlet.md"), "-c", "64", "--chunks", "1",
            "-t", "1", "-tb", "2", "-ngl", "99", "-fa", "on", "-v")
    assert r.returncode == 0 and "Final estimate" in r.stdout + r.stderr and "-ngl has no effect" in r.stderr


def test_an_interrupted_generate_ends_its_line_and_prints_the_timings():
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "llmsuite.cli.main", "generate", "-m", TINY, "-p", "Once upon",
                             "-n", "100000", "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a shell
    assert proc.stdout.read(20)  # it is generating
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert out.endswith(b"\n") and b"interrupted" in err and b"eval time" in err and b"Traceback" not in err


def test_a_step_of_one_token_per_sequence_is_an_eval_run():
    ctx = Context(tiny_model(TINY_GEMMA3), ContextParams(n_ctx=64, n_seq_max=2))
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    ctx.memory.seq_cp(0, 1, -1, -1)
    assert ctx.decode(Batch(np.array([4, 5], np.int32), np.array([3, 3], np.int32), np.array([0, 1], np.int32))) == 0
    assert (ctx.perf.n_p_eval, ctx.perf.n_eval) == (3, 1)


def test_prompt_cache_says_what_it_did(tmp_path):
    cache = tmp_path / "prompt.bin"
    args = ("-p", "The capital of France is", "-n", "2", "--prompt-cache", str(cache), "-v")
    first, second = generate(*args), generate(*args)
    assert "does not exist yet" in first.stderr and "saved the state of the" in first.stderr
    assert "loaded 5 tokens" in second.stderr and "5 of the prompt's 5 match, 4 reused" in second.stderr
    assert "saved the state" not in second.stderr


def test_info_takes_the_default_model_and_prints_the_template():
    r = llm("info", "--template")
    assert r.returncode == 0 and r.stdout.startswith("{% for message in messages %}")
    assert llm("info").stdout.startswith("file ") and "SmolLM2-135M" in llm("info").stdout
    assert_one_line_error(llm("info", "-m", TINY, "--template"), "has no chat template")


def test_context_shift_goes_on_past_a_full_context_keeping_the_prompt_head():
    args = ("-p", "Once upon a time", "-c", "32", "-n", "60", "--ignore-eos", "--swa-full")
    stopped, shifted = generate(*args), generate(*args, "--context-shift", "--keep", "2")
    assert "context full and context shift is disabled" in stopped.stderr
    assert "/    28 runs" in stopped.stderr and "/    59 runs" in shifted.stderr, shifted.stderr
    assert "context full" not in shifted.stderr and shifted.stdout.startswith(stopped.stdout.rstrip("\n"))


@pytest.mark.parametrize("args, fragment", [
    (["--context-shift"], "--kv iswa cannot"),  # the window cache reuses cells
    (["--context-shift", "--swa-full", "-np", "2"], "drop -np"),
])
def test_context_shift_refusals_print_nothing_on_stdout(args, fragment):
    r = generate("-p", "Once upon a time", *args)
    assert_one_line_error(r, fragment)
    assert r.stdout == ""


def test_color_marks_the_prompt():
    r = generate("-p", "Hi", "-n", "1", "-co", "on")
    assert r.stdout.startswith("\x1b[33mHi\x1b[0m")
    assert "\x1b[" not in generate("-p", "Hi", "-n", "1", "--color", "auto").stdout  # auto: not on a pipe
    assert_one_line_error(generate("-p", "Hi", "--color", "maybe"), "--color takes on, off or auto")


def test_interactive_continues_the_prompt_then_each_input():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "llmsuite.cli.main", "generate", "-m", TINY, "-i", "-p", "Once upon a time",
                        "-n", "4", "--temp", "0", "--in-prefix", " ", "--color", "on"], input="and then\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("\n")[:2]
    assert first.startswith("\x1b[33mOnce upon a time\x1b[0m") and len(first) > len("\x1b[33mOnce upon a time\x1b[0m")
    assert second.strip()  # the answer to the input
    assert "eval time =" in r.stderr and "/     8 runs" in r.stderr  # 4 + 4 sampled tokens, each decoded


def test_a_context_too_small_for_any_prompt_is_refused_before_loading():
    r = llm("generate", "-m", "no-such-model", "-c", "3", "-p", "hi")
    assert_one_line_error(r, "-c 3 leaves no room for a prompt")


def test_context_shift_is_refused_for_a_recurrent_state_before_any_output():
    r = llm("generate", "-m", str(TINY_GEMMA3.parent / "tiny-mamba.gguf"), "-p", "Once upon", "--context-shift")
    assert_one_line_error(r, "--kv recurrent cannot")
    assert r.stdout == ""


def test_every_command_that_builds_a_context_takes_the_same_flags():
    import typer

    from llmsuite.cli.main import app

    shared = {"-c", "-b", "-ub", "--kv", "--ctx", "--swa-full", "-ctk", "-ctv", "--backend", "--attn", "--attn-impl",
              "--numerics", "--sparse-topk", "--sparse-block", "--sparse-local", "--sparse-layers", "-t", "-tb",
              "-ngl", "-fa", "-dev", "-sm", "-mg", "--no-mmap"}
    commands = typer.main.get_command(app).commands
    for name in ("generate", "chat", "embed", "perplexity"):
        flags = {flag for param in commands[name].params for flag in param.opts}
        assert shared <= flags, (name, shared - flags)
        assert ("-np" in flags) == (name != "perplexity"), name


# ---- every llama.cpp flag, by its own name --------------------------------------------------------

LLAMA_FLAGS = load_fixture("llama/flags.json")["flags"]  # scripts/llama_flags.py over build 11434's arg.cpp
# the llama.cpp tools (arg.cpp's examples) each subcommand stands for; llm bench and test-ops stand for
# llama-bench and test-backend-ops, whose flags are their own (not arg.cpp's)
TOOLS = {"generate": {"COMPLETION", "CLI"}, "chat": {"CLI"}, "embed": {"EMBEDDING"}, "perplexity": {"PERPLEXITY"},
         "batched-bench": {"BENCH"}, "tokenize": {"TOKENIZE"}}
SKIPPED = {"-h", "--help", "--usage"}  # print the help and exit
ARGUMENTS = {"tokenize": ["hello"]}  # a subcommand's required arguments


def parse(subcommand: str, args: list[str]) -> str | None:
    """None where the subcommand's parser takes `args`, else the one-line error `llm` prints."""
    from llmsuite.cli.main import command, is_usage_error, usage_message

    try:
        command().commands[subcommand].make_context(subcommand, list(args))
    except Exception as e:
        if not is_usage_error(e):
            raise
        return usage_message(e)
    return None


def typed_flags(subcommand: str):
    for flag in LLAMA_FLAGS:
        tools = set(flag["examples"]) - set(flag["excludes"])
        if "COMMON" in tools or tools & TOOLS[subcommand]:
            for name in flag["names"]:
                yield name, ["1"] * flag["values"]
            for name in flag["negatives"]:
                yield name, []


@pytest.mark.parametrize("subcommand", sorted(TOOLS))
def test_every_llama_cpp_flag_is_taken_or_refused_by_its_own_name(subcommand):
    """Each flag of the llama.cpp tool a subcommand stands for, with a value where it takes one:
    the parser takes it, or refuses it naming the flag as typed — never as another flag (`-sp`
    as `-s p`), nor by leaving its value over as an extra argument."""
    wrong, taken = [], 0
    for name, values in typed_flags(subcommand):
        if name in SKIPPED:
            continue
        message = parse(subcommand, [name, *values, *ARGUMENTS.get(subcommand, [])])
        taken += message is None
        if message is not None and not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message):
            wrong.append(f"{name} {' '.join(values)}: {message}")
    assert not wrong, f"llm {subcommand}: " + "; ".join(wrong)
    assert taken >= 5  # the walk reaches flags the subcommand has


def test_a_flag_is_read_whole_and_a_value_is_never_a_flag():
    assert parse("generate", ["-sp"]) is None or "-sp" in parse("generate", ["-sp"])
    for subcommand, args, flag in (("generate", ["-n5"], "-n5"), ("embed", ["-ngx", "1"], "-ngx"),
                                   ("bench", ["-oex", "md"], "-oex"), ("generate", ["--no-such"], "--no-such")):
        assert parse(subcommand, args) == f"invalid argument: {flag}"
    assert parse("generate", ["-p", "-5", "-n", "-1", "--temp", "-0.5"]) is None


def test_generate_takes_llama_cpp_spellings(tmp_path):
    sp = generate("--chat", "-p", "hi", "-n", "1", "-sp")
    assert sp.returncode == 0 and sp.stdout.startswith("<|im_start|>user\nhi<|im_end|>")
    system = tmp_path / "system.txt"
    system.write_text("Be brief.\n")
    by_file = generate("--chat", "-sysf", str(system), "-p", "hi", "-n", "0", "-sp")
    by_flag = generate("--chat", "-sys", "Be brief.", "-p", "hi", "-n", "0", "-sp")
    assert by_file.returncode == 0 and by_file.stdout == by_flag.stdout and "Be brief.<" in by_file.stdout
    assert_one_line_error(generate("--chat", "-sys", "x", "-sysf", str(system), "-p", "hi"), "not both")
    r = generate("-p", "hi", "-n", "1", "--no-jinja", "-no-cnv", "-v")
    assert r.returncode == 0 and "--no-jinja has no effect" in r.stderr
    assert_one_line_error(generate("-p", "hi", "-st"), "apply to -cnv and -i")


def test_single_turn_answers_one_input_and_exits():
    import subprocess
    import sys

    def run(*flags):
        return subprocess.run([sys.executable, "-m", "llmsuite.cli.main", "generate", "-m", TINY, "-cnv", "-n", "3",
                               "--ignore-eos", "--temp", "0", *flags], input="one\ntwo\n", capture_output=True,
                              text=True, timeout=120)
    both, one = run(), run("-st")
    assert both.returncode == one.returncode == 0, one.stderr
    assert "/     6 runs" in both.stderr and "/     3 runs" in one.stderr  # sampled tokens: two answers, then one


def test_multiline_input_reads_as_llama_cli(monkeypatch):
    import io
    import sys

    from llmsuite.cli.conversation import read_turn

    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\\\nc/\nd\n"))
    assert read_turn(False, multiline=True) == "a\nb"  # -mli: every line continues, a backslash ends the input
    assert read_turn(False, multiline=True) == "c"  # a slash always ends it
    monkeypatch.setattr(sys, "stdin", io.StringIO("d\\\ne\nf/\n"))
    assert read_turn(False) == "d\ne" and read_turn(False) == "f"  # without -mli a backslash continues


def test_logit_bias_as_llama_cpp_spells_it():
    vocab = tiny_model(TINY_GEMMA3).vocab
    token = next(t for t in range(100, vocab.n_tokens) if vocab.token_to_piece(t).decode("utf-8", "ignore").isalpha())
    r = generate("-p", "hi", "-n", "1", "-l", f"{token}+100", "--logit-bias", "5-inf")
    assert r.returncode == 0 and r.stdout == "hi" + vocab.detokenize([token]) + "\n", r.stderr
    assert_one_line_error(generate("-p", "hi", "-l", "12x3"), "TOKEN_ID+BIAS")
    assert_one_line_error(generate("-p", "hi", "-l", f"{vocab.n_tokens}+1"), "outside the vocabulary")


def test_mirostat_replaces_the_chain_and_refuses_what_it_replaces():
    r = generate("-p", "hi", "-n", "2", "-v", "--temp", "0.8", "-s", "1", "--mirostat", "2", "--mirostat-lr", "0.2",
                 "--mirostat-ent", "4")
    assert r.returncode == 0 and "sampler chain: logits -> temp -> mirostat-v2" in r.stderr, r.stderr
    assert_one_line_error(generate("-p", "hi", "--mirostat", "2", "--top-k", "5"), "replaces the sampler chain")
    assert_one_line_error(generate("-p", "hi", "--mirostat", "1", "--samplers", "top_k"), "--samplers among it")
    assert_one_line_error(generate("-p", "hi", "--mirostat", "3"), "--mirostat takes 0")


def test_kv_flags_as_llama_cpp_spells_them(tmp_path):
    from conftest import tiny_path

    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 30)
    qwen = str(tiny_path("qwen3"))
    runs = {flag: llm("perplexity", "-m", qwen, "-f", str(text), "-c", "32", "-b", "64", flag, "-o", "json", "-nkvo")
            for flag in ("-kvu", "-no-kvu")}
    assert all(r.returncode == 0 for r in runs.values()), runs["-no-kvu"].stderr
    docs = {flag: json.loads(r.stdout) for flag, r in runs.items()}  # two chunks a batch: one buffer, or two
    assert (docs["-kvu"]["settings"]["kv"], docs["-no-kvu"]["settings"]["kv"]) == ("unified", "split")
    assert docs["-kvu"]["final"] == pytest.approx(docs["-no-kvu"]["final"], rel=1e-3)
    assert_one_line_error(llm("perplexity", "-m", qwen, "-f", str(text), "-kvu", "--kv", "split"), "contradicts")


def test_help_is_a_flag_of_every_subcommand():
    from llmsuite.cli.main import run

    for subcommand in ("generate", "embed", "bench", "batched-bench", "perplexity", "test-ops", "tokenize"):
        for flag in ("-h", "--help"):
            assert run([subcommand, flag]) == 0
