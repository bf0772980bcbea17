"""Mamba-2: the state-space mixer with one scalar decay per head and B, C shared by groups of
heads, and a grouped RMSNorm before the out-projection.

In-projection to z | xBC | dt; the causal conv runs over xBC (so the conv state holds x, B and C);
the scan state is (heads, head_dim, d_state) per sequence. `Mamba2Mixer` is the mixer alone, for
the models that also put it between attention layers (Granite 4.0-H).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..memory import RecurrentSpec
from .mamba import SSMHParams, StateSpaceModel, check_ssm_shapes, read_ssm_hparams
from .registry import register


@dataclass
class Mamba2Weights:
    ssm_in: np.ndarray  # z | xBC | dt
    conv_w: np.ndarray  # (conv channels, d_conv)
    conv_b: np.ndarray
    ssm_dt_b: np.ndarray  # (heads,)
    A: np.ndarray  # (heads, 1), negative
    D: np.ndarray  # (heads, 1)
    ssm_norm: np.ndarray  # (groups, d_inner / groups)
    ssm_out: np.ndarray


@dataclass
class Mamba2Layer:
    attn_norm: np.ndarray
    mixer: Mamba2Weights


@dataclass(frozen=True)
class Mamba2Mixer:
    """The Mamba-2 mixer of one shape: its weights of layer il, its recurrent state, its pass."""
    n_embd: int
    d_inner: int
    n_head: int  # ssm.time_step_rank
    n_group: int
    d_state: int
    d_conv: int

    @classmethod
    def of(cls, hp: SSMHParams) -> "Mamba2Mixer":
        return cls(hp.n_embd, hp.d_inner, hp.dt_rank, hp.n_group, hp.d_state, hp.d_conv)

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return self.n_head, self.d_inner // self.n_head, self.d_state

    @property
    def spec(self) -> RecurrentSpec:
        return RecurrentSpec((self.d_conv - 1, self.conv_channels), self.ssm_shape)

    def load(self, model, gguf: GGUFFile, il: int) -> Mamba2Weights:
        blk, n_head = f"blk.{il}", self.n_head
        d_in_proj = self.d_inner + self.conv_channels + n_head
        w = lambda name, shape, matrix=True: model.weight(gguf, f"{blk}.{name}", shape, matrix=matrix)  # noqa: E731
        return Mamba2Weights(
            ssm_in=w("ssm_in.weight", (d_in_proj, self.n_embd)),
            conv_w=w("ssm_conv1d.weight", (self.conv_channels, self.d_conv), matrix=False),
            conv_b=w("ssm_conv1d.bias", (self.conv_channels,)),
            ssm_dt_b=w("ssm_dt.bias", (n_head,)),
            A=w("ssm_a", (n_head, 1), matrix=False),
            D=w("ssm_d", (n_head, 1), matrix=False),
            ssm_norm=w("ssm_norm.weight", (self.n_group, self.d_inner // self.n_group), matrix=False),
            ssm_out=w("ssm_out.weight", (self.n_embd, self.d_inner)),
        )

    def __call__(self, g, il: int, layer: Mamba2Weights, x: np.ndarray) -> np.ndarray:
        n_tokens, (n_head, head_dim, d_state) = len(x), self.ssm_shape
        rs = g.rs(il)
        conv_state, ssm_state = rs.read()
        zxbcdt = g.linear(x, layer.ssm_in)
        split = self.d_inner + self.conv_channels
        z, xbc, dt = zxbcdt[:, :self.d_inner], zxbcdt[:, self.d_inner:split], zxbcdt[:, split:]
        xbc, conv_state = g.ops.ssm_conv(xbc, conv_state, layer.conv_w, rs.seq_index)
        xbc = g.ops.silu(xbc + layer.conv_b)
        x = xbc[:, :self.d_inner].reshape(n_tokens, n_head, head_dim)
        B, C = (xbc[:, self.d_inner + i * self.n_group * d_state:][:, :self.n_group * d_state]
                .reshape(n_tokens, self.n_group, d_state) for i in (0, 1))
        y, ssm_state = g.ops.ssm_scan(ssm_state, x, dt + layer.ssm_dt_b, layer.A, B, C, rs.seq_index)
        rs.write(conv_state, ssm_state)
        y = (y + x * layer.D).reshape(n_tokens, self.d_inner)
        y = g.ops.swiglu(z, y).reshape(n_tokens, self.n_group, -1)
        y = g.norm(y, layer.ssm_norm).reshape(n_tokens, self.d_inner)
        return g.linear(y, layer.ssm_out)


@register("mamba2")
class Mamba2(StateSpaceModel):
    arch = "mamba2"

    def load_hparams(self, gguf: GGUFFile) -> SSMHParams:
        hp = read_ssm_hparams(gguf, self.arch)
        check_ssm_shapes(gguf, hp)
        self.mamba2 = Mamba2Mixer.of(hp)
        return hp

    @property
    def conv_channels(self) -> int:
        return self.mamba2.conv_channels

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return self.mamba2.ssm_shape

    def load_layer(self, gguf: GGUFFile, il: int) -> Mamba2Layer:
        norm = self.weight(gguf, f"blk.{il}.attn_norm.weight", (self.hparams.n_embd,))
        return Mamba2Layer(norm, self.mamba2.load(self, gguf, il))

    def mixer(self, g, il: int, layer: Mamba2Layer, x: np.ndarray) -> np.ndarray:
        return self.mamba2(g, il, layer.mixer, x)
