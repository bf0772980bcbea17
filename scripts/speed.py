"""Prompt-processing and generation speed of the engine (tokens/s), llama-bench style.

    python scripts/speed.py [-m smollm2-135m] [-p 512] [-n 128] [-r 3]

pp: one batch of p random tokens into an empty cache; tg: n single-token decodes after it.
Reports the mean and spread over -r repetitions (after one warm-up), on stdout.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model


def run_once(ctx: Context, rng, n_prompt: int, n_gen: int) -> tuple[float, float]:
    ctx.clear()
    n_vocab = ctx.model.hparams.n_vocab
    tokens = rng.integers(0, n_vocab, n_prompt)
    t0 = time.perf_counter()
    ctx.decode(Batch.from_tokens(tokens, pos0=0))
    t_pp = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n_gen):
        ctx.decode(Batch.from_tokens([int(rng.integers(n_vocab))], pos0=n_prompt + i))
    t_tg = time.perf_counter() - t0
    return n_prompt / t_pp, n_gen / t_tg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    model = load_model(resolve_model(args.model))
    ctx = Context(model, ContextParams(n_ctx=args.n_prompt + args.n_gen + 16))
    rng = np.random.default_rng(0)
    run_once(ctx, rng, min(args.n_prompt, 64), 4)  # warm-up
    pp, tg = zip(*(run_once(ctx, rng, args.n_prompt, args.n_gen) for _ in range(args.repetitions)))
    print(f"model {model.name} ({model.path.name})")
    print(f"pp{args.n_prompt}: {np.mean(pp):8.2f} ± {np.std(pp, ddof=1) if len(pp) > 1 else 0:.2f} t/s")
    print(f"tg{args.n_gen}: {np.mean(tg):8.2f} ± {np.std(tg, ddof=1) if len(tg) > 1 else 0:.2f} t/s")


if __name__ == "__main__":
    main()
