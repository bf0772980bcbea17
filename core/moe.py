"""Mixture of experts as llama.cpp's build_moe_ffn runs it: the router's choice of experts per
token (softmax or sigmoid gating, a selection-only bias, grouped routing, weight normalization
and scaling) and the layer's weights, the experts kept as slices of their stacked 3-D tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ModelFileError
from .gguf import GGUFFile

# llama_expert_gating_func_type as GGUF files store it (3, softmax over the chosen weights: not supported)
GATING = {1: "softmax", 2: "sigmoid", 4: "sqrtsoftplus"}
MAX_EXPERTS = 1 << 12
WEIGHTS_SUM_MIN = 6.103515625e-5  # llama.cpp clamps the sum before normalizing (the smallest normal f16)


@dataclass(frozen=True)
class MoEParams:
    n_expert: int
    n_used: int  # experts per token
    n_ff: int  # each expert's hidden size
    n_shared: int = 0  # shared experts, run for every token as one FFN of n_shared * n_ff
    n_dense_lead: int = 0  # leading layers whose FFN is dense
    gating: str = "softmax"
    norm_weights: bool = False  # the chosen weights are divided by their sum
    weights_scale: float = 0.0  # then multiplied by this (0: not scaled)
    n_group: int = 1  # experts in n_group groups, of which the n_group_used best are open to a token
    n_group_used: int = 1


def read_moe_params(gguf: GGUFFile, arch: str, n_ff_default: int, norm_weights: bool = False,
                    gating_default: int | None = 1) -> MoEParams | None:
    """The MoE keys of `arch`, checked against each other; None for a model without experts.
    gating_default None: the gating key is required."""
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    n_expert = gguf.get_int(key("expert_count"), 0, lo=0, hi=MAX_EXPERTS)
    if n_expert == 0:
        return None
    n_used = gguf.get_int(key("expert_used_count"), lo=1, hi=n_expert)
    gating = gguf.get_int(key("expert_gating_func"), *(() if gating_default is None else (gating_default,)),
                          lo=0, hi=255)
    if gating not in GATING:
        raise ModelFileError(f"{gguf.path}: {key('expert_gating_func')} {gating} is not supported "
                             f"(known: {', '.join(f'{k} {v}' for k, v in GATING.items())})")
    n_group = gguf.get_int(key("expert_group_count"), 1, lo=1, hi=n_expert)
    n_group_used = gguf.get_int(key("expert_group_used_count"), 1 if n_group == 1 else n_group, lo=1, hi=n_group)
    if n_expert % n_group or n_group_used * (n_expert // n_group) < n_used:
        raise ModelFileError(f"{gguf.path}: {n_expert} experts in {n_group} groups with {n_group_used} used cannot "
                             f"offer {n_used} experts per token")
    return MoEParams(
        n_expert=n_expert, n_used=n_used,
        n_ff=gguf.get_int(key("expert_feed_forward_length"), n_ff_default, lo=1, hi=1 << 24),
        n_shared=gguf.get_int(key("expert_shared_count"), 0, lo=0, hi=MAX_EXPERTS),
        n_dense_lead=gguf.get_int(key("leading_dense_block_count"), 0, lo=0, hi=1 << 12),
        gating=GATING[gating],
        norm_weights=gguf.get_bool(key("expert_weights_norm"), norm_weights),
        weights_scale=gguf.get_float(key("expert_weights_scale"), 0.0, lo=0.0, hi=1e6),
        n_group=n_group, n_group_used=n_group_used)


@dataclass
class MoEWeights:
    router: np.ndarray  # (n_expert, n_embd), float32
    gate_up: list  # per expert: gate and up stacked, (2 n_ff, n_embd)
    down: list  # per expert: (n_embd, n_ff)
    selection_bias: np.ndarray | None = None  # exp_probs_b: added to the scores for choosing only
    shared_gate_up: object = None  # the shared experts' FFN, if any
    shared_down: object = None
    by_token: np.ndarray | None = None  # hash routing (DeepSeek-V4): each token id's experts, (n_vocab, n_used)
    clamp: float = 0.0  # clamped SwiGLU (gate ≤ clamp, |up| ≤ clamp) of the routed experts (0: none)
    shared_clamp: float = 0.0  # and of the shared experts


@dataclass
class Route:
    experts: np.ndarray  # (n_tokens, n_used) int64, best first
    weights: np.ndarray  # (n_tokens, n_used) float32
    groups: np.ndarray | None = None  # (n_tokens, n_group_used): the groups open to each token


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, best first (ties: the lower index first)."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def gate_probs(logits: np.ndarray, gating: str) -> np.ndarray:
    """The router's probabilities: softmax over the experts, or each expert's sigmoid, or
    sqrt(softplus) (softplus(x) = x above 20, as ggml computes it)."""
    if gating == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if gating == "sqrtsoftplus":
        return np.sqrt(np.where(logits > 20, logits, np.log1p(np.exp(np.minimum(logits, 20)))))
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-logits))


def route(logits: np.ndarray, p: MoEParams, selection_bias: np.ndarray | None = None,
          experts: np.ndarray | None = None) -> Route:
    """Each token's experts and their weights from the router's logits (n_tokens, n_expert);
    `experts` given (hash routing) fixes the choice, and the router only weighs it."""
    logits = np.asarray(logits, dtype=np.float32)
    probs = gate_probs(logits, p.gating).astype(np.float32)
    if experts is not None:
        return _weighed(probs, np.asarray(experts, dtype=np.int64), p)
    selection = probs if selection_bias is None else probs + selection_bias
    groups = None
    if p.n_group > 1:  # a group scores the sum of its two best experts; the rest are closed
        per_group = selection.reshape(len(selection), p.n_group, -1)
        best_two = np.sort(per_group, axis=-1)[..., -min(2, per_group.shape[-1]):]
        groups = top_k(best_two.sum(axis=-1), p.n_group_used)
        open_ = np.zeros(per_group.shape[:2], dtype=bool)
        np.put_along_axis(open_, groups, True, axis=1)
        selection = np.where(np.repeat(open_, per_group.shape[-1], axis=1), selection, -np.inf)
    chosen = _weighed(probs, top_k(selection, p.n_used), p)
    chosen.groups = groups
    return chosen


def _weighed(probs: np.ndarray, experts: np.ndarray, p: MoEParams) -> Route:
    """The chosen experts' weights: their probabilities, normalized and scaled as the model says."""
    weights = np.take_along_axis(probs, experts, axis=1)
    if p.norm_weights:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), np.float32(WEIGHTS_SUM_MIN))
    if p.weights_scale:
        weights = weights * np.float32(p.weights_scale)
    return Route(experts, weights.astype(np.float32))


def load_moe(model, gguf: GGUFFile, blk: str, p: MoEParams, n_embd: int) -> MoEWeights:
    """Layer `blk`'s router, experts (each a view of its slice of the stacked tensors, in the
    GGUF's type), selection bias and shared experts."""
    router = model.weight(gguf, f"{blk}.ffn_gate_inp.weight", (p.n_expert, n_embd), matrix=False)
    gate = model.stacked(gguf, f"{blk}.ffn_gate_exps.weight", p.n_expert, (p.n_ff, n_embd))
    up = model.stacked(gguf, f"{blk}.ffn_up_exps.weight", p.n_expert, (p.n_ff, n_embd))
    down = model.stacked(gguf, f"{blk}.ffn_down_exps.weight", p.n_expert, (n_embd, p.n_ff))
    weights = MoEWeights(router, [model.backend.concatenate([g, u], axis=0) for g, u in zip(gate, up)], down)
    if f"{blk}.exp_probs_b.bias" in gguf.tensors:
        weights.selection_bias = model.weight(gguf, f"{blk}.exp_probs_b.bias", (p.n_expert,))
    if p.n_shared:
        n_ff = p.n_ff * p.n_shared
        weights.shared_gate_up = model.fused(gguf, [(f"{blk}.ffn_gate_shexp.weight", (n_ff, n_embd)),
                                                    (f"{blk}.ffn_up_shexp.weight", (n_ff, n_embd))])
        weights.shared_down = model.weight(gguf, f"{blk}.ffn_down_shexp.weight", (n_embd, n_ff))
    return weights
