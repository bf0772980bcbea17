"""The `llm` command: subcommands are registered here; errors become one sentence on stderr."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from llmsuite.core.errors import LLMError, printable

from . import bench, embed, generate, models, perplexity, testops, tokenize
from .common import settings

MAX_ERROR_CHARS = 500

app = typer.Typer(
    name="llm",
    help="llama.cpp's tools over a hackable Python engine: generate, embed, bench, perplexity, test-ops, tokenize, pull, models, info.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log details; tracebacks on errors")] = False):
    settings["verbose"] = verbose


app.command("generate")(generate.generate)
app.command("embed")(embed.embed)
app.command("bench")(bench.bench)
app.command("perplexity")(perplexity.perplexity)
app.command("test-ops")(testops.test_ops)
app.command("tokenize")(tokenize.tokenize)
app.command("pull")(models.pull)
app.command("models")(models.models)
app.command("info")(models.info)


def run(argv: list[str] | None = None) -> int:
    """`llm` with these arguments (default: the command line); returns the exit status.

    An error is one escaped line on stderr, written plainly: a message quoting a corrupt file
    must neither reach the terminal raw nor cost Rich seconds to wrap."""
    try:
        app(args=argv, prog_name="llm")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except LLMError as e:
        if settings["verbose"]:
            traceback.print_exc()
        sys.stderr.write(f"error: {printable(str(e), MAX_ERROR_CHARS)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
