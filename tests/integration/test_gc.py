# `ckptfs gc` against a real backend (a file:// directory and radosgw). --dry-run: after files are
# deleted through a mount, it counts exactly the chunks no remaining record references (a chunk
# shared with a remaining file is not counted) and deletes nothing; it refuses to run without
# --dry-run or --grace, or with a record it cannot read. --grace: rounds run in a loop while two
# mounts with injected backend faults save and delete; no committed file loses a chunk, every
# remaining file reads back on a cold mount, and the bucket ends holding only what records name.
# Runs in /usr/bin/python3.
import json
import os
import random
import shutil
import threading
import time

import pytest

from conftest import CKPTFS_BIN, read_file, run, wait_for, write_file
from test_remote import REMOTE_CHUNKS, mount_on, new_remote, state_of, wait_state  # noqa: F401

MiB = 1 << 20


def gc(remote, *args, timeout=120):
    env = {**os.environ, **(remote.env or {})}
    return run([CKPTFS_BIN, "gc", *remote.mount_args, *args], check=False, env=env,
               timeout=timeout)


def field(out, name):
    line = next(l for l in out.splitlines() if l.startswith(name))
    return int(line.split()[1])


def save_and_delete(mounts, seed, max_steps, expect, wait_s):
    """Each mount saves two ranks a step, for 30 s or max_steps steps, and deletes its steps but
    the last two through the mount; `expect` gets {path: bytes} of what remains, and every mount
    has uploaded its files (within wait_s). Steps reuse blocks across steps and mounts: garbage
    chunks are often saved again, the case in which a node finds a condemned chunk in a tier and
    skips its upload."""
    rng = random.Random(seed)
    blocks = [os.urandom(384 * 1024) for _ in range(8)]
    deadline = time.monotonic() + 30
    step = 0
    while time.monotonic() < deadline and step < max_steps:
        for tag, m in mounts.items():
            os.mkdir(m / f"{tag}-{step}")
            for rank in range(2):
                name = f"{tag}-{step}/rank-{rank}.bin"
                data = b"".join(rng.choice(blocks) for _ in range(rng.randint(1, 4)))
                data += os.urandom(rng.randint(0, 200 * 1024))
                write_file(m / name, data)
                expect[name] = data
            if step >= 2:  # keep the last two steps
                shutil.rmtree(m / f"{tag}-{step - 2}")
                for rank in range(2):
                    del expect[f"{tag}-{step - 2}/rank-{rank}.bin"]
        step += 1
        time.sleep(0.5)  # a job's compute between two checkpoints; rounds overlap the saves
    for tag, m in mounts.items():
        wait_state([m / n for n in expect if n.startswith(tag)], timeout=wait_s)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_gc_dry_run_counts_what_no_record_references(make_mount, new_remote, kind):
    remote = new_remote(kind)
    m = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    shared = os.urandom(2 * MiB)
    write_file(m / "keep.bin", shared)
    write_file(m / "copy.bin", shared)  # the same chunks as keep.bin
    write_file(m / "gone.bin", os.urandom(3 * MiB))
    for f in ("keep.bin", "copy.bin", "gone.bin"):
        assert wait_for(lambda: state_of(m / f), lambda s: s == "remote", 120) == "remote"
    gone_chunks = json.loads(os.getxattr(m / "gone.bin", "user.ckptfs.chunks"))["chunks"]
    chunks_before = len(remote.objects("chunks/"))

    p = gc(remote, "--dry-run")
    assert p.returncode == 0, p.stderr
    assert field(p.stdout, "chunks") == chunks_before
    assert field(p.stdout, "unreferenced") == 0, p.stdout

    os.unlink(m / "gone.bin")
    os.unlink(m / "copy.bin")
    assert wait_for(lambda: set(remote.objects("files/")), lambda k: k == {"files/keep.bin"}, 60) \
        == {"files/keep.bin"}
    p = gc(remote, "--dry-run")
    assert p.returncode == 0, p.stderr
    assert field(p.stdout, "records") == 1
    assert field(p.stdout, "unreferenced") == gone_chunks, p.stdout  # copy.bin's are keep.bin's
    assert len(remote.objects("chunks/")) == chunks_before  # a dry run deletes nothing

    p = gc(remote)
    assert p.returncode == 2 and "--grace" in p.stderr and "--dry-run" in p.stderr
    assert len(remote.objects("chunks/")) == chunks_before


@pytest.mark.timeout(120)
def test_gc_refuses_with_an_unreadable_record(make_mount, new_remote):
    remote = new_remote("file")
    m = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    write_file(m / "f.bin", os.urandom(MiB))
    assert wait_for(lambda: state_of(m / "f.bin"), lambda s: s == "remote", 120) == "remote"
    record = remote.root / "files.d" / "f.bin"
    good = record.read_bytes()
    # Its last byte belongs to the record's checksum: inverted, never left as it was (setting it
    # to a fixed value changed nothing when it already held that value, once in 256 runs).
    record.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    p = gc(remote, "--dry-run")
    assert p.returncode == 1 and "files/f.bin" in p.stderr and "checksum" in p.stderr, p.stderr
    assert "nothing was deleted" in p.stdout
    p = gc(remote, "--grace", "1")
    assert p.returncode == 1 and "files/f.bin" in p.stderr and "checksum" in p.stderr, p.stderr
    assert "nothing was deleted" in p.stdout
    assert "round" not in p.stdout  # nothing condemned


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_gc_rounds_while_two_mounts_save_and_delete_lose_nothing(make_mount, new_remote, kind):
    remote = new_remote(kind)
    options = REMOTE_CHUNKS + ",gc_window=1"
    faults = "fail=0.1,ops=put+get+head,seed="
    mounts = {tag: mount_on(make_mount, remote, tag, options=options, faults=faults + seed)
              for tag, seed in (("a", "3"), ("b", "5"))}
    stop = threading.Event()
    rounds = []

    def collect():
        while not stop.is_set():
            rounds.append(gc(remote, "--grace", "2", timeout=300))

    collector = threading.Thread(target=collect)
    collector.start()
    expect = {}
    try:
        save_and_delete(mounts, 1, 24, expect, wait_s=240)
        want = {"files/" + n for n in expect}
        assert wait_for(lambda: set(remote.objects("files/")), lambda k: k == want, 120) == want
    finally:
        stop.set()
        collector.join()
    assert all(p.returncode == 0 for p in rounds), [p.stdout + p.stderr for p in rounds]
    assert sum(field(p.stdout, "deleted") for p in rounds if "deleted" in p.stdout) > 0
    for m in mounts.values():
        assert "injected fault" in m.log()

    last = gc(remote, "--grace", "2")
    assert last.returncode == 0, last.stdout + last.stderr
    dry = gc(remote, "--dry-run")
    assert field(dry.stdout, "unreferenced") == 0, dry.stdout  # the bucket holds what records name
    assert field(dry.stdout, "records") == len(expect)
    cold = mount_on(make_mount, remote, "cold", options=REMOTE_CHUNKS)
    for name, data in expect.items():
        assert read_file(cold / name) == data, name
