"""How close the MoE, Qwen3 and DeepSeek decoders are to llama.cpp on the tiny fixture models: top-10
logits, the last position in full, decisive top-1, routing and DSA key selections, under both
numerics (f32 activations with an f32 cache; or ggml's rounding with llama.cpp's f16 cache).

    python scripts/decoder_fidelity.py [--fixtures tests/fixtures/tiny] [--models llama-moe,qwen3,...]

Prints one markdown row per model and numerics (and, for DeepSeek-2, naive against latent
attention). DSA positions whose selection differs from
llama.cpp's (near-ties) are left out of the "away from flips" column and listed with their gap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.models import load_model

MARGIN, GAP = 5e-2, 1e-3
NUMERICS = {"f32": dict(numerics="f32", type_k="f32", type_v="f32"),
            "ggml": dict(numerics="ggml", type_k="f16", type_v="f16")}


def decode(model, ids, params) -> tuple[np.ndarray, dict]:
    seen: dict[str, list] = {}
    ctx = Context(model, ContextParams(n_ctx=2048, **params),
                  observer=lambda name, ub, x: seen.setdefault(name, []).append(np.asarray(x).copy()))
    assert ctx.decode(Batch.from_tokens(ids, all_outputs=True)) == 0, ctx.last_error
    return ctx.logits.copy(), seen


def dsa_flips(seen: dict, ref: dict) -> dict[int, float]:
    """Position → llama.cpp's boundary gap where some layer's selected keys differ (the smallest
    gap among those layers: a flip downstream of an earlier one can have a wide gap)."""
    flips = {}
    for il, info in ref["debug"].get("dsa", {}).items():
        rows = [row for mask in seen[f"dsa_mask-{il}"] for row in mask]
        for pos, (row, keys) in enumerate(zip(rows, info["selected_keys"])):
            if np.flatnonzero(np.isfinite(row)).tolist() != keys:  # the narrowest gap of the layers that differ
                flips[pos] = min(flips.get(pos, np.inf), info["boundary_gap_per_position"][pos])
    return flips


def routing_misses(seen: dict, ref: dict) -> int:
    misses = 0
    for il, info in ref["debug"].get("moe", {}).items():
        chosen = np.concatenate(seen[f"ffn_moe_topk-{il}"])
        misses += sum(sorted(chosen[pos]) != sorted(want) for pos, (want, margin) in
                      enumerate(zip(info["selected_experts"], info["expert_margin_per_position"])) if margin >= GAP)
    return misses


def row(name: str, model, ref: dict, numerics: str) -> str:
    logits, seen = decode(model, ref["ids"], NUMERICS[numerics])
    flips = dsa_flips(seen, ref)
    worst = worst_away = 0.0
    decisive = agree = 0
    for pos, top in enumerate(ref["top"]):
        ids, values = [t[0] for t in top], np.array([t[1] for t in top])
        diff = float(np.abs(logits[pos, ids] - values).max())
        worst = max(worst, diff)
        worst_away = max(worst_away, diff) if pos not in flips else worst_away
        if values[0] - values[1] >= MARGIN:
            decisive += 1
            agree += int(np.argmax(logits[pos])) == ids[0]
    last = float(np.abs(logits[-1] - np.array(ref["last_logits"])).max())
    flipped = ", ".join(f"{p} (gap {g:.1e})" for p, g in sorted(flips.items())) or "none"
    return (f"| {name} | {numerics} | {worst:.4f} | {worst_away:.4f} | {last:.4f} | {agree}/{decisive} | "
            f"{routing_misses(seen, ref)} | {flipped} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/tiny")
    ap.add_argument("--models", default="llama-moe,qwen3,deepseek2,deepseek32")
    args = ap.parse_args()
    print("| model | numerics | top-10 max abs diff | away from DSA flips | last position, all logits | "
          "decisive top-1 | experts differing (margin >= 1e-3) | DSA positions differing |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name in args.models.split(","):
        model = load_model(args.fixtures / f"tiny-{name}.gguf")
        ref = json.loads((args.fixtures / f"tiny-{name}.json").read_text())
        for numerics in NUMERICS:
            print(row(name, model, ref, numerics), flush=True)
        if model.attn_impls == ("mla", "naive"):
            latent, naive = (decode(model, ref["ids"], {**NUMERICS["f32"], "attn_impl": impl})[0] for impl in model.attn_impls)
            print(f"\n{name}: --attn-impl naive against mla, f32 cache: max relative diff "
                  f"{np.abs(latent - naive).max() / np.abs(naive).max():.1e}\n")


if __name__ == "__main__":
    main()
