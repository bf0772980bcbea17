"""Dense against block top-k attention at depth, on real text and one prefilled state: the depth is
decoded once, saved, and restored before every measurement, so each K sees the same cache.

    python scripts/sparse_speed.py -m smollm2-135m -f tests/fixtures/hamlet.md -d 8192 -k 0,1024 -r 2

For each depth and K it times tg N (one token per step, greedy continuation) and pp P (the next
P tokens of the text in one batch), and prints ms per token, t/s and the speedup against K = 0
(dense) as a markdown table. With -v it adds the attention split of the last tg run (the same
per-layer statistics `llm generate -v` prints). Repetitions alternate the K values, so a drift in
the machine's speed touches each the same way. The prefilled states are kept in
~/.cache/llmsuite/sparse_speed for the next run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.graph import AttnStats
from llmsuite.core.hub import resolve_model
from llmsuite.core.memory.masks import SparseParams
from llmsuite.core.models import load_model

STATE_DIR = Path.home() / ".cache" / "llmsuite" / "sparse_speed"


def timed_tg(ctx: Context, n: int, first: int) -> float:
    token, t0 = first, time.perf_counter()
    for _ in range(n):
        assert ctx.decode(Batch.from_tokens([token])) == 0, ctx.last_error
        token = int(np.argmax(ctx.get_logits(-1)))
    return (time.perf_counter() - t0) / n


def timed_pp(ctx: Context, tokens: list[int]) -> float:
    t0 = time.perf_counter()
    assert ctx.decode(Batch.from_tokens(tokens)) == 0, ctx.last_error
    return (time.perf_counter() - t0) / len(tokens)


def prefilled_state(model, params: ContextParams, tokens: list[int], text: str, name: str) -> bytes:
    """The state after decoding `tokens`, kept on disk between runs (prefilling 8192 tokens takes
    a minute or two here)."""
    path = STATE_DIR / f"{name}-{text}-{len(tokens)}-{params.n_ctx}-{params.type_k}.state"
    if path.exists():
        return path.read_bytes()
    ctx = Context(model, params)
    for i in range(0, len(tokens), params.n_batch):
        assert ctx.decode(Batch.from_tokens(tokens[i:i + params.n_batch])) == 0, ctx.last_error
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ctx.state_bytes())
    return path.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-f", "--file", default="tests/fixtures/hamlet.md")
    ap.add_argument("-d", "--depths", default="8192")
    ap.add_argument("-k", "--topk", default="0,1024")
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    ap.add_argument("--attn", default="sparse", help="--attn for K > 0 (auto shows what auto picks)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--local", type=int, default=-1, help="-1: min(128, K)")
    ap.add_argument("--layers", default="2-")
    ap.add_argument("-ctk", "--cache-type", default="f16")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--plot", type=Path, help="save the speedup of each K against depth as a PNG (needs matplotlib)")
    a = ap.parse_args()
    model = load_model(resolve_model(a.model))
    text = open(a.file, encoding="utf-8").read()
    tokens = model.vocab.tokenize(text)
    topks = [int(k) for k in a.topk.split(",")]
    print(f"{a.model}, {a.file}, cache {a.cache_type}, block {a.block}, local {a.local}, layers {a.layers}, "
          f"--attn {a.attn} for K > 0, best of {a.repetitions}\n")
    print(f"| depth | K | tg{a.n_gen} ms/t | tg t/s | speedup | pp{a.n_prompt} t/s | speedup |")
    print("| --: | --: | --: | --: | --: | --: | --: |")
    speedups = []
    for depth in (int(d) for d in a.depths.split(",")):
        need = depth + max(a.n_gen, a.n_prompt) + 1
        if len(tokens) < need:
            raise SystemExit(f"{a.file} has {len(tokens)} tokens, fewer than the {need} depth {depth} needs")
        base = ContextParams(n_ctx=depth + max(a.n_gen, a.n_prompt) + 16, n_batch=a.n_prompt, n_ubatch=a.n_prompt,
                             type_k=a.cache_type, type_v=a.cache_type, attn="dense")
        state = prefilled_state(model, base, tokens[:depth], Path(a.file).stem, a.model)
        ctxs = {k: Context(model, replace(base, attn=a.attn if k else "dense",
                                          sparse=SparseParams(k, a.block, a.local, a.layers))) for k in topks}
        best = {k: [np.inf, np.inf] for k in topks}
        stats = {}
        for _ in range(a.repetitions):
            for k, c in ctxs.items():
                c.load_state_bytes(state)
                c.attn_stats = stats[k] = AttnStats() if a.verbose else None
                best[k][0] = min(best[k][0], timed_tg(c, a.n_gen, tokens[depth]))
                c.load_state_bytes(state)
                c.attn_stats = None
                best[k][1] = min(best[k][1], timed_pp(c, tokens[depth:depth + a.n_prompt]))
        dense_tg, dense_pp = best[topks[0]]
        for k in topks:
            tg, pp = best[k]
            speedups.append((depth, k, dense_tg / tg, dense_pp / pp))
            print(f"| {depth} | {k or 'dense'} | {1e3 * tg:.1f} | {1 / tg:.2f} | {dense_tg / tg:.2f}× | "
                  f"{1 / pp:.1f} | {dense_pp / pp:.2f}× |", flush=True)
        if a.verbose:
            for k in topks:
                print(f"\nK={k}, tg{a.n_gen} of the last repetition (timed with the statistics on):")
                print("\n".join(stats[k].lines()))
    if a.plot:
        plot(speedups, topks[1:], a)


def plot(speedups: list[tuple], topks: list[int], a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for k in topks:
        rows = [r for r in speedups if r[1] == k]
        ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="o", label=f"tg{a.n_gen}, K={k}")
        ax.plot([r[0] for r in rows], [r[3] for r in rows], marker="s", linestyle="--", label=f"pp{a.n_prompt}, K={k}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("depth (cells already in the cache)")
    ax.set_ylabel("speedup against dense")
    ax.set_title(f"{a.model}, block top-k, CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
