"""DeepSeek-V3.2: DeepSeek-V3's MLA and experts, with DSA sparse attention. Per layer a lightning
indexer scores every cached key for each query and the attention keeps the best `indexer.top_k`:

    q_idx = W_q_idx · (normed low-rank q)        n_idx_head heads of d_idx, NEOX RoPE on the first dims
    k_idx = LayerNorm(W_k_idx · x)               one head, RoPE likewise, cached beside the latent (--kv dsa)
    w     = W_proj · x / √(d_idx · n_idx_head)   a weight per indexer head
    score(t, j) = Σ_h w[t, h]·ReLU(q_idx[t, h]·k_idx[j])

Like llama.cpp, q_idx and k_idx are multiplied by the orthonormal Hadamard matrix and the keys
cached (f16 by default) in that basis. The scores are the same without it, but the rounding of the
cached keys is not, and the top-k sits on score gaps as small as 1e-4: in the rotated basis, with
--numerics ggml, the selections equal llama.cpp's at every position whose gap is ≥ 1e-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError
from ..gguf import GGUFFile
from ..graph import IndexerInput
from ..memory.masks import hadamard
from ..memory.spec import IndexerSpec, RopeSpec
from .base import HParams
from .deepseek2 import DeepSeek2, MLALayer
from .registry import register


@dataclass(frozen=True)
class IndexerParams:
    n_head: int
    head_dim: int
    top_k: int


@dataclass
class IndexerWeights:
    wq: np.ndarray  # (n_head·head_dim, q_lora)
    wk: np.ndarray  # (head_dim, n_embd)
    k_norm: np.ndarray
    k_norm_bias: np.ndarray
    proj: np.ndarray  # (n_head, n_embd)


@register("deepseek32")
class DeepSeek32(DeepSeek2):
    arch = "deepseek32"
    ops = DeepSeek2.ops + ("NORM",)  # the indexer's key norm
    attn_impls = ("mla",)  # the indexer selects among latent cells
    gating_default = None  # llama.cpp requires expert_gating_func here
    indexer_neox = True  # the indexer's RoPE mode on the first n_rot dims of its heads
    indexer_norm_eps = 1e-6  # llama.cpp hard-codes the indexer's LayerNorm epsilon

    def indexer_full(self, il: int) -> bool:
        """Whether layer il has an indexer of its own (every DeepSeek-3.2 layer has)."""
        return True

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = super().load_hparams(gguf)
        key = lambda name: f"{self.arch}.attention.indexer.{name}"  # noqa: E731
        head_dim = gguf.get_int(key("key_length"), lo=self.mla.qk_rope, hi=1 << 14)
        if head_dim < 64 or head_dim & (head_dim - 1):
            raise ModelFileError(f"{gguf.path}: {key('key_length')} {head_dim} must be a power of two ≥ 64 "
                                 "(the indexer's Hadamard rotation, as in llama.cpp)")
        self.indexer = IndexerParams(n_head=gguf.get_int(key("head_count"), lo=1, hi=1 << 12), head_dim=head_dim,
                                     top_k=gguf.get_int(key("top_k"), lo=1, hi=1 << 24))
        self.rotation = hadamard(head_dim)
        return hp

    def load_layer(self, gguf: GGUFFile, il: int) -> MLALayer:
        layer = super().load_layer(gguf, il)
        if not self.indexer_full(il):
            return layer
        hp, ix, blk = self.hparams, self.indexer, f"blk.{il}.indexer"
        layer.indexer = IndexerWeights(
            wq=self.weight(gguf, f"{blk}.attn_q_b.weight", (ix.n_head * ix.head_dim, self.mla.q_lora)),
            wk=self.weight(gguf, f"{blk}.attn_k.weight", (ix.head_dim, hp.n_embd)),
            k_norm=self.weight(gguf, f"{blk}.k_norm.weight", (ix.head_dim,)),
            k_norm_bias=self.weight(gguf, f"{blk}.k_norm.bias", (ix.head_dim,)),
            proj=self.weight(gguf, f"{blk}.proj.weight", (ix.n_head, hp.n_embd)))
        return layer

    def indexer_spec(self) -> IndexerSpec:
        hp = self.hparams
        return IndexerSpec(self.indexer.head_dim, self.indexer.top_k,
                           RopeSpec(self.mla.qk_rope, hp.rope_freq_base, hp.rope_freq_scale, neox=self.indexer_neox),
                           hadamard=True)

    def indexer_input(self, g, il: int, layer: MLALayer, h, q_a) -> IndexerInput:
        ix, w = self.indexer, layer.indexer
        q = g.rope(g.linear(q_a, w.wq).reshape(len(h), ix.n_head, ix.head_dim), il, neox=self.indexer_neox)
        k = g.ops.norm(g.linear(h, w.wk), self.indexer_norm_eps) * w.k_norm + w.k_norm_bias
        k = g.rope(k.reshape(len(h), 1, ix.head_dim), il, neox=self.indexer_neox)
        weights = g.linear(h, w.proj) * np.float32(1.0 / math.sqrt(ix.head_dim * ix.n_head))
        basis = g.ops.asarray(self.rotation)
        return IndexerInput(k.reshape(len(h), ix.head_dim) @ basis, q @ basis, weights)
