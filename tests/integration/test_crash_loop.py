# kill -9 of the daemon at random moments of a checkpointing workload, then a remount, many
# times over (seeded; CKPTFS_CRASH_KILLS kills, 25 by default; scripts/crash_loop.sh runs the
# long variant). A worker process saves, overwrites, fsyncs, replaces by rename and deletes files
# in the mount, one operation at a time, and journals each one outside the mount before it
# starts and after it returns. After every remount:
#   - every file whose last operation returned holds exactly what it was given;
#   - the file of the operation in flight holds its old bytes, its new bytes, or (new, or being
#     unlinked) is absent: never torn, never empty in between;
#   - `ckptfs stats` adds up with the chunk files on disk, and nothing is left in staging;
#   - the recovery log line says what it swept.
# A file:// backend keeps the upload queue busy through the kills; at the end a fresh node reads
# every file from the backend alone.
import collections
import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import read_file, spec_sha, wait_for

KILLS = int(os.environ.get("CKPTFS_CRASH_KILLS", "25"))
SEED = int(os.environ.get("CKPTFS_CRASH_SEED", "20261126"))
MiB = 1 << 20

# The workload: argv = mount root, journal path, seed. Journal lines: "begin OP PATH ARG" (ARG:
# SEED:SIZE of the bytes being written, the source of a rename, "-" for unlink) and
# "end OP PATH SHA" (the SHA-256 of what PATH holds now; "-" once unlinked). Files of 1 to 12 MiB.
WORKER = r"""
import hashlib, os, random, sys
root, journal, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
j = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def note(line):
    os.write(j, (line + "\n").encode())
def save(path, spec, sync=False):
    # The bytes are made block by block as they are written (inside the operation's window).
    dseed, size = map(int, spec.split(":"))
    r, h = random.Random(dseed), hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for at in range(0, size, 1 << 20):
        block = r.randbytes(min(1 << 20, size - at))
        h.update(block)
        os.write(fd, block)
    if sync:
        os.fsync(fd)
    os.close(fd)
    return h.hexdigest()
print("ready", flush=True)
n = 0
while True:
    n += 1
    have = sorted(f for f in os.listdir(root) if f.startswith("f"))
    op = rng.choice(["new", "new", "overwrite", "fsync", "replace", "unlink"])
    if op in ("overwrite", "fsync", "replace", "unlink") and not have:
        op = "new"
    spec = f"{rng.getrandbits(32)}:{rng.randrange(1, 13) * (1 << 20) - rng.randrange(0, 4096)}"
    if op == "new":
        path = f"f{seed}-{n:05d}"
        note(f"begin new {path} {spec}")
        note(f"end new {path} {save(os.path.join(root, path), spec)}")
    elif op in ("overwrite", "fsync"):
        path = rng.choice(have)
        note(f"begin {op} {path} {spec}")
        note(f"end {op} {path} {save(os.path.join(root, path), spec, sync=op == 'fsync')}")
    elif op == "replace":  # torch.save to a temporary name, then rename over the old file
        path = rng.choice(have)
        tmp = f"tmp{seed}-{n:05d}"
        note(f"begin new {tmp} {spec}")
        sha = save(os.path.join(root, tmp), spec)
        note(f"end new {tmp} {sha}")
        note(f"begin rename {path} {tmp}")
        os.rename(os.path.join(root, tmp), os.path.join(root, path))
        note(f"end rename {path} {sha}")
    else:
        path = rng.choice(have)
        note(f"begin unlink {path} -")
        os.unlink(os.path.join(root, path))
        note(f"end unlink {path} -")
"""


def replay(journal):
    """(committed {path: sha}, the operation in flight or None: (op, path, arg))."""
    files, pending = {}, None
    for line in journal.read_text().splitlines():
        kind, op, path, arg = line.split()
        if kind == "begin":
            pending = (op, path, arg)
        elif op == "unlink":
            files.pop(path, None)
            pending = None
        elif op == "rename":
            files[path] = files.pop(pending[2])
            pending = None
        else:
            files[path] = arg
            pending = None
    return files, pending


def sha_of(path):
    return hashlib.sha256(read_file(path)).hexdigest()


def check_after_crash(root, journal):
    """Asserts the promises; returns the operation that was in flight and what its file holds
    now ('old', 'new' or 'absent')."""
    files, pending = replay(journal)
    present = {f for f in os.listdir(root) if f.startswith(("f", "tmp"))}
    in_flight = {pending[1], pending[2]} if pending else set()
    for path, sha in files.items():
        if path in in_flight:
            continue
        assert path in present, f"{path}: a closed file is gone"
        assert sha_of(root / path) == sha, f"{path}: a closed file holds other bytes"
    extra = present - set(files) - in_flight
    assert not extra, f"files no operation left behind: {sorted(extra)}"
    if not pending:
        return "idle", "-"
    op, path, arg = pending
    got = sha_of(root / path) if path in present else None
    size = os.stat(root / path).st_size if got else None
    if op == "new":
        assert got in (None, spec_sha(arg)), f"{path}: a new file being written reads as " \
                                             f"neither absent nor its whole new bytes ({size} bytes)"
        return op, "absent" if got is None else "new"
    if op in ("overwrite", "fsync"):
        assert got in (files[path], spec_sha(arg)), f"{path}: torn by the crash ({size} bytes)"
        return op, "old" if got == files[path] else "new"
    if op == "rename":
        if got == files[arg]:
            assert arg not in present, f"{arg} is still there after the rename"
            return op, "new"
        assert got == files[path], f"{path}: neither before nor after the rename"
        assert arg in present and sha_of(root / arg) == files[arg], f"{arg} lost by the rename"
        return op, "old"
    assert got in (None, files[path]), f"{path}: the file being unlinked changed"
    return op, "old" if got else "absent"


def stats_and_disk(m):
    """`ckptfs stats` and the chunk files on disk (bytes, count), taken again until they agree, for
    10 s at most. The store removes the chunk files a transaction freed after it commits
    (RunAfterCommit, the settle pass's reclaim), so just after stats returns a freed chunk's file
    may still be listed, or vanish while it is read; a lasting mismatch still fails."""
    def take():
        s = m.stats()
        try:
            return s, m.chunk_bytes_on_disk(), m.chunks_on_disk()
        except FileNotFoundError:
            return s, None, None
    return wait_for(take, lambda r: (r[1], r[2]) == (r[0]["stored_bytes"], r[0]["chunks"]),
                    timeout=10)


@pytest.mark.timeout(60 + KILLS * 25)
def test_kill_dash_nine_at_random_moments(make_mount, workdir):
    remote = workdir / "remote"
    remote.mkdir()
    backend = ["--backend", f"file://{remote}"]
    m = make_mount(args=backend, options="sync_interval=0")
    rng = random.Random(SEED)
    outcomes = collections.Counter()
    swept = collections.Counter()
    for k in range(KILLS):
        journal = workdir / f"journal-{k}"
        seed = SEED + k
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(m.mnt), str(journal),
                                   str(seed)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        assert worker.stdout.readline().strip() == "ready"
        # Spread over every phase: the first create, the middle of writes, the queue draining
        # at close, fsync, renames, unlinks, between operations; uploads run throughout.
        time.sleep(rng.choice([0.0, 0.05, 0.3]) + rng.random() * 1.5)
        log_before = len(m.log())
        m.kill_daemon()
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=60)
        m.umount()
        m.mount()
        op, held = check_after_crash(m.mnt, journal)
        outcomes[f"{op}:{held}"] += 1
        recovered = m.log()[log_before:]
        line = re.search(r"recovered from an unclean stop: (\d+) files unlinked while open, "
                         r"(\d+) new files never closed, and (\d+) unreferenced chunks removed",
                         recovered)
        assert line, recovered[-2000:]
        swept["new files"] += int(line.group(2))
        swept["chunks"] += int(line.group(3))
        s, disk_bytes, disk_chunks = stats_and_disk(m)
        assert s["stored_bytes"] == disk_bytes
        assert s["chunks"] == disk_chunks
        assert not os.listdir(m.cache / "staging")
        # The next round starts from what is there now: the journal of the survivors.
        carry = workdir / f"journal-{k + 1}"
        with open(carry, "w") as f:
            for path in sorted(os.listdir(m.mnt)):
                if path.startswith(("f", "tmp")):
                    f.write(f"end new {path} {sha_of(m.mnt / path)}\n")
    print(f"\ncrash loop, {KILLS} kills (seed {SEED}): in flight at the kill "
          f"{dict(sorted(outcomes.items()))}; swept {dict(swept)}")
    # Everything the last mount holds reaches the backend, and a fresh node reads it from there.
    names = sorted(f for f in os.listdir(m.mnt) if f.startswith(("f", "tmp")))
    want = {n: sha_of(m.mnt / n) for n in names}
    wait_for(lambda: [os.getxattr(m.mnt / n, "user.ckptfs.state") for n in names],
             lambda states: all(x == b"remote" for x in states), timeout=120)
    fresh = make_mount(args=backend, name="fresh")
    assert sorted(f for f in os.listdir(fresh.mnt) if f.startswith(("f", "tmp"))) == names
    for n in names:
        assert sha_of(fresh.mnt / n) == want[n], n
