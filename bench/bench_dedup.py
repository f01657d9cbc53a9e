#!/usr/bin/python3
"""ckptfs dedup benchmark: stored bytes over unique bytes for the checkpoint scenarios, with
tensor-boundary chunking (the default) against content-defined chunking alone (-o
tensor_chunking=0) in the same run. 1.00 is perfect: every unique byte stored once.

  dp-ranks    8 data-parallel ranks save identical model states (unique: one rank's tensors)
  finetune    a frozen base and a trained head saved at 5 steps (unique: base + 5 heads and
              their optimizer state)
  reordered   the same tensors saved again in another order, nesting and file

Then the chunking+hashing throughput of the write path per core (bench/chunk_bench --file on a
torch.save file, both ways).

Usage: /usr/bin/python3 bench/bench_dedup.py [--mib 256] [--dir /var/tmp/ckptfs-dedup]
"""
import argparse
import os
import shutil
import subprocess
import sys

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model(seed, mib, width=1024):
    """A GPT-like state dict of about `mib` MiB: per layer a fused QKV, an MLP, biases, norms."""
    g = torch.Generator().manual_seed(seed)
    per_layer = (3 * width * width + 8 * width * width) * 2  # bf16 weights
    sd = {}
    for i in range(max(1, mib * 2**20 // per_layer)):
        p = f"decoder.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.ones(width, dtype=torch.bfloat16)
        sd[p + "self_attention.linear_qkv.weight"] = torch.randn(3 * width, width, generator=g).bfloat16()
        sd[p + "self_attention.linear_qkv.bias"] = torch.randn(3 * width, generator=g).bfloat16()
        sd[p + "mlp.linear_fc1.weight"] = torch.randn(4 * width, width, generator=g).bfloat16()
        sd[p + "mlp.linear_fc2.weight"] = torch.randn(width, 4 * width, generator=g).bfloat16()
    return sd


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def stored(binary, path):
    out = subprocess.run([binary, "stats", path], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        if k == "stored_bytes":
            return int(v)
    raise RuntimeError(out)


def scenarios(mnt, mib):
    """Yields (name, directory, unique bytes) after writing each scenario under mnt."""
    d = os.path.join(mnt, "dp-ranks")
    os.mkdir(d)
    sd = model(1, mib)
    for rank in range(8):
        torch.save({"model": sd, "rank": rank}, os.path.join(d, f"mp_rank_00_dp_{rank}.pt"))
    yield "dp-ranks", d, nbytes(sd.values())

    d = os.path.join(mnt, "finetune")
    os.mkdir(d)
    base = model(2, mib)
    unique = nbytes(base.values())
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        head = {"output_layer.weight": torch.randn(8192, 1024, generator=g)}
        opt = {k: torch.randn_like(v) for k, v in head.items()}
        unique += nbytes(head.values()) + nbytes(opt.values())
        torch.save({"model": {**base, **head}, "optimizer": opt, "iteration": step},
                   os.path.join(d, f"iter_{step:07d}.pt"))
    yield "finetune", d, unique

    d = os.path.join(mnt, "reordered")
    os.mkdir(d)
    sd = model(4, mib)
    torch.save(sd, os.path.join(d, "a.pt"))
    torch.save({"wrapped": {k.upper(): sd[k] for k in reversed(list(sd))}}, os.path.join(d, "b.pt"))
    yield "reordered", d, nbytes(sd.values())


def run_mount(binary, work, options):
    mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache")
    subprocess.run([binary, "umount", mnt], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(mnt)
    cmd = [binary, "mount", mnt, "--cache-dir", cache]
    if options:
        cmd += ["-o", options]
    subprocess.run(cmd, check=True)
    return mnt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="model size per save")
    ap.add_argument("--dir", default="/var/tmp/ckptfs-dedup")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tools", "ckptfs"))
    ap.add_argument("--chunk-bench", default=os.path.join(ROOT, "build", "bench", "chunk_bench"))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("dedup", args.json)
    results = {}
    for label, options in (("tensor", ""), ("cdc", "tensor_chunking=0")):
        mnt = run_mount(args.bin, os.path.join(args.dir, label), options)
        try:
            for name, d, unique in scenarios(mnt, args.mib):
                results[(name, label)] = stored(args.bin, d) / unique
        finally:
            subprocess.run([args.bin, "umount", mnt], check=True)
    for name in ("dp-ranks", "finetune", "reordered"):
        print(f"{name:10s} stored/unique = {results[(name, 'tensor')]:.4f}   "
              f"(content-defined only: {results[(name, 'cdc')]:.4f})")
        for label in ("tensor", "cdc"):
            out.add(f"{name} ({label})", results[(name, label)], subject="stored",
                    baseline="unique", better="lower")
    out.write()
    sample = os.path.join(args.dir, "sample.pt")
    torch.save(model(5, args.mib), sample)
    sys.stdout.flush()
    subprocess.run([args.chunk_bench, "--file", sample], check=True)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
