#!/usr/bin/python3
"""ckptfs tier-chain benchmark: a cold restore (torch.load through a fresh mount with an empty
local tier) of one checkpoint saved through a mount on the chain [file:// directory, radosgw on
127.0.0.1], when the near tier holds its chunks against when only the far one does (the near
tier's chunks removed, as its keep= policy and gc would). Both against torch.load of a plain
local copy with the page cache dropped. Every figure is measured in this run.

  restore near/far     time with the near tier's chunks / time with the far tier's only
  restore near/plain   time with the near tier's chunks / torch.load of a plain local file

Usage: /usr/bin/python3 bench/bench_tiers.py [--gib 1] [--dir /var/tmp/ckptfs-tiers]
On this machine the "near" directory and radosgw share one disk: the figure shows what the
chain costs and what the object store's request path costs, not a parallel filesystem's speed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchjson  # noqa: E402
from bench_remote import ROOT, drop_caches, sh, start_rgw, state_dict, teardown  # noqa: E402


def wait_tiers(path, timeout=1800):
    t0 = time.perf_counter()
    while os.getxattr(path, "user.ckptfs.state").decode() != "remote":
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{path} never reached every tier")
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-tiers")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("tiers", args.json)
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rgw, env = start_rgw(work)
    near = os.path.join(work, "pfs")
    os.makedirs(near)
    mounts = []
    try:
        import boto3
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                     region_name="us-east-1").create_bucket(Bucket="bench")

        def mount(name):
            mnt, cache = os.path.join(work, name, "mnt"), os.path.join(work, name, "cache")
            os.makedirs(mnt)
            os.makedirs(cache)
            sh(args.bin, "mount", mnt, "--cache-dir", cache, "--backend", f"file://{near}",
               "--backend", "s3://bench/ck", "--s3-endpoint", env["AWS_ENDPOINT_URL"],
               stdout=subprocess.DEVNULL)
            mounts.append(mnt)
            return mnt

        def cold_load(name):
            m = mount(name)
            path = os.path.join(m, "model.pt")
            while not os.path.exists(path):
                time.sleep(0.05)
            drop_caches()
            t0 = time.perf_counter()
            loaded = torch.load(path)
            took = time.perf_counter() - t0
            assert all(torch.equal(loaded[k], sd[k]) for k in sd)
            return took

        a = mount("a")
        sd = state_dict(args.gib, 1)
        ckpt = os.path.join(a, "model.pt")
        torch.save(sd, ckpt)
        wait_tiers(ckpt)
        size = os.path.getsize(ckpt)
        plain = os.path.join(work, "plain.pt")
        shutil.copyfile(ckpt, plain)
        drop_caches()
        t0 = time.perf_counter()
        loaded = torch.load(plain)
        plain_load = time.perf_counter() - t0
        del loaded

        near_load = cold_load("b")
        shutil.rmtree(os.path.join(near, "chunks.d"))
        far_load = cold_load("c")

        print(f"checkpoint {size / 2**20:.0f} MiB; near tier file://, far tier radosgw on "
              "127.0.0.1 (one disk)")
        print(f"restore near/far   = {near_load / far_load:.2f}   (near tier {near_load:.1f} s, "
              f"far tier only {far_load:.1f} s)")
        print(f"restore near/plain = {near_load / plain_load:.2f}   (plain torch.load "
              f"{plain_load:.1f} s)")
        out.add("restore-near", near_load / far_load, subject="near tier", baseline="far tier",
                better="lower", subject_s=near_load, baseline_s=far_load)
        out.add("restore-near-vs-plain", near_load / plain_load, subject="near tier",
                baseline="plain", better="lower", subject_s=near_load, baseline_s=plain_load)
        out.write()
    finally:
        teardown(args.bin, mounts, rgw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
