"""The README's two set-up commands stay as documented, and CI runs exactly its test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section, flags=re.S)


def test_two_setup_commands():
    commands = setup_commands()
    assert len(commands) == 2
    assert "llm generate" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if ln.strip()]
    assert ci_lines[-1] == setup_commands()[1]


def test_cuda_folder_is_not_a_package():
    assert not (ROOT / "cuda" / "__init__.py").exists()
