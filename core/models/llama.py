"""Llama (and SmolLM, Mistral-style dense models): RMSNorm, RoPE, GQA attention, SwiGLU FFN; with
`expert_count` in the GGUF, Mixtral's mixture of experts (softmax router, top-k, weights renormalized)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..moe import MoEWeights, load_moe, read_moe_params
from .base import HParams, Model, read_hparams
from .registry import register


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray
    wqkv: np.ndarray  # q, k and v projections stacked
    wo: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray | None  # gate and up projections stacked (dense layers)
    ffn_down: np.ndarray | None
    moe: MoEWeights | None = None
    q_norm: np.ndarray | None = None  # per-head q/k RMSNorm weights (qwen3), shared by the heads
    k_norm: np.ndarray | None = None


@register("llama")
class Llama(Model):
    arch = "llama"

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch)
        hp.moe = read_moe_params(gguf, self.arch, hp.n_ff, norm_weights=True)
        return hp

    def load_layer(self, gguf: GGUFFile, il: int) -> LlamaLayer:
        hp = self.hparams
        wqkv, wo = self.attention_weights(gguf, il)
        moe = load_moe(self, gguf, f"blk.{il}", hp.moe, hp.n_embd) if hp.moe else None
        gate_up, down = (None, None) if moe else self.gated_ffn_weights(gguf, il)
        return LlamaLayer(
            attn_norm=self.weight(gguf, f"blk.{il}.attn_norm.weight", (hp.n_embd,)),
            wqkv=wqkv, wo=wo,
            ffn_norm=self.weight(gguf, f"blk.{il}.ffn_norm.weight", (hp.n_embd,)),
            ffn_gate_up=gate_up, ffn_down=down, moe=moe,
        )

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        scale = 1.0 / math.sqrt(hp.head_dim_k)
        x = g.inp_embd(self.token_embd)
        for il, layer in enumerate(self.layers):
            q, k, v = self.split_qkv(g.linear(g.norm(x, layer.attn_norm), layer.wqkv))
            if layer.q_norm is not None:
                q, k = g.norm(q, layer.q_norm), g.norm(k, layer.k_norm)
            attn = g.attn(il, g.rope(q, il), g.rope(k, il), v, scale)
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.linear(attn, layer.wo)
            h = g.norm(x, layer.ffn_norm)
            x = x + (g.moe(h, hp.moe, layer.moe, il=il) if layer.moe else
                     g.ffn(h, layer.ffn_gate_up, layer.ffn_down, "swiglu"))
            g.cb("l_out", il, x)
        return g.logits(x, self.output_norm, self.output)
