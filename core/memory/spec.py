"""What a model declares about its memory, one entry per layer (ARCHITECTURE §3.5): the factory
builds a memory from these and the flags, and never reads a model's hyper-parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RopeSpec:
    """How a layer's cached keys were rotated, so that the memory can shift them itself."""
    n_rot: int
    base: float
    freq_scale: float = 1.0
    neox: bool = False
    offset: int = 0  # where the rotated dims start in each head (MLA's rope part is the tail of K)


@dataclass(frozen=True)
class IndexerSpec:
    """DeepSeek-3.2's lightning indexer: one key head of head_dim per cell, kept beside the layer's
    K rows in the same cells; top_k keys per query become the attention mask."""
    head_dim: int
    top_k: int
    rope: RopeSpec | None = None
    hadamard: bool = False  # keys are stored multiplied by the orthonormal Hadamard matrix (as llama.cpp does)


@dataclass(frozen=True)
class CompressSpec:
    """DeepSeek-V4's compressed rows of a layer: every `ratio` tokens of a sequence pool into one
    row of `width` values (a softmax-gated sum of per-token projections, then the model's norm and
    rope), visible from the block's last token on. With `overlap` (ratio 4) a row pools its block's
    second halves with the block before's first halves, so the projections are twice as wide. An
    `indexer` keeps its own compressed keys, compressed the same way, and each query attends only
    the top_k rows they score best (CSA); without one every visible row is attended (HCA)."""
    ratio: int
    width: int
    overlap: bool = False
    indexer: IndexerSpec | None = None

    @property
    def state_size(self) -> int:
        """Per-token projections a sequence keeps for its unfinished blocks."""
        return 2 * self.ratio if self.overlap else self.ratio

    @property
    def proj_width(self) -> int:
        return 2 * self.width if self.overlap else self.width


@dataclass(frozen=True)
class AttnSpec:
    """An attention layer: K/V rows of n_head_kv heads; window > 0 for a sliding-window layer;
    rope None when the keys carry no position rotation (nothing to shift). With `v_view` no V is
    stored: the values are the first head_dim_v dims of each key head (MLA's latent). A `compress`
    layer attends its compressed rows too (memory/compressed.py)."""
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    window: int = 0
    rope: RopeSpec | None = None
    v_view: bool = False
    indexer: IndexerSpec | None = None
    compress: CompressSpec | None = None  # compressed rows attended beside the cached keys (DeepSeek-V4)

    @property
    def k_width(self) -> int:
        return self.n_head_kv * self.head_dim_k

    @property
    def v_width(self) -> int:
        """Values stored per cell (0 where V is a view of K)."""
        return 0 if self.v_view else self.n_head_kv * self.head_dim_v


@dataclass(frozen=True)
class RecurrentSpec:
    """A recurrent layer: per sequence, the conv state (the last d_conv - 1 inputs of its
    channels) and the SSM state, both float32. A layer that is a short convolution only (LFM2)
    keeps an SSM state of no elements, shape (0,): every memory operation still covers it."""
    conv_shape: tuple[int, int]  # (d_conv - 1, channels)
    ssm_shape: tuple[int, ...] = (0,)  # (heads, head_dim, d_state)

    @property
    def n_floats(self) -> int:
        n_conv = self.conv_shape[0] * self.conv_shape[1]
        n_ssm = 1
        for dim in self.ssm_shape:
            n_ssm *= dim
        return n_conv + n_ssm


LayerSpec = AttnSpec | RecurrentSpec


@dataclass(frozen=True)
class MemorySpec:
    """A model's memory layout: one spec per layer, the vocabulary size (token histories are
    validated against it), and what kind of model holds it: a causal "decoder", an "encoder" that
    keeps no memory (BERT), or an "enc-dec" whose layers here are its decoder's (T5)."""
    layers: dict[int, LayerSpec] = field(default_factory=dict)
    n_vocab: int = 1 << 31
    model_kind: str = "decoder"

    def of(self, kind: type) -> dict[int, LayerSpec]:
        return {il: s for il, s in self.layers.items() if isinstance(s, kind)}

    @property
    def window(self) -> int:
        """The sliding window of the windowed layers (0: none)."""
        return max((s.window for s in self.of(AttnSpec).values()), default=0)

    @property
    def window_layers(self) -> frozenset[int]:
        return frozenset(il for il, s in self.of(AttnSpec).items() if s.window > 0)
