"""Llama (and SmolLM, Mistral-style dense models): RMSNorm, RoPE, GQA attention, SwiGLU FFN."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from .base import Model
from .registry import register


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray
    wqkv: np.ndarray  # q, k and v projections stacked
    wo: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray  # gate and up projections stacked
    ffn_down: np.ndarray


@register("llama")
class Llama(Model):
    arch = "llama"

    def load_tensors(self, gguf: GGUFFile) -> None:
        hp = self.hparams
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.layers = []
        for il in range(hp.n_layer):
            wqkv, wo = self.attention_weights(gguf, il)
            gate_up, down = self.gated_ffn_weights(gguf, il)
            self.layers.append(LlamaLayer(
                attn_norm=self.weight(gguf, f"blk.{il}.attn_norm.weight", (hp.n_embd,)),
                wqkv=wqkv, wo=wo,
                ffn_norm=self.weight(gguf, f"blk.{il}.ffn_norm.weight", (hp.n_embd,)),
                ffn_gate_up=gate_up, ffn_down=down,
            ))
        self.output_norm = self.weight(gguf, "output_norm.weight", (hp.n_embd,))
        self.output = self.output_head(gguf, self.token_embd)

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        scale = 1.0 / math.sqrt(hp.head_dim_k)
        x = g.inp_embd(self.token_embd)
        for il, layer in enumerate(self.layers):
            q, k, v = self.split_qkv(g.linear(g.norm(x, layer.attn_norm), layer.wqkv))
            attn = g.attn(il, g.rope(q, il), g.rope(k, il), v, scale)
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.linear(attn, layer.wo)
            x = x + g.ffn(g.norm(x, layer.ffn_norm), layer.ffn_gate_up, layer.ffn_down, "swiglu")
            g.cb("l_out", il, x)
        return g.logits(x, self.output_norm, self.output)
