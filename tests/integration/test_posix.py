# POSIX behaviour of a ckptfs mount: bytes, names, attributes, xattrs, mmap, permissions.
import ctypes
import errno
import json
import mmap
import os
import random
import stat
import subprocess
import sys

import pytest

from conftest import MS_SYNC, expect_errno, read_file, wait_for, write_and_keep_mapped, write_file

MiB = 1 << 20


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


# --- file bytes ---

def test_sequential_then_random_offset_writes(mnt):
    p = mnt / "f"
    model = bytearray(rand_bytes(5 * MiB + 123, 1))
    with open(p, "wb") as f:
        for off in range(0, len(model), MiB):
            f.write(model[off:off + MiB])
    assert os.stat(p).st_size == len(model)
    assert read_file(p) == model
    # Random patches on the committed file, some reaching past the end.
    rng = random.Random(2)
    fd = os.open(p, os.O_RDWR)
    try:
        for _ in range(60):
            off = rng.randrange(0, len(model) + 64 * 1024)
            data = rng.randbytes(rng.choice([1, 17, 4096, 65536, 300_000]))
            assert os.pwrite(fd, data, off) == len(data)
            if off > len(model):
                model.extend(b"\0" * (off - len(model)))
            model[off:off + len(data)] = data
            # Uncommitted bytes are visible to reads through the same mount before close.
            check = rng.randrange(0, len(model))
            assert os.pread(fd, 4096, check) == bytes(model[check:check + 4096])
        assert os.fstat(fd).st_size == len(model)
    finally:
        os.close(fd)
    assert os.stat(p).st_size == len(model)
    assert read_file(p) == model


def test_overwrite_with_shorter_and_longer_content(mnt):
    p = mnt / "f"
    write_file(p, b"A" * 3 * MiB)
    write_file(p, b"short")
    assert os.stat(p).st_size == 5
    assert read_file(p) == b"short"
    long = rand_bytes(2 * MiB + 7, 3)
    write_file(p, long)
    assert read_file(p) == long
    # O_TRUNC without a write empties the file at once.
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    os.close(fd)
    assert os.stat(p).st_size == 0
    assert read_file(p) == b""


def test_read_while_another_handle_writes(mnt):
    p = mnt / "f"
    data = rand_bytes(3 * MiB, 4)
    with open(p, "wb") as w:
        w.write(data[:MiB + 5])
        w.flush()
        with open(p, "rb") as r:
            assert r.read() == data[:MiB + 5]
        w.write(data[MiB + 5:])
    assert read_file(p) == data


def test_sparse_file_holes_read_as_zeros(mnt):
    p = mnt / "sparse"
    far = 3 * 1024 * MiB + 12345  # 3 GiB: a hole never materialized anywhere
    with open(p, "wb") as f:
        f.write(b"head")
        f.seek(far)
        f.write(b"tail")
    assert os.stat(p).st_size == far + 4
    with open(p, "rb") as f:
        assert f.read(4) == b"head"
        assert f.read(MiB) == b"\0" * MiB
        f.seek(far - 100)
        assert f.read() == b"\0" * 100 + b"tail"
        f.seek(2 * 1024 * MiB)
        assert f.read(4096) == b"\0" * 4096
    s = mnt.stats()
    assert s["logical_bytes"] == far + 4
    assert s["data_bytes"] < MiB, s  # the hole is not stored


def test_append_mode(mnt):
    p = mnt / "log"
    write_file(p, b"0123")
    fd1 = os.open(p, os.O_WRONLY | os.O_APPEND)
    fd2 = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd1, 0, os.SEEK_SET)
        os.write(fd1, b"aa")
        os.write(fd2, b"bbb")
        os.pwrite(fd1, b"c", 0)  # Linux: pwrite on an O_APPEND descriptor appends too
    finally:
        os.close(fd1)
        os.close(fd2)
    assert read_file(p) == b"0123aabbbc"
    with open(p, "ab") as f:
        f.write(b"Z" * MiB)
    assert read_file(p) == b"0123aabbbc" + b"Z" * MiB


def test_truncate_and_ftruncate_shrink_and_grow(mnt):
    p = mnt / "t"
    data = rand_bytes(4 * MiB + 1000, 5)
    write_file(p, data)
    os.truncate(p, 3 * MiB + 17)  # into the middle of a chunk
    assert os.stat(p).st_size == 3 * MiB + 17
    assert read_file(p) == data[:3 * MiB + 17]
    os.truncate(p, 5 * MiB)  # grow: zeros
    assert read_file(p) == data[:3 * MiB + 17] + b"\0" * (2 * MiB - 17)
    os.truncate(p, 0)
    assert read_file(p) == b""
    with open(p, "r+b", buffering=0) as f:  # unbuffered: the calls reach the mount in order
        f.write(b"x" * 100_000)
        os.ftruncate(f.fileno(), 10)  # shrink the uncommitted bytes
        assert os.fstat(f.fileno()).st_size == 10
        f.seek(0, os.SEEK_END)
        f.write(b"y" * 5)
        os.ftruncate(f.fileno(), 200_000)  # grow past the end of an open writer
        f.seek(300_000)
        f.write(b"z")
    expect = b"x" * 10 + b"y" * 5 + b"\0" * (300_000 - 15) + b"z"
    assert os.stat(p).st_size == len(expect)
    assert read_file(p) == expect


def test_fallocate_grows(mnt):
    p = mnt / "fa"
    write_file(p, b"abc")
    fd = os.open(p, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 10000)
    finally:
        os.close(fd)
    assert os.stat(p).st_size == 10000
    assert read_file(p) == b"abc" + b"\0" * 9997


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_COLLAPSE_RANGE = 0x01, 0x02, 0x08
FALLOC_FL_ZERO_RANGE = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd, mode, off, length):
    if _libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_fallocate_modes_and_holes(mnt):
    p = mnt / "holes"
    data = rand_bytes(8 * MiB, 40)
    write_file(p, data)
    fd = os.open(p, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 32 * MiB)  # preallocation: nothing to see
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 * MiB, 4 * MiB)
        fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 7 * MiB, 4 * MiB)  # past EOF
        # PUNCH_HOLE needs KEEP_SIZE: the kernel answers EOPNOTSUPP before asking the daemon.
        expect_errno(errno.EOPNOTSUPP, fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, MiB)
        expect_errno(errno.EOPNOTSUPP, fallocate, fd, FALLOC_FL_COLLAPSE_RANGE, 0, MiB)
    finally:
        os.close(fd)
    want = data[:MiB] + b"\0" * (4 * MiB) + data[5 * MiB:7 * MiB] + b"\0" * MiB
    assert os.stat(p).st_size == 8 * MiB
    assert read_file(p) == want
    # The punched and zeroed ranges are holes: only the 3 MiB of data take blocks.
    used = os.stat(p).st_blocks * 512
    assert 3 * MiB <= used <= 3 * MiB + 64 * 1024, used
    # ZERO_RANGE without KEEP_SIZE grows the file.
    fd = os.open(p, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 6 * MiB, 4 * MiB)
    finally:
        os.close(fd)
    want = want[:6 * MiB] + b"\0" * (4 * MiB)
    assert os.stat(p).st_size == 10 * MiB and read_file(p) == want
    mnt.remount()
    assert read_file(p) == want
    assert 2 * MiB <= os.stat(p).st_blocks * 512 <= 2 * MiB + 64 * 1024


def test_st_blocks_counts_data_not_holes(mnt):
    # A 1-byte file truncated to 10 GiB takes one block, as on a local filesystem: du reports
    # what the file stores, not its length.
    p = mnt / "sparse"
    write_file(p, b"x")
    os.truncate(p, 10 << 30)
    st = os.stat(p)
    assert st.st_size == 10 << 30 and st.st_blocks * 512 <= 64 * 1024, st.st_blocks
    du = subprocess.run(["du", "-k", str(p)], stdout=subprocess.PIPE, text=True, check=True)
    assert int(du.stdout.split()[0]) <= 64, du.stdout
    full = mnt / "full"
    write_file(full, rand_bytes(3 * MiB, 41))
    assert os.stat(full).st_blocks * 512 >= 3 * MiB


def _data_and_holes(fd, size):
    """The file's data ranges as SEEK_DATA and SEEK_HOLE report them."""
    ranges, off = [], 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            assert e.errno == errno.ENXIO, e
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        assert start < end <= size, (start, end)
        ranges.append((start, end))
        off = end
    return ranges


@pytest.mark.parametrize("passthrough", ["1", "0"])
def test_seek_hole_and_data_and_blocks_through_an_open_descriptor(make_mount, passthrough):
    m = make_mount(options=f"passthrough={passthrough}")
    p = m / "sparse"
    write_file(p, b"x")
    fd = os.open(p, os.O_RDWR)
    try:
        # Extended through the descriptor, before any commit: one block, not 10 GiB of them.
        os.ftruncate(fd, 10 << 30)
        st = os.fstat(fd)
        assert st.st_size == 10 << 30 and st.st_blocks * 512 <= 64 * 1024, st.st_blocks
        assert os.stat(p).st_blocks * 512 <= 64 * 1024
        os.pwrite(fd, rand_bytes(MiB, 42), 4 << 30)
        assert MiB <= os.fstat(fd).st_blocks * 512 <= 2 * MiB + 64 * 1024, os.fstat(fd).st_blocks
    finally:
        os.close(fd)
    # Committed: the manifest's holes, through a new descriptor and after a remount.
    for remount in (False, True):
        if remount:
            m.remount()
        fd = os.open(p, os.O_RDONLY)
        try:
            ranges = _data_and_holes(fd, 10 << 30)
            assert len(ranges) == 2, ranges
            assert ranges[0][0] == 0 and ranges[0][1] < 64 * MiB, ranges
            assert ranges[1][0] <= 4 << 30 < (4 << 30) + MiB <= ranges[1][1] < (4 << 30) + 64 * MiB
            expect_errno(errno.ENXIO, os.lseek, fd, 10 << 30, os.SEEK_DATA)
            expect_errno(errno.ENXIO, os.lseek, fd, 10 << 30, os.SEEK_HOLE)
            assert os.lseek(fd, (8 << 30), os.SEEK_HOLE) == 8 << 30
            expect_errno(errno.ENXIO, os.lseek, fd, (6 << 30), os.SEEK_DATA)
        finally:
            os.close(fd)
        assert 1 * MiB <= os.stat(p).st_blocks * 512 <= 2 * MiB + 64 * 1024
    # Sparse-aware copies skip the holes instead of reading 10 GiB of zeros.
    out = m / "copy"
    subprocess.run(["cp", "--sparse=always", str(p), str(out)], check=True, timeout=120)
    assert os.stat(out).st_size == 10 << 30
    assert os.stat(out).st_blocks * 512 <= 2 * MiB + 64 * 1024
    with open(out, "rb") as f:
        f.seek(4 << 30)
        assert f.read(MiB) == rand_bytes(MiB, 42)
    # A file without holes is data from start to end.
    full = m / "full"
    write_file(full, rand_bytes(3 * MiB, 43))
    fd = os.open(full, os.O_RDONLY)
    try:
        assert _data_and_holes(fd, 3 * MiB) == [(0, 3 * MiB)]
    finally:
        os.close(fd)


def test_fsync_and_fdatasync(mnt):
    p = mnt / "sync"
    data = rand_bytes(2 * MiB, 6)
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, data[:MiB])
        os.fsync(fd)
        assert os.pread(fd, MiB, 0) == data[:MiB]
        os.write(fd, data[MiB:])
        os.fdatasync(fd)
        # After fsync the bytes are committed: a reader elsewhere sees them while fd is open.
        assert read_file(p) == data
    finally:
        os.close(fd)
    dfd = os.open(mnt.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # fsyncdir
    finally:
        os.close(dfd)
    assert read_file(p) == data


def test_exclusive_create_and_name_length(mnt):
    p = mnt / "x"
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.close(fd)
    expect_errno(errno.EEXIST, os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    write_file(mnt / ("n" * 255), b"ok")
    assert read_file(mnt / ("n" * 255)) == b"ok"
    expect_errno(errno.ENAMETOOLONG, write_file, mnt / ("n" * 256), b"no")
    expect_errno(errno.ENOENT, os.stat, mnt / "missing")
    expect_errno(errno.ENOENT, read_file, mnt / "missing")
    expect_errno(errno.EISDIR, os.open, mnt.mnt, os.O_WRONLY)


# --- names ---

def renameat2(src, dst, flags):
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD = -100
    rc = libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst),
                        ctypes.c_uint(flags))
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_rename_files(mnt):
    a, b, c = mnt / "a", mnt / "b", mnt / "c"
    write_file(a, b"aaa")
    write_file(b, b"bbbbbb")
    ino_a = os.stat(a).st_ino
    os.rename(a, b)  # onto an existing file
    assert not a.exists()
    assert read_file(b) == b"aaa"
    assert os.stat(b).st_ino == ino_a
    os.replace(b, c)
    assert sorted(os.listdir(mnt.mnt)) == ["c"]
    assert read_file(c) == b"aaa"
    expect_errno(errno.ENOENT, os.rename, mnt / "nope", mnt / "x")
    # The replaced file's bytes are gone from the store.
    assert mnt.stats()["files"] == 1
    # renameat2: RENAME_NOREPLACE and RENAME_EXCHANGE.
    write_file(a, b"A")
    expect_errno(errno.EEXIST, renameat2, a, c, 1)
    renameat2(a, c, 2)
    assert read_file(a) == b"aaa" and read_file(c) == b"A"


def test_rename_directories(mnt):
    d1 = mnt / "d1"
    os.makedirs(d1 / "sub")
    write_file(d1 / "sub" / "f", b"data")
    os.mkdir(mnt / "other")
    assert os.stat(mnt.mnt).st_nlink == 4
    os.rename(d1, mnt / "other" / "moved")  # across directories
    assert os.stat(mnt.mnt).st_nlink == 3
    assert os.stat(mnt / "other").st_nlink == 3
    assert read_file(mnt / "other" / "moved" / "sub" / "f") == b"data"
    # Onto an existing empty directory: replaced.
    os.mkdir(mnt / "empty")
    os.rename(mnt / "other" / "moved", mnt / "empty")
    assert read_file(mnt / "empty" / "sub" / "f") == b"data"
    assert sorted(os.listdir(mnt.mnt)) == ["empty", "other"]
    assert os.stat(mnt.mnt).st_nlink == 4
    assert os.stat(mnt / "other").st_nlink == 2
    # Onto a non-empty directory, a file onto a directory, a directory onto a file.
    os.mkdir(mnt / "x")
    write_file(mnt / "x" / "keep", b"k")
    os.mkdir(mnt / "y")
    expect_errno(errno.ENOTEMPTY, os.rename, mnt / "y", mnt / "x")
    write_file(mnt / "file", b"f")
    expect_errno(errno.EISDIR, os.rename, mnt / "file", mnt / "y")
    expect_errno(errno.ENOTDIR, os.rename, mnt / "y", mnt / "file")
    # Into its own subdirectory.
    expect_errno(errno.EINVAL, os.rename, mnt / "empty", mnt / "empty" / "sub" / "loop")
    assert read_file(mnt / "x" / "keep") == b"k"


def test_unlink_and_open_unlinked_file(mnt):
    p = mnt / "gone"
    data = rand_bytes(MiB, 7)
    write_file(p, data)
    before = mnt.stats()
    with open(p, "rb") as f:
        os.unlink(p)
        assert not p.exists()
        assert "gone" not in os.listdir(mnt.mnt)
        assert f.read() == data  # still readable through the open handle
    expect_errno(errno.ENOENT, os.unlink, p)
    # The kernel sends RELEASE in the background after close(2): wait for the orphan to go.
    after = wait_for(mnt.stats, lambda s: s["files"] == before["files"] - 1)
    assert after["files"] == before["files"] - 1
    assert after["stored_bytes"] < before["stored_bytes"]
    os.mkdir(mnt / "d")
    expect_errno(errno.EISDIR, os.unlink, mnt / "d")


def test_mkdir_rmdir(mnt):
    d = mnt / "d"
    os.mkdir(d, 0o750)
    assert stat.S_ISDIR(os.stat(d).st_mode)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750 & ~_umask()
    expect_errno(errno.EEXIST, os.mkdir, d)
    write_file(d / "f", b"1")
    expect_errno(errno.ENOTEMPTY, os.rmdir, d)
    expect_errno(errno.ENOTDIR, os.rmdir, d / "f")
    expect_errno(errno.ENOTDIR, os.mkdir, d / "f" / "sub")
    os.unlink(d / "f")
    os.rmdir(d)
    assert not d.exists()
    expect_errno(errno.ENOENT, os.rmdir, d)


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_readdir_2000_entries(mnt):
    d = mnt / "many"
    os.mkdir(d)
    names = {f"entry-{i:05d}-{'x' * (i % 40)}" for i in range(2000)}
    for n in names:
        fd = os.open(d / n, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
    for i in range(10):
        os.mkdir(d / f"subdir{i}")
    listed = os.listdir(d)
    assert len(listed) == len(set(listed)) == 2010
    assert set(listed) == names | {f"subdir{i}" for i in range(10)}
    with os.scandir(d) as it:
        kinds = {e.name: e.is_dir(follow_symlinks=False) for e in it}
    assert sum(kinds.values()) == 10
    assert os.stat(d).st_nlink == 12
    # Deleting half while listing again: the rest is listed exactly once.
    for n in sorted(names)[::2]:
        os.unlink(d / n)
    listed = os.listdir(d)
    assert len(listed) == len(set(listed)) == 1010


# --- attributes ---

def test_stat_fields_and_times(mnt):
    p = mnt / "f"
    write_file(p, b"x" * 1000)
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o666 & ~_umask()
    assert st.st_size == 1000 and st.st_nlink == 1
    assert st.st_uid == 0 and st.st_gid == 0
    assert st.st_blocks * 512 >= 1000
    # Directory link counts: 2 + subdirectories.
    os.mkdir(mnt / "d")
    assert os.stat(mnt / "d").st_nlink == 2
    for i in range(3):
        os.mkdir(mnt / "d" / str(i))
    write_file(mnt / "d" / "file", b"")
    assert os.stat(mnt / "d").st_nlink == 5
    os.rmdir(mnt / "d" / "0")
    assert os.stat(mnt / "d").st_nlink == 4
    # A write changes mtime (from a time set far in the past); so does a create in a directory.
    old = 1_000_000_000_123_456_789
    os.utime(p, ns=(old, old))
    assert os.stat(p).st_mtime_ns == old
    with open(p, "r+b") as f:
        f.write(b"y")
    st = os.stat(p)
    assert st.st_mtime_ns != old and st.st_mtime_ns > old
    assert st.st_atime_ns == old
    os.utime(mnt / "d", ns=(old, old))
    write_file(mnt / "d" / "new", b"")
    assert os.stat(mnt / "d").st_mtime_ns > old
    # ctime changes on chmod.
    os.utime(p, ns=(old, old))
    c0 = os.stat(p).st_ctime_ns
    os.chmod(p, 0o600)
    assert os.stat(p).st_ctime_ns >= c0
    assert os.stat(p).st_mtime_ns == old


def test_chmod_chown_utime(mnt):
    p = mnt / "f"
    write_file(p, b"abc")
    os.chmod(p, 0o4751)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o4751
    assert stat.S_ISREG(os.stat(p).st_mode)
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.chown(p, -1, 42)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (1234, 42)
    os.utime(p, ns=(1_600_000_000_111_222_333, 1_500_000_000_444_555_666))
    st = os.stat(p)
    assert st.st_atime_ns == 1_600_000_000_111_222_333
    assert st.st_mtime_ns == 1_500_000_000_444_555_666
    os.utime(p)  # now
    assert os.stat(p).st_mtime_ns > 1_500_000_000_444_555_666
    os.mkdir(mnt / "d")
    os.chmod(mnt / "d", 0o1777)
    assert stat.S_IMODE(os.stat(mnt / "d").st_mode) == 0o1777
    assert read_file(p) == b"abc"


def test_symlinks(mnt):
    write_file(mnt / "target", b"T")
    os.symlink("target", mnt / "link")
    os.symlink("/nonexistent/dangling", mnt / "dangling")
    os.symlink("d/../target", mnt / "rel")
    assert os.readlink(mnt / "link") == "target"
    assert os.readlink(mnt / "dangling") == "/nonexistent/dangling"
    lst = os.lstat(mnt / "link")
    assert stat.S_ISLNK(lst.st_mode) and lst.st_size == len("target")
    assert stat.S_ISREG(os.stat(mnt / "link").st_mode)
    assert read_file(mnt / "link") == b"T"
    expect_errno(errno.ENOENT, os.stat, mnt / "dangling")
    expect_errno(errno.EEXIST, os.symlink, "x", mnt / "link")
    expect_errno(errno.EINVAL, os.readlink, mnt / "target")
    os.unlink(mnt / "link")
    assert read_file(mnt / "target") == b"T"


def test_hard_links(mnt):
    a, b = mnt / "a", mnt / "b"
    write_file(a, b"one")
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    assert sa.st_ino == sb.st_ino
    assert sa.st_nlink == sb.st_nlink == 2
    with open(b, "r+b") as f:
        f.write(b"TWO")
    assert read_file(a) == b"TWO"
    os.unlink(a)
    assert os.stat(b).st_nlink == 1
    assert read_file(b) == b"TWO"
    os.mkdir(mnt / "d")
    expect_errno(errno.EPERM, os.link, mnt / "d", mnt / "d2")
    expect_errno(errno.EEXIST, os.link, b, b)


def test_special_files(mnt):
    os.mkfifo(mnt / "fifo", 0o640)
    st = os.stat(mnt / "fifo")
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640 & ~_umask()
    os.unlink(mnt / "fifo")


def test_statvfs(mnt):
    s = os.statvfs(mnt.mnt)
    assert s.f_bavail > 0 and s.f_blocks > 0 and s.f_bsize > 0
    assert s.f_namemax == 255


def test_xattrs(mnt):
    p = mnt / "f"
    write_file(p, b"")
    os.setxattr(p, "user.a", b"1")
    os.setxattr(p, "user.bin", bytes(range(256)))
    big = rand_bytes(64 * 1024, 8)
    os.setxattr(p, "user.big", big)
    assert os.getxattr(p, "user.a") == b"1"
    assert os.getxattr(p, "user.bin") == bytes(range(256))
    assert os.getxattr(p, "user.big") == big
    assert sorted(os.listxattr(p)) == ["user.a", "user.big", "user.bin"]
    os.setxattr(p, "user.a", b"replaced", os.XATTR_REPLACE)
    assert os.getxattr(p, "user.a") == b"replaced"
    expect_errno(errno.EEXIST, os.setxattr, p, "user.a", b"x", os.XATTR_CREATE)
    expect_errno(errno.ENODATA, os.setxattr, p, "user.new", b"x", os.XATTR_REPLACE)
    expect_errno(errno.ENODATA, os.getxattr, p, "user.missing")
    os.removexattr(p, "user.a")
    expect_errno(errno.ENODATA, os.getxattr, p, "user.a")
    expect_errno(errno.ENODATA, os.removexattr, p, "user.a")
    assert sorted(os.listxattr(p)) == ["user.big", "user.bin"]
    os.setxattr(p, "user.empty", b"")
    assert os.getxattr(p, "user.empty") == b""
    # On a directory, and a file's xattrs go with its bytes through a rename.
    os.mkdir(mnt / "d")
    os.setxattr(mnt / "d", "user.dir", b"d")
    assert os.getxattr(mnt / "d", "user.dir") == b"d"
    os.rename(p, mnt / "d" / "g")
    assert os.getxattr(mnt / "d" / "g", "user.bin") == bytes(range(256))


def test_mmap_reads(mnt):
    p = mnt / "m"
    data = rand_bytes(9 * MiB + 333, 9)
    write_file(p, data)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert len(m) == len(data)
        rng = random.Random(10)
        for _ in range(50):
            off = rng.randrange(len(data))
            n = rng.randrange(1, 300_000)
            assert m[off:off + n] == data[off:off + n]
        assert m[:] == data


def test_mmap_shared_write(mnt):
    p = mnt / "mw"
    write_file(p, b"\0" * (2 * MiB))
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[100:105] = b"hello"
        m[MiB + 1:MiB + 4] = b"abc"
        m.flush()
    data = read_file(p)
    assert data[100:105] == b"hello" and data[MiB + 1:MiB + 4] == b"abc"
    assert data.count(0) == 2 * MiB - 8


def test_a_shared_mapping_kept_after_close_writes_the_file(make_mount):
    # A mapping outlives its descriptor: what it writes after the close (and after the file's
    # seal had every reason to run) is the file's, read through the path at once and after a
    # remount.
    m = make_mount()
    n = 4 * MiB
    data = rand_bytes(n, 21)
    libc, addr = write_and_keep_mapped(m / "a.bin", data)
    try:
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")  # seals what may be sealed
        ctypes.memset(addr + MiB, 0x41, MiB)
        assert libc.msync(addr, n, MS_SYNC) == 0
        want = data[:MiB] + b"A" * MiB + data[2 * MiB:]
        assert read_file(m / "a.bin") == want
        os.setxattr(m.mnt, "user.ckptfs.seal", b"1")  # still mapped: succeeds, seals nothing
        assert read_file(m / "a.bin") == want
    finally:
        assert libc.munmap(addr, n) == 0
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    assert read_file(m / "a.bin") == want
    m.remount()
    assert read_file(m / "a.bin") == want


# --- permissions ---

NOBODY = 65534

PROBE = r"""
import errno, json, os, sys
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
def read(p):
    with open(p, "rb") as f:
        f.read()
def write(p):
    with open(p, "r+b") as f:
        f.write(b"x")
def create(p):
    with open(p, "wb") as f:
        f.write(b"mine")
d = sys.argv[1]
out["uid"] = os.getuid()
attempt("read_644", lambda: read(d + "/pub"))
attempt("write_644", lambda: write(d + "/pub"))
attempt("trunc_644", lambda: os.truncate(d + "/pub", 0))
attempt("read_600", lambda: read(d + "/secret"))
attempt("create_in_755", lambda: create(d + "/new"))
attempt("unlink_in_755", lambda: os.unlink(d + "/pub"))
attempt("chmod_not_owner", lambda: os.chmod(d + "/pub", 0o777))
attempt("create_in_777", lambda: create(d + "/open/mine"))
attempt("setxattr_644", lambda: os.setxattr(d + "/pub", "user.x", b"1"))
print(json.dumps(out))
"""


def test_permissions_enforced_for_other_users(mnt):
    root = mnt.mnt
    write_file(root / "pub", b"public")
    os.chmod(root / "pub", 0o644)
    write_file(root / "secret", b"secret")
    os.chmod(root / "secret", 0o600)
    os.mkdir(root / "open")
    os.chmod(root / "open", 0o777)
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, "-c", PROBE, str(root)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["uid"] == NOBODY
    assert r["read_644"] == 0
    assert r["write_644"] == errno.EACCES
    assert r["trunc_644"] == errno.EACCES
    assert r["read_600"] == errno.EACCES
    assert r["create_in_755"] == errno.EACCES
    assert r["unlink_in_755"] == errno.EACCES
    assert r["chmod_not_owner"] == errno.EPERM
    assert r["create_in_777"] == 0
    assert r["setxattr_644"] == errno.EACCES
    assert read_file(root / "pub") == b"public"
    st = os.stat(root / "open" / "mine")
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    assert read_file(root / "open" / "mine") == b"mine"
    assert not (root / "new").exists()


# --- concurrency ---

def test_concurrent_writers(mnt):
    """Threads writing their own files, and threads writing disjoint regions of one shared file
    (the sharded-checkpoint pattern), all at once."""
    import threading

    piece = 3 * MiB + 4097
    nthreads = 6
    shared = mnt / "shared"
    fd = os.open(shared, os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, nthreads * piece)
    os.close(fd)
    errors = []

    def own_file(i):
        try:
            data = rand_bytes(piece + i * 1000, 500 + i)
            with open(mnt / f"own-{i}", "wb") as f:
                for off in range(0, len(data), 256 * 1024):
                    f.write(data[off:off + 256 * 1024])
        except Exception as e:  # reported below
            errors.append(e)

    def shared_region(i):
        try:
            data = rand_bytes(piece, 600 + i)
            fd = os.open(shared, os.O_WRONLY)
            try:
                # Back to front in 128 KiB pieces: out-of-order writes for the daemon.
                offs = list(range(0, piece, 128 * 1024))
                for off in reversed(offs):
                    os.pwrite(fd, data[off:off + 128 * 1024], i * piece + off)
            finally:
                os.close(fd)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=own_file, args=(i,)) for i in range(nthreads)]
    threads += [threading.Thread(target=shared_region, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for check in (lambda: None, mnt.remount):
        check()
        for i in range(nthreads):
            assert read_file(mnt / f"own-{i}") == rand_bytes(piece + i * 1000, 500 + i), i
        got = read_file(shared)
        assert len(got) == nthreads * piece
        for i in range(nthreads):
            assert got[i * piece:(i + 1) * piece] == rand_bytes(piece, 600 + i), i


def test_append_while_others_open_and_close(mnt):
    """An O_APPEND writer while another thread keeps opening, closing and stat-ing the file:
    every close commits the writer's bytes so far, and the size the kernel sees (the offset of
    the next append) must never move back."""
    import threading

    p = mnt / "log"
    write_file(p, b"")
    stop = threading.Event()
    cycles = [0]
    errors = []

    def prober():
        try:
            while not stop.is_set():
                fd = os.open(p, os.O_RDONLY)
                os.close(fd)
                os.stat(p)
                cycles[0] += 1
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=prober)
    t.start()
    n, expect, mismatches = 2000, 0, []
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(n):
                os.write(fd, (b"%08d" % i) * 512)
                expect += 4096
                size = os.fstat(fd).st_size
                if size != expect:
                    mismatches.append((i, size, expect))
        finally:
            os.close(fd)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not errors, errors
    assert cycles[0] > 0
    assert not mismatches, mismatches[:10]
    assert read_file(p) == b"".join((b"%08d" % i) * 512 for i in range(n))
