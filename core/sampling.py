"""llama.cpp's default sampler chain: penalties → top-k → top-p → min-p → temperature → dist.

Candidates are (ids, logits) arrays narrowed step by step. `--temp 0` picks the arg-max of the
penalised logits, which is what the chain reduces to. The random draw uses NumPy's PCG64 seeded
with `seed`, so runs repeat exactly for a given seed (llama.cpp's mt19937 stream is not mimicked).
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
    def __init__(self, params: SamplerParams | None = None):
        self.params = params or SamplerParams()
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

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        ids = np.arange(len(logits))
        values = logits.astype(np.float32, copy=True)
        if self._penalties_active() and self.history:
            values = self._apply_penalties(values)
        if p.temp <= 0.0:
            return int(np.argmax(values))
        ids, values = self._top_k(ids, values)
        ids, values = self._top_p(ids, values)
        ids, values = self._min_p(ids, values)
        probs = _softmax(values / np.float32(p.temp))
        choice = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        return int(ids[min(choice, len(ids) - 1)])

    def _apply_penalties(self, values: np.ndarray) -> np.ndarray:
        p = self.params
        tokens, counts = np.unique(np.fromiter(self.history, dtype=np.int64), return_counts=True)
        hit = values[tokens]
        hit = np.where(hit <= 0, hit * p.repeat_penalty, hit / p.repeat_penalty)
        hit -= counts * p.frequency_penalty + p.presence_penalty
        values[tokens] = hit
        return values

    def _top_k(self, ids, values):
        k = self.params.top_k
        if k <= 0 or k >= len(values):
            order = np.argsort(-values, kind="stable")
        else:
            part = np.argpartition(-values, k - 1)[:k]
            order = part[np.argsort(-values[part], kind="stable")]
        return ids[order], values[order]

    def _top_p(self, ids, values):
        top_p = self.params.top_p
        if top_p >= 1.0:
            return ids, values
        cum = np.cumsum(_softmax(values))
        reached = np.flatnonzero(cum >= top_p)
        keep = max(int(reached[0]) + 1 if len(reached) else len(values), self.params.min_keep)
        return ids[:keep], values[:keep]

    def _min_p(self, ids, values):
        min_p = self.params.min_p
        if min_p <= 0.0:
            return ids, values
        keep = values >= values.max() + np.log(min_p)
        if keep.sum() < self.params.min_keep:
            return ids[: self.params.min_keep], values[: self.params.min_keep]
        return ids[keep], values[keep]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
