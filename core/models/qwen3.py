"""Qwen3: Llama's block with each head's q and k RMS-normed before RoPE (NEOX), and a head size
of its own (`attention.key_length`, not n_embd / n_head)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from .base import HParams, Model, read_hparams
from .registry import register


@dataclass
class Qwen3Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray
    wo: np.ndarray
    q_norm: np.ndarray  # (head_dim,), shared by the heads
    k_norm: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray
    ffn_down: np.ndarray


@register("qwen3")
class Qwen3(Model):
    arch = "qwen3"

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch)
        hp.rope_neox = True
        return hp

    def load_tensors(self, gguf: GGUFFile) -> None:
        hp = self.hparams
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.layers = []
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            wqkv, wo = self.attention_weights(gguf, il)
            gate_up, down = self.gated_ffn_weights(gguf, il)
            self.layers.append(Qwen3Layer(
                attn_norm=self.weight(gguf, f"{blk}.attn_norm.weight", (hp.n_embd,)),
                wqkv=wqkv, wo=wo,
                q_norm=self.weight(gguf, f"{blk}.attn_q_norm.weight", (hp.head_dim_k,)),
                k_norm=self.weight(gguf, f"{blk}.attn_k_norm.weight", (hp.head_dim_k,)),
                ffn_norm=self.weight(gguf, f"{blk}.ffn_norm.weight", (hp.n_embd,)),
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
            q, k = g.norm(q, layer.q_norm), g.norm(k, layer.k_norm)
            attn = g.attn(il, g.rope(q, il), g.rope(k, il), v, scale)
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.linear(attn, layer.wo)
            x = x + g.ffn(g.norm(x, layer.ffn_norm), layer.ffn_gate_up, layer.ffn_down, "swiglu")
            g.cb("l_out", il, x)
        return g.logits(x, self.output_norm, self.output)
