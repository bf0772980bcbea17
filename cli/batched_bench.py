"""`llm batched-bench`: llama-batched-bench for this engine — prompts and generation of many
sequences at once, its table and JSON, swept over the engine's memory kinds and attention paths."""

from __future__ import annotations

import csv
import json
import sys
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from llmsuite.core import batched_bench as core
from llmsuite.core.backend import BACKENDS, NUMERICS, get_backend
from llmsuite.core.bench import cpu_name, loader, parse_int_list, parse_str_list
from llmsuite.core.context import ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import CACHE_TYPES, kv_choices
from llmsuite.core.memory.factory import MAX_SEQ
from llmsuite.core.memory.masks import SparseParams
from llmsuite.core.plan import ATTN_PATHS

from . import options as opt
from .common import err_console, exit_interrupted, resolve

ListOpt = Optional[list[str]]
LLAMA_FIELDS = ["n_kv_max", "n_batch", "n_ubatch", "flash_attn", "is_pp_shared", "n_gpu_layers", "n_threads",
                "n_threads_batch", "pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"]
ENGINE_FIELDS = ["is_tg_separate", "model_filename", "backend", "numerics", "kv", "attn", "sparse_topk", "type_k",
                 "type_v"]
COLUMNS = [("PP", 6), ("TG", 6), ("B", 4), ("N_KV", 6), ("T_PP s", 8), ("S_PP t/s", 8), ("T_TG s", 8),
           ("S_TG t/s", 8), ("T s", 8), ("S t/s", 8)]
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


def batched_bench(
    model: Annotated[ListOpt, typer.Option("-m", "--model", help="models (comma list or repeated)")] = None,
    n_pp: Annotated[ListOpt, typer.Option("-npp", help="prompt tokens per sequence (comma list)")] = None,
    n_tg: Annotated[ListOpt, typer.Option("-ntg", help="tokens generated per sequence (comma list)")] = None,
    n_pl: Annotated[ListOpt, typer.Option("-npl", help="parallel sequences (comma list)")] = None,
    shared_prompt: Annotated[bool, typer.Option("-pps", help="one prompt, copied to the other sequences (seq_cp)")] = False,
    separate_tg: Annotated[bool, typer.Option("-tgs", help="generate the sequences one after another")] = False,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="cells of the context: N_KV limit (0: the model's)")] = 0,
    batch_size: opt.BatchSize = 2048,
    ubatch_size: opt.UBatchSize = 512,
    cache_type_k: Annotated[ListOpt, typer.Option("-ctk", "--cache-type-k", help="K cache types (comma list)")] = None,
    cache_type_v: Annotated[ListOpt, typer.Option("-ctv", "--cache-type-v", help="V cache types (comma list)")] = None,
    kv: Annotated[ListOpt, typer.Option("--kv", help="memory classes, a comma list of <kv-kinds> (default: split, "
                                        "a stream per sequence, as llama-batched-bench; unified with -kvu)")] = None,
    kv_unified: Annotated[bool, typer.Option("-kvu", "--kv-unified", help="one KV buffer for all sequences "
                                             "(llama.cpp's switch; --kv unified)")] = False,
    attn: Annotated[ListOpt, typer.Option("--attn", help=f"attention paths: {','.join(ATTN_PATHS)}")] = None,
    sparse_topk: Annotated[ListOpt, typer.Option("--sparse-topk", help="block top-k sizes K (0: dense)")] = None,
    sparse_block: opt.SparseBlock = opt.SPARSE.block,
    sparse_local: opt.SparseLocal = opt.SPARSE.local,
    sparse_layers: opt.SparseLayers = opt.SPARSE.layers,
    attn_mask: opt.AttnMask = "auto",
    kv_budget: opt.KvBudget = 0,
    backend: Annotated[ListOpt, typer.Option("--backend", help="backends: cpu,cuda,cuda-emu")] = None,
    numerics: Annotated[ListOpt, typer.Option("--numerics", help="ggml,f32 (default: ggml on the cpu)")] = None,
    threads: opt.Threads = 0,
    threads_batch: opt.ThreadsBatch = 0,
    gpu_layers: opt.GpuLayers = None,
    flash_attn: opt.FlashAttn = "auto",
    device: opt.Device = None,
    split_mode: opt.SplitMode = None,
    main_gpu: opt.MainGpu = None,
    verbose: opt.Verbose = False,
    no_warmup: Annotated[bool, typer.Option("--no-warmup")] = False,
    output: Annotated[str, typer.Option("-o", "--output", "--output-format", help="md, csv, json or jsonl")] = "md",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress on stderr")] = True,
) -> None:
    """Throughput of many sequences decoding at once (llama-batched-bench)."""
    opt.verbose_flag(verbose)
    fa = {"0": "off", "1": "on"}.get(flash_attn, flash_attn)
    if opt.llama_cpp_flags("auto", gpu_layers, fa, device, split_mode, main_gpu) == "dense" and not attn:
        attn = ["dense"]
    if output not in ("md", "csv", "json", "jsonl"):
        raise InvalidInputError(f"unknown output format '{output}' (md, csv, json or jsonl)")
    pps, tgs, pls = _ints(n_pp, "-npp"), _ints(n_tg, "-ntg"), _ints(n_pl, "-npl")
    core.check_lists(pps, tgs, pls, MAX_SEQ)
    axes = dict(backend=_strs(backend, BACKENDS, "--backend"), numerics=_strs(numerics, NUMERICS, "--numerics"),
                kv=_strs(kv, kv_choices(), "--kv"), attn=_strs(attn, ATTN_PATHS, "--attn"),
                sparse_topk=_ints(sparse_topk, "--sparse-topk"), type_k=_strs(cache_type_k, CACHE_TYPES, "-ctk"),
                type_v=_strs(cache_type_v, CACHE_TYPES, "-ctv"))
    core.check_kv(kv_unified, axes["kv"])
    sparse = SparseParams(0, sparse_block, sparse_local, sparse_layers)
    options = core.Options(ctx_size, batch_size, ubatch_size, threads, threads_batch, shared_prompt, separate_tg,
                           kv_unified, sparse, attn_mask, kv_budget, not no_warmup)
    for k in axes["sparse_topk"] or [0]:  # refused before any model loads
        ContextParams(n_ctx=ctx_size, n_batch=batch_size, n_ubatch=min(ubatch_size, batch_size), n_seq_max=max(pls),
                      sparse=SparseParams(k, sparse_block, sparse_local, sparse_layers), attn_mask=attn_mask,
                      kv_budget=kv_budget, n_threads=threads, n_threads_batch=threads_batch).validate()
    for name in axes["backend"] or ["cpu"]:
        get_backend(name)  # an unavailable backend is refused before a model loads
    models = [m for value in (model or ["smollm2-135m"]) for m in parse_str_list(value)]
    paths = {m: resolve(m) for m in models}
    runs = core.setups(models, axes)
    all_cases = core.cases(pps, tgs, pls)
    rows, notes, stopped = _run_all(runs, all_cases, paths, options, max(pls), progress)
    if not rows and stopped is None:
        raise InvalidInputError(f"nothing to run: {notes[0]}" if notes else "nothing to run")
    for note in notes:
        err_console.print(note, markup=False)
    meta = dict(flash_attn=FLASH_ATTN.get(fa, -1), n_gpu_layers=int(gpu_layers) if _is_int(gpu_layers) else -1,
                paths=paths)
    _print(rows, runs, options, meta, output)
    if stopped is not None:
        exit_interrupted(f"during {stopped}; the results are the {len(rows)} rows measured before it")


def _ints(values, flag) -> list[int]:
    """Comma lists of integers (llama.cpp's), also taking llama-bench's ranges; negatives are read so
    that they are refused with a sentence of their own."""
    out = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip()
            if part.startswith("-") and part[1:].isdigit():
                out.append(int(part))
            elif part:
                out += parse_int_list(part, flag)
    return out


def _strs(values, allowed, flag) -> list[str]:
    out = [s for v in values or [] for s in parse_str_list(v)]
    for s in out:
        if s not in allowed:
            raise InvalidInputError(f"unknown {flag} value '{s}' (choose from {', '.join(allowed)})")
    return out


def _is_int(value) -> bool:
    return value is not None and value.lstrip("-").isdigit()


def _run_all(runs, all_cases, paths, options, n_seq, show_progress):
    """Every setup's cases; (rows, notes, where Ctrl-C stopped or None)."""
    rows, notes = [], []
    load = loader(paths)  # a Setup names its model and backend, as a bench instance does
    enabled = show_progress and err_console.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err_console,
                  transient=True, disable=not enabled) as bar:
        task = bar.add_task("batched-bench", total=len(runs) * len(all_cases))
        for i, setup in enumerate(runs):
            label = f"setup {i + 1}/{len(runs)} ({_describe(setup)})"
            runner = core.Runner(load, options, n_seq,
                                 on_event=lambda event, label=label: bar.update(task, description=f"{label}: {event}"),
                                 on_note=lambda note, setup=setup: notes.append(f"{_describe(setup)}: {note}"))
            done = len(rows)
            try:
                for row in runner.run(setup, all_cases):
                    rows.append(row)
                    bar.advance(task)
            except InvalidInputError as e:
                notes.append(f"skipped {_describe(setup)}: {e}")
            except KeyboardInterrupt:
                return rows, notes, label
            bar.advance(task, len(all_cases) - (len(rows) - done))
    return rows, notes, None


def _describe(setup: core.Setup) -> str:
    return f"{setup.model}, " + ", ".join(f"{name}={getattr(setup, name)}" for name in core.SETUP_AXES)


# ---- output ----------------------------------------------------------------------------------

def _record(row: core.Row, options: core.Options, meta: dict) -> dict:
    """llama-batched-bench's JSON fields, then the engine's."""
    s, c = row.setup, row.case
    return dict(n_kv_max=row.n_kv_max, n_batch=options.n_batch, n_ubatch=min(options.n_ubatch, options.n_batch),
                flash_attn=meta["flash_attn"], is_pp_shared=int(options.shared_prompt),
                n_gpu_layers=meta["n_gpu_layers"], n_threads=row.n_threads, n_threads_batch=row.n_threads_batch,
                pp=c.pp, tg=c.tg, pl=c.pl, n_kv=row.n_kv, t_pp=round(row.t_pp, 6), speed_pp=round(row.speed_pp, 6),
                t_tg=round(row.t_tg, 6), speed_tg=round(row.speed_tg, 6), t=round(row.t, 6),
                speed=round(row.speed, 6), is_tg_separate=int(options.separate_tg),
                model_filename=str(meta["paths"][s.model]), backend=s.backend, numerics=s.numerics, kv=row.kv,
                attn=s.attn, sparse_topk=s.sparse_topk, type_k=s.type_k, type_v=s.type_v)


def _print(rows: list[core.Row], runs: list[core.Setup], options: core.Options, meta: dict, output: str) -> None:
    records = [_record(r, options, meta) for r in rows]
    if output == "json":
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
    elif output == "jsonl":
        for record in records:
            sys.stdout.write(json.dumps(record) + "\n")
    elif output == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=LLAMA_FIELDS + ENGINE_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    elif rows:
        sys.stdout.write(_markdown(rows, runs, options, meta))


def _markdown(rows: list[core.Row], runs: list[core.Setup], options: core.Options, meta: dict) -> str:
    """llama-batched-bench's header line and table; where setups vary, a column per varying axis and
    the speed of each row over the first setup's for the same case."""
    first = rows[0]
    header = (f"main: n_kv_max = {first.n_kv_max}, n_batch = {options.n_batch}, n_ubatch = "
              f"{min(options.n_ubatch, options.n_batch)}, flash_attn = {meta['flash_attn']}, is_pp_shared = "
              f"{int(options.shared_prompt)}, is_tg_separate = {int(options.separate_tg)}, n_gpu_layers = "
              f"{meta['n_gpu_layers']}, n_threads = {first.n_threads}, n_threads_batch = {first.n_threads_batch}\n")
    backends = sorted({s.backend for s in runs})
    measured = f"measured on: {', '.join(backends)} — {cpu_name()}; " + "; ".join(get_backend(b).describe()
                                                                                    for b in backends) + "\n"
    varying = core.varying_axes(runs)
    axis_cols = [(name, max(len(name), *(len(str(_axis_value(r, name))) for r in rows))) for name in varying]
    columns = [(name, -width) for name, width in axis_cols] + COLUMNS
    if varying:
        columns += [("S_PP x", 7), ("S_TG x", 7)]
    base = {r.case: r for r in rows if r.setup == runs[0]}
    body = []
    for r in rows:
        cells = [str(_axis_value(r, name)) for name in varying]
        cells += [str(r.case.pp), str(r.case.tg), str(r.case.pl), str(r.n_kv), f"{r.t_pp:.3f}", f"{r.speed_pp:.2f}",
                  f"{r.t_tg:.3f}", f"{r.speed_tg:.2f}", f"{r.t:.3f}", f"{r.speed:.2f}"]
        if varying:
            ref = base.get(r.case)
            cells += [f"{r.speed_pp / ref.speed_pp:.2f}x" if ref else "-",
                      f"{r.speed_tg / ref.speed_tg:.2f}x" if ref and ref.speed_tg else "-"]
        body.append(cells)
    return "\n" + header + measured + "\n" + _table(columns, body) + "\n"


def _axis_value(row: core.Row, name: str):
    return row.kv if name == "kv" else getattr(row.setup, name)


def _table(columns: list[tuple[str, int]], body: list[list[str]]) -> str:
    """llama-batched-bench's layout: `|%6s | %6s | …|`, right-aligned; negative widths left-align."""
    def line(cells):
        parts = [f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w) in zip(cells, columns)]
        return "|" + " | ".join(parts) + " |"
    sep = "|" + "-|-".join("-" * abs(w) for _, w in columns) + "-|"
    return "\n".join([line([name for name, _ in columns]), sep] + [line(cells) for cells in body]) + "\n"
