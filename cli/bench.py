"""`llm bench`: llama-bench for this engine — pp/tg at depth, sweeps, md/csv/json/jsonl."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from llmsuite.core import bench as core
from llmsuite.core.backend import BACKENDS, NUMERICS, get_backend
from llmsuite.core.context import ContextParams
from llmsuite.core.plan import ATTN_PATHS
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.memory import CACHE_TYPES, kv_choices, mask_choices
from llmsuite.core.memory.factory import ATTN_IMPLS
from llmsuite.core.memory.masks import SparseParams
from llmsuite.core.models import load_model

from . import options as opt
from .common import err_console, exit_interrupted, log, resolve

ListOpt = Optional[list[str]]
OUTPUTS = ("md", "csv", "json", "jsonl")
FIELDS = ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
          "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "kv", "attn_impl",
          "attn", "attn_mask", "kv_budget", "numerics", "sparse_topk", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts"]
DISPLAY = {"n_batch": ("n_batch", 7), "n_ubatch": ("n_ubatch", 8), "type_k": ("type_k", 6), "type_v": ("type_v", 6),
           "kv": ("kv", -8), "attn_impl": ("attn_impl", -9), "attn": ("attn", -6), "backend": ("backend", -10),
           "sparse_topk": ("sparse_topk", 11), "numerics": ("numerics", -8), "attn_mask": ("attn_mask", -9)}


def bench(
    specs: Annotated[Optional[list[str]], typer.Argument(help="tests: pp512 tg128 pp512+tg128 pp2048@d32768")] = None,
    model: Annotated[ListOpt, typer.Option("-m", "--model", help="models (comma list or repeated)")] = None,
    n_prompt: Annotated[ListOpt, typer.Option("-p", "--n-prompt", help="prompt lengths (lists, ranges)")] = None,
    n_gen: Annotated[ListOpt, typer.Option("-n", "--n-gen", help="generation lengths")] = None,
    pg: Annotated[ListOpt, typer.Option("-pg", help="pp,tg pairs")] = None,
    depth: Annotated[ListOpt, typer.Option("-d", "--n-depth", help="depths for -p/-n/-pg tests")] = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions")] = 5,
    batch: Annotated[ListOpt, typer.Option("-b", "--batch-size")] = None,
    ubatch: Annotated[ListOpt, typer.Option("-ub", "--ubatch-size")] = None,
    cache_type_k: Annotated[ListOpt, typer.Option("-ctk", "--cache-type-k")] = None,
    cache_type_v: Annotated[ListOpt, typer.Option("-ctv", "--cache-type-v")] = None,
    kv: Annotated[ListOpt, typer.Option("--kv", help="memory classes, a comma list of <kv-kinds>")] = None,
    attn: Annotated[ListOpt, typer.Option("--attn", help=f"attention paths: {','.join(ATTN_PATHS)}")] = None,
    attn_impl: Annotated[ListOpt, typer.Option("--attn-impl", help="latent attention (deepseek2): mla,naive")] = None,
    backend: Annotated[ListOpt, typer.Option("--backend", help="backends: cpu,cuda,cuda-emu")] = None,
    numerics: Annotated[ListOpt, typer.Option("--numerics", help="ggml,f32 (default: ggml on the cpu, ggml-cpu's "
                                              "8-bit activations and integer dots; f32 the float reference)")] = None,
    threads: Annotated[ListOpt, typer.Option("-t", "--threads", help="thread counts (the cpu backend)")] = None,
    gpu_layers: opt.GpuLayers = None,
    flash_attn: Annotated[str, typer.Option("-fa", "--flash-attn", help="0|1 (or off|on|auto), a comma list "
                          "as llama-bench's: 0 runs attention on the dense path (a list sweeps --attn dense,auto)")] = "auto",
    no_kv_offload: Annotated[Optional[str], typer.Option("-nkvo", "--no-kv-offload", help="llama-bench's 0|1 list "
                             "(no effect here: the cache lives with its backend)")] = None,
    mmap: Annotated[Optional[str], typer.Option("-mmp", "--mmap", help="llama-bench's 0|1 (no effect here: the GGUF "
                    "is mapped)")] = None,
    device: opt.Device = None,
    split_mode: opt.SplitMode = None,
    main_gpu: opt.MainGpu = None,
    verbose: opt.Verbose = False,
    sparse_topk: Annotated[ListOpt, typer.Option("--sparse-topk", help="block top-k sizes K (0: dense), e.g. 0,1024")] = None,
    sparse_block: opt.SparseBlock = opt.SPARSE.block,
    sparse_local: opt.SparseLocal = opt.SPARSE.local,
    sparse_layers: opt.SparseLayers = opt.SPARSE.layers,
    attn_mask: Annotated[ListOpt, typer.Option("--attn-mask", help="mask producers, a comma list of <attn-masks>")] = None,
    kv_budget: opt.KvBudget = 0,
    no_warmup: Annotated[bool, typer.Option("--no-warmup")] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="md, csv, json or jsonl")] = "md",
    output_err: Annotated[Optional[str], typer.Option("-oe", "--output-err", help="the results on stderr too, in "
                          "md, csv, json or jsonl (llama-bench's)")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress on stderr")] = True,
) -> None:
    """Measure prompt processing and generation speed (llama-bench)."""
    opt.verbose_flag(verbose)
    fas = [_flash_attn(v) for v in core.parse_str_list(flash_attn)]
    if len(fas) > 1:  # llama-bench sweeps -fa: here the attention path is the axis
        if attn:
            raise InvalidInputError("-fa with several values sweeps the attention path: drop --attn or give one -fa")
        attn = [",".join(dict.fromkeys("dense" if fa == "off" else "auto" for fa in fas))]
    elif opt.llama_cpp_flags("auto", gpu_layers, fas[0], device, split_mode, main_gpu, mmap is not None) == "dense" \
            and not attn:
        attn = ["dense"]
    if no_kv_offload is not None:
        core.parse_str_list(no_kv_offload)
        log("note: -nkvo has no effect here (the KV cache lives with its backend)")
    for flag, fmt in (("-o", output), ("-oe", output_err)):
        if fmt is not None and fmt not in OUTPUTS:
            raise InvalidInputError(f"unknown {flag} output format '{fmt}' (md, csv, json or jsonl)")
    if repetitions < 1:
        raise InvalidInputError("-r must be at least 1")
    tests = _tests(specs, n_prompt, n_gen, pg, depth)
    axes = _axes(batch, ubatch, cache_type_k, cache_type_v, kv, attn, backend)
    axes["sparse_topk"] = _ints(sparse_topk, "--sparse-topk")
    axes["n_threads"] = _ints(threads, "-t")
    axes["attn_impl"] = _strs(attn_impl, ATTN_IMPLS, "--attn-impl")
    axes["numerics"] = _strs(numerics, NUMERICS, "--numerics")
    axes["attn_mask"] = _strs(attn_mask, mask_choices(), "--attn-mask")
    if any(t < 1 for t in axes["n_threads"]):
        raise InvalidInputError("-t takes thread counts of at least 1")
    sparse = SparseParams(0, sparse_block, sparse_local, sparse_layers)
    for k in axes["sparse_topk"] or [0]:
        ContextParams(sparse=replace(sparse, topk=k), kv_budget=kv_budget).validate()  # refused before any model loads
    models = [m for value in (model or ["smollm2-135m"]) for m in core.parse_str_list(value)]
    paths = {m: resolve(m) for m in models}
    runs = core.instances(models, tests, axes, sparse=sparse, kv_budget=kv_budget)
    results, notes, stopped_at = _run_all(runs, paths, repetitions, not no_warmup, progress)
    if not results and stopped_at is None:  # one sentence: why the first run could not start
        raise InvalidInputError(notes[0].removeprefix("skipped: ") if notes else "nothing to run")
    for note in notes:
        err_console.print(note, markup=False)
    _print_results(results, paths, output)
    if output_err:
        _print_results(results, paths, output_err, sys.stderr)
    if stopped_at is not None:
        exit_interrupted(f"during test {stopped_at + 1} of {len(runs)} ({runs[stopped_at].test.name}); "
                         f"the results are the {len(results)} tests done before it")


def _flash_attn(value: str) -> str:
    fa = {"0": "off", "1": "on"}.get(value, value)
    if fa not in opt.FA_VALUES:
        raise InvalidInputError(f"-fa takes 0, 1, on, off or auto (a comma list), not '{value}'")
    return fa


def _print_results(results: list[core.Result], paths: dict, output: str, stream=None) -> None:
    stream = stream or sys.stdout
    if not results and output not in ("json", "jsonl"):
        return
    rows = [_fields(r, paths) for r in results]
    if output == "md":
        stream.write(_markdown(results, rows))
    elif output == "json":
        stream.write(json.dumps([{**row, "samples_ns": r.samples_ns, "samples_ts": [round(t, 6) for t in r.samples_ts]}
                                 for r, row in zip(results, rows)], indent=2) + "\n")
    elif output == "jsonl":
        for r, row in zip(results, rows):
            stream.write(json.dumps({**row, "samples_ns": r.samples_ns, "samples_ts": r.samples_ts}) + "\n")
    else:
        names = FIELDS + ["backend", "device"]
        stream.write(",".join(names) + "\n")  # llama-bench: bare names, then every value quoted
        csv.DictWriter(stream, fieldnames=names, quoting=csv.QUOTE_ALL).writerows(rows)


def _tests(specs, n_prompt, n_gen, pg, depth) -> list[core.Test]:
    tests = [core.parse_spec(s) for s in specs or []]
    explicit = n_prompt or n_gen or pg
    if not tests and not explicit:
        n_prompt, n_gen = ["512"], ["128"]
    depths = _ints(depth, "-d") or [0]
    for d in depths:  # llama-bench: -p tests, then -n, then -pg, for every depth
        tests += [core.Test(p, 0, d) for p in _ints(n_prompt, "-p") if p > 0]
        tests += [core.Test(0, n, d) for n in _ints(n_gen, "-n") if n > 0]
        for pair in pg or []:
            values = _ints([pair], "-pg")
            if len(values) != 2:
                raise InvalidInputError(f"-pg '{pair}' needs exactly two numbers: prompt,generation")
            if values != [0, 0]:
                tests.append(core.Test(values[0], values[1], d))
    if not tests:
        raise InvalidInputError("no test to run (every length given is 0)")
    return tests


def _ints(values, flag) -> list[int]:
    return [n for v in values or [] for n in core.parse_int_list(v, flag)]


def _strs(values, allowed, flag) -> list[str]:
    out = [s for v in values or [] for s in core.parse_str_list(v)]
    for s in out:
        if s not in allowed:
            raise InvalidInputError(f"unknown {flag} value '{s}' (choose from {', '.join(allowed)})")
    return out


def _axes(batch, ubatch, ctk, ctv, kv, attn, backend) -> dict[str, list]:
    return dict(n_batch=_ints(batch, "-b"), n_ubatch=_ints(ubatch, "-ub"), type_k=_strs(ctk, CACHE_TYPES, "-ctk"),
                type_v=_strs(ctv, CACHE_TYPES, "-ctv"), kv=_strs(kv, kv_choices(), "--kv"),
                attn=_strs(attn, ATTN_PATHS, "--attn"), backend=_strs(backend, BACKENDS, "--backend"))


def _run_all(runs, paths, repetitions, warmup, show_progress):
    results, notes, warned = [], [], set()
    # one runner for the sweep, so a depth prefilled for one instance is restored for the next
    runner = core.Runner(core.loader(paths), repetitions, warmup,
                         on_warning=lambda message: _warn_once(message, warned))
    enabled = show_progress and err_console.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not enabled) as bar:
        task = bar.add_task("bench", total=len(runs))
        for i, inst in enumerate(runs):
            label = f"bench {i + 1}/{len(runs)}: {inst.test.name}"
            runner.on_event = lambda event, label=label: bar.update(task, description=f"{label} {event}")
            try:
                get_backend(inst.backend)
                results.append(runner.run(inst))
            except InvalidInputError as e:
                notes.append(f"skipped: {_describe(inst)}: {e}")
            except KeyboardInterrupt:  # the test under way is dropped; those done are reported
                return results, notes, i
            bar.advance(task)
    return results, notes, None


def _warn_once(message: str, warned: set) -> None:
    if message not in warned:
        warned.add(message)
        err_console.print(f"warning: {message}", markup=False)


def _describe(inst: core.Instance) -> str:
    axes = ", ".join(f"{name}={getattr(inst, name)}" for name in core.AXES)
    return f"{inst.model} {inst.test.name} ({axes})"


@lru_cache(maxsize=None)
def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _fields(r: core.Result, paths) -> dict:
    inst = r.instance
    model = load_model_meta(paths[inst.model])
    device = get_backend(inst.backend).describe()
    return dict(build_commit=_commit(), build_number=0, cpu_info=core.cpu_name(),
                gpu_info=device if inst.backend == "cuda" else "", backends=inst.backend.upper(),
                model_filename=str(paths[inst.model]), model_type=model["desc"], model_size=model["size"],
                model_n_params=model["n_params"], n_batch=inst.n_batch, n_ubatch=inst.n_ubatch,
                n_threads=inst.threads, type_k=inst.type_k, type_v=inst.type_v, kv=inst.kv, attn_impl=inst.attn_impl,
                attn=inst.attn, attn_mask=inst.attn_mask, kv_budget=inst.kv_budget, numerics=inst.numerics,
                sparse_topk=inst.sparse_topk,
                n_prompt=inst.test.n_prompt, n_gen=inst.test.n_gen, n_depth=inst.test.n_depth,
                test_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), avg_ns=r.avg_ns,
                stddev_ns=r.stddev_ns, avg_ts=round(r.avg_ts, 6), stddev_ts=round(r.stddev_ts, 6),
                backend=inst.backend, device=device)


@lru_cache(maxsize=None)
def load_model_meta(path: Path) -> dict:
    model = load_model(path)
    return dict(desc=model.desc, size=model.size_bytes, n_params=model.n_params)


# ---- markdown ---------------------------------------------------------------------------------

def _markdown(results: list[core.Result], rows: list[dict]) -> str:
    runs = [r.instance for r in results]
    varying = core.varying_axes(runs)
    backends = sorted({r.backend for r in runs})
    header = (f"measured on: {', '.join(backends)} — {core.cpu_name()}, {core.blas_threads()} BLAS threads, "
              + "; ".join(get_backend(b).describe() for b in backends) + "\n\n")
    table = _pivot(results, rows, varying[0]) if len(varying) == 1 else _plain(results, rows, varying)
    return header + table + f"\nbuild: {_commit()} (llmsuite)\n"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _table(columns: list[tuple[str, int]], body: list[list[str]]) -> str:
    """llama-bench's md: negative widths left-align; the separator ends with ':' when right-aligned."""
    def line(cells):
        return "| " + " | ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w) in zip(cells, columns)) + " |"
    sep = "| " + " | ".join("-" * (abs(w) - 1) + (":" if w > 0 else "-") for _, w in columns) + " |"
    return "\n".join([line([name for name, _ in columns]), sep] + [line(cells) for cells in body]) + "\n"


def _model_cells(row: dict) -> list[str]:
    return [row["model_type"], _size(row["model_size"]), _params(row["model_n_params"])]


def _plain(results, rows, varying) -> str:
    shown = [a for a in ("n_batch", "n_ubatch", "type_k", "type_v", "kv", "attn_impl", "attn", "attn_mask", "sparse_topk",
                         "numerics")
             if a in varying or
             any(getattr(r.instance, a) != getattr(core.Instance, a) for r in results)]
    columns = [("model", -30), ("size", 10), ("params", 10), ("backend", -10), ("threads", 7)]
    columns += [DISPLAY[a] for a in shown] + [("test", 15), ("t/s", 20)]
    body = [_model_cells(row) + [r.instance.backend, str(row["n_threads"])] + [str(getattr(r.instance, a)) for a in shown]
            + [r.instance.test.name, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"] for r, row in zip(results, rows)]
    return _table(columns, body)


def _pivot(results, rows, axis: str) -> str:
    """One axis varies: one row per model and test, t/s per value of the axis, speedup against the first."""
    values = list(dict.fromkeys(getattr(r.instance, axis) for r in results))
    groups: dict[tuple, dict] = {}
    for r, row in zip(results, rows):
        key = (r.instance.model, r.instance.test.name)
        groups.setdefault(key, {"row": row, "backend": r.instance.backend, "ts": {}})["ts"][getattr(r.instance, axis)] = r
    columns = [("model", -30), ("size", 10), ("params", 10)] + ([("backend", -10)] if axis != "backend" else [])
    columns += [("test", 15)] + [(f"t/s {axis}={v}", max(20, len(f"t/s {axis}={v}"))) for v in values]
    columns += [(f"speedup {v}", max(10, len(f"speedup {v}"))) for v in values[1:]]
    body = []
    for (_, test), g in groups.items():
        ts = g["ts"]
        cells = _model_cells(g["row"]) + ([g["backend"]] if axis != "backend" else []) + [test]
        cells += [f"{ts[v].avg_ts:.2f} ± {ts[v].stddev_ts:.2f}" if v in ts else "-" for v in values]
        first = ts.get(values[0])
        cells += [f"{ts[v].avg_ts / first.avg_ts:.2f}x" if first and v in ts else "-" for v in values[1:]]
        body.append(cells)
    return _table(columns, body)
