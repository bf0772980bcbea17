"""Flags read whole, as llama.cpp's tools read them.

llama.cpp's parsers match each argument against the flags as written: `-ngl` is -ngl, `-sp` is
-sp. Click would read an undeclared `-ngl` as `-n gl`, `-sp` as `-s p` and `-oe` as `-o e`, and
then complain about a flag the user never typed, or run with it. Every subcommand's parser first
walks its arguments with the declared flags: an argument that looks like a flag and is not one
of them is refused by its own name (`invalid argument: -ngl`, llama.cpp's words), and a value is
never taken for a flag (`-p -5`)."""

from __future__ import annotations

import re

from typer._click.exceptions import NoSuchOption
from typer.core import TyperCommand

NUMBER = re.compile(r"-\d|-\.\d|-inf$|-nan$")  # a negative value given where an argument is expected


def undeclared(params, args: list[str]) -> str | None:
    """The first argument of `args` that looks like a flag and is none of `params`' (a command's
    parameters, its help option among them), or None."""
    takes_value = {}
    for param in params:
        for name in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())):
            if name.startswith("-"):
                takes_value[name] = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
    value_next = False
    for arg in args:
        if value_next:
            value_next = False
            continue
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-" or NUMBER.match(arg):
            continue
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if name not in takes_value:
            return name
        value_next = takes_value[name] and "=" not in arg
    return None


class LlamaSpelledCommand(TyperCommand):
    """A Typer command whose flags are read whole (module docstring)."""

    def parse_args(self, ctx, args):
        name = undeclared(self.get_params(ctx), args)
        if name is not None:
            raise NoSuchOption(name, ctx=ctx)
        return super().parse_args(ctx, args)
