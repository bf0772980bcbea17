"""llama.cpp and llmsuite side by side: llama-bench and `llm bench` on the same models and tests,
with the same thread count, in one run, and the ratio of their speeds.

    LLAMACPP_BIN=$(../shared/tools/build-llamacpp.sh) python scripts/vs_llamacpp.py [-t 2] [-r 3]
        [-m smollm2-135m,gemma3-270m,llama-3.2-1b:Q4_K_M] [--tests pp512,tg128,tg32@d4096,pp512@d4096]
        [--numerics ggml,f32] [--cache-types f16,q8_0,iq4_nl]

A model is a known name, a GGUF path, or PRESET:TYPE: a random-weight model of a real model's
shapes (scripts/random_model.py's presets, e.g. llama-3.2-1b or qwen3-1.7b) quantized to TYPE by
llama-quantize, made once and kept in $LLMSUITE_HOME/random/.

The tools alternate test by test (llama.cpp, then llmsuite), so a machine whose speed drifts
affects both sides of a ratio alike. Threads: llama-bench's -t; for llmsuite, numba's and BLAS's
thread counts through the environment. `--cache-types` runs each test with each KV-cache type on
both sides (-ctk and -ctv alike; llama-bench's flash attention on, which a quantized V cache needs).
Prints a markdown table (ratio = llmsuite / llama.cpp).

`--attn dense,sparse` compares llmsuite's attention paths instead (one numerics, one cache type): the
tests at one depth run in one call per tool, so each tool fills a depth once (llama-bench keeps its
state between tests, llm bench between paths), and each row gives llama.cpp, both paths, sparse over
dense and each path over llama.cpp (llama.cpp's CPU flash attention walks every cell of a row, its
`n_kv_max` hint unread: dense):

    python scripts/vs_llamacpp.py -m deepseek-v4-flash:Q4_K_M --attn dense,sparse -r 2 \\
        --tests pp2048@d0,tg32@d0,pp2048@d4096,tg32@d4096
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from llmsuite.core.hub import home, resolve_model

SPEC = re.compile(r"(pp|tg)(\d+)(?:@d(\d+))?$")


def llama_bench(bin_dir: Path, model: Path, test: str, threads: int, reps: int, cache: str) -> float | None:
    kind, n, depth = SPEC.match(test).groups()
    sizes = ["-p", n, "-n", "0"] if kind == "pp" else ["-p", "0", "-n", n]
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), *sizes, "-d", depth or "0", "-t", str(threads),
           "-r", str(reps), "-o", "json", "-ctk", cache, "-ctv", cache, "-fa", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return None  # a case llama.cpp cannot run here (bf16 caches died of SIGILL on one VM)
    return float(json.loads(done.stdout)[0]["avg_ts"])


def llm_bench(model: str, test: str, threads: int, reps: int, numerics: str, cache: str) -> float:
    env = {**os.environ, **{k: str(threads) for k in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                      "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    cmd = [sys.executable, "-m", "llmsuite.cli.main", "bench", "-m", model, test, "-r", str(reps), "-o", "json",
           "--no-progress", "--numerics", numerics, "-ctk", cache, "-ctv", cache]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    return float(rows[0]["avg_ts"])


def by_depth(tests: list[str]) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for test in tests:
        groups.setdefault(int(SPEC.match(test).group(3) or 0), []).append(test)
    return groups


def test_name(n_prompt: int, n_gen: int) -> str:
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def llama_bench_depth(bin_dir: Path, model: Path, tests: list[str], depth: int, threads: int, reps: int,
                      cache: str) -> dict[str, float]:
    """t/s per test (its name without the depth) of one llama-bench call at one depth."""
    specs = [SPEC.match(t).groups() for t in tests]
    pp = ",".join(n for kind, n, _ in specs if kind == "pp") or "0"
    tg = ",".join(n for kind, n, _ in specs if kind == "tg") or "0"
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", pp, "-n", tg, "-d", str(depth), "-t", str(threads),
           "-r", str(reps), "-o", "json", "-ctk", cache, "-ctv", cache, "-fa", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {}
    return {test_name(r["n_prompt"], r["n_gen"]): float(r["avg_ts"]) for r in json.loads(done.stdout)}


def llm_bench_paths(model: str, tests: list[str], threads: int, reps: int, numerics: str, cache: str,
                    paths: list[str]) -> dict[tuple[str, str], float]:
    """t/s per (test without the depth, attention path) of one `llm bench` call."""
    env = {**os.environ, **{k: str(threads) for k in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                      "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    cmd = [sys.executable, "-m", "llmsuite.cli.main", "bench", "-m", model, *tests, "-r", str(reps), "-o", "json",
           "--no-progress", "--numerics", numerics, "-ctk", cache, "-ctv", cache, "--attn", ",".join(paths)]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    return {(test_name(r["n_prompt"], r["n_gen"]), r["attn"]): float(r["avg_ts"]) for r in rows}


def compare_paths(args, bin_dir: Path, paths: list[str]) -> None:
    """The --attn table: per model, depth and test, llama.cpp and each of llmsuite's paths."""
    first, *rest = paths
    cols = "".join(f" llmsuite {p} t/s |" for p in paths) + "".join(f" {p} / {first} |" for p in rest) + \
        "".join(f" {p} / llama.cpp |" for p in paths)
    print(f"| model | test | llama.cpp t/s |{cols}  (-t {args.threads}, -r {args.repetitions}, {args.numerics}, "
          f"{args.cache_types})")
    print("| --- | --- | ---: |" + " ---: |" * (len(paths) * 3 - 1))
    for name in args.models.split(","):
        path = model_path(name, bin_dir)
        for depth, tests in by_depth(args.tests.split(",")).items():
            ref = llama_bench_depth(bin_dir, path, tests, depth, args.threads, args.repetitions, args.cache_types)
            ours = llm_bench_paths(str(path), tests, args.threads, args.repetitions, args.numerics, args.cache_types,
                                   paths)
            for test in tests:
                base = test.split("@")[0]
                speeds = [ours[(base, p)] for p in paths]
                cells = "".join(f" {v:.2f} |" for v in speeds) + "".join(f" {v / speeds[0]:.2f}x |" for v in speeds[1:])
                cells += "".join(f" {v / ref[base]:.2f}x |" if base in ref else " - |" for v in speeds)
                reference = f"{ref[base]:.2f}" if base in ref else "failed"
                print(f"| {name} | {test} | {reference} |{cells}", flush=True)


def model_path(name: str, bin_dir: Path) -> Path:
    """A known name or path as `llm` resolves it; PRESET:TYPE made (once) with random_model.py."""
    if ":" not in name:
        return resolve_model(name)
    preset, file_type = name.split(":", 1)
    path = home() / "random" / f"{preset}-{file_type}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"(making {path.name} with llama-quantize)", file=sys.stderr, flush=True)
        script = Path(__file__).with_name("random_model.py")
        subprocess.run([sys.executable, str(script), preset, str(path), "--quantize", file_type], check=True,
                       env={**os.environ, "LLAMACPP_BIN": str(bin_dir)})
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--tests", default="pp512,tg128,tg32@d4096,pp512@d4096")
    ap.add_argument("--numerics", default="ggml", help="llmsuite's numerics, a column each: ggml, f32 or ggml,f32")
    ap.add_argument("--cache-types", default="f16", help="KV-cache types, a row each (both tools' -ctk and -ctv)")
    ap.add_argument("--attn", help="llmsuite's attention paths side by side (dense,sparse): one numerics and cache type")
    args = ap.parse_args()
    numerics = args.numerics.split(",")
    bin_dir = os.environ.get("LLAMACPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-bench").exists():
        sys.exit("error: set LLAMACPP_BIN to the folder of llama-bench (../shared/tools/build-llamacpp.sh prints it)")
    if args.attn:
        if len(numerics) > 1 or "," in args.cache_types:
            sys.exit("error: --attn compares attention paths under one --numerics and one --cache-types")
        compare_paths(args, Path(bin_dir), args.attn.split(","))
        return
    ours_cols = "".join(f" llmsuite {n} t/s | ratio {n} |" for n in numerics)
    print(f"| model | test | cache | llama.cpp t/s |{ours_cols}  (-t {args.threads}, -r {args.repetitions})")
    print("| --- | --- | --- | ---: |" + " ---: | ---: |" * len(numerics))
    for name in args.models.split(","):
        path = model_path(name, Path(bin_dir))
        for test in args.tests.split(","):
            if not SPEC.match(test):
                sys.exit(f"error: test '{test}' is not ppN, tgN, ppN@dD or tgN@dD")
            for cache in args.cache_types.split(","):
                ref = llama_bench(Path(bin_dir), path, test, args.threads, args.repetitions, cache)
                cells = ""
                for n in numerics:
                    ours = llm_bench(str(path), test, args.threads, args.repetitions, n, cache)
                    cells += f" {ours:.1f} | {'-' if ref is None else f'{ours / ref:.2f}x'} |"
                print(f"| {name} | {test} | {cache} | {'failed' if ref is None else f'{ref:.1f}'} |{cells}", flush=True)


if __name__ == "__main__":
    main()
