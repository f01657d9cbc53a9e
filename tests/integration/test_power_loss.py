# A power loss of the machine under the local tier: what fsync promises, tested against a cache
# directory that loses every byte that was not synced. kill -9 keeps the kernel's page cache;
# this does not. The cache directory lives on an ext4 filesystem on a loop device; at a random
# moment of a workload the daemon is stopped (SIGSTOP, every thread out of the kernel) and the
# loop device's backing image is copied: the copy holds exactly what ext4 had
# sent to its "disk" (synced data, journal commits), not the dirty pages of the page cache
# (commit=600 and the kernel's 30 s dirty expiry keep those in memory during a round). The copy
# is then mounted in place of the disk, journal replayed, and ckptfs mounts it:
#   - LMDB opens and the mount recovers;
#   - every file reads whole as a version it had: the one its last fsync made durable or a
#     later one, never EIO, zeros or a mix; a file never fsync'd may be absent.
# The workload replaces files, from tracker files of a few bytes to shards of tens of MiB, the
# ways checkpoints are saved: rewritten with O_TRUNC (FUSE
# passthrough: a staging file, sealed behind the close), written to a temporary name and
# renamed over the file (torch.save through a temporary file; Megatron's and DeepSpeed's
# tracker files), and rewritten in place without O_TRUNC (the daemon's write queue), some of
# them fsync'd; large files are often caught half sealed. Every test runs on a mount with
# passthrough and on one without (the daemon's path for every write).
# CKPTFS_POWER_LOSS_ROUNDS rounds (4 by default), seeded.
import ctypes
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MS_SYNC, run, spec_sha, wait_for, write_and_keep_mapped

ROUNDS = int(os.environ.get("CKPTFS_POWER_LOSS_ROUNDS", "4"))
SEED = int(os.environ.get("CKPTFS_POWER_LOSS_SEED", "7011"))
MiB = 1 << 20

# argv: mount root, journal path, seed. Journal: "begin PATH SEED:SIZE SYNC", then
# "done PATH SHA SYNC" once the new version is in place (and durable, SYNC=1).
WORKER = r"""
import hashlib, os, random, sys
root, journal, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
j = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
print("ready", flush=True)

def fill(fd, dseed, size):
    r, h = random.Random(dseed), hashlib.sha256()
    for at in range(0, size, 1 << 20):
        b = r.randbytes(min(1 << 20, size - at))
        h.update(b)
        os.pwrite(fd, b, at)
    return h.hexdigest()

while True:
    path = f"f{rng.randrange(12):02d}"
    sync = rng.random() < 0.4
    style = rng.choice(["trunc", "rename", "inplace"])
    # Tracker files (a few bytes: their chunks are written through the page cache), checkpoint
    # shards of a few MiB (chunk files written with O_DIRECT), and larger ones (often caught
    # half sealed).
    kind = rng.random()
    if kind < 0.25:
        size = rng.randrange(1, 4096)
    else:
        mib = rng.randrange(1, 9) if kind < 0.85 else rng.randrange(16, 48)
        size = mib * (1 << 20) - rng.randrange(4096)
    dseed = rng.getrandbits(32)
    os.write(j, f"begin {path} {dseed}:{size} {int(sync)}\n".encode())
    full = os.path.join(root, path)
    if style == "rename":
        fd = os.open(full + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    elif style == "inplace":
        fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o644)
    else:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sha = fill(fd, dseed, size)
    if style == "inplace":
        os.ftruncate(fd, size)
    if sync:
        os.fsync(fd)
    os.close(fd)
    if style == "rename":
        os.rename(full + ".tmp", full)
        if sync:  # a durable rename: the directory too
            d = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(d)
            os.close(d)
    os.write(j, f"done {path} {sha} {int(sync)}\n".encode())
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
    """(shas the file may hold, whether it may be absent)."""
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
    return shas, last_sync < 0


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


@pytest.mark.timeout(120 + ROUNDS * 120)
@pytest.mark.parametrize("options", ["", "passthrough=0"], ids=["passthrough", "daemon-path"])
def test_power_loss_keeps_a_whole_version_of_every_file(make_mount, workdir, disks, options):
    rng = random.Random(SEED)
    disk = disks("disk0")
    disk.format(2 << 30)
    disk.attach()
    totals = {"exact": 0, "absent": 0, "older": 0}
    for k in range(ROUNDS):
        # Each round on a cache directory of its own (the earlier ones stay on the disk).
        cache, journal = f"cache{k}", workdir / f"journal{k}"
        m = make_mount(cache=disk.where / cache, name=f"r{k}", options=options or None)
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(m.mnt), str(journal),
                                   str(SEED + k)], stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "ready"
        time.sleep(0.5 + rng.random() * 4.5)
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
        m2 = make_mount(cache=disk.where / cache, name=f"r{k}-after", options=options or None,
                        env={"CKPTFS_BOOT_ID": f"after-power-loss-{k}"})
        lines = journal.read_text().splitlines()
        paths = sorted({line.split()[1] for line in lines})
        present = {p for p in os.listdir(m2.mnt) if not p.endswith(".tmp")}
        outcome = {"exact": 0, "absent": 0, "older": 0}
        for path in paths:
            shas, may_be_absent = allowed_outcomes(lines, path)
            if path not in present:
                assert may_be_absent, f"{path}: fsync'd, gone after the power loss"
                outcome["absent"] += 1
                continue
            try:
                with open(m2.mnt / path, "rb") as f:
                    got = hashlib.sha256(f.read()).hexdigest()
            except OSError as e:
                raise AssertionError(f"{path}: unreadable after the power loss: {e}") from e
            assert got in shas, f"{path}: reads bytes no write gave it since its last fsync"
            newest = [line.split()[2] for line in lines if line.startswith(f"done {path} ")]
            outcome["exact" if newest and got == newest[-1] else "older"] += 1
        print(f"\npower loss {k} ({options or 'passthrough'}): {len(lines)} journal lines, "
              f"files {outcome}")
        for key in totals:
            totals[key] += outcome[key]
        assert "recovered from an unclean stop" in m2.log()
        m2.stats()  # the metadata reads
        # A clean stop after the recovery leaves a store that mounts again, reading the same.
        m2.umount()
        m2.mount()
        assert {p for p in os.listdir(m2.mnt) if not p.endswith(".tmp")} == present
        m2.umount()
    print(f"\npower loss ({options or 'passthrough'}), all rounds: {totals}")
    disk.detach()


@pytest.mark.timeout(300)
def test_power_loss_keeps_what_msync_wrote_through_a_mapping_kept_after_close(
        make_mount, workdir, disks):
    # FUSE passthrough maps the staging file itself: msync syncs it without the daemon seeing
    # it, so the file's staged record must be durable while such a mapping may still write.
    disk = disks("disk0")
    disk.format(1 << 30)
    disk.attach()
    m = make_mount(cache=disk.where / "cache", name="m", options="passthrough=1")
    n = 4 * MiB
    old = os.urandom(n)
    libc, addr = write_and_keep_mapped(m.mnt / "a.bin", old)
    try:
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")  # held: the mapping still writes
        held = "a process still writes it through a mapping"
        assert held in wait_for(m.log, lambda log: held in log, timeout=30)
        ctypes.memset(addr, 0x42, n)
        assert libc.msync(addr, n, MS_SYNC) == 0
        # The power goes right after msync returned.
        daemon = m.daemon_pid()
        stop_all([daemon])
        nxt = disks("disk1")
        run(["cp", "--sparse=always", disk.image, nxt.image], timeout=300)
        os.kill(daemon, signal.SIGKILL)
    finally:
        libc.munmap(addr, n)
    m.force_umount()
    disk.detach()
    nxt.attach()
    m2 = make_mount(cache=nxt.where / "cache", name="m-after", options="passthrough=1",
                    env={"CKPTFS_BOOT_ID": "after-power-loss-mapping"})
    with open(m2.mnt / "a.bin", "rb") as f:
        assert f.read() == b"\x42" * n, "what msync wrote is gone after the power loss"
    m2.umount()
    nxt.detach()
