"""DeepSeek-V2/V3: multi-head latent attention (MLA) and a mixture of experts with shared experts
after `leading_dense_block_count` dense layers.

MLA compresses each token's keys and values into one latent (`attn_kv_a_mqa` → kv_lora_rank, then
RMSNorm) plus a small rope part shared by the heads. How a context attends is `--attn-impl`:

- `mla` caches only [latent | rope part] (one head, V a view of its latent): the K up-projection
  is absorbed into each query head, the V up-projection applied after attention;
- `naive` expands K = [k_nope | rope part] and V per head from the latent and caches those.

Both compute the same scores: q_nope·(W_k latent) = (W_kᵀ q_nope)·latent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from ..gguf import GGUFFile
from ..memory import AttnSpec, MemorySpec, RopeSpec
from ..moe import MoEWeights, load_moe, read_moe_params
from .base import HParams, Model, read_hparams
from .registry import register


@dataclass(frozen=True)
class MLAParams:
    q_lora: int  # 0: q projected directly (attn_q)
    kv_lora: int  # the latent's size
    qk_nope: int  # per head: query/key dims without rope
    qk_rope: int  # per head: rotated dims (the key's are shared by the heads)
    v_head: int  # per head: value dims

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope


@dataclass
class MLALayer:
    attn_norm: np.ndarray
    wq: np.ndarray | None  # no q low-rank path
    wq_a: np.ndarray | None
    q_a_norm: np.ndarray | None
    wq_b: np.ndarray | None
    wkv_a: np.ndarray  # → [latent | k rope part]
    kv_a_norm: np.ndarray
    k_absorb: list  # per head (kv_lora, qk_nope): folds the K up-projection into the query
    k_expand: list  # per head (qk_nope, kv_lora): the K up-projection (naive)
    v_expand: list  # per head (v_head, kv_lora): the V up-projection
    wo: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray | None = None  # dense layers
    ffn_down: np.ndarray | None = None
    moe: MoEWeights | None = None
    indexer: object = None  # DeepSeek-3.2's lightning indexer


def read_mla_params(gguf: GGUFFile, arch: str, hp: HParams) -> MLAParams:
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    scaling = gguf.get_str(key("rope.scaling.type"), "none")
    if scaling not in ("none", ""):
        raise UnsupportedError(f"{gguf.path}: rope scaling '{scaling}' of {arch} is not implemented")
    kv_lora = gguf.get_int(key("attention.kv_lora_rank"), lo=1, hi=1 << 16)
    # MLA-converted files give the per-head sizes in *_mla keys; key/value_length then describe the cache
    qk_head = gguf.get_int(key("attention.key_length_mla"), hp.head_dim_k, lo=1, hi=1 << 14)
    v_head = gguf.get_int(key("attention.value_length_mla"), hp.head_dim_v, lo=1, hi=1 << 14)
    if not 0 < hp.n_rot < qk_head:
        raise ModelFileError(f"{gguf.path}: rope.dimension_count {hp.n_rot} must be below the head size {qk_head}")
    return MLAParams(q_lora=gguf.get_int(key("attention.q_lora_rank"), 0, lo=0, hi=1 << 16), kv_lora=kv_lora,
                     qk_nope=qk_head - hp.n_rot, qk_rope=hp.n_rot, v_head=v_head)


@register("deepseek2")
class DeepSeek2(Model):
    arch = "deepseek2"
    attn_impls = ("mla", "naive")
    gating_default: int | None = 1  # softmax when the file does not say
    norm_weights_default = False

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        hp = read_hparams(gguf, self.arch)
        hp.moe = read_moe_params(gguf, self.arch, hp.n_ff, self.norm_weights_default, self.gating_default)
        self.mla = read_mla_params(gguf, self.arch, hp)
        return hp

    def load_layer(self, gguf: GGUFFile, il: int) -> MLALayer:
        hp, m, blk = self.hparams, self.mla, f"blk.{il}"
        w = lambda name, *shape: self.weight(gguf, f"{blk}.{name}.weight", shape)  # noqa: E731
        n_q = hp.n_head * m.qk_head
        low_rank = m.q_lora > 0
        k_absorb, k_expand, v_expand = self.kv_up_projections(gguf, blk)
        layer = MLALayer(
            attn_norm=w("attn_norm", hp.n_embd),
            wq=None if low_rank else w("attn_q", n_q, hp.n_embd),
            wq_a=w("attn_q_a", m.q_lora, hp.n_embd) if low_rank else None,
            q_a_norm=w("attn_q_a_norm", m.q_lora) if low_rank else None,
            wq_b=w("attn_q_b", n_q, m.q_lora) if low_rank else None,
            wkv_a=w("attn_kv_a_mqa", m.kv_lora + m.qk_rope, hp.n_embd),
            kv_a_norm=w("attn_kv_a_norm", m.kv_lora),
            k_absorb=k_absorb, k_expand=k_expand, v_expand=v_expand,
            wo=w("attn_output", hp.n_embd, hp.n_head * m.v_head),
            ffn_norm=w("ffn_norm", hp.n_embd),
        )
        if hp.moe is None or il < hp.moe.n_dense_lead:
            layer.ffn_gate_up, layer.ffn_down = self.gated_ffn_weights(gguf, il)
        else:
            layer.moe = load_moe(self, gguf, blk, hp.moe, hp.n_embd)
        return layer

    def kv_up_projections(self, gguf: GGUFFile, blk: str) -> tuple[list, list, list]:
        """Per head: the K up-projection absorbed (kv_lora, qk_nope) and expanded (qk_nope, kv_lora),
        and the V up-projection (v_head, kv_lora), from attn_k_b/attn_v_b or from attn_kv_b."""
        hp, m = self.hparams, self.mla
        if f"{blk}.attn_k_b.weight" in gguf.tensors or f"{blk}.attn_kv_b.weight" not in gguf.tensors:
            name = f"{blk}.attn_k_b.weight"
            return (self.stacked(gguf, name, hp.n_head, (m.kv_lora, m.qk_nope)),
                    self.stacked_transposed(gguf, name, hp.n_head, (m.qk_nope, m.kv_lora)),
                    self.stacked(gguf, f"{blk}.attn_v_b.weight", hp.n_head, (m.v_head, m.kv_lora)))
        # attn_kv_b stacks, per head, the K rows then the V rows: (n_head·(qk_nope + v_head), kv_lora)
        name = f"{blk}.attn_kv_b.weight"
        heads = self.float_tensor(gguf, name, (hp.n_head * (m.qk_nope + m.v_head), m.kv_lora))
        heads = heads.reshape(hp.n_head, m.qk_nope + m.v_head, m.kv_lora)
        return ([self.from_array(h[:m.qk_nope].T, f"{name}[{i}] k absorbed") for i, h in enumerate(heads)],
                [self.from_array(h[:m.qk_nope], f"{name}[{i}] k") for i, h in enumerate(heads)],
                [self.from_array(h[m.qk_nope:], f"{name}[{i}] v") for i, h in enumerate(heads)])

    def memory_spec(self, attn_impl: str = "mla") -> MemorySpec:
        hp, m = self.hparams, self.mla
        if attn_impl == "mla":
            rope = RopeSpec(m.qk_rope, hp.rope_freq_base, hp.rope_freq_scale, offset=m.kv_lora)
            layer = AttnSpec(1, m.kv_lora + m.qk_rope, m.kv_lora, rope=rope, v_view=True, indexer=self.indexer_spec())
        else:
            rope = RopeSpec(m.qk_rope, hp.rope_freq_base, hp.rope_freq_scale, offset=m.qk_nope)
            layer = AttnSpec(hp.n_head, m.qk_head, m.v_head, rope=rope)
        return MemorySpec({il: layer for il in range(hp.n_layer)}, hp.n_vocab)

    def indexer_spec(self):
        return None

    # ---- forward -------------------------------------------------------------------------

    def forward(self, g) -> np.ndarray:
        hp = self.hparams
        x = g.inp_embd(self.token_embd)
        for il, layer in enumerate(self.layers):
            attn = self.attention(g, il, layer, g.norm(x, layer.attn_norm))
            if il == hp.n_layer - 1:
                attn, x = g.select_outputs(attn, x)
            x = x + g.linear(attn, layer.wo)
            h = g.norm(x, layer.ffn_norm)
            x = x + (g.moe(h, hp.moe, layer.moe, "swiglu", il) if layer.moe else
                     g.ffn(h, layer.ffn_gate_up, layer.ffn_down, "swiglu"))
            g.cb("l_out", il, x)
        return g.logits(x, self.output_norm, self.output)

    def queries(self, g, il: int, layer: MLALayer, h) -> tuple:
        """(q_nope, q_rope after RoPE, the normed low-rank q or None), q parts (n_tokens, n_head, ·)."""
        hp, m = self.hparams, self.mla
        q_a = None
        if layer.wq is not None:
            q = g.linear(h, layer.wq)
        else:
            q_a = g.norm(g.linear(h, layer.wq_a), layer.q_a_norm)
            q = g.linear(q_a, layer.wq_b)
        q = q.reshape(len(h), hp.n_head, m.qk_head)
        return q[..., :m.qk_nope], g.rope(q[..., m.qk_nope:], il), q_a

    def indexer_input(self, g, il: int, layer: MLALayer, h, q_a):
        """What a DSA layer's indexer needs from the ubatch (None: attention is dense)."""
        return None

    def attention(self, g, il: int, layer: MLALayer, h):
        hp, m = self.hparams, self.mla
        q_nope, q_rope, q_a = self.queries(g, il, layer, h)
        indexer = self.indexer_input(g, il, layer, h, q_a)
        kv = g.linear(h, layer.wkv_a)
        latent = g.norm(kv[:, :m.kv_lora], layer.kv_a_norm)
        k_rope = g.rope(kv[:, None, m.kv_lora:], il)  # (n_tokens, 1, qk_rope), shared by the heads
        scale = 1.0 / math.sqrt(m.qk_head)
        xp = g.ops.xp
        if g.attn_impl == "mla":
            q = xp.concatenate([g.per_head(q_nope, layer.k_absorb), q_rope], axis=2)
            k = xp.concatenate([latent[:, None, :], k_rope], axis=2)
            out = g.attn(il, q, k, None, scale, v_dim=m.kv_lora, indexer=indexer)
            return g.per_head(out.reshape(len(h), hp.n_head, m.kv_lora), layer.v_expand).reshape(len(h), -1)
        heads = xp.broadcast_to(latent[:, None, :], (len(h), hp.n_head, m.kv_lora))
        k_rope = xp.broadcast_to(k_rope, (len(h), hp.n_head, m.qk_rope))
        k = xp.concatenate([g.per_head(heads, layer.k_expand), k_rope], axis=2)
        v = g.per_head(heads, layer.v_expand)
        return g.attn(il, xp.concatenate([q_nope, q_rope], axis=2), k, v, scale)
