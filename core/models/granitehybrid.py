"""Granite 4.0-H (`granitehybrid`): Mamba-2 layers and attention layers in one stack, every layer
followed by a SwiGLU FFN. A 0 in the per-layer head_count_kv makes a layer Mamba-2.

Granite's four scalars: the input embeddings are multiplied by `embedding_scale`, both branch
outputs of every layer by `residual_scale` before their residual add, attention scores by
`attention.scale` (instead of 1/√head_dim), and the logits divided by `logit_scale`. RoPE (plain
pairs) is on unless `rope.scaling.finetuned` is false, the switch Granite's conversions use."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..memory import RecurrentSpec
from .base import HParams
from .hybrid import HybridModel
from .mamba import check_ssm_shapes, read_ssm_hparams
from .mamba2 import Mamba2Mixer
from .registry import register


@dataclass
class GraniteScales:
    embedding: float
    residual: float
    attention: float  # replaces 1/√head_dim
    logit: float
    rope: bool


@dataclass
class AttentionWeights:
    wqkv: np.ndarray
    wo: np.ndarray


@register("granitehybrid")
class GraniteHybrid(HybridModel):
    arch = "granitehybrid"
    ops = (*HybridModel.ops, "SSM_SCAN", "SILU", "RMS_NORM_GROUP", "SCALE")

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = super().load_hparams(gguf)
        ssm = read_ssm_hparams(gguf, self.arch)
        check_ssm_shapes(gguf, ssm)
        self.mamba2 = Mamba2Mixer.of(ssm)
        key = lambda name: f"{self.arch}.{name}"  # noqa: E731
        scale = lambda name, default: gguf.get_float(key(name), default, hi=1e6, positive=True)  # noqa: E731
        self.scales = GraniteScales(
            embedding=scale("embedding_scale", 1.0), residual=scale("residual_scale", 1.0),
            attention=scale("attention.scale", 1.0 / math.sqrt(hp.head_dim_k)), logit=scale("logit_scale", 1.0),
            rope=gguf.get_bool(key("rope.scaling.finetuned"), True))
        return hp

    @property
    def recurrent_spec(self) -> RecurrentSpec:
        return self.mamba2.spec

    @property
    def uses_rope(self) -> bool:
        return self.scales.rope

    def load_recurrent(self, gguf: GGUFFile, il: int):
        return self.mamba2.load(self, gguf, il)

    def load_attention(self, gguf: GGUFFile, il: int) -> AttentionWeights:
        return AttentionWeights(*self.attention_weights(gguf, il))

    def attention(self, g, il: int, w: AttentionWeights, x: np.ndarray) -> np.ndarray:
        q, k, v = self.split_qkv(g.linear(x, w.wqkv))
        if self.scales.rope:
            q, k = g.rope(q, il), g.rope(k, il)
        return g.linear(g.attn(il, q, k, v, self.scales.attention), w.wo)

    def forward(self, g) -> np.ndarray:
        hp, residual = self.hparams, np.float32(self.scales.residual)
        x = g.inp_embd(self.token_embd, scale=self.scales.embedding)
        for il, layer in enumerate(self.layers):
            h = g.norm(x, layer.attn_norm)
            h = self.mamba2(g, il, layer.mixer, h) if self.is_recurrent_layer(il) else self.attention(g, il, layer.mixer, h)
            if il == hp.n_layer - 1:
                h, x = g.select_outputs(h, x)
            x = h * residual + x
            h = g.ffn(g.norm(x, layer.ffn_norm), layer.ffn_gate_up, layer.ffn_down, "swiglu")
            x = g.cb("l_out", il, h * residual + x)
        logits = g.logits(x, self.output_norm, self.output)
        if not g.embeddings:
            logits *= np.float32(1.0) / np.float32(self.scales.logit)
        return logits



