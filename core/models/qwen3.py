"""Qwen3: Llama's block with each head's q and k RMS-normed before RoPE (NEOX), and a head size
of its own (`attention.key_length`, not n_embd / n_head)."""

from __future__ import annotations

from ..gguf import GGUFFile
from .base import HParams
from .llama import Llama, LlamaLayer
from .registry import register


@register("qwen3")
class Qwen3(Llama):
    arch = "qwen3"

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = super().load_hparams(gguf)
        hp.rope_neox = True
        return hp

    def load_layer(self, gguf: GGUFFile, il: int) -> LlamaLayer:
        layer = super().load_layer(gguf, il)
        head_dim = (self.hparams.head_dim_k,)
        layer.q_norm = self.weight(gguf, f"blk.{il}.attn_q_norm.weight", head_dim)
        layer.k_norm = self.weight(gguf, f"blk.{il}.attn_k_norm.weight", head_dim)
        return layer
