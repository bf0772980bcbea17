"""GLM-5's DSA (`glm-dsa`): DeepSeek-3.2's latent attention, experts and lightning indexer
(deepseek32.py), with what llama.cpp's glm-dsa.cpp does differently:

- per-layer indexer types (`attention.indexer.types`, booleans): a "full" layer has an indexer of
  its own and selects its top-k keys; a "shared" layer has no indexer tensors and attends with the
  selection of the last full layer before it, so the indexer key cache holds the full layers only;
- the indexer's RoPE is NORM (adjacent pairs) on the first n_rot dims, where DeepSeek-3.2's is NEOX;
- its key LayerNorm runs with epsilon 0: llama.cpp never sets one for glm-dsa;
- `expert_gating_func` may be absent: sigmoid.

`value_length_mla` may differ from the nope size (GLM-5: 256 against 192); deepseek2.py reads both.
Rope scaling is refused as for DeepSeek, so YaRN's log-multiplier fix (deepseek32.cpp has it) never
applies.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import ModelFileError
from ..gguf import GGUFFile, describe_value
from ..graph import IndexerInput
from ..memory import MemorySpec
from .base import HParams
from .deepseek2 import MLALayer
from .deepseek32 import DeepSeek32
from .registry import register

GLM52_CONTEXT = 1 << 20  # from this n_ctx_train a file without indexer types is GLM-5.2 (earlier: all full)
GLM52_LAYERS = 78
INDEXER_TENSORS = ("attn_q_b.weight", "attn_k.weight", "k_norm.weight", "k_norm.bias", "proj.weight")


def glm52_full(il: int) -> bool:
    """GLM-5.2's default indexer types (llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES, from the model's
    config.json): layers 0 and 1 full, then every fourth layer from 2 of its 78; later ones shared."""
    return il < 2 or (il < GLM52_LAYERS and il % 4 == 2)


def read_indexer_types(gguf: GGUFFile, key: str, hp: HParams) -> tuple[bool, ...]:
    """Per layer, whether it is full (true) or shared, as llama.cpp reads them: an array of one
    value per layer, or one boolean for all; without the key, by n_ctx_train."""
    value = gguf.metadata.get(key)
    if value is None:
        full = [hp.n_ctx_train < GLM52_CONTEXT or glm52_full(il) for il in range(hp.n_layer)]
    elif isinstance(value, bool):
        full = [value] * hp.n_layer
    elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "biu":
        if len(value) != hp.n_layer:
            raise ModelFileError(f"{gguf.path}: metadata {key} has {len(value)} values but block_count is {hp.n_layer}")
        full = [bool(v) for v in value]
    else:
        raise ModelFileError(f"{gguf.path}: metadata {key} should be an array of booleans (true: a layer with its "
                             f"own indexer), not {describe_value(value)}")
    if not full[0]:
        raise ModelFileError(f"{gguf.path}: metadata {key} makes layer 0 shared, but a shared layer reuses the "
                             "selection of a full layer before it")
    return tuple(full)


@register("glm-dsa")
class GLMDSA(DeepSeek32):
    arch = "glm-dsa"
    gating_default = 2  # sigmoid
    indexer_neox = False
    indexer_norm_eps = 0.0

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = super().load_hparams(gguf)
        key = f"{self.arch}.attention.indexer.types"
        self.full_indexer = read_indexer_types(gguf, key, hp)
        self.selection_source = tuple(max(j for j in range(il + 1) if self.full_indexer[j]) for il in range(hp.n_layer))
        for il in range(hp.n_layer):  # before any weight is read
            missing = [n for n in INDEXER_TENSORS if self.full_indexer[il] and f"blk.{il}.indexer.{n}" not in gguf.tensors]
            if missing:
                raise ModelFileError(f"{gguf.path}: required tensor 'blk.{il}.indexer.{missing[0]}' is missing "
                                     f"({key} makes layer {il} full: it has an indexer of its own)")
        return hp

    def indexer_full(self, il: int) -> bool:
        return self.full_indexer[il]

    def memory_spec(self, attn_impl: str = "mla") -> MemorySpec:
        """DeepSeek-3.2's layout, with indexer keys kept for the full layers only."""
        spec = super().memory_spec(attn_impl)
        return replace(spec, layers={il: layer if self.full_indexer[il] else replace(layer, indexer=None)
                                     for il, layer in spec.layers.items()})

    def indexer_input(self, g, il: int, layer: MLALayer, h, q_a) -> IndexerInput:
        if self.full_indexer[il]:
            return super().indexer_input(g, il, layer, h, q_a)
        return IndexerInput.reusing(self.selection_source[il])
