"""A chat template is a program inside a model file: rendering one is bounded in size, time and
depth, and whatever a hostile one does ends in one sentence naming the file (issue 32)."""

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import TINY_GEMMA3, real_model
from gguf_mutants import VT, mutant_file
from hostile_templates import HOSTILE
from llmsuite.cli.main import run
from llmsuite.core.chat import ChatTemplate, render_chat
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.sandbox import BoundedEnvironment, Bounds, TemplateRefused

ORIGIN = "the chat template of evil.gguf"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_template_is_refused_in_one_sentence(name):
    source, fragment = HOSTILE[name]
    start = time.monotonic()
    with pytest.raises(InvalidInputError) as refused:
        render_chat(ChatTemplate(source, ORIGIN), MESSAGES)
    message = str(refused.value)
    assert message.startswith(ORIGIN + " ") and fragment in message and "\n" not in message, message
    assert time.monotonic() - start < 2


def test_hostile_templates_stay_under_a_gibibyte():
    """All of them in one fresh process: its peak RSS, the allocations a refusal prevented included.
    (VmHWM, not ru_maxrss: a child's ru_maxrss starts from the parent's RSS on Linux.)"""
    script = ("import json\n"
              "from hostile_templates import HOSTILE\n"
              "from llmsuite.core.chat import ChatTemplate, render_chat\n"
              "for source, _ in HOSTILE.values():\n"
              "    try:\n"
              "        render_chat(ChatTemplate(source), [{'role': 'user', 'content': 'hi'}])\n"
              "    except Exception:\n"
              "        pass\n"
              "status = open('/proc/self/status').read()\n"
              "print(json.dumps(int(status.split('VmHWM:')[1].split()[0])))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) < 1 << 20  # KiB


def test_real_template_renders_as_plain_jinja():
    """The bounds change nothing for a template that keeps within them."""
    source = real_model("smollm2-135m").chat_template
    turns = MESSAGES + [{"role": "assistant" if i % 2 else "user", "content": f"turn {i} " * 50} for i in range(40)]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    expected = plain.render(messages=turns, bos_token="", eos_token="", add_generation_prompt=True)
    assert render_chat(source, turns) == expected


EVERYDAY = [
    "{% for m in messages %}{{ m.content.replace('i', 'I').center(9) }}{{ loop.cycle('|', '/') }}{% endfor %}",
    "{{ messages | map(attribute='role') | join(', ') }} {{ '%s=%d' | format('n', messages | length) }}",
    "{{ messages | tojson(indent=2) }}{{ '{}:{:>4}'.format('x', 7) }}{{ ('ab' * 3) ~ [1, 2] ~ (1, ) }}",
    "{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}{% set ns.n = ns.n + 1 %}"
    "{% else %}none{% endfor %}{{ ns.n }}",
    "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
    "{% call wrap('b') %}{{ messages[-1].content | upper }}{% endcall %}",
    "{% for x in [[1, [2]], [3]] recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}]"
    "{% endfor %}",
    "{% set block %}{% for m in messages %}{{ m.role[0] }}{% endfor %}{% endset %}{{ block * 2 }}"
    "{% filter indent(2, first=True) %}a\nb{% endfilter %}{{ 'x\ty'.expandtabs(4) }}{{ 2 ** 10 }}",
]


@pytest.mark.parametrize("source", EVERYDAY)
def test_everyday_constructs_render_as_plain_jinja(source):
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    expected = plain.from_string(source).render(messages=MESSAGES)
    assert BoundedEnvironment(trim_blocks=True, lstrip_blocks=True).render(source, messages=MESSAGES) == expected


def test_bounds_scale_with_the_conversation():
    """The size bound is 1 MiB plus twice the messages: a long conversation still renders."""
    long_turn = [{"role": "user", "content": "y" * (3 << 20)}]
    assert len(render_chat("{% for m in messages %}{{ m.content }}{% endfor %}", long_turn)) == 3 << 20
    with pytest.raises(TemplateRefused, match="time limit"):
        BoundedEnvironment(Bounds(seconds=0.05)).render("{% for i in range(99999) %}{% for j in range(99999) %}"
                                                        "{% endfor %}{% endfor %}")


def test_loops_keep_their_length_and_lookahead():
    source = "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '.' if loop.last else ',' }}{% endfor %}"
    assert BoundedEnvironment().render(source, messages=["a", "b", "c"]) == "1/3,2/3,3/3."
    generated = "{% for m in messages | select %}{{ m }}{{ '!' if loop.last }}{% endfor %}"
    assert BoundedEnvironment().render(generated, messages=["a", "", "c"]) == "ac!"


# ---- through the commands -----------------------------------------------------------------------

def evil_model(tmp_path: Path, source: str) -> Path:
    return mutant_file(TINY_GEMMA3, tmp_path, lambda img: img.set("tokenizer.chat_template", VT.STRING,
                                                                   source.encode()))


def llm_in_process(capsys, monkeypatch, *args: str, stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = run(list(args))
    out, err = capsys.readouterr()
    return status, out, err


CLI_CASES = ["macro recursion", "string repetition", "captured macro", "nested loops", "attribute escape",
             "syntax error", "deep nesting", "str.format"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_commands_refuse_a_hostile_template_and_info_shows_it(name, tmp_path, capsys, monkeypatch):
    source, fragment = HOSTILE[name]
    path = evil_model(tmp_path, source)
    runs = {"generate --chat": ("generate", "-m", str(path), "--chat", "-p", "hi", "-n", "1"),
            "chat": ("chat", "-m", str(path), "-n", "1")}
    for command, args in runs.items():
        start = time.monotonic()
        status, out, err = llm_in_process(capsys, monkeypatch, *args, stdin="hi\n")
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert status == 1 and len(lines) == 1 and "Traceback" not in err, (command, err)
        assert lines[0].startswith(f"error: the chat template of {path.name} ") and fragment in lines[0], lines[0]
        assert time.monotonic() - start < 2, command
    status, out, err = llm_in_process(capsys, monkeypatch, "info", "--template", str(path))
    assert status == 0 and out == source + "\n", err
    status, out, _ = llm_in_process(capsys, monkeypatch, "info", str(path))
    assert status == 0 and "chat template yes" in out
