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
    args = ap.parse_args()
    numerics = args.numerics.split(",")
    bin_dir = os.environ.get("LLAMACPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-bench").exists():
        sys.exit("error: set LLAMACPP_BIN to the folder of llama-bench (../shared/tools/build-llamacpp.sh prints it)")
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
