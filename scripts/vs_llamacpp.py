"""llama.cpp and llmsuite side by side: llama-bench and `llm bench` on the same models and tests,
with the same thread count, in one run, and the ratio of their speeds.

    LLAMACPP_BIN=$(../shared/tools/build-llamacpp.sh) python scripts/vs_llamacpp.py [-t 2] [-r 3]
        [-m smollm2-135m,gemma3-270m] [--tests pp512,tg128,tg32@d4096,pp512@d4096] [--numerics f32,ggml]

The tools alternate test by test (llama.cpp, then llmsuite), so a machine whose speed drifts
affects both sides of a ratio alike. Threads: llama-bench's -t; for llmsuite, numba's and BLAS's
thread counts through the environment. Prints a markdown table (ratio = llmsuite / llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from llmsuite.core.hub import resolve_model

SPEC = re.compile(r"(pp|tg)(\d+)(?:@d(\d+))?$")


def llama_bench(bin_dir: Path, model: Path, test: str, threads: int, reps: int) -> float:
    kind, n, depth = SPEC.match(test).groups()
    sizes = ["-p", n, "-n", "0"] if kind == "pp" else ["-p", "0", "-n", n]
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), *sizes, "-d", depth or "0", "-t", str(threads),
           "-r", str(reps), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return float(rows[0]["avg_ts"])


def llm_bench(model: str, test: str, threads: int, reps: int, numerics: str) -> float:
    env = {**os.environ, **{k: str(threads) for k in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                      "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    cmd = [sys.executable, "-m", "llmsuite.cli.main", "bench", "-m", model, test, "-r", str(reps), "-o", "json",
           "--no-progress", "--numerics", numerics]
    rows = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    return float(rows[0]["avg_ts"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--tests", default="pp512,tg128,tg32@d4096,pp512@d4096")
    ap.add_argument("--numerics", default="f32", help="llmsuite's numerics, a column each: f32, ggml or f32,ggml")
    args = ap.parse_args()
    numerics = args.numerics.split(",")
    bin_dir = os.environ.get("LLAMACPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-bench").exists():
        sys.exit("error: set LLAMACPP_BIN to the folder of llama-bench (../shared/tools/build-llamacpp.sh prints it)")
    ours_cols = "".join(f" llmsuite {n} t/s | ratio {n} |" for n in numerics)
    print(f"| model | test | llama.cpp t/s |{ours_cols}  (-t {args.threads}, -r {args.repetitions})")
    print("| --- | --- | ---: |" + " ---: | ---: |" * len(numerics))
    for name in args.models.split(","):
        path = resolve_model(name)
        for test in args.tests.split(","):
            if not SPEC.match(test):
                sys.exit(f"error: test '{test}' is not ppN, tgN, ppN@dD or tgN@dD")
            ref = llama_bench(Path(bin_dir), path, test, args.threads, args.repetitions)
            cells = ""
            for n in numerics:
                ours = llm_bench(name, test, args.threads, args.repetitions, n)
                cells += f" {ours:.1f} | {ours / ref:.2f}x |"
            print(f"| {name} | {test} | {ref:.1f} |{cells}", flush=True)


if __name__ == "__main__":
    main()
