"""Read llama.cpp's command-line flags out of its common/arg.cpp into tests/fixtures/llama/flags.json.

    python scripts/llama_flags.py LLAMA_CPP_SOURCE_DIR [-o tests/fixtures/llama/flags.json]

Each `add_opt(common_arg(...))` gives its names (and the names of its negation, `--no-…`), how
many values it takes (from its handler's parameters) and the tools it applies to (`set_examples`,
everything when not set; `set_excludes` taken out). tests/test_llama_flags.py walks the list
through every subcommand's parser.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def calls(text: str):
    """The text of each add_opt(common_arg(...)) call with what follows it up to the next `;`."""
    for match in re.finditer(r"add_opt\(common_arg\(", text):
        depth, i = 2, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if text[i] == '"':  # skip string literals (they hold parentheses)
                i += 1
                while text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
            i += 1
        yield text[match.end():i], text[i:text.index(";", i)]


def flag(body: str, tail: str) -> dict:
    groups = re.findall(r'^\s*\{([^{}]*)\}\s*,', body) or []
    names = re.findall(r'"([^"]+)"', groups[0]) if groups else []
    rest = body[body.index("}") + 1:]
    negatives = []
    second = re.match(r'\s*,\s*\{([^{}]*)\}', rest)
    if second and '"-' in second.group(1):
        negatives = re.findall(r'"([^"]+)"', second.group(1))
    handler = re.search(r"\[\]\s*\(common_params\s*&\s*\w*\s*(,[^)]*)?\)", body)
    params = handler.group(1) or "" if handler else ""
    n_values = 0 if "bool" in params else params.count(",")
    chained = body + tail  # .set_examples(...) sits inside add_opt's parentheses
    examples = _examples(chained, "set_examples") or ["COMMON"]
    excludes = _examples(chained, "set_excludes")
    return {"names": names, "negatives": negatives, "values": n_values, "examples": examples, "excludes": excludes}


MMPROJ_EXAMPLES = ["MTMD", "SERVER", "CLI"]  # arg.cpp's mmproj_examples, set by name


def _examples(chained: str, method: str) -> list[str]:
    listed = re.search(method + r"\(\{([^}]*)\}", chained)
    if listed:
        return re.findall(r"LLAMA_EXAMPLE_(\w+)", listed.group(1))
    return MMPROJ_EXAMPLES if f"{method}(mmproj_examples)" in chained else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=Path(__file__).parents[1] / "tests/fixtures/llama/flags.json")
    args = ap.parse_args()
    text = (args.source / "common" / "arg.cpp").read_text()
    flags = [flag(body, tail) for body, tail in calls(text)]
    flags = [f for f in flags if f["names"]]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"source": "llama.cpp build 11434, common/arg.cpp", "flags": flags}, indent=1) + "\n")
    print(f"{len(flags)} flags -> {args.output}")


if __name__ == "__main__":
    main()
