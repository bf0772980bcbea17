"""LFM2 (`lfm2`): gated short-convolution layers and attention layers in one stack, every layer
followed by a SwiGLU FFN. A 0 in the per-layer head_count_kv makes a layer a short convolution.

The short convolution: the in-projection gives B | C | x; B ⊙ x runs through a causal depthwise
conv of `shortconv.l_cache` taps (no bias, no activation; its state is the last l_cache - 1 inputs,
and there is no SSM state), and C gates the result before the out-projection. Attention layers
RMS-norm each head's q and k before NEOX RoPE. The final norm is stored as `token_embd_norm`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..memory import RecurrentSpec
from .base import HParams
from .hybrid import HybridModel
from .registry import register

MAX_CONV_TAPS = 1 << 10


@dataclass
class ShortConvWeights:
    in_proj: np.ndarray  # B | C | x
    conv_w: np.ndarray  # (n_embd, l_cache)
    out_proj: np.ndarray


@dataclass
class AttentionWeights:
    wqkv: np.ndarray
    wo: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray


@register("lfm2")
class LFM2(HybridModel):
    arch = "lfm2"
    output_norm_name = "token_embd_norm.weight"  # llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = super().load_hparams(gguf)
        hp.rope_neox = True
        self.l_cache = gguf.get_int(f"{self.arch}.shortconv.l_cache", lo=2, hi=MAX_CONV_TAPS)
        return hp

    @property
    def recurrent_spec(self) -> RecurrentSpec:
        return RecurrentSpec((self.l_cache - 1, self.hparams.n_embd))

    def load_recurrent(self, gguf: GGUFFile, il: int) -> ShortConvWeights:
        n_embd, blk = self.hparams.n_embd, f"blk.{il}.shortconv"
        return ShortConvWeights(
            in_proj=self.weight(gguf, f"{blk}.in_proj.weight", (3 * n_embd, n_embd)),
            conv_w=self.weight(gguf, f"{blk}.conv.weight", (n_embd, self.l_cache), matrix=False),
            out_proj=self.weight(gguf, f"{blk}.out_proj.weight", (n_embd, n_embd)))

    def load_attention(self, gguf: GGUFFile, il: int) -> AttentionWeights:
        head_dim = (self.hparams.head_dim_k,)
        wqkv, wo = self.attention_weights(gguf, il)
        return AttentionWeights(wqkv, wo, self.weight(gguf, f"blk.{il}.attn_q_norm.weight", head_dim),
                                self.weight(gguf, f"blk.{il}.attn_k_norm.weight", head_dim))

    def short_conv(self, g, il: int, w: ShortConvWeights, x: np.ndarray) -> np.ndarray:
        rs = g.rs(il)
        conv_state, no_ssm_state = rs.read()
        bcx = g.linear(x, w.in_proj)
        n = self.hparams.n_embd
        b, c, xx = bcx[:, :n], bcx[:, n:2 * n], bcx[:, 2 * n:]
        conv, conv_state = g.ops.ssm_conv(b * xx, conv_state, w.conv_w, rs.seq_index)
        rs.write(conv_state, no_ssm_state)
        return g.linear(c * conv, w.out_proj)

    def attention(self, g, il: int, w: AttentionWeights, x: np.ndarray) -> np.ndarray:
        q, k, v = self.split_qkv(g.linear(x, w.wqkv))
        q, k = g.norm(q, w.q_norm), g.norm(k, w.k_norm)
        scale = 1.0 / math.sqrt(self.hparams.head_dim_k)
        return g.linear(g.attn(il, g.rope(q, il), g.rope(k, il), v, scale), w.wo)

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        x = g.inp_embd(self.token_embd)
        for il, layer in enumerate(self.layers):
            h = g.norm(x, layer.attn_norm)
            mix = self.short_conv if self.is_recurrent_layer(il) else self.attention
            h = mix(g, il, layer.mixer, h)
            if il == hp.n_layer - 1:
                h, x = g.select_outputs(h, x)
            x = x + h
            x = g.cb("l_out", il, x + g.ffn(g.norm(x, layer.ffn_norm), layer.ffn_gate_up, layer.ffn_down, "swiglu"))
        return g.logits(x, self.output_norm, self.output)
