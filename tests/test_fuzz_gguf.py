"""Malformed model files: structured mutants of the tiny Gemma 3 model (every header field, every
metadata value type for each key the engine reads, tensor names, dimensions, types and offsets,
alignment, truncation in every section, flipped bytes) through `llm info`, `load_model` and
`llm generate`. Each one must be refused with one sentence naming the file, or work; never
another exception, a hang, or unbounded memory. `-m slow` runs every mutant and a thousand flips
of the tiny model, and the fast set on SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_GEMMA3
from llmsuite.cli.main import MAX_ERROR_CHARS
from llmsuite.core.hub import resolve_model

WORKER = Path(__file__).parent / "fuzz_worker.py"


def fuzz(model: Path, which: str, tmp_path: Path, timeout: int) -> list[dict]:
    proc = subprocess.run([sys.executable, str(WORKER), str(model), which, "20261202", str(tmp_path)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, f"the worker died after {len(rows)} mutants: {proc.stderr[-2000:]}"
    return rows


def judge(rows: list[dict]) -> list[str]:
    """Every way a mutant's handling falls short, as one line each."""
    problems = []
    for row in rows:
        label = row["label"]
        if "finding" in row:
            problems.append(f"{label}: {row['finding']} {row.get('where', '')[-300:]}")
            continue
        for command, names_file in (("info", True), ("generate", False)):
            rc, text = row.get(f"{command}_rc"), row.get(f"{command}_err", "")
            if rc is None:
                continue
            if rc not in (0, 1) or (rc == 1 and not _one_sentence(text.removeprefix("error: "),
                                                                  row["path"] if names_file else "")):
                problems.append(f"{label}: llm {command} exited {rc} with {text[:300]!r}")
        if row["load"] == "refused":
            message = row["error"]
            if not _one_sentence(message, row["path"]) or len(message) > MAX_ERROR_CHARS:
                problems.append(f"{label}: refusal is not one short sentence naming the file: {message[:300]!r}")
            elif label.startswith(("value ", "missing ")) and not _names_key(label, message):
                problems.append(f"{label}: refusal does not name the key: {message[:300]!r}")
    return problems


def _one_sentence(text: str, path: str) -> bool:
    """One printable line (after its newline), starting with the file's path when one is given."""
    text = text.removesuffix("\n")
    return "\n" not in text and text.isprintable() and text.startswith(path)


def _names_key(label: str, message: str) -> bool:
    """A refusal for a bad value names the key, or the hyper-parameter it is checked against, or
    the tensor whose shape the value (or a missing key's default) contradicts."""
    key = label.split(" ", 2)[1]
    return key.rsplit(".", 1)[-1] in message or "but the hyper-parameters make it" in message


def test_mutants_of_tiny_gemma3_are_refused_cleanly_or_load(tmp_path):
    rows = fuzz(TINY_GEMMA3, "fast", tmp_path, timeout=900)
    assert len(rows) >= 300
    problems = judge(rows)
    assert not problems, f"{len(problems)} of {len(rows)} mutants mishandled:\n" + "\n".join(problems[:40])
    refused = sum(row.get("load") == "refused" for row in rows)
    assert 0 < refused < len(rows)  # both outcomes occur: the mutations reach past the first check
    assert max(row["maxrss_mb"] for row in rows) < 2048


@pytest.mark.slow
@pytest.mark.parametrize("model, which", [("tiny-gemma3", "slow"), ("smollm2-135m", "fast")])
def test_every_mutant(tmp_path, model, which):
    """Every mutant of the tiny model; the CI-sized set of SmolLM2's (each one copies 98 MB)."""
    path = TINY_GEMMA3 if model == "tiny-gemma3" else resolve_model(model)
    rows = fuzz(path, which, tmp_path, timeout=7200)
    problems = judge(rows)
    assert not problems, f"{len(problems)} of {len(rows)} mutants mishandled:\n" + "\n".join(problems[:40])
