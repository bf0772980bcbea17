"""BERT: an encoder. Token, learned position and token-type embeddings, post-LayerNorm blocks
with biases, a GELU feed-forward, and the output pooled per sequence (mean, cls, last)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..embeddings import POOLING_TYPES
from ..errors import InvalidInputError, ModelFileError
from ..gguf import GGUFFile
from ..memory import MemorySpec
from .base import HParams, Model, read_hparams
from .registry import register


@dataclass
class BertLayer:
    wqkv: np.ndarray  # q, k and v projections stacked
    bqkv: np.ndarray
    wo: np.ndarray
    bo: np.ndarray
    attn_out_norm: tuple[np.ndarray, np.ndarray]  # LayerNorm weight and bias
    ffn_up: np.ndarray
    ffn_up_b: np.ndarray
    ffn_down: np.ndarray
    ffn_down_b: np.ndarray
    out_norm: tuple[np.ndarray, np.ndarray]


@register("bert")
class Bert(Model):
    arch = "bert"
    ops = ("GET_ROWS", "MUL_MAT", "NORM", "GELU", "FLASH_ATTN_EXT")

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch)
        hp.norm_eps = gguf.get_float("bert.attention.layer_norm_epsilon", 1e-12, hi=1.0, positive=True)
        if gguf.get_bool("bert.attention.causal", False):
            raise ModelFileError(f"{gguf.path}: a causal bert is not supported (bert.attention.causal is true)")
        pooling = gguf.get_int("bert.pooling_type", 0, lo=0, hi=255)
        if pooling not in POOLING_TYPES:
            raise ModelFileError(f"{gguf.path}: bert.pooling_type {pooling} is not supported "
                                 f"(known: {', '.join(f'{k} {v}' for k, v in POOLING_TYPES.items())})")
        hp.pooling = POOLING_TYPES[pooling]
        return hp

    def load_tensors(self, gguf: GGUFFile) -> None:
        hp = self.hparams
        vec = lambda name, n=hp.n_embd: self.weight(gguf, name, (n,))  # noqa: E731
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.position_embd = self.weight(gguf, "position_embd.weight", (hp.n_ctx_train, hp.n_embd))
        n_types = gguf.tensor_info("token_types.weight").numpy_shape[0]
        self.token_types = self.weight(gguf, "token_types.weight", (n_types, hp.n_embd), matrix=False)
        self.embd_norm = (vec("token_embd_norm.weight"), vec("token_embd_norm.bias"))
        self.layers = []
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            wqkv, wo = self.attention_weights(gguf, il)
            n_q, n_kv = hp.n_head * hp.head_dim_k, hp.n_embd_k_gqa
            self.layers.append(BertLayer(
                wqkv=wqkv,
                bqkv=np.concatenate([vec(f"{blk}.attn_q.bias", n_q), vec(f"{blk}.attn_k.bias", n_kv),
                                     vec(f"{blk}.attn_v.bias", hp.n_embd_v_gqa)]),
                wo=wo, bo=vec(f"{blk}.attn_output.bias"),
                attn_out_norm=(vec(f"{blk}.attn_output_norm.weight"), vec(f"{blk}.attn_output_norm.bias")),
                ffn_up=self.weight(gguf, f"{blk}.ffn_up.weight", (hp.n_ff, hp.n_embd)),
                ffn_up_b=vec(f"{blk}.ffn_up.bias", hp.n_ff),
                ffn_down=self.weight(gguf, f"{blk}.ffn_down.weight", (hp.n_embd, hp.n_ff)),
                ffn_down_b=vec(f"{blk}.ffn_down.bias"),
                out_norm=(vec(f"{blk}.layer_output_norm.weight"), vec(f"{blk}.layer_output_norm.bias")),
            ))

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        return MemorySpec({}, self.hparams.n_vocab, model_kind="encoder")

    def encode(self, g) -> np.ndarray:
        hp = self.hparams
        if g.ub.pos.max() >= hp.n_ctx_train:
            raise InvalidInputError(f"position {int(g.ub.pos.max())} is past bert's {hp.n_ctx_train} learned "
                                    "positions")
        x = g.inp_embd(self.token_embd) + self.token_types[0]  # every token is of type 0
        x = g.layer_norm(x + g.ops.get_rows(self.position_embd, g.ub.pos), *self.embd_norm)
        scale = 1.0 / math.sqrt(hp.head_dim_k)
        for il, layer in enumerate(self.layers):
            q, k, v = self.split_qkv(g.linear(x, layer.wqkv, layer.bqkv))
            attn = g.attn(il, q, k, v, scale)
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = g.layer_norm(x + g.linear(attn, layer.wo, layer.bo), *layer.attn_out_norm)
            h = g.linear(g.ops.gelu(g.linear(x, layer.ffn_up, layer.ffn_up_b)), layer.ffn_down, layer.ffn_down_b)
            x = g.cb("l_out", il, g.layer_norm(x + h, *layer.out_norm))
        return g.embd(x)

    forward = encode
