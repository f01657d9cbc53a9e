#!/usr/bin/python3
"""ckptfs gc benchmark: `ckptfs gc --dry-run` over a file:// backend holding at least --chunks
chunks, written through a mount with small chunks (one file per 64 MiB), then again after half
of the files are deleted, then a real round (`--grace 1`, the mount's gc_window 0.5 s) that
deletes what no record names, and a last dry run. Prints the time and peak RSS of each run, and
what it counted or deleted.

Usage: /usr/bin/python3 bench/bench_gc.py [--chunks 100000] [--dir /var/tmp/ckptfs-gc]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def gc(binary, backend, *mode):
    """Runs `ckptfs gc` (--dry-run unless told); returns (seconds, its own peak RSS in KiB,
    counted fields)."""
    t0 = time.perf_counter()
    p = subprocess.run([binary, "gc", "--backend", f"file://{backend}", *(mode or ["--dry-run"])],
                       capture_output=True, text=True, check=True)
    secs = time.perf_counter() - t0
    fields = {l.split()[0]: int(l.split()[1]) for l in p.stdout.splitlines() if l.split() and
              l.split()[0] in ("records", "chunks", "unreferenced", "deleted", "peak_rss_kib")}
    return secs, fields["peak_rss_kib"], fields


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-gc")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN",
                                                    os.path.join(ROOT, "build/tools/ckptfs")))
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    backend, mnt, cache = (os.path.join(args.dir, n) for n in ("backend", "mnt", "cache"))
    for d in (backend, mnt, cache):
        os.makedirs(d)
    subprocess.run([args.bin, "mount", mnt, "--cache-dir", cache, "--backend", f"file://{backend}",
                    "-o", "chunk_min=4K,chunk_avg=8K,chunk_max=16K,gc_window=0.5"], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        files, written, chunks = [], 0, 0
        t0 = time.perf_counter()
        while chunks < args.chunks:
            path = os.path.join(mnt, f"f{len(files):04d}.bin")
            with open(path, "wb") as f:
                f.write(os.urandom(64 * MiB))
            files.append(path)
            written += 64 * MiB
            os.setxattr(mnt, "user.ckptfs.seal", b"1")
            chunks += json.loads(os.getxattr(path, "user.ckptfs.chunks"))["chunks"]
        for path in files:
            while os.getxattr(path, "user.ckptfs.state") != b"remote":
                time.sleep(0.2)
        print(f"# {len(files)} files, {written / 2**30:.1f} GiB, {chunks} chunks uploaded to "
              f"file://{backend} in {time.perf_counter() - t0:.0f} s")
        secs, peak, f = gc(args.bin, backend)
        print(f"gc --dry-run, all referenced:  {secs:.1f} s, peak RSS {peak / 1024:.0f} MiB "
              f"({f['records']} records, {f['chunks']} chunks, {f['unreferenced']} unreferenced)")
        for path in files[::2]:
            os.unlink(path)
        want = len(files) - len(files[::2])
        while len([n for n in os.listdir(os.path.join(backend, "files.d"))]) > want:
            time.sleep(0.2)
        secs, peak, f = gc(args.bin, backend)
        print(f"gc --dry-run, half deleted:    {secs:.1f} s, peak RSS {peak / 1024:.0f} MiB "
              f"({f['records']} records, {f['chunks']} chunks, {f['unreferenced']} unreferenced)")
        secs, peak, f = gc(args.bin, backend, "--grace", "1")
        print(f"gc --grace 1 (a round):        {secs:.1f} s, peak RSS {peak / 1024:.0f} MiB "
              f"({f['records']} records, {f['chunks']} chunks, {f['deleted']} deleted; "
              f"1 s of it is the grace)")
        secs, peak, f = gc(args.bin, backend)
        print(f"gc --dry-run after the round:  {secs:.1f} s, peak RSS {peak / 1024:.0f} MiB "
              f"({f['records']} records, {f['chunks']} chunks, {f['unreferenced']} unreferenced)")
    finally:
        subprocess.run([args.bin, "umount", mnt], stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
