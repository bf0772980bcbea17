"""The `llm` command: subcommands are registered here; errors become one sentence on stderr."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from llmsuite.core.errors import LLMError

from . import bench, generate, models, perplexity, testops, tokenize
from .common import err_console, settings

app = typer.Typer(
    name="llm",
    help="llama.cpp's tools over a hackable Python engine: generate, bench, perplexity, test-ops, tokenize, pull, models, info.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log details; tracebacks on errors")] = False):
    settings["verbose"] = verbose


app.command("generate")(generate.generate)
app.command("bench")(bench.bench)
app.command("perplexity")(perplexity.perplexity)
app.command("test-ops")(testops.test_ops)
app.command("tokenize")(tokenize.tokenize)
app.command("pull")(models.pull)
app.command("models")(models.models)
app.command("info")(models.info)


def main() -> None:
    try:
        app()
    except LLMError as e:
        if settings["verbose"]:
            traceback.print_exc()
        err_console.print(f"error: {e}", markup=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted", markup=False)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
