"""Where a generation step of B sequences goes (llm batched-bench's TG phase): the layers' weights,
the output head, attention, the other ops and Python, per step and per token, for each B.

    python scripts/batched_profile.py [-m smollm2-135m] [-npl 1,4,16] [-npp 128] [-ntg 32] [-c 4096]
        [--kv unified,split] [-t 2]

Each B runs as batched-bench runs it: a context of -c cells with room for the largest B (a stream
per sequence under split), B prompts of -npp tokens, then -ntg steps of one token per sequence in
one batch; the steps are timed with every backend op wrapped in a timer (about a microsecond per
op: read the split, not the last digit). Python is the step's wall time less all ops. Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from llmsuite.core import batched_bench as bb
from llmsuite.core.bench import loader
from llmsuite.core.hub import resolve_model

OTHER_OPS = ("rms_norm", "norm", "rope", "gated_ffn", "swiglu", "geglu", "add", "mul", "scale", "get_rows")
PARTS = ("weights", "head", "attention", "other ops", "python")


def instrument(backend, head, spent: dict) -> None:
    """Time every op of interest into `spent`; a matmul with the output head counts as "head"."""
    def wrap(name, category):
        op = getattr(backend, name, None)
        if op is None:
            return

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return op(*args, **kwargs)
            finally:
                cat = "head" if name == "matmul" and len(args) > 1 and args[1] is head else category
                spent[cat] += time.perf_counter() - t0
        setattr(backend, name, timed)

    wrap("matmul", "weights")
    wrap("flash_attn_ext", "attention")
    for name in OTHER_OPS:
        wrap(name, "other ops")


def profile(runner: bb.Runner, setup: bb.Setup, case: bb.Case) -> dict:
    ctx = runner.context(setup)
    runner._warmup(ctx)
    ctx.clear()
    runner._decode(ctx, runner._prompt_batch(ctx, case.pp, case.pl))
    steps = list(runner._steps(ctx, case))
    runner._decode(ctx, steps[0])  # the first step's buffers, outside the timer
    spent: dict = defaultdict(float)
    instrument(ctx.backend, ctx.model.output, spent)
    t0 = time.perf_counter()
    for batch in steps[1:]:
        runner._decode(ctx, batch)
    n = len(steps) - 1
    total = (time.perf_counter() - t0) / n
    split = {part: spent[part] / n for part in PARTS[:-1]}
    split["python"] = total - sum(split.values())
    return {"kv": ctx.plan.memory, "step": total, **split}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-npl", default="1,4,16")
    ap.add_argument("-npp", type=int, default=128)
    ap.add_argument("-ntg", type=int, default=32)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--kv", default="unified,split")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    pls = [int(b) for b in args.npl.split(",")]
    path = resolve_model(args.model)
    runner = bb.Runner(loader({args.model: path}), bb.Options(n_ctx=args.ctx, n_threads=args.threads), max(pls))
    print(f"{path.name}, -npp {args.npp}, {args.ntg - 1} timed steps, -c {args.ctx}, -t {args.threads}; "
          "ms per step (share of the step)\n")
    print("| kv | B | step ms | t/s | " + " | ".join(PARTS) + " |")
    print("| --- | ---: | ---: | ---: |" + " ---: |" * len(PARTS))
    for kv in args.kv.split(","):
        for pl in pls:
            row = profile(runner, bb.Setup(args.model, kv=kv), bb.Case(args.npp, args.ntg, pl))
            cells = " | ".join(f"{row[p] * 1e3:.2f} ({row[p] / row['step']:.0%})" for p in PARTS)
            print(f"| {row['kv']} | {pl} | {row['step'] * 1e3:.1f} | {pl / row['step']:.1f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
