"""What every architecture shares: typed hyper-parameters, weight loading, the default memory."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

from ..backend import get_backend
from ..backend.base import refusal
from ..batch import POS_LIMIT
from ..errors import ModelFileError, UnsupportedError, printable
from ..gguf import GGUFFile
from ..moe import MoEParams
from ..quants import dequantize
from ..memory import AttnSpec, MemorySpec, RecurrentSpec, RopeSpec
from ..vocab import Vocab

ProgressFn = Callable[[int, int], None]


@dataclass
class HParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_rot: int
    rms_eps: float
    norm_eps: float = 1e-5  # LayerNorm's epsilon, for the models that use it
    pooling: str = ""  # GGUF pooling_type: how an embeddings context pools a sequence ("": not given)
    moe: MoEParams | None = None  # the experts of a mixture-of-experts model
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_neox: bool = False
    n_swa: int = 0
    swa_layers: frozenset[int] = field(default_factory=frozenset)
    rope_freq_base_swa: float | None = None
    recurrent_layers: frozenset[int] = field(default_factory=frozenset)  # a hybrid's layers without attention

    def is_swa(self, il: int) -> bool:
        return il in self.swa_layers

    def rope_base(self, il: int) -> float:
        if self.rope_freq_base_swa is not None and self.is_swa(il):
            return self.rope_freq_base_swa
        return self.rope_freq_base

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_head_kv * self.head_dim_k

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_head_kv * self.head_dim_v


# sane bounds for hyper-parameters, checked before anything is sized from them
MAX_EMBD = 1 << 20
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1 << 14
MAX_LAYERS = 1 << 12
MAX_FF = 1 << 24
MAX_VOCAB = 1 << 24
MAX_ROPE_BASE = 1e12  # real models use up to ~1e7; float32 must hold its powers


def read_hparams(gguf: GGUFFile, arch: str, block_prefix: str = "blk.", hybrid: bool = False,
                 n_ff_default: int | None = None) -> HParams:
    """The hyper-parameters every transformer GGUF carries, checked for type, range and
    consistency with each other and with the tensors in the file (blocks named block_prefix N.).
    A `hybrid` architecture marks its recurrent layers with a 0 in a per-layer head_count_kv;
    `n_ff_default` stands for a feed_forward_length the architecture does not require."""
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    get = lambda name, *a, **kw: gguf.get_int(key(name), *a, per_layer=True, **kw)  # noqa: E731
    n_embd = get("embedding_length", lo=1, hi=MAX_EMBD)
    n_head = get("attention.head_count", lo=1, hi=MAX_HEADS)
    n_layer = count_blocks(gguf, get("block_count", lo=1, hi=MAX_LAYERS), block_prefix)
    recurrent = frozenset()
    if hybrid:
        n_head_kv, recurrent = read_layer_kinds(gguf, key("attention.head_count_kv"), n_layer, n_head)
    else:
        n_head_kv = get("attention.head_count_kv", n_head, lo=1, hi=n_head)
    if n_head % n_head_kv:
        raise ModelFileError(f"{gguf.path}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    if key("attention.key_length") not in gguf.metadata and n_embd % n_head:
        raise ModelFileError(f"{gguf.path}: embedding_length {n_embd} is not a multiple of head_count {n_head} "
                             "and attention.key_length is missing")
    head_dim_k = get("attention.key_length", n_embd // n_head, lo=1, hi=MAX_HEAD_DIM)
    n_rot = get("rope.dimension_count", head_dim_k, lo=0, hi=head_dim_k)
    if n_rot < 2 or n_rot % 2:
        raise ModelFileError(f"{gguf.path}: rope.dimension_count {n_rot} must be an even number from 2 to the "
                             f"head size {head_dim_k} (attention.key_length)")
    n_vocab = get("vocab_size", len(gguf.get_strs("tokenizer.ggml.tokens", [])), lo=1, hi=MAX_VOCAB)
    return HParams(
        n_vocab=n_vocab,
        n_ctx_train=get("context_length", lo=1, hi=POS_LIMIT),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=get("attention.value_length", head_dim_k, lo=1, hi=MAX_HEAD_DIM),
        n_ff=get("feed_forward_length", *(() if n_ff_default is None else (n_ff_default,)), lo=1, hi=MAX_FF),
        n_rot=n_rot,
        rms_eps=gguf.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5, hi=1.0, positive=True),
        rope_freq_base=gguf.get_float(key("rope.freq_base"), 10000.0, hi=MAX_ROPE_BASE, positive=True),
        rope_freq_scale=1.0 / gguf.get_float(key("rope.scale_linear"), 1.0, lo=1e-6, hi=1e6),
        recurrent_layers=recurrent,
    )


def read_layer_kinds(gguf: GGUFFile, key: str, n_layer: int, n_head: int) -> tuple[int, frozenset[int]]:
    """A hybrid's per-layer head_count_kv (as llama.cpp reads it: 0 makes a layer recurrent):
    the KV head count of its attention layers and the set of its recurrent layers."""
    values = gguf.metadata.get(key)
    if values is None:
        raise ModelFileError(f"{gguf.path}: metadata {key} is missing; a hybrid model gives it per layer "
                             "(0: a recurrent layer)")
    if isinstance(values, int) and not isinstance(values, bool):
        values = np.full(n_layer, values)
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "iu" or values.ndim != 1:
        raise ModelFileError(f"{gguf.path}: metadata {key} is not an integer or an array of integers")
    if len(values) != n_layer:
        raise ModelFileError(f"{gguf.path}: metadata {key} has {len(values)} values but block_count is {n_layer}")
    kv = sorted(set(values.tolist()) - {0})
    if not kv:
        raise ModelFileError(f"{gguf.path}: metadata {key} makes every layer recurrent; this architecture "
                             "has attention layers")
    if len(kv) > 1 or not 1 <= kv[0] <= n_head:
        raise UnsupportedError(f"{gguf.path}: metadata {key} gives attention layers {kv} KV heads; this engine "
                               f"runs hybrids whose attention layers share one count from 1 to head_count {n_head}")
    return kv[0], frozenset(np.flatnonzero(values == 0).tolist())


def count_blocks(gguf: GGUFFile, n_layer: int, prefix: str = "blk.", key: str = "block_count") -> int:
    """A block count, checked against the `{prefix}N.` tensors the file holds."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    present = {int(m.group(1)) for name in gguf.tensors if (m := pattern.match(name))}
    if present != set(range(n_layer)):
        raise ModelFileError(f"{gguf.path}: {key} is {n_layer} but the file holds tensors of "
                             f"{len(present)} blocks" + (f" (up to {prefix}{max(present)})" if present else ""))
    return n_layer


def describe(gguf: GGUFFile, arch: str, n_params: int) -> str:
    """llama-bench's model_type: architecture, size label and file type, e.g. 'llama 135M Q4_1'."""
    size = printable(gguf.get_str("general.size_label", ""), 20) or (f"{n_params / 1e9:.1f}B" if n_params >= 1e9
                                                       else f"{n_params / 1e6:.0f}M")
    try:
        ftype = LlamaFileType(gguf.get_int("general.file_type", -1, lo=-1)).name.removeprefix("MOSTLY_")
    except ValueError:
        ftype = "unknown type"
    return f"{arch} {size} {ftype}"


def fingerprint(gguf: GGUFFile, hp: HParams) -> str:
    """Identifies a model's weights for state files: shapes, types and a sample of every tensor."""
    digest = hashlib.sha256(repr((gguf.architecture, sorted(asdict(hp).items()))).encode())
    for name, info in gguf.tensors.items():
        digest.update(f"{name}:{info.type.name}:{info.shape}".encode("utf-8", "surrogateescape"))
        digest.update(gguf.raw(name)[:256].tobytes())
    return digest.hexdigest()[:32]


class Model:
    """Base class of an architecture: `load_hparams`, `load_tensors`, `forward`, `memory_spec`."""

    arch: ClassVar[str] = ""
    attn_impls: ClassVar[tuple[str, ...]] = ()  # latent-attention models: their --attn-impl values, default first
    # the backend ops (core/backend/base.py OPS) the forward pass calls, checked before loading
    ops: ClassVar[tuple[str, ...]] = ("GET_ROWS", "MUL_MAT", "RMS_NORM", "ROPE", "SWIGLU", "FLASH_ATTN_EXT", "TOP_K")
    output_norm_name: ClassVar[str] = "output_norm.weight"  # the final norm's tensor
    embeddings_refusal: ClassVar[str] = ""  # why an embeddings context cannot serve this architecture ("": it can)

    def __init__(self, gguf: GGUFFile, progress: ProgressFn | None = None, backend=None):
        self.path = gguf.path
        self.backend = backend or get_backend("cpu")  # where the weights live and in what type
        self.hparams = self.load_hparams(gguf)
        self.vocab = Vocab(gguf)
        self.chat_template = gguf.get_str("tokenizer.chat_template", None)
        self.name = printable(gguf.get_str("general.name", "") or gguf.path.stem, 80)
        self.fingerprint = fingerprint(gguf, self.hparams)
        self.size_bytes = sum(t.n_bytes for t in gguf.tensors.values())
        self.n_params = sum(t.n_elements for t in gguf.tensors.values())
        self.desc = describe(gguf, self.arch, self.n_params)
        if self.hparams.n_vocab != self.vocab.n_tokens:
            raise ModelFileError(f"{gguf.path}: vocab_size {self.hparams.n_vocab} differs from the "
                                 f"{self.vocab.n_tokens} tokens of the tokenizer")
        self._progress = progress
        self._loaded, self._to_load = 0, sum(t.n_bytes for t in gguf.tensors.values())
        self.weight_types: set = set()  # GGUF types of the matrices, for the backend's kernels
        self.load_tensors(gguf)

    def load_hparams(self, gguf: GGUFFile) -> HParams:
        return read_hparams(gguf, self.arch)

    def load_tensors(self, gguf: GGUFFile) -> None:
        """The token embeddings, every layer by `load_layer`, the final norm and the lm head."""
        hp = self.hparams
        self.token_embd = self.weight(gguf, "token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.layers = [self.load_layer(gguf, il) for il in range(hp.n_layer)]
        self.output_norm = self.weight(gguf, self.output_norm_name, (hp.n_embd,))
        self.output = self.output_head(gguf, self.token_embd)

    def load_layer(self, gguf: GGUFFile, il: int):
        raise NotImplementedError

    def forward(self, g) -> np.ndarray:
        """Run one ubatch; return the logits of its output rows, (n_outputs, n_vocab)."""
        raise NotImplementedError

    def encode(self, g) -> np.ndarray:
        """Run the encoder over one ubatch (attention within each sequence, both ways); return its
        output, (n_tokens, n_embd). Only models with an encoder have one."""
        raise NotImplementedError(f"{self.arch} has no encoder")

    @classmethod
    def check_backend(cls, gguf: GGUFFile, backend) -> None:
        """Refuse, before any tensor is read, a backend that lacks an op this architecture calls
        (matmuls on the file's matrix types, row lookups on its embedding type)."""
        matrix_types = tuple(sorted({t.type.name.lower() for t in gguf.tensors.values() if len(t.numpy_shape) == 2}))
        for op in cls.ops:
            types = matrix_types if op in ("MUL_MAT", "GET_ROWS") else ()
            if not backend.supports(op, types):
                raise UnsupportedError(refusal(backend, op, types, cls.arch))

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        """The memory layout, one spec per layer, for the attention implementation chosen (see
        `attn_impls`): here every layer is attention as the decoder hyper-parameters describe it;
        other architectures declare their own."""
        hp = self.hparams
        return MemorySpec({il: self.attention_spec(il) for il in range(hp.n_layer)}, hp.n_vocab)

    def attention_spec(self, il: int, rope: bool = True) -> AttnSpec:
        """Attention layer il's cache as the hyper-parameters describe it (rope False: keys carry
        no rotation, so a shift moves nothing)."""
        hp = self.hparams
        return AttnSpec(hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, hp.n_swa if hp.is_swa(il) else 0,
                        RopeSpec(hp.n_rot, hp.rope_base(il), hp.rope_freq_scale, hp.rope_neox) if rope else None)

    @property
    def is_recurrent(self) -> bool:
        return bool(self.memory_spec().of(RecurrentSpec))

    # ---- weight loading helpers ----------------------------------------------------------

    def weight(self, gguf: GGUFFile, name: str, shape: tuple[int, ...], matrix: bool = True) -> np.ndarray:
        """Tensor `name` in the backend's compute type, checking its NumPy shape. A 2-D tensor
        is a matmul weight (kept in its GGUF type where a kernel reads it) unless `matrix` is
        False: then it is a parameter array in float32 (SSM conv taps, decays, group norms)."""
        info = self._checked(gguf, name, shape)
        if matrix:
            out = self.backend.load_weight(gguf.raw(name), info.type, info.numpy_shape, name)
        else:
            out = self.backend.load_weight(gguf.raw(name), info.type, (info.n_elements,), name).reshape(shape)
        self.note_loaded(info, matrix=len(shape) == 2 and matrix)
        return out

    def note_loaded(self, info, matrix: bool = True) -> None:
        """Count a loaded tensor for the progress bar; a matmul weight's type for `prepare`."""
        if matrix:
            self.weight_types.add(info.type)
        self._loaded += info.n_bytes
        if self._progress:
            self._progress(self._loaded, self._to_load)

    def stacked(self, gguf: GGUFFile, name: str, n: int, shape: tuple[int, int]) -> list:
        """A stacked (n, n_out, n_in) tensor (experts, heads) as n matmul weights, each a view of
        its own bytes in the GGUF's type."""
        info = self._checked(gguf, name, (n, *shape))
        raw = gguf.raw(name)
        size = len(raw) // n
        out = [self.backend.load_weight(raw[i * size:(i + 1) * size], info.type, shape, f"{name}[{i}]")
               for i in range(n)]
        self.note_loaded(info)
        return out

    def stacked_transposed(self, gguf: GGUFFile, name: str, n: int, shape: tuple[int, int]) -> list:
        """The n matrices of a stacked (n, n_in, n_out) tensor transposed to (n_out, n_in) weights,
        in float32 (a transpose cannot stay in the GGUF's blocks). A second copy of a tensor also
        loaded as it is, so not counted again for the progress bar."""
        full = self.float_tensor(gguf, name, (n, *shape[::-1]), count=False)
        return [self.from_array(m.T, f"{name}[{i}]ᵀ") for i, m in enumerate(full)]

    def float_tensor(self, gguf: GGUFFile, name: str, shape: tuple[int, ...], count: bool = True) -> np.ndarray:
        """Tensor `name` expanded to a float32 host array, to be rearranged before it is placed."""
        info = self._checked(gguf, name, shape)
        if count:
            self.note_loaded(info)
        return dequantize(gguf.raw(name), info.type, info.n_elements, name=name).reshape(shape)

    def from_array(self, a: np.ndarray, name: str):
        """A float32 host matrix as a matmul weight of the backend."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        return self.backend.load_weight(a.reshape(-1).view(np.uint8), GGMLQuantizationType.F32, a.shape, name)

    def _checked(self, gguf: GGUFFile, name: str, shape: tuple[int, ...]):
        info = gguf.tensor_info(name)
        if info.numpy_shape != tuple(shape):
            raise ModelFileError(f"{gguf.path}: tensor '{name}' has shape {list(info.numpy_shape)}, "
                                 f"but the hyper-parameters make it {list(shape)}")
        return info

    def fused(self, gguf: GGUFFile, names_shapes: list[tuple[str, tuple[int, int]]]) -> np.ndarray:
        """Several (n_out_i, n_in) weights stacked into one (sum n_out_i, n_in) matrix."""
        return self.backend.concatenate([self.weight(gguf, n, s) for n, s in names_shapes], axis=0)

    def attention_weights(self, gguf: GGUFFile, il: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's fused q/k/v projection (n_q + 2 n_kv, n_embd) and its output projection."""
        hp, blk = self.hparams, f"blk.{il}"
        wqkv = self.fused(gguf, [(f"{blk}.attn_q.weight", (hp.n_head * hp.head_dim_k, hp.n_embd)),
                                 (f"{blk}.attn_k.weight", (hp.n_embd_k_gqa, hp.n_embd)),
                                 (f"{blk}.attn_v.weight", (hp.n_embd_v_gqa, hp.n_embd))])
        wo = self.weight(gguf, f"{blk}.attn_output.weight", (hp.n_embd, hp.n_head * hp.head_dim_v))
        return wqkv, wo

    def gated_ffn_weights(self, gguf: GGUFFile, il: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's fused gate/up projection (2 n_ff, n_embd) and its down projection."""
        hp, blk = self.hparams, f"blk.{il}"
        gate_up = self.fused(gguf, [(f"{blk}.ffn_gate.weight", (hp.n_ff, hp.n_embd)),
                                    (f"{blk}.ffn_up.weight", (hp.n_ff, hp.n_embd))])
        return gate_up, self.weight(gguf, f"{blk}.ffn_down.weight", (hp.n_embd, hp.n_ff))

    def split_qkv(self, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(n_tokens, n_q + 2 n_kv) → q, k, v as (n_tokens, heads, head_dim)."""
        hp = self.hparams
        n_q, n_k = hp.n_head * hp.head_dim_k, hp.n_embd_k_gqa
        q = qkv[:, :n_q].reshape(-1, hp.n_head, hp.head_dim_k)
        k = qkv[:, n_q:n_q + n_k].reshape(-1, hp.n_head_kv, hp.head_dim_k)
        v = qkv[:, n_q + n_k:].reshape(-1, hp.n_head_kv, hp.head_dim_v)
        return q, k, v

    def output_head(self, gguf: GGUFFile, token_embd: np.ndarray) -> np.ndarray:
        """The lm head: `output.weight`, or the token embeddings when they are tied."""
        if "output.weight" in gguf.tensors:
            return self.weight(gguf, "output.weight", (self.hparams.n_vocab, self.hparams.n_embd))
        return token_embd
