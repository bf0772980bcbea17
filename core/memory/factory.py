"""Choosing the memory class from the flags (`--kv`, `--ctx`, `--swa-full`, cache types, `-np`),
refusing combinations that cannot apply with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError
from .base import Memory
from .iswa import KVCacheISWA, swa_cache_size
from .kv_cache import KVCache, LayerShape
from .none import NoKVMemory
from .storage import CACHE_TYPES, check_cache_type, row_bytes

KV_KINDS = ("auto", "unified", "split", "iswa", "none")
CTX_KINDS = ("auto", "decoder", "encoder", "no-kv")
MAX_SEQ = 256


@dataclass
class MemoryParams:
    n_ctx: int = 0
    n_ubatch: int = 512
    n_seq_max: int = 1
    type_k: str = "f32"
    type_v: str = "f32"
    swa_full: bool = False
    kv: str = "auto"
    ctx: str = "auto"

    def validate_flags(self) -> None:
        """The checks that hold whatever the model."""
        if self.kv not in KV_KINDS:
            raise InvalidInputError(f"unknown --kv '{self.kv}' (choose from {', '.join(KV_KINDS)})")
        if self.ctx not in CTX_KINDS:
            raise InvalidInputError(f"unknown --ctx '{self.ctx}' (choose from {', '.join(CTX_KINDS)})")
        if not 1 <= self.n_seq_max <= MAX_SEQ:
            raise InvalidInputError(f"-np must be between 1 and {MAX_SEQ}")
        for flag, type_name in (("--cache-type-k", self.type_k), ("--cache-type-v", self.type_v)):
            if type_name not in CACHE_TYPES:
                raise InvalidInputError(f"{flag} {type_name} is not supported (choose from {', '.join(CACHE_TYPES)})")
        if self.ctx == "no-kv" and self.kv not in ("auto", "none"):
            raise InvalidInputError(f"--ctx no-kv recomputes the prefix without a cache, so --kv {self.kv} cannot apply")
        if self.ctx == "decoder" and self.kv == "none":
            raise InvalidInputError("--ctx decoder decodes over a cache; use --ctx no-kv to run without one")
        if self.swa_full and self.kv not in ("auto", "iswa"):
            raise InvalidInputError(f"--swa-full sizes the window cache of --kv iswa; --kv {self.kv} has none")


def resolve_kinds(arch: str, has_swa: bool, p: MemoryParams) -> tuple[str, str]:
    """(memory kind, context kind) for a decoder-only model, or InvalidInputError saying why not."""
    p.validate_flags()
    if p.ctx == "encoder":
        raise InvalidInputError(f"--ctx encoder needs an encoder model; {arch} is a causal decoder")
    kv = p.kv
    if kv == "auto":
        kv = "none" if p.ctx == "no-kv" else ("iswa" if has_swa else "unified")
    if kv == "iswa" and not has_swa:
        raise InvalidInputError(f"--kv iswa needs sliding-window layers; {arch} has none")
    if p.swa_full and not has_swa:
        raise InvalidInputError(f"--swa-full applies to sliding-window models; {arch} has none")
    if kv == "split" and p.n_ctx // p.n_seq_max < 1:
        raise InvalidInputError(f"-c {p.n_ctx} cannot be split into {p.n_seq_max} sequences")
    return kv, ("no-kv" if kv == "none" else "decoder")


def create_memory(hp, arch: str, p: MemoryParams, xp=np) -> Memory:
    """The memory for a decoder-only transformer with hyper-parameters `hp`, its rows in `xp` arrays."""
    has_swa = hp.n_swa > 0 and bool(hp.swa_layers)
    kv, _ = resolve_kinds(arch, has_swa, p)
    for type_name, dim in ((p.type_k, hp.n_embd_k_gqa), (p.type_v, hp.n_embd_v_gqa)):
        check_cache_type(type_name, dim)
    layers = {il: LayerShape(hp.n_head_kv, hp.head_dim_k, hp.head_dim_v) for il in range(hp.n_layer)}
    swa = dict(n_swa=hp.n_swa, swa_layers=hp.swa_layers) if has_swa else {}
    check_fits(cache_bytes(hp, kv, p), p.n_ctx, xp)
    if kv == "none":
        return NoKVMemory(p.n_seq_max, n_vocab=hp.n_vocab, **swa)
    if kv == "iswa":
        return KVCacheISWA(layers, set(hp.swa_layers), p.n_ctx, hp.n_swa, p.n_ubatch, p.n_seq_max,
                           p.type_k, p.type_v, p.swa_full, xp=xp)
    if kv == "split":
        return KVCache(layers, p.n_ctx // p.n_seq_max, p.n_seq_max, p.n_seq_max, p.type_k, p.type_v,
                       kind="split", xp=xp, **swa)
    return KVCache(layers, p.n_ctx, p.n_seq_max, 1, p.type_k, p.type_v, kind="unified", xp=xp, **swa)


def cache_bytes(hp, kv: str, p: MemoryParams) -> int:
    """What the cache of kind `kv` will take, computed before anything is allocated."""
    if kv == "none":
        return 0
    per_cell = row_bytes(p.type_k, hp.n_embd_k_gqa) + row_bytes(p.type_v, hp.n_embd_v_gqa)
    n_window_layers = len(hp.swa_layers) if kv == "iswa" else 0
    window_cells = p.n_ctx if p.swa_full else swa_cache_size(p.n_ctx, hp.n_swa, p.n_seq_max, p.n_ubatch)
    return per_cell * ((hp.n_layer - n_window_layers) * p.n_ctx + n_window_layers * window_cells)


def check_fits(n_bytes: int, n_ctx: int, xp) -> None:
    available = available_memory(xp)
    if available is not None and n_bytes > available:
        raise InvalidInputError(f"a context of {n_ctx} cells (-c) needs {n_bytes / 2**30:.1f} GiB of KV cache, "
                                f"more than the {available / 2**30:.1f} GiB of memory available; give a smaller -c")


def available_memory(xp) -> int | None:
    """Bytes free where the cache would live: the device's memory for CuPy; else the system's
    MemAvailable, or less where the process's address space is capped (ulimit -v)."""
    if xp is not np:
        return int(xp.cuda.runtime.memGetInfo()[0])
    status = _proc_fields("/proc/meminfo", "MemAvailable") | _proc_fields("/proc/self/status", "VmSize")
    available = status.get("MemAvailable")
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap != resource.RLIM_INFINITY and "VmSize" in status:
            room = cap - status["VmSize"]
            available = room if available is None else min(available, room)
    except ImportError:
        pass
    return available


def _proc_fields(path: str, *names: str) -> dict[str, int]:
    """Fields given in kB from a /proc file, in bytes ({} where there is no /proc)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    fields = (line.split() for line in lines)
    return {f[0].rstrip(":"): int(f[1]) * 1024 for f in fields if len(f) >= 2 and f[0].rstrip(":") in names}
