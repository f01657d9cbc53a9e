# Faults of the local tier: a full cache disk (ENOSPC), a corrupted chunk file (EIO), and a
# failing cache disk: chunk file reads or writes (--cache-faults) and LMDB writes (an LD_PRELOAD
# shim, tests/store/lmdb_fault_shim.c) that fail.
import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, expect_errno, read_file, run, wait_for, write_file

MiB = 1 << 20


# torch.save(state of argv[3] MiB, argv[1]) by path or through a Python file object (argv[2]).
TORCH_SAVE = r"""
import sys, torch
path, how, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(1)
state = {"a": torch.randn(mib << 17, generator=g), "b": torch.randn(mib << 17, generator=g)}
try:
    if how == "path":
        torch.save(state, path)
    else:
        with open(path, "wb") as f:
            torch.save(state, f)
    print("saved", flush=True)
except Exception as e:
    print("raised", type(e).__name__, e, flush=True)
"""


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


@pytest.fixture
def small_disk(workdir):
    """A 64 MiB tmpfs to hold a cache directory; unmounted afterwards (after the ckptfs mount,
    which make_mount's teardown removes first: this fixture is set up before it)."""
    d = workdir / "small-disk"
    d.mkdir()
    run(["mount", "-t", "tmpfs", "-o", "size=64m", "ckptfs-test-tmpfs", d])
    yield d
    subprocess.run(["umount", str(d)], timeout=60, check=False)
    if os.path.ismount(d):
        subprocess.run(["umount", "-l", str(d)], timeout=60, check=False)


def write_until_error(path, total, seed):
    """Writes `total` bytes in 1 MiB pieces; returns the OSError seen at write() or close()."""
    rng = random.Random(seed)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    err = None
    try:
        for _ in range(total // MiB):
            os.write(fd, rng.randbytes(MiB))
    except OSError as e:
        err = e
    finally:
        try:
            os.close(fd)
        except OSError as e:
            err = err or e
    return err


@pytest.mark.timeout(300)
def test_cache_disk_full(small_disk, make_mount):
    m = make_mount(cache=small_disk / "cache")
    root = m.mnt
    keep = rand_bytes(4 * MiB, 1)
    write_file(root / "keep", keep)
    os.mkdir(root / "dir")
    write_file(root / "dir" / "small", b"small file")

    err = write_until_error(root / "huge", 200 * MiB, 2)
    assert err is not None, "writing 200 MiB onto a 64 MiB cache disk succeeded"
    assert err.errno == errno.ENOSPC, err
    # (The daemon's log lives on the full disk too: what it says about this may be lost.)

    # The store is consistent: what was there before reads back; the partial file is no bigger
    # than what fitted and can be deleted.
    assert read_file(root / "keep") == keep
    assert read_file(root / "dir" / "small") == b"small file"
    assert os.stat(root / "huge").st_size < 64 * MiB
    os.unlink(root / "huge")
    assert sorted(os.listdir(root)) == ["dir", "keep"]
    # The failed writer's chunks are reclaimed: the tier holds only what manifests reference.
    s = wait_for(m.stats, lambda s: s["stored_bytes"] == m.chunk_bytes_on_disk())
    assert s["files"] == 2
    assert s["stored_bytes"] == m.chunk_bytes_on_disk() == len(keep) + len(b"small file")
    # Space is back: new files can be written.
    fresh = rand_bytes(8 * MiB, 3)
    write_file(root / "fresh", fresh)
    assert read_file(root / "fresh") == fresh

    # torch.save of a state dict that does not fit fails instead of leaving a checkpoint, and an
    # existing checkpoint it was meant to replace keeps its previous version. (In a subprocess:
    # PyTorch 1.13 aborts the process when its zip writer's destructor fails after the error.)
    small_state = {"w": torch.arange(10.0)}
    torch.save(small_state, root / "ok.pt")
    for target, how in (("too-big.pt", "path"), ("ok.pt", "path"), ("ok.pt", "fileobj")):
        p = subprocess.run([sys.executable, "-c", TORCH_SAVE, str(root / target), how, "192"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        assert "saved" not in p.stdout, (target, how, p.stdout, p.stderr[-2000:])
        assert p.returncode != 0 or "raised" in p.stdout, (target, how, p.stdout)
    assert os.stat(root / "too-big.pt").st_size == 0  # created, but no bytes were committed
    os.unlink(root / "too-big.pt")
    assert torch.equal(torch.load(root / "ok.pt")["w"], small_state["w"])

    # A clean unmount and a remount keep all of it.
    m.remount()
    assert read_file(root / "keep") == keep
    assert read_file(root / "fresh") == fresh
    assert sorted(os.listdir(root)) == ["dir", "fresh", "keep", "ok.pt"]


def saved_state(mib):
    g = torch.Generator().manual_seed(1)
    return {"a": torch.randn(mib << 17, generator=g), "b": torch.randn(mib << 17, generator=g)}


@pytest.mark.timeout(300)
def test_disk_full_at_the_margin_never_loses_a_checkpoint_silently(small_disk, make_mount):
    # torch.save by path ignores errors from close(2), so a full disk must fail a write(2): sizes
    # around the free space either save completely (and load back equal) or fail visibly while
    # the checkpoint being replaced keeps its previous version.
    m = make_mount(cache=small_disk / "cache")
    root = m.mnt
    old = {"w": torch.arange(1000.0)}
    torch.save(old, root / "ckpt.pt")
    outcomes = []
    for mib in (8, 16, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 96):
        p = subprocess.run([sys.executable, "-c", TORCH_SAVE, str(root / "ckpt.pt"), "path",
                            str(mib)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        back = torch.load(root / "ckpt.pt")
        if "saved" in p.stdout and p.returncode == 0:
            want = saved_state(mib)
            assert all(torch.equal(back[k], want[k]) for k in want), f"{mib} MiB: saved but wrong"
            outcomes.append((mib, "saved"))
            torch.save(old, root / "ckpt.pt")  # back to the small one for the next size
        else:
            assert torch.equal(back["w"], old["w"]), f"{mib} MiB: failed and lost the old version"
            outcomes.append((mib, "failed"))
    assert (8, "saved") in outcomes, outcomes
    assert (96, "failed") in outcomes, outcomes


def chunk_of(m, data):
    """The local tier's chunks (chunk files or pack extents) whose bytes occur in `data`:
    {chunk id hex: (offset in data, length)}."""
    out = {}
    for name, (path, at, length) in m.chunk_locations().items():
        with open(path, "rb") as f:
            f.seek(at)
            b = f.read(length)
        off = data.find(b)
        if off >= 0:
            out[name] = (off, len(b))
    return out


def test_corrupt_chunk_reads_fail_with_eio(make_mount):
    m = make_mount()
    root = m.mnt
    victim = rand_bytes(16 * MiB, 10)
    write_file(root / "victim", victim)
    m.umount()
    chunks = chunk_of(m, victim)
    assert sum(n for _, n in chunks.values()) == len(victim)
    # A chunk well inside the file, at least 2 MiB from both ends.
    inner = sorted((off, n, p) for p, (off, n) in chunks.items()
                   if off >= 3 * MiB and off + n <= len(victim) - 3 * MiB)
    assert inner, chunks
    bad_off, bad_len, bad_name = inner[len(inner) // 2]
    m.corrupt_chunk(bad_name)  # where it lies: its chunk file, or its extent in a pack

    m.mount()
    other = rand_bytes(3 * MiB, 11)
    write_file(root / "other", other)
    # Reads of the damaged range fail with EIO...
    with open(root / "victim", "rb", buffering=0) as f:
        expect_errno(errno.EIO, os.pread, f.fileno(), 4096, bad_off + bad_len // 2)
        expect_errno(errno.EIO, os.pread, f.fileno(), bad_len, bad_off)
        # ... again (the daemon moved the bad chunk aside; it stays unreadable) ...
        expect_errno(errno.EIO, os.pread, f.fileno(), 100, bad_off)
        # ... and ranges far from it read correctly.
        assert os.pread(f.fileno(), MiB, 0) == victim[:MiB]
        assert os.pread(f.fileno(), MiB, len(victim) - MiB) == victim[-MiB:]
    # Never wrong bytes: every piece either fails with EIO or matches.
    failed = 0
    with open(root / "victim", "rb", buffering=0) as f:
        for off in range(0, len(victim), 64 * 1024):
            try:
                got = os.pread(f.fileno(), 64 * 1024, off)
            except OSError as e:
                assert e.errno == errno.EIO
                failed += 1
                continue
            # A short read may stop before the damage; what comes back is right.
            assert len(got) > 0 and got == victim[off:off + len(got)], off
            assert off + len(got) <= bad_off or off >= bad_off + bad_len, "read damaged bytes"
    assert failed >= bad_len // (64 * 1024)
    # The whole-file read fails rather than returning something.
    expect_errno(errno.EIO, read_file, root / "victim")
    log = m.log()
    assert "corrupt" in log and bad_name in log, log[-2000:]
    # Other files are fine, and a fresh copy of the same bytes heals the store.
    assert read_file(root / "other") == other
    write_file(root / "victim", victim)
    assert read_file(root / "victim") == victim
    m.remount()
    assert read_file(root / "victim") == victim


# --- a failing cache disk (--cache-faults: chunk file reads or writes fail on command) ---

def remount_with(m, faults):
    m.umount()
    m.args = ["--cache-faults", faults] if faults else []
    m.mount()


@pytest.mark.timeout(180)
def test_chunk_read_errors_fail_reads_with_eio_and_lose_nothing(make_mount):
    m = make_mount()
    files = {f"f{i}": rand_bytes((i + 1) * 3 * MiB, 20 + i) for i in range(3)}
    for name, data in files.items():
        write_file(m / name, data)
    remount_with(m, "ops=read,error=eio")  # a fresh daemon: nothing in its RAM tier
    expect_errno(errno.EIO, read_file, m / "f1")
    assert "reading chunk" in m.log() and "injected cache disk fault" in m.log()
    # The daemon stays up and keeps serving what does not need the disk's reads.
    write_file(m / "new", b"written while reads fail")
    assert sorted(os.listdir(m.mnt)) == sorted([*files, "new"])
    # A read error is no corruption: nothing was moved aside, and with a healthy disk again
    # every byte is there.
    assert not os.listdir(m.cache / "chunks" / "corrupt")
    remount_with(m, None)
    for name, data in files.items():
        assert read_file(m / name) == data, name
    assert read_file(m / "new") == b"written while reads fail"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("error", ["eio", "enospc"])
def test_chunk_write_errors_mid_save_keep_the_previous_version(make_mount, error):
    # The daemon's write path (in passthrough mode the save goes to a staging file, and chunks
    # are written by the seal: see the test below).
    m = make_mount(options="passthrough=0")
    old = rand_bytes(6 * MiB, 30)
    write_file(m / "ckpt.pt", old)
    other = rand_bytes(2 * MiB, 31)
    write_file(m / "other.pt", other)
    # The disk starts failing 8 MiB into the next save.
    remount_with(m, f"ops=write,error={error},after=8M")
    err = write_until_error(m / "ckpt.pt", 64 * MiB, 32)
    assert err is not None and err.errno == (errno.EIO if error == "eio" else errno.ENOSPC), err
    assert "writing chunk" in m.log() and "keeps its previously committed bytes" in m.log()
    # Nothing committed is lost, and the daemon serves on.
    assert read_file(m / "ckpt.pt") == old
    assert read_file(m / "other.pt") == other
    remount_with(m, None)  # a healthy disk: a later mount is clean
    assert "recovered from an unclean stop" not in m.log()
    assert read_file(m / "ckpt.pt") == old
    new = rand_bytes(12 * MiB, 33)
    write_file(m / "ckpt.pt", new)
    assert read_file(m / "ckpt.pt") == new
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("packs", ["0", "1"])
def test_chunk_write_errors_during_a_seal_lose_nothing(make_mount, packs):
    # The seal behind a passthrough save. (Through the daemon's write path the failing disk is
    # met by the write itself, which fails with EIO: a different test.) With packs the seal
    # writes chunk files only when a reader still holds the staging file (store/pack_sink.h):
    # here one does; without one it writes none (the test below).
    m = make_mount(options=f"passthrough=1,packs={packs}")
    assert "passthrough on" in wait_for(m.log, lambda log: "passthrough on" in log, timeout=10)
    old = rand_bytes(6 * MiB, 40)
    write_file(m / "ckpt.pt", old)
    assert m.stats()["stored_bytes"] == 6 * MiB  # sealed: in chunks
    remount_with(m, "ops=write,error=eio")
    new = rand_bytes(12 * MiB, 41)
    reader = None
    if packs == "1":
        wfd = os.open(m / "ckpt.pt", os.O_WRONLY | os.O_TRUNC)
        os.write(wfd, new)
        reader = os.open(m / "ckpt.pt", os.O_RDONLY)  # joins the staging file
        os.close(wfd)
    else:
        write_file(m / "ckpt.pt", new)  # into a staging file: the chunk disk is not involved
    assert read_file(m / "ckpt.pt") == new
    # The seal cannot write a chunk: the staged bytes stay, and say so.
    err = None
    try:
        os.getxattr(m / "ckpt.pt", "user.ckptfs.chunks")
    except OSError as e:
        err = e
    assert err is not None and err.errno == errno.EIO, err
    assert "writing chunk" in m.log()
    assert read_file(m / "ckpt.pt") == new
    assert len(os.listdir(m.cache / "passthrough")) == 1
    if reader is not None:
        assert os.pread(reader, MiB, 5 * MiB) == new[5 * MiB:6 * MiB]
        os.close(reader)
    # A healthy disk: the next mount seals them, and everything is in chunks.
    remount_with(m, None)
    assert read_file(m / "ckpt.pt") == new
    s = m.stats()
    assert s["files"] == 1 and s["logical_bytes"] == 12 * MiB
    assert s["stored_bytes"] == m.chunk_bytes_on_disk()
    assert not os.listdir(m.cache / "passthrough")


@pytest.mark.timeout(180)
def test_a_seal_into_a_pack_writes_no_chunk_and_pack_read_errors_lose_nothing(make_mount):
    # With packs a seal with no reader left adopts its staging file as a pack: the chunk disk's
    # writes may all fail, the seal needs none. What can fail is reading the pack's extents:
    # a clear EIO, nothing moved aside or dropped, every byte back on a healthy disk.
    m = make_mount(options="passthrough=1,packs=1")
    assert "passthrough on" in wait_for(m.log, lambda log: "passthrough on" in log, timeout=10)
    old = rand_bytes(6 * MiB, 45)
    write_file(m / "ckpt.pt", old)
    assert m.stats()["stored_bytes"] == 6 * MiB  # sealed: in a pack
    remount_with(m, "ops=write,error=eio")
    new = rand_bytes(12 * MiB, 46)
    write_file(m / "ckpt.pt", new)
    usage = json.loads(os.getxattr(m / "ckpt.pt", "user.ckptfs.chunks"))  # sealed
    assert usage["chunks"] > 0, usage
    assert "writing chunk" not in m.log()
    assert not m.chunk_files()
    # The new version's chunks are extents of its pack (the old one's may linger until reclaimed).
    mine = chunk_of(m, new)
    assert len(mine) == usage["chunks"] and sum(n for _, n in mine.values()) == 12 * MiB
    extents = {k: v for k, v in m.pack_extents().items() if k in mine}
    assert len(extents) == len(mine)
    assert m.stats()["stored_bytes"] == m.chunk_bytes_on_disk()
    assert not os.listdir(m.cache / "passthrough")
    # A disk whose reads fail: a fresh daemon (nothing in its RAM tier) reads the pack.
    remount_with(m, "ops=read,error=eio")
    expect_errno(errno.EIO, read_file, m / "ckpt.pt")
    assert "reading chunk" in m.log() and "injected cache disk fault" in m.log()
    assert not os.listdir(m.cache / "chunks" / "corrupt")
    # A read error is no corruption: no extent dropped.
    assert extents.items() <= m.pack_extents().items()
    remount_with(m, None)
    assert read_file(m / "ckpt.pt") == new
    assert extents.items() <= m.pack_extents().items()


@pytest.mark.timeout(120)
def test_a_reader_between_a_failed_close_and_its_release_gets_the_previous_version(
        make_mount, workdir):
    # The kernel sends a passthrough writer's release after its close(2) has returned; here it
    # reaches the store a second later, and a reader opens the file in between.
    trigger = workdir / "lmdb-fails"
    m = make_mount(options="passthrough=1",
                   env={"LD_PRELOAD": str(lmdb_fault_shim()),
                        "CKPTFS_TEST_LMDB_FAULT": str(trigger),
                        "CKPTFS_TEST_RELEASE_DELAY_MS": "1000"})
    # The daemon logs it when the kernel's INIT arrives, which may be after mount returned.
    assert "passthrough on" in wait_for(m.log, lambda log: "passthrough on" in log, timeout=10)
    old = rand_bytes(3 * MiB, 53)
    write_file(m / "ckpt.pt", old)
    m.stats()  # sealed: no commit of it is left
    trigger.touch()
    for attempt in range(3):
        with pytest.raises(OSError) as e:
            write_file(m / "ckpt.pt", rand_bytes(4 * MiB, 54 + attempt))
        assert e.value.errno == errno.EIO
        # Before the release: the file is still what was committed.
        assert read_file(m / "ckpt.pt") == old
        assert os.stat(m / "ckpt.pt").st_size == len(old)
    trigger.unlink()
    # The failed sessions are dropped for good: a healthy disk does not bring them back.
    m.remount()
    assert read_file(m / "ckpt.pt") == old
    assert not os.listdir(m.cache / "passthrough")


def lmdb_fault_shim():
    """The LD_PRELOAD shim that fails LMDB's data file writes while a trigger file exists."""
    env = os.environ.get("CKPTFS_LMDB_FAULT_SHIM")
    shim = Path(env) if env else REPO_ROOT / "build" / "tests" / "libckptfs_lmdb_fault_shim.so"
    assert shim.is_file(), f"{shim} is missing: build the ckptfs_lmdb_fault_shim target"
    return shim


@pytest.mark.timeout(180)
@pytest.mark.parametrize("passthrough", ["0", "1"])
def test_metadata_write_errors_fail_the_commit_and_lose_nothing(make_mount, workdir, passthrough):
    trigger = workdir / "lmdb-fails"
    m = make_mount(options=f"passthrough={passthrough}",
                   env={"LD_PRELOAD": str(lmdb_fault_shim()),
                        "CKPTFS_TEST_LMDB_FAULT": str(trigger)})
    old = rand_bytes(5 * MiB, 50)
    write_file(m / "ckpt.pt", old)
    other = rand_bytes(MiB, 51)
    write_file(m / "other.pt", other)
    m.stats()  # (passthrough) the files closed so far are sealed: no commit of theirs is left
    trigger.touch()  # the disk under the metadata starts failing
    new = rand_bytes(7 * MiB, 52)
    err = None
    try:
        write_file(m / "ckpt.pt", new)
    except OSError as e:
        err = e
    assert err is not None and err.errno == errno.EIO, err
    assert "could not be committed" in m.log()
    # Nothing committed is lost; the daemon is up and reads on.
    assert read_file(m / "ckpt.pt") == old
    assert read_file(m / "other.pt") == other
    trigger.unlink()  # healthy again: commits work, and a later mount is clean
    write_file(m / "ckpt.pt", new)
    m.remount()
    assert read_file(m / "ckpt.pt") == new
    assert read_file(m / "other.pt") == other
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk()
