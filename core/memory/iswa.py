"""Interleaved sliding-window attention cache (llama_kv_cache_iswa): a full-size cache for the
global layers and a window-sized one for the sliding-window layers, fed the same ubatches (a
composite of two attention caches, composite.py)."""

from __future__ import annotations

from ..errors import InvalidInputError
from .composite import CompositeMemory
from .kv_cache import KVCache
from .spec import AttnSpec

PAD = 256


def swa_cache_size(kv_size: int, n_swa: int, n_seq_max: int, n_ubatch: int) -> int:
    """Room for one window per sequence plus a ubatch, padded like llama.cpp."""
    size = min(kv_size, n_swa * n_seq_max + n_ubatch)
    return -(-size // PAD) * PAD


class KVCacheISWA(CompositeMemory):
    kind = "iswa"

    def __init__(self, layers: dict[int, AttnSpec], swa_layers: set[int], kv_size: int, n_swa: int,
                 n_ubatch: int, n_seq_max: int = 1, type_k: str = "f32", type_v: str = "f32",
                 swa_full: bool = False, producers=None, xp=None, backend=None):
        base_layers = {il: s for il, s in layers.items() if il not in swa_layers}
        window_layers = {il: s for il, s in layers.items() if il in swa_layers}
        swa_size = kv_size if swa_full else swa_cache_size(kv_size, n_swa, n_seq_max, n_ubatch)
        self.swa_full = swa_full
        self.base = KVCache(base_layers, kv_size, n_seq_max, 1, type_k, type_v, kind="iswa-base",
                            producers=producers, xp=xp, backend=backend)
        self.swa = KVCache(window_layers, swa_size, n_seq_max, 1, type_k, type_v, n_swa=n_swa,
                           swa_layers=window_layers, kind="iswa-window", xp=xp, backend=backend)
        super().__init__([self.base, self.swa])

    @property
    def shift_refusal(self) -> str:
        """Shifting needs both caches to hold the same positions, i.e. --swa-full."""
        if self.base.kv_size == self.swa.kv_size:
            return ""
        return "the window cache of --kv iswa is smaller than the full one and has dropped old positions (use --swa-full)"

    def _check_shift(self) -> None:
        if not self.can_shift:
            raise InvalidInputError("positions cannot be shifted in an iSWA cache whose window cache is smaller "
                                    "than the full one; use --swa-full")

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_shift()
        super().seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self._check_shift()
        super().seq_div(seq, p0, p1, d)
