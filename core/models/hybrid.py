"""What hybrid architectures share (Granite 4.0-H, LFM2): a per-layer head_count_kv says which
layers attend (a KV cache) and which are recurrent (a state per sequence, 0 KV heads), and every
layer has a gated FFN after its mixer. The memory is then `--kv hybrid` (memory/composite.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from ..gguf import GGUFFile
from ..memory import MemorySpec, RecurrentSpec
from .base import HParams, Model, read_hparams


@dataclass
class HybridLayer:
    attn_norm: np.ndarray
    mixer: object  # the attention or recurrent weights of the layer
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray
    ffn_down: np.ndarray


class HybridModel(Model):
    ops = ("GET_ROWS", "MUL_MAT", "RMS_NORM", "ROPE", "SWIGLU", "FLASH_ATTN_EXT", "TOP_K", "SSM_CONV", "MUL")

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        n_expert = gguf.get_int(f"{self.arch}.expert_count", 0, lo=0)
        if n_expert:  # Granite 4.0-H Tiny/Small, LFM2-8B-A1B
            raise UnsupportedError(f"{gguf.path}: {self.arch} with a mixture of experts ({n_expert} experts) is not "
                                   "supported yet; the dense models are")
        return read_hparams(gguf, self.arch, hybrid=True)

    def is_recurrent_layer(self, il: int) -> bool:
        return il in self.hparams.recurrent_layers

    @property
    def recurrent_spec(self) -> RecurrentSpec:
        raise NotImplementedError

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        hp = self.hparams
        layers = {il: self.recurrent_spec if self.is_recurrent_layer(il) else self.attention_spec(il, self.uses_rope)
                  for il in range(hp.n_layer)}
        return MemorySpec(layers, hp.n_vocab)

    @property
    def uses_rope(self) -> bool:
        return True

    def load_layer(self, gguf: GGUFFile, il: int) -> HybridLayer:
        """Layer il's norm, mixer and FFN; a missing tensor is named with the kind of layer
        head_count_kv made it."""
        hp = self.hparams
        try:
            mixer = self.load_recurrent(gguf, il) if self.is_recurrent_layer(il) else self.load_attention(gguf, il)
        except ModelFileError as e:
            kind = "recurrent (head_count_kv 0)" if self.is_recurrent_layer(il) else "an attention layer"
            raise ModelFileError(f"{e} (layer {il} is {kind})") from None
        gate_up, down = self.gated_ffn_weights(gguf, il)
        return HybridLayer(attn_norm=self.weight(gguf, f"blk.{il}.attn_norm.weight", (hp.n_embd,)), mixer=mixer,
                           ffn_norm=self.weight(gguf, f"blk.{il}.ffn_norm.weight", (hp.n_embd,)),
                           ffn_gate_up=gate_up, ffn_down=down)

    def load_recurrent(self, gguf: GGUFFile, il: int):
        raise NotImplementedError

    def load_attention(self, gguf: GGUFFile, il: int):
        raise NotImplementedError
