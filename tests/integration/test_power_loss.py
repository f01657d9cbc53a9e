# A power loss of the machine under the local tier: what fsync promises, tested against a cache
# directory that loses every byte that was not synced. kill -9 keeps the kernel's page cache;
# this does not. The cache directory lives on an ext4 filesystem on a loop device; at a random
# moment of a workload the daemon is stopped (SIGSTOP, every thread out of the kernel) and the
# loop device's backing image is copied: the copy holds exactly what ext4 had
# sent to its "disk" (synced data, journal commits), not the dirty pages of the page cache
# (commit=600 and the kernel's 30 s dirty expiry keep those in memory during a round). The copy
# is then mounted in place of the disk, journal replayed, and ckptfs mounts it:
#   - LMDB opens and the mount recovers;
#   - every file whose fsync returned reads exactly as it was then, or as a later version;
#   - no file ever reads wrong bytes: a version whose chunks were lost fails with EIO.
# CKPTFS_POWER_LOSS_ROUNDS rounds (4 by default), seeded.
import errno
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run, spec_sha

ROUNDS = int(os.environ.get("CKPTFS_POWER_LOSS_ROUNDS", "4"))
SEED = int(os.environ.get("CKPTFS_POWER_LOSS_SEED", "7011"))
MiB = 1 << 20

# argv: mount root, journal path, seed. Journal: "begin PATH SEED:SIZE SYNC", then
# "done PATH SHA SYNC" once close (and fsync, SYNC=1) returned.
WORKER = r"""
import hashlib, os, random, sys
root, journal, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
j = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
print("ready", flush=True)
while True:
    path = f"f{rng.randrange(12):02d}"
    sync = rng.random() < 0.4
    dseed, size = rng.getrandbits(32), rng.randrange(1, 9) * (1 << 20) - rng.randrange(4096)
    os.write(j, f"begin {path} {dseed}:{size} {int(sync)}\n".encode())
    r, h = random.Random(dseed), hashlib.sha256()
    fd = os.open(os.path.join(root, path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for at in range(0, size, 1 << 20):
        b = r.randbytes(min(1 << 20, size - at))
        h.update(b)
        os.write(fd, b)
    if sync:
        os.fsync(fd)
    os.close(fd)
    os.write(j, f"done {path} {h.hexdigest()} {int(sync)}\n".encode())
"""


class LoopDisk:
    """An ext4 filesystem on a loop device over `image`, mounted at `where`."""

    def __init__(self, image, where):
        self.image, self.where, self.dev = Path(image), Path(where), None

    def format(self, size):
        with open(self.image, "wb") as f:
            f.truncate(size)
        # Inode tables and journal written now: no lazy-init thread writes during a copy.
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             self.image])

    def attach(self):
        self.dev = run(["losetup", "--find", "--show", self.image]).stdout.strip()
        self.where.mkdir(exist_ok=True)
        run(["mount", "-t", "ext4", "-o", "commit=600", self.dev, self.where])

    def detach(self):
        if os.path.ismount(self.where):
            p = subprocess.run(["umount", str(self.where)], timeout=60, check=False)
            if p.returncode != 0:
                subprocess.run(["umount", "-l", str(self.where)], timeout=60, check=False)
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], timeout=60, check=False)
            self.dev = None


def stop_all(pids, timeout=30):
    """SIGSTOP, then waits until every thread of every pid is stopped (out of the kernel)."""
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for p in pids:
            for t in os.listdir(f"/proc/{p}/task"):
                try:
                    stat = Path(f"/proc/{p}/task/{t}/stat").read_text()
                except FileNotFoundError:
                    continue
                states.append(stat.rsplit(")", 1)[1].split()[0])
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"threads did not stop: {states}")


def allowed_outcomes(journal_lines, path):
    """(shas the file may hold, whether it may be absent, whether EIO is acceptable)."""
    versions, pending = [], None  # versions: [(sha, synced)]
    for line in journal_lines:
        kind, p, arg, sync = line.split()
        if p != path:
            continue
        if kind == "begin":
            pending = spec_sha(arg)
        else:
            versions.append((arg, sync == "1"))
            pending = None
    last_sync = max((i for i, (_, s) in enumerate(versions) if s), default=-1)
    shas = {sha for sha, _ in versions[max(last_sync, 0):]}
    if pending:
        shas.add(pending)
    later = pending is not None or last_sync < len(versions) - 1
    return shas, last_sync < 0, later


@pytest.fixture
def disks(workdir):
    made = []

    def make(name):
        d = LoopDisk(workdir / f"{name}.img", workdir / f"{name}.disk")
        made.append(d)
        return d

    yield make
    for d in made:
        d.detach()


@pytest.mark.timeout(120 + ROUNDS * 90)
def test_power_loss_keeps_what_fsync_promised(make_mount, workdir, disks):
    rng = random.Random(SEED)
    disk = disks("disk0")
    disk.format(1 << 30)
    disk.attach()
    for k in range(ROUNDS):
        # Each round on a cache directory of its own (the earlier ones stay on the disk).
        cache, journal = f"cache{k}", workdir / f"journal{k}"
        m = make_mount(cache=disk.where / cache, name=f"r{k}")
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(m.mnt), str(journal),
                                   str(SEED + k)], stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "ready"
        time.sleep(0.5 + rng.random() * 2.5)
        # The power goes: the disk keeps what ext4 had written to it, nothing more. Only the
        # daemon writes the cache disk (the worker waits on it inside FUSE requests).
        daemon = m.daemon_pid()
        stop_all([daemon])
        nxt = disks(f"disk{k + 1}")
        run(["cp", "--sparse=always", disk.image, nxt.image], timeout=300)
        for p in (worker.pid, daemon):
            os.kill(p, signal.SIGKILL)
        worker.wait(timeout=60)
        m.force_umount()
        disk.detach()
        os.unlink(disk.image)
        disk = nxt
        disk.attach()  # ext4 replays its journal

        # The machine is back: LMDB opens, the mount recovers, and the promises hold.
        # Another boot (files staged by a passthrough close without fsync are dropped then:
        # their bytes may not have reached the disk).
        m2 = make_mount(cache=disk.where / cache, name=f"r{k}-after",
                        env={"CKPTFS_BOOT_ID": f"after-power-loss-{k}"})
        lines = journal.read_text().splitlines()
        paths = sorted({line.split()[1] for line in lines})
        present = set(os.listdir(m2.mnt))
        outcome = {"exact": 0, "eio": 0, "absent": 0}
        for path in paths:
            shas, may_be_absent, may_fail = allowed_outcomes(lines, path)
            if path not in present:
                assert may_be_absent, f"{path}: fsync'd, gone after the power loss"
                outcome["absent"] += 1
                continue
            try:
                with open(m2.mnt / path, "rb") as f:
                    got = hashlib.sha256(f.read()).hexdigest()
            except OSError as e:
                assert e.errno == errno.EIO, f"{path}: {e}"
                assert may_fail, f"{path}: fsync'd and never written since, but reads fail"
                outcome["eio"] += 1
                continue
            assert got in shas, f"{path}: reads bytes no write gave it since its last fsync"
            outcome["exact"] += 1
        print(f"\npower loss {k}: {len(lines)} journal lines, files {outcome}")
        assert "recovered from an unclean stop" in m2.log()
        m2.stats()  # the metadata reads
        # A clean stop after the recovery leaves a store that mounts again.
        m2.umount()
        m2.mount()
        assert sorted(os.listdir(m2.mnt)) == sorted(present)
        m2.umount()
    disk.detach()
