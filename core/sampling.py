"""llama.cpp's default sampler chain: penalties → top-k → top-p → min-p → temperature → dist.

Candidates are (ids, logits) arrays narrowed step by step, in the array module of the logits, so on
a GPU the chain runs on the device and only the chosen token comes back. `--temp 0` picks the
arg-max of the penalised logits, which is what the chain reduces to. The uniform draw comes from
NumPy's PCG64 seeded with `seed`, so runs repeat exactly for a given seed (llama.cpp's mt19937
stream is not mimicked).
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass

import numpy as np

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp: "use a random seed"


@dataclass
class SamplerParams:
    seed: int = DEFAULT_SEED
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_keep: int = 1


class Sampler:
    def __init__(self, params: SamplerParams | None = None, ops=None):
        from .backend import get_backend

        self.params = params or SamplerParams()
        self.ops = ops or get_backend("cpu")  # argmax and the CDF draw run where the logits are
        seed = self.params.seed
        self.seed = secrets.randbits(32) if seed == DEFAULT_SEED or seed < 0 else seed
        self.rng = np.random.default_rng(self.seed)
        self.history: deque[int] = deque(maxlen=max(self.params.repeat_last_n, 0) or None)

    def accept(self, token: int) -> None:
        if self.params.repeat_last_n != 0:
            self.history.append(int(token))

    def describe(self) -> str:
        """The chain as llama.cpp prints it; disabled steps carry a leading '?'."""
        p = self.params
        steps = [("penalties", self._penalties_active()), ("top-k", p.top_k > 0), ("top-p", p.top_p < 1.0),
                 ("min-p", p.min_p > 0.0), ("temp-ext", True), ("dist", True)]
        return "logits -> " + " -> ".join(name if on else f"?{name}" for name, on in steps)

    def _penalties_active(self) -> bool:
        p = self.params
        return p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                         or p.presence_penalty != 0.0)

    def sample(self, logits) -> int:
        p, xp = self.params, self.ops.xp
        values = xp.asarray(logits, dtype=np.float32).copy()
        if self._penalties_active() and self.history:
            values = self._apply_penalties(values)
        if p.temp <= 0.0:
            return self.ops.argmax(values)
        ids, values = self._top_k(xp.arange(len(values)), values)
        ids, values = self._top_p(ids, values)
        ids, values = self._min_p(ids, values)
        probs = xp.exp((values - values.max()) / np.float32(p.temp))
        return self.ops.sample_cdf(probs, ids, float(self.rng.random()))

    def _apply_penalties(self, values):
        p, xp = self.params, self.ops.xp
        tokens, counts = np.unique(np.fromiter(self.history, dtype=np.int64), return_counts=True)
        tokens, counts = xp.asarray(tokens), xp.asarray(counts.astype(np.float32))
        hit = values[tokens]
        hit = xp.where(hit <= 0, hit * np.float32(p.repeat_penalty), hit / np.float32(p.repeat_penalty))
        values[tokens] = hit - (counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty))
        return values

    def _top_k(self, ids, values):
        xp, k = self.ops.xp, self.params.top_k
        if k <= 0 or k >= len(values):
            order = xp.argsort(-values, kind="stable")
        else:
            part = xp.argpartition(-values, k - 1)[:k]
            order = part[xp.argsort(-values[part], kind="stable")]
        return ids[order], values[order]

    def _top_p(self, ids, values):
        top_p, xp = self.params.top_p, self.ops.xp
        if top_p >= 1.0:
            return ids, values
        cum = xp.cumsum(_softmax(xp, values))
        reached = int(xp.searchsorted(cum, np.float32(top_p), side="left"))  # first index with cum >= p
        keep = max(min(reached + 1, len(values)), self.params.min_keep)
        return ids[:keep], values[:keep]

    def _min_p(self, ids, values):
        min_p, xp = self.params.min_p, self.ops.xp
        if min_p <= 0.0:
            return ids, values
        keep = values >= values.max() + np.float32(np.log(min_p))
        if int(keep.sum()) < self.params.min_keep:
            return ids[: self.params.min_keep], values[: self.params.min_keep]
        return ids[keep], values[keep]


def _softmax(xp, x):
    e = xp.exp(x - x.max())
    return e / e.sum()
