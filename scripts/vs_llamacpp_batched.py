"""llama-batched-bench and `llm batched-bench` side by side: the same model, prompt and generation
lengths, sequence counts and thread count, one KV layout at a time, and the ratio of each speed.

    LLAMACPP_BIN=$(../shared/tools/build-llamacpp.sh) python scripts/vs_llamacpp_batched.py [-t 2] [-r 1]
        [-m smollm2-135m,llama-3.2-1b:Q4_K_M] [-npp 128] [-ntg 64] [-npl 1,2,4,8,16] [-c 4096]
        [--kv unified,split]

Models as in vs_llamacpp.py (a known name, a path, or PRESET:TYPE made by random_model.py). --kv
unified is llama.cpp's -kvu, split its default (a stream per sequence). The tools alternate
sequence count by sequence count (llama.cpp, then llmsuite, -r times; the median of each kept),
so a machine whose speed drifts affects both sides of a ratio alike. Prints a markdown table,
ratio = llmsuite / llama.cpp; the T columns' ratios are the inverses of the S columns'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vs_llamacpp import model_path  # noqa: E402

SPEEDS = ("speed_pp", "speed_tg", "speed")


def thread_env(threads: int) -> dict:
    return {**os.environ, **{k: str(threads) for k in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                       "OMP_NUM_THREADS", "MKL_NUM_THREADS")}}


def llama_row(bin_dir: Path, model: Path, args, kv: str, pl: int) -> dict:
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(model), "-npp", args.npp, "-ntg", args.ntg,
           "-npl", str(pl), "-c", str(args.ctx), "-t", str(args.threads), "--output-format", "jsonl"]
    cmd += ["-kvu"] if kv == "unified" else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def llm_row(model: Path, args, kv: str, pl: int) -> dict:
    cmd = [sys.executable, "-m", "llmsuite.cli.main", "batched-bench", "-m", str(model), "-npp", args.npp,
           "-ntg", args.ntg, "-npl", str(pl), "-c", str(args.ctx), "-t", str(args.threads), "--kv", kv,
           "-o", "jsonl", "--no-progress"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=thread_env(args.threads)).stdout
    return json.loads(out.splitlines()[0])


def median_speeds(rows: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in rows) for key in SPEEDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=1)
    ap.add_argument("-m", "--models", default="smollm2-135m")
    ap.add_argument("-npp", default="128")
    ap.add_argument("-ntg", default="64")
    ap.add_argument("-npl", default="1,2,4,8,16")
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--kv", default="unified,split")
    args = ap.parse_args()
    bin_dir = os.environ.get("LLAMACPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-batched-bench").exists():
        sys.exit("error: set LLAMACPP_BIN to the folder of llama-batched-bench (../shared/tools/build-llamacpp.sh)")
    print(f"-npp {args.npp} -ntg {args.ntg} -c {args.ctx} -t {args.threads}, median of {args.repetitions}\n")
    print("| model | kv | B | llama.cpp S_PP | llmsuite S_PP | ratio | llama.cpp S_TG | llmsuite S_TG | ratio "
          "| llama.cpp S | llmsuite S | ratio |")
    print("| --- | --- | ---: |" + " ---: |" * 9)
    for name in args.models.split(","):
        path = model_path(name, Path(bin_dir))
        for kv in args.kv.split(","):
            for pl in (int(b) for b in args.npl.split(",")):
                theirs, ours = [], []
                for _ in range(args.repetitions):
                    theirs.append(llama_row(Path(bin_dir), path, args, kv, pl))
                    ours.append(llm_row(path, args, kv, pl))
                ref, got = median_speeds(theirs), median_speeds(ours)
                cells = "".join(f" {ref[k]:.1f} | {got[k]:.1f} | {got[k] / ref[k]:.2f}x |" for k in SPEEDS)
                print(f"| {name} | {kv} | {pl} |{cells}", flush=True)


if __name__ == "__main__":
    main()
