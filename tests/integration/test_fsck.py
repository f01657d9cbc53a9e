# `ckptfs fsck` on a live mount: every kind of damage it is asked to find (a corrupt or missing
# local chunk file, a chunk object deleted from the backend, a flipped byte in a backend object,
# a damaged file record), what --repair fixes from the other copy, and what it cannot (a chunk
# no tier holds), named by path. Local chunks are damaged where they lie: a chunk file, or an
# extent of a pack (-o packs=1). The backend is a file:// directory, so the test damages its
# objects directly. Runs in /usr/bin/python3 (Debian's PyTorch).
import json
import os

import pytest
import torch

from conftest import CKPTFS_BIN, read_file, run, wait_for, write_file

MiB = 1 << 20
SMALL = "chunk_max=1M,chunk_avg=256K,chunk_min=64K"


def fsck(path, *flags):
    """Runs `ckptfs fsck --json`; returns (exit status, report)."""
    p = run([CKPTFS_BIN, "fsck", path, "--json", *flags], check=False)
    assert p.returncode in (0, 1), f"fsck could not run ({p.returncode}): {p.stderr}"
    return p.returncode, json.loads(p.stdout)


def state(path):
    return os.getxattr(path, "user.ckptfs.state").decode()


def wait_remote(*paths):
    for p in paths:
        assert wait_for(lambda: state(p), lambda s: s == "remote", 120) == "remote", p


def flip_byte(path, offset=100):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def backend_chunk(backend, name):
    """The backend's object for chunk `name` (posix encoding: chunks.d/<2 hex>.d/<32 hex>)."""
    return backend / "chunks.d" / f"{name[:2]}.d" / name


def read_uncached(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        out = []
        while b := os.read(fd, 4 * MiB):
            out.append(b)
        return b"".join(out)
    finally:
        os.close(fd)


@pytest.mark.timeout(300)
def test_fsck_finds_every_damage_and_repairs_from_the_other_copy(make_mount, workdir):
    backend = workdir / "backend"
    backend.mkdir()
    m = make_mount(options=SMALL, args=["--backend", f"file://{backend}"])
    data = os.urandom(3 * MiB)
    write_file(m / "f1.bin", data)
    torch.save({"w": torch.randn(256, 1024), "step": 7}, m / "model.pt")
    want_pt = read_file(m / "model.pt")
    wait_remote(m / "f1.bin", m / "model.pt")

    code, r = fsck(m.mnt, "--deep")
    assert code == 0 and r["clean"], r
    assert r["files"] == 2 and r["chunks"] >= 4 and r["records"] == 2, r
    assert r["refcount_errors"] == 0 and r["damaged_files"] == 0, r

    # Three distinct chunks damaged three ways, and f1's record.
    names = sorted(m.chunk_locations())
    a, b, c = names[0], names[1], names[2]
    m.corrupt_chunk(a, 100)                      # a corrupt local chunk
    backend_chunk(backend, b).unlink()           # a chunk object deleted from the backend
    flip_byte(backend_chunk(backend, c))         # a flipped byte in a backend object
    record = backend / "files.d" / "f1.bin"
    record.write_bytes(record.read_bytes()[:-3] + b"xyz")  # a damaged record

    # Shallow: what presence shows (the deleted object, the record).
    code, r = fsck(m.mnt)
    assert code == 1 and not r["clean"], r
    assert r["remote_missing"] == 1 and r["records_bad"] == 1, r
    # Deep: every one of them.
    code, r = fsck(m.mnt, "--deep")
    assert code == 1, r
    assert (r["local_corrupt"], r["remote_missing"], r["remote_corrupt"], r["records_bad"]) == \
        (1, 1, 1, 1), r
    assert r["damaged_files"] == 0, r  # each damaged chunk has a good copy on the other tier
    assert any(a in p for p in r["problems"]) and any(c in p for p in r["problems"]), r

    # The corrupt local copy was moved aside: like an evicted chunk, it comes from the backend
    # when needed. Another one is damaged, and repair fetches it at once; the backend's chunks
    # come back from the local tier, and f1 is published again.
    d = names[3]
    m.corrupt_chunk(d, 100)
    code, r = fsck(m.mnt, "--deep", "--repair")
    assert code == 0 and r["clean"], r
    assert (r["local_corrupt"], r["local_repaired"]) == (1, 1), r
    assert (r["remote_repaired"], r["records_republished"]) == (2, 1), r
    assert d in m.chunk_locations()
    wait_remote(m / "f1.bin")
    after = wait_for(lambda: fsck(m.mnt, "--deep"), lambda cr: cr[0] == 0, 60)
    assert after[0] == 0, json.dumps(after[1])
    assert read_uncached(m / "f1.bin") == data
    assert read_uncached(m / "model.pt") == want_pt
    assert backend_chunk(backend, b).exists()

    # A second node reads everything from the repaired backend alone.
    n = make_mount(options=SMALL, name="n", args=["--backend", f"file://{backend}"])
    assert wait_for(lambda: os.path.exists(n / "model.pt"), bool, 30)
    assert read_file(n / "f1.bin") == data
    assert torch.load(n / "model.pt")["step"] == 7


@pytest.mark.timeout(120)
def test_fsck_names_the_files_no_tier_can_repair(make_mount):
    m = make_mount(options=SMALL)  # no backend: the local tier is the only copy
    (m / "run").mkdir()
    write_file(m / "run" / "a.bin", os.urandom(2 * MiB))
    write_file(m / "run" / "b.bin", os.urandom(2 * MiB))
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    code, r = fsck(m / "run")
    assert code == 0 and r["files"] == 2, r

    # One chunk goes: fsck says which file lost bytes, and repair cannot help.
    m.lose_chunk(m.losable_chunks()[0])
    code, r = fsck(m.mnt, "--repair")
    assert code == 1 and not r["clean"], r
    assert r["local_missing"] == 1 and r["local_repaired"] == 0, r
    assert r["damaged_files"] == 1 and len(r["damaged"]) == 1, r
    assert r["damaged"][0] in ("/run/a.bin", "/run/b.bin"), r
    p = run([CKPTFS_BIN, "fsck", m.mnt], check=False)
    assert p.returncode == 1 and "damage found" in p.stdout and r["damaged"][0] in p.stdout
    # The other file is whole.
    other = "/run/b.bin" if r["damaged"][0] == "/run/a.bin" else "/run/a.bin"
    assert len(read_file(m / other.lstrip("/"))) == 2 * MiB


def test_fsck_outside_a_mount_fails_clearly(tmp_path):
    p = run([CKPTFS_BIN, "fsck", tmp_path], check=False)
    assert p.returncode == 2 and "not in a ckptfs mount" in p.stderr


@pytest.mark.timeout(300)
def test_a_report_too_long_for_one_attribute_keeps_its_counts(make_mount):
    m = make_mount(options=SMALL)
    deep = m / ("d" * 250) / ("e" * 250)
    deep.mkdir(parents=True)
    for i in range(101):
        write_file(deep / (f"{i:03d}" + "f" * 240), os.urandom(8192))
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    m.lose_all_chunks()
    # 101 paths of ~750 bytes and their problem lines: more than the kernel's 64 KiB per value.
    code, r = fsck(m.mnt)
    assert code == 1, r
    counts = {k: v for k, v in r.items() if k not in ("damaged", "problems")}
    assert r["damaged_files"] == 101 and r["local_missing"] == 101, counts
    assert 0 < len(r["damaged"]) < 101
    assert all(p.startswith("/" + "d" * 250 + "/") for p in r["damaged"])
