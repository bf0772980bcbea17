"""DeepSeek-V4 (`deepseek4`): sliding-window attention over one shared K=V head in every layer, with
compressed rows beside the window where `compress_ratios` says (llama.cpp's src/models/deepseek4.cpp).

- Attention: a low-rank query (wq_a → RMSNorm → wq_b) RMS-normed per head without a weight; one
  key head that is also the value; RoPE on the last n_rot dims (the file's base alone in ratio-0
  layers; `compress_rope_freq_base` with the file's scaling, YaRN where it says so, in the compressed
  ones); a sink logit per head; the output de-roped and projected per group of heads (wo_a), then
  together (wo_b).
- Compressed rows (--kv dsv4, memory/compressed.py): ratio 128 (HCA) pools each block of 128
  tokens, every visible row attended; ratio 4 (CSA) pools each block of 4 with the block before,
  and a lightning indexer over its own compressed keys keeps each query's top_k rows. A pooled row
  is a softmax-gated sum of per-token projections, RMS-normed and roped at the block's start.
- Hyper-connections: the residual stream is four streams; around each sub-block a mix of them
  (`pre`) is its input and its output is spread back (`post`) over the streams mixed by a
  Sinkhorn-normalised 4×4 matrix (`comb`); the head mixes them once more.
- MoE in every layer: sqrt(softplus) gating with a selection bias, the first `hash_layer_count`
  layers routed by a token-id table, SwiGLU clamped per layer, and shared experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ..backend.base import Yarn, yarn
from ..errors import ModelFileError, UnsupportedError
from ..gguf import GGUFFile
from ..graph import IndexerInput
from ..hyper import compress_pool, hc_mix, hc_post, sigmoid
from ..memory import AttnSpec, MemorySpec, RopeSpec
from ..memory.masks import hadamard
from ..memory.spec import CompressSpec, IndexerSpec
from ..moe import MoEWeights, load_moe, read_moe_params
from .base import HParams, Model, read_hparams
from .registry import register

HC_STREAMS = 4  # llama.cpp's fused hyper-connection ops are written for four streams
RATIOS = (0, 4, 128)  # the compression ratios llama.cpp's DeepSeek-V4 code knows
SQRT_SOFTPLUS = 4  # expert_gating_func
HADAMARD_BLOCK = 64  # the indexer's keys are rotated in blocks of the largest 64·2^k dividing their size


def indexer_rotation_block(dim: int) -> int:
    """The indexer keys' Hadamard rotation works in blocks of the largest 64·2^k dividing their size."""
    block = HADAMARD_BLOCK
    while dim % (2 * block) == 0:
        block *= 2
    return block


@dataclass(frozen=True)
class DSV4Params:
    q_lora: int
    n_group: int  # output groups of heads
    o_lora: int
    n_swa: int
    compress_base: float  # rope base of the compressed layers, their compressors and the indexer
    compress_scale: float  # and their frequency scale (1 / rope.scaling.factor)
    yarn: Yarn | None  # and YaRN's correction, where rope.scaling.type is yarn
    ratios: tuple[int, ...]
    hc_iterations: int
    hc_eps: float
    n_hash: int  # layers routed by token id
    clamp: tuple[float, ...]  # per layer: routed experts' SwiGLU limit
    shared_clamp: tuple[float, ...]
    indexer_heads: int
    indexer_dim: int
    indexer_top_k: int


@dataclass
class HyperWeights:
    fn: np.ndarray  # (n_mix, 4·n_embd)
    scale: np.ndarray
    base: np.ndarray


@dataclass
class Compressor:
    kv_gate: np.ndarray  # the kv and gate projections stacked, (2·c·width, n_embd), c = 2 where blocks overlap
    ape: np.ndarray  # (ratio, c·width): a score added by position in the block
    norm: np.ndarray


@dataclass
class Indexer:
    wq: np.ndarray  # (n_head·dim, q_lora)
    proj: np.ndarray  # (n_head, n_embd)
    compressor: Compressor


@dataclass
class DSV4Layer:
    hc_attn: HyperWeights
    hc_ffn: HyperWeights
    attn_norm: np.ndarray
    wq_a: np.ndarray
    q_a_norm: np.ndarray
    wq_b: np.ndarray
    wkv: np.ndarray
    kv_norm: np.ndarray
    sinks: np.ndarray
    wo_a: list  # per group of heads (o_lora, heads per group · head_dim)
    wo_b: np.ndarray
    ffn_norm: np.ndarray
    moe: MoEWeights
    compressor: Compressor | None = None
    indexer: Indexer | None = None


@register("deepseek4")
class DeepSeek4(Model):
    arch = "deepseek4"
    ops = Model.ops + ("HC_MIX", "HC_POST", "COMPRESS_POOL", "LIGHTNING_INDEXER", "TOP_K_MASK", "MOE_ROUTE")
    embeddings_refusal = ("deepseek4 gives no embeddings: its hidden state is four hyper-connection streams that only "
                          "its output head mixes into one, and llama.cpp's DeepSeek-V4 memory refuses embedding batches")

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        key = lambda name: f"{self.arch}.{name}"  # noqa: E731
        n_ff_exp = gguf.get_int(key("expert_feed_forward_length"), lo=1, hi=1 << 24, per_layer=True)
        hp = read_hparams(gguf, self.arch, n_ff_default=n_ff_exp)
        self._check_attention(gguf, hp)
        hp.moe = read_moe_params(gguf, self.arch, n_ff_exp, gating_default=None)
        if hp.moe is None or hp.moe.gating != "sqrtsoftplus":
            raise UnsupportedError(f"{gguf.path}: {key('expert_gating_func')} must be {SQRT_SOFTPLUS} (sqrt(softplus)) "
                                   "with experts, as DeepSeek-V4 routes")
        if not hp.moe.n_shared:
            raise ModelFileError(f"{gguf.path}: {key('expert_shared_count')} must be at least 1: every DeepSeek-V4 "
                                 "layer has shared experts")
        hp.n_swa = gguf.get_int(key("attention.sliding_window"), lo=1, hi=1 << 24)
        hp.swa_layers = frozenset(range(hp.n_layer))
        self.v4 = self._read_params(gguf, hp)
        self._check_tensors(gguf, hp)
        self.indexer_basis = hadamard(indexer_rotation_block(self.v4.indexer_dim))
        return hp

    def _check_tensors(self, gguf: GGUFFile, hp: HParams) -> None:
        """Every tensor the graph needs is in the file, and the hash-routing tables hold expert ids,
        before any weight is read."""
        for name in self.tensor_names(hp):
            if name not in gguf.tensors:
                raise ModelFileError(f"{gguf.path}: required tensor '{name}' is missing")
        for il in range(self.v4.n_hash):
            self._hash_table(gguf, f"blk.{il}.ffn_gate_tid2eid.weight", hp)

    def tensor_names(self, hp: HParams) -> list[str]:
        names = ["token_embd.weight", "output_norm.weight", "output.weight",
                 *(f"output_hc_{part}.weight" for part in ("fn", "scale", "base"))]
        per_layer = ["attn_norm", "attn_sinks", "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv", "attn_kv_a_norm",
                     "attn_output_a", "attn_output_b", "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                     "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                     *(f"hc_{sub}_{part}" for sub in ("attn", "ffn") for part in ("fn", "scale", "base"))]
        compressor = [f"attn_compressor_{part}" for part in ("kv", "gate", "ape", "norm")]
        indexer = ["indexer.proj", "indexer.attn_q_b", *(f"indexer_compressor_{part}" for part in ("kv", "gate", "ape",
                                                                                                    "norm"))]
        for il, ratio in enumerate(self.v4.ratios):
            layer = per_layer + (compressor if ratio else []) + (indexer if ratio == 4 else [])
            layer.append("ffn_gate_tid2eid" if il < self.v4.n_hash else "exp_probs_b")
            names += [f"blk.{il}.{n}.{'bias' if n == 'exp_probs_b' else 'weight'}" for n in layer]
        return names

    def _check_attention(self, gguf: GGUFFile, hp: HParams) -> None:
        key = lambda name: f"{self.arch}.{name}"  # noqa: E731
        if hp.n_head_kv != 1:
            raise UnsupportedError(f"{gguf.path}: {key('attention.head_count_kv')} is {hp.n_head_kv}; DeepSeek-V4 "
                                   "attends one shared key-value head (it must be 1)")
        if hp.head_dim_v != hp.head_dim_k:
            raise ModelFileError(f"{gguf.path}: {key('attention.value_length')} {hp.head_dim_v} differs from "
                                 f"{key('attention.key_length')} {hp.head_dim_k}; DeepSeek-V4's values are its keys")
        if (hp.head_dim_k - hp.n_rot) % 2:
            raise ModelFileError(f"{gguf.path}: {key('attention.key_length')} {hp.head_dim_k} less "
                                 f"{key('rope.dimension_count')} {hp.n_rot} must be even")

    def _read_params(self, gguf: GGUFFile, hp: HParams) -> DSV4Params:
        key = lambda name: f"{self.arch}.{name}"  # noqa: E731
        ratios = self._ratios(gguf, hp.n_layer)
        hc = gguf.get_int(key("hyper_connection.count"), lo=0, hi=1 << 10)
        if hc != HC_STREAMS:
            raise UnsupportedError(f"{gguf.path}: {key('hyper_connection.count')} is {hc}; DeepSeek-V4 runs "
                                   f"{HC_STREAMS} hyper-connection streams")
        n_group = gguf.get_int(key("attention.output_group_count"), lo=1, hi=hp.n_head)
        if hp.n_head % n_group:
            raise ModelFileError(f"{gguf.path}: {key('attention.head_count')} {hp.n_head} is not a multiple of "
                                 f"{key('attention.output_group_count')} {n_group}")
        idx_dim = gguf.get_int(key("attention.indexer.key_length"), lo=1, hi=1 << 14)
        if idx_dim % HADAMARD_BLOCK:
            raise ModelFileError(f"{gguf.path}: {key('attention.indexer.key_length')} {idx_dim} is not a multiple of "
                                 f"{HADAMARD_BLOCK} (the indexer keys' Hadamard rotation works in such blocks)")
        if idx_dim == hp.head_dim_k:
            raise ModelFileError(f"{gguf.path}: {key('attention.indexer.key_length')} equals "
                                 f"{key('attention.key_length')} ({idx_dim}); llama.cpp cannot build that cache "
                                 "(it dies of SIGFPE), and DeepSeek-V4 keeps them apart")
        if hp.n_rot > idx_dim:
            raise ModelFileError(f"{gguf.path}: {key('rope.dimension_count')} {hp.n_rot} exceeds "
                                 f"{key('attention.indexer.key_length')} {idx_dim}")
        n_hash = gguf.get_int(key("hash_layer_count"), lo=0, hi=hp.n_layer)
        clamp = self._per_layer(gguf, key("swiglu_clamp_exp"), hp.n_layer)
        compress_base = gguf.get_float(key("attention.compress_rope_freq_base"), hi=1e12, positive=True)
        compress_scale, scaling = self._rope_scaling(gguf, hp, compress_base)
        return DSV4Params(
            q_lora=gguf.get_int(key("attention.q_lora_rank"), lo=1, hi=1 << 16), n_group=n_group,
            o_lora=gguf.get_int(key("attention.output_lora_rank"), lo=1, hi=1 << 16), n_swa=hp.n_swa,
            compress_base=compress_base, compress_scale=compress_scale, yarn=scaling, ratios=ratios, hc_iterations=gguf.get_int(key("hyper_connection.sinkhorn_iterations"), lo=1, hi=1 << 10),
            hc_eps=gguf.get_float(key("hyper_connection.epsilon"), lo=0.0, hi=1.0), n_hash=n_hash, clamp=clamp,
            shared_clamp=self._per_layer(gguf, key("swiglu_clamp_shexp"), hp.n_layer, clamp),
            indexer_heads=gguf.get_int(key("attention.indexer.head_count"), lo=1, hi=1 << 12), indexer_dim=idx_dim,
            indexer_top_k=gguf.get_int(key("attention.indexer.top_k"), lo=1, hi=1 << 24))

    def _rope_scaling(self, gguf: GGUFFile, hp: HParams, base: float) -> tuple[float, Yarn | None]:
        """The compressed layers' frequency scale and YaRN correction, as llama.cpp's context makes
        them: the scale from rope.scaling.factor (none: 1), YaRN's ramp where the type is yarn, its
        magnitude factor cancelled (llama.cpp's dsv4_rope_attn_factor), beta 32 / 1 (not read)."""
        key = lambda name: f"{self.arch}.rope.scaling.{name}"  # noqa: E731
        kind = gguf.get_str(key("type"), "linear")
        if kind not in ("none", "linear", "yarn"):
            raise UnsupportedError(f"{gguf.path}: metadata {key('type')} '{kind}' is not supported for deepseek4 "
                                   "(none, linear or yarn)")
        factor = gguf.get_float(key("factor"), 0.0, lo=0.0, hi=1e6)
        scale = 1.0 if kind == "none" or factor == 0.0 else float(np.float32(1) / np.float32(factor))
        if kind != "yarn":
            return scale, None
        n_ctx_orig = gguf.get_int(key("original_context_length"), hp.n_ctx_train, lo=1, hi=1 << 30)
        attn_factor = float(np.float32(1) / (np.float32(1) + np.float32(0.1) * np.log(np.float32(1) / np.float32(scale))))
        return scale, yarn(hp.n_rot, n_ctx_orig, base, scale, attn_factor=attn_factor)

    def _ratios(self, gguf: GGUFFile, n_layer: int) -> tuple[int, ...]:
        name = f"{self.arch}.attention.compress_ratios"
        values = gguf.get(name)
        if values is None:
            raise ModelFileError(f"{gguf.path}: required metadata {name} is missing")
        if not isinstance(values, np.ndarray) or values.dtype.kind not in "iu" or len(values) < n_layer:
            raise ModelFileError(f"{gguf.path}: metadata {name} must be an integer array of at least block_count "
                                 f"({n_layer}) values")
        ratios = tuple(int(r) for r in values[:n_layer])
        if any(r not in RATIOS for r in ratios):
            raise UnsupportedError(f"{gguf.path}: metadata {name} holds {sorted(set(ratios) - set(RATIOS))}; "
                                   f"DeepSeek-V4 compresses by {', '.join(map(str, RATIOS))} only")
        if 4 not in ratios:
            raise ModelFileError(f"{gguf.path}: metadata {name} has no ratio-4 layer; DeepSeek-V4 needs one for its "
                                 "lightning indexer (llama.cpp dies of SIGFPE on such a file)")
        return ratios

    @staticmethod
    def _per_layer(gguf: GGUFFile, key: str, n_layer: int, default=None) -> tuple[float, ...]:
        """A float per layer: a scalar for all, or an array of block_count values."""
        value = gguf.get(key)
        if value is None:
            if default is None:
                raise ModelFileError(f"{gguf.path}: required metadata {key} is missing")
            return default
        if isinstance(value, np.ndarray):
            return tuple(float(v) for v in gguf.get_numbers(key, "iuf", n_layer))
        return (gguf.get_float(key, lo=0.0, hi=1e9),) * n_layer

    # ---- weights -------------------------------------------------------------------------

    def load_tensors(self, gguf: GGUFFile) -> None:
        super().load_tensors(gguf)
        hp = self.hparams
        self.hc_head = HyperWeights(self.weight(gguf, "output_hc_fn.weight", (HC_STREAMS, HC_STREAMS * hp.n_embd)),
                                    self._vector(gguf, "output_hc_scale.weight", 1),
                                    self._vector(gguf, "output_hc_base.weight", HC_STREAMS))

    def load_layer(self, gguf: GGUFFile, il: int) -> DSV4Layer:
        hp, v4, blk = self.hparams, self.v4, f"blk.{il}"
        w = lambda name, *shape: self.weight(gguf, f"{blk}.{name}.weight", shape)  # noqa: E731
        D, H = hp.head_dim_k, hp.n_head
        per_group = H * D // v4.n_group
        layer = DSV4Layer(
            hc_attn=self._hyper(gguf, f"{blk}.hc_attn"), hc_ffn=self._hyper(gguf, f"{blk}.hc_ffn"),
            attn_norm=w("attn_norm", hp.n_embd), wq_a=w("attn_q_a", v4.q_lora, hp.n_embd),
            q_a_norm=w("attn_q_a_norm", v4.q_lora), wq_b=w("attn_q_b", H * D, v4.q_lora),
            wkv=w("attn_kv", D, hp.n_embd), kv_norm=w("attn_kv_a_norm", D),
            sinks=self._vector(gguf, f"{blk}.attn_sinks.weight", H),
            wo_a=self.row_groups(gguf, f"{blk}.attn_output_a.weight", v4.n_group, (v4.o_lora, per_group)),
            wo_b=w("attn_output_b", hp.n_embd, v4.n_group * v4.o_lora),
            ffn_norm=w("ffn_norm", hp.n_embd), moe=self._moe(gguf, il))
        ratio = v4.ratios[il]
        if ratio:
            layer.compressor = self._compressor(gguf, f"{blk}.attn_compressor", ratio, D)
        if ratio == 4:
            layer.indexer = Indexer(
                wq=w("indexer.attn_q_b", v4.indexer_heads * v4.indexer_dim, v4.q_lora),
                proj=self.weight(gguf, f"{blk}.indexer.proj.weight", (v4.indexer_heads, hp.n_embd)),
                compressor=self._compressor(gguf, f"{blk}.indexer_compressor", ratio, v4.indexer_dim))
        return layer

    def _vector(self, gguf: GGUFFile, name: str, n: int) -> np.ndarray:
        """A float32 parameter vector (sinks, hyper-connection scales and bases)."""
        if gguf.tensor_info(name).type != GGMLQuantizationType.F32:
            raise ModelFileError(f"{gguf.path}: tensor '{name}' must be F32, not {gguf.tensor_info(name).type.name}")
        return self.weight(gguf, name, (n,))

    def _hyper(self, gguf: GGUFFile, prefix: str) -> HyperWeights:
        n_mix = (2 + HC_STREAMS) * HC_STREAMS
        return HyperWeights(self.weight(gguf, f"{prefix}_fn.weight", (n_mix, HC_STREAMS * self.hparams.n_embd)),
                            self._vector(gguf, f"{prefix}_scale.weight", 3), self._vector(gguf, f"{prefix}_base.weight",
                                                                                          n_mix))

    def _compressor(self, gguf: GGUFFile, prefix: str, ratio: int, width: int) -> Compressor:
        proj = 2 * width if ratio == 4 else width
        n_embd = self.hparams.n_embd
        return Compressor(kv_gate=self.fused(gguf, [(f"{prefix}_kv.weight", (proj, n_embd)),
                                                    (f"{prefix}_gate.weight", (proj, n_embd))]),
                          ape=self.weight(gguf, f"{prefix}_ape.weight", (ratio, proj), matrix=False),
                          norm=self.weight(gguf, f"{prefix}_norm.weight", (width,)))

    def _moe(self, gguf: GGUFFile, il: int) -> MoEWeights:
        hp, blk = self.hparams, f"blk.{il}"
        moe = load_moe(self, gguf, blk, hp.moe, hp.n_embd)
        moe.clamp, moe.shared_clamp = self.v4.clamp[il], self.v4.shared_clamp[il]
        if il < self.v4.n_hash:
            name = f"{blk}.ffn_gate_tid2eid.weight"
            moe.by_token = self._hash_table(gguf, name, hp)
            self.note_loaded(gguf.tensor_info(name), matrix=False)
        return moe

    @staticmethod
    def _hash_table(gguf: GGUFFile, name: str, hp: HParams) -> np.ndarray:
        """Hash routing's experts per token id, (n_vocab, n_used), checked to be I32 expert ids."""
        info = gguf.tensor_info(name)
        if info.type != GGMLQuantizationType.I32:
            raise ModelFileError(f"{gguf.path}: tensor '{name}' must be I32 expert ids, not {info.type.name}")
        if info.numpy_shape != (hp.n_vocab, hp.moe.n_used):
            raise ModelFileError(f"{gguf.path}: tensor '{name}' has shape {list(info.numpy_shape)}, but the "
                                 f"hyper-parameters make it {[hp.n_vocab, hp.moe.n_used]}")
        table = gguf.raw(name).view(np.int32).reshape(info.numpy_shape)
        if table.size and (table.min() < 0 or table.max() >= hp.moe.n_expert):
            raise ModelFileError(f"{gguf.path}: tensor '{name}' holds an expert id outside 0..{hp.moe.n_expert - 1}")
        return table.astype(np.int64)

    def row_groups(self, gguf: GGUFFile, name: str, n: int, shape: tuple[int, int]) -> list:
        """A (n·rows, cols) matrix as n matmul weights of `shape` (rows, cols), each a view of its bytes."""
        self._checked(gguf, name, (n * shape[0], shape[1]))
        raw, info = gguf.raw(name), gguf.tensor_info(name)
        size = len(raw) // n
        out = [self.backend.load_weight(raw[i * size:(i + 1) * size], info.type, shape, f"{name}[{i}]") for i in range(n)]
        self.note_loaded(info)
        return out

    # ---- memory --------------------------------------------------------------------------

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        hp, v4 = self.hparams, self.v4
        layers = {}
        for il, ratio in enumerate(v4.ratios):
            base = v4.compress_base if ratio else hp.rope_freq_base
            rope = RopeSpec(hp.n_rot, base, offset=hp.head_dim_k - hp.n_rot)
            compress = None
            if ratio:
                indexer = None
                if ratio == 4:
                    indexer = IndexerSpec(v4.indexer_dim, v4.indexer_top_k,
                                          RopeSpec(hp.n_rot, v4.compress_base, offset=v4.indexer_dim - hp.n_rot),
                                          hadamard=True)
                compress = CompressSpec(ratio, hp.head_dim_k, overlap=ratio == 4, indexer=indexer)
            layers[il] = AttnSpec(1, hp.head_dim_k, hp.head_dim_k, window=v4.n_swa, rope=rope, v_view=True,
                                  compress=compress)
        return MemorySpec(layers, hp.n_vocab)

    # ---- forward -------------------------------------------------------------------------

    def forward(self, g) -> np.ndarray:
        xp = g.ops.xp
        x = g.inp_embd(self.token_embd)
        streams = xp.repeat(x[:, None, :], HC_STREAMS, axis=1)  # (n_tokens, 4, n_embd)
        for il, layer in enumerate(self.layers):
            streams = g.cb("l_last", il, self.block(g, il, layer, streams))
        (streams,) = g.select_outputs(streams)
        return g.logits(g.cb("hc_head", -1, self.hyper_head(g, streams)), self.output_norm, self.output)

    def block(self, g, il: int, layer: DSV4Layer, streams):
        """Layer il: attention, then the experts, each between the streams' mix and spread."""
        y, post, comb = self.hyper_pre(g, streams, layer.hc_attn)
        streams = self.hyper_post(g, self.attention(g, il, layer, g.norm(y, layer.attn_norm)), streams, post, comb)
        y, post, comb = self.hyper_pre(g, streams, layer.hc_ffn)
        out = g.moe(g.norm(y, layer.ffn_norm), self.hparams.moe, layer.moe, "swiglu", il)
        return self.hyper_post(g, out, streams, post, comb)

    # ---- hyper-connections -----------------------------------------------------------------

    def _mix(self, g, streams, hc: HyperWeights):
        """The mixing logits of the streams: their concatenation RMS-normed (no weight), projected."""
        flat = g.norm(streams.reshape(len(streams), HC_STREAMS * self.hparams.n_embd), None)  # a ubatch may output none
        return g.linear(flat, hc.fn)

    def hyper_pre(self, g, streams, hc: HyperWeights):
        """A sub-block's input Σ_h pre_h·stream_h, and the post weights and Sinkhorn-normalised
        comb[src, dst] that hyper_post spreads its output with."""
        pre, post, comb = hc_mix(self._mix(g, streams, hc), hc.scale, hc.base, HC_STREAMS, self.v4.hc_iterations,
                                 self.v4.hc_eps, g.ops.xp)
        return (pre[:, :, None] * streams).sum(axis=1), post, comb

    @staticmethod
    def hyper_post(g, out, streams, post, comb):
        return hc_post(out, streams, post, comb, g.ops.xp)

    def hyper_head(self, g, streams):
        """The head's mix of the streams: Σ_h pre_h·stream_h (no post, no comb)."""
        hc, xp = self.hc_head, g.ops.xp
        pre = sigmoid(self._mix(g, streams, hc) * hc.scale[0] + hc.base, xp) + np.float32(self.v4.hc_eps)
        return (pre[:, :, None] * streams).sum(axis=1)

    # ---- attention -------------------------------------------------------------------------

    def rope_of(self, ratio: int) -> tuple:
        """(base, frequency scale, YaRN) of a layer's rope: the file's base alone where it keeps no
        compressed rows; where it does, the compressed base and the context's scaling."""
        v4 = self.v4
        if not ratio:
            return self.hparams.rope_freq_base, 1.0, None
        return v4.compress_base, v4.compress_scale, v4.yarn

    def rope_tail(self, g, x, rope: tuple, pos=None, inverse: bool = False):
        """RoPE (`rope_of`) on the last n_rot dims of each head of x (n, heads, dim)."""
        xp, n_rot = g.ops.xp, self.hparams.n_rot
        base, freq_scale, scaling = rope
        tail = g.rope_at(xp.ascontiguousarray(x[..., -n_rot:]), base, pos, inverse, freq_scale, scaling)
        return xp.concatenate([x[..., :-n_rot], tail], axis=-1)

    def attention(self, g, il: int, layer: DSV4Layer, h):
        hp, v4 = self.hparams, self.v4
        ratio = v4.ratios[il]
        rope = self.rope_of(ratio)
        n, H, D = len(h), hp.n_head, hp.head_dim_k
        q_a = g.norm(g.linear(h, layer.wq_a), layer.q_a_norm)
        q = self.rope_tail(g, g.norm(g.linear(q_a, layer.wq_b).reshape(n, H, D), None), rope)
        kv = self.rope_tail(g, g.norm(g.linear(h, layer.wkv), layer.kv_norm)[:, None, :], rope)
        indexer = None
        if ratio:
            view = g.mctx.layer(il)
            self.compress(g, view, "attn", h, layer.compressor, rope)
            if layer.indexer is not None:
                self.compress(g, view, "indexer", h, layer.indexer.compressor, rope, rotate=True)
                indexer = self.indexer_queries(g, layer.indexer, h, q_a, rope)
        out = g.attn(il, q, kv, None, 1.0 / math.sqrt(D), v_dim=D, indexer=indexer, sinks=layer.sinks)
        out = self.rope_tail(g, out.reshape(n, H, D), rope, inverse=True)
        grouped = out.reshape(n, v4.n_group, H * D // v4.n_group)
        return g.linear(g.per_head(grouped, layer.wo_a).reshape(n, -1), layer.wo_b)

    def compress(self, g, view, kind: str, h, c: Compressor, rope: tuple, rotate: bool = False) -> None:
        """Project the ubatch's tokens for layer view's `kind` rows; pool every block the ubatch
        completes (softmax over its candidates, per channel), RMS-norm it, rope it at the block's
        first position (and rotate an indexer key), and store it."""
        xp, proj = g.ops.xp, c.ape.shape[1]
        kv_gate = g.linear(h, c.kv_gate)
        kv, score = kv_gate[:, :proj], kv_gate[:, proj:] + c.ape[xp.asarray(g.ub.pos % len(c.ape))]
        blocks = view.compressor_input(kind, kv, score)
        if blocks is None:
            return
        pooled = compress_pool(blocks.kv, blocks.score, xp)
        rows = self.rope_tail(g, g.norm(pooled, c.norm)[:, None, :], rope, pos=blocks.pos)[:, 0]
        view.store_rows(kind, blocks, self.rotated(g, rows) if rotate else rows)

    def rotated(self, g, x):
        """x (…, dim) in the indexer's Hadamard basis, block by block (indexer_basis)."""
        dim, block = x.shape[-1], len(self.indexer_basis)
        basis = g.ops.asarray(self.indexer_basis)
        return (x.reshape(*x.shape[:-1], dim // block, block) @ basis).reshape(x.shape)

    def indexer_queries(self, g, ix: Indexer, h, q_a, rope: tuple) -> IndexerInput:
        v4 = self.v4
        q = g.linear(q_a, ix.wq).reshape(len(h), v4.indexer_heads, v4.indexer_dim)
        q = self.rotated(g, self.rope_tail(g, q, rope))
        weights = g.linear(h, ix.proj) * np.float32(1.0 / math.sqrt(v4.indexer_dim * v4.indexer_heads))
        return IndexerInput(None, q, weights)

