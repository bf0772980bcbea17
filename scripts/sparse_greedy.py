"""Block top-k against dense after a long prefix: each fixture prompt follows the same prefix of a
text, and for every K it prints the first token's KLD against dense, whether that token's argmax
changed (with dense's top-1 margin) and how many of the first N greedy tokens match dense.

    python scripts/sparse_greedy.py -m gemma3-270m --prefix 2048 -k 1024 --kv unified

The prefix is decoded once and restored before every run, so each K sees the same cache.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.hub import resolve_model
from llmsuite.core.memory.masks import SparseParams
from llmsuite.core.models import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def run(ctx: Context, state: bytes, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """The first token's logits and the greedy tokens after the restored prefix."""
    ctx.load_state_bytes(state)
    assert ctx.decode(Batch.from_tokens(prompt)) == 0, ctx.last_error
    first, tokens = ctx.get_logits(-1).copy(), []
    for _ in range(steps):
        tokens.append(int(np.argmax(ctx.get_logits(-1))))
        assert ctx.decode(Batch.from_tokens([tokens[-1]])) == 0, ctx.last_error
    return first, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-f", "--file", default=str(FIXTURES / "hamlet.md"))
    ap.add_argument("--prefix", type=int, default=2048, help="tokens of the text before each prompt")
    ap.add_argument("-k", "--topk", default="1024")
    ap.add_argument("-n", "--steps", type=int, default=16)
    ap.add_argument("--kv", default="unified")
    a = ap.parse_args()
    model = load_model(resolve_model(a.model))
    cases = json.loads((FIXTURES / "real" / f"{a.model}.greedy.json").read_text())["cases"]
    prefix = model.vocab.tokenize(Path(a.file).read_text(encoding="utf-8"))[:a.prefix]
    base = ContextParams(n_ctx=a.prefix + 64 + a.steps, n_batch=512, n_ubatch=512, kv=a.kv, attn="sparse")
    ctx = Context(model, base)
    for i in range(0, len(prefix), 512):
        assert ctx.decode(Batch.from_tokens(prefix[i:i + 512])) == 0, ctx.last_error
    state = ctx.state_bytes()
    prompts = [case["prompt_ids"][1:] for case in cases]  # the prefix already starts with BOS
    dense = [run(ctx, state, p, a.steps) for p in prompts]
    print(f"{a.model}, --kv {a.kv}, {a.prefix} tokens of {Path(a.file).name} before each prompt\n")
    print(f"| K | prompt | first-token KLD | first token | dense margin | equal of {a.steps} greedy |")
    print("| --: | --- | --: | --- | --: | --: |")
    for k in (int(v) for v in a.topk.split(",")):
        sparse_ctx = Context(model, replace(base, sparse=SparseParams(k)))
        for case, p, (d_first, d_tokens) in zip(cases, prompts, dense):
            s_first, s_tokens = run(sparse_ctx, state, p, a.steps)
            pd, ps = log_softmax(d_first), log_softmax(s_first)
            kld = float((np.exp(pd) * (pd - ps)).sum())
            top2 = np.sort(d_first)[-2:]
            same = "same" if np.argmax(d_first) == np.argmax(s_first) else "changed"
            equal = next((i for i, (x, y) in enumerate(zip(d_tokens, s_tokens)) if x != y), a.steps)
            print(f"| {k} | {case['prompt'][:32]!r} | {kld:.4f} | {same} | {top2[1] - top2[0]:.2f} | {equal} |")


if __name__ == "__main__":
    main()
