"""The work behind `llm batched-bench` (llama-batched-bench): many sequences decoding together.

For each prompt length PP, generation length TG and sequence count B (llama's loop order: PP, then
TG, then B innermost) the memory is cleared, B prompts of PP random tokens are decoded in -b
chunks (or one, copied to the others with seq_cp, under -pps), then TG steps each decode one token
of every sequence as one batch of B rows (or, under -tgs, each sequence's TG tokens one after
another). The two phases are timed apart; the figures are llama-batched-bench's:
S_PP = B·PP/T_PP (PP/T_PP when the prompt is shared), S_TG = B·TG/T_TG, S = tokens / (T_PP + T_TG).

One context serves every case of a setup (the engine's axes: backend, numerics, memory kind,
attention path, sparse top-k, cache types), with room for the largest B; a case whose cells
exceed the context is skipped with a note (llama.cpp skips it silently)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Iterator

import numpy as np

from .backend import default_cache_type
from .batch import Batch
from .bench import blas_threads, fill_backend_defaults
from .context import Context, ContextParams, check_status
from .errors import InvalidInputError
from .memory.factory import MEMORY_KINDS, default_kind
from .memory.masks import SparseParams
from .models import Model

WARMUP_TOKENS = 16  # llama-batched-bench's warm-up: 16 random tokens of sequence 0
SETUP_AXES = ("backend", "numerics", "kv", "attn", "sparse_topk", "type_k", "type_v")  # outer to inner


@dataclass(frozen=True)
class Case:
    """One row of the table: PP prompt tokens and TG generated tokens for each of B sequences."""
    pp: int
    tg: int
    pl: int

    def n_kv(self, shared: bool, cells_shared: bool) -> int:
        """Cells the case fills: a shared prompt is held once where sequences share cells (one
        unified buffer) and once per sequence where each has its own stream."""
        if shared:
            return (self.pp if cells_shared else self.pl * self.pp) + self.pl * self.tg
        return self.pl * (self.pp + self.tg)


def cases(n_pp: list[int], n_tg: list[int], n_pl: list[int]) -> list[Case]:
    return [Case(pp, tg, pl) for pp, tg, pl in product(n_pp, n_tg, n_pl)]


@dataclass(frozen=True)
class Setup:
    """One combination of the engine's axes: one context, every case run on it."""
    model: str
    backend: str = "cpu"
    numerics: str = ""  # "": the backend's default
    kv: str = "auto"  # auto: split as llama-batched-bench (unified with -kvu), where the model's cache is plain
    attn: str = "auto"
    sparse_topk: int = 0
    type_k: str = ""  # "": the backend's default cache type
    type_v: str = ""

    def __post_init__(self):
        fill_backend_defaults(self)


@dataclass(frozen=True)
class Options:
    """What every setup shares: llama-batched-bench's single-valued flags."""
    n_ctx: int = 0  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0
    n_threads_batch: int = 0
    shared_prompt: bool = False  # -pps
    separate_tg: bool = False  # -tgs
    kv_unified: bool = False  # -kvu: what --kv auto means on a plain attention cache
    sparse: SparseParams = field(default_factory=SparseParams)
    attn_mask: str = "auto"
    kv_budget: int = 0
    warmup: bool = True


def setups(models: list[str], axes: dict[str, list]) -> list[Setup]:
    values = [axes.get(name) or [getattr(Setup, name)] for name in SETUP_AXES]
    return [Setup(m, **dict(zip(SETUP_AXES, combo))) for m in models for combo in product(*values)]


def varying_axes(runs: list[Setup]) -> list[str]:
    return [name for name in ("model", *SETUP_AXES) if len({getattr(s, name) for s in runs}) > 1]


def check_lists(n_pp: list[int], n_tg: list[int], n_pl: list[int], max_seq: int) -> None:
    """Refuse lists no case can run from, before any model loads."""
    for flag, values, least in (("-npp", n_pp, 1), ("-ntg", n_tg, 0), ("-npl", n_pl, 1)):
        if not values:
            raise InvalidInputError(f"{flag} needs at least one value (e.g. -npp 128 -ntg 64 -npl 1,2,4,8)")
        bad = [v for v in values if v < least]
        if bad:
            raise InvalidInputError(f"{flag} {bad[0]}: " + ("a prompt needs at least one token" if flag == "-npp" else
                                    "the number of parallel sequences must be at least 1" if flag == "-npl" else
                                    "generated tokens cannot be negative"))
    if max(n_pl) > max_seq:
        raise InvalidInputError(f"-npl {max(n_pl)}: the memory holds at most {max_seq} sequences (-np limits)")


def check_kv(kv_unified: bool, kinds: list[str]) -> None:
    if kv_unified and "split" in kinds:
        raise InvalidInputError("-kvu asks for one unified KV buffer; it contradicts --kv split")


@dataclass
class Row:
    """A case's measurement on a setup, with llama-batched-bench's figures."""
    setup: Setup
    kv: str  # the memory kind the context ran (auto resolved)
    case: Case
    n_kv: int
    t_pp: float
    t_tg: float
    shared: bool
    n_kv_max: int  # the context's cells (-c)
    n_threads: int
    n_threads_batch: int

    @property
    def prompt_tokens(self) -> int:
        return self.case.pp if self.shared else self.case.pl * self.case.pp

    @property
    def speed_pp(self) -> float:
        return self.prompt_tokens / self.t_pp

    @property
    def speed_tg(self) -> float:
        """0 where no token was generated (llama.cpp prints nan)."""
        return self.case.pl * self.case.tg / self.t_tg if self.case.tg else 0.0

    @property
    def t(self) -> float:
        return self.t_pp + self.t_tg

    @property
    def speed(self) -> float:
        return (self.prompt_tokens + self.case.pl * self.case.tg) / self.t


def resolve_kv(model: Model, kv: str, kv_unified: bool) -> str:
    """--kv auto as llama-batched-bench builds its cache: a stream per sequence unless -kvu, where
    the model's attention cache is a plain one (beside recurrent states too); windowed, latent and
    recurrent-only memories keep their own default."""
    if kv != "auto" or kv_unified:
        return kv
    spec = model.memory_spec(model.attn_impls[0] if model.attn_impls else "naive")
    plain = spec.model_kind == "decoder" and default_kind(spec) in ("unified", "hybrid") and not spec.window_layers
    return "split" if plain else "auto"


class Runner:
    """Runs the cases of each setup on one context; `on_event` hears what is under way, `on_note`
    what was skipped."""

    def __init__(self, load: Callable[[Setup], Model], options: Options, n_seq: int,
                 on_event: Callable[[str], None] | None = None, on_note: Callable[[str], None] | None = None,
                 seed: int = 0):
        self.load, self.options, self.n_seq = load, options, n_seq
        self.on_event = on_event or (lambda message: None)
        self.on_note = on_note or (lambda message: None)
        self.rng = np.random.default_rng(seed)

    def context(self, setup: Setup) -> Context:
        """The setup's context, refused (InvalidInputError) where it cannot run what was asked."""
        model, o = self.load(setup), self.options
        check_kv(o.kv_unified, [setup.kv])
        kv = resolve_kv(model, setup.kv, o.kv_unified)
        kind = MEMORY_KINDS.get(kv)
        params = ContextParams(n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=min(o.n_ubatch, o.n_batch),
                               n_seq_max=self.n_seq, kv=kv, attn=setup.attn, backend=setup.backend,
                               numerics=setup.numerics, type_k=setup.type_k, type_v=setup.type_v,
                               cache_types_given=(setup.type_k, setup.type_v) != (default_cache_type(setup.backend),) * 2,
                               sparse=SparseParams(setup.sparse_topk, o.sparse.block, o.sparse.local, o.sparse.layers),
                               attn_mask=o.attn_mask, kv_budget=o.kv_budget if kind and kind.budgeted else 0,
                               n_threads=o.n_threads, n_threads_batch=o.n_threads_batch)
        ctx = Context(model, params)
        # the kernels compiled (once per machine) or loaded now, not inside a timed case
        ctx.backend.prepare(model.weight_types, state_space=model.is_recurrent, cache_types=(setup.type_k, setup.type_v))
        if not ctx.generates or ctx.needs_encoded_input:
            raise InvalidInputError(f"batched-bench times a decoder's prompts and generation; {model.arch} is "
                                    f"{'an encoder' if not ctx.generates else 'an encoder-decoder'}")
        if o.shared_prompt and ctx.memory.copy_refusal:
            raise InvalidInputError(f"-pps copies the prompt to the other sequences, but --kv {ctx.plan.memory} "
                                    f"cannot: {ctx.memory.copy_refusal}")
        return ctx

    def run(self, setup: Setup, all_cases: list[Case]) -> Iterator[Row]:
        ctx = self.context(setup)
        if self.options.warmup:
            self.on_event("warm-up")
            self._warmup(ctx)
        for case in all_cases:
            reason = self.refusal(ctx, case)
            if reason:
                self.on_note(f"skipped PP {case.pp}, TG {case.tg}, B {case.pl}: {reason}")
                continue
            yield self._case(ctx, setup, case)

    def refusal(self, ctx: Context, case: Case) -> str:
        """Why a case cannot run on this context ("": it can)."""
        o = self.options
        n_kv = case.n_kv(o.shared_prompt, self._cells_shared(ctx))
        if n_kv > ctx.n_ctx:
            return f"N_KV {n_kv} exceeds the context (-c {ctx.n_ctx})"
        if case.pp + case.tg > ctx.seq_capacity():
            return (f"a sequence needs {case.pp + case.tg} cells and its stream holds {ctx.seq_capacity()} "
                    f"(-c {ctx.n_ctx} split into {ctx.params.n_seq_max} streams)")
        return ""

    @staticmethod
    def _cells_shared(ctx: Context) -> bool:
        """Sequences share one buffer of cells (anything but a stream per sequence)."""
        return ctx.plan.memory != "split"

    def _warmup(self, ctx: Context) -> None:
        """llama-batched-bench's warm-up (16 tokens of sequence 0, fewer where its stream is
        smaller), then what the cases run with all the sequences: two-token prompts and one step
        of a row each. The kernels compile on first use, once per machine (numba), so that a first
        run's figures are not its compile times."""
        ctx.clear()
        n = max(1, min(WARMUP_TOKENS, ctx.seq_capacity() - 1))
        self._decode(ctx, Batch.from_tokens(self._tokens(ctx, n), pos0=0))
        self._decode(ctx, Batch.from_tokens(self._tokens(ctx, 1), pos0=n))
        ctx.clear()
        if self.refusal(ctx, Case(2, 1, self.n_seq)):
            return
        self._decode(ctx, self._prompt_batch(ctx, 2, self.n_seq))
        for batch in self._steps(ctx, Case(2, 1, self.n_seq)):
            self._decode(ctx, batch)
        ctx.clear()

    def _case(self, ctx: Context, setup: Setup, case: Case) -> Row:
        o = self.options
        ctx.clear()
        n_prompts = 1 if o.shared_prompt else case.pl
        prompt = self._prompt_batch(ctx, case.pp, n_prompts)
        self.on_event(f"PP {case.pp}, B {case.pl}: prompt")
        t0 = time.perf_counter()
        for start in range(0, len(prompt), o.n_batch):
            self._decode(ctx, _slice(prompt, start, start + o.n_batch))
        ctx.backend.synchronize()
        t_pp = time.perf_counter() - t0
        if o.shared_prompt:
            for seq in range(1, case.pl):
                ctx.memory.seq_cp(0, seq, -1, -1)
        self.on_event(f"PP {case.pp}, B {case.pl}: generation")
        steps = list(self._steps(ctx, case))
        t0 = time.perf_counter()
        for batch in steps:
            self._decode(ctx, batch)
        ctx.backend.synchronize()
        t_tg = time.perf_counter() - t0
        threads = o.n_threads or blas_threads()
        return Row(setup, ctx.plan.memory, case, case.n_kv(o.shared_prompt, self._cells_shared(ctx)), t_pp, t_tg,
                   o.shared_prompt, ctx.n_ctx, threads, o.n_threads_batch or threads)

    def _prompt_batch(self, ctx: Context, pp: int, n_prompts: int) -> Batch:
        """n_prompts sequences of pp random tokens at positions 0..pp-1, each one's last token outputs."""
        n = pp * n_prompts
        output = np.zeros(n, dtype=bool)
        output[pp - 1::pp] = True
        return Batch(self._tokens(ctx, n), np.tile(np.arange(pp, dtype=np.int32), n_prompts),
                     np.repeat(np.arange(n_prompts, dtype=np.int32), pp), output)

    def _steps(self, ctx: Context, case: Case) -> Iterator[Batch]:
        """The generation batches: B rows per step (0123 0123 …), or under -tgs each sequence's
        tokens alone (0 0 0 … 1 1 1 …). Tokens are drawn before the timer starts."""
        if self.options.separate_tg:
            for seq in range(case.pl):
                for i in range(case.tg):
                    yield Batch(self._tokens(ctx, 1), np.array([case.pp + i], np.int32), np.array([seq], np.int32),
                                np.ones(1, bool))
            return
        for i in range(case.tg):
            yield Batch(self._tokens(ctx, case.pl), np.full(case.pl, case.pp + i, np.int32),
                        np.arange(case.pl, dtype=np.int32), np.ones(case.pl, bool))

    def _tokens(self, ctx: Context, n: int) -> np.ndarray:
        return self.rng.integers(0, ctx.model.hparams.n_vocab, n).astype(np.int32)

    @staticmethod
    def _decode(ctx: Context, batch: Batch) -> None:
        check_status(ctx, ctx.decode(batch))


def _slice(batch: Batch, start: int, end: int) -> Batch:
    return Batch(batch.tokens[start:end], batch.pos[start:end], batch.seq_id[start:end], batch.output[start:end])
