#!/usr/bin/python3
"""ckptfs disk wear: bytes the cache disk takes per byte a job saves through the mount.

The cache directory lives on a filesystem of its own (ext4 on a loop device over a file in
--dir), so that the loop device's own counter of sectors written counts the mount's writes and
nothing else the machine does. Each figure saves a state dict of SIZE bytes through the mount,
waits for its seal (the bytes in chunks: user.ckptfs.seal) and for writeback (syncfs of the cache
filesystem), and divides the sectors written meanwhile, ext4's journal and LMDB included, by the
bytes saved. Lower is better; 1.00 is every byte written once.

  wear fsync'd     torch.save to a file object, fsync'd before its close (as DCP's
                   FileSystemWriter and any careful writer do), of bytes not stored before
  wear save        the same without fsync
  wear same-again  a save whose bytes are those of the save before it (a step that changed
                   nothing, or a second rank saving the same shard): only new metadata is owed

Usage: /usr/bin/python3 bench/bench_wear.py [--gib 1] [--dir /var/tmp/ckptfs-wear]
       [-o mount-options] [--bin build/tools/ckptfs] [--json FILE]
"""
import argparse
import os
import shutil
import subprocess
import sys

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = {"wear fsync'd": 1.05, "wear save": 1.05, "wear same-again": 1.05}  # issue 41, at most


def sectors_written(dev):
    """Sectors (512 bytes) written to block device `dev` (e.g. loop3) since it was set up."""
    with open(f"/sys/block/{dev}/stat") as f:
        return int(f.read().split()[6])


def syncfs(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the directory's
        subprocess.run(["sync", "-f", path], check=True)  # the whole filesystem (syncfs)
    finally:
        os.close(fd)


class LoopFs:
    """A fresh ext4 of `size` bytes on a loop device over <dir>/disk.img, mounted at <dir>/fs."""

    def __init__(self, base, size):
        self.img, self.mnt = os.path.join(base, "disk.img"), os.path.join(base, "fs")
        with open(self.img, "wb") as f:
            f.truncate(size)
        subprocess.run(["mkfs.ext4", "-q", "-F", self.img], check=True)
        self.loop = subprocess.run(["losetup", "-f", "--show", self.img], check=True,
                                   capture_output=True, text=True).stdout.strip()
        os.makedirs(self.mnt)
        subprocess.run(["mount", self.loop, self.mnt], check=True)
        self.dev = os.path.basename(self.loop)

    def close(self):
        subprocess.run(["umount", self.mnt])
        subprocess.run(["losetup", "-d", self.loop])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-wear")
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN", os.path.join(ROOT, "build/tools/ckptfs")))
    ap.add_argument("-o", dest="opts", default="")
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("wear", args.json)

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    size = int(args.gib * (1 << 30))
    fs = LoopFs(args.dir, 4 * size + (2 << 30))
    cache, mnt = os.path.join(fs.mnt, "cache"), os.path.join(args.dir, "mnt")
    os.makedirs(mnt)
    cmd = [args.bin, "mount", mnt, "--cache-dir", cache]
    if args.opts:
        cmd += ["-o", args.opts]
    subprocess.run(cmd, check=True)
    try:
        n = max(1, size // (64 << 20))  # 64 MiB tensors, like one rank's shard of a large model
        torch.manual_seed(0)
        sd = {f"layers.{i}.weight": torch.randn(4096, 4096) for i in range(n)}
        step = [0]

        def save(fsync):
            step[0] += 1
            path = os.path.join(mnt, f"step-{step[0]}.pt")
            with open(path, "wb") as f:
                torch.save(sd, f)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            return os.path.getsize(path)

        def figure(name, fn):
            syncfs(fs.mnt)
            before = sectors_written(fs.dev)
            saved = fn()
            os.setxattr(mnt, "user.ckptfs.seal", b"1")
            syncfs(fs.mnt)
            written = (sectors_written(fs.dev) - before) * 512
            ratio = written / saved
            out.add(name, ratio, subject="disk bytes", baseline="bytes saved", better="lower",
                    goal=GOALS.get(name))
            print(f"{name:<16} disk/saved = {ratio:.2f}   ({saved / 2**20:.0f} MiB saved, "
                  f"{written / 2**20:.0f} MiB written to the cache disk)", flush=True)

        def fresh():
            for t in sd.values():
                t.add_(1.0)

        print(f"# state dict: {n} tensors, {n * 64} MiB; cache on ext4 over {fs.loop}", flush=True)
        fresh()
        figure("wear fsync'd", lambda: save(True))
        fresh()
        figure("wear save", lambda: save(False))
        figure("wear same-again", lambda: save(False))
        out.write()
    finally:
        subprocess.run([args.bin, "umount", mnt])
        fs.close()
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
