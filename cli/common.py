"""What every subcommand shares: the stderr console, Rich progress, model loading."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from llmsuite.core import hub
from llmsuite.core.backend import get_backend
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.api import load
from llmsuite.core.models import Model

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
settings = {"verbose": False}  # set by `llm -v`


def log(message: str) -> None:
    """Informational lines on stderr, shown with -v."""
    if settings["verbose"]:
        err_console.print(message, markup=False)


class RichReporter:
    """hub.Reporter on a Rich progress display (stderr, only when it is a terminal)."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def task(self, description: str, total: int | None):
        task_id = self.progress.add_task(description, total=total)
        return _RichTask(self.progress, task_id)


class _RichTask:
    def __init__(self, progress: Progress, task_id):
        self.progress, self.task_id = progress, task_id

    def advance(self, n: int) -> None:
        self.progress.advance(self.task_id, n)


@contextmanager
def progress_display():
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TimeRemainingColumn(), console=err_console, transient=True,
                        disable=not err_console.is_terminal)
    with progress:
        yield progress


def ready_backend(name: str, numerics: str | None = None):
    """The backend, refused early if it cannot run; cuda-emu's first build of the host kernels
    (seconds, once per source) shows as progress."""
    with progress_display() as progress:
        task = progress.add_task(f"starting the {name} backend", total=None)
        return get_backend(name, numerics=numerics, progress=lambda message: progress.update(task, description=message))


def resolve(spec: str | None) -> Path:
    with progress_display() as progress:
        return hub.resolve_model(spec, RichReporter(progress))


def open_model(spec: str | None, backend: str = "cpu", cache_types=("f16",), numerics: str | None = None) -> tuple[Model, float]:
    """Resolve `-m`, load the model for `backend` with a progress bar and ready the kernels it,
    these KV-cache types and these numerics need (llmsuite.load); returns (model, load seconds)."""
    path = resolve(spec)
    t0 = time.perf_counter()
    with progress_display() as progress:
        task = progress.add_task(f"loading {path.name}", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)
            if done == total:
                progress.update(task, description="preparing cpu kernels (numba compiles them once per machine)",
                                total=None)

        model = load(path, backend=backend, numerics=numerics, cache_types=cache_types, progress=report)
    for note in model.backend.notes:
        log(note)
    log(f"backend {model.backend.name}: {model.backend.describe()}")  # on the cpu: which integer paths run
    return model, time.perf_counter() - t0


def exit_interrupted(note: str) -> NoReturn:
    """After Ctrl-C, once the results so far are printed: one line on what they cover, exit 130
    (as a shell reports SIGINT)."""
    sys.stdout.flush()
    err_console.print(f"interrupted: {note}", markup=False)
    raise typer.Exit(130)


def read_text_file(path: Path) -> str:
    """Read a prompt file like llama.cpp's -f: UTF-8, one trailing newline removed."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a directory") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"{path}: is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text
