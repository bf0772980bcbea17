"""Op contracts: what each op the models use computes, its test cases, and a naive reference.

Each `Op` says which inputs it takes (NumPy order; the ggml layout is noted where it differs),
builds them for a case, computes the answer plainly in float64 (`reference`), and calls a
backend (`run`). `llm test-ops` compares every backend with the reference by normalized mean
squared error, with test-backend-ops' thresholds.

Layout mapping: a ggml tensor of ne = [a, b, c] is a NumPy array of shape (c, b, a). Attention
uses the engine's token-major layout: q (n_tokens, n_head, d), k/v (n_kv, n_head_kv, d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants

from .backend.weights import BlockRows
from .quants import Q8_1_OFFSET_TYPES, block_mins, ggml_activations, q8_1_offset_error, quantize_rows

DEFAULT_NMSE = 1e-7


@dataclass
class Case:
    op: "Op"
    params: dict
    perf_only: bool = False

    @property
    def name(self) -> str:
        return f"{self.op.name}({','.join(f'{k}={_fmt(v)}' for k, v in self.params.items())})"


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:f}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


@dataclass
class Op:
    name: str
    make: Callable[[dict, np.random.Generator], dict]  # case params -> inputs
    reference: Callable[..., np.ndarray]  # (inputs, params) -> float64 answer
    run: Callable[..., np.ndarray]  # (backend, inputs, params) -> answer
    cases: Callable[[bool], list[dict]]  # quick -> case params
    perf_cases: Callable[[], list[dict]] = lambda: []
    nmse: Callable[[dict], float] = lambda p: DEFAULT_NMSE
    flops: Callable[[dict], float] = lambda p: 0.0
    compare_as: Callable[[np.ndarray, dict], np.ndarray] | None = None  # e.g. TOP_K compares values

    def all_cases(self, quick: bool, perf: bool = False) -> list[Case]:
        if perf:
            return [Case(self, p, perf_only=True) for p in self.perf_cases()]
        return [Case(self, p) for p in self.cases(quick)]


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    OPS[op.name] = op
    return op


def _f32(rng, *shape, lo=-1.0, hi=1.0) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


# ---- weights of any GGUF type ---------------------------------------------------------------

WEIGHT_TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]


def ggml_type(name: str) -> T:
    return T[name.upper()]


def random_weight(rng, type_name: str, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) weight as raw GGUF data: quantized from uniform floats where gguf can,
    else random blocks with sane scales (K-quants have no Python quantizer)."""
    qtype = ggml_type(type_name)
    values = _f32(rng, rows, cols)
    if qtype == T.F32:
        return values
    if qtype == T.F16:
        return values.astype(np.float16)
    try:
        return quants.quantize(values, qtype)
    except NotImplementedError:
        block, type_size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
        for at in {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}[qtype]:
            raw[:, at:at + 2] = (rng.uniform(0.001, 0.01, len(raw)).astype(np.float16)).view(np.uint8).reshape(-1, 2)
        return raw.reshape(rows, -1)


def dequantized(raw: np.ndarray, type_name: str, shape) -> np.ndarray:
    """The reference view of a weight: gguf-py's own dequantization, in float64."""
    qtype = ggml_type(type_name)
    if qtype in (T.F32, T.F16):
        return raw.astype(np.float64).reshape(shape)
    return quants.dequantize(raw.reshape(-1).view(np.uint8).reshape(-1, GGML_QUANT_SIZES[qtype][1]),
                             qtype).astype(np.float64).reshape(shape)


# ---- MUL_MAT -------------------------------------------------------------------------------

# (n_out, n_in) of the real models' matmuls: SmolLM2 (q|o, k|v, gate|up, down, head) and
# Gemma 3 270M (q, k|v, o, gate|up, down, head). A type is tested where n_in fits its blocks.
MODEL_MATMULS = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576),
                 (1024, 640), (256, 640), (640, 1024), (2048, 640), (640, 2048), (262144, 640)]
# Mamba's step-size projections have a small rank (n_in 4 in tiny-mamba, 48 in Mamba-130M), which
# no 32-value run divides: every float type is tested there in quick runs too.
SSM_MATMULS = [(128, 4), (1536, 48)]
MATMUL_ROWS = (1, 2, 4, 8, 512)  # decode, -np sequences, small ubatches, a prompt
MATMUL_MAX_FLOPS = 2 * 49152 * 576 * 8  # the float64 reference of larger cases takes too long


def _mul_mat_cases(quick: bool) -> list[dict]:
    if quick:
        shapes = [(192, 1024), (192, 576)]
    else:
        shapes = MODEL_MATMULS
    cases = []
    for t in WEIGHT_TYPES:
        block = GGML_QUANT_SIZES[ggml_type(t)][0]
        fitting = [(m, k) for m, k in shapes if k % block == 0][:1 if quick else None]
        if block == 1:
            fitting += SSM_MATMULS
        cases += [dict(type_a=t, type_b="f32", m=m, n=n, k=k) for m, k in fitting for n in MATMUL_ROWS
                  if 2 * m * n * k <= MATMUL_MAX_FLOPS]
    return cases


register(Op(
    "MUL_MAT",
    make=lambda p, rng: dict(w=random_weight(rng, p["type_a"], p["m"], p["k"]), x=_f32(rng, p["n"], p["k"])),
    reference=lambda i, p: i["x"].astype(np.float64) @ dequantized(i["w"], p["type_a"], (p["m"], p["k"])).T,
    run=lambda b, i, p: b.mul_mat(i["w"], ggml_type(p["type_a"]), (p["m"], p["k"]), i["x"]),
    cases=_mul_mat_cases,
    perf_cases=lambda: [dict(type_a=t, type_b="f32", m=m, n=n, k=k) for t, (m, k) in
                        (("q4_1", (1536, 576)), ("q8_0", (49152, 576)), ("q5_0", (2048, 640)),
                         ("q8_0", (262144, 640)), ("q4_K", (640, 2048)), ("q6_K", (640, 2048)),
                         ("f32", (4096, 4096)), ("q4_0", (4096, 4096)), ("q8_0", (4096, 4096)))
                        for n in (1, 8, 512)],
    # Every type's weights are dequantized exactly (ggml's arithmetic), and activations stay f32:
    # on the cpu only the f32 sums round (NMSE ~1e-13). The cuda backend rounds the dequantized
    # weights and the activations to f16 (2^-11 relative each: NMSE ~2e-7), so one bound fits
    # every type. (test-backend-ops allows 5e-4 because ggml quantizes activations to 8 bits.)
    nmse=lambda p: 2e-6,
    flops=lambda p: 2.0 * p["m"] * p["n"] * p["k"],
))

# MUL_MAT with ggml's numerics (the cpu backend's --numerics ggml): the activations rounded to
# their vec_dot_type's 8-bit blocks, ggml's integer dots for up to 8 rows. The reference is the
# exact product of the rounded activations and the weights in float64, plus Q4_1/Q5_1's q8_1
# sum term; only float summation order separates the backend from it (NMSE ~1e-13). The bound is
# 1e-10: leaving out the f16 rounding of the q8_1 sums (a relative 2^-11 of one term) must fail.
GGML_NUMERICS_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K")


def _mul_mat_ggml_reference(i, p):
    w = dequantized(i["w"], p["type_a"], (p["m"], p["k"]))
    qtype = ggml_type(p["type_a"])
    out = ggml_activations(i["x"], qtype).astype(np.float64) @ w.T
    if qtype in Q8_1_OFFSET_TYPES:
        raw = np.ascontiguousarray(i["w"]).reshape(p["m"], -1).view(np.uint8)
        out += q8_1_offset_error(i["x"]).astype(np.float64) @ block_mins(raw, qtype).T.astype(np.float64)
    return out


def _mul_mat_ggml_cases(quick: bool) -> list[dict]:
    shapes = [(192, 1024)] if quick else [(576, 576), (1536, 576), (576, 1536), (2048, 640), (640, 2048)]
    return [dict(type_a=t, type_b="f32", m=m, n=n, k=k, numerics="ggml") for t in GGML_NUMERICS_TYPES
            for m, k in shapes if k % GGML_QUANT_SIZES[ggml_type(t)][0] == 0 for n in (1, 8, 512)]


register(Op(
    "MUL_MAT_GGML",
    make=lambda p, rng: dict(w=random_weight(rng, p["type_a"], p["m"], p["k"]), x=_f32(rng, p["n"], p["k"])),
    reference=_mul_mat_ggml_reference,
    run=lambda b, i, p: b.configured(numerics="ggml").mul_mat(i["w"], ggml_type(p["type_a"]), (p["m"], p["k"]), i["x"]),
    cases=_mul_mat_ggml_cases,
    perf_cases=lambda: [dict(type_a=t, type_b="f32", m=m, n=n, k=k, numerics="ggml") for t, (m, k) in
                        (("q4_1", (1536, 576)), ("q5_0", (2048, 640)), ("q4_K", (640, 2048))) for n in (1, 8, 512)],
    nmse=lambda p: 1e-10,
    flops=lambda p: 2.0 * p["m"] * p["n"] * p["k"],
))

# ---- GET_ROWS / SET_ROWS -------------------------------------------------------------------

register(Op(
    "GET_ROWS",
    make=lambda p, rng: dict(table=random_weight(rng, p["type"], p["rows"], p["cols"]),
                             ids=rng.integers(0, p["rows"], p["n"]).astype(np.int32)),
    reference=lambda i, p: dequantized(i["table"], p["type"], (p["rows"], p["cols"]))[i["ids"]],
    run=lambda b, i, p: b.get_rows_raw(i["table"], ggml_type(p["type"]), (p["rows"], p["cols"]), i["ids"]),
    cases=lambda quick: [dict(type=t, rows=64, cols=256, n=n) for t in WEIGHT_TYPES for n in (1, 7)],
))

CACHE_ROW_TYPES = {"f32": None, "f16": None, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0,
                   "q5_1": T.Q5_1, "iq4_nl": T.IQ4_NL}


def cache_blocks(x: np.ndarray, qtype: T) -> np.ndarray:
    """Rows (n, cols) as a block cache stores them, by the reference: gguf-py's quantizer, or for
    IQ4_NL (gguf-py has none) core.quants', which tests/test_quants.py holds to llama.cpp's bytes."""
    if qtype == T.IQ4_NL:
        return quantize_rows(x, qtype)
    return quants.quantize(x, qtype)


def _set_rows_make(p, rng):
    dst = np.zeros((p["rows"], p["cols"]), np.float32)
    if p["type"] == "f16":
        dst = dst.astype(np.float16)
    elif CACHE_ROW_TYPES[p["type"]] is not None:
        block, type_size = GGML_QUANT_SIZES[CACHE_ROW_TYPES[p["type"]]]
        dst = np.zeros((p["rows"], p["cols"] // block * type_size), np.uint8)
    return dict(dst=dst, src=_f32(rng, p["n"], p["cols"]),
                ids=rng.choice(p["rows"], p["n"], replace=False).astype(np.int64))


def _set_rows_reference(i, p):
    qtype = CACHE_ROW_TYPES[p["type"]]
    src = i["src"].astype(np.float64)
    if p["type"] == "f16":
        src = i["src"].astype(np.float16).astype(np.float64)
    elif qtype is not None:  # what the row type can hold: the reference quantizer, then gguf-py's dequantize
        src = quants.dequantize(cache_blocks(i["src"], qtype), qtype).astype(np.float64)
    out = np.zeros((p["rows"], p["cols"]))
    out[i["ids"]] = src
    return out


def _set_rows_run(b, i, p):
    qtype = CACHE_ROW_TYPES[p["type"]]
    out = b.to_numpy(b.set_rows(i["dst"], i["ids"], i["src"], qtype))
    if qtype is None:
        return out.astype(np.float32)
    return quants.dequantize(out, qtype).reshape(p["rows"], p["cols"])


register(Op(
    "SET_ROWS",
    make=_set_rows_make, reference=_set_rows_reference, run=_set_rows_run,
    cases=lambda quick: [dict(type=t, rows=32, cols=128, n=n) for t in CACHE_ROW_TYPES for n in (1, 5)],
))

# ---- norms ---------------------------------------------------------------------------------


def _rms_norm_ref(i, p):
    x = i["x"].astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + p["eps"])


def _norm_ref(i, p):
    x = i["x"].astype(np.float64)
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + p["eps"])


_NORM_CASES = lambda quick: [dict(ne=[n, rows], eps=eps) for n in (64, 576, 4096) for rows in (1, 5)  # noqa: E731
                             for eps in (1e-6, 1e-5)]

register(Op("RMS_NORM", make=lambda p, rng: dict(x=_f32(rng, p["ne"][1], p["ne"][0], lo=-3, hi=3)),
            reference=_rms_norm_ref, run=lambda b, i, p: b.rms_norm(i["x"], None, p["eps"]), cases=_NORM_CASES))
register(Op("NORM", make=lambda p, rng: dict(x=_f32(rng, p["ne"][1], p["ne"][0], lo=-3, hi=3)),
            reference=_norm_ref, run=lambda b, i, p: b.norm(i["x"], p["eps"]), cases=_NORM_CASES))

# ---- ROPE ----------------------------------------------------------------------------------


def _yarn_ref(theta_extrap, p):
    """YaRN as the YaRN paper's reference code mixes the angles (and as ggml's rope_yarn does), in
    float64: the correction dims where a pair turns fewer than beta times over n_ctx_orig, the ramp
    between them, the magnitude factor."""
    n_rot, fs = p["n_dims"], p["freq_scale"]

    def corr_dim(beta):
        return n_rot * math.log(p["n_ctx_orig"] / (beta * 2 * math.pi)) / (2 * math.log(p["freq_base"]))

    low, high = max(0, math.floor(corr_dim(32.0))), min(n_rot - 1, math.ceil(corr_dim(1.0)))
    ramp = 1 - np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0, 1)
    mix = ramp * p["ext_factor"]
    mscale = p["attn_factor"] * (1 + 0.1 * math.log(1 / fs))
    return theta_extrap * fs * (1 - mix) + theta_extrap * mix, mscale


def _rope_ref(i, p):
    x = i["x"].astype(np.float64)
    n_rot, pos = p["n_dims"], i["pos"].astype(np.float64)
    theta = pos[:, None] * p["freq_scale"] * p["freq_base"] ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    mscale = 1.0
    if p.get("ext_factor"):
        theta, mscale = _yarn_ref(pos[:, None] * p["freq_base"] ** (-2.0 * np.arange(n_rot // 2) / n_rot), p)
    c, s = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    out = x.copy()
    if p["mode"] == "neox":
        a, b_ = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]
        out[..., : n_rot // 2], out[..., n_rot // 2: n_rot] = a * c - b_ * s, a * s + b_ * c
    else:
        a, b_ = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * c - b_ * s, a * s + b_ * c
    return out


def _rope_run(b, i, p):
    from .backend.base import yarn

    scaling = yarn(p["n_dims"], p["n_ctx_orig"], p["freq_base"], p["freq_scale"], ext_factor=p["ext_factor"],
                   attn_factor=p["attn_factor"]) if p.get("ext_factor") else None
    table = b.rope_cache(i["pos"], p["n_dims"], p["freq_base"], p["freq_scale"], scaling)
    return b.rope(i["x"], table, neox=p["mode"] == "neox")


register(Op(
    "ROPE",
    # back: negative positions rotate back (ggml's rope_back, DeepSeek-V4's de-rope of its attention output)
    make=lambda p, rng: dict(x=_f32(rng, p["ne"][2], p["ne"][1], p["ne"][0]),
                             pos=rng.integers(-512 if p.get("back") else 0, 512, p["ne"][2]).astype(np.int32)),
    reference=_rope_ref, run=_rope_run,
    cases=lambda quick: [dict(ne=[hd, nh, nt], n_dims=nd, mode=mode, freq_base=fb, freq_scale=fs)
                         for hd, nd in ((64, 64), (128, 128), (128, 64), (256, 256)) for nh, nt in ((4, 1), (9, 7))
                         for mode in ("normal", "neox") for fb, fs in ((10000.0, 1.0), (1e6, 0.25))]
    + [dict(ne=[32, nh, nt], n_dims=32, mode="normal", freq_base=fb, freq_scale=1.0, back=True)
       for nh, nt in ((64, 1), (4, 9)) for fb in (10000.0, 160000.0)]
    # YaRN as DeepSeek-V4's compressed layers apply it (factor 16 over 65536, the magnitude factor cancelled)
    + [dict(ne=[hd, nh, 5], n_dims=nd, mode="normal", freq_base=160000.0, freq_scale=1 / 16, n_ctx_orig=65536,
            ext_factor=1.0, attn_factor=1 / (1 + 0.1 * math.log(16)), back=True) for hd, nd, nh in ((64, 64, 8), (128, 64, 3))]
    + [dict(ne=[128, 2, 5], n_dims=128, mode="normal", freq_base=10000.0, freq_scale=0.25, n_ctx_orig=4096,
            ext_factor=1.0, attn_factor=1.0)],
))

# ---- SOFT_MAX ------------------------------------------------------------------------------


def _alibi_ref(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0:
        return np.ones(n_head)
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-max_bias / 2.0 / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)])


def _softmax_rows(s, sinks=None):
    """Softmax over the last axis in float64; a sink adds exp(sink) to the denominator."""
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True) + (np.exp(sinks - m) if sinks is not None else 0.0)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def _mask(rng, rows, cols, kind) -> np.ndarray | None:
    """test-backend-ops' dense mask: uniform [-1, 1] with random all -inf or all 0 blocks."""
    if kind == "none":
        return None
    mask = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    for _ in range(max(1, int(0.2 * rows * cols / (128 * 64)))):
        r, c = rng.integers(0, max(rows - 1, 1)), rng.integers(0, max(cols - 1, 1))
        mask[r:r + 64, c:c + 128] = -np.inf if rng.random() < 0.5 else 0.0
    return mask.astype(np.float16).astype(np.float32)  # ggml passes the mask as f16


def _softmax_ref(i, p):
    s = i["x"].astype(np.float64) * p["scale"]
    if i["mask"] is not None:
        s = s + _alibi_ref(s.shape[0], p["max_bias"])[:, None, None] * i["mask"]
    sinks = None if i["sinks"] is None else i["sinks"].astype(np.float64)[:, None, None]
    return _softmax_rows(s, sinks)


register(Op(
    "SOFT_MAX",
    make=lambda p, rng: dict(x=_f32(rng, p["ne"][2], p["ne"][1], p["ne"][0], lo=-5, hi=5),
                             mask=_mask(rng, p["ne"][1], p["ne"][0], "dense" if p["mask"] else "none"),
                             sinks=_f32(rng, p["ne"][2], lo=-3, hi=3) if p["sinks"] else None),
    reference=_softmax_ref,
    run=lambda b, i, p: b.soft_max_ext(i["x"], i["mask"], p["scale"], p["max_bias"], i["sinks"]),
    cases=lambda quick: [dict(ne=[n, r, h], mask=mask, scale=sc, max_bias=mb, sinks=sk)
                         for n, r, h in ((32, 4, 2), (512, 8, 4), (1025, 3, 8)) for mask in (False, True)
                         for sc, mb in ((1.0, 0.0), (0.125, 8.0)) for sk in (False, True) if mask or mb == 0.0],
    nmse=lambda p: 1e-6,
))

# ---- elementwise and activations -------------------------------------------------------------

_SHAPES = [[32, 1], [576, 7], [1536, 16]]


def _binary(name, fn):
    register(Op(name, make=lambda p, rng: dict(a=_f32(rng, p["ne"][1], p["ne"][0]), b=_f32(rng, p["ne"][1], p["ne"][0])),
                reference=lambda i, p: fn(i["a"].astype(np.float64), i["b"].astype(np.float64)),
                run=lambda b, i, p: getattr(b, name.lower())(i["a"], i["b"]),
                cases=lambda quick: [dict(type="f32", ne=s) for s in _SHAPES]))


_binary("ADD", np.add)
_binary("MUL", np.multiply)
register(Op("SCALE", make=lambda p, rng: dict(a=_f32(rng, p["ne"][1], p["ne"][0])),
            reference=lambda i, p: i["a"].astype(np.float64) * p["s"],
            run=lambda b, i, p: b.scale(i["a"], p["s"]),
            cases=lambda quick: [dict(type="f32", ne=s, s=sc) for s in _SHAPES for sc in (0.125, 25.3)]))


def _gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu_ref(x):
    return x / (1 + np.exp(-x))


for _name, _fn in (("SILU", _silu_ref), ("GELU", _gelu_ref)):
    register(Op(_name, make=lambda p, rng: dict(x=_f32(rng, p["ne"][1], p["ne"][0], lo=-8, hi=8)),
                reference=lambda i, p, fn=_fn: fn(i["x"].astype(np.float64)),
                run=lambda b, i, p, n=_name.lower(): getattr(b, n)(i["x"]),
                cases=lambda quick: [dict(type="f32", ne=s) for s in _SHAPES]))

def _glu_make(p, rng):
    """ggml's GLU cases: split (gate and up as two tensors) or not (one [gate | up] tensor, as
    the models' fused gate-up projection gives it)."""
    gate = _f32(rng, p["ne"][1], p["ne"][0], lo=-6, hi=6)
    up = _f32(rng, p["ne"][1], p["ne"][0], lo=-2, hi=2)
    return dict(gate=gate, up=up) if p["split"] else dict(x=np.concatenate([gate, up], axis=1))


def _glu_parts(i):
    if "x" in i:
        n_ff = i["x"].shape[1] // 2
        return i["x"][:, :n_ff], i["x"][:, n_ff:]
    return i["gate"], i["up"]


def _glu_run(b, i, p, name):
    if p.get("limit"):
        from .hyper import clamped_swiglu

        return clamped_swiglu(b, *_glu_parts(i), p["limit"])
    return getattr(b, name)(i["gate"], i["up"]) if p["split"] else b.gated_ffn(i["x"], name)


def _glu_ref(i, p, fn):
    gate, up = (part.astype(np.float64) for part in _glu_parts(i))
    if p.get("limit"):  # DeepSeek-V4's clamped SwiGLU
        gate, up = np.minimum(gate, p["limit"]), np.clip(up, -p["limit"], p["limit"])
    return fn(gate) * up


for _name, _fn in (("SWIGLU", _silu_ref), ("GEGLU", _gelu_ref)):
    register(Op(_name, make=_glu_make, reference=lambda i, p, fn=_fn: _glu_ref(i, p, fn),
                run=lambda b, i, p, n=_name.lower(): _glu_run(b, i, p, n),
                cases=lambda quick, n=_name: [dict(type="f32", ne=s, split=split) for s in _SHAPES
                                              for split in (True, False)]
                + ([dict(type="f32", ne=s, split=False, limit=lim) for s in _SHAPES[:2] for lim in (1.25, 10.0)]
                   if n == "SWIGLU" else [])))

# ---- SSM_CONV / SSM_SCAN (Mamba) ------------------------------------------------------------
# Token-major, as the engine runs them: tokens in ubatch order, `seq_index[t]` the state row of
# token t's sequence (ggml's ops take equal-length sequences (n_seq, n_t); that is the special
# case seq_index = repeat(arange(n_seq), n_t)). Cases interleave sequences of unequal length too.


def _seq_index(p, rng) -> np.ndarray:
    """Tokens of n_seq sequences: equal runs one after another, or (mixed) shuffled across them."""
    index = np.repeat(np.arange(p["n_seq"]), p["n_t"])
    return rng.permutation(index) if p.get("mixed") else index


def _ssm_conv_ref(i, p):
    x, w = i["x"].astype(np.float64), i["w"].astype(np.float64)
    state = i["state"].astype(np.float64).copy()
    out = np.empty_like(x)
    for t, s in enumerate(i["seq_index"]):
        window = np.concatenate([state[s], x[t][None]])  # (d_conv, C)
        out[t] = (window.T * w).sum(axis=1)
        state[s] = window[1:]
    return np.concatenate([out.reshape(-1), state.reshape(-1)])


def _ssm_conv_run(b, i, p):
    out, state = b.ssm_conv(i["x"], i["state"], i["w"], i["seq_index"])
    return np.concatenate([b.to_numpy(out).reshape(-1), b.to_numpy(state).reshape(-1)])


register(Op(
    "SSM_CONV",
    make=lambda p, rng: dict(x=_f32(rng, p["n_seq"] * p["n_t"], p["d_inner"]),
                             state=_f32(rng, p["n_seq"], p["d_conv"] - 1, p["d_inner"]),
                             w=_f32(rng, p["d_inner"], p["d_conv"]), seq_index=_seq_index(p, rng)),
    reference=_ssm_conv_ref, run=_ssm_conv_run,
    cases=lambda quick: [dict(d_conv=4, d_inner=di, n_t=nt, n_seq=ns, mixed=mixed) for di in (128, 192, 1536)
                         for nt in (1, 7) for ns in (1, 3) for mixed in (False, True) if ns > 1 or not mixed],
))


def _ssm_scan_ref(i, p):
    """Per token: Δ = softplus(dt) (x itself above 20), state = state·e^(Δ·A) + Δ·x ⊗ B, y = state·C."""
    state = i["state"].astype(np.float64).copy()
    A, heads_per_group = i["A"].astype(np.float64), p["n_head"] // p["n_group"]
    y = np.empty(i["x"].shape)
    for t, s in enumerate(i["seq_index"]):
        dt = i["dt"][t].astype(np.float64)
        delta = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))[:, None, None]  # (H, 1, 1)
        B = np.repeat(i["B"][t].astype(np.float64), heads_per_group, axis=0)[:, None, :]  # (H, 1, N)
        C = np.repeat(i["C"][t].astype(np.float64), heads_per_group, axis=0)[:, None, :]
        state[s] = state[s] * np.exp(delta * A[:, None, :]) + delta * i["x"][t][:, :, None] * B
        y[t] = (state[s] * C).sum(axis=-1)
    return np.concatenate([y.reshape(-1), state.reshape(-1)])


def _ssm_scan_run(b, i, p):
    y, state = b.ssm_scan(i["state"], i["x"], i["dt"], i["A"], i["B"], i["C"], i["seq_index"])
    return np.concatenate([b.to_numpy(y).reshape(-1), b.to_numpy(state).reshape(-1)])


def _ssm_scan_make(p, rng):
    """Mamba-1 (head_dim 1, one group, A per channel and state) or Mamba-2 (A per head)."""
    n_tok, H, P, N, G = p["n_seq"] * p["n_t"], p["n_head"], p["head_dim"], p["d_state"], p["n_group"]
    return dict(state=_f32(rng, p["n_seq"], H, P, N), x=_f32(rng, n_tok, H, P),
                dt=_f32(rng, n_tok, H, lo=-4, hi=2), A=-np.exp(_f32(rng, H, N if p["mamba"] == 1 else 1)),
                B=_f32(rng, n_tok, G, N), C=_f32(rng, n_tok, G, N), seq_index=_seq_index(p, rng))


register(Op(
    "SSM_SCAN",
    make=_ssm_scan_make, reference=_ssm_scan_ref, run=_ssm_scan_run,
    cases=lambda quick: [dict(mamba=1, n_head=di, head_dim=1, n_group=1, d_state=16, n_t=nt, n_seq=ns, mixed=ns > 1)
                         for di in (128, 256) for nt in (1, 5) for ns in (1, 2)]
                        + [dict(mamba=2, n_head=h, head_dim=hd, n_group=g, d_state=ds, n_t=nt, n_seq=ns, mixed=ns > 1)
                           for h, hd, g in ((4, 32, 2), (24, 64, 1)) for ds in (16, 128) for nt in (1, 5)
                           for ns in (1, 3)],
))

# ---- RMS_NORM over groups (Mamba-2's gated norm) ------------------------------------------------


def _group_norm_ref(i, p):
    x = i["x"].astype(np.float64).reshape(len(i["x"]), p["n_group"], -1)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + p["eps"])
    return (normed * i["w"]).reshape(len(x), -1)


register(Op(
    "RMS_NORM_GROUP",
    make=lambda p, rng: dict(x=_f32(rng, p["ne"][1], p["ne"][0], lo=-3, hi=3),
                             w=_f32(rng, p["n_group"], p["ne"][0] // p["n_group"], lo=0.5, hi=1.5)),
    reference=_group_norm_ref,
    run=lambda b, i, p: b.rms_norm(i["x"].reshape(len(i["x"]), p["n_group"], -1), i["w"], p["eps"]).reshape(
        len(i["x"]), -1),
    cases=lambda quick: [dict(ne=[n, rows], n_group=g, eps=1e-5) for n, g in ((128, 2), (1536, 1), (4096, 8))
                         for rows in (1, 5)],
))

# ---- TOP_K -----------------------------------------------------------------------------------

register(Op(
    "TOP_K",
    make=lambda p, rng: dict(x=rng.permutation(p["ne"][0] * p["ne"][1]).reshape(p["ne"][1], p["ne"][0]).astype(np.float32)),
    reference=lambda i, p: -np.sort(-i["x"].astype(np.float64), axis=-1)[:, : p["k"]],
    run=lambda b, i, p: np.take_along_axis(i["x"], b.to_numpy(b.top_k(i["x"], p["k"])).astype(np.int64), axis=-1),
    cases=lambda quick: [dict(ne=[n, r], k=k) for n, r in ((100, 1), (4096, 5)) for k in (1, 16, 40) if k <= n],
    nmse=lambda p: 0.0,
))

# ---- sparse attention's selection: TOP_K over a mask, LIGHTNING_INDEXER ------------------------

def _masked_scores_make(p, rng):
    """Distinct scores (a permutation) and a causal mask with holes (other sequences' cells)."""
    rows, n_kv = p["rows"], p["kv"]
    pos = np.sort(rng.choice(n_kv, rows, replace=False))
    visible = (np.arange(n_kv)[None, :] <= pos[:, None]) & (rng.random((rows, n_kv)) >= p["holes"])
    base = np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    return dict(scores=rng.permutation(rows * n_kv).reshape(rows, n_kv).astype(np.float32) / 64, base=base)


def _top_k_mask_ref(i, p):
    out = np.full(i["base"].shape, -np.inf)
    for r, (scores, base) in enumerate(zip(i["scores"].astype(np.float64), i["base"])):
        visible = np.flatnonzero(np.isfinite(base))
        kept = visible if len(visible) <= p["k"] else visible[np.argsort(-scores[visible])[:p["k"]]]
        out[r, kept] = 0.0
    return out


def _top_k_mask_run(b, i, p):
    from .memory.masks import top_k_mask

    return top_k_mask(i["scores"], i["base"], p["k"], b.xp)


register(Op(
    "TOP_K_MASK", make=_masked_scores_make, reference=_top_k_mask_ref, run=_top_k_mask_run,
    cases=lambda quick: [dict(rows=r, kv=n, k=k, holes=h) for r, n in ((1, 40), (16, 300), (96, 2048))
                         for k in (16, 64) for h in (0.0, 0.3)],
    nmse=lambda p: 0.0,  # a selection: the kept cells must be the same
))


def _indexer_make(p, rng):
    rows, n_head, d = p["rows"], p["n_head"], p["d"]
    keys = _f32(rng, p["kv"], 1, d)
    if p["type_k"] == "f16":
        keys = keys.astype(np.float16)
    return dict(q=_f32(rng, rows, n_head, d), w=_f32(rng, rows, n_head), keys=keys)


def _indexer_ref(i, p):
    dots = np.einsum("rhd,kd->rhk", i["q"].astype(np.float64), i["keys"][:, 0].astype(np.float64))
    return np.einsum("rh,rhk->rk", i["w"].astype(np.float64), np.maximum(dots, 0.0))


def _indexer_run(b, i, p):
    from .memory.masks import indexer_scores

    return indexer_scores(i["q"], i["w"], b.cache_rows_f32(i["keys"]), b.xp)


register(Op(
    "LIGHTNING_INDEXER", make=_indexer_make, reference=_indexer_ref, run=_indexer_run,
    cases=lambda quick: [dict(rows=r, n_head=h, d=d, kv=n, type_k=t) for r, h, d, n in
                         ((1, 16, 64, 96), (96, 16, 64, 96), (7, 64, 128, 1000)) for t in ("f32", "f16")],
    nmse=lambda p: 1e-10,  # float32 dot products of at most 128 terms; f16 keys are exact in f32
))

# ---- MOE_ROUTE -----------------------------------------------------------------------------------


def _route_make(p, rng):
    """Router logits and selection bias on grids far apart enough that no choice is a near-tie;
    with `hash`, each token's experts given (DeepSeek-V4's routing by token id)."""
    logits = rng.permutation(p["rows"] * p["n_expert"]).reshape(p["rows"], p["n_expert"]).astype(np.float32)
    bias = (rng.permutation(p["n_expert"]) % 16).astype(np.float32) / 64 if p["bias"] else None
    out = dict(logits=logits * np.float32(4.0 / logits.size), **({"bias": bias} if bias is not None else {}))
    if p.get("hash"):
        out["experts"] = np.stack([rng.choice(p["n_expert"], p["n_used"], replace=False) for _ in range(p["rows"])])
    return out


def _route_params(p):
    from .moe import MoEParams

    return MoEParams(n_expert=p["n_expert"], n_used=p["n_used"], n_ff=1, gating=p["gating"],
                     norm_weights=bool(p["norm"]), weights_scale=p["scale"], n_group=p["groups"][0],
                     n_group_used=p["groups"][1])


def _route_ref(i, p):
    """Per row, as llama.cpp's build_moe_ffn: probs, selection score (+ bias), groups scored by the
    sum of their two best, top-k among the open groups, unbiased weights, normalized, scaled."""
    out = np.zeros(i["logits"].shape)
    n_group, n_group_used = p["groups"]
    for r, logits in enumerate(i["logits"].astype(np.float64)):
        if p["gating"] == "softmax":
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
        elif p["gating"] == "sqrtsoftplus":
            probs = np.sqrt(np.log1p(np.exp(logits)))
        else:
            probs = 1.0 / (1.0 + np.exp(-logits))
        select = probs + (i["bias"] if "bias" in i else 0.0)
        groups = select.reshape(n_group, -1)
        group_score = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
        closed = np.argsort(-group_score)[n_group_used:]
        groups[closed] = -np.inf
        chosen = i["experts"][r] if "experts" in i else np.argsort(-groups.reshape(-1))[:p["n_used"]]
        weights = probs[chosen]
        if p["norm"]:
            weights = weights / max(weights.sum(), 6.103515625e-5)
        out[r, chosen] = weights * (p["scale"] or 1.0)
    return out


def _route_run(b, i, p):
    from .moe import route

    r = route(b.to_numpy(i["logits"]), _route_params(p), b.to_numpy(i["bias"]) if "bias" in i else None,
              i.get("experts"))
    out = np.zeros(r.experts.shape[:1] + (p["n_expert"],), dtype=np.float32)
    np.put_along_axis(out, r.experts, r.weights, axis=1)
    return out


register(Op(
    "MOE_ROUTE", make=_route_make, reference=_route_ref, run=_route_run,
    cases=lambda quick: [
        dict(rows=r, n_expert=e, n_used=k, gating=g, norm=n, scale=s, groups=grp, bias=bias)
        for r in (1, 7)
        for e, k, g, n, s, grp, bias in ((8, 2, "softmax", 1, 0.0, (1, 1), False),  # Mixtral
                                         (64, 6, "softmax", 0, 2.0, (1, 1), False),  # DeepSeek-V2
                                         (256, 8, "sigmoid", 1, 2.5, (8, 4), True),  # DeepSeek-V3
                                         (8, 2, "sigmoid", 1, 2.5, (4, 2), True),  # tiny-deepseek32
                                         (256, 6, "sqrtsoftplus", 1, 1.5, (1, 1), True))]  # DeepSeek-V4
    + [dict(rows=7, n_expert=e, n_used=k, gating="sqrtsoftplus", norm=1, scale=1.5, groups=(1, 1), bias=False,
            hash=True) for e, k in ((4, 2), (256, 6))],  # DeepSeek-V4's first layers, routed by token id
    nmse=lambda p: 1e-10,  # float32 weights of the same experts
))

# ---- DeepSeek-V4: HC_MIX, HC_POST, COMPRESS_POOL (core/hyper.py) ---------------------------------


def _hc_mix_make(p, rng):
    s = p["streams"]
    return dict(mix=_f32(rng, p["rows"], (2 + s) * s, lo=-3, hi=3), scale=_f32(rng, 3, lo=0.5, hi=1.5),
                base=_f32(rng, (2 + s) * s))


def _hc_mix_ref(i, p):
    """Per token, as ggml's hc_pre / hc_comb: sigmoid gates, then a softmax over each source's
    destinations and Sinkhorn rounds (columns, then rows and columns), every sum plus eps."""
    s, eps = p["streams"], p["eps"]
    mix, scale, base = (i[k].astype(np.float64) for k in ("mix", "scale", "base"))
    out = []
    for row in mix:
        pre = 1 / (1 + np.exp(-(row[:s] * scale[0] + base[:s]))) + eps
        post = 2 / (1 + np.exp(-(row[s:2 * s] * scale[1] + base[s:2 * s])))
        comb = np.empty((s, s))
        for src in range(s):
            logits = row[2 * s + src * s:2 * s + (src + 1) * s] * scale[2] + base[2 * s + src * s:2 * s + (src + 1) * s]
            e = np.exp(logits - logits.max())
            comb[src] = e / e.sum() + eps
        comb /= comb.sum(axis=0) + eps
        for _ in range(p["iterations"] - 1):
            comb /= comb.sum(axis=1)[:, None] + eps
            comb /= comb.sum(axis=0) + eps
        out.append(np.concatenate([pre, post, comb.reshape(-1)]))
    return np.array(out)


def _hc_mix_run(b, i, p):
    from .hyper import hc_mix

    xp = b.xp
    pre, post, comb = hc_mix(*(b.asarray(i[k]) for k in ("mix", "scale", "base")), p["streams"], p["iterations"],
                             p["eps"], xp)
    return xp.concatenate([pre, post, comb.reshape(len(comb), -1)], axis=1)


register(Op(
    "HC_MIX", make=_hc_mix_make, reference=_hc_mix_ref, run=_hc_mix_run,
    cases=lambda quick: [dict(rows=r, streams=4, iterations=it, eps=1e-6) for r in (1, 7, 64) for it in (1, 3, 20)],
    nmse=lambda p: 1e-10,
))


def _hc_post_make(p, rng):
    n, s, e = p["rows"], p["streams"], p["n_embd"]
    comb = rng.random((n, s, s)).astype(np.float32)
    return dict(out=_f32(rng, n, e), streams=_f32(rng, n, s, e), post=_f32(rng, n, s, lo=0, hi=2),
                comb=comb / comb.sum(axis=1, keepdims=True))


def _hc_post_ref(i, p):
    out, streams, post, comb = (i[k].astype(np.float64) for k in ("out", "streams", "post", "comb"))
    result = np.empty(streams.shape)
    for dst in range(p["streams"]):
        result[:, dst] = post[:, dst, None] * out + sum(comb[:, src, dst, None] * streams[:, src]
                                                        for src in range(p["streams"]))
    return result


def _hc_post_run(b, i, p):
    from .hyper import hc_post

    return hc_post(*(b.asarray(i[k]) for k in ("out", "streams", "post", "comb")), b.xp)


register(Op(
    "HC_POST", make=_hc_post_make, reference=_hc_post_ref, run=_hc_post_run,
    cases=lambda quick: [dict(rows=r, streams=4, n_embd=e) for r in (1, 9) for e in (64, 4096)],
    nmse=lambda p: 1e-10,
))


def _pool_make(p, rng):
    """Candidates of n blocks; with `first`, block 0's earlier half is the -inf row of a sequence's start."""
    n, c, w = p["blocks"], p["candidates"], p["width"]
    score = _f32(rng, n, c, w, lo=-4, hi=4)
    if p["first"]:
        score[0, :c // 2] = -np.inf
    return dict(kv=_f32(rng, n, c, w), score=score)


def _pool_ref(i, p):
    kv, score = i["kv"].astype(np.float64), i["score"].astype(np.float64)
    w = np.exp(score - score.max(axis=1, keepdims=True))
    return (w * kv).sum(axis=1) / w.sum(axis=1)


def _pool_run(b, i, p):
    from .hyper import compress_pool

    return compress_pool(b.asarray(i["kv"]), b.asarray(i["score"]), b.xp)


register(Op(
    "COMPRESS_POOL", make=_pool_make, reference=_pool_ref, run=_pool_run,
    cases=lambda quick: [dict(blocks=n, candidates=c, width=w, first=f) for n in (1, 5) for c, w, f in
                         ((8, 64, True), (8, 128, True), (128, 64, False), (8, 512, True), (128, 512, False))],
    nmse=lambda p: 1e-10,
))

# ---- FLASH_ATTN_EXT --------------------------------------------------------------------------

KV_TYPES = CACHE_ROW_TYPES
SPARSE_SEED = 0x5A17


def _kv_rows(rng, n_kv, n_head_kv, d, kv_type):
    """K or V values as the cache type holds them (rounded through f16, or a block type's values),
    and for a block type its blocks (`BlockRows`, what the backend's attention reads), else None."""
    x = _f32(rng, n_kv, n_head_kv, d)
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32), None
    qtype = KV_TYPES[kv_type]
    if qtype is None:
        return x, None
    raw = cache_blocks(x.reshape(n_kv, -1), qtype)
    values = quants.dequantize(raw, qtype).reshape(n_kv, n_head_kv, d).astype(np.float32)
    return values, BlockRows(raw, int(qtype), n_head_kv, d)


def sparse_mask(rows: int, n_kv: int, n_kv_max: int, seed: int = SPARSE_SEED, blocks: bool = False,
                edges: bool = False) -> np.ndarray:
    """test-backend-ops' sparse mask: row r keeps n_kv_max - r % min(n_kv_max, 17) random columns
    (ascending, small negative values), so some rows keep one entry; all else is -inf. With
    `blocks`, as a block top-k mask does: the columns come from a few blocks of 32 scattered over
    the cache that all rows share, so nearby rows' selections overlap (the CPU gathers their union).
    With `edges` the rows keep 0, 1, n_kv_max and n_kv_max - 1 columns in turn (a row that sees
    nothing gives 0; a full row leaves a compacted list no -1 padding)."""
    rng = np.random.default_rng(seed)
    mask = np.full((rows, n_kv), -np.inf, dtype=np.float32)
    pool = np.arange(n_kv)
    if blocks:
        chosen = np.sort(rng.permutation(-(-n_kv // 32))[:max(1, 2 * n_kv_max // 32)])
        pool = (chosen[:, None] * 32 + np.arange(32)).reshape(-1)
        pool = pool[pool < n_kv]
    for r in range(rows):
        count = min(len(pool), max(1, n_kv_max - r % min(n_kv_max, 17)))
        if edges:
            count = min(len(pool), (0, 1, n_kv_max, n_kv_max - 1)[r % 4])
        cols = np.sort(rng.permutation(pool)[:count])
        mask[r, cols] = -0.03125 * (1 + (np.arange(count) + r) % 7)
    return mask


def ring_window_mask(rows: int, n_kv: int, window: int) -> np.ndarray:
    """A sliding window over a ring cache, as llama.cpp's SWA cache lays it out: the rows' tokens
    sit in cells n_kv - rows // 2 onwards, wrapping past the end, and each row sees the `window`
    newest tokens up to its own, so a tile of rows sees keys at both ends of the ring."""
    first = n_kv - rows // 2
    mask = np.full((rows, n_kv), -np.inf, dtype=np.float32)
    for r in range(rows):
        mask[r, (first + r - np.arange(window)) % n_kv] = 0.0
    return mask


def _fa_make(p, rng):
    nh_kv, (r1, _) = p["nh"], p["nr23"]
    q = _f32(rng, p["nb"], nh_kv * r1, p["hsk"])
    k, k_blocks = _kv_rows(rng, p["kv"], nh_kv, p["hsk"], p["type_K"])
    v, v_blocks = (k[..., : p["hsv"]], None) if p.get("v_is_view_of_k") else \
        _kv_rows(rng, p["kv"], nh_kv, p["hsv"], p["type_V"])
    if p["n_kv_max"]:
        mask = sparse_mask(p["nb"], p["kv"], p["n_kv_max"], blocks=p.get("sparse") == "blocks",
                           edges=p.get("sparse") == "edges")
    elif p.get("window"):
        mask = ring_window_mask(p["nb"], p["kv"], p["window"])
    else:
        mask = _mask(rng, p["nb"], p["kv"], "dense" if p["mask"] else "none")
    sinks = _f32(rng, nh_kv * r1, lo=-10, hi=10) if p["sinks"] else None
    return dict(q=q, k=k, v=v, mask=mask, sinks=sinks, k_blocks=k_blocks, v_blocks=v_blocks)


def _fa_ref(i, p):
    """Plain attention per query head, in float64."""
    q, k, v = (i[n].astype(np.float64) for n in ("q", "k", "v"))
    n_head, group = q.shape[1], q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(p["hsk"])
    slopes = _alibi_ref(n_head, p["max_bias"])
    out = np.empty((q.shape[0], n_head, v.shape[2]))
    for h in range(n_head):
        s = q[:, h] @ k[:, h // group].T * scale
        if p["logit_softcap"]:
            s = p["logit_softcap"] * np.tanh(s / p["logit_softcap"])
        if i["mask"] is not None:
            s = s + slopes[h] * i["mask"]
        sinks = None if i["sinks"] is None else np.full((len(s), 1), float(i["sinks"][h]))
        out[:, h] = _softmax_rows(s, sinks) @ v[:, h // group]
    return out


def _fa_run(b, i, p):
    """The cache rows as stored: a block type's blocks (the reference takes their values)."""
    k = i["k"] if i.get("k_blocks") is None else i["k_blocks"]
    v = i["v"] if i.get("v_blocks") is None else i["v_blocks"]
    return b.flash_attn_ext(i["q"], k, v, i["mask"], 1.0 / math.sqrt(p["hsk"]), p["logit_softcap"],
                            i["sinks"], p["max_bias"], p["n_kv_max"], path=p.get("path"))


def fa_params(hsk=128, hsv=128, nh=2, gqa=1, kv=512, nb=8, mask=True, sinks=False, max_bias=0.0, softcap=0.0,
              type_kv="f16", n_kv_max=0, v_is_view_of_k=False, path="auto", sparse="random", window=0) -> dict:
    """A FLASH_ATTN_EXT case; `path` forces the dense or sparse kernel where the hint allows either;
    `sparse` ("random", "blocks" or "edges") is the kind of sparse mask (see sparse_mask); `window` > 0
    makes the mask a sliding window over a ring cache (ring_window_mask)."""
    params = dict(hsk=hsk, hsv=hsv, nh=nh, nr23=[gqa, 1], kv=kv, nb=nb, mask=mask, sinks=sinks, max_bias=max_bias,
                  logit_softcap=softcap, prec="f32", type_K=type_kv, type_V=type_kv, v_is_view_of_k=v_is_view_of_k,
                  n_kv_max=n_kv_max, **({"window": window} if window else {}))
    if not n_kv_max:
        return params
    return {**params, "path": path, **({"sparse": sparse} if sparse != "random" else {})}


def _fa_cases(quick: bool) -> list[dict]:
    heads = [(40, 40), (64, 64), (80, 80), (96, 96), (128, 128), (192, 192), (256, 256), (576, 512)]
    cases = []
    for (hsk, hsv), gqa, kv, nb in product(heads, (1, 4, 8, 16), (113, 512, 1025), (1, 8)):
        if quick and hsk >= 192 and gqa > 4:
            continue
        cases.append(fa_params(hsk, hsv, 1 if gqa >= 8 else 2, gqa, kv, nb, v_is_view_of_k=hsk == 576))
    for variant in (dict(mask=False), dict(sinks=True), dict(softcap=10.0), dict(max_bias=8.0),
                    *(dict(type_kv=t) for t in KV_TYPES if t != "f16"), dict(sinks=True, softcap=10.0, max_bias=8.0)):
        for hsk, gqa, nb in ((64, 1, 8), (128, 4, 1), (128, 8, 32)):
            cases.append(fa_params(hsk, hsk, 2, gqa, 512, nb, **variant))
    for kv in (4096,):
        cases.append(fa_params(128, 128, 2, 4, kv, 8))
    for hsk, gqa, kv, nb in ((64, 2, 200, 70), (256, 1, 130, 20)):  # prompts of partial 64-row tiles
        cases.append(fa_params(hsk, hsk, 2, gqa, kv, nb))
    for type_kv in ("f16", "q8_0"):  # a prompt's tiles over a wrapped sliding-window ring
        cases.append(fa_params(64, 64, 2, 4, 1024, 300, window=256, type_kv=type_kv))
    for path in ("dense", "sparse"):
        for kv, n_kv_max, nb, gqa in ((4096, 512, 1, 8), (4096, 512, 8, 4), (1025, 96, 24, 1), (768, 64, 3, 2),
                                      (4096, 2048, 4, 16), (113, 17, 20, 1)):
            cases.append(fa_params(128, 128, 1 if gqa >= 8 else 2, gqa, kv, nb, n_kv_max=n_kv_max, path=path))
        cases.append(fa_params(576, 512, 1, 16, 2048, 4, n_kv_max=512, v_is_view_of_k=True, path=path))
        # DeepSeek-V4: one K=V head of 512 under 64 query heads with sinks, a window plus the kept rows
        cases.append(fa_params(512, 512, 1, 64, 1024, 2, sinks=True, n_kv_max=128 + 512, v_is_view_of_k=True,
                               path=path))
        cases.append(fa_params(512, 512, 1, 16, 256, 1, sinks=True, n_kv_max=16 + 48, v_is_view_of_k=True, path=path))
        cases.append(fa_params(64, 64, 1, 4, 200, 16, sinks=True, n_kv_max=32 + 8, v_is_view_of_k=True, path=path))
        cases.append(fa_params(64, 64, 2, 4, 1024, 8, sinks=True, softcap=10.0, max_bias=8.0, n_kv_max=128,
                               type_kv="q8_0", path=path))
        for variant in (dict(), dict(sinks=True, softcap=10.0, max_bias=8.0, type_kv="q8_0"), dict(type_kv="f32")):
            cases.append(fa_params(64, 64, 2, 4, 4096, 80, n_kv_max=256, path=path, sparse="blocks", **variant))
        for variant in (dict(), dict(sinks=True)):  # rows that keep 0, 1 and n_kv_max keys
            cases.append(fa_params(128, 128, 2, 4, 1024, 9, n_kv_max=64, path=path, sparse="edges", **variant))
    return cases


def _fa_perf_cases() -> list[dict]:
    """Dense against sparse on the same long cache (the sparse masks keep n_kv_max keys per row),
    at the sizes the CUDA issue sets targets for: head 128, 32 query / 8 KV heads, 32768 keys,
    decode (1 query) and prefill (2048 queries), f16 K/V. The small first group suits a CPU."""
    cpu_sized = [fa_params(128, 128, 8, 1, 32768, 1, type_kv="f32", n_kv_max=n, path=p)
                 for n, p in ((0, "auto"), (1024, "dense"), (1024, "sparse"))] + \
        [fa_params(128, 128, 8, 4, 4096, 512, type_kv="f32")]
    gpu_sized = [fa_params(128, 128, 8, 4, 32768, nb, type_kv="f16", n_kv_max=n, path=p)
                 for nb in (1, 8, 2048) for n, p in ((0, "auto"), (2048, "dense"), (2048, "sparse"))]
    return cpu_sized + gpu_sized


register(Op(
    "FLASH_ATTN_EXT", make=_fa_make, reference=_fa_ref, run=_fa_run, cases=_fa_cases, perf_cases=_fa_perf_cases,
    nmse=lambda p: 5e-4,
    flops=lambda p: 2.0 * p["nh"] * p["nr23"][0] * p["nb"] * (p["hsk"] + p["hsv"]) * p["kv"],
))
