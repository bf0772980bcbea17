"""`llm perplexity`: llama-perplexity's numbers and output, and its KL-divergence mode."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llmsuite.core.atomic import atomic_writer
from llmsuite.core.context import Context
from llmsuite.core.graph import AttnStats
from llmsuite.core.errors import InvalidInputError, Interrupted
from llmsuite.core.perplexity import (ChunkPlan, KLStats, PerplexityResult, kl_divergence, median, percentile,
                                      perplexity as run_ppl, perplexity_context, perplexity_tokens, plan_chunks,
                                      read_kl_base, vocab_fingerprint)

from . import options as opt
from .common import err_console, exit_interrupted, log, open_model, read_text_file, settings as cli_settings
from .generate import print_attn_stats

DEFAULT_CTX = 512


ChunkSize = Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="tokens per chunk (default 512)")]


# -np does not apply: the chunks decoded together follow from -b and -c, as in llama-perplexity
@opt.with_context_options(omit=("parallel",), ctx_size=opt.Flag(ChunkSize, None))
def perplexity(
    model: opt.Model = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="text to score")] = None,
    chunks: Annotated[int, typer.Option("--chunks", help="chunks to score (-1: all)")] = -1,
    *,
    context: opt.ContextOptions,
    verbose: opt.Verbose = False,
    kl_base: Annotated[Optional[Path], typer.Option("--kl-divergence-base", help="file of base log-probabilities")] = None,
    kl: Annotated[bool, typer.Option("--kl-divergence", help="compare with --kl-divergence-base")] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="text or json")] = "text",
    kv_unified: Annotated[Optional[bool], typer.Option("-kvu/-no-kvu", "--kv-unified/--no-kv-unified",
                          help="chunks scored together share one KV buffer, or a stream each (llama.cpp's -kvu; "
                          "--kv unified or split)", show_default=False)] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar on stderr")] = True,
) -> None:
    """Perplexity of a text file, chunk by chunk (llama-perplexity)."""
    opt.verbose_flag(verbose)
    context = context.apply_llama_cpp_flags()
    if kv_unified is not None:
        wanted = "unified" if kv_unified else "split"
        if context.kv not in ("auto", wanted):
            raise InvalidInputError(f"{'-kvu' if kv_unified else '-no-kvu'} asks for --kv {wanted}; it contradicts "
                                    f"--kv {context.kv}")
        context = replace(context, kv=wanted)
    ctx_size = context.ctx_size
    if output not in ("text", "json"):
        raise InvalidInputError(f"unknown output format '{output}' (text or json)")
    if kl and kl_base is None:
        raise InvalidInputError("--kl-divergence needs --kl-divergence-base FILE with the base log-probabilities")
    base = read_kl_base(kl_base) if kl else None
    if base is not None:
        if ctx_size is not None and ctx_size != base.n_ctx:
            raise InvalidInputError(f"{kl_base} was computed with -c {base.n_ctx}; drop -c or pass -c {base.n_ctx}")
        ctx_size = base.n_ctx
    elif file is None:
        raise InvalidInputError("give the text to score with -f FILE")
    if ctx_size is None:
        ctx_size = DEFAULT_CTX
    if ctx_size <= 0:
        raise InvalidInputError("perplexity needs a context size -c > 0")
    text = read_text_file(file) if base is None else None
    if text is not None and not text.strip():
        raise InvalidInputError(f"{file} is empty")
    params = context.params(n_ctx=ctx_size, n_ubatch=min(context.ubatch_size, context.batch_size), n_seq_max=1)
    lm, _ = open_model(model, context.backend, (params.type_k, params.type_v), context.numerics)
    if base is not None:
        if base.n_vocab != lm.hparams.n_vocab or base.vocab_fp != vocab_fingerprint(lm.vocab):
            raise InvalidInputError(f"{kl_base} was computed with another vocabulary ({base.model_name}); "
                                    "KL-divergence needs the same tokens")
        if base.model_fp != lm.fingerprint:
            log(f"note: the base was computed with {base.model_name}, a different model file")
        tokens = base.tokens.tolist()
    else:
        log("perplexity: tokenizing the input ..")
        tokens = perplexity_tokens(lm, text)
    plan = plan_chunks(len(tokens), ctx_size, context.batch_size, base.n_chunk if base is not None else chunks)
    if ctx_size > lm.hparams.n_ctx_train:
        err_console.print(f"warning: the model was trained on only {lm.hparams.n_ctx_train} context tokens "
                          f"({ctx_size} specified)", markup=False)
    _check_memory(plan, lm.hparams.n_vocab)
    ctx = perplexity_context(lm, plan, params)
    if cli_settings["verbose"]:
        ctx.attn_stats = AttnStats()
    log(f"perplexity: calculating perplexity over {plan.n_chunk} chunks, n_ctx={plan.n_ctx}, "
        f"batch_size={plan.n_batch}, n_seq={plan.n_seq}")
    settings = dict(model=lm.name, file=str(file) if file else None, n_ctx=plan.n_ctx, n_chunk=plan.n_chunk,
                    n_batch=plan.n_batch, n_ubatch=ctx.params.n_ubatch, n_seq=plan.n_seq, kv=ctx.memory.kind,
                    type_k=params.type_k, type_v=params.type_v, backend=context.backend, attn=context.attn,
                    sparse_topk=context.sparse_topk)
    with _progress(progress, plan) as bar:
        if base is not None:
            _run_kl(ctx, base, plan, output, bar, settings)
        else:
            _run_ppl(ctx, tokens, plan, output, bar, settings, kl_base)
    print_attn_stats(ctx)


def _check_memory(plan: ChunkPlan, n_vocab: int) -> None:
    """Refuse a run whose logits alone would not fit in the memory this machine has free."""
    need = plan.n_seq * (plan.n_ctx - plan.first) * n_vocab * 4 * 2
    try:
        with open("/proc/meminfo") as f:
            free = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return
    if need > free:
        raise InvalidInputError(f"-c {plan.n_ctx} with {plan.n_seq} parallel chunks needs about {need / 2**30:.1f} GiB "
                                f"for logits, but only {free / 2**30:.1f} GiB is available; lower -c or -b")


class _Bar:
    def __init__(self, progress: Progress | None, plan: ChunkPlan):
        self.progress, self.plan, self.t0 = progress, plan, time.perf_counter()
        self.task = progress.add_task("perplexity", total=plan.n_chunk) if progress else None

    def advance(self, done: int) -> None:
        if self.progress:
            rate = done * self.plan.n_ctx / (time.perf_counter() - self.t0)
            self.progress.update(self.task, completed=done, description=f"perplexity {rate:7.1f} t/s")


class _progress:
    def __init__(self, enabled: bool, plan: ChunkPlan):
        self.enabled = enabled and err_console.is_terminal
        self.plan = plan

    def __enter__(self) -> _Bar:
        self.display = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), console=err_console, transient=True) if self.enabled else None
        if self.display:
            self.display.__enter__()
        return _Bar(self.display, self.plan)

    def __exit__(self, *exc):
        if self.display:
            self.display.__exit__(*exc)


def _run_ppl(ctx: Context, tokens, plan: ChunkPlan, output: str, bar: _Bar, settings: dict, kl_base: Path | None):
    def on_chunk(index: int, value: float) -> None:
        if output == "text":
            sys.stdout.write(f"[{index + 1}]{value:.4f},")
            sys.stdout.flush()
        bar.advance(index + 1)

    try:
        if kl_base is not None:
            with atomic_writer(kl_base) as f:  # the previous base survives an interrupt or a full disk
                result = run_ppl(ctx, tokens, plan, on_chunk, kl_base=f)
        else:
            result = run_ppl(ctx, tokens, plan, on_chunk)
    except Interrupted as stop:
        _print_ppl(stop.partial, output, settings, None, interrupted=True)
        done = len(stop.partial.running_ppl)
        exit_interrupted(f"{done} of {plan.n_chunk} chunks done, and the estimate covers only those"
                         + (f"; {kl_base} was not written" if kl_base else ""))
    _print_ppl(result, output, settings, kl_base)


def _print_ppl(result: PerplexityResult, output: str, settings: dict, kl_base: Path | None,
               interrupted: bool = False) -> None:
    scored = result.count > 0
    rate = len(result.running_ppl) * result.plan.n_ctx / result.seconds if scored else 0.0
    if output == "json":
        doc = dict(settings=settings, chunks=[round(v, 6) for v in result.running_ppl],
                   final=result.ppl if scored else None, final_error=result.ppl_error if scored else None,
                   scored_tokens=result.count, seconds=result.seconds, tokens_per_second=rate,
                   kl_divergence_base=str(kl_base) if kl_base else None, interrupted=interrupted)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    sys.stdout.write("\n")
    if not scored:
        return
    if math.isnan(result.ppl_error):
        err_console.print("Unexpected negative standard deviation of log(prob)", markup=False)
    else:
        sys.stdout.write(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_error:.5f}\n")
    log(f"perplexity: {result.seconds:.2f} seconds, {rate:.1f} tokens per second")


def _run_kl(ctx: Context, base, plan: ChunkPlan, output: str, bar: _Bar, settings: dict) -> None:
    if output == "text":
        sys.stdout.write("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                         "              Δp RMS            Same top p\n")
    rows = []

    def on_chunk(index: int, stats: KLStats) -> None:
        row = _chunk_row(stats)
        rows.append(row)
        if output == "text":
            sys.stdout.write(f"{index + 1:4d}    {row['ppl']:9.4f} ± {row['ppl_unc']:9.4f}"
                             f"    {row['ln_ratio']:10.5f} ± {row['ln_ratio_unc']:10.5f}"
                             f"    {row['kld']:10.5f} ± {row['kld_unc']:10.5f}"
                             f"    {100 * row['dp_rms']:6.3f} ± {100 * row['dp_rms_unc']:6.3f} %"
                             f"    {100 * row['same_top']:6.3f} ± {100 * row['same_top_unc']:6.3f} %\n")
            sys.stdout.flush()
        bar.advance(index + 1)

    try:
        stats, interrupted = kl_divergence(ctx, base, plan, on_chunk), False
    except Interrupted as stop:
        stats, interrupted = stop.partial, True
        rows = rows[:len(stats.kld_values)]
    summary = _summary(stats) if stats.count else None
    if output == "json":
        doc = dict(settings=settings, chunks=rows, summary=summary, interrupted=interrupted)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif stats.count >= 100:
        sys.stdout.write("\n" + _summary_text(summary))
    if interrupted:
        exit_interrupted(f"{len(rows)} of {plan.n_chunk} chunks done, and the statistics cover only those")


def _chunk_row(s: KLStats) -> dict:
    """The running values llama.cpp prints after each chunk."""
    log_ppl, log_ppl_unc = s.mean_and_uncertainty(s.sum_nll, s.sum_nll2)
    base, base_unc = s.mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2)
    cov = s.covariance()
    kld, kld_unc = s.mean_and_uncertainty(s.sum_kld, s.sum_kld2)
    mse, mse_unc = s.mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4)
    rms = math.sqrt(mse)
    top = s.n_same_top / s.count
    return dict(ppl=math.exp(log_ppl), ppl_unc=math.exp(log_ppl) * log_ppl_unc, ln_ratio=log_ppl - base,
                ln_ratio_unc=math.sqrt(max(log_ppl_unc ** 2 + base_unc ** 2 - 2 * cov, 0.0)),
                kld=kld, kld_unc=kld_unc, dp_rms=rms, dp_rms_unc=0.5 / rms * mse_unc if rms else 0.0,
                same_top=top, same_top_unc=math.sqrt(top * (1 - top) / (s.count - 1)) if s.count > 1 else 0.0)


def _summary(s: KLStats) -> dict:
    log_ppl, log_ppl_unc = s.mean_and_uncertainty(s.sum_nll, s.sum_nll2)
    base, base_unc = s.mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2)
    cov = s.covariance()
    ppl, ppl_base = math.exp(log_ppl), math.exp(base)
    ratio_unc = math.sqrt(max(log_ppl_unc ** 2 + base_unc ** 2 - 2 * cov, 0.0))
    kld = np.sort(np.concatenate(s.kld_values))
    dp = np.sort(np.concatenate(s.p_diff_values))
    fractions = {"99.9%": 0.999, "99.0%": 0.99, "95.0%": 0.95, "90.0%": 0.90, "75.0%": 0.75, "25.0%": 0.25,
                 "10.0%": 0.10, " 5.0%": 0.05, " 1.0%": 0.01, " 0.1%": 0.001}
    row = _chunk_row(s)
    dp_mean, dp_unc = s.mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2)
    return dict(
        count=s.count, ppl=ppl, ppl_unc=ppl * log_ppl_unc, ppl_base=ppl_base, ppl_base_unc=ppl_base * base_unc,
        cor=cov / (log_ppl_unc * base_unc) if log_ppl_unc and base_unc else 0.0,
        ln_ratio=log_ppl - base, ln_ratio_unc=ratio_unc,
        ratio=math.exp(log_ppl - base), ratio_unc=math.exp(log_ppl - base) * ratio_unc,
        diff=ppl - ppl_base, diff_unc=math.sqrt(max((ppl * log_ppl_unc) ** 2 + (ppl_base * base_unc) ** 2
                                                    - 2 * ppl * ppl_base * cov, 0.0)),
        kld=row["kld"], kld_unc=row["kld_unc"], kld_max=float(kld[-1]), kld_median=median(kld), kld_min=float(kld[0]),
        kld_percentiles={k: percentile(kld, f) for k, f in fractions.items() if k not in ("75.0%", "25.0%")},
        dp_mean=dp_mean, dp_unc=dp_unc, dp_max=float(dp[-1]), dp_median=median(dp), dp_min=float(dp[0]),
        dp_percentiles={k: percentile(dp, f) for k, f in fractions.items()},
        dp_rms=row["dp_rms"], dp_rms_unc=row["dp_rms_unc"], same_top=row["same_top"], same_top_unc=row["same_top_unc"])


def _summary_text(m: dict) -> str:
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {m['ppl']:10.6f} ± {m['ppl_unc']:10.6f}",
             f"Mean PPL(base)                : {m['ppl_base']:10.6f} ± {m['ppl_base_unc']:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * m['cor']:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {m['ln_ratio']:10.6f} ± {m['ln_ratio_unc']:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {m['ratio']:10.6f} ± {m['ratio_unc']:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {m['diff']:10.6f} ± {m['diff_unc']:10.6f}",
             "",
             "====== KL divergence statistics ======",
             f"Mean    KLD: {m['kld']:10.6f} ± {m['kld_unc']:10.6f}",
             f"Maximum KLD: {m['kld_max']:10.6f}"]
    pct = m["kld_percentiles"]
    lines += [f"{k}   KLD: {pct[k]:10.6f}" for k in ("99.9%", "99.0%", "95.0%", "90.0%")]
    lines.append(f"Median  KLD: {m['kld_median']:10.6f}")
    lines += [f"{k}   KLD: {pct[k]:10.6f}" for k in ("10.0%", " 5.0%", " 1.0%", " 0.1%")]
    lines += [f"Minimum KLD: {m['kld_min']:10.6f}", "",
              "====== Token probability statistics ======",
              f"Mean    Δp: {100 * m['dp_mean']:6.3f} ± {100 * m['dp_unc']:5.3f} %",
              f"Maximum Δp: {100 * m['dp_max']:6.3f}%"]
    pct = m["dp_percentiles"]
    lines += [f"{k}   Δp: {100 * pct[k]:6.3f}%" for k in ("99.9%", "99.0%", "95.0%", "90.0%", "75.0%")]
    lines.append(f"Median  Δp: {100 * m['dp_median']:6.3f}%")
    lines += [f"{k}   Δp: {100 * pct[k]:6.3f}%" for k in ("25.0%", "10.0%", " 5.0%", " 1.0%", " 0.1%")]
    lines += [f"Minimum Δp: {100 * m['dp_min']:6.3f}%",
              f"RMS Δp    : {100 * m['dp_rms']:6.3f} ± {100 * m['dp_rms_unc']:5.3f} %",
              f"Same top p: {100 * m['same_top']:6.3f} ± {100 * m['same_top_unc']:5.3f} %"]
    return "\n".join(lines) + "\n"
