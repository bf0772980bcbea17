"""Where one decoded token's time goes: weights (matmuls, embedding rows), attention, the other
ops, and Python (the rest: graph, memory bookkeeping, dispatch). With --prompt N, where one
prompt ubatch of N tokens goes instead (the fastest of -n runs, at most 8, each on a fresh copy of
the depth).

    python scripts/decode_profile.py [-m smollm2-135m] [-d 0,4096] [-n 32] [-ctk f16] [--prompt 512]

Every backend op is wrapped in a timer; a category is the sum of its ops' wall time, and Python
is the token's wall time less all ops. The wrappers add about a microsecond per op, so read the
split, not the last digit. Prints one markdown row per depth.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.hub import resolve_model
from llmsuite.core.models import load_model

CATEGORIES = {"matmul": "weights", "get_rows": "weights", "flash_attn_ext": "attention"}
OTHER_OPS = ("rms_norm", "norm", "rope", "rope_cache", "gated_ffn", "swiglu", "geglu", "silu", "gelu", "add", "mul",
             "scale", "take_rows", "softmax")


def instrument(backend, spent: dict) -> None:
    for name in (*CATEGORIES, *OTHER_OPS):
        op = getattr(backend, name, None)
        if op is None:
            continue

        def timed(*args, _op=op, _cat=CATEGORIES.get(name, "other ops"), **kwargs):
            t0 = time.perf_counter()
            try:
                return _op(*args, **kwargs)
            finally:
                spent[_cat] += time.perf_counter() - t0
        setattr(backend, name, timed)


def profile(model, depth: int, n_tokens: int, cache_type: str) -> dict:
    ctx = Context(model, ContextParams(n_ctx=depth + n_tokens + 16, type_k=cache_type, type_v=cache_type))
    prompt = list(range(1000, 1000 + max(depth, 1)))
    for i in range(0, len(prompt), 512):
        assert ctx.decode(Batch.from_tokens(prompt[i:i + 512])) == 0, ctx.last_error
    for i in range(4):  # warm up (kernels, buffers)
        assert ctx.decode(Batch.from_tokens([500 + i])) == 0
    spent: dict = defaultdict(float)
    instrument(ctx.backend, spent)
    t0 = time.perf_counter()
    for i in range(n_tokens):
        assert ctx.decode(Batch.from_tokens([600 + i])) == 0
    total = (time.perf_counter() - t0) / n_tokens
    split = {cat: spent[cat] / n_tokens for cat in ("weights", "attention", "other ops")}
    split["python"] = total - sum(split.values())
    return {"total": total, **split}


def profile_prompt(model, depth: int, n_prompt: int, runs: int, cache_type: str) -> dict:
    ctx = Context(model, ContextParams(n_ctx=depth + n_prompt, n_batch=max(n_prompt, 512), n_ubatch=n_prompt,
                                       type_k=cache_type, type_v=cache_type))
    rng = np.random.default_rng(0)
    for i in range(0, depth, 512):
        assert ctx.decode(Batch.from_tokens(rng.integers(100, 20000, min(512, depth - i)))) == 0, ctx.last_error
    state = ctx.state_bytes()
    prompt = rng.integers(100, 20000, n_prompt)
    spent: dict = defaultdict(float)
    instrument(ctx.backend, spent)
    best = None
    for run in range(runs + 1):  # the first run warms up
        ctx.load_state_bytes(state)
        spent.clear()
        t0 = time.perf_counter()
        assert ctx.decode(Batch.from_tokens(prompt)) == 0, ctx.last_error
        total = time.perf_counter() - t0
        if run and (best is None or total < best["total"]):
            split = {cat: spent[cat] for cat in ("weights", "attention", "other ops")}
            best = {"total": total, **split, "python": total - sum(split.values())}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-d", "--depths", default="0,4096")
    ap.add_argument("-n", "--tokens", type=int, default=32)
    ap.add_argument("-ctk", "--cache-type", default="f16")
    ap.add_argument("--prompt", type=int, default=0, help="profile one prompt ubatch of this many tokens")
    args = ap.parse_args()
    model = load_model(resolve_model(args.model))
    if hasattr(model.backend, "prepare") and hasattr(model, "weight_types"):
        model.backend.prepare(model.weight_types, cache_types=(args.cache_type,))
    unit = f"ms/pp{args.prompt}" if args.prompt else "ms/token"
    print(f"| model | depth | cache | {unit} | weights | attention | other ops | python |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for depth in (int(d) for d in args.depths.split(",")):
        if args.prompt:
            r = profile_prompt(model, depth, args.prompt, min(args.tokens, 8), args.cache_type)
        else:
            r = profile(model, depth, args.tokens, args.cache_type)
        ms = {k: v * 1e3 for k, v in r.items()}
        print(f"| {args.model} | {depth} | {args.cache_type} | {ms['total']:.1f} | {ms['weights']:.1f} | "
              f"{ms['attention']:.1f} | {ms['other ops']:.1f} | {ms['python']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
