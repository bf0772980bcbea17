"""Files written whole or not at all: a state file or a KL-divergence base replaces the previous one
only once it is complete, so an interrupt, a full disk or an error halfway leaves the old file as it
was (llama.cpp writes these in place)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import LLMError


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: a temporary file beside it, flushed and fsynced, then
    renamed over `path`. On any failure the temporary file is removed and `path` is untouched; an
    OSError (a full disk, a file-size limit, no permission) becomes one sentence saying so."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as e:
        raise LLMError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        os.fchmod(fd, _new_file_mode())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_directory(path.parent)
    except BaseException as e:
        with suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise LLMError(f"could not write {path} ({e.strerror or e}); the previous file is unchanged") from None
        raise


def write_atomic(path: str | Path, data: bytes) -> None:
    """`path` holds `data`, or (on failure) what it held before."""
    with atomic_writer(path) as f:
        f.write(data)


def _new_file_mode() -> int:
    """The mode a plain open() would give a new file (0666 less the umask), not mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (where the platform lets a directory be opened)."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
