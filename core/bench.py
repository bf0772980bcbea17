"""The work behind `llm bench` (llama-bench): test specs, sweeps in llama-bench's loop order,
and its timing semantics — a warm-up, the depth prefilled outside the timer and restored from a
saved state on later repetitions, random prompt tokens, t/s as the mean of per-repetition rates."""

from __future__ import annotations

import os
import platform
import re
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Callable

import numpy as np

from .backend import default_cache_type, default_numerics
from .batch import Batch
from .context import Context, ContextParams, check_status
from .errors import InvalidInputError
from .memory.factory import MEMORY_KINDS
from .memory.masks import SparseParams
from .models import Model, load_model

SPEC = re.compile(r"^(?:pp(?P<pp>\d+)(?:\+tg(?P<pg>\d+))?|tg(?P<tg>\d+))(?:@d(?P<d>\d+))?$")
RANGE = re.compile(r"^(\d+)(?:-(\d+)(?:([+*])(\d+))?)?$")


@dataclass(frozen=True)
class Test:
    n_prompt: int
    n_gen: int
    n_depth: int = 0

    @property
    def name(self) -> str:
        """llama-bench's test name: pp512, tg128, pp512+tg128, with ' @ d4096' at depth."""
        if self.n_gen == 0:
            base = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            base = f"tg{self.n_gen}"
        else:
            base = f"pp{self.n_prompt}+tg{self.n_gen}"
        return base + (f" @ d{self.n_depth}" if self.n_depth else "")


def parse_spec(spec: str) -> Test:
    m = SPEC.match(spec.strip())
    bad = InvalidInputError(f"bad test spec '{spec}': expected ppN, tgN or ppN+tgM with N, M > 0, "
                            "optionally followed by @dN (e.g. pp512, tg128, pp2048@d32768)")
    if not m:
        raise bad
    pp, pg, tg = int(m["pp"] or 0), int(m["pg"] or 0), int(m["tg"] or 0)
    if (m["pp"] and pp == 0) or (m["pg"] and pg == 0) or (m["tg"] and tg == 0):
        raise bad
    return Test(pp, tg or pg, int(m["d"] or 0))


def parse_int_list(value: str, flag: str) -> list[int]:
    """llama-bench's integer lists: comma lists of N, A-B, A-B+S or A-B*M."""
    out: list[int] = []
    for part in value.split(","):
        m = RANGE.match(part.strip())
        if not m:
            raise InvalidInputError(f"{flag} '{value}': '{part}' is not a number or a range (A-B, A-B+S, A-B*M)")
        first = int(m[1])
        if m[2] is None:
            out.append(first)
            continue
        last, op, step = int(m[2]), m[3] or "+", int(m[4] or 1)
        if last < first or (op == "+" and step < 1) or (op == "*" and step < 2):
            raise InvalidInputError(f"{flag} '{value}': invalid range '{part}'")
        v = first
        while v <= last:
            out.append(v)
            v = v + step if op == "+" else v * step
    return out


def parse_str_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


# ---- instances ------------------------------------------------------------------------------

AXES = ("backend", "numerics", "n_threads", "kv", "attn_impl", "attn", "attn_mask", "sparse_topk", "n_batch", "n_ubatch",
        "type_k", "type_v")  # outer to inner


@dataclass(frozen=True)
class Instance:
    model: str
    test: Test
    backend: str = "cpu"
    numerics: str = ""  # "": the backend's default (ggml on the cpu: ggml-cpu's 8-bit activations and integer dots)
    n_threads: int = 0  # 0: every core
    kv: str = "auto"
    attn_impl: str = "auto"  # latent-attention models: mla or naive
    attn: str = "auto"
    n_batch: int = 2048
    n_ubatch: int = 512
    type_k: str = ""  # "": the backend's default cache type
    type_v: str = ""
    attn_mask: str = "auto"  # the mask producer of the selecting layers (--attn-mask)
    sparse_topk: int = 0
    sparse: SparseParams = SparseParams()  # block, local and layers of --sparse-topk
    kv_budget: int = 0  # cells an evicting memory kind keeps (--kv-budget)

    def __post_init__(self):
        fill_backend_defaults(self)
        kind = MEMORY_KINDS.get(self.kv)
        if kind is None or not kind.budgeted:  # --kv-budget bounds the kinds that evict, in a sweep with others
            object.__setattr__(self, "kv_budget", 0)

    def context_params(self) -> ContextParams:
        return ContextParams(n_ctx=self.test.n_prompt + self.test.n_gen + self.test.n_depth, n_batch=self.n_batch,
                             n_ubatch=min(self.n_ubatch, self.n_batch), kv=self.kv, attn=self.attn,
                             attn_impl=self.attn_impl,
                             backend=self.backend, numerics=self.numerics, type_k=self.type_k, type_v=self.type_v,
                             cache_types_given=(self.type_k, self.type_v) != (default_cache_type(self.backend),) * 2,
                             sparse=replace(self.sparse, topk=self.sparse_topk), attn_mask=self.attn_mask,
                             kv_budget=self.kv_budget,
                             n_threads=self.threads, n_threads_batch=self.threads)

    @property
    def threads(self) -> int:
        """The thread count this instance runs with (-t, or every core)."""
        return self.n_threads or blas_threads()


def fill_backend_defaults(run) -> None:
    """A frozen sweep point's numerics and cache types left "" become its backend's defaults."""
    if not run.numerics:
        object.__setattr__(run, "numerics", default_numerics(run.backend))
    for name in ("type_k", "type_v"):
        if not getattr(run, name):
            object.__setattr__(run, name, default_cache_type(run.backend))


def instances(models: list[str], tests: list[Test], axes: dict[str, list], **fixed) -> list[Instance]:
    """llama-bench's loop order: model, then each axis, the tests innermost; `fixed` sets the rest."""
    values = [axes.get(name) or [getattr(Instance, name)] for name in AXES]
    return [Instance(m, t, **dict(zip(AXES, combo)), **fixed) for m in models for combo in product(*values)
            for t in tests]


def varying_axes(runs: list[Instance]) -> list[str]:
    return [name for name in AXES if len({getattr(r, name) for r in runs}) > 1]


# ---- running ----------------------------------------------------------------------------------

@dataclass
class Result:
    instance: Instance
    samples_ns: list[int] = field(default_factory=list)
    skipped: str = ""

    @property
    def samples_ts(self) -> list[float]:
        n = self.instance.test.n_prompt + self.instance.test.n_gen
        return [1e9 * n / ns for ns in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return float(np.mean(self.samples_ts))

    @property
    def stddev_ts(self) -> float:
        ts = self.samples_ts
        return float(np.std(ts, ddof=1)) if len(ts) > 1 else 0.0

    @property
    def avg_ns(self) -> int:
        return int(sum(self.samples_ns) // len(self.samples_ns))

    @property
    def stddev_ns(self) -> int:
        ns = self.samples_ns
        if len(ns) < 2:
            return 0
        mean = sum(ns) / len(ns)
        return int(np.sqrt(sum((x - mean) ** 2 for x in ns) / (len(ns) - 1)))


def loader(paths: dict[str, Path]) -> Callable[[Instance], Model]:
    """Each instance's model, loaded for its backend; one kept at a time (reloaded on a change)."""
    load = lru_cache(maxsize=1)(lambda name, backend: load_model(paths[name], backend=backend))
    return lambda inst: load(inst.model, inst.backend)


class Runner:
    """Runs instances on loaded models, keeping llama-bench's depth-state cache between them."""

    def __init__(self, load: Callable[["Instance"], Model], repetitions: int = 5, warmup: bool = True,
                 on_event: Callable[[str], None] | None = None, seed: int = 0,
                 on_warning: Callable[[str], None] | None = None):
        self.load, self.repetitions, self.warmup = load, repetitions, warmup
        self.on_event = on_event or (lambda message: None)
        self.on_warning = on_warning or (lambda message: None)
        self.rng = np.random.default_rng(seed)
        self._depth_states: dict[tuple, bytes] = {}

    def run(self, inst: Instance) -> Result:
        model = self.load(inst)
        test = inst.test
        needed = test.n_prompt + test.n_gen + test.n_depth
        if needed > model.hparams.n_ctx_train:  # llama-bench runs it too, and llama.cpp warns
            self.on_warning(f"{test.name} needs {needed} positions, more than the {model.hparams.n_ctx_train} "
                            f"{model.name} was trained on (possible training context overflow)")
        ctx = Context(model, inst.context_params())
        if not ctx.generates and (test.n_gen or test.n_depth):
            raise InvalidInputError(f"{test.name}: {model.arch} is an encoder; only pp (the encoder) can be timed")
        # llama-bench's warm-up decodes at depth 0, and a step at depth reads the cache with kernels a
        # depth-0 step never calls (the parallel decode attention, a block cache's): compiled (once
        # per machine) or loaded now, never inside a repetition
        ctx.backend.prepare(model.weight_types, state_space=model.is_recurrent,
                            cache_types=tuple(t or default_cache_type(inst.backend) for t in (inst.type_k, inst.type_v)))
        result = Result(inst)
        if self.warmup:
            self.on_event("warmup")
            self._reset(ctx, test)
            if test.n_prompt:
                self._prompt(ctx, test.n_prompt)
            if test.n_gen:
                self._gen(ctx, 1)
        for rep in range(self.repetitions):
            self._reset(ctx, test)
            if test.n_depth:
                self._prefill_depth(ctx, inst)
            self.on_event(f"rep {rep + 1}/{self.repetitions}")
            t0 = time.perf_counter_ns()
            if test.n_prompt:
                self._prompt(ctx, test.n_prompt)
            if test.n_gen:
                self._gen(ctx, test.n_gen)
            result.samples_ns.append(time.perf_counter_ns() - t0)
        return result

    def _reset(self, ctx: Context, test: Test) -> None:
        """Empty memory; an encoder-decoder timing no pp (the encoder) gets a one-token encoder
        output for its decoder to attend, outside the timer."""
        ctx.clear()
        if ctx.needs_encoded_input and not test.n_prompt:
            self._prompt(ctx, 1)

    def _prefill_depth(self, ctx: Context, inst: Instance) -> None:
        """Depth outside the timer: decoded once, then restored from the saved state."""
        key = (inst.model, inst.test.n_depth, inst.kv, inst.kv_budget, inst.type_k, inst.type_v, inst.backend,
               inst.test.n_prompt + inst.test.n_gen)
        state = self._depth_states.get(key)
        if state is not None:
            self.on_event("depth (cached)")
            ctx.load_state_bytes(state)
            return
        self.on_event("depth")
        self._prompt(ctx, inst.test.n_depth, decoder=True)
        self._depth_states[key] = ctx.state_bytes()

    def _first_token(self, ctx: Context) -> int:
        vocab = ctx.model.vocab
        return vocab.bos if vocab.add_bos else int(self.rng.integers(ctx.model.hparams.n_vocab))

    def _prompt(self, ctx: Context, n: int, decoder: bool = False) -> None:
        """n random tokens in -b chunks (first of each chunk BOS when the model adds it), last one
        outputs. An encoder-decoder's prompt is its encoder's (in -ub chunks), unless `decoder`."""
        n_vocab, n_batch = ctx.model.hparams.n_vocab, ctx.params.n_batch if decoder else ctx.prompt_batch
        done = 0
        while done < n:
            size = min(n_batch, n - done)
            tokens = self.rng.integers(0, n_vocab, size).astype(np.int32)
            tokens[0] = self._first_token(ctx)
            self._decode(ctx, Batch.from_tokens(tokens), prompt=not decoder)
            done += size

    def _gen(self, ctx: Context, n: int) -> None:
        token = self._first_token(ctx)
        for _ in range(n):
            self._decode(ctx, Batch.from_tokens([token]))
            token = int(self.rng.integers(ctx.model.hparams.n_vocab))

    @staticmethod
    def _decode(ctx: Context, batch: Batch, prompt: bool = False) -> None:
        check_status(ctx, ctx.prompt(batch) if prompt else ctx.decode(batch))


# ---- what the numbers were measured on ------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_threads() -> int:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1
