"""How close the encoder and encoder-decoder contexts are to llama.cpp on the tiny fixture models:
BERT's pooled and per-token embeddings, T5's teacher-forced decoder logits, under both numerics
(f32 activations, or ggml's rounding of activations before F16/quantized weights).

    python scripts/encoder_fidelity.py [--fixtures tests/fixtures/tiny]

Prints one markdown row per model and numerics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.embeddings import cosine
from llmsuite.core.models import load_model

MARGIN = 5e-2  # T5's top-1 is compared where llama.cpp's best two logits are this far apart


def bert_row(model, ref: dict, numerics: str) -> str:
    pooled = Context(model, ContextParams(numerics=numerics))
    per_token = Context(model, ContextParams(numerics=numerics, pooling="none"))
    pooled_diff, token_diff, worst_cos = 0.0, 0.0, 1.0
    for seq, expected, tokens_expected in zip(ref["seqs"], ref["pooled"], ref["token_embeddings"]["per_seq"]):
        assert pooled.decode(Batch.from_tokens(seq)) == 0, pooled.last_error
        got = pooled.get_embeddings_seq(0)
        pooled_diff = max(pooled_diff, float(np.abs(got - expected).max()))
        worst_cos = min(worst_cos, cosine(got, expected))
        assert per_token.decode(Batch.from_tokens(seq, all_outputs=True)) == 0, per_token.last_error
        token_diff = max(token_diff, float(np.abs(per_token.logits - np.array(tokens_expected)).max()))
    return f"| bert | {numerics} | pooled max abs diff {pooled_diff:.2e}, min cosine {worst_cos:.7f} | " \
           f"per-token max abs diff {token_diff:.2e} |"


def t5_row(model, ref: dict, numerics: str) -> str:
    ctx = Context(model, ContextParams(n_ctx=512, numerics=numerics))
    assert ctx.encode(Batch.from_tokens(ref["enc_ids"])) == 0, ctx.last_error
    assert ctx.decode(Batch.from_tokens(ref["dec_ids"], all_outputs=True)) == 0, ctx.last_error
    top_diff, decisive, agree, flips = 0.0, 0, 0, []
    for pos, top in enumerate(ref["top"]):
        ids, values = [t[0] for t in top], np.array([t[1] for t in top])
        top_diff = max(top_diff, float(np.abs(ctx.logits[pos, ids] - values).max()))
        same = int(np.argmax(ctx.logits[pos])) == ids[0]
        if values[0] - values[1] >= MARGIN:
            decisive += 1
            agree += same
        elif not same:
            flips.append(f"{pos} (margin {values[0] - values[1]:.1e})")
    last = float(np.abs(ctx.logits[-1] - np.array(ref["last_logits"])).max())
    return f"| t5 | {numerics} | top-10 max abs diff {top_diff:.3f}, last position {last:.3f} | " \
           f"top-1 {agree}/{decisive} where margin >= {MARGIN}; flips elsewhere: {', '.join(flips) or 'none'} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", type=Path, default=Path(__file__).parents[1] / "tests/fixtures/tiny")
    args = parser.parse_args()
    print("| model | numerics | against llama.cpp | |\n|---|---|---|---|")
    for name, row in (("bert", bert_row), ("t5", t5_row)):
        model = load_model(args.fixtures / f"tiny-{name}.gguf")
        ref = json.loads((args.fixtures / f"tiny-{name}.json").read_text())
        for numerics in ("f32", "ggml"):
            print(row(model, ref, numerics), flush=True)


if __name__ == "__main__":
    main()
