"""Memory footprint (nbytes) of every memory kind for a model at a context size.

    python scripts/memory_footprint.py [-m gemma3-270m] [-c 32768] [-ctk f32] [-np 1]

Only the cache arrays are counted; they are allocated lazily, so this costs no RAM. For a
latent-attention model (deepseek2) `unified`/`split` cache the naive per-head K and V
(--attn-impl naive), `mla` only the latent, `dsa` the latent and the indexer keys.
"""

from __future__ import annotations

import argparse

from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model

KINDS = [("unified", {}), ("split", {}), ("iswa", {}), ("iswa --swa-full", {"swa_full": True}), ("mla", {}),
         ("dsa", {}), ("none", {})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-c", "--ctx-size", type=int, default=32768)
    ap.add_argument("-ctk", "--cache-type", default="f32")
    ap.add_argument("-np", "--parallel", type=int, default=1)
    args = ap.parse_args()
    model = load_model(resolve_model(args.model))
    print(f"{model.name}, -c {args.ctx_size}, -np {args.parallel}, cache type {args.cache_type}")
    print(f"| {'--kv':<16} | {'MiB':>10} |\n| {'-' * 16} | {'-' * 10}:|")
    for label, extra in KINDS:
        params = ContextParams(n_ctx=args.ctx_size, n_seq_max=args.parallel, kv=label.split()[0],
                               type_k=args.cache_type, type_v=args.cache_type, **extra)
        try:
            nbytes = Context(model, params).memory.nbytes
            print(f"| {label:<16} | {nbytes / 2**20:>10.1f} |")
        except InvalidInputError as e:
            print(f"| {label:<16} | {'-':>10} | {e}")


if __name__ == "__main__":
    main()
