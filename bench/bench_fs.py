#!/usr/bin/python3
"""ckptfs filesystem benchmark: the mount against the plain directory its cache lives on.

Every figure is a ratio measured in this run (higher is better for the mount; 1.00 = as fast as
the plain directory):
  save mount/plain        torch.save of a state dict of SIZE bytes (new values every run) to a new
                          path each run, as a job saves step after step
  save+seal               the same, until the bytes are in chunks (in passthrough mode a close
                          commits a staging file, cut into chunks behind it; off, the two agree)
  save-over               torch.save over the same path every run (ext4 writes a file replaced
                          by truncation back at its close: the plain directory pays for that)
  load-warm mount/plain   torch.load of it, second load (page caches warm)
  load-cold               torch.load of it after dropping the kernel's caches (the daemon keeps
                          its RAM tier: at most ram_cache of the chunks)
  write-1M mount/plain    sequential 1 MiB writes of SIZE fresh random bytes to a new path each
                          run, closed (as for save: a file written over in place would let the
                          plain side reuse the page cache its truncation just freed)
  write-1M+seal           the same, until the bytes are in chunks
  read-1M-cold            sequential 1 MiB reads after dropping the kernel's caches
  read-1M-warm            the same with caches warm
and the daemon's peak RSS (VmHWM) against its budget (256 MiB + configured RAM cache).

Usage: /usr/bin/python3 bench/bench_fs.py [--gib 2] [--dir /var/tmp/ckptfs-bench]
       [--repeat 3] [--only save,write-1M] [-o mount-options] [--against OLD_CKPTFS]
Runs alternate which side goes first, so neither inherits the other's writeback.

--against OLD_CKPTFS compares two builds of ckptfs in one run: the baseline side is then a mount
of OLD_CKPTFS (same options, its cache beside the other's) instead of the plain directory, and
every figure reads new/old (e.g. `save new/old = 0.98`); --against-opts gives that side other
mount options (an option the old build does not know, say).
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import torch

import benchjson  # noqa: E402  (bench/, the script's own folder)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def seal(mnt):
    """Returns once every file closed on the mount is in chunks (user.ckptfs.seal)."""
    os.setxattr(mnt, "user.ckptfs.seal", b"1")


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class FreshBytes:
    """SIZE random bytes, renewed before every timed run: the mount deduplicates, and bytes it
    has seen before (a repeated block, an earlier run's file) would measure dedup, not writing.
    The random bytes are drawn once (seconds per GiB); each renewal XORs every 8-byte word with a
    new random constant, which changes every chunk's content and boundaries in milliseconds."""

    def __init__(self, size):
        self.size = size
        g = torch.Generator().manual_seed(0)
        self.words = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).numpy()
        self.rng = random.Random(0)
        self.buf = memoryview(self.words)

    def renew(self):
        os.sync()  # no run inherits the writeback of the one before
        w = self.words[:self.size // 8 * 8].view("<u8")
        w ^= w.dtype.type(self.rng.getrandbits(64) | 1)

def write_seq(path, data, block):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), block):
            os.write(fd, data[off:off + block])
    finally:
        os.close(fd)


def read_seq(path, block):
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while True:
            b = os.read(fd, block)
            if not b:
                break
            n += len(b)
    finally:
        os.close(fd)
    return n


def daemon_pid(cache):
    with open(os.path.join(cache, "lock")) as f:
        return int(f.readline())


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def reported_kib():
    """Guest memory the kernel has handed back to the hypervisor so far (free page reporting), or
    None on a machine without it. On such a VM a page freed and reported is backed again by the
    host at its next first touch: the copy into fresh page cache then runs several times slower,
    whichever side of a ratio it falls on."""
    try:
        with open("/sys/module/page_reporting/parameters/reported_kib") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


# Issue 19's goals (mount/plain as throughput; higher is better).
GOALS = {"save": 1.0, "write-1M": 0.8, "read-1M-cold": 0.8, "load-warm": 0.95}


def mount(ckptfs, mnt, cache, opts):
    os.makedirs(mnt)
    cmd = [ckptfs, "mount", mnt, "--cache-dir", cache]
    if opts:
        cmd += ["-o", opts]
    subprocess.run(cmd, check=True)
    return daemon_pid(cache)


def write_path(cache):
    """'passthrough' or 'daemon': how the mount whose cache this is takes writes (its log says so
    once the kernel's INIT arrived). Builds linked against a libfuse without passthrough (Debian
    12's 3.14; scripts/install-deps.sh builds 3.17 into build-deps/) write through the daemon."""
    log = os.path.join(cache, "ckptfs.log")
    for _ in range(100):
        with open(log) as f:
            text = f.read()
        if "mounted:" in text:
            return "passthrough" if "passthrough on" in text else "daemon"
        time.sleep(0.05)
    return "unknown"


def mount_beside_plain(ckptfs, base, opts, against=None, against_opts=None):
    """A fresh base/{plain,cache,mnt}: the mount (-o opts) with its cache beside the plain
    directory it is compared with (with `against`: a mount of that binary at base/plain, its
    cache base/cache-old). Returns (plain, mnt, the daemon's pid)."""
    plain, cache, mnt = (os.path.join(base, d) for d in ("plain", "cache", "mnt"))
    for b in filter(None, (ckptfs, against)):
        for m in (mnt, plain):
            subprocess.run([b, "umount", m], stderr=subprocess.DEVNULL)
    shutil.rmtree(base, ignore_errors=True)
    if against:
        mount(against, plain, os.path.join(base, "cache-old"),
              opts if against_opts is None else against_opts)
    else:
        os.makedirs(plain)
    return plain, mnt, mount(ckptfs, mnt, cache, opts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default="/var/tmp/ckptfs-bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bin", default=os.environ.get("CKPTFS_BIN", os.path.join(ROOT, "build/tools/ckptfs")))
    ap.add_argument("-o", dest="opts", default="")
    ap.add_argument("--only", default="", help="comma-separated figures to time (default: all)")
    ap.add_argument("--against", default="", metavar="OLD_CKPTFS",
                    help="the baseline is a mount of this ckptfs binary, not the plain directory")
    ap.add_argument("--against-opts", default=None, metavar="OPTS",
                    help="mount options of the --against side (default: the same as -o)")
    benchjson.add_argument(ap)
    args = ap.parse_args()
    out = benchjson.Results("fs", args.json)
    only = set(filter(None, args.only.split(",")))

    size = int(args.gib * (1 << 30))
    base = args.dir
    plain, mnt, pid = mount_beside_plain(args.bin, base, args.opts, args.against or None,
                                         args.against_opts)
    subject, baseline = ("new", "old") if args.against else ("mount", "plain")
    if args.against:
        paths = {side: write_path(os.path.join(base, c))
                 for side, c in (("new", "cache"), ("old", "cache-old"))}
        print(f"# write path: new {paths['new']}, old {paths['old']}", flush=True)
        if paths["new"] != paths["old"]:
            print("# WARNING: the two builds take writes by different paths; the ratios compare "
                  "the paths, not the builds", flush=True)
    mounts = [mnt, plain] if args.against else [mnt]
    reported0 = reported_kib()
    results = {}
    try:
        # A state dict of 64 MiB tensors, like one rank's shard of a large model.
        n = max(1, size // (64 << 20))
        torch.manual_seed(0)
        sd = {f"layers.{i}.weight": torch.randn(4096, 4096) for i in range(n)}
        sd["step"] = 1000
        real = sum(t.numel() * t.element_size() for t in sd.values() if torch.is_tensor(t))
        print(f"# state dict: {n} tensors, {real / (1 << 30):.2f} GiB; block I/O: {size / (1 << 30):.2f} GiB; "
              f"repeat {args.repeat}, median", flush=True)

        def ratio(name, plain_fn, mount_fn, prep=None):
            if only and name not in only:
                return
            tp, tm = [], []
            for i in range(args.repeat):
                sides = ((plain_fn, tp), (mount_fn, tm))
                for fn, acc in (sides if i % 2 == 0 else sides[::-1]):
                    if prep:
                        prep()
                    acc.append(timed(fn))
            p, m = statistics.median(tp), statistics.median(tm)
            results[name] = p / m
            # The fastest run of each side too: on a VM the page-cache copy alone varies by 3x.
            fastest = min(tp) / min(tm)
            out.add(name, p / m, subject=subject, baseline=baseline,
                    goal=None if args.against else GOALS.get(name),
                    subject_s=m, baseline_s=p, fastest_ratio=fastest)
            nbytes = size if "save" not in name and "load" not in name else real
            print(f"{name:<12} {subject}/{baseline} = {p / m:.2f}   ({baseline} {nbytes / p / 1e9:.2f} GB/s, "
                  f"{subject} {nbytes / m / 1e9:.2f} GB/s; fastest runs {fastest:.2f})", flush=True)

        pf, mf = os.path.join(plain, "model.pt"), os.path.join(mnt, "model.pt")
        step = [0]

        def seal_all():
            for m in mounts:
                seal(m)

        def perturb():  # every save writes new bytes, as every training step does
            seal_all()  # no run inherits the seal of the one before
            for d in (plain, mnt):  # the last step's file goes (untimed), the next is new
                for name in os.listdir(d):
                    if name.startswith("step-"):
                        os.unlink(os.path.join(d, name))
            step[0] += 1
            for t in sd.values():
                if torch.is_tensor(t):
                    t.add_(1.0)
            os.sync()  # no run inherits the writeback of the one before

        def at(d):
            return os.path.join(d, f"step-{step[0]}.pt")

        ratio("save", lambda: torch.save(sd, at(plain)), lambda: torch.save(sd, at(mnt)),
              prep=perturb)
        ratio("save+seal", lambda: (torch.save(sd, at(plain)), args.against and seal(plain)),
              lambda: (torch.save(sd, at(mnt)), seal(mnt)), prep=perturb)
        perturb()
        torch.save(sd, pf)
        torch.save(sd, mf)
        ratio("save-over", lambda: torch.save(sd, pf), lambda: torch.save(sd, mf), prep=perturb)
        seal_all()
        torch.load(pf)
        torch.load(mf)
        ratio("load-warm", lambda: torch.load(pf), lambda: torch.load(mf))
        ratio("load-cold", lambda: torch.load(pf), lambda: torch.load(mf), prep=drop_caches)
        del sd
        os.unlink(pf)
        os.unlink(mf)

        fresh = FreshBytes(size)
        seq = [0]

        def seq_files(d):
            return sorted((int(n[4:-4]), os.path.join(d, n)) for n in os.listdir(d)
                          if n.startswith("seq-"))

        def renew():  # as for save: a new path each run; older ones removed (untimed)
            seal_all()
            for d in (plain, mnt):
                for n, path in seq_files(d):
                    if n < seq[0]:  # the run just before (the other side's, maybe) stays
                        os.unlink(path)
            seq[0] += 1
            fresh.renew()

        def seq_at(d):
            return os.path.join(d, f"seq-{seq[0]}.bin")

        ratio("write-1M", lambda: write_seq(seq_at(plain), fresh.buf, 1 << 20),
              lambda: write_seq(seq_at(mnt), fresh.buf, 1 << 20), prep=renew)
        ratio("write-1M+seal", lambda: (write_seq(seq_at(plain), fresh.buf, 1 << 20),
                                        args.against and seal(plain)),
              lambda: (write_seq(seq_at(mnt), fresh.buf, 1 << 20), seal(mnt)), prep=renew)
        if not seq_files(plain) or not seq_files(mnt):  # reads alone (--only)
            renew()
            write_seq(seq_at(plain), fresh.buf, 1 << 20)
            write_seq(seq_at(mnt), fresh.buf, 1 << 20)
        seal_all()
        del fresh
        pb, mb = seq_files(plain)[-1][1], seq_files(mnt)[-1][1]
        ratio("read-1M-cold", lambda: read_seq(pb, 1 << 20), lambda: read_seq(mb, 1 << 20), prep=drop_caches)
        ratio("read-1M-warm", lambda: read_seq(pb, 1 << 20), lambda: read_seq(mb, 1 << 20))
        hwm = vm_hwm_kib(pid) / 1024
        print(f"daemon peak RSS = {hwm:.0f} MiB (budget 256 MiB + 128 MiB RAM cache = 384 MiB)")
        out.note("daemon_peak_rss_mib", round(hwm))
        if reported0 is not None:
            gib = (reported_kib() - reported0) / 2**20
            print(f"guest memory reported free to the hypervisor during the runs = {gib:.0f} GiB "
                  f"(free page reporting: fresh page cache is backed again at first touch)")
            out.note("page_reporting_gib", round(gib, 1))
        out.write()
    finally:
        subprocess.run([args.bin, "umount", mnt])
        if args.against:
            subprocess.run([args.against, "umount", plain])
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
