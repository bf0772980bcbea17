"""How close the engine's logits are to llama.cpp's on the real models, through both CPU paths:
the prompt path (one ubatch: BLAS over dequantized tiles, attention in tiles) and the decode path
(one token per ubatch: the mat-vec kernels and attend_rows), plus the greedy fixture prompts.

    python scripts/logit_fidelity.py [-m smollm2-135m,gemma3-270m] [--fixtures tests/fixtures/real] [--numerics ggml]

Prints one markdown row per model and path: mean and max |Δ| over llama.cpp's top-10 logits at the
96 positions, top-1 agreement, max |Δ| over the last position's whole vocabulary; and per model how
each greedy prompt compares with llama.cpp's first 16 tokens (the KV cache is the CLI's default,
f16, as in the fixtures).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from llmsuite.core.backend import default_cache_type
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model

GREEDY_TOKENS = 16
CACHE = default_cache_type("cpu")  # the CLI's default, f16 as llama.cpp's fixtures used
NUMERICS = "f32"  # --numerics


def params(**kw) -> ContextParams:
    return ContextParams(n_ctx=2048, type_k=CACHE, type_v=CACHE, numerics=NUMERICS, **kw)


def logits_in_one_batch(model, ids) -> np.ndarray:
    ctx = Context(model, params(n_ubatch=512))
    assert ctx.decode(Batch.from_tokens(ids, all_outputs=True)) == 0, ctx.last_error
    return ctx.logits.copy()


def logits_token_by_token(model, ids) -> np.ndarray:
    ctx = Context(model, params())
    rows = []
    for pos, token in enumerate(ids):
        assert ctx.decode(Batch.from_tokens([token], pos0=pos)) == 0, ctx.last_error
        rows.append(ctx.get_logits().copy())
    return np.stack(rows)


def statistics(ours: np.ndarray, fixture: dict) -> dict:
    diffs, same_top = [], 0
    for pos, top in enumerate(fixture["top"]):
        ids = [t[0] for t in top]
        diffs.append(np.abs(ours[pos, ids] - np.array([t[1] for t in top])))
        same_top += int(np.argmax(ours[pos])) == ids[0]
    diffs = np.concatenate(diffs)
    last = np.abs(ours[-1] - np.array(fixture["last_logits"])).max()
    return {"mean": diffs.mean(), "max": diffs.max(), "top1": same_top, "n": len(fixture["top"]), "last": last}


def greedy_report(model, cases) -> list[str]:
    """Per prompt: identical for GREEDY_TOKENS tokens, or the first step that differs with our
    margin between our token and llama.cpp's."""
    report = []
    for case in cases:
        ctx = Context(model, params())
        assert ctx.decode(Batch.from_tokens(case["prompt_ids"])) == 0
        verdict = "identical"
        for step, want in enumerate(case["generated_ids"][:GREEDY_TOKENS]):
            logits = ctx.get_logits()
            got = int(np.argmax(logits))
            if got != want:
                verdict = f"differs at step {step} (our margin {logits[got] - logits[want]:.3f})"
                break
            assert ctx.decode(Batch.from_tokens([got])) == 0
        report.append(verdict)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--fixtures", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/real"))
    ap.add_argument("--numerics", default="ggml", choices=("f32", "ggml"),
                    help="ggml (the default): matmul activations rounded as ggml-cpu does; f32: the float reference")
    args = ap.parse_args()
    global NUMERICS
    NUMERICS = args.numerics
    print("| model | path | mean \\|Δ\\| top-10 | max \\|Δ\\| top-10 | top-1 equal | last position max \\|Δ\\| |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    greedy = []
    for name in args.models.split(","):
        fixture = json.loads((Path(args.fixtures) / f"{name}.logits.json").read_text())
        model = load_model(resolve_model(name))
        for path, run in (("prompt (one ubatch)", logits_in_one_batch), ("decode (token by token)", logits_token_by_token)):
            s = statistics(run(model, fixture["ids"]), fixture)
            print(f"| {name} | {path} | {s['mean']:.3f} | {s['max']:.3f} | {s['top1']}/{s['n']} | {s['last']:.3f} |",
                  flush=True)
        cases = json.loads((Path(args.fixtures) / f"{name}.greedy.json").read_text())["cases"]
        greedy.append(f"{name}, greedy first {GREEDY_TOKENS} tokens: " + "; ".join(greedy_report(model, cases)))
    print("\n" + "\n".join(greedy))


if __name__ == "__main__":
    main()
