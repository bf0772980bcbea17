"""Mamba-2: the state-space mixer with one scalar decay per head and B, C shared by groups of
heads, and a grouped RMSNorm before the out-projection.

In-projection to z | xBC | dt; the causal conv runs over xBC (so the conv state holds x, B and C);
the scan state is (heads, head_dim, d_state) per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from .mamba import SSMHParams, StateSpaceModel, check_ssm_shapes, read_ssm_hparams
from .registry import register


@dataclass
class Mamba2Layer:
    attn_norm: np.ndarray
    ssm_in: np.ndarray  # z | xBC | dt
    conv_w: np.ndarray  # (conv channels, d_conv)
    conv_b: np.ndarray
    ssm_dt_b: np.ndarray  # (heads,)
    A: np.ndarray  # (heads, 1), negative
    D: np.ndarray  # (heads, 1)
    ssm_norm: np.ndarray  # (groups, d_inner / groups)
    ssm_out: np.ndarray


@register("mamba2")
class Mamba2(StateSpaceModel):
    arch = "mamba2"

    def load_hparams(self, gguf: GGUFFile) -> SSMHParams:
        hp = read_ssm_hparams(gguf, self.arch)
        check_ssm_shapes(gguf, hp)
        return hp

    @property
    def n_head(self) -> int:
        return self.hparams.dt_rank

    @property
    def conv_channels(self) -> int:
        hp = self.hparams
        return hp.d_inner + 2 * hp.n_group * hp.d_state

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        hp = self.hparams
        return self.n_head, hp.d_inner // self.n_head, hp.d_state

    def load_layer(self, gguf: GGUFFile, il: int) -> Mamba2Layer:
        hp, blk, n_head = self.hparams, f"blk.{il}", self.n_head
        d_in_proj = hp.d_inner + self.conv_channels + n_head
        return Mamba2Layer(
            attn_norm=self.weight(gguf, f"{blk}.attn_norm.weight", (hp.n_embd,)),
            ssm_in=self.weight(gguf, f"{blk}.ssm_in.weight", (d_in_proj, hp.n_embd)),
            conv_w=self.weight(gguf, f"{blk}.ssm_conv1d.weight", (self.conv_channels, hp.d_conv), matrix=False),
            conv_b=self.weight(gguf, f"{blk}.ssm_conv1d.bias", (self.conv_channels,)),
            ssm_dt_b=self.weight(gguf, f"{blk}.ssm_dt.bias", (n_head,)),
            A=self.weight(gguf, f"{blk}.ssm_a", (n_head, 1), matrix=False),
            D=self.weight(gguf, f"{blk}.ssm_d", (n_head, 1), matrix=False),
            ssm_norm=self.weight(gguf, f"{blk}.ssm_norm.weight", (hp.n_group, hp.d_inner // hp.n_group),
                                 matrix=False),
            ssm_out=self.weight(gguf, f"{blk}.ssm_out.weight", (hp.n_embd, hp.d_inner)),
        )

    def mixer(self, g, il: int, layer: Mamba2Layer, x: np.ndarray) -> np.ndarray:
        hp = self.hparams
        n_tokens, (n_head, head_dim, d_state) = len(x), self.ssm_shape
        rs = g.rs(il)
        conv_state, ssm_state = rs.read()
        zxbcdt = g.linear(x, layer.ssm_in)
        split = hp.d_inner + self.conv_channels
        z, xbc, dt = zxbcdt[:, :hp.d_inner], zxbcdt[:, hp.d_inner:split], zxbcdt[:, split:]
        xbc, conv_state = self.conv(g, rs, conv_state, xbc, layer)
        x = xbc[:, :hp.d_inner].reshape(n_tokens, n_head, head_dim)
        B, C = (xbc[:, hp.d_inner + i * hp.n_group * d_state:][:, :hp.n_group * d_state]
                .reshape(n_tokens, hp.n_group, d_state) for i in (0, 1))
        y, ssm_state = g.ops.ssm_scan(ssm_state, x, dt + layer.ssm_dt_b, layer.A, B, C, rs.seq_index)
        rs.write(conv_state, ssm_state)
        y = (y + x * layer.D).reshape(n_tokens, hp.d_inner)
        y = g.ops.swiglu(z, y).reshape(n_tokens, hp.n_group, -1)
        y = g.norm(y, layer.ssm_norm).reshape(n_tokens, hp.d_inner)
        return g.linear(y, layer.ssm_out)
