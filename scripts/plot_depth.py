#!/usr/bin/env python3
"""Plot tokens/s against depth, one line per model, from `llm bench -o json` (an SVG, no plotting
library needed):

    llm bench -m a.gguf -m b.gguf -p 0 -n 32 -d 0,2048,8192 -o json > depth.json
    python scripts/plot_depth.py depth.json docs/hybrid-depth.svg [--title "tg32 against depth"]

Each record's `model_type` names its line; `n_depth` is x and `avg_ts` (± `stddev_ts`) is y.
"""

from __future__ import annotations

import argparse
import json
from html import escape
from pathlib import Path

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def lines_of(records: list[dict]) -> dict[str, list[tuple[int, float, float]]]:
    """model → [(depth, t/s, stddev)] sorted by depth."""
    lines: dict[str, list[tuple[int, float, float]]] = {}
    for r in records:
        lines.setdefault(r["model_type"], []).append((int(r["n_depth"]), float(r["avg_ts"]), float(r["stddev_ts"])))
    return {name: sorted(points) for name, points in lines.items()}


def svg(lines: dict[str, list[tuple[int, float, float]]], title: str) -> str:
    x_max = max(d for points in lines.values() for d, _, _ in points) or 1
    y_max = max(t + s for points in lines.values() for _, t, s in points) * 1.1
    x = lambda d: LEFT + (WIDTH - LEFT - RIGHT) * d / x_max  # noqa: E731
    y = lambda t: HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * t / y_max  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
           'font-size="12">', f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<line x1="{LEFT}" y1="{y(0)}" x2="{WIDTH - RIGHT}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{LEFT}" y1="{y(0)}" x2="{LEFT}" y2="{TOP}" stroke="black"/>',
           f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 12}" text-anchor="middle">depth (tokens in the '
           'context)</text>',
           f'<text x="16" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" '
           f'transform="rotate(-90 16 {(TOP + HEIGHT - BOTTOM) / 2})">tokens/s</text>']
    depths = sorted({d for points in lines.values() for d, _, _ in points})
    for d in depths:
        out.append(f'<text x="{x(d):.1f}" y="{y(0) + 16}" text-anchor="middle">{d}</text>')
    for k in range(6):
        t = y_max / 1.1 * k / 5
        out.append(f'<line x1="{LEFT - 4}" y1="{y(t):.1f}" x2="{WIDTH - RIGHT}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y(t) + 4:.1f}" text-anchor="end">{t:.0f}</text>')
    for i, (name, points) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(d):.1f},{y(t):.1f}" for d, t, _ in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for d, t, s in points:
            out.append(f'<circle cx="{x(d):.1f}" cy="{y(t):.1f}" r="3" fill="{colour}"/>')
            if s > 0:
                out.append(f'<line x1="{x(d):.1f}" y1="{y(t - s):.1f}" x2="{x(d):.1f}" y2="{y(t + s):.1f}" '
                           f'stroke="{colour}"/>')
        legend_y = TOP + 20 * i
        out.append(f'<line x1="{WIDTH - RIGHT + 15}" y1="{legend_y}" x2="{WIDTH - RIGHT + 35}" y2="{legend_y}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 40}" y="{legend_y + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--title", default="tokens/s against depth")
    args = ap.parse_args()
    records = json.loads(args.bench_json.read_text())
    args.out.write_text(svg(lines_of(records), args.title))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
