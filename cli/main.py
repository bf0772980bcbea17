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
app.command("chat")(generate.chat)
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
    must neither reach the terminal raw nor cost Rich seconds to wrap. Usage errors (an unknown
    option, a value of the wrong kind) are one line too, as llama.cpp's tools print them."""
    try:
        status = app(args=argv, prog_name="llm", standalone_mode=False)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except LLMError as e:
        if settings["verbose"]:
            traceback.print_exc()
        sys.stderr.write(f"error: {printable(str(e), MAX_ERROR_CHARS)}\n")
        return 1
    except Exception as e:
        if type(e).__name__ == "Abort":  # Click turns Ctrl-C (and EOF at a prompt) into Abort
            sys.stderr.write("interrupted\n")
            return 130
        if not is_usage_error(e):
            raise
        message = usage_message(e)
        if message:  # none where the usage (help) was printed instead
            sys.stderr.write(f"error: {printable(message, MAX_ERROR_CHARS)}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    return status if isinstance(status, int) else 0


def is_usage_error(e: Exception) -> bool:
    """Click's (or Typer's own copy of Click's) parse errors: they carry a message and an exit code."""
    return hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)


def usage_message(e: Exception) -> str:
    """One line in llama.cpp's words: `invalid argument: -ngl` for an option nobody declared."""
    option = getattr(e, "option_name", None)
    if type(e).__name__ == "NoSuchOption" and option:
        return f"invalid argument: {option}"
    message = " ".join(e.format_message().split())
    return message[:1].lower() + message[1:]


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
