#!/usr/bin/python3
"""ckptfs benchmark of a node's ranks saving at once: N processes, each torch.save of its own
shard (new values every run) to a new path, released together, on the mount against the plain
directory its cache lives on. Every figure is a ratio measured in this run (higher is better for
the mount; 1.00 = as fast as the plain directory):
  save-N mount/plain        until the last rank's torch.save has returned
  save-N+seal               the same, until every shard is in chunks (N staging files cut at once)
and the daemon's peak RSS (VmHWM) against its budget: 256 MiB + the RAM cache + the chunk copies
of the seals (64 MiB, all seals together).

Usage: /usr/bin/python3 bench/bench_ranks.py [--ranks 8] [--gib 4] [--repeat 3]
       [--dir /var/tmp/ckptfs-ranks] [-o mount-options]
--gib is the checkpoint's size, all shards together. Runs alternate which side goes first.
"""
import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)
from bench_fs import mount_beside_plain, seal, vm_hwm_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rank(rank, mib, barrier, go, results):
    """One rank: its shard of 64 MiB tensors, saved each time `go` hands it a path."""
    torch.manual_seed(rank)
    sd = {f"layers.{i}.weight": torch.randn(4096, 4096) for i in range(max(1, mib // 64))}
    sd["rank"] = rank
    while True:
        barrier.wait()
        path = go.get()
        if path is None:
            return
        for t in sd.values():
            if torch.is_tensor(t):
                t.add_(1.0)  # new values every run, as every training step has
        barrier.wait()
        t0 = time.perf_counter()
        torch.save(sd, path)
        results.put(time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-ranks")
    ap.add_argument("-o", dest="opts", default="", help="mount options")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("ranks", args.json)
    n = args.ranks
    mib = max(64, int(args.gib * 1024 / n) // 64 * 64)
    base = args.dir
    plain, mnt, pid = mount_beside_plain(args.bin, base, args.opts)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    gos = [ctx.Queue() for _ in range(n)]
    procs = [ctx.Process(target=_rank, args=(r, mib, barrier, gos[r], results)) for r in range(n)]
    for p in procs:
        p.start()
    step = [0]
    try:
        print(f"# {n} ranks, {mib} MiB each ({n * mib / 1024:.2f} GiB); repeat {args.repeat}, "
              f"median", flush=True)

        def save_all(d):
            """Every rank saves its shard under d at once; the time until the last is done."""
            for f in os.listdir(d):  # the last run's files go (untimed)
                os.unlink(os.path.join(d, f))
            step[0] += 1
            barrier.wait()
            for r in range(n):
                gos[r].put(os.path.join(d, f"step{step[0]}-rank{r}.pt"))
            os.sync()  # no run inherits the writeback of the one before
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(n):
                results.get(timeout=1800)
            return time.perf_counter() - t0

        def figure(name, sealed):
            tp, tm = [], []
            for i in range(args.repeat):
                for d in ((plain, mnt) if i % 2 == 0 else (mnt, plain)):
                    seal(mnt)  # no run inherits the seal of the one before
                    t = save_all(d)
                    if d == mnt and sealed:
                        t0 = time.perf_counter()
                        seal(mnt)
                        t += time.perf_counter() - t0
                    (tm if d == mnt else tp).append(t)
            p, m = statistics.median(tp), statistics.median(tm)
            print("   runs plain", [round(x, 2) for x in tp], "mount", [round(x, 2) for x in tm])
            gb = n * mib / 1024 * 2**30 / 1e9
            out.add(name, p / m, subject="mount", baseline="plain", subject_s=m, baseline_s=p,
                    fastest_ratio=min(tp) / min(tm))
            print(f"{name:<14} mount/plain = {p / m:.2f}   (plain {gb / p:.2f} GB/s, mount "
                  f"{gb / m:.2f} GB/s; fastest runs {min(tp) / min(tm):.2f})", flush=True)

        figure(f"save-{n}", False)
        figure(f"save-{n}+seal", True)
        hwm = vm_hwm_kib(pid) / 1024
        print(f"daemon peak RSS = {hwm:.0f} MiB (budget 256 MiB + 128 MiB RAM cache + 64 MiB of "
              f"seal copies = 448 MiB)")
        out.note("daemon_peak_rss_mib", round(hwm))
        out.write()
    finally:
        try:  # the ranks stop at their next wait
            barrier.wait(timeout=60)
            for g in gos:
                g.put(None)
        except Exception:  # a rank failed or hangs
            for p in procs:
                p.terminate()
        for p in procs:
            p.join()
        subprocess.run([args.bin, "umount", mnt])
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
