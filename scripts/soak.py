"""A long multi-sequence run that would show a leak: RSS, open files and threads, sampled as it goes.

    python scripts/soak.py -m smollm2-135m -np 8 -c 4096 --churn 8192

Eight sequences (-np) sample tokens side by side in one batch per step until the context (-c) is
full; then the run churns as conversations do, for --churn more tokens: when a decode finds no
room, the longest sequence is rewound to half its length (`seq_rm`), and every third time it is
replaced by a copy of a shorter one instead (`seq_cp`, a fork) or started over. A recurrent memory
cannot drop a tail: there every churn forks or starts over, and a sequence counts as full at
-c / -np positions.

Prints one JSON document: the figures after the first 256 tokens and at the end, the peak RSS,
and a sample every 512 tokens. tests/test_soak.py runs it (marked slow) and holds it to: peak RSS
at the end within 5 % of the RSS after 256 tokens; no more open files or threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from llmsuite.core import hub
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams, DecodeStatus, check_status
from llmsuite.core.models import load_model
from llmsuite.core.sampling import Sampler, SamplerParams


def process_figures() -> dict:
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return dict(rss_mib=int(status["VmRSS"].split()[0]) / 1024, peak_mib=int(status["VmHWM"].split()[0]) / 1024,
                threads=int(status["Threads"]), open_files=len(os.listdir("/proc/self/fd")))


class Soak:
    def __init__(self, ctx: Context, n_seq: int, seed: int):
        self.ctx, self.n_seq = ctx, n_seq
        # a recurrent memory has no cells to run out of: its sequences count as full at n_ctx / n_seq,
        # so that the tokens in flight are the context's, as with a cache the sequences share
        self.max_pos = ctx.n_ctx // n_seq if ctx.memory.kind == "recurrent" else ctx.seq_capacity()
        self.samplers = [Sampler(SamplerParams(seed=seed + s, temp=0.8), ctx.backend) for s in range(n_seq)]
        self.pos = [0] * n_seq  # the next position of each sequence
        self.logits: list[np.ndarray | None] = [None] * n_seq
        self.prompt: list[int] = []
        self.rewinds = self.forks = self.restarts = 0

    def start(self, prompt: list[int]) -> None:
        """Each sequence gets the prompt with a different last token, in one batch."""
        self.prompt = prompt
        self._prefill(list(range(self.n_seq)))

    def _prefill(self, seqs: list[int]) -> None:
        n = len(self.prompt)
        tokens = np.array([self.prompt[:-1] + [self.prompt[-1] + s] for s in seqs], np.int32)
        batch = Batch(tokens.reshape(-1), pos=np.tile(np.arange(n, dtype=np.int32), len(seqs)),
                      seq_id=np.repeat(np.array(seqs, np.int32), n), output=np.tile(np.arange(n) == n - 1, len(seqs)))
        check_status(self.ctx, self.ctx.decode(batch))
        for i, s in enumerate(seqs):
            self.pos[s] = n
            self.logits[s] = self.ctx.get_logits(i * n + n - 1)

    def step(self) -> bool:
        """One sampled token per sequence, decoded in one batch; False when there was no room."""
        if self.max_pos is not None and max(self.pos) >= self.max_pos:
            return False
        tokens = [sampler.sample(logits) for sampler, logits in zip(self.samplers, self.logits)]
        batch = Batch(np.array(tokens, np.int32), pos=np.array(self.pos, np.int32),
                      seq_id=np.arange(self.n_seq, dtype=np.int32), output=np.ones(self.n_seq, bool))
        status = self.ctx.decode(batch)
        if status == DecodeStatus.NO_SLOT:
            return False
        check_status(self.ctx, status)
        for s, tok in enumerate(tokens):
            self.samplers[s].accept(tok)
        self.pos = [p + 1 for p in self.pos]
        self.logits = [self.ctx.get_logits(s) for s in range(self.n_seq)]
        return True

    def churn(self) -> None:
        """Make room as conversations do: rewind the longest sequence to half its length; every
        third time (or where the memory cannot drop a tail) fork it from a shorter one instead, or
        start it over when none is shorter."""
        memory = self.ctx.memory
        longest = max(range(self.n_seq), key=lambda s: self.pos[s])
        other = min((s for s in range(self.n_seq) if s != longest), key=lambda s: self.pos[s])
        turn = self.rewinds + self.forks + self.restarts
        if turn % 3 != 2 and memory.seq_rm(longest, self.pos[longest] // 2, -1):
            self.pos[longest] //= 2
            self.logits[longest] = self.logits[other]  # it samples on from a neighbour's logits
            self.rewinds += 1
            return
        memory.seq_rm(longest, -1, -1)
        if self.pos[other] < self.pos[longest]:
            memory.seq_cp(other, longest, -1, -1)
            self.pos[longest], self.logits[longest] = self.pos[other], self.logits[other]
            self.forks += 1
        else:
            self._prefill([longest])
            self.restarts += 1


def run(model: str, n_seq: int, n_ctx: int, churn_tokens: int, seed: int) -> dict:
    lm = load_model(model if os.path.exists(model) else hub.resolve_model(model))
    ctx = Context(lm, ContextParams(n_ctx=n_ctx, n_seq_max=n_seq, n_batch=max(512, n_seq), n_ubatch=512))
    soak = Soak(ctx, n_seq, seed)
    soak.start(lm.vocab.tokenize("Once upon a time, in a house by the sea,", add_special=True))
    generated, samples, t0 = 0, [], time.perf_counter()
    first = filled = None
    while filled is None or generated < filled + churn_tokens:
        if not soak.step():
            filled = generated if filled is None else filled
            soak.churn()
            continue
        generated += n_seq
        if first is None and generated >= 256:
            first = process_figures()
        if generated % 512 < n_seq:
            samples.append(dict(tokens=generated, **process_figures()))
    end = process_figures()
    return dict(model=lm.name, memory=ctx.memory.kind, n_seq=n_seq, n_ctx=n_ctx, tokens=generated,
                tokens_to_fill=filled, rewinds=soak.rewinds, forks=soak.forks, restarts=soak.restarts,
                seconds=round(time.perf_counter() - t0, 1), after_256=first, end=end,
                peak_growth_pct=round(100 * (end["peak_mib"] / first["rss_mib"] - 1), 2), samples=samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("-np", "--parallel", type=int, default=8)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("--churn", type=int, default=8192, help="tokens to generate after the context is full")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.model, args.parallel, args.ctx_size, args.churn, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
