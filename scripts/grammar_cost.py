"""What a grammar costs a generated token: `llm generate`'s loop with and without one, alternating.

    python scripts/grammar_cost.py [-m smollm2-135m] [-n 64] [-r 3]

Greedy generation of -n tokens from the same prompt, unconstrained, then under a permissive GBNF
grammar (letters, digits, punctuation and spaces: the mask is computed and applied every step but
seldom changes the arg-max) and under a JSON schema; -r rounds, each alternating the three. Prints
tokens/s (median) and each constrained run's cost against the unconstrained one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import llmsuite
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.generation import generate
from llmsuite.core.grammar import compile_grammar
from llmsuite.core.sampling import Sampler, SamplerParams

# the text as a rule of its own, as GBNF grammars write it: llguidance makes it one lexeme. Written
# as `root ::= [...]*` the repetition is a parser rule instead, and a mask then takes 2-6 ms
PERMISSIVE = "root ::= text\ntext ::= [a-zA-Z0-9 ,.;:'!?()\\n-]*"
SCHEMA = {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"},
                                                                     "age": {"type": "integer"}}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    args = ap.parse_args()
    model = llmsuite.load(args.model)
    prompt = model.vocab.tokenize("Once upon a time, in a land far away,", add_special=True)
    setups = {"none": None, "gbnf": compile_grammar(gbnf=PERMISSIVE),
              "json schema": compile_grammar(json_schema=json.dumps(SCHEMA))}
    speeds: dict[str, list[float]] = {name: [] for name in setups}
    sampling: dict[str, list[float]] = {name: [] for name in setups}
    eog = tuple((t, float("-inf")) for t in range(model.vocab.n_tokens) if model.vocab.is_eog(t))
    for _ in range(args.r + 1):  # the first round warms up and is dropped
        for name, grammar in setups.items():
            # unconstrained and permissive runs never end early; the schema's ends where its JSON does
            params = SamplerParams(temp=0.0, grammar=grammar, logit_bias=() if name == "json schema" else eog)
            sampler = Sampler(params, vocab=model.vocab)
            times: list[float] = []
            result = generate(Context(model, ContextParams(n_ctx=512)), sampler, prompt, args.n,
                              on_token=lambda seq, tok: times.append(time.perf_counter()))[0]
            speeds[name].append((len(times) - 1) / (times[-1] - times[0]))  # the steps after the first token
            sampling[name].append(result.t_sample / max(len(result.tokens), 1))
    for name in setups:
        speeds[name], sampling[name] = speeds[name][1:], sampling[name][1:]
    base = statistics.median(speeds["none"])
    print(f"{args.model}, {args.n} greedy tokens, median of {args.r}\n")
    print("| constraint | t/s | sampling ms/token | cost |")
    print("| --- | ---: | ---: | ---: |")
    for name in setups:
        speed = statistics.median(speeds[name])
        print(f"| {name} | {speed:.1f} | {statistics.median(sampling[name]) * 1e3:.2f} | {1 - speed / base:+.1%} |")


if __name__ == "__main__":
    main()
