#!/usr/bin/env python3
"""Write a random-weight GGUF with the shapes of a real model: same architecture, hparams, tensor
shapes and weight types, so the same work per token. For speed checks where the real file cannot
go (the GPU machine reaches no package index and takes 64 MiB of files); its text is gibberish.

    python scripts/random_model.py smollm2-135m /tmp/smollm2-shaped.gguf [--ctx 40960]
    LLAMACPP_BIN=… python scripts/random_model.py llama-3.2-1b /tmp/llama1b-q4km.gguf --quantize Q4_K_M

--ctx declares a longer trained context (not a shape: the speed per token is the same), so that
llm bench accepts depths beyond the real model's 8192 positions. --quantize writes the F16 model
first and quantizes it with llama.cpp's own `llama-quantize` (from $LLAMACPP_BIN): gguf-py has no
K-quant writer, and the real files' mixes (Q4_K_M: Q4_K with Q6_K for some tensors) are
llama-quantize's choice. A measuring stick only: llmsuite never needs llama.cpp.

The tokenizer is a byte-level BPE with one merge and filler tokens up to the real vocabulary size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFWriter, LlamaFileType as F, quants

PRESETS = {
    # SmolLM2-135M-Instruct.Q4_1.gguf: Q4_1 matrices, Q8_0 (tied) embeddings
    "smollm2-135m": dict(arch="llama", n_vocab=49152, n_embd=576, n_layer=30, n_head=9, n_head_kv=3, head_dim=64,
                         n_ff=1536, n_ctx=8192, rope_base=100000.0, eps=1e-5, matrix_type=Q.Q4_1, embd_type=Q.Q8_0,
                         file_type=F.MOSTLY_Q4_1),
    # gemma-3-270m-q4_k_m.gguf: mostly Q5_0 matrices (no K-quant writer in gguf-py), Q8_0 embeddings
    "gemma3-270m": dict(arch="gemma3", n_vocab=262144, n_embd=640, n_layer=18, n_head=4, n_head_kv=1, head_dim=256,
                        n_ff=2048, n_ctx=32768, rope_base=1e6, eps=1e-6, sliding_window=512,
                        matrix_type=Q.Q5_0, embd_type=Q.Q8_0, file_type=F.MOSTLY_Q5_0),
    # Llama-3.2-1B and Qwen3-1.7B, written in F16 for --quantize (Q4_K_M, Q8_0) to turn into the real mixes
    "llama-3.2-1b": dict(arch="llama", n_vocab=128256, n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64,
                         n_ff=8192, n_ctx=131072, rope_base=500000.0, eps=1e-5, matrix_type=Q.F16, embd_type=Q.F16,
                         file_type=F.MOSTLY_F16),
    "qwen3-1.7b": dict(arch="qwen3", n_vocab=151936, n_embd=2048, n_layer=28, n_head=16, n_head_kv=8, head_dim=128,
                       n_ff=6144, n_ctx=40960, rope_base=1e6, eps=1e-6, matrix_type=Q.F16, embd_type=Q.F16,
                       file_type=F.MOSTLY_F16),
    # Mamba-130M (state-spaces/mamba-130m) quantized like SmolLM2 above, for a recurrent model of the
    # same size: Q4_1 projections, the rank-48 step projection F32 (no block fits 48), Q8_0 embeddings
    "mamba-130m": dict(arch="mamba", n_vocab=50280, n_embd=768, n_layer=24, d_inner=1536, d_state=16, d_conv=4,
                       dt_rank=48, n_ctx=1 << 20, eps=1e-5, matrix_type=Q.Q4_1, embd_type=Q.Q8_0,
                       file_type=F.MOSTLY_Q4_1),
    # LFM2-350M (LiquidAI/LFM2-350M): 16 layers, attention in 2, 5, 8, 10, 12, 14 and gated short
    # convolutions (3 taps) in the other 10; written F16 for --quantize Q4_K_M, the mix it ships in
    "lfm2-350m": dict(arch="lfm2", n_vocab=65536, n_embd=1024, n_layer=16, n_head=16, n_head_kv=8, head_dim=64,
                      n_ff=4608, n_ctx=128000, rope_base=1e6, eps=1e-5, l_cache=3,
                      attention_layers=(2, 5, 8, 10, 12, 14), matrix_type=Q.F16, embd_type=Q.F16,
                      file_type=F.MOSTLY_F16),
    # DeepSeek-V4-Flash's attention, indexer, compressor and hyper-connection shapes (64 query heads over
    # one K=V head of 512, rope 64, q/output LoRA 1024 in 8 groups, a 128-token window, an indexer of
    # 64 × 128 keeping 512 rows, 4 streams with 20 Sinkhorn rounds, the real vocabulary), cut in depth and
    # width where attention at depth does not look: 6 of its 43 layers in its pattern (two window-only, then
    # ratio 4 and 128 alternating, so a third of the layers select rows as against 20 of 43), the first 3
    # routed by token id as its are, and 8 routed experts of width 512 (of 256 of 2048; 6 used, as its
    # are); its one shared expert of 2048 as 4 shared of 512 (llama.cpp sizes the shared FFN as
    # expert_shared_count × the expert width). Written F16 for --quantize.
    "deepseek-v4-flash": dict(arch="deepseek4", n_vocab=129280, n_embd=4096, n_layer=6, n_head=64, head_dim=512,
                              n_rot=64, q_lora=1024, o_groups=8, o_lora=1024, n_expert=8, n_used=6, n_shared=4,
                              n_ff_exp=512, n_hash=3, window=128, indexer_heads=64, indexer_dim=128,
                              indexer_top_k=512, hc=4, sinkhorn=20, ratios=(0, 0, 4, 128, 4, 128), n_ctx=1 << 20,
                              rope_base=10000.0, compress_base=160000.0, eps=1e-6, swiglu_clamp=10.0,
                              matrix_type=Q.F16, embd_type=Q.F16, file_type=F.MOSTLY_F16),
}


def byte_level_tokens(n_vocab: int) -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, "ab" (the one merge), fillers, BOS and EOS."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    shifted = iter(range(256, 512))
    stand_in = {b: chr(b) if b in keep else chr(next(shifted)) for b in range(256)}
    fill = ["ab"] + [f"<r{i}>" for i in range(n_vocab - 259)]
    return [stand_in[b] for b in range(256)] + fill + ["<s>", "</s>"]


def mamba_layer_tensors(p: dict, il: int) -> dict[str, tuple[tuple[int, ...], str]]:
    e, di, ds, blk = p["n_embd"], p["d_inner"], p["d_state"], f"blk.{il}"
    return {f"{blk}.attn_norm.weight": ((e,), "norm"), f"{blk}.ssm_in.weight": ((2 * di, e), "matrix"),
            f"{blk}.ssm_conv1d.weight": ((di, p["d_conv"]), "f32"), f"{blk}.ssm_conv1d.bias": ((di,), "bias"),
            f"{blk}.ssm_x.weight": ((p["dt_rank"] + 2 * ds, di), "matrix"),
            f"{blk}.ssm_dt.weight": ((di, p["dt_rank"]), "f32"), f"{blk}.ssm_dt.bias": ((di,), "bias"),
            f"{blk}.ssm_a": ((di, ds), "decay"), f"{blk}.ssm_d": ((di,), "norm"),
            f"{blk}.ssm_out.weight": ((e, di), "matrix")}


def ffn_tensors(p: dict, blk: str) -> dict[str, tuple[tuple[int, ...], str]]:
    e, ff = p["n_embd"], p["n_ff"]
    return {f"{blk}.ffn_norm.weight": ((e,), "norm"), f"{blk}.ffn_gate.weight": ((ff, e), "matrix"),
            f"{blk}.ffn_up.weight": ((ff, e), "matrix"), f"{blk}.ffn_down.weight": ((e, ff), "matrix")}


def short_conv_layer_tensors(p: dict, il: int) -> dict[str, tuple[tuple[int, ...], str]]:
    e, blk = p["n_embd"], f"blk.{il}"
    return {f"{blk}.attn_norm.weight": ((e,), "norm"), f"{blk}.shortconv.in_proj.weight": ((3 * e, e), "matrix"),
            f"{blk}.shortconv.conv.weight": ((e, p["l_cache"]), "f32"),
            f"{blk}.shortconv.out_proj.weight": ((e, e), "matrix"), **ffn_tensors(p, blk)}


def deepseek4_layer_tensors(p: dict, il: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """DeepSeek-V4's block (llama.cpp's tensor table, ne reversed): attention, hyper-connections (F32),
    the layer's compressor and indexer by its ratio, the router, the experts."""
    e, h, d, blk = p["n_embd"], p["n_head"], p["head_dim"], f"blk.{il}"
    ql, og, ol, ne = p["q_lora"], p["o_groups"], p["o_lora"], p["n_expert"]
    mix, hcd = (2 + p["hc"]) * p["hc"], p["hc"] * e
    out = {f"{blk}.attn_norm.weight": ((e,), "norm"), f"{blk}.attn_sinks.weight": ((h,), "norm"),
           f"{blk}.attn_q_a.weight": ((ql, e), "matrix"), f"{blk}.attn_q_a_norm.weight": ((ql,), "norm"),
           f"{blk}.attn_q_b.weight": ((h * d, ql), "matrix"), f"{blk}.attn_kv.weight": ((d, e), "matrix"),
           f"{blk}.attn_kv_a_norm.weight": ((d,), "norm"),
           f"{blk}.attn_output_a.weight": ((og * ol, h * d // og), "matrix"),
           f"{blk}.attn_output_b.weight": ((e, og * ol), "matrix"),
           f"{blk}.ffn_norm.weight": ((e,), "norm"), f"{blk}.ffn_gate_inp.weight": ((ne, e), "f32"),
           f"{blk}.ffn_gate_exps.weight": ((ne, p["n_ff_exp"], e), "matrix"),
           f"{blk}.ffn_up_exps.weight": ((ne, p["n_ff_exp"], e), "matrix"),
           f"{blk}.ffn_down_exps.weight": ((ne, e, p["n_ff_exp"]), "matrix"),
           f"{blk}.ffn_gate_shexp.weight": ((p["n_ff_exp"] * p["n_shared"], e), "matrix"),
           f"{blk}.ffn_up_shexp.weight": ((p["n_ff_exp"] * p["n_shared"], e), "matrix"),
           f"{blk}.ffn_down_shexp.weight": ((e, p["n_ff_exp"] * p["n_shared"]), "matrix")}
    for sub in ("attn", "ffn"):
        out.update({f"{blk}.hc_{sub}_fn.weight": ((mix, hcd), "f32"), f"{blk}.hc_{sub}_base.weight": ((mix,), "bias"),
                    f"{blk}.hc_{sub}_scale.weight": ((3,), "norm")})
    out[f"{blk}.ffn_gate_tid2eid.weight" if il < p["n_hash"] else f"{blk}.exp_probs_b.bias"] = \
        ((p["n_vocab"], p["n_used"]), "experts") if il < p["n_hash"] else ((ne,), "bias")
    ratio = p["ratios"][il]
    if ratio:
        out.update(compressor_tensors(f"{blk}.attn_compressor", ratio, d, e))
    if ratio == 4:
        out.update({f"{blk}.indexer.proj.weight": ((p["indexer_heads"], e), "f32"),
                    f"{blk}.indexer.attn_q_b.weight": ((p["indexer_heads"] * p["indexer_dim"], ql), "matrix"),
                    **compressor_tensors(f"{blk}.indexer_compressor", ratio, p["indexer_dim"], e)})
    return out


def compressor_tensors(prefix: str, ratio: int, width: int, n_embd: int) -> dict[str, tuple[tuple[int, ...], str]]:
    proj = 2 * width if ratio == 4 else width  # the ratio-4 rows overlap the block before
    return {f"{prefix}_kv.weight": ((proj, n_embd), "matrix"), f"{prefix}_gate.weight": ((proj, n_embd), "matrix"),
            f"{prefix}_ape.weight": ((ratio, proj), "bias"), f"{prefix}_norm.weight": ((width,), "norm")}


def layer_tensors(p: dict, il: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (NumPy shape, kind) for one block: kinds "matrix", "norm", and for Mamba "f32"
    (an unquantized matrix), "bias" and "decay"; DeepSeek-V4's hash routing "experts" (I32 ids)."""
    if p["arch"] == "mamba":
        return mamba_layer_tensors(p, il)
    if p["arch"] == "deepseek4":
        return deepseek4_layer_tensors(p, il)
    if p["arch"] == "lfm2" and il not in p["attention_layers"]:
        return short_conv_layer_tensors(p, il)
    e, hd = p["n_embd"], p["head_dim"]
    blk = f"blk.{il}"
    out = {f"{blk}.attn_norm.weight": ((e,), "norm"),
           f"{blk}.attn_q.weight": ((p["n_head"] * hd, e), "matrix"),
           f"{blk}.attn_k.weight": ((p["n_head_kv"] * hd, e), "matrix"),
           f"{blk}.attn_v.weight": ((p["n_head_kv"] * hd, e), "matrix"),
           f"{blk}.attn_output.weight": ((e, p["n_head"] * hd), "matrix"),
           **ffn_tensors(p, blk)}
    if p["arch"] in ("qwen3", "lfm2"):
        out.update({f"{blk}.attn_q_norm.weight": ((hd,), "norm"), f"{blk}.attn_k_norm.weight": ((hd,), "norm")})
    if p["arch"] == "gemma3":
        out.update({f"{blk}.attn_q_norm.weight": ((hd,), "norm"), f"{blk}.attn_k_norm.weight": ((hd,), "norm"),
                    f"{blk}.post_attention_norm.weight": ((e,), "norm"),
                    f"{blk}.post_ffw_norm.weight": ((e,), "norm")})
    return out


def add_hparams(w: GGUFWriter, p: dict) -> None:
    a = p["arch"]
    if a == "mamba":
        add_ssm_hparams(w, p)
        return
    if a == "deepseek4":
        add_deepseek4_hparams(w, p)
        return
    w.add_context_length(p["n_ctx"])
    w.add_embedding_length(p["n_embd"])
    w.add_block_count(p["n_layer"])
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    if "attention_layers" in p:  # a hybrid: 0 KV heads marks a recurrent layer
        w.add_array(f"{a}.attention.head_count_kv",
                    [p["n_head_kv"] if il in p["attention_layers"] else 0 for il in range(p["n_layer"])])
    else:
        w.add_head_count_kv(p["n_head_kv"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_rope_freq_base(p["rope_base"])
    w.add_layer_norm_rms_eps(p["eps"])
    w.add_uint32(f"{a}.rope.dimension_count", p["head_dim"])
    w.add_uint32(f"{a}.vocab_size", p["n_vocab"])
    if "sliding_window" in p:
        w.add_sliding_window(p["sliding_window"])
    if "l_cache" in p:
        w.add_uint32(f"{a}.shortconv.l_cache", p["l_cache"])


def add_deepseek4_hparams(w: GGUFWriter, p: dict) -> None:
    """The keys llama.cpp's deepseek4 loader reads (reference/llamacpp-deepseek4.md §1), written with
    gguf's generic writers (its release has no DeepSeek-V4 helpers)."""
    u = lambda k, v: w.add_uint32(f"deepseek4.{k}", v)  # noqa: E731
    f = lambda k, v: w.add_float32(f"deepseek4.{k}", v)  # noqa: E731
    n = p["n_layer"]
    for key, value in (("context_length", p["n_ctx"]), ("embedding_length", p["n_embd"]), ("block_count", n),
                       ("attention.head_count", p["n_head"]), ("attention.head_count_kv", 1),
                       ("attention.key_length", p["head_dim"]), ("attention.value_length", p["head_dim"]),
                       ("rope.dimension_count", p["n_rot"]), ("attention.q_lora_rank", p["q_lora"]),
                       ("attention.sliding_window", p["window"]), ("expert_count", p["n_expert"]),
                       ("expert_used_count", p["n_used"]), ("expert_shared_count", p["n_shared"]),
                       ("expert_feed_forward_length", p["n_ff_exp"]), ("expert_gating_func", 4),
                       ("attention.indexer.head_count", p["indexer_heads"]),
                       ("attention.indexer.key_length", p["indexer_dim"]),
                       ("attention.indexer.top_k", p["indexer_top_k"]), ("attention.output_group_count", p["o_groups"]),
                       ("attention.output_lora_rank", p["o_lora"]), ("hyper_connection.count", p["hc"]),
                       ("hyper_connection.sinkhorn_iterations", p["sinkhorn"]), ("hash_layer_count", p["n_hash"]),
                       ("embedding_length_out", p["hc"] * p["n_embd"]), ("vocab_size", p["n_vocab"])):
        u(key, value)
    for key, value in (("rope.freq_base", p["rope_base"]), ("attention.layer_norm_rms_epsilon", p["eps"]),
                       ("expert_weights_scale", 1.5), ("attention.compress_rope_freq_base", p["compress_base"]),
                       ("hyper_connection.epsilon", 1e-6)):
        f(key, value)
    w.add_bool("deepseek4.expert_weights_norm", True)
    w.add_array("deepseek4.attention.compress_ratios", list(p["ratios"]))
    w.add_array("deepseek4.swiglu_clamp_exp", [p["swiglu_clamp"]] * n)
    w.add_array("deepseek4.swiglu_clamp_shexp", [p["swiglu_clamp"]] * n)


def add_ssm_hparams(w: GGUFWriter, p: dict) -> None:
    w.add_context_length(p["n_ctx"])
    w.add_embedding_length(p["n_embd"])
    w.add_block_count(p["n_layer"])
    w.add_layer_norm_rms_eps(p["eps"])
    for key in ("conv_kernel", "inner_size", "state_size", "time_step_rank"):
        w.add_uint32(f"mamba.ssm.{key}", p[{"conv_kernel": "d_conv", "inner_size": "d_inner", "state_size": "d_state",
                                             "time_step_rank": "dt_rank"}[key]])
    w.add_uint32("mamba.vocab_size", p["n_vocab"])


def add_tokenizer(w: GGUFWriter, n_vocab: int) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(byte_level_tokens(n_vocab))
    w.add_token_types([1] * (n_vocab - 2) + [3, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(n_vocab - 2)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...], kind: str, qtype: Q):
    """(data, raw dtype): norms near 1 in F32; matrices N(0, 1/n_in) quantized to qtype (F32 for
    "f32"); biases small; decays -1..-d_state per channel, as Mamba initializes A."""
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32), None
    if kind == "bias":
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32), None
    if kind == "decay":
        return -np.tile(np.arange(1, shape[1] + 1, dtype=np.float32), (shape[0], 1)), None
    data = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[-1]))
    if kind == "f32":
        return data, None
    if qtype == Q.F16:
        return data.astype(np.float16), None
    return quants.quantize(data, qtype), qtype


def write_random_model(preset: str, path: Path, seed: int = 0, n_ctx: int = 0, **overrides) -> Path:
    """The preset's model at `path`; n_ctx > 0 overrides the trained context length it declares,
    `overrides` any other preset field (n_layer=2 for a small model of the same kind, say)."""
    p = {**PRESETS[preset], **({"n_ctx": n_ctx} if n_ctx > 0 else {}), **overrides}
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), p["arch"])
    w.add_name(f"random {preset}-shaped model")
    w.add_file_type(p["file_type"])
    add_hparams(w, p)
    add_tokenizer(w, p["n_vocab"])
    final_norm = "token_embd_norm.weight" if p["arch"] == "lfm2" else "output_norm.weight"
    tensors = {"token_embd.weight": ((p["n_vocab"], p["n_embd"]), "embd"), final_norm: ((p["n_embd"],), "norm")}
    if p["arch"] == "deepseek4":  # an untied head, mixed from the four streams
        tensors.update({"output.weight": ((p["n_vocab"], p["n_embd"]), "matrix"),
                        "output_hc_fn.weight": ((p["hc"], p["hc"] * p["n_embd"]), "f32"),
                        "output_hc_base.weight": ((p["hc"],), "bias"), "output_hc_scale.weight": ((1,), "norm")})
    for il in range(p["n_layer"]):
        tensors.update(layer_tensors(p, il))
    for name, (shape, kind) in tensors.items():
        qtype = p["embd_type"] if kind == "embd" else p["matrix_type"]
        if kind == "experts":  # each token id's distinct experts (DeepSeek-V4's hash routing), I32
            data, raw_dtype = np.argsort(rng.random((shape[0], p["n_expert"])), axis=1)[:, :shape[1]].astype(np.int32), None
        else:
            data, raw_dtype = random_tensor(rng, shape, kind, qtype)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=0, help="declared context length (default: the real model's)")
    parser.add_argument("--quantize", metavar="TYPE", help="llama-quantize's file type (Q4_K_M, Q8_0, …), with $LLAMACPP_BIN")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.quantize:
        write_quantized(args.preset, args.out, args.quantize, args.seed, args.ctx)
    else:
        write_random_model(args.preset, args.out, args.seed, args.ctx)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")


def write_quantized(preset: str, path: Path, file_type: str, seed: int = 0, n_ctx: int = 0) -> Path:
    """The preset in F16, quantized to `file_type` by $LLAMACPP_BIN/llama-quantize (the F16 file is removed)."""
    quantize = Path(os.environ.get("LLAMACPP_BIN", "")) / "llama-quantize"
    if not quantize.is_file():
        raise SystemExit("error: --quantize needs LLAMACPP_BIN, the folder of llama-quantize "
                         "(../shared/tools/build-llamacpp.sh prints it)")
    f16 = path.with_name(path.name + ".f16.tmp")
    try:
        write_random_model(preset, f16, seed, n_ctx, matrix_type=Q.F16, embd_type=Q.F16, file_type=F.MOSTLY_F16)
        subprocess.run([str(quantize), str(f16), str(path), file_type], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"error: llama-quantize failed: {(e.stderr or e.stdout).strip().splitlines()[-1]}") from None
    finally:
        f16.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    main()
