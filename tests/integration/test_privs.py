# Set-id bits and file capabilities on a ckptfs mount: what a write, a truncation, a chown or
# an fallocate by whom clears, as on a local filesystem (the daemon clears them itself: it takes
# FUSE_HANDLE_KILLPRIV_V2 from the kernel, docs/posix.md).
import errno
import os
import stat
import subprocess
import sys

import pytest

from conftest import read_file, write_file

NOBODY = 65534
SETID = stat.S_ISUID | stat.S_ISGID


def nobody_cmd(code, *args):
    """Runs `code` (Python, with os and sys imported and argv in `a`) as an unprivileged user."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            sys.executable, "-c", "import os, sys\na = sys.argv[1:]\n" + code, *map(str, args)]


def as_nobody(code, *args):
    p = subprocess.run(nobody_cmd(code, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def mode_of(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def setid_file(mnt, name, mode=0o6777, data=b"old bytes"):
    p = mnt / name
    write_file(p, data)
    os.chmod(p, mode)
    assert mode_of(p) == mode
    return p


def test_unprivileged_write_clears_setid_bits(mnt):
    p = setid_file(mnt, "w")
    as_nobody("fd = os.open(a[0], os.O_WRONLY)\nos.pwrite(fd, b'new', 0)\nos.close(fd)", p)
    assert mode_of(p) == 0o777
    assert read_file(p) == b"new bytes"


def test_unprivileged_open_with_truncation_clears_setid_bits(mnt):
    p = setid_file(mnt, "t")
    as_nobody("os.close(os.open(a[0], os.O_WRONLY | os.O_TRUNC))", p)
    assert mode_of(p) == 0o777
    assert read_file(p) == b""
    q = setid_file(mnt, "t2")
    as_nobody("os.truncate(a[0], 3)", q)
    assert mode_of(q) == 0o777
    assert read_file(q) == b"old"


def test_read_only_open_with_truncation_clears_setid_bits(mnt):
    p = setid_file(mnt, "ro")
    as_nobody("os.close(os.open(a[0], os.O_RDONLY | os.O_TRUNC))", p)
    assert mode_of(p) == 0o777
    assert read_file(p) == b""


def test_root_of_a_user_namespace_is_not_privileged_here(mnt):
    """Capabilities held in another user namespace do not count for the mount's files: an
    unprivileged user who made one still clears the bits, as on ext4."""
    code = "fd = os.open(a[0], os.O_WRONLY | os.O_TRUNC)\nos.close(fd)\nos.truncate(a[1], 1)"
    p, q = setid_file(mnt, "ns1"), setid_file(mnt, "ns2")
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           "unshare", "-Ur", sys.executable, "-c", "import os, sys\na = sys.argv[1:]\n" + code,
           str(p), str(q)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert mode_of(p) == 0o777
    assert mode_of(q) == 0o777


def test_unprivileged_fallocate_clears_setid_bits(mnt):
    p = setid_file(mnt, "fa")
    as_nobody("fd = os.open(a[0], os.O_WRONLY)\nos.posix_fallocate(fd, 0, 1 << 16)\nos.close(fd)",
              p)
    assert mode_of(p) == 0o777
    assert os.stat(p).st_size == 1 << 16


def test_privileged_writer_keeps_setid_bits(mnt):
    """root holds CAP_FSETID: its writes and truncations leave the bits, as on ext4."""
    p = setid_file(mnt, "r")
    with open(p, "r+b") as f:
        f.write(b"root")
    os.truncate(p, 4)
    with open(p, "wb") as f:  # O_TRUNC
        f.write(b"again")
    assert mode_of(p) == 0o6777
    assert read_file(p) == b"again"


def test_group_setid_without_group_exec(mnt):
    """S_ISGID without S_IXGRP survives a write by a member of the file's group, not one by
    anyone else."""
    write = "fd = os.open(a[0], os.O_WRONLY)\nos.write(fd, b'x')\nos.close(fd)"
    member = setid_file(mnt, "member", mode=0o2666)
    os.chown(member, 0, NOBODY)
    os.chmod(member, 0o2666)
    as_nobody(write, member)
    assert mode_of(member) == 0o2666
    other = setid_file(mnt, "other", mode=0o2666)  # group root
    as_nobody(write, other)
    assert mode_of(other) == 0o666


def test_open_for_writing_alone_keeps_setid_bits(mnt):
    p = setid_file(mnt, "o")
    as_nobody("os.close(os.open(a[0], os.O_WRONLY))", p)
    assert mode_of(p) == 0o6777


def test_chown_clears_setid_bits(mnt):
    p = setid_file(mnt, "c", mode=0o6755)
    os.chown(p, 1234, -1)
    assert mode_of(p) == 0o755
    assert os.stat(p).st_uid == 1234
    p = setid_file(mnt, "c1", mode=0o6755)
    os.chown(p, -1, -1)  # Linux clears them even when nothing changes
    assert mode_of(p) == 0o755
    q = setid_file(mnt, "c2", mode=0o6745)  # set-group-id without group exec: kept
    os.chown(q, -1, 42)
    assert mode_of(q) == 0o2745
    d = mnt / "dir"
    os.mkdir(d)
    os.chmod(d, 0o2775)
    os.chown(d, 1234, 1234)  # a directory's set-group-id bit is inheritance, not privilege
    assert mode_of(d) == 0o2775


def test_setid_added_while_a_writer_has_the_file_open(mnt):
    """An unprivileged writer opened the file before root made it set-id; its later writes
    clear the bits, at the latest when it closes the file."""
    p = mnt / "late"
    write_file(p, b"")
    os.chmod(p, 0o666)
    code = ("fd = os.open(a[0], os.O_WRONLY | os.O_TRUNC)\n"
            "sys.stdout.write('open\\n'); sys.stdout.flush()\n"
            "sys.stdin.readline()\n"
            "os.write(fd, b'after chmod')\nos.close(fd)\n")
    proc = subprocess.Popen(nobody_cmd(code, p), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "open\n"
        os.chmod(p, 0o4777)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert mode_of(p) == 0o777
    assert read_file(p) == b"after chmod"


def test_privileged_write_drops_capabilities_and_keeps_setid_bits(mnt):
    p = setid_file(mnt, "capsuid", mode=0o4755)
    subprocess.run(["setcap", "cap_net_raw+ep", str(p)], check=True)
    with open(p, "r+b") as f:
        f.write(b"O")
    with pytest.raises(OSError):
        os.getxattr(p, "security.capability")
    assert mode_of(p) == 0o4755


def test_with_writeback_cache(make_mount):
    """With writeback_cache the kernel says "clear" differently (a ctime-only SETATTR)."""
    m = make_mount(options="writeback_cache=1")
    p = setid_file(m.mnt, "c", mode=0o6755)
    os.chown(p, -1, -1)
    assert mode_of(p) == 0o755
    q = setid_file(m.mnt, "w")
    as_nobody("fd = os.open(a[0], os.O_WRONLY)\nos.pwrite(fd, b'new', 0)\nos.close(fd)", q)
    assert mode_of(q) == 0o777


def test_write_removes_file_capabilities(mnt):
    p = mnt / "cap"
    write_file(p, b"program")
    os.chmod(p, 0o755)
    subprocess.run(["setcap", "cap_net_raw+ep", str(p)], check=True)
    assert os.getxattr(p, "security.capability")
    with open(p, "r+b") as f:  # even root's write drops them, as on ext4
        f.write(b"P")
    with pytest.raises(OSError) as e:
        os.getxattr(p, "security.capability")
    assert e.value.errno == errno.ENODATA
    # And a file opened for writing before the capabilities were set.
    q = mnt / "cap2"
    write_file(q, b"program")
    with open(q, "r+b") as f:
        subprocess.run(["setcap", "cap_net_raw+ep", str(q)], check=True)
        f.write(b"P")
    with pytest.raises(OSError) as e:
        os.getxattr(q, "security.capability")
    assert e.value.errno == errno.ENODATA
    assert read_file(q) == b"Program"
