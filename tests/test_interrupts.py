"""Ctrl-C loses nothing (issue 32, item 3): perplexity, KL-divergence, bench and embed print what
they finished, say in one line what that covers, and exit 130; a base file being written survives."""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, TINY_BERT, TINY_GEMMA3
from llmsuite.cli.main import run
from llmsuite.core import bench as core_bench
from llmsuite.core import context, perplexity

HAMLET = FIXTURES / "hamlet.md"
PPL = ["perplexity", "-m", str(TINY_GEMMA3), "-f", str(HAMLET), "-c", "64", "-b", "64", "--chunks", "5",
       "--no-progress"]


def interrupt_on_call(monkeypatch, owner, name: str, call: int) -> None:
    """Make `owner.name` raise KeyboardInterrupt on its `call`-th call, as Ctrl-C would there."""
    original, calls = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapper)


def llm(capsys, *args) -> tuple[int, str, str]:
    status = run([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def note_of(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, err
    return lines[0]


def test_perplexity_prints_the_chunks_done(monkeypatch, capsys):
    interrupt_on_call(monkeypatch, perplexity, "token_nll", 3)
    status, out, err = llm(capsys, *PPL)
    assert status == 130 and "Traceback" not in err
    chunks = re.findall(r"\[(\d+)\]([\d.]+),", out)
    assert [int(i) for i, _ in chunks] == [1, 2]
    assert f"Final estimate: PPL = {chunks[-1][1]} +/- " in out  # the running value after the chunks done
    assert note_of(err) == "interrupted: 2 of 5 chunks done, and the estimate covers only those"


def test_perplexity_json_says_it_was_interrupted(monkeypatch, capsys):
    interrupt_on_call(monkeypatch, perplexity, "token_nll", 2)
    status, out, _ = llm(capsys, *PPL, "-o", "json")
    doc = json.loads(out)
    assert status == 130 and doc["interrupted"] is True and len(doc["chunks"]) == 1
    assert doc["final"] == pytest.approx(doc["chunks"][0], abs=1e-6)


def test_interrupted_base_leaves_the_previous_one_and_kl_prints_its_chunks(monkeypatch, capsys, tmp_path):
    base = tmp_path / "base.bin"
    assert llm(capsys, *PPL, "--kl-divergence-base", base)[0] == 0
    before = base.read_bytes()
    with monkeypatch.context() as patch:
        interrupt_on_call(patch, perplexity, "token_nll", 2)
        status, _, err = llm(capsys, *PPL, "--kl-divergence-base", base)
    assert status == 130 and base.read_bytes() == before and f"{base} was not written" in note_of(err)
    interrupt_on_call(monkeypatch, perplexity.KLStats, "add", 4)
    status, out, err = llm(capsys, *PPL[:-1], "--kl-divergence-base", base, "--kl-divergence", "-ctk", "q8_0",
                           "-o", "json")
    doc = json.loads(out)
    assert status == 130 and doc["interrupted"] is True and len(doc["chunks"]) == 3
    assert doc["summary"]["count"] == 3 * 31  # 64-token chunks score their second half, less one
    assert note_of(err) == "interrupted: 3 of 5 chunks done, and the statistics cover only those"


def test_bench_prints_the_tests_done(monkeypatch, capsys):
    interrupt_on_call(monkeypatch, core_bench.Runner, "run", 2)
    status, out, err = llm(capsys, "bench", "-m", TINY_GEMMA3, "-p", "16", "-n", "4", "-r", "1", "-o", "json")
    rows = json.loads(out)
    assert status == 130 and [(r["n_prompt"], r["n_gen"]) for r in rows] == [(16, 0)]
    assert note_of(err) == "interrupted: during test 2 of 2 (tg4); the results are the 1 tests done before it"


def test_embed_prints_the_inputs_done(monkeypatch, capsys):
    interrupt_on_call(monkeypatch, context, "check_status", 3)
    status, out, err = llm(capsys, "embed", "-m", TINY_BERT, "-np", "1", "one", "two", "three", "four")
    assert status == 130 and re.findall(r"^embedding (\d+):", out, re.M) == ["0", "1"]
    assert note_of(err) == "interrupted: 2 of 4 inputs embedded, and only those printed"


def test_a_real_sigint_during_perplexity():
    """The signal itself, sent once the first chunk is out: the decode under way is rolled back."""
    args = [sys.executable, "-m", "llmsuite.cli.main", "perplexity", "-m", "smollm2-135m", "-f", str(HAMLET),
            "-c", "128", "-b", "128", "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=0)
    first = proc.stdout.read(3)  # "[1]" once the first chunk is scored
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert first == "[1]" and proc.returncode == 130, err
    assert "Final estimate: PPL = " in out and note_of(err).startswith("interrupted: ")
    assert "Traceback" not in err
