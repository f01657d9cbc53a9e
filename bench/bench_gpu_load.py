#!/usr/bin/python3
"""gpu/ckptfs_gpu.py against torch.load: loading one checkpoint from a ckptfs mount, cold.

Writes a torch.save state dict of GIB GiB (fp32 and bf16 tensors of 64-256 MiB, like one rank's
shard of a large model) onto a fresh mount; then, before every timed load, remounts (the daemon's
RAM cache goes) and drops the kernel's page cache (the mount's and its cache directory's), and
measures:
  load        torch.load(path) into host memory  vs  ckptfs_gpu.load(path, device="cpu")
  load-gpu    torch.load(path, map_location="cuda")  vs  ckptfs_gpu.load(path, device="cuda")
              (only where torch sees a GPU; through pinned staging when the library has HIP)
printing `load ckptfs_gpu/torch.load = R` (R > 1: ckptfs_gpu is faster) with both GB/s. Each
result is checked bitwise against torch.load's once, outside the timings.

Usage: /usr/bin/python3 bench/bench_gpu_load.py [--gib 4] [--dir /var/tmp/ckptfs-gpu-bench]
       [--repeat 1] [--bin build/tools/ckptfs] [--lib build/gpu/libckptfs_gpu.so] [--ablate]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_state(total):
    """fp32 and bf16 tensors of 64, 128 and 256 MiB in turn, `total` bytes in all."""
    g = torch.Generator().manual_seed(0)
    sd, size, i = {}, 0, 0
    sizes = [64 * MiB, 128 * MiB, 256 * MiB]
    while size < total:
        nbytes = min(sizes[i % 3], total - size)
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        n = max(1, nbytes // (4 if dtype == torch.float32 else 2))
        sd[f"model.layers.{i}.weight"] = torch.randn(n, generator=g).to(dtype).view(-1, 1024) \
            if n % 1024 == 0 else torch.randn(n, generator=g).to(dtype)
        size += n * (4 if dtype == torch.float32 else 2)
        i += 1
    return sd, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-gpu-bench")
    ap.add_argument("--repeat", type=int, default=1, help="timed loads of each kind (median)")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    ap.add_argument("--lib", default=os.environ.get("CKPTFS_GPU_LIB",
                                                    os.path.join(ROOT, "build/gpu/libckptfs_gpu.so")))
    ap.add_argument("-o", dest="opts", default="")
    ap.add_argument("--ablate", action="store_true",
                    help="also time the host load without huge-page advice and with 32 reads in "
                         "flight, each against torch.load")
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("gpu_load", args.json)
    os.environ["CKPTFS_GPU_LIB"] = os.path.abspath(args.lib)
    sys.path.insert(0, os.path.join(ROOT, "gpu"))
    import ckptfs_gpu  # noqa: E402

    base = args.dir
    cache, mnt = os.path.join(base, "cache"), os.path.join(base, "mnt")
    subprocess.run([args.bin, "umount", mnt], stderr=subprocess.DEVNULL)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(mnt)
    mount_cmd = [args.bin, "mount", mnt, "--cache-dir", cache] + (["-o", args.opts] if args.opts else [])

    def remount():
        subprocess.run([args.bin, "umount", mnt], check=True)
        subprocess.run(mount_cmd, check=True)
        drop_caches()

    subprocess.run(mount_cmd, check=True)
    path = os.path.join(mnt, "model.pt")
    gpu = torch.cuda.is_available()
    try:
        sd, size = make_state(int(args.gib * (1 << 30)))
        torch.save(sd, path)
        print(f"# state dict: {len(sd)} tensors (fp32/bf16, 64-256 MiB), {size / (1 << 30):.2f} GiB; "
              f"library {ckptfs_gpu.library_path()} (HIP: {ckptfs_gpu.has_hip()}); "
              f"GPU: {torch.cuda.get_device_name() if gpu else 'none'}; cold caches, "
              f"median of {args.repeat}", flush=True)
        del sd

        def timed(fn, sync=False):
            remount()
            t0 = time.perf_counter()
            out = fn()
            if sync:
                torch.cuda.synchronize()
            return time.perf_counter() - t0, out

        def compare(name, torch_fn, ours_fn, sync=False):
            tt, to = [], []
            for r in range(args.repeat):
                t, ref = timed(torch_fn, sync)
                tt.append(t)
                t, got = timed(ours_fn, sync)
                to.append(t)
                if r == 0:  # bitwise, once, outside the timings
                    assert list(got) == list(ref), "different tensor names"
                    for k, v in ref.items():
                        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
                del ref, got
            t, o = statistics.median(tt), statistics.median(to)
            print(f"{name:<9} ckptfs_gpu/torch.load = {t / o:.2f}   (torch.load {size / t / 1e9:.2f} "
                  f"GB/s, ckptfs_gpu {size / o / 1e9:.2f} GB/s)", flush=True)
            out.add(name, t / o, subject="ckptfs_gpu", baseline="torch.load", subject_s=o,
                    baseline_s=t)

        compare("load", lambda: torch.load(path), lambda: ckptfs_gpu.load(path, device="cpu"))
        if args.ablate:
            for label, opts in (("no-huge", {"no_huge_pages": 1}), ("qd32", {"queue_depth": 32})):
                compare(label, lambda: torch.load(path),
                        lambda: ckptfs_gpu.load(path, device="cpu", options=opts))
        if gpu:
            compare("load-gpu", lambda: torch.load(path, map_location="cuda"),
                    lambda: ckptfs_gpu.load(path, device="cuda"), sync=True)
        else:
            print("load-gpu  skipped: torch sees no GPU")
        out.write()
    finally:
        subprocess.run([args.bin, "umount", mnt])
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
