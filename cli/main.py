"""The `llm` command: subcommands are registered here; errors become one sentence on stderr."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from llmsuite.core import plugins
from llmsuite.core.errors import LLMError, printable

from . import batched_bench, bench, embed, generate, models, perplexity, testops, tokenize
from .common import settings
from .options import Plugin, fill_choices, with_plugin_option
from .spelling import LlamaSpelledCommand

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
def _options(verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log details; tracebacks on errors")] = False,
             plugin: Plugin = None):
    settings["verbose"] = verbose


COMMANDS = {"generate": generate.generate, "chat": generate.chat, "embed": embed.embed, "bench": bench.bench,
            "batched-bench": batched_bench.batched_bench,
            "perplexity": perplexity.perplexity, "test-ops": testops.test_ops, "tokenize": tokenize.tokenize,
            "pull": models.pull, "models": models.models, "info": models.info}
for _name, _command in COMMANDS.items():
    app.command(_name, cls=LlamaSpelledCommand)(with_plugin_option(_command))


def run(argv: list[str] | None = None) -> int:
    """`llm` with these arguments (default: the command line); returns the exit status.

    An error is one escaped line on stderr, written plainly: a message quoting a corrupt file
    must neither reach the terminal raw nor cost Rich seconds to wrap. Usage errors (an unknown
    option, a value of the wrong kind) are one line too, as llama.cpp's tools print them."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        load_plugins(argv)
        status = command().main(args=argv, prog_name="llm", standalone_mode=False)
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


def load_plugins(argv: list[str]) -> None:
    """Installed plugins, then each --plugin FILE of the command line, before the command line is
    parsed: their names are then valid values and appear in --help."""
    plugins.load_installed()
    for path in plugins.plugin_files(argv):
        plugins.load_plugin(path)


def command():
    """The Click command for `app`, with the registered names (built-in and plugins') in the help
    texts that list them."""
    group = typer.main.get_command(app)
    fill_choices(group)
    return group


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
