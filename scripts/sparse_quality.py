"""What block top-k costs in quality: PPL, mean KLD and same-top-token share against dense attention
for a list of K on one text, as `llm perplexity` computes them (the dense run writes the base
log-probabilities; each K is compared with it under --attn sparse, so the selection always applies).

    python scripts/sparse_quality.py -m smollm2-135m -f tests/fixtures/hamlet.md -c 4096 -k 256,512,1024,2048

Prints a markdown table; --plot FILE also saves PPL change against K (needs matplotlib, which only
this script uses).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LLM = [sys.executable, "-m", "llmsuite.cli.main", "perplexity", "--no-progress", "-o", "json"]


def run(args: list[str]) -> dict:
    out = subprocess.run(LLM + args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip() or f"llm perplexity failed ({out.returncode})")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--chunks", type=int, default=-1)
    ap.add_argument("-k", "--topk", default="256,512,1024,2048", help="comma list of K")
    ap.add_argument("--block", default="16", help="comma list of block sizes")
    ap.add_argument("--local", type=int, default=-1, help="-1: min(128, K)")
    ap.add_argument("--layers", default="2-")
    ap.add_argument("--plot", type=Path, help="save PPL change against K as a PNG")
    a = ap.parse_args()
    common = ["-m", a.model, "-c", str(a.ctx_size), "--chunks", str(a.chunks)]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "dense.kld"
        dense = run(common + ["-f", a.file, "--kl-divergence-base", str(base)])
        rows = []
        for block in (int(v) for v in a.block.split(",")):
            for k in (int(v) for v in a.topk.split(",")):
                sparse = ["--sparse-topk", str(k), "--sparse-block", str(block), "--sparse-local", str(a.local),
                          "--sparse-layers", a.layers, "--attn", "sparse"]
                s = run(common + ["--kl-divergence-base", str(base), "--kl-divergence"] + sparse)["summary"]
                rows.append((block, k, s["ppl"], 100 * (s["ppl"] / dense["final"] - 1), s["kld"], 100 * s["same_top"]))
    print(f"{a.model}, {a.file}, -c {a.ctx_size}, --chunks {a.chunks}, local {a.local}, layers {a.layers}; "
          f"dense PPL {dense['final']:.4f}\n")
    print("| block | K | PPL | ΔPPL | mean KLD | same top |\n| --: | --: | --: | --: | --: | --: |")
    for block, k, ppl, delta, kld, top in rows:
        print(f"| {block} | {k} | {ppl:.4f} | {delta:+.2f}% | {kld:.5f} | {top:.2f}% |")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        for block in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == block]
            ax.plot([r[1] for r in mine], [r[3] for r in mine], marker="o", label=f"block {block}")
        ax.legend(fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("--sparse-topk K")
        ax.set_ylabel("PPL change vs dense (%)")
        ax.set_title(f"{a.model}, -c {a.ctx_size}")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
