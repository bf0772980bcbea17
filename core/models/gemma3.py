"""Gemma 3: scaled embeddings, q/k RMSNorm, pre- and post-norms, GeGLU, and interleaved
sliding-window attention (5 local layers with their own RoPE base, then 1 global)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..batch import POS_LIMIT
from ..gguf import GGUFFile
from .base import HParams, Model, read_hparams
from .registry import register

SWA_PATTERN = 6  # every 6th layer is global
ROPE_BASE_LOCAL = 10000.0


@dataclass
class Gemma3Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    wo: np.ndarray
    post_attn_norm: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray
    ffn_down: np.ndarray
    post_ffn_norm: np.ndarray


@register("gemma3")
class Gemma3(Model):
    arch = "gemma3"
    ops = ("GET_ROWS", "MUL_MAT", "RMS_NORM", "ROPE", "GEGLU", "FLASH_ATTN_EXT", "TOP_K")

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch)
        hp.rope_neox = True
        hp.n_swa = gguf.get_int("gemma3.attention.sliding_window", 0, hi=POS_LIMIT)
        if hp.n_swa > 0:
            hp.swa_layers = frozenset(il for il in range(hp.n_layer) if il % SWA_PATTERN < SWA_PATTERN - 1)
            hp.rope_freq_base_swa = ROPE_BASE_LOCAL
        return hp

    def load_tensors(self, gguf: GGUFFile) -> None:
        hp = self.hparams
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.layers = []
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            wqkv, wo = self.attention_weights(gguf, il)
            gate_up, down = self.gated_ffn_weights(gguf, il)
            self.layers.append(Gemma3Layer(
                attn_norm=self.weight(gguf, f"{blk}.attn_norm.weight", (hp.n_embd,)),
                wqkv=wqkv, wo=wo,
                q_norm=self.weight(gguf, f"{blk}.attn_q_norm.weight", (hp.head_dim_k,)),
                k_norm=self.weight(gguf, f"{blk}.attn_k_norm.weight", (hp.head_dim_k,)),
                post_attn_norm=self.weight(gguf, f"{blk}.post_attention_norm.weight", (hp.n_embd,)),
                ffn_norm=self.weight(gguf, f"{blk}.ffn_norm.weight", (hp.n_embd,)),
                ffn_gate_up=gate_up, ffn_down=down,
                post_ffn_norm=self.weight(gguf, f"{blk}.post_ffw_norm.weight", (hp.n_embd,)),
            ))
        self.output_norm = self.weight(gguf, "output_norm.weight", (hp.n_embd,))
        self.output = self.output_head(gguf, self.token_embd)

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        # the query scale (query_pre_attn_scalar) is applied to q; attention itself scales by 1
        q_scale = np.float32(1.0 / math.sqrt(hp.head_dim_k))
        x = g.inp_embd(self.token_embd, scale=math.sqrt(hp.n_embd))
        for il, layer in enumerate(self.layers):
            q, k, v = self.split_qkv(g.linear(g.norm(x, layer.attn_norm), layer.wqkv))
            q, k = g.norm(q, layer.q_norm), g.norm(k, layer.k_norm)
            attn = g.attn(il, g.rope(q, il) * q_scale, g.rope(k, il), v, scale=1.0)
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.norm(g.linear(attn, layer.wo), layer.post_attn_norm)
            h = g.ffn(g.norm(x, layer.ffn_norm), layer.ffn_gate_up, layer.ffn_down, "geglu")
            x = g.cb("l_out", il, x + g.norm(h, layer.post_ffn_norm))
        return g.logits(x, self.output_norm, self.output)
