# Packs (-o packs=1): a seal keeps its passthrough staging file as the home of its new chunks
# (chunks/packs/<name>.pack, indexed by <name>.idx) and punches out the chunks stored already.
# What must hold: every closed file reads back bitwise after a kill -9 of the daemon at any
# moment of the seals (a pack half sealed, half punched), `fsck --deep` finds nothing wrong, a
# corrupt extent is reported and repaired from a tier as a corrupt chunk file is, and eviction
# returns a pack's room. The chunks the daemon writes itself (passthrough=0, fetches from a tier)
# are appended to packs of its own (chunks/packs/append.<ns>.pack): no chunk file, every
# fsync'd file kept through a kill -9 mid-save.
import ctypes
import json
import mmap
import os
import random
import threading
import time

import pytest

from conftest import CKPTFS_BIN, MS_SYNC, read_file, run, wait_for, write_and_keep_mapped, write_file

MiB = 1 << 20
PACKS = "passthrough=1,packs=1"


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def fsck(path, *flags):
    p = run([CKPTFS_BIN, "fsck", path, "--json", *flags], check=False)
    assert p.returncode in (0, 1), f"fsck could not run ({p.returncode}): {p.stderr}"
    return p.returncode, json.loads(p.stdout)


def allocated(path):
    return os.stat(path).st_blocks * 512


def saves(m, round_):
    """Files saved the ways a job does: new bytes, some fsync'd, and copies of files stored
    before (so that seals punch)."""
    files = {}
    for i in range(6):
        data = rand_bytes(random.Random(round_ * 10 + i).randrange(4 * MiB, 24 * MiB),
                          1000 * round_ + i)
        files[f"r{round_}-new-{i}.pt"] = data
        write_file(m / f"r{round_}-new-{i}.pt", data, fsync=i % 2 == 0)
    for i in range(3):
        src = f"r{round_}-new-{i}.pt"
        data = files[src] + rand_bytes(MiB, 2000 * round_ + i)  # shared head, new tail
        files[f"r{round_}-copy-{i}.pt"] = data
        write_file(m / f"r{round_}-copy-{i}.pt", data, fsync=i == 0)
    return files


@pytest.mark.timeout(600)
def test_kill_dash_nine_during_and_after_seals_keeps_every_closed_file(make_mount):
    m = make_mount(options=PACKS)
    kept = {}
    for round_, delay in enumerate([0.0, 0.05, 0.3, 1.0, None]):
        kept.update(saves(m, round_))
        if delay is None:
            # Every seal done (packs made, duplicates punched), then the kill.
            os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
            assert m.pack_extents(), "sealed files live in packs"
            assert not os.listdir(m.cache / "passthrough")
        else:
            time.sleep(delay)  # the seals the closes queued are running
        m.crash_and_remount()
        for name, data in kept.items():
            assert read_file(m / name) == data, f"round {round_}: {name}"
        code, r = fsck(m.mnt, "--deep")
        assert code == 0 and r["clean"], r
    # Sealed after the last remount: the staging files are packs now, and they hold the files.
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    assert not os.listdir(m.cache / "passthrough")
    ext = m.pack_extents()
    assert ext
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk() and s["chunks"] == m.chunks_on_disk(), s
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"] and r["unreferenced_chunk_files"] == 0, r
    m.remount()
    for name, data in kept.items():
        assert read_file(m / name) == data, name
    # Deleting every file empties every pack: none is left.
    for name in kept:
        os.unlink(m / name)
    assert wait_for(lambda: list((m.chunks_dir / "packs").iterdir()), lambda v: not v, 30) == []


@pytest.mark.timeout(300)
def test_a_corrupt_extent_is_reported_and_repaired_from_a_tier(make_mount, workdir):
    backend = workdir / "backend"
    backend.mkdir()
    m = make_mount(options=PACKS, args=["--backend", f"file://{backend}"])
    data = rand_bytes(12 * MiB, 5)
    write_file(m / "f.bin", data)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    assert wait_for(lambda: os.getxattr(m / "f.bin", "user.ckptfs.state").decode(),
                    lambda s: s == "remote", 120) == "remote"
    ext = m.pack_extents()
    assert ext and not m.chunk_files(), "the seal wrote no chunk file"
    cid, (pack, off, length) = sorted(ext.items())[0]
    with open(pack, "r+b") as f:
        f.seek(off + length // 2)
        b = f.read(1)
        f.seek(off + length // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    m.remount()  # no page of the file is cached in the kernel any more
    code, r = fsck(m.mnt, "--deep", "--repair")
    assert r["local_corrupt"] == 1 and r["local_repaired"] == 1, r
    assert not m.chunk_files()
    assert m.pack_extents()[cid][0] != pack, "fetched back, kept in a pack of the daemon's own"
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    assert read_file(m / "f.bin") == data
    # Without --repair the damage is reported, and the read is served from the tier.
    cid, (pack, off, length) = sorted(m.pack_extents().items())[0]
    with open(pack, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    m.remount()
    code, r = fsck(m.mnt, "--deep")
    assert code == 1 and r["local_corrupt"] == 1 and not r["clean"], r
    assert read_file(m / "f.bin") == data


@pytest.mark.timeout(300)
def test_eviction_punches_packs_and_reads_fetch_back(make_mount, workdir):
    backend = workdir / "backend"
    backend.mkdir()
    m = make_mount(options=PACKS + ",cache_size=16M", args=["--backend", f"file://{backend}"])
    files = {f"f{i}.bin": rand_bytes(16 * MiB, 40 + i) for i in range(4)}
    for name, data in files.items():
        write_file(m / name, data)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    for name in files:
        assert wait_for(lambda: os.getxattr(m / name, "user.ckptfs.state").decode(),
                        lambda s: s == "remote", 120) == "remote"
    # Eviction runs as chunks land remotely and as the tier is read: a read of each file.
    for name, data in files.items():
        assert read_file(m / name) == data
    packs = list((m.chunks_dir / "packs").glob("*.pack"))
    held = sum(allocated(p) for p in packs)
    assert held <= 40 * MiB, (held, packs)  # 64 MiB saved, 16 MiB allowed, some slack
    m.remount()
    for name, data in files.items():
        assert read_file(m / name) == data
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def seal_and_copy(m, data):
    """Seals what is staged, then saves `data` again as b.pt (whose chunks, found stored, are
    punched out of its own pack) and seals that too."""
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    write_file(m / "b.pt", data)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    drop_caches()


@pytest.mark.timeout(300)
def test_a_writable_mapping_kept_after_close_never_changes_a_pack(make_mount):
    # FUSE passthrough hands mmap to the staging file itself: the mapping can write it after the
    # descriptor's close, which the daemon sees as the last writer's release.
    m = make_mount(options=PACKS)
    n = 8 * MiB
    data = rand_bytes(n, 5)
    libc, addr = write_and_keep_mapped(m / "a.pt", data)
    try:
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
        ctypes.memset(addr, 0x41, n)  # written after the close and the seal
        assert libc.msync(ctypes.c_void_p(addr), ctypes.c_size_t(n), MS_SYNC) == 0
        seal_and_copy(m, data)
        assert read_file(m / "b.pt") == data
        assert read_file(m / "a.pt") == b"A" * n  # the mapping's bytes are the file's
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(n))
    assert "is corrupt" not in m.log()
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r


@pytest.mark.timeout(300)
def test_a_writer_left_from_a_killed_daemon_never_changes_a_pack(make_mount):
    # Passthrough writes never reach the daemon: a descriptor opened before a kill -9 still
    # writes the staging file that the next daemon's resumed seal takes up.
    m = make_mount(options=PACKS)
    n = 8 * MiB
    data = rand_bytes(n, 6)
    w1 = os.open(m / "a.pt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(w1, data)
    w2 = os.open(m / "a.pt", os.O_WRONLY)  # joins the staging file
    os.close(w1)  # a.pt's bytes are recorded: the staging file
    m.kill_daemon()
    m.force_umount()  # lazily: w2 keeps the dead connection's staging file open
    m.mount()  # the staged record survives (same boot); its seal resumes
    try:
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
        try:
            os.pwrite(w2, b"B" * n, 0)
        except OSError:
            pass  # refused is fine too: what matters is what the files read
        seal_and_copy(m, data)
        assert read_file(m / "b.pt") == data
        assert read_file(m / "a.pt") == data
    finally:
        try:
            os.close(w2)
        except OSError:
            pass
    assert "is corrupt" not in m.log()
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r


def pack_of(m, data_ids):
    """The pack holding most of the extents `data_ids` (chunk ids hex)."""
    ext = m.pack_extents()
    packs = [ext[c][0] for c in data_ids if c in ext]
    return max(set(packs), key=packs.count)


def save_as_pack(m, name, make):
    """Saves make(attempt) as `name` and seals it until the seal made its staging file a pack
    (one that ran before the daemon saw the close copies the chunks instead). Returns the bytes
    and the pack."""
    for attempt in range(5):
        before = set(m.pack_extents())
        data = make(attempt)
        write_file(m / name, data)
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
        new = [c for c in m.pack_extents() if c not in before]
        if new:
            return data, pack_of(m, new)
    pytest.fail(f"{name} was never sealed as a pack")


@pytest.mark.timeout(300)
def test_ranges_a_seal_stopped_before_its_punch_left_are_punched_at_the_next_start(make_mount):
    # A kill -9 between a seal's commit and its punch leaves the chunks that the file shares with
    # one stored before in its pack, never punched: the next start punches what no extent holds.
    m = make_mount(options=PACKS)
    a = rand_bytes(16 * MiB, 60)
    write_file(m / "a.pt", a)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    b, pack = save_as_pack(m, "b.pt", lambda i: a + rand_bytes(2 * MiB, 61 + i))
    live = sorted((off, n) for p, off, n in m.pack_extents().values() if p == pack)
    m.umount()
    # The state that kill leaves: the head, a's chunks, still there in b's pack.
    with open(pack, "r+b") as f:
        f.write(rand_bytes(live[0][0], 62))
        os.fsync(f.fileno())
    unpunched = allocated(pack)
    assert unpunched >= 15 * MiB
    m.mount()
    assert allocated(pack) <= sum(n for _, n in live) + 64 * 1024, (allocated(pack), unpunched)
    assert read_file(m / "a.pt") == a
    assert read_file(m / "b.pt") == b
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r


def share_head(m, seed):
    """a.pt (24 MiB) sealed into its pack, then b.pt, whose first 4 MiB are a's: once a.pt goes,
    its pack holds b's head alone, under a quarter of its size. Returns (b's bytes, a's pack)."""
    a, a_pack = save_as_pack(m, "a.pt", lambda i: rand_bytes(24 * MiB, seed + 100 * i))
    b = a[:4 * MiB] + rand_bytes(8 * MiB, seed + 1)
    write_file(m / "b.pt", b)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    return b, a_pack


@pytest.mark.timeout(300)
def test_a_sparse_pack_moves_its_last_chunks_into_chunk_files_and_goes(make_mount):
    m = make_mount(options=PACKS)
    b, a_pack = share_head(m, 70)
    files = set(m.chunk_files())
    os.unlink(m / "a.pt")
    assert wait_for(lambda: a_pack.exists(), lambda v: not v, 30) is False, "compacted away"
    assert set(m.chunk_files()) - files, "b's head now lives in chunk files"
    assert not m.chunks_in_two_homes(), "moved, not copied"
    assert "moved into chunk files (compaction)" in m.log()
    assert read_file(m / "b.pt") == b
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    m.remount()
    assert read_file(m / "b.pt") == b
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk() and s["chunks"] == m.chunks_on_disk(), s


@pytest.mark.timeout(600)
def test_kill_dash_nine_during_a_compaction_keeps_every_chunk(make_mount):
    m = make_mount(options=PACKS)
    for i, delay in enumerate([0.0, 0.002, 0.01, 0.03]):
        b, _ = share_head(m, 80 + 10 * i)
        killer = threading.Timer(delay, m.kill_daemon)
        killer.start()
        try:
            os.unlink(m / "a.pt")  # the reclaim follows, then the compaction
        except OSError:
            pass  # killed first
        killer.join()
        m.umount()
        m.mount()
        assert read_file(m / "b.pt") == b, f"kill after {delay}s"
        code, r = fsck(m.mnt, "--deep")
        assert code == 0 and r["clean"], r
        os.unlink(m / "b.pt")
        if (m / "a.pt").exists():
            os.unlink(m / "a.pt")


# --- Chunks the daemon writes itself (cache/append_pack.h) -----------------------------------
DAEMON_PACKS = "passthrough=0,packs=1"


def append_packs(m):
    return sorted((m.chunks_dir / "packs").glob("append.*.pack"))


@pytest.mark.timeout(300)
def test_a_save_through_the_daemon_makes_no_chunk_file(make_mount):
    m = make_mount(options=DAEMON_PACKS)
    files = {f"shard-{i}.pt": rand_bytes(random.Random(i).randrange(1, 20 * MiB), 700 + i)
             for i in range(6)}
    files["tracker.txt"] = b"17"
    for i, (name, data) in enumerate(files.items()):
        write_file(m / name, data, fsync=i % 2 == 0)
    assert not m.chunk_files(), "every chunk the daemon wrote is an extent of a pack"
    assert append_packs(m), "appended to packs of the daemon's own"
    assert not os.listdir(m.cache / "passthrough")
    for name, data in files.items():
        assert read_file(m / name) == data, name
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk() and s["chunks"] == m.chunks_on_disk(), s
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    m.remount()
    drop_caches()
    for name, data in files.items():
        assert read_file(m / name) == data, name
    # Deleting every file drops every extent; the packs go once no longer appended to.
    for name in files:
        os.unlink(m / name)
    assert wait_for(m.pack_extents, lambda v: not v, 30) == {}
    m.remount()
    assert not list((m.chunks_dir / "packs").iterdir())


# A writer that saves files through the daemon in a loop, fsync'ing every one: "begin NAME SEED
# SIZE" before its open, "done NAME" once its fsync returned.
SAVER = r"""
import os, random, sys
root, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
for i in range(10**6):
    size = rng.randrange(1, 6 << 20)
    dseed = rng.getrandbits(32)
    name = f"s{seed}-{i % 7}.pt"
    print(f"begin {name} {dseed} {size}", flush=True)
    fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, random.Random(dseed).randbytes(size))
    os.fsync(fd)
    print(f"done {name}", flush=True)
    os.close(fd)
"""


@pytest.mark.timeout(600)
def test_kill_dash_nine_mid_save_keeps_every_fsynced_file(make_mount, workdir):
    import subprocess
    import sys
    m = make_mount(options=DAEMON_PACKS)
    script = workdir / "saver.py"
    script.write_text(SAVER)
    durable = {}
    for round_ in range(4):
        savers = [subprocess.Popen([sys.executable, str(script), str(m.mnt), str(10 * round_ + k)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                  for k in range(3)]
        time.sleep(0.5 + 0.4 * round_)  # mid-save: puts in flight, packs half written
        m.kill_daemon()
        begun = {}  # name: the version being saved when the daemon died
        for p in savers:
            out, _ = p.communicate(timeout=60)
            for line in out.splitlines():
                w = line.split()
                if w[0] == "begin":
                    begun[w[1]] = (int(w[2]), int(w[3]))
                else:
                    durable[w[1]] = begun.pop(w[1])
        m.umount()
        m.mount()
        assert "recovered from an unclean stop" in m.log()
        for name in list(durable):
            got = read_file(m / name)
            # The version its last fsync made durable, or the one begun after it (its fsync may
            # have committed it, the reply lost with the daemon), whole; what it holds now is
            # what later rounds expect.
            ok = [v for v in (durable[name], begun.get(name))
                  if v and got == random.Random(v[0]).randbytes(v[1])]
            assert ok, (round_, name, len(got))
            durable[name] = ok[0]
        # The daemon writes packs; a chunk file comes only from compaction of a pack left sparse.
        assert not m.chunk_files() or "moved into chunk files (compaction)" in m.log()
        s = m.stats()
        assert s["stored_bytes"] == m.chunk_bytes_on_disk(), s
        assert s["chunks"] == m.chunks_on_disk(), s
        code, r = fsck(m.mnt, "--deep")
        assert code == 0 and r["clean"], r
    assert durable, "some saves finished before the kills"


@pytest.mark.timeout(300)
def test_a_cold_read_from_a_tier_keeps_the_fetched_chunks_in_a_pack(make_mount, workdir):
    backend = workdir / "backend"
    backend.mkdir()
    m = make_mount(options="packs=1", args=["--backend", f"file://{backend}"])
    data = rand_bytes(24 * MiB, 9)
    write_file(m / "f.bin", data, fsync=True)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    assert wait_for(lambda: os.getxattr(m / "f.bin", "user.ckptfs.state").decode(),
                    lambda s: s == "remote", 120) == "remote"
    m.lose_all_chunks()
    assert read_file(m / "f.bin") == data  # fetched from the tier
    assert not m.chunk_files(), "fetched chunks are not chunk files"
    fetched = m.pack_extents()
    assert fetched and all(p.name.startswith("append.") for p, _, _ in fetched.values())
    assert m.stats()["stored_bytes"] == m.chunk_bytes_on_disk()
    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    # Served from the pack from now on: the tier's chunks gone, the file still reads.
    m.umount()
    (backend / "chunks.d").rename(workdir / "chunks-away")  # the tier keeps its records
    m.mount()
    drop_caches()
    assert read_file(m / "f.bin") == data
