#!/usr/bin/python3
"""Sixteen fresh mounts at once on one bucket (radosgw on 127.0.0.1, scripts/rgw.sh), without
and with a record snapshot (docs/journal.md): one node saves --files small files, then sixteen
new mounts start at once, each with its own cache directory, and each one's time to ready is
taken (`ckptfs mount` returns once the mount serves). Then `ckptfs snapshot` runs and sixteen
more mounts start at once. Prints each round's times and the record GETs radosgw served.

  /usr/bin/python3 bench/bench_mounts.py [--files 4000] [--nodes 16]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import benchjson  # noqa: E402  (bench/, the script's own folder)
from bench_remote import mount_bucket, server_counters, start_rgw, teardown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def storm(args, work, endpoint, mounts, tag):
    """args.nodes mounts started at once: (each one's seconds to ready, all of them)."""
    times = [None] * args.nodes

    def go(i):
        t0 = time.perf_counter()
        mount_bucket(args.bin, work, f"{tag}{i}", endpoint, mounts)
        times[i] = time.perf_counter() - t0
    threads = [threading.Thread(target=go, args=(i,)) for i in range(args.nodes)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-mounts")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("mounts", args.json)
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rgw, env = start_rgw(work)
    endpoint = env["AWS_ENDPOINT_URL"]
    mounts = []
    try:
        import boto3
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="bench")
        writer = mount_bucket(args.bin, work, "writer", endpoint, mounts)
        os.makedirs(os.path.join(writer, "run"))
        for i in range(args.files):
            with open(os.path.join(writer, f"run/f{i:06d}"), "wb") as f:
                f.write(b"x" * (i % 7))
        last = os.path.join(writer, f"run/f{args.files - 1:06d}")
        while os.getxattr(last, "user.ckptfs.state").decode() != "remote":
            time.sleep(0.2)
        time.sleep(3)  # the uploads behind it, and the writer's own journal passes
        rounds = {}
        for case in ("listing", "snapshot"):
            if case == "snapshot":
                subprocess.run([args.bin, "snapshot", "--backend", "s3://bench/ck",
                                "--s3-endpoint", endpoint], check=True, stdout=subprocess.DEVNULL)
            before = server_counters()["GETs"]
            times, total = storm(args, work, endpoint, mounts, case)
            gets = server_counters()["GETs"] - before
            rounds[case] = statistics.median(times)
            print(f"{case:8s} {args.nodes} mounts of {args.files} files at once: ready after "
                  f"{min(times):.2f}-{max(times):.2f} s (median {statistics.median(times):.2f} s), "
                  f"all in {total:.2f} s; radosgw GETs {gets}", flush=True)
            for m in mounts[-args.nodes:]:
                assert len(os.listdir(os.path.join(m, "run"))) == args.files, m
        out.add("mount-ready", rounds["listing"] / rounds["snapshot"], subject="snapshot",
                baseline="listing", listing_s=rounds["listing"], snapshot_s=rounds["snapshot"])
        out.write()
    finally:
        teardown(args.bin, mounts, rgw)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
