"""`Graph`: one ubatch in flight. A model's forward pass is written against these helpers; the
doors to the memory are `attn` (attention layers) and `rs` (recurrent layers), `cross_attn` reads
the encoder output an encoder-decoder context keeps, and every numeric op goes through the backend."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .hyper import clamped_swiglu
from .moe import route


@dataclass
class IndexerInput:
    """A DSA layer's lightning-indexer inputs for the ubatch: per token its key (n_tokens, d) to
    keep, and its queries (n_tokens, n_head, d) and head weights (n_tokens, n_head) to score with.
    A layer without an indexer of its own (GLM-DSA's "shared" layers) gives only `reuse`: the
    earlier layer whose selection it attends with (see `reusing`)."""
    k: np.ndarray | None = None
    q: np.ndarray | None = None
    w: np.ndarray | None = None
    reuse: int | None = None

    @classmethod
    def reusing(cls, il: int) -> "IndexerInput":
        """Attend with layer il's selection: the same query rows keep the same cells."""
        return cls(reuse=il)

    def rows(self, rows) -> "IndexerInput":
        if self.reuse is not None:
            return self
        return IndexerInput(self.k, self.q[rows], self.w[rows])


class Graph:
    def __init__(self, model, mctx, backend, observer=None, logits_out: np.ndarray | None = None, stats=None,
                 embeddings: bool = False, cross=None, attn_impl: str = "naive"):
        self.hp = model.hparams
        self.attn_impl = attn_impl  # how a latent-attention model attends: "mla" or "naive"
        self.embeddings = embeddings  # `logits` returns the normed hidden state instead (llama.cpp's t_embd)
        self.cross = cross  # the encoder output a decoder attends (a CrossInput), if any
        self.observer = observer
        self.logits_out = logits_out  # where the output rows' logits go, if the caller has a buffer
        self.mctx = mctx
        self.ub = mctx.ubatch
        self.ops = backend
        self.n_tokens = self.ub.n_tokens
        self.out_rows = np.flatnonzero(self.ub.output)
        self._rope_tables: dict[tuple, object] = {}
        self._masks: dict[tuple[int, int], tuple] = {}
        self._selections: dict[tuple[int, int], tuple] = {}  # (layer, id of a group's base mask) → its DSA mask
        self.stats = stats  # an AttnStats, to time and count attention per layer (-v)

    def cb(self, name: str, il: int, x: np.ndarray) -> np.ndarray:
        """Show a named intermediate tensor to the observer, if any (llama.cpp's cb_eval)."""
        if self.observer is not None:
            self.observer(f"{name}-{il}" if il >= 0 else name, self.ub, x)
        return x

    def inp_embd(self, table: np.ndarray, scale: float | None = None) -> np.ndarray:
        x = self.ops.get_rows(table, self.ub.tokens)
        if scale is not None:
            x *= np.float32(scale)
        return x

    def norm(self, x: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
        return self.ops.rms_norm(x, weight, self.hp.rms_eps)

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return self.ops.norm(x, self.hp.norm_eps) * weight + bias

    def linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        out = self.ops.matmul(x, weight)
        if bias is not None:
            out += bias
        return out

    def rope(self, x: np.ndarray, il: int, neox: bool | None = None) -> np.ndarray:
        """RoPE at the ubatch positions with layer il's frequency base (neox: the model's mode
        unless given)."""
        key = (self.hp.rope_base(il), self.hp.rope_freq_scale)
        if key not in self._rope_tables:
            self._rope_tables[key] = self.ops.rope_cache(self.ub.pos, self.hp.n_rot, *key)
        return self.ops.rope(x, self._rope_tables[key], neox=self.hp.rope_neox if neox is None else neox)

    def rope_at(self, x: np.ndarray, base: float, pos: np.ndarray | None = None, inverse: bool = False,
                freq_scale: float = 1.0, scaling=None) -> np.ndarray:
        """RoPE (adjacent pairs) of x's first n_rot dims at `pos` (the ubatch positions unless given)
        with this frequency base and scale (and YaRN's `scaling`, a backend.base.Yarn); `inverse`
        rotates back (ggml's rope_back: the angles negated, so the same float32 angles with their
        sign flipped)."""
        args = (self.hp.n_rot, base, freq_scale, scaling)
        if pos is None:
            key = ("at", inverse, *args)
            if key not in self._rope_tables:
                self._rope_tables[key] = self.ops.rope_cache(-self.ub.pos if inverse else self.ub.pos, *args)
            table = self._rope_tables[key]
        else:
            table = self.ops.rope_cache(-pos if inverse else pos, *args)
        return self.ops.rope(x, table, neox=False)

    def attn(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray | None, scale: float, kq_bias=None,
             v_dim: int = 0, indexer: "IndexerInput | None" = None, sinks=None) -> np.ndarray:
        """Store this ubatch's K/V for layer il, attend over the memory with the mask the layer's
        producer makes; returns (n_tokens, n_head*d_v). `kq_bias(query_pos, key_pos)` gives a
        per-head bias (n_head, n_rows, n_kv) added to the scores (T5's relative positions).
        v None: V is a view of K, its first v_dim dims per head (MLA's latent). `indexer`: the
        ubatch's indexer keys to keep and queries for the layer's indexer mask (DSA). `sinks`: one
        extra logit per head in the softmax's denominator (n_head,), with no value."""
        view = self.mctx.layer(il)
        if indexer is None:
            view.store(k, v)
        else:
            view.store(k, v, indexer_k=indexer.k)
        d_v = v_dim if v is None else v.shape[2]
        groups = view.groups()
        if len(groups) == 1:
            return self._attend(il, q, groups[0], scale, kq_bias, indexer, d_v, sinks)[..., :d_v].reshape(len(q), -1)
        out = self.ops.xp.empty((len(q), q.shape[1], d_v), dtype=np.float32)
        for g in groups:  # one per cache stream
            rows = g.rows if isinstance(g.rows, slice) else self.ops.asarray(g.rows)
            out[rows] = self._attend(il, q[rows], g, scale, kq_bias, indexer and indexer.rows(rows), d_v, sinks)[..., :d_v]
        return out.reshape(len(q), -1)

    def cross_attn(self, il: int, q: np.ndarray, project, scale: float) -> np.ndarray:
        """Attention over the encoder output: `project(encoder_output)` gives layer il's K and V
        (n_enc, n_head_kv, d), made once per encode; a token sees its own sequence's encoder tokens."""
        if self.cross is None:
            raise RuntimeError("cross-attention before any encode")
        k, v = self.cross.kv(il, project)
        mask = self.cross.mask(self.ub.seq_id)
        return self.ops.flash_attn_ext(q, k, v, mask, scale).reshape(len(q), -1)

    def _attend(self, il: int, q, group, scale: float, kq_bias=None, indexer=None, d_v: int = 0, sinks=None):
        """Attention of one group of query rows. Where V is a view of K, a backend that reads
        strided rows gets that view; the others attend with all of K as values and the caller
        keeps the first d_v dims of the output (the CPU kernels read rows in place that way)."""
        t0 = time.perf_counter() if self.stats is not None else 0.0
        values = group.values
        if values is group.keys and self.ops.reads_value_views:
            values = values[..., :d_v]
        if indexer is not None:
            mask, n_kv_max = self._dsa_mask(il, q, group, indexer)
            self.cb("dsa_mask", il, mask)
        else:
            mask, n_kv_max = self._mask(il, q, group)
        if kq_bias is not None:  # llama.cpp never uses flash attention with a KQ bias
            out = self.ops.attn_soft_max(q, group.keys, values, mask + kq_bias(group.pos, group.cell_pos), scale)
        else:
            out = self.ops.flash_attn_ext(q, group.keys, values, mask, scale, sinks=sinks, n_kv_max=n_kv_max)
        if group.observe is not None:
            group.observe(self._attention_mass(q, group.keys, mask, scale))
        if self.stats is not None:
            self.ops.synchronize()
            self.stats.add(il, group, mask, time.perf_counter() - t0, self.ops, n_kv_max)
        return out

    def _dsa_mask(self, il: int, q, group, indexer: IndexerInput):
        """Layer il's indexer selection for this group of rows, kept for the layers that reuse it.
        A memory hands every layer of a ubatch the same base mask per group (the same rows over the
        same cells), so that mask's identity finds the selection the reused layer made for them."""
        if indexer.reuse is None:
            produced = self._checked(il, group, group.produce_mask(il, q, self.ops, {"indexer_q": indexer.q,
                                                                                     "indexer_w": indexer.w}))
            # holding the base keeps its id from being reused while the key lives
            self._selections[(il, id(group.mask))] = (group.mask, produced)
            return produced
        held = self._selections.get((indexer.reuse, id(group.mask)))
        if held is None:
            raise RuntimeError(f"layer {il} reuses the indexer selection of layer {indexer.reuse}, which made none "
                               "for these rows in this ubatch")
        return held[1]

    def _mask(self, il: int, q, group):
        """The producer's mask; one that ignores the queries is made once per ubatch and group."""
        if group.producer.uses_queries:
            return self._checked(il, group, group.produce_mask(il, q, self.ops))
        key = (id(group.producer), id(group.mask))
        if key not in self._masks:
            # holding the producer and the base keeps their ids from being reused while the key lives
            self._masks[key] = (group.producer, group.mask, self._checked(il, group, group.produce_mask(il, q, self.ops)))
        return self._masks[key][2]

    def _attention_mass(self, q, keys, mask, scale: float):
        """(n_kv,): the attention probability each cell got from these query rows, summed over the
        rows and the heads (what flash attention computes and does not keep), in a second pass over
        the cells some row keeps."""
        xp = self.ops.xp
        rows, n_head, d = q.shape
        n_head_kv = keys.shape[1]
        seen = xp.flatnonzero(xp.isfinite(mask).any(axis=0))
        k = self.ops.cache_rows_f32(keys[seen])[..., :d].transpose(1, 2, 0)  # (n_head_kv, d, n_seen)
        # the query heads of a KV head side by side: (n_head_kv, rows * group, d), row-major
        qg = xp.asarray(q, dtype=np.float32).reshape(rows, n_head_kv, -1, d).transpose(1, 0, 2, 3)
        group = n_head // n_head_kv
        probs = self.ops.soft_max_ext(xp.matmul(qg.reshape(n_head_kv, rows * group, d), k),
                                      xp.repeat(mask[:, seen], group, axis=0), scale)
        mass = xp.zeros(mask.shape[1], dtype=np.float32)
        mass[seen] = probs.sum(axis=(0, 1))
        return mass

    @staticmethod
    def _checked(il: int, group, produced):
        """A producer's (mask, n_kv_max) as the attention op needs it (a plugin's may be wrong)."""
        mask, n_kv_max = produced
        if getattr(mask, "shape", None) != group.mask.shape or not isinstance(n_kv_max, (int, np.integer)) \
                or n_kv_max < 0:
            raise ValueError(f"layer {il}'s mask producer ({getattr(group.producer, 'kind', '?')}) returned a mask of "
                             f"shape {getattr(mask, 'shape', type(mask).__name__)} and bound {n_kv_max!r}; attention "
                             f"needs shape {group.mask.shape} and a bound >= 0")
        return mask, int(n_kv_max)

    def rs(self, il: int):
        """Layer il's recurrent states for this ubatch (a RecurrentView: read, write, seq_index)."""
        return self.mctx.layer(il)

    def ffn(self, x: np.ndarray, gate_up: np.ndarray, down: np.ndarray, act: str, clamp: float = 0.0) -> np.ndarray:
        """Gated feed-forward with the gate and up projections fused into one weight; a clamp
        (DeepSeek-V4's SwiGLU) bounds the gate above and the up projection both ways first."""
        h = self.ops.matmul(x, gate_up)
        if clamp > 1e-6:  # llama.cpp's threshold for an active clamp
            n_ff = h.shape[1] // 2
            return self.ops.matmul(clamped_swiglu(self.ops, h[:, :n_ff], h[:, n_ff:], clamp), down)
        return self.ops.matmul(self.ops.gated_ffn(h, act), down)

    def moe(self, x: np.ndarray, p, w, act: str = "swiglu", il: int = -1) -> np.ndarray:
        """A mixture-of-experts FFN (`p` MoEParams, `w` MoEWeights): the router picks each token's
        experts, each expert runs over only the rows routed to it, and their outputs are summed with
        the router's weights; shared experts run for every row."""
        by_token = None if w.by_token is None else w.by_token[self.ub.tokens]
        r = route(self.ops.to_numpy(self.ops.matmul(x, w.router)), p, w.selection_bias, by_token)
        self.cb("ffn_moe_topk", il, r.experts)
        self.cb("ffn_moe_weights", il, r.weights)
        if r.groups is not None:
            self.cb("ffn_moe_groups", il, r.groups)
        out = self.ops.xp.zeros(x.shape, dtype=np.float32)
        for e in np.unique(r.experts):
            rows, slot = np.nonzero(r.experts == e)
            h = self.ffn(self.ops.take_rows(x, rows), w.gate_up[e], w.down[e], act, w.clamp)
            out[self.ops.asarray(rows)] += h * self.ops.asarray(r.weights[rows, slot])[:, None]
        if w.shared_gate_up is not None:
            out += self.ffn(x, w.shared_gate_up, w.shared_down, act, w.shared_clamp)
        return out

    def per_head(self, x, weights: list):
        """Each head's own projection: x (n_tokens, n_head, n_in), weights[h] (n_out, n_in) →
        (n_tokens, n_head, n_out)."""
        xp = self.ops.xp
        return xp.stack([self.ops.matmul(xp.ascontiguousarray(x[:, h]), w) for h, w in enumerate(weights)], axis=1)

    def select_outputs(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep only the rows that produce outputs (done before the last layer's FFN)."""
        if len(self.out_rows) == self.n_tokens:
            return xs
        return tuple(self.ops.take_rows(x, self.out_rows) for x in xs)

    def logits(self, x: np.ndarray, norm_weight: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The output rows' logits, or under `embeddings` their normed hidden states."""
        h = self.cb("result_norm", -1, self.norm(x, norm_weight))
        if self.embeddings:
            return self.embd(h)
        return self.ops.matmul(h, head, out=self.logits_out)

    def embd(self, x: np.ndarray) -> np.ndarray:
        """An embeddings output (n_outputs, n_embd), into the caller's buffer if it has one."""
        if self.logits_out is None:
            return x
        self.logits_out[...] = x
        return self.logits_out


class AttnStats:
    """Per layer: which mask producer ran and which kernel path, the share of visible cells the
    masks kept, and the seconds spent making masks and attending (what -v prints)."""

    def __init__(self):
        self.layers: dict[int, dict] = {}

    def add(self, il: int, group, mask, seconds: float, backend, n_kv_max: int) -> None:
        xp = backend.xp
        row = self.layers.setdefault(il, {"masks": set(), "paths": set(), "kept": 0, "visible": 0,
                                          "seconds": 0.0, "calls": 0})
        selected = n_kv_max > 0 or group.producer.kind == "dense"
        row["masks"].add(group.producer.kind if selected else "dense(auto)")
        row["visible"] += int(xp.isfinite(group.mask).sum())
        row["kept"] += int(xp.isfinite(mask).sum())
        row["seconds"] += seconds
        row["calls"] += 1
        row["paths"].add(backend.last_attn_path)

    def lines(self) -> list[str]:
        out = []
        for il, r in sorted(self.layers.items()):
            kept = r["kept"] / r["visible"] if r["visible"] else 1.0
            out.append(f"layer {il:3d}: {'+'.join(sorted(r['masks'])):<17} mask, {'+'.join(sorted(r['paths'])):<12} path, "
                       f"kept {100 * kept:6.2f}% of visible cells, {1e3 * r['seconds']:9.2f} ms in attention")
        return out
