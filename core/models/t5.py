"""T5: an encoder-decoder. RMSNorm (no mean), no position embeddings but a learned bias per
relative-position bucket (bidirectional in the encoder, causal in the decoder; layer 0's table
serves every layer), no 1/√d attention scale, a gated-GELU feed-forward (flan) or a ReLU one, and
decoder layers that cross-attend the encoder's output."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..memory import AttnSpec, MemorySpec
from .base import MAX_LAYERS, HParams, Model, count_blocks, read_hparams
from .registry import register

MAX_DISTANCE = 128  # llama.cpp hard-codes T5's max_distance


@dataclass
class T5Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    ffn_up: np.ndarray  # gate and up stacked when the FFN is gated
    ffn_down: np.ndarray
    cross_norm: np.ndarray | None = None  # decoder layers only
    cross_wq: np.ndarray | None = None
    cross_wkv: np.ndarray | None = None
    cross_wo: np.ndarray | None = None


def relative_bucket(key_pos: np.ndarray, query_pos: np.ndarray, n_buckets: int, bidirectional: bool) -> np.ndarray:
    """llama_relative_position_bucket for every (query, key) pair: exact buckets for short
    distances, logarithmic ones up to MAX_DISTANCE; the log is taken in float32 as there."""
    rel = key_pos[None, :].astype(np.int64) - query_pos[:, None]
    bucket = np.zeros(rel.shape, np.int64)
    if bidirectional:
        n_buckets //= 2
        bucket += (rel > 0) * n_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = n_buckets // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log((rel / max_exact).astype(np.float32))
    large = np.floor(max_exact + log_ratio * np.float32(n_buckets - max_exact) / math.log(MAX_DISTANCE / max_exact))
    large = np.minimum(np.nan_to_num(large, neginf=0).astype(np.int64), n_buckets - 1)
    return bucket + np.where(rel < max_exact, rel, large)


@register("t5")
class T5(Model):
    arch = "t5"
    ops = Model.ops + ("GEGLU", "ATTN_SOFT_MAX")  # self-attention with a position bias runs unfused

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch, block_prefix="enc.blk.")
        self.n_dec_layer = count_blocks(gguf, gguf.get_int("t5.decoder_block_count", hp.n_layer, lo=1, hi=MAX_LAYERS),
                                        "dec.blk.", "decoder_block_count")
        self.n_buckets = gguf.get_int("t5.attention.relative_buckets_count", 32, lo=2, hi=1 << 16)
        self.decoder_start_id = gguf.get_int("t5.decoder_start_token_id", -1, lo=-1, hi=hp.n_vocab - 1)
        return hp

    def load_tensors(self, gguf: GGUFFile) -> None:
        hp = self.hparams
        if self.decoder_start_id < 0:
            self.decoder_start_id = self.vocab.bos
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.enc_rel_b = self.weight(gguf, "enc.blk.0.attn_rel_b.weight", (self.n_buckets, hp.n_head), matrix=False)
        self.dec_rel_b = self.weight(gguf, "dec.blk.0.attn_rel_b.weight", (self.n_buckets, hp.n_head), matrix=False)
        self.gated = "enc.blk.0.ffn_gate.weight" in gguf.tensors
        self.enc_layers = [self._layer(gguf, f"enc.blk.{il}") for il in range(hp.n_layer)]
        self.dec_layers = [self._layer(gguf, f"dec.blk.{il}", cross=True) for il in range(self.n_dec_layer)]
        self.enc_output_norm = self.weight(gguf, "enc.output_norm.weight", (hp.n_embd,))
        self.dec_output_norm = self.weight(gguf, "dec.output_norm.weight", (hp.n_embd,))
        self.output = self.output_head(gguf, self.token_embd)

    def _layer(self, gguf: GGUFFile, blk: str, cross: bool = False) -> T5Layer:
        hp = self.hparams
        n_q, n_kv, n_out = hp.n_head * hp.head_dim_k, hp.n_embd_k_gqa, hp.n_head * hp.head_dim_v
        vec = lambda name: self.weight(gguf, f"{blk}.{name}.weight", (hp.n_embd,))  # noqa: E731
        ffn = [(f"{blk}.ffn_up.weight", (hp.n_ff, hp.n_embd))]
        if self.gated:
            ffn.insert(0, (f"{blk}.ffn_gate.weight", (hp.n_ff, hp.n_embd)))
        layer = T5Layer(
            attn_norm=vec("attn_norm"),
            wqkv=self.fused(gguf, [(f"{blk}.attn_q.weight", (n_q, hp.n_embd)), (f"{blk}.attn_k.weight", (n_kv, hp.n_embd)),
                                   (f"{blk}.attn_v.weight", (hp.n_embd_v_gqa, hp.n_embd))]),
            wo=self.weight(gguf, f"{blk}.attn_o.weight", (hp.n_embd, n_out)),
            ffn_norm=vec("ffn_norm"),
            ffn_up=self.fused(gguf, ffn),
            ffn_down=self.weight(gguf, f"{blk}.ffn_down.weight", (hp.n_embd, hp.n_ff)))
        if cross:
            layer.cross_norm = vec("cross_attn_norm")
            layer.cross_wq = self.weight(gguf, f"{blk}.cross_attn_q.weight", (n_q, hp.n_embd))
            layer.cross_wkv = self.fused(gguf, [(f"{blk}.cross_attn_k.weight", (n_kv, hp.n_embd)),
                                                (f"{blk}.cross_attn_v.weight", (hp.n_embd_v_gqa, hp.n_embd))])
            layer.cross_wo = self.weight(gguf, f"{blk}.cross_attn_o.weight", (hp.n_embd, n_out))
        return layer

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        """The decoder's self-attention layers; their keys carry no rotation (nothing to shift)."""
        hp = self.hparams
        layers = {il: AttnSpec(hp.n_head_kv, hp.head_dim_k, hp.head_dim_v) for il in range(self.n_dec_layer)}
        return MemorySpec(layers, hp.n_vocab, model_kind="enc-dec")

    def position_bias(self, table: np.ndarray, bidirectional: bool):
        """kq_bias for g.attn: (n_head, queries, keys) from the bucket of each pair's positions."""
        def bias(query_pos, key_pos):
            buckets = relative_bucket(np.asarray(key_pos), np.asarray(query_pos), self.n_buckets, bidirectional)
            return np.ascontiguousarray(table[buckets].transpose(2, 0, 1))
        return bias

    def _ffn(self, g, x, layer: T5Layer):
        h = g.norm(x, layer.ffn_norm)
        if self.gated:
            return g.ffn(h, layer.ffn_up, layer.ffn_down, "geglu")
        return g.linear(np.maximum(g.linear(h, layer.ffn_up), 0.0), layer.ffn_down)

    def encode(self, g) -> np.ndarray:
        x = g.inp_embd(self.token_embd)
        bias = self.position_bias(self.enc_rel_b, bidirectional=True)
        for il, layer in enumerate(self.enc_layers):
            q, k, v = self.split_qkv(g.linear(g.norm(x, layer.attn_norm), layer.wqkv))
            x = x + g.linear(g.attn(il, q, k, v, 1.0, kq_bias=bias), layer.wo)
            x = g.cb("l_out", il, x + self._ffn(g, x, layer))
        return g.cb("result_norm", -1, g.norm(x, self.enc_output_norm))

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        x = g.inp_embd(self.token_embd)
        bias = self.position_bias(self.dec_rel_b, bidirectional=False)
        for il, layer in enumerate(self.dec_layers):
            q, k, v = self.split_qkv(g.linear(g.norm(x, layer.attn_norm), layer.wqkv))
            x = x + g.linear(g.attn(il, q, k, v, 1.0, kq_bias=bias), layer.wo)
            q = g.linear(g.norm(x, layer.cross_norm), layer.cross_wq).reshape(len(x), hp.n_head, hp.head_dim_k)
            attn = g.cross_attn(il, q, lambda enc, wkv=layer.cross_wkv: self._cross_kv(g, enc, wkv), 1.0)
            if il == self.n_dec_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.linear(attn, layer.cross_wo)
            x = g.cb("l_out", il, x + self._ffn(g, x, layer))
        return g.logits(x, self.dec_output_norm, self.output)

    def _cross_kv(self, g, enc: np.ndarray, wkv: np.ndarray):
        hp = self.hparams
        kv = g.linear(enc, wkv)
        k = kv[:, :hp.n_embd_k_gqa].reshape(len(enc), hp.n_head_kv, hp.head_dim_k)
        v = kv[:, hp.n_embd_k_gqa:].reshape(len(enc), hp.n_head_kv, hp.head_dim_v)
        return np.ascontiguousarray(k), np.ascontiguousarray(v)
