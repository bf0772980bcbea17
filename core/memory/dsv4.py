"""DeepSeek-V4's memory (llama_kv_cache_dsv4, `--kv dsv4`): a composite of a sliding-window cache
of every layer's raw keys and the compressed rows of the compressed layers (compressed.py).

The window cache is the engine's KVCache with every layer windowed (cells out of every sequence's
window are reused), one stream per sequence as llama.cpp builds it, or one shared stream where
`unified` (llama.cpp ignores --kv-unified here: a FIXME of its). K is V. A compressed layer's view
stores the raw keys in the window cache and asks the compressed part for its compressor inputs and
for the rows beside the window's keys; a ratio-0 layer's view is the window cache's own.

llama.cpp's sequence rules hold: only whole sequences are removed or copied, no position moves, so
no context shift; a removal either child would refuse is refused by both, nothing changed."""

from __future__ import annotations

import numpy as np

from .base import AttnGroup
from .composite import CompositeContext, CompositeMemory
from .compressed import Blocks, CompressedContext, CompressedMemory
from .iswa import swa_cache_size
from .kv_cache import KVCache
from .masks import WindowMask
from .spec import AttnSpec


def window_layout(n_ctx: int, n_seq_max: int, n_swa: int, n_ubatch: int, unified: bool) -> tuple[int, int]:
    """(streams, cells per stream) of the window cache: a window and a ubatch per stream, padded as
    llama.cpp pads; one stream per sequence, or one shared by all of them (a window each)."""
    if unified:
        return 1, swa_cache_size(n_ctx, n_swa, n_seq_max, n_ubatch)
    return n_seq_max, swa_cache_size(n_ctx // n_seq_max, n_swa, 1, n_ubatch)


class DSV4Context(CompositeContext):
    def layer(self, il: int):
        raw = self.parts[self.memory.raw].layer(il)
        if il not in self.memory.compressed.layers:
            return raw
        return CompressedLayerView(raw, self.parts[self.memory.compressed], il, self.memory.raw.xp)


class DSV4Memory(CompositeMemory):
    kind = "dsv4"
    context_class = DSV4Context

    def __init__(self, layers: dict[int, AttnSpec], n_ctx: int, n_seq_max: int, n_ubatch: int, n_swa: int,
                 type_k: str = "f32", unified: bool = False, backend=None):
        n_stream, cells = window_layout(n_ctx, n_seq_max, n_swa, n_ubatch, unified)
        window = WindowMask(n_swa)
        self.raw = KVCache(layers, cells, n_seq_max, n_stream, type_k, type_k, n_swa=n_swa, swa_layers=layers,
                           kind="dsv4-window", producers={il: window for il in layers}, backend=backend)
        compressed = {il: spec for il, spec in layers.items() if spec.compress is not None}
        self.compressed = CompressedMemory(compressed, n_seq_max, n_ctx // n_seq_max, type_k, self.raw.xp)
        # the compressed part first: what it refuses (moving positions, copying a range) it refuses
        # before the window cache has changed
        super().__init__([self.compressed, self.raw])


class CompressedLayerView:
    """A compressed layer's door to the memory: the raw keys go to the window cache; the compressor
    inputs and rows to the compressed part; its groups are the window's with the visible rows."""

    def __init__(self, raw, compressed: CompressedContext, il: int, xp):
        self.raw, self.compressed, self.il, self.xp = raw, compressed, il, xp

    def store(self, k: np.ndarray, v: np.ndarray | None = None, **extra) -> None:
        self.raw.store(k, v)  # the indexer's keys are compressed rows (store_rows), not the tokens'

    def compressor_input(self, kind: str, kv, score) -> Blocks | None:
        return self.compressed.compressor_input(self.il, kind, kv, score)

    def store_rows(self, kind: str, blocks: Blocks, rows) -> None:
        self.compressed.store_rows(self.il, kind, blocks, rows)

    def groups(self) -> list[AttnGroup]:
        return [self.compressed.extend(self.il, group, self.xp) for group in self.raw.groups()]

