# What survives: overwrites, atomic replace, unlink, a clean remount, and a kill -9 of the daemon.
import errno
import json
import signal
import time
import os
import random
import stat
import subprocess
import sys

import pytest

from conftest import expect_errno, pid_alive, read_file, write_file
from test_metrics import free_port, get, samples

MiB = 1 << 20


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def test_overwrite_existing_file(mnt):
    p = mnt / "ckpt"
    v1 = rand_bytes(6 * MiB, 1)
    v2 = rand_bytes(2 * MiB + 5, 2)
    write_file(p, v1)
    ino = os.stat(p).st_ino
    write_file(p, v2)
    assert os.stat(p).st_ino == ino
    assert os.stat(p).st_size == len(v2)
    assert read_file(p) == v2
    mnt.remount()
    assert read_file(p) == v2
    # The first version's chunks are reclaimed: only v2 is stored.
    assert mnt.stats()["stored_bytes"] == len(v2)


def test_save_to_temp_then_atomic_replace(mnt):
    final = mnt / "model.pt"
    tmp = mnt / "model.pt.tmp"
    old = rand_bytes(3 * MiB, 3)
    new = rand_bytes(4 * MiB, 4)
    write_file(final, old)
    with open(final, "rb") as reader:  # a reader of the old version keeps it
        write_file(tmp, new, fsync=True)
        os.replace(tmp, final)
        assert reader.read() == old
    assert not tmp.exists()
    assert sorted(os.listdir(mnt.mnt)) == ["model.pt"]
    assert read_file(final) == new
    mnt.remount()
    assert sorted(os.listdir(mnt.mnt)) == ["model.pt"]
    assert read_file(final) == new
    s = mnt.stats()
    assert s["files"] == 1 and s["stored_bytes"] == len(new)


def test_unlink_frees_and_persists(mnt):
    write_file(mnt / "a", rand_bytes(2 * MiB, 5))
    write_file(mnt / "b", rand_bytes(2 * MiB, 6))
    os.unlink(mnt / "a")
    assert mnt.stats()["stored_bytes"] == 2 * MiB
    mnt.remount()
    assert os.listdir(mnt.mnt) == ["b"]
    expect_errno(errno.ENOENT, os.stat, mnt / "a")
    assert read_file(mnt / "b") == rand_bytes(2 * MiB, 6)
    assert mnt.chunk_bytes_on_disk() == 2 * MiB


def snapshot(root):
    """Everything observable about a tree: {relative path: attributes (+ bytes, target, xattrs)}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            rec = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid,
                   "nlink": st.st_nlink, "mtime_ns": st.st_mtime_ns, "atime_ns": st.st_atime_ns,
                   "ino": st.st_ino}
            if stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(p)
            else:
                rec["xattrs"] = {n: os.getxattr(p, n) for n in sorted(os.listxattr(p))}
            if stat.S_ISREG(st.st_mode):
                rec["size"] = st.st_size
                rec["data"] = read_file(p)
            out[rel] = rec
    return out


def test_remount_preserves_everything(mnt):
    root = mnt.mnt
    os.makedirs(root / "run" / "step-100")
    os.makedirs(root / "run" / "empty")
    write_file(root / "run" / "step-100" / "model.pt", rand_bytes(5 * MiB + 3, 7))
    write_file(root / "run" / "step-100" / "optim.pt", rand_bytes(700_000, 8), fsync=True)
    write_file(root / "run" / "config.json", b'{"lr": 0.1}')
    write_file(root / "empty-file", b"")
    with open(root / "sparse", "wb") as f:
        f.seek(10 * MiB)
        f.write(b"end")
    os.symlink("step-100", root / "run" / "latest")
    os.symlink("/absolute/dangling", root / "dangling")
    os.link(root / "run" / "config.json", root / "config-hardlink")
    os.chmod(root / "run" / "config.json", 0o640)
    os.chmod(root / "run" / "empty", 0o700)
    os.chown(root / "run" / "step-100" / "optim.pt", 1000, 1001)
    os.setxattr(root / "run" / "step-100" / "model.pt", "user.step", b"100")
    os.setxattr(root / "run", "user.owner", b"team-a")
    os.utime(root / "run" / "step-100" / "model.pt", ns=(1_234_567_890_123_456_789, 1_111_111_111_222_333_444))
    os.mkfifo(root / "fifo")
    # Directories last: their mtimes change with every entry made in them.
    os.utime(root / "run" / "empty", ns=(1_000_000_000_000_000_001, 1_000_000_000_000_000_002))
    before = snapshot(root)
    assert len(before) == 12
    mnt.remount()
    after = snapshot(root)
    assert after.keys() == before.keys()
    for k in before:
        assert after[k] == before[k], k
    # And once more, after a change on the remounted store.
    write_file(root / "run" / "config.json", b'{"lr": 0.2}')
    before = snapshot(root)
    mnt.remount()
    assert snapshot(root) == before
    assert read_file(root / "config-hardlink") == b'{"lr": 0.2}'


# --- kill -9 of the daemon ---

# Writes argv[2] bytes of a seeded pattern to argv[1] (opened with argv[3]: "trunc" or
# "inplace"), prints "ready" after argv[4] bytes, and keeps writing without ever closing.
WRITER = r"""
import os, random, sys, time
path, total, how, ready_after, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
flags = os.O_WRONLY | (os.O_TRUNC | os.O_CREAT if how == "trunc" else 0)
fd = os.open(path, flags, 0o644)
rng = random.Random(seed)
done, told = 0, False
while True:
    block = rng.randbytes(1 << 20)
    try:
        os.write(fd, block)
    except OSError:
        time.sleep(0.05)  # the mount is gone: wait to be killed
        continue
    done += len(block)
    if done >= ready_after and not told:
        print("ready", flush=True)
        told = True
    if done >= total:
        while True:
            time.sleep(1)  # everything written, never closed
"""


def start_writer(path, total, how, ready_after, seed):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(total), how,
                          str(ready_after), str(seed)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.strip() == "ready", f"writer failed to start: {line!r}"
    return p


@pytest.mark.timeout(300)
def test_kill_dash_nine_keeps_closed_files(make_mount):
    m = make_mount()
    root = m.mnt
    closed = {}
    for i in range(4):
        data = rand_bytes(random.Random(i).randrange(1, 3 * MiB), 100 + i)
        write_file(root / f"closed-{i}", data)
        closed[f"closed-{i}"] = data
    os.mkdir(root / "dir")
    for i in range(3):
        data = rand_bytes(2 * MiB + i, 200 + i)
        write_file(root / "dir" / f"synced-{i}", data, fsync=True)
        closed[f"dir/synced-{i}"] = data
    old_trunc = rand_bytes(5 * MiB, 300)
    old_inplace = rand_bytes(5 * MiB, 301)
    write_file(root / "victim-trunc", old_trunc)
    write_file(root / "victim-inplace", old_inplace)
    os.symlink("closed-0", root / "link")
    os.setxattr(root / "closed-1", "user.k", b"v")

    writers = [
        start_writer(root / "new-big", 256 * MiB, "trunc", 48 * MiB, 400),  # a new file
        start_writer(root / "victim-trunc", 256 * MiB, "trunc", 24 * MiB, 401),  # open("wb")
        start_writer(root / "victim-inplace", 3 * MiB, "inplace", 3 * MiB, 402),  # open("r+b")
    ]
    try:
        m.kill_daemon()
    finally:
        for w in writers:
            w.kill()
            w.wait(timeout=60)
    # The mount is dead: its users see ENOTCONN.
    expect_errno(errno.ENOTCONN, os.stat, root / "closed-0")
    m.umount()
    m.mount()
    assert "recovered from an unclean stop" in m.log()

    for name, data in closed.items():
        assert os.stat(root / name).st_size == len(data), name
        assert read_file(root / name) == data, name
    assert os.readlink(root / "link") == "closed-0"
    assert os.getxattr(root / "closed-1", "user.k") == b"v"
    # Files being written when the daemon died hold their last committed version: never torn.
    assert read_file(root / "victim-trunc") == old_trunc
    assert read_file(root / "victim-inplace") == old_inplace
    # Created but never closed: gone, like its bytes (a loader must not meet an empty file).
    assert not (root / "new-big").exists()
    assert "1 new files never closed" in m.log()
    # Nothing the dead writers put on disk is left behind: the tier holds what manifests use.
    s = m.stats()
    assert s["stored_bytes"] == m.chunk_bytes_on_disk()
    assert s["chunks"] == m.chunks_on_disk()
    assert not os.listdir(m.cache / "staging")
    # The recovered store keeps working.
    write_file(root / "victim-trunc", b"after")
    m.remount()
    assert read_file(root / "victim-trunc") == b"after"
    assert read_file(root / "dir" / "synced-0") == closed["dir/synced-0"]


def test_new_files_fsynced_or_closed_empty_survive_a_crash(make_mount):
    # A new file is kept once fsync'd or closed, even with no byte written, and whatever else
    # held it open.
    m = make_mount()
    fd = os.open(m / "fsynced-empty", os.O_CREAT | os.O_WRONLY, 0o644)
    os.fsync(fd)
    write_file(m / "closed-empty", b"")
    both = os.open(m / "two-handles", os.O_CREAT | os.O_WRONLY, 0o644)
    other = os.open(m / "two-handles", os.O_RDONLY)
    os.close(both)
    os.close(other)
    m.crash_and_remount(fd)
    assert sorted(os.listdir(m.mnt)) == ["closed-empty", "fsynced-empty", "two-handles"]
    assert all(os.stat(m / n).st_size == 0 for n in os.listdir(m.mnt))


def test_another_handles_close_does_not_commit_a_half_written_file(make_mount):
    # A save in progress is one session: a reader opening and closing the file meanwhile (or a
    # forked process closing an inherited descriptor) must not commit the half-written bytes,
    # so that a crash still leaves the previous version.
    m = make_mount()
    path = m.mnt / "ckpt.pt"
    old = rand_bytes(3 * MiB, 500)
    write_file(path, old)
    new = rand_bytes(8 * MiB, 501)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, new[: 5 * MiB])
    for _ in range(3):  # other handles come and go; one of them reads the new bytes
        with open(path, "rb") as f:
            assert f.read(MiB) == new[:MiB]
    m.crash_and_remount(fd)
    assert read_file(path) == old


@pytest.mark.parametrize("sig,ignored", [(signal.SIGTERM, False), (signal.SIGINT, False),
                                         (signal.SIGINT, True)])
def test_signal_unmounts_cleanly(make_mount, sig, ignored):
    # The daemon's write path: with a passthrough file held open by this process, the kernel
    # keeps the exiting daemon around for minutes after its store is closed and marked clean
    # (a known limit, see README: Durability).
    m = make_mount(options="passthrough=0", mount=False)
    # ignored: mounted from where SIGINT is ignored, as a script's background job is; the daemon
    # must still stop on `kill -INT`.
    subprocess.run([str(c) for c in m.mount_command()], check=True, timeout=60,
                   preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored
                   else None)
    assert m.mounted()
    data = rand_bytes(3 * MiB, 600)
    write_file(m.mnt / "closed", data)
    # A file still open for writing when the signal comes is committed on the way out.
    fd = os.open(m.mnt / "open", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"written before the signal")
    pid = m.daemon_pid()
    os.kill(pid, sig)
    deadline = time.monotonic() + 60
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "the daemon did not exit"
    try:
        os.close(fd)
    except OSError:
        pass  # the mount is gone
    assert not m.mounted()
    assert "stopped" in m.log()
    m.mount()
    assert "unclean" not in m.log()  # a clean stop: nothing to recover
    assert read_file(m.mnt / "closed") == data
    assert read_file(m.mnt / "open") == b"written before the signal"


def test_seals_with_cut_threads_cut_the_chunks_seals_without_them_cut(make_mount):
    # With cut_threads a seal's content-defined cut candidates are found ahead, 16 MiB at a time
    # in parts on other threads; the chunks must be the same as without them. Random bytes (every
    # cut content-defined), staged by passthrough front to back, and back to front.
    data = rand_bytes(40 * MiB, 720)
    chunks = {}
    for threads in (0, 3):
        port = free_port()
        m = make_mount(options=f"passthrough=1,cut_threads={threads},metrics=127.0.0.1:{port}",
                       name=f"cut{threads}")
        write_file(m / "front.bin", data)
        fd = os.open(m / "back.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        for off in range(len(data) - MiB, -1, -MiB):
            os.pwrite(fd, data[off:off + MiB], off)
        os.close(fd)
        usage = [json.loads(os.getxattr(m / n, "user.ckptfs.chunks"))
                 for n in ("front.bin", "back.bin")]
        assert read_file(m / "front.bin") == data and read_file(m / "back.bin") == data
        # The same bytes, the same chunks, however they were written: back.bin shares them all.
        assert usage[1]["shared_chunks"] == usage[1]["chunks"] == usage[0]["chunks"] > 20, usage
        status = json.loads(os.getxattr(m.mnt, "user.ckptfs.status"))
        assert status["options"]["cut_threads"] == threads
        # The cuts were read off candidates found ahead exactly when there were threads to help.
        cuts = samples(get(f"http://127.0.0.1:{port}/metrics"))["ckptfs_cut_ahead_cuts_total"]
        assert (cuts > 20) == (threads > 0), cuts
        chunks[threads] = m.chunk_ids_on_disk()
        assert len(chunks[threads]) == usage[0]["chunks"]
    assert chunks[3] == chunks[0]


def test_passthrough_staged_files_through_a_crash(make_mount):
    # In passthrough mode a save goes to a staging file: a crash mid-write leaves the previous
    # version, a closed file survives whether or not its seal ran, and the seal that follows
    # deduplicates its chunks against the files already stored.
    m = make_mount(options="passthrough=1")  # also where the suite runs with passthrough=0
    old = rand_bytes(3 * MiB, 700)
    write_file(m / "ckpt.pt", old)
    assert m.stats()["stored_bytes"] == 3 * MiB  # sealed
    closed = rand_bytes(5 * MiB, 701)
    write_file(m / "closed.pt", closed)  # staged; its seal may or may not run before the kill
    fd = os.open(m / "ckpt.pt", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, rand_bytes(2 * MiB, 702))
    assert os.listdir(m.cache / "passthrough"), "the writes go to a staging file"
    m.crash_and_remount(fd)
    assert read_file(m / "ckpt.pt") == old
    assert read_file(m / "closed.pt") == closed
    write_file(m / "copy.pt", closed)  # the same bytes again: no new chunk once sealed
    s = m.stats()
    assert s["files"] == 3 and s["stored_bytes"] == 8 * MiB, s
    assert s["stored_bytes"] == m.chunk_bytes_on_disk()
    assert not os.listdir(m.cache / "passthrough")
    assert "passthrough on" in m.log()
