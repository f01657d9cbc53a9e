#!/usr/bin/python3
"""Resharded views against the offline route, both measured in this run.

A Megatron-LM checkpoint (mcore names, GQA, SwiGLU, bf16 weights with the fp16 optimizer's fp32
masters and Adam state; tests/reshard/megatron_fixture.py) is saved at TP=4, PP=2 into a ckptfs
mount. For each target shape:

  view     torch.load of every target rank file under ROOT/.views/tpT-ppP (the first open of a
           file computes its CRCs); nothing is written
  offline  what a conversion does: torch.load every source shard, reshard (the fixture's
           reference, torch.cat and slicing), torch.save the new shards to a plain directory on
           the same disk, torch.load them

Prints `view/offline` time ratios (goal <= 0.25), the temporary bytes each route writes, the time
to the first byte of a view file (fresh mount: plan + CRCs) and the daemon's peak RSS.

  /usr/bin/python3 bench/bench_reshard.py --gib 2
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402
import benchjson  # noqa: E402  (bench/, the script's own folder)


def sh(*args):
    return subprocess.run([str(a) for a in args], check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True).stdout


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def du(path):
    """Bytes of the regular files under path, not counting the virtual .views trees."""
    total = 0
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if x != ".views"]
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def proc_field(pid, name, fname="status"):
    for line in Path(f"/proc/{pid}/{fname}").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0, help="approximate source checkpoint size")
    ap.add_argument("--dir", default="/var/tmp/ckptfs-bench-reshard")
    ap.add_argument("--bin", default=str(REPO / "build" / "tools" / "ckptfs"))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    results_json = benchjson.Results("reshard", args.json)

    work = Path(args.dir)
    if work.exists():
        subprocess.run(["fusermount3", "-u", str(work / "mnt")], stderr=subprocess.DEVNULL)
        shutil.rmtree(work)
    (work / "mnt").mkdir(parents=True)
    # hidden 2048, 16 heads in 4 query groups, SwiGLU ffn 5632, vocab 32000: about 630 MiB per
    # layer with the optimizer (14 bytes per parameter), 0.9 GiB for the tied embeddings.
    layers = max(2, 2 * round((args.gib * 1024 - 900) / 630 / 2))
    cfg = mf.ModelConfig(era="mcore", num_layers=layers, hidden_size=2048, num_attention_heads=16,
                         num_query_groups=4, ffn_hidden_size=5632, swiglu=True, vocab_size=32000,
                         make_vocab_size_divisible_by=128, bias=False, normalization="RMSNorm",
                         position_embedding_type="rope")
    mnt = work / "mnt"
    out = sh(args.bin, "mount", mnt, "--cache-dir", work / "cache")
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))
    results = []
    try:
        root = mnt / "ckpt"
        t0 = time.perf_counter()
        mf.save_checkpoint(root, cfg, 4, 2)
        os.sync()
        src_bytes = du(root)
        print(f"source: {layers} layers, TP 4 x PP 2, {src_bytes / 2**30:.2f} GiB, "
              f"saved in {time.perf_counter() - t0:.1f} s", flush=True)
        for T, P in ((2, 2), (4, 1), (2, 1)):
            spec = f"tp{T}-pp{P}"
            view = root / ".views" / spec / "iter_0000100"
            # View route.
            drop_caches()
            written0 = proc_field(pid, "write_bytes", "io")
            cache0 = du(work / "cache")
            t0 = time.perf_counter()
            first = view / mf.rank_name(0, 0, P) / "model_optim_rng.pt"
            with open(first, "rb") as f:
                f.read(1)
            ttfb = time.perf_counter() - t0
            for p in range(P):
                for t in range(T):
                    torch.load(view / mf.rank_name(t, p, P) / "model_optim_rng.pt")
            view_s = time.perf_counter() - t0
            view_written = proc_field(pid, "write_bytes", "io") - written0
            cache_grew = du(work / "cache") - cache0
            # Offline route.
            drop_caches()
            off = work / f"offline-{spec}"
            t0 = time.perf_counter()
            ref = mf.reference_shard(root, T, P)
            mf.write_reference(ref, off, "iter_0000100")
            del ref
            for p in range(P):
                for t in range(T):
                    torch.load(off / "iter_0000100" / mf.rank_name(t, p, P) / "model_optim_rng.pt")
            offline_s = time.perf_counter() - t0
            offline_written = du(off)
            shutil.rmtree(off)
            results.append((spec, view_s, offline_s, ttfb, view_written, cache_grew,
                            offline_written))
            print(f"tp4-pp2 -> {spec}: view {view_s:.1f} s, offline {offline_s:.1f} s, "
                  f"first byte {ttfb:.2f} s", flush=True)
        rss = proc_field(pid, "VmHWM")
    finally:
        subprocess.run([args.bin, "umount", mnt], stdout=subprocess.DEVNULL)
    print()
    for spec, v, o, ttfb, vw, cg, ow in results:
        print(f"tp4-pp2->{spec:8s} view/offline = {v / o:.2f}   (view {v:.1f} s, offline {o:.1f} s; "
              f"written: daemon {vw} B, cache dir +{max(cg, 0)} B, offline {ow / 2**30:.2f} GiB; "
              f"first byte {ttfb:.2f} s)")
        results_json.add(f"tp4-pp2->{spec}", v / o, subject="view", baseline="offline",
                         better="lower", goal=0.25, subject_s=v, baseline_s=o,
                         first_byte_s=ttfb, view_written=vw, offline_written=ow)
    print(f"daemon peak RSS = {rss / 1024:.0f} MiB (includes the source's save)")
    results_json.note("daemon_peak_rss_mib", round(rss / 1024))
    results_json.write()


if __name__ == "__main__":
    main()
