"""Plugins: a Python file (`--plugin FILE.py`) or an installed package (entry-point group
`llmsuite.plugins`) that registers, through the decorators below, a memory kind (`--kv NAME`), a
mask producer (`--attn-mask NAME`), a sampler (`--samplers ...;NAME`) or an architecture (a GGUF
`general.architecture`). Every tool takes a registered name as it takes a built-in one.

Each registry remembers where its names came from (`origin`), so an error at run time names the
plugin, and a second registration of a name, built-in or not, is refused."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

from .errors import LLMError

ENTRY_POINT_GROUP = "llmsuite.plugins"
BUILTIN = "built-in"

# (registry, name) -> where it was registered: BUILTIN, a plugin file, or an entry point
_origins: dict[tuple[str, str], str] = {}
_loading: list[str] = []  # the plugin being loaded (innermost last)
_loaded: set[str] = set()  # plugin files and entry points loaded in this process


class PluginError(LLMError):
    """A plugin that cannot be loaded, or that failed at run time; the message names it."""


def register(registry: str, name: str, table: dict, value) -> None:
    """Put `value` in `table` under `name`, remembering who registered it; a taken name is refused."""
    where = _loading[-1] if _loading else BUILTIN
    if not isinstance(name, str) or not name or any(c in name for c in ",; \t\n"):
        raise PluginError(f"{where}: {registry} name {name!r} must be a non-empty word (no commas, ';' or spaces)")
    if name in table:
        raise PluginError(f"{where}: registers the {registry} '{name}', which already exists "
                          f"(from {_origins.get((registry, name), BUILTIN)})")
    table[name] = value
    _origins[(registry, name)] = where


def origin(registry: str, name: str) -> str:
    """Where `name` came from: BUILTIN, a plugin file or an entry point."""
    return _origins.get((registry, name), BUILTIN)


def from_plugin(registry: str, name: str) -> bool:
    return origin(registry, name) != BUILTIN


def describe(registry: str, name: str) -> str:
    """"memory kind 'streaming' (plugin streaming_llm.py)", for run-time errors."""
    where = origin(registry, name)
    return f"{registry} '{name}'" + ("" if where == BUILTIN else f" (plugin {Path(where).name})")


@contextmanager
def _registering(where: str):
    _loading.append(where)
    try:
        yield
    finally:
        _loading.pop()


def load_plugin(path: str | Path) -> None:
    """Run a plugin file once; its decorators register what it defines. Every failure is one
    PluginError naming the file."""
    path = Path(path)
    key = str(path.resolve())
    if key in _loaded:
        return
    if not path.is_file():
        raise PluginError(f"plugin {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"llmsuite_plugin_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    with _registering(str(path)):
        try:
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        except PluginError:
            sys.modules.pop(spec.name, None)
            raise
        except BaseException as e:  # a syntax error, a failed import, a raise while registering
            sys.modules.pop(spec.name, None)
            if isinstance(e, KeyboardInterrupt):
                raise
            raise PluginError(f"plugin {path} failed to load: {type(e).__name__}: {e}") from e
    _loaded.add(key)


def load_installed() -> None:
    """Load every installed plugin (entry-point group `llmsuite.plugins`): the entry point names a
    module, whose import registers, or a function, called with no arguments."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name} = {ep.value}"
        if where in _loaded:
            continue
        with _registering(where):
            try:
                target = ep.load()
                if callable(target):
                    target()
            except PluginError:
                raise
            except Exception as e:
                raise PluginError(f"installed plugin {ep.name} ({ep.value}) failed to load: "
                                  f"{type(e).__name__}: {e}") from e
        _loaded.add(where)


def plugin_files(argv: list[str]) -> list[str]:
    """The files of every `--plugin FILE` / `--plugin=FILE` on a command line, in order."""
    files = []
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif arg.startswith("--plugin="):
            files.append(arg.split("=", 1)[1])
    return files
