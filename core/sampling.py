"""llama.cpp's sampler chain: logit bias → penalties → top-k → top-p → min-p → temperature → dist,
in the order `--samplers` gives.

Candidates are (ids, logits) arrays narrowed step by step, in the array module of the logits, so on
a GPU the chain runs on the device and only the chosen token comes back. `--temp 0` picks the
arg-max of the biased, penalised logits. The uniform draw comes from NumPy's PCG64 seeded with
`seed`, so runs repeat exactly for a given seed (llama.cpp's mt19937 stream is not mimicked).

Each name `--samplers` takes is a function in SAMPLERS, `step(sampler, ids, logits) -> (ids, logits)`,
registered with `@sampler_step`; a plugin adds its own the same way.
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from .plugins import from_plugin, register

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp: "use a random seed"
CHAIN = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")  # llama.cpp's
# the steps that may move the most likely token (top-k, top-p, min-p, top-n-sigma always keep it):
# at --temp 0 only these run before the arg-max, as llama.cpp's chain would leave it
ARGMAX_CHANGING = frozenset({"penalties", "dry", "typ_p", "xtc"})
DRY_BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp's default sequence breakers
DRY_MAX_BREAKER_CHARS, DRY_MAX_TAIL_TOKENS = 40, 20  # llama.cpp's bounds on a breaker
ALIASES = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "min-p": "min_p", "temp": "temperature",
           "typical": "typ_p", "typical-p": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "top-n-sigma": "top_n_sigma"}


SAMPLERS: dict[str, Callable] = {}  # name -> step(sampler, ids, logits) -> (ids, logits)


def sampler_step(name: str):
    """Register the decorated `step(sampler, ids, logits) -> (ids, logits)` as `--samplers` NAME: it
    narrows or reweights the candidates (`ids` and their `logits`, arrays of the logits' array
    module); `sampler` gives its params, rng and history."""
    def add(step):
        register("sampler", name, SAMPLERS, step)
        return step
    return add


def sampler_names() -> tuple[str, ...]:
    """Every name --samplers takes now: llama.cpp's and plugins'."""
    return tuple(SAMPLERS)


def parse_samplers(spec: str) -> tuple[str, ...]:
    """--samplers 'penalties;top_k;top_p;min_p;temperature' (llama.cpp's names and separators)."""
    from .errors import InvalidInputError

    names = [ALIASES.get(n.strip().lower(), n.strip().lower()) for n in spec.replace(",", ";").split(";") if n.strip()]
    unknown = [n for n in names if n not in sampler_names()]
    if unknown:
        raise InvalidInputError(f"--samplers: unknown sampler '{unknown[0]}' (known: {', '.join(sampler_names())})")
    return tuple(names)


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
    typ_p: float = 1.0  # locally typical sampling (1.0: off)
    top_n_sigma: float = -1.0  # keep logits within n standard deviations of the largest (<= 0: off)
    xtc_probability: float = 0.0  # exclude top choices: how often (0.0: off)
    xtc_threshold: float = 0.1  # ... and above which probability (> 0.5: off)
    dynatemp_range: float = 0.0  # dynamic temperature: temp ± range by the candidates' entropy (0.0: off)
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0  # DRY: penalize tokens that extend a repetition (0.0: off)
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # tokens scanned (-1: all of them; 0: off)
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    mirostat: int = 0  # 1 or 2: Mirostat (v1, v2) in place of the chain, after the temperature
    mirostat_tau: float = 5.0  # its target surprise (bits)
    mirostat_eta: float = 0.1  # its learning rate
    grammar: object = None  # a core.grammar.Grammar: only tokens that keep the text in it are sampled
    chain: tuple[str, ...] = CHAIN
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) pairs; --ignore-eos puts -inf on EOG


class Sampler:
    def __init__(self, params: SamplerParams | None = None, ops=None, vocab=None):
        """`vocab`: the model's vocabulary, which a grammar needs to know the tokens' text."""
        from .backend import get_backend

        self.params = params or SamplerParams()
        if self.params.grammar is not None and vocab is None:
            raise ValueError("a sampler with a grammar needs the model's vocabulary")
        self.matcher = self.params.grammar.matcher(vocab) if self.params.grammar is not None else None
        self.ops = ops or get_backend("cpu")  # argmax and the CDF draw run where the logits are
        seed = self.params.seed
        self.seed = secrets.randbits(32) if seed == DEFAULT_SEED or seed < 0 else seed
        self.rng = np.random.default_rng(self.seed)
        self.history: deque[int] = deque(maxlen=max(self.params.repeat_last_n, 0) or None)
        self.mu = 2.0 * self.params.mirostat_tau  # Mirostat's running surprise bound
        self.dry = _Dry(self.params, vocab) if _dry_active(self.params) else None

    def accept(self, token: int) -> None:
        if self.params.repeat_last_n != 0:
            self.history.append(int(token))
        if self.dry is not None:
            self.dry.tokens.append(int(token))

    def describe(self) -> str:
        """The chain as llama.cpp prints it; disabled steps carry a leading '?'."""
        p = self.params
        active = {"penalties": self._penalties_active(), "top_k": p.top_k > 0, "top_p": p.top_p < 1.0,
                  "min_p": p.min_p > 0.0, "temperature": True, "typ_p": p.typ_p < 1.0,
                  "top_n_sigma": p.top_n_sigma > 0.0, "xtc": p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5,
                  "dry": self.dry is not None}
        shown = {"top_k": "top-k", "top_p": "top-p", "min_p": "min-p", "temperature": "temp-ext",
                 "typ_p": "typical", "top_n_sigma": "top-n-sigma"}
        if p.mirostat:
            steps = ([("logit-bias", True)] if p.logit_bias else []) + ([("grammar", True)] if p.grammar else []) + \
                [("temp", True), ("mirostat" if p.mirostat == 1 else "mirostat-v2", True)]
            return "logits -> " + " -> ".join(name for name, _ in steps)
        steps = ([("logit-bias", True)] if p.logit_bias else []) + ([("grammar", True)] if p.grammar else []) + \
            [(shown.get(name, name), active.get(name, True)) for name in p.chain] + [("dist", True)]
        return "logits -> " + " -> ".join(name if on else f"?{name}" for name, on in steps)

    def _penalties_active(self) -> bool:
        p = self.params
        return p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                         or p.presence_penalty != 0.0)

    def sample(self, logits) -> int:
        """The next token: logit bias, the grammar's mask, then the chain (or Mirostat) and the draw;
        a grammar then takes the token."""
        p, xp = self.params, self.ops.xp
        values = xp.asarray(logits, dtype=np.float32).copy()
        for token, bias in p.logit_bias:
            values[token] += np.float32(bias)
        if self.matcher is not None:
            allowed = np.zeros(len(values), bool)
            allowed[:self.matcher.n_tokens] = self.matcher.allowed()[:len(values)]
            values[~xp.asarray(allowed)] = -np.inf
        token = self._choose(values)
        if self.matcher is not None:
            self.matcher.consume(token)
        return token

    def reset_grammar(self) -> None:
        """Start the grammar over (a new answer in a conversation)."""
        if self.matcher is not None:
            self.matcher.reset()

    def _choose(self, values) -> int:
        p, xp = self.params, self.ops.xp
        ids = xp.arange(len(values))
        if p.temp <= 0.0:  # greedy: the steps that can change the arg-max only (the others keep it)
            for name in p.chain:
                if name in ARGMAX_CHANGING or from_plugin("sampler", name):
                    ids, values = self._step(name, ids, values)
            return int(ids[self.ops.argmax(values)])
        if p.mirostat:
            return self._mirostat(ids, values / np.float32(p.temp))
        for name in p.chain:
            ids, values = self._step(name, ids, values)
        probs = xp.exp(values - values.max())
        return self.ops.sample_cdf(probs, ids, float(self.rng.random()))

    def _mirostat(self, ids, values) -> int:
        """Mirostat in place of the chain (llama.cpp's, after the temperature): v1 keeps the top k
        tokens, k from the Zipf exponent estimated over the 100 most likely and the bound mu; v2 the
        tokens whose surprise (-log2 p) is at most mu. One is drawn, and mu moves by the learning
        rate times how far its surprise was from the target."""
        p, xp = self.params, self.ops.xp
        order = xp.argsort(-values, kind="stable")
        ids, values = ids[order], values[order]
        probs = _softmax(xp, values)
        if p.mirostat == 1:
            m = min(100 - 1, len(probs) - 1)
            t = np.log(np.arange(2, m + 2) / np.arange(1, m + 1))
            b = np.log(np.asarray(probs[:m], np.float64) / np.asarray(probs[1:m + 1], np.float64))
            s_hat = float((t * b).sum() / (t * t).sum())
            eps = s_hat - 1
            with np.errstate(all="ignore"):
                base = np.float64(eps * 2 ** self.mu) / (1 - np.float64(len(values)) ** -eps)
                k = base ** (1 / s_hat) if base > 0 else np.nan
            keep = max(int(k), 1) if np.isfinite(k) else 1  # as llama.cpp's int(NaN): the top token
        else:
            surprise = -np.log2(np.maximum(np.asarray(probs, np.float64), 1e-300))
            keep = max(int(np.argmax(surprise > self.mu)) if (surprise > self.mu).any() else len(values), 1)
        ids, probs = ids[:keep], _softmax(xp, values[:keep])
        token = self.ops.sample_cdf(probs, ids, float(self.rng.random()))
        chosen = float(probs[int(xp.flatnonzero(ids == token)[0])])
        self.mu -= p.mirostat_eta * (-np.log2(chosen) - p.mirostat_tau)
        return token

    def _step(self, name: str, ids, values):
        if not from_plugin("sampler", name):
            return SAMPLERS[name](self, ids, values)
        from .errors import LLMError
        from .plugins import describe

        try:
            ids, values = SAMPLERS[name](self, ids, values)
        except Exception as e:
            raise LLMError(f"{describe('sampler', name)} failed: {type(e).__name__}: {e}") from e
        if len(ids) != len(values) or len(ids) == 0:
            raise LLMError(f"{describe('sampler', name)} returned {len(ids)} ids for {len(values)} logits; "
                           "it must keep at least one candidate, one logit per id")
        return ids, values

    @sampler_step("penalties")
    def _penalties(self, ids, values):
        """llama.cpp's penalties on the candidates: repeat (scaling), frequency and presence
        (subtracted), by how often each token appears in the last repeat_last_n."""
        if not (self._penalties_active() and self.history):
            return ids, values
        p, xp = self.params, self.ops.xp
        tokens, counts = np.unique(np.fromiter(self.history, dtype=np.int64), return_counts=True)
        seen = np.zeros(max(int(tokens.max()), int(ids.max())) + 1, dtype=np.float32)
        seen[tokens] = counts
        count = xp.asarray(seen)[ids]
        hit = count > 0
        scaled = xp.where(values <= 0, values * np.float32(p.repeat_penalty), values / np.float32(p.repeat_penalty))
        values = xp.where(hit, scaled, values) - (count * np.float32(p.frequency_penalty)
                                                  + hit * np.float32(p.presence_penalty))
        return ids, values.astype(np.float32)

    @sampler_step("temperature")
    def _temperature(self, ids, values):
        """llama.cpp's temp-ext: values / temp, or with --dynatemp-range the temperature moved within
        temp ± range by the candidates' entropy over its largest possible value, to --dynatemp-exp."""
        p, xp = self.params, self.ops.xp
        temp = p.temp
        if p.dynatemp_range > 0 and len(values) > 1:
            probs = _softmax(xp, values)
            entropy = -float(xp.sum(xp.where(probs > 0, probs * xp.log(xp.maximum(probs, 1e-38)), 0)))
            low, high = max(0.0, temp - p.dynatemp_range), temp + p.dynatemp_range
            temp = low + (high - low) * (entropy / np.log(len(values))) ** p.dynatemp_exponent
            if temp <= 0:  # llama.cpp's temperature 0: the largest logit alone
                best = int(self.ops.argmax(values))
                return ids[best:best + 1], values[best:best + 1]
        return ids, values / np.float32(temp)

    @sampler_step("dry")
    def _dry(self, ids, values):
        """DRY: a token that would extend a sequence already seen (after at least dry_allowed_length
        tokens of it) loses dry_multiplier · dry_base^(length - dry_allowed_length) of its logit;
        the repetition is cut at the last sequence breaker."""
        if self.dry is None:
            return ids, values
        penalties = self.dry.penalties()
        if not penalties:
            return ids, values
        xp = self.ops.xp
        tokens = np.fromiter(penalties, dtype=np.int64)
        amounts = np.fromiter(penalties.values(), dtype=np.float32)
        full = np.zeros(max(int(tokens.max()), int(ids.max())) + 1, dtype=np.float32)
        full[tokens] = amounts
        return ids, (values - xp.asarray(full)[ids]).astype(np.float32)

    @sampler_step("typ_p")
    def _typical(self, ids, values):
        """Locally typical sampling: the candidates whose surprise (-log p) is nearest the entropy,
        nearest first, until their probabilities add up to more than typ_p."""
        p, xp = self.params, self.ops.xp
        if p.typ_p >= 1.0:
            return ids, values
        probs = _softmax(xp, values)
        logp = xp.log(xp.maximum(probs, 1e-38))
        entropy = -xp.sum(probs * logp)
        order = xp.argsort(xp.abs(-logp - entropy), kind="stable")
        cum = xp.cumsum(probs[order])
        over = int(xp.searchsorted(cum, np.float32(p.typ_p), side="right"))  # first index with cum > typ_p
        keep = min(max(over + 1, p.min_keep), len(values))
        return ids[order[:keep]], values[order[:keep]]

    @sampler_step("top_n_sigma")
    def _top_n_sigma(self, ids, values):
        """The logits within n standard deviations (of the finite logits) of the largest."""
        n, xp = self.params.top_n_sigma, self.ops.xp
        if n <= 0 or len(values) <= 1:
            return ids, values
        finite = values[xp.isfinite(values)]
        keep = values >= finite.max() - np.float32(n) * finite.std()
        return ids[keep], values[keep]

    @sampler_step("xtc")
    def _xtc(self, ids, values):
        """Exclude top choices: with probability xtc_probability, drop every candidate at or above
        xtc_threshold but the least likely of them (none when only one reaches it)."""
        p, xp = self.params, self.ops.xp
        if p.xtc_probability <= 0 or p.xtc_threshold > 0.5 or len(values) < 2:
            return ids, values
        if float(self.rng.random()) > p.xtc_probability:
            return ids, values
        order = xp.argsort(-values, kind="stable")
        ids, values = ids[order], values[order]
        above = int(xp.sum(_softmax(xp, values) >= np.float32(p.xtc_threshold)))  # sorted: a prefix
        drop = above - 1
        if drop > 0 and len(values) - drop >= p.min_keep:
            return ids[drop:], values[drop:]
        return ids, values

    @sampler_step("top_k")
    def _top_k(self, ids, values):
        xp, k = self.ops.xp, self.params.top_k
        if k <= 0 or k >= len(values):
            order = xp.argsort(-values, kind="stable")
        else:
            part = xp.argpartition(-values, k - 1)[:k]
            order = part[xp.argsort(-values[part], kind="stable")]
        return ids[order], values[order]

    @sampler_step("top_p")
    def _top_p(self, ids, values):
        top_p, xp = self.params.top_p, self.ops.xp
        if top_p >= 1.0:
            return ids, values
        if len(values) > 1 and not bool((values[:-1] >= values[1:]).all()):  # top-k has not sorted them
            order = xp.argsort(-values, kind="stable")
            ids, values = ids[order], values[order]
        cum = xp.cumsum(_softmax(xp, values))
        reached = int(xp.searchsorted(cum, np.float32(top_p), side="left"))  # first index with cum >= p
        keep = max(min(reached + 1, len(values)), self.params.min_keep)
        return ids[:keep], values[:keep]

    @sampler_step("min_p")
    def _min_p(self, ids, values):
        min_p = self.params.min_p
        if min_p <= 0.0:
            return ids, values
        keep = values >= values.max() + np.float32(np.log(min_p))
        if int(keep.sum()) < self.params.min_keep:
            return ids[: self.params.min_keep], values[: self.params.min_keep]
        return ids[keep], values[keep]


def _softmax(xp, x):
    e = xp.exp(x - x.max())
    return e / e.sum()


@lru_cache(maxsize=8)
def _dry_breakers(vocab, breakers: tuple[str, ...]) -> dict[int, list[tuple[int, ...]]]:
    """DRY's breakers as token sequences, {token: [tails]}, made once per vocabulary and breakers
    (the -np sequences' samplers share them): a token holding a breaker's text breaks alone (empty
    tail); a token ending in the start of a breaker breaks where the rest of it follows."""
    found: dict[int, list[tuple[int, ...]]] = {}

    def add(token: int, tail: tuple[int, ...]) -> None:
        if tail not in found.setdefault(token, []):
            found[token].append(tail)

    pieces = [vocab.token_to_piece(t, True) for t in range(vocab.n_tokens)]
    for breaker in breakers:
        text = breaker.encode()[:DRY_MAX_BREAKER_CHARS]
        for token, word in enumerate(pieces):
            if not text:
                break
            if text in word:
                add(token, ())
                continue
            pos = word.find(text[:1])
            while pos >= 0:
                i = 1
                while i < len(text) and pos + i < len(word) and word[pos + i] == text[i]:
                    i += 1
                if i == len(text) or pos + i == len(word):  # the word ends in the breaker's start
                    tail = vocab.tokenize(text[i:].decode("utf-8", "replace"), add_special=False, parse_special=False)
                    add(token, tuple(tail[:DRY_MAX_TAIL_TOKENS]))
                pos = word.find(text[:1], pos + 1)
    return found


def _dry_active(p: SamplerParams) -> bool:
    return p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and p.dry_penalty_last_n != 0


class _Dry:
    """DRY's state (llama.cpp's, ported from koboldcpp): the last tokens, and the breakers as token
    sequences (_dry_breakers)."""

    def __init__(self, p: SamplerParams, vocab):
        if vocab is None:
            raise ValueError("DRY needs the model's vocabulary for its sequence breakers")
        self.p = p
        self.tokens: deque[int] = deque(maxlen=None if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n)
        self.breakers = _dry_breakers(vocab, tuple(p.dry_sequence_breakers))

    def penalties(self) -> dict[int, float]:
        """{token: how much its logit loses}, from the last tokens."""
        p, last = self.p, list(self.tokens)[::-1]  # last[0] is the newest
        n = len(last)
        if n <= p.dry_allowed_length:
            return {}
        limit = self._repetition_limit(last)
        if limit < p.dry_allowed_length:
            return {}
        longest: dict[int, int] = {}
        for k in range(1, n):  # how far the newest tokens repeat from k tokens back
            length = 0
            while length + k < n and last[length] == last[length + k]:
                length += 1
            length = min(length, limit)
            if length >= p.dry_allowed_length:
                follower = last[k - 1]  # what came after that earlier occurrence
                longest[follower] = max(longest.get(follower, 0), length)
        top = int(88.7228391 / np.log(p.dry_base)) if p.dry_base > 1.000001 else 0
        out = {}
        for token, length in longest.items():
            if () in self.breakers.get(token, []):  # a breaker by itself is never penalized
                continue
            exponent = length - p.dry_allowed_length
            out[token] = p.dry_multiplier * p.dry_base ** (min(exponent, top) if top > 0 else exponent)
        return out

    def _repetition_limit(self, last: list[int]) -> int:
        """How many of the newest tokens a repetition may span: up to the newest breaker."""
        for i, token in enumerate(last):
            matched = [len(tail) for tail in self.breakers.get(token, [])
                       if len(tail) <= i and all(tail[j] == last[i - j - 1] for j in range(len(tail)))]
            if matched:
                return i - max(matched)
        return len(last)
