"""Mamba (Mamba-1): RMSNorm, then a selective state-space mixer in every layer and no attention.

The mixer: in-projection to x | z, a causal depthwise conv over x (its last d_conv - 1 inputs are
the conv state), SiLU, the x-projection to the step size Δ (rank dt_rank, then up to d_inner) and
B, C; the selective scan (its d_inner × d_state matrix is the SSM state); the D skip; gating by
SiLU(z); the out-projection. Both states live in the recurrent memory, reached through `g.rs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..batch import POS_LIMIT
from ..errors import ModelFileError
from ..gguf import GGUFFile
from ..memory import MemorySpec, RecurrentSpec
from .base import MAX_EMBD, MAX_LAYERS, MAX_VOCAB, Model, count_blocks
from .registry import register

MAX_SSM_DIM = 1 << 16


@dataclass
class SSMHParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    rms_eps: float
    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int  # Mamba-2: the number of heads
    n_group: int = 1
    pooling: str = ""  # state-space GGUFs carry no pooling type; --pooling chooses one


def read_ssm_hparams(gguf: GGUFFile, arch: str) -> SSMHParams:
    """The keys every state-space GGUF carries, checked for range and against each other."""
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    get = lambda name, *a, **kw: gguf.get_int(key(name), *a, per_layer=True, **kw)  # noqa: E731
    n_vocab = get("vocab_size", len(gguf.get_strs("tokenizer.ggml.tokens", [])), lo=1, hi=MAX_VOCAB)
    return SSMHParams(
        n_vocab=n_vocab,
        n_ctx_train=get("context_length", lo=1, hi=POS_LIMIT),
        n_embd=get("embedding_length", lo=1, hi=MAX_EMBD),
        n_layer=count_blocks(gguf, get("block_count", lo=1, hi=MAX_LAYERS)),
        rms_eps=gguf.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5, hi=1.0, positive=True),
        d_conv=get("ssm.conv_kernel", lo=1, hi=MAX_SSM_DIM),
        d_inner=get("ssm.inner_size", lo=1, hi=MAX_SSM_DIM),
        d_state=get("ssm.state_size", lo=1, hi=MAX_SSM_DIM),
        dt_rank=get("ssm.time_step_rank", lo=1, hi=MAX_SSM_DIM),
        n_group=get("ssm.group_count", 1, lo=1, hi=MAX_SSM_DIM),
    )


@dataclass
class MambaLayer:
    attn_norm: np.ndarray
    ssm_in: np.ndarray  # x | z
    conv_w: np.ndarray  # (d_inner, d_conv)
    conv_b: np.ndarray
    ssm_x: np.ndarray  # x -> dt | B | C
    ssm_dt: np.ndarray  # (d_inner, dt_rank)
    ssm_dt_b: np.ndarray
    A: np.ndarray  # (d_inner, d_state), negative
    D: np.ndarray
    ssm_out: np.ndarray


class StateSpaceModel(Model):
    """What Mamba and Mamba-2 share: hyper-parameters, the residual stack, the memory layout."""
    ops = ("GET_ROWS", "MUL_MAT", "RMS_NORM", "RMS_NORM_GROUP", "SSM_CONV", "SSM_SCAN", "SILU", "SWIGLU", "TOP_K")

    def load_hparams(self, gguf: GGUFFile) -> SSMHParams:
        return read_ssm_hparams(gguf, self.arch)

    def load_layer(self, gguf: GGUFFile, il: int):
        raise NotImplementedError

    def mixer(self, g, il: int, layer, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def memory_spec(self, attn_impl: str = "naive") -> MemorySpec:
        hp = self.hparams
        spec = RecurrentSpec((hp.d_conv - 1, self.conv_channels), self.ssm_shape)
        return MemorySpec({il: spec for il in range(hp.n_layer)}, hp.n_vocab)

    def forward(self, g) -> np.ndarray:
        x = g.inp_embd(self.token_embd)
        for il, layer in enumerate(self.layers):
            h = self.mixer(g, il, layer, g.norm(x, layer.attn_norm))
            if il == self.hparams.n_layer - 1:  # the states needed every token; the rest only outputs
                h, x = g.select_outputs(h, x)
            x = g.cb("l_out", il, x + h)
        return g.logits(x, self.output_norm, self.output)

    def conv(self, g, rs, conv_state, x, layer) -> tuple[np.ndarray, np.ndarray]:
        """The causal conv with its bias, then SiLU; returns (activations, new conv state)."""
        x, conv_state = g.ops.ssm_conv(x, conv_state, layer.conv_w, rs.seq_index)
        return g.ops.silu(x + layer.conv_b), conv_state


@register("mamba")
class Mamba(StateSpaceModel):
    arch = "mamba"

    @property
    def conv_channels(self) -> int:
        return self.hparams.d_inner

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return self.hparams.d_inner, 1, self.hparams.d_state  # a head per channel, of dim 1

    def load_layer(self, gguf: GGUFFile, il: int) -> MambaLayer:
        hp, blk = self.hparams, f"blk.{il}"
        return MambaLayer(
            attn_norm=self.weight(gguf, f"{blk}.attn_norm.weight", (hp.n_embd,)),
            ssm_in=self.weight(gguf, f"{blk}.ssm_in.weight", (2 * hp.d_inner, hp.n_embd)),
            conv_w=self.weight(gguf, f"{blk}.ssm_conv1d.weight", (hp.d_inner, hp.d_conv), matrix=False),
            conv_b=self.weight(gguf, f"{blk}.ssm_conv1d.bias", (hp.d_inner,)),
            ssm_x=self.weight(gguf, f"{blk}.ssm_x.weight", (hp.dt_rank + 2 * hp.d_state, hp.d_inner)),
            ssm_dt=self.weight(gguf, f"{blk}.ssm_dt.weight", (hp.d_inner, hp.dt_rank)),
            ssm_dt_b=self.weight(gguf, f"{blk}.ssm_dt.bias", (hp.d_inner,)),
            A=self.weight(gguf, f"{blk}.ssm_a", (hp.d_inner, hp.d_state), matrix=False),
            D=self.weight(gguf, f"{blk}.ssm_d", (hp.d_inner,)),
            ssm_out=self.weight(gguf, f"{blk}.ssm_out.weight", (hp.n_embd, hp.d_inner)),
        )

    def mixer(self, g, il: int, layer: MambaLayer, x: np.ndarray) -> np.ndarray:
        hp = self.hparams
        rs = g.rs(il)
        conv_state, ssm_state = rs.read()
        xz = g.linear(x, layer.ssm_in)
        x, z = xz[:, :hp.d_inner], xz[:, hp.d_inner:]
        x, conv_state = self.conv(g, rs, conv_state, x, layer)
        dbc = g.linear(x, layer.ssm_x)
        dt = g.linear(dbc[:, :hp.dt_rank], layer.ssm_dt) + layer.ssm_dt_b
        B = dbc[:, None, hp.dt_rank:hp.dt_rank + hp.d_state]
        C = dbc[:, None, hp.dt_rank + hp.d_state:]
        y, ssm_state = g.ops.ssm_scan(ssm_state, x[:, :, None], dt, layer.A, B, C, rs.seq_index)
        rs.write(conv_state, ssm_state)
        y = y.reshape(len(x), hp.d_inner) + x * layer.D
        return g.linear(g.ops.swiglu(z, y), layer.ssm_out)


def check_ssm_shapes(gguf: GGUFFile, hp: SSMHParams) -> None:
    """Mamba-2's heads and groups must divide the inner size (and the groups the heads)."""
    if hp.d_inner % hp.dt_rank or hp.d_inner % hp.n_group or hp.dt_rank % hp.n_group:
        raise ModelFileError(f"{gguf.path}: ssm.inner_size {hp.d_inner}, ssm.time_step_rank (heads) {hp.dt_rank} "
                             f"and ssm.group_count {hp.n_group} do not divide each other")
