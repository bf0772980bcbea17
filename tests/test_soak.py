"""A long multi-sequence run keeps its memory flat (issue 32, item 4): scripts/soak.py in a fresh
process, eight sequences sampling to a full 4096-token context and then churning (rewinds and
forks) for 8192 more tokens. Slow: minutes per model, so outside the default run (-m slow)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_SSM, tiny_path

SOAK = Path(__file__).parent.parent / "scripts" / "soak.py"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", str(TINY_SSM["mamba2"]), str(tiny_path("lfm2"))],
                         ids=["attention", "recurrent", "hybrid"])
def test_a_long_churning_run_keeps_memory_files_and_threads_flat(model):
    done = subprocess.run([sys.executable, str(SOAK), "-m", model, "-np", "8", "-c", "4096", "--churn", "8192"],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first, end = report["after_256"], report["end"]
    assert report["tokens"] >= report["tokens_to_fill"] + 8192 and report["rewinds"] + report["forks"] > 0
    assert end["peak_mib"] <= 1.05 * first["rss_mib"], report
    assert end["open_files"] <= first["open_files"] and end["threads"] <= first["threads"], report
