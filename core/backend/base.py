"""The backend contract: every op the graph, the memory and the tools call, in one place.

A backend is an array module (`xp`) plus these ops. Shapes follow NumPy order: activations
`(n_tokens, features)`, weights `(n_out, n_in)` as GGUF stores them, attention tensors
`(n_tokens, n_head, head_dim)`, cache rows `(n_cells, n_head_kv, head_dim)`. A plain reference of
each op is in core/ops.py, and `llm test-ops -b NAME` checks a backend against it.

A backend says what it can do with `supports(op, types)`; a model's ops and the context's cache
types are checked when they are loaded and built, so a missing op is a one-sentence refusal
before any work. The fused mask ops (`BLOCK_TOPK_MASK`, `BLOCK_BOUNDS`) are optional: the memory
computes the same selection in array operations where a backend lacks them.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from .algebra import ArrayAlgebra

# The ops a model's forward pass, the memory and the tools may call, by ggml's names (test-ops checks
# those of core/ops.py under the same names).
OPS = ("ADD", "MUL", "SCALE", "MUL_MAT", "MUL_MAT_GGML", "GET_ROWS", "SET_ROWS", "RMS_NORM", "RMS_NORM_GROUP", "NORM",
       "SILU", "GELU", "SWIGLU", "GEGLU", "ROPE", "SOFT_MAX", "ATTN_SOFT_MAX", "FLASH_ATTN_EXT", "SSM_CONV", "SSM_SCAN",
       "TOP_K", "TOP_K_MASK", "MOE_ROUTE", "LIGHTNING_INDEXER", "BLOCK_TOPK_MASK", "BLOCK_BOUNDS", "HC_MIX", "HC_POST",
       "COMPRESS_POOL")


@dataclass(frozen=True)
class Yarn:
    """YaRN's angle correction, as ggml's rope_yarn: each dim pair's angle mixes the interpolated one
    (× freq_scale) and the extrapolated one by ext_factor times a ramp that falls from 1 to 0 over
    the pairs between corr_dims; cos and sin are scaled by mscale."""
    ext_factor: float
    corr_dims: tuple[float, float]
    mscale: float


def yarn(n_rot: int, n_ctx_orig: int, freq_base: float, freq_scale: float, beta_fast: float = 32.0,
         beta_slow: float = 1.0, ext_factor: float = 1.0, attn_factor: float = 1.0) -> Yarn:
    """The correction ggml computes for these parameters (ggml_rope_yarn_corr_dims, in float32)."""
    f = np.float32

    def corr_dim(beta: float):
        return f(n_rot) * np.log(f(n_ctx_orig) / (f(beta) * f(2) * f(math.pi))) / (f(2) * np.log(f(freq_base)))

    low, high = max(0.0, math.floor(corr_dim(beta_fast))), min(n_rot - 1.0, math.ceil(corr_dim(beta_slow)))
    mscale = f(attn_factor) * (f(1) + f(0.1) * np.log(f(1) / f(freq_scale))) if ext_factor else f(attn_factor)
    return Yarn(float(ext_factor), (float(low), float(high)), float(mscale))


def yarn_angles(theta_extrap, freq_scale: float, scaling: Yarn | None, xp=np):
    """ggml's angles (n, n_rot/2) from the unscaled ones: interpolated, and where YaRN applies mixed
    with the extrapolated ones by its ramp."""
    theta = theta_extrap * np.float32(freq_scale)
    if scaling is None or not scaling.ext_factor:
        return theta
    low, high = (np.float32(d) for d in scaling.corr_dims)
    pair = xp.arange(theta.shape[-1], dtype=np.float32)
    ramp = np.float32(1) - xp.clip((pair - low) / max(np.float32(0.001), high - low), 0, 1)
    mix = (ramp * np.float32(scaling.ext_factor)).astype(np.float32)
    return theta * (np.float32(1) - mix) + theta_extrap * mix


class Backend(ArrayAlgebra, ABC):
    """What the engine asks of a compute backend. `add`, `mul` and `scale` come from ArrayAlgebra."""

    name: str  # "cpu", "cuda", "cuda-emu"
    xp: object  # the array module: numpy, or cupy (or its host emulation)
    attn_path: str = "auto"  # --attn: "auto", "dense" or "sparse" (forced where the hint allows it)
    numerics: str = "f32"  # --numerics: "f32", or "ggml" (the cpu: matmul activations rounded as ggml-cpu)
    reads_value_views: bool = False  # attention takes V as a strided view of K (MLA's latent)
    last_attn_path: str = "dense"  # the path the last flash_attn_ext took, for -v
    notes: list[str]  # what loading fell back on, for -v

    # ---- what it is and what it can do ------------------------------------------------------

    @abstractmethod
    def describe(self) -> str:
        """One line for -v: the library, the device, the paths that run."""

    @abstractmethod
    def supports(self, op: str, types: tuple[str, ...] = ()) -> bool:
        """Whether `op` (one of OPS) runs here on tensors of these types (ggml type names, lower case)."""

    def configured(self, attn_path: str | None = None, numerics: str | None = None) -> "Backend":
        """This backend with another attention path or numerics, sharing its compiled kernels and
        buffers-to-be (itself when nothing changes): a context's backend."""
        if (attn_path or self.attn_path) == self.attn_path and (numerics or self.numerics) == self.numerics:
            return self
        other = copy.copy(self)
        other.attn_path, other.numerics = attn_path or self.attn_path, numerics or self.numerics
        other.notes = []
        return other

    @abstractmethod
    def prepare(self, weight_types, state_space: bool = False, cache_types=("f16",)) -> None:
        """Compile or load what a model with these weight types and cache types will run, before
        the first batch (so its time is not counted as compute)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for the work queued so far (timing)."""

    # ---- arrays and weights ------------------------------------------------------------------

    @abstractmethod
    def asarray(self, x):
        """A host array in this backend's memory."""

    @abstractmethod
    def to_numpy(self, x) -> np.ndarray:
        """An array of this backend as a host NumPy array."""

    @abstractmethod
    def load_weight(self, raw: np.ndarray, qtype, shape: tuple[int, ...], name: str = ""):
        """A GGUF tensor's raw bytes as this backend's weight (a matrix may stay quantized)."""

    @abstractmethod
    def concatenate(self, arrays, axis: int = 0):
        """Weights (or arrays) stacked along `axis`: q|k|v and gate|up run as one matmul."""

    @abstractmethod
    def take_rows(self, x, rows):
        """x[rows] for an activation array."""

    @abstractmethod
    def cache_rows_f32(self, x):
        """Cache rows (f32, f16 or quantized blocks) as float32 (n, heads, head_dim)."""

    # ---- matrix products and rows ------------------------------------------------------------

    @abstractmethod
    def matmul(self, x, w, out=None):
        """MUL_MAT: x @ w.T for a weight stored (n_out, n_in), into `out` when given; under ggml
        numerics the activations are rounded to 8-bit blocks first (MUL_MAT_GGML)."""

    @abstractmethod
    def mul_mat(self, raw_w, w_type, shape: tuple[int, int], x):
        """MUL_MAT over a weight given as raw GGUF bytes of any type (test-ops)."""

    @abstractmethod
    def get_rows(self, table, ids):
        """GET_ROWS: rows `ids` of a weight table as float32 (token embeddings)."""

    @abstractmethod
    def get_rows_raw(self, raw, w_type, shape: tuple[int, int], ids):
        """GET_ROWS of a table given as raw GGUF bytes (test-ops)."""

    @abstractmethod
    def set_rows(self, dst, ids, src, qtype=None):
        """SET_ROWS: dst with rows `ids` replaced by src, stored in dst's type (ggml blocks when
        qtype is given)."""

    # ---- elementwise and normalization -------------------------------------------------------

    @abstractmethod
    def rms_norm(self, x, weight, eps: float):
        """RMS_NORM: x / sqrt(mean(x²) + eps) over the last axis, times weight (one vector, or one
        per group of a (…, n_group, d) x) when given."""

    @abstractmethod
    def norm(self, x, eps: float):
        """NORM: layer norm without affine, (x - mean) / sqrt(var + eps)."""

    @abstractmethod
    def silu(self, x):
        """SILU: x·sigmoid(x)."""

    @abstractmethod
    def gelu(self, x):
        """GELU: GELU, tanh approximation (ggml-cpu's f16 table under ggml numerics)."""

    @abstractmethod
    def swiglu(self, gate, up):
        """SWIGLU: silu(gate)·up."""

    @abstractmethod
    def geglu(self, gate, up):
        """GEGLU: gelu(gate)·up."""

    @abstractmethod
    def gated_ffn(self, h, act: str):
        """SWIGLU or GEGLU (act) over a fused gate|up activation (n_tokens, 2·n_ff)."""

    @abstractmethod
    def rope_cache(self, pos, n_rot: int, freq_base: float, freq_scale: float = 1.0, scaling: Yarn | None = None):
        """ROPE tables for positions `pos`: cos and sin (n_tokens, n_rot/2), ggml's angle recurrence,
        with YaRN's correction where `scaling` is given (negative positions rotate back)."""

    @abstractmethod
    def rope(self, x, table, neox: bool):
        """ROPE: rotate the first n_rot dims of x (n_tokens, n_head, head_dim); pairs are adjacent,
        or (i, i + n_rot/2) when neox."""

    # ---- softmax and attention ---------------------------------------------------------------

    @abstractmethod
    def soft_max_ext(self, x, mask, scale: float, max_bias: float = 0.0, sinks=None):
        """SOFT_MAX: softmax(x·scale + slope_h·mask) over the last axis of x (n_head, rows, cols); a
        sink adds exp(sink_h) to the denominator."""

    @abstractmethod
    def attn_soft_max(self, q, k, v, mask, scale: float):
        """ATTN_SOFT_MAX: softmax(q·kᵀ·scale + mask)·v unfused, as llama.cpp computes attention
        with a KQ bias (T5's position bias, carried in mask (n_head or 1, n_tokens, n_kv))."""

    @abstractmethod
    def flash_attn_ext(self, q, k, v, mask=None, scale: float = 1.0, softcap: float = 0.0, sinks=None,
                       max_bias: float = 0.0, n_kv_max: int = 0, path: str | None = None):
        """FLASH_ATTN_EXT: softmax(softcap(q·kᵀ·scale) + slope·mask)·v with GQA and sinks; n_kv_max > 0
        promises no mask row keeps more cells (the sparse path may gather them). A fully masked row
        yields zeros. Sets last_attn_path."""

    # ---- state-space ops (Mamba) -------------------------------------------------------------

    @abstractmethod
    def ssm_conv(self, x, state, w, seq_index):
        """SSM_CONV: depthwise causal conv over tokens in ubatch order; returns (out, new states)."""

    @abstractmethod
    def ssm_scan(self, state, x, dt, A, B, C, seq_index):
        """SSM_SCAN: the selective scan (Mamba-1 A (H, N), Mamba-2 A (H, 1)); returns (y, new states)."""

    # ---- sampling ----------------------------------------------------------------------------

    @abstractmethod
    def argmax(self, x) -> int:
        """The index of the largest value (greedy sampling)."""

    @abstractmethod
    def sample_cdf(self, probs, ids, u: float) -> int:
        """The candidate where the running sum of unnormalized probs first reaches u·total."""

    @abstractmethod
    def top_k(self, x, k: int):
        """TOP_K: indices of the k largest values of each row, largest first (lower index on ties)."""

    # ---- fused mask ops (optional: supports() says) ------------------------------------------

    def block_topk_mask(self, q, base, pos, cell_pos, lo, hi, topk: int, block: int, local: int):
        """BLOCK_TOPK_MASK: the block top-k selection of masks.BlockTopK in one pass."""
        raise NotImplementedError(f"the {self.name} backend has no fused BLOCK_TOPK_MASK")

    def block_bounds(self, keys, cell_pos, seen_pos, stale, block: int, n_blocks: int, lo, hi) -> None:
        """BLOCK_BOUNDS: refresh the elementwise min/max of the stale key blocks, in place."""
        raise NotImplementedError(f"the {self.name} backend has no fused BLOCK_BOUNDS")


def refusal(backend: Backend, op: str, types: tuple[str, ...], who: str) -> str:
    """The sentence for an op a backend lacks."""
    on = f" on {', '.join(types)}" if types else ""
    return f"{who} needs {op}{on}, which the {backend.name} backend does not support (--backend cpu runs it)"
