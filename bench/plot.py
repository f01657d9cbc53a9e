#!/usr/bin/env python3
"""Draws the benchmarks' JSON results (`--json FILE` of any bench/bench_*.py) as PNG charts.

    /usr/bin/python3 bench/plot.py results/*.json --out bench/plots

One chart per input, named after its benchmark: a bar per figure, the ratio as the benchmark
printed it, a line at 1.0 (the baseline's own speed) and a mark at the issue's goal where there is
one. A bar is green where it meets its goal, red where it misses it, grey where the figure has no
goal. Needs Debian's python3-matplotlib.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

TITLES = {
    "fs": "Through the mount vs a plain directory (throughput ratio)",
    "remote": "Cold restore and upload vs boto3 (time or throughput ratio)",
    "tiers": "Restore from the near tier vs the far tier and plain",
    "reshard": "Megatron views vs offline resharding (time ratio)",
    "ds_universal": "DeepSpeed universal view vs offline conversion (time ratio)",
    "dedup": "Stored bytes / unique bytes",
    "gpu_load": "ckptfs_gpu.load vs torch.load (throughput ratio)",
}


def color(fig):
    """Green where the figure meets its goal, red where it misses it, grey where it has none."""
    goal = fig.get("goal")
    if goal is None:
        return "#7f8c8d"
    met = fig["ratio"] >= goal if fig["better"] == "higher" else fig["ratio"] <= goal
    return "#3a9a4a" if met else "#c0392b"


def draw(doc, path):
    figs = doc["figures"]
    if not figs:
        raise ValueError(f"{doc['bench']}: no figures to draw")
    labels = [f"{f['figure']}\n{f['subject']} / {f['baseline']}, "
              f"{'higher' if f['better'] == 'higher' else 'lower'} is better" for f in figs]
    ratios = [f["ratio"] for f in figs]
    fig, ax = plt.subplots(figsize=(8, 0.9 * len(figs) + 1.6))
    ys = list(range(len(figs)))[::-1]
    ax.barh(ys, ratios, color=[color(f) for f in figs], height=0.6)
    ax.axvline(1.0, color="black", linewidth=1)
    for y, f in zip(ys, figs):
        ax.text(f["ratio"], y, f" {f['ratio']:.2f}", va="center", fontsize=9)
        if f.get("goal") is not None:
            ax.plot([f["goal"]], [y + 0.36], marker="v", markersize=9, color="#1f4e9a")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, max(ratios + [f["goal"] or 0 for f in figs] + [1.0]) * 1.18)
    ax.set_xlabel("ratio (black line: the baseline; blue triangle: the goal)")
    ax.set_title(f"{TITLES.get(doc['bench'], doc['bench'])}\n"
                 f"{doc.get('host', '?')}, {doc.get('cpus', '?')} CPUs, {doc.get('time', '')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", help="JSON files written by the benchmarks' --json")
    ap.add_argument("--out", default=".", help="folder for the PNG files (default: here)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for p in args.inputs:
        with open(p) as f:
            doc = json.load(f)
        png = os.path.join(args.out, f"{doc['bench']}.png")
        draw(doc, png)
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
