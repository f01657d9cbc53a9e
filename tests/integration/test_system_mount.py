# Mounting like every other filesystem: an fstab line of type fuse.ckptfs through mount(8) and
# the mount helper, `mount -t fuse.ckptfs`, options in a config file, the systemd unit's
# ExecStart/ExecStop, and what `cmake --install` installs. The tests that go through mount(8)
# run it in a private mount namespace where the helper is the binary under test, so that they
# run beside an installed ckptfs without touching its helper.
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CKPTFS_BIN, REPO_ROOT, mount_fstype, pid_alive, run, wait_for

HELPER = Path("/sbin/mount.fuse.ckptfs")


def helper_state():
    """The system's mount helper as it is: None when there is none, else its identity (and a
    link's target), which any change to it would change."""
    try:
        st = os.lstat(HELPER)
    except FileNotFoundError:
        return None
    link = os.readlink(HELPER) if stat.S_ISLNK(st.st_mode) else None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, link)


class MountNamespace:
    """A private mount namespace of one test, held by a process of its own, in which
    /sbin/mount.fuse.ckptfs is the binary under test: the helper's directory is overlaid there
    (its upper layer on a tmpfs) with a link to it, the way `cmake --install` links it. Nothing
    of this is seen outside, so a helper the system has (an installed ckptfs) or has not is left
    as it is. A FUSE mount made in the namespace is seen only there: run() runs a command in it,
    path() names a path as seen from it (through /proc/PID/root) and fstype() reads its mount
    table."""

    SETUP = (
        "set -e\n"
        'mount -t tmpfs ckptfs-test "$1"\n'
        'mkdir "$1/upper" "$1/work"\n'
        'mount -t overlay ckptfs-test -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$2"\n'
        'ln -sfn "$3" "$2/$4"\n'
        "echo ready\n"
        "exec cat\n")  # holds the namespace until its stdin closes

    def __init__(self, layer):
        layer.mkdir()
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", self.SETUP,
             "setup", str(layer), str(HELPER.parent.resolve()), str(CKPTFS_BIN), HELPER.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.proc.stdout.readline() != "ready\n":
            self.proc.kill()
            pytest.fail(f"no private mount namespace with the helper: {self.proc.communicate()[1]}")
        self.pid = self.proc.pid  # unshare execs sh, which execs cat: one process throughout
        target = self.run(["readlink", "-f", HELPER]).stdout.strip()
        assert target == str(CKPTFS_BIN.resolve()), f"{HELPER} in the namespace is {target}"

    def run(self, cmd, **kw):
        return run(["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--", *cmd], **kw)

    def path(self, p):
        return Path(f"/proc/{self.pid}/root") / Path(p).relative_to("/")

    def fstype(self, p):
        return mount_fstype(p, self.pid)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture
def ns(ckptfs_bin, workdir):
    """mount(8) looks for /sbin/mount.fuse.ckptfs: the binary under test, in a mount namespace
    of this test's own (MountNamespace); the system's helper is the same afterwards."""
    before = helper_state()
    namespace = MountNamespace(workdir / "helper-layer")
    try:
        yield namespace
    finally:
        namespace.close()
        assert helper_state() == before, f"{HELPER} changed"


def daemon_pid(cache):
    return int((Path(cache) / "lock").read_text().split()[0])


def unmount_and_wait(ns, mnt, cache):
    """umount(8), then the daemon's exit: it commits and syncs after the kernel let go."""
    pid = daemon_pid(cache)
    ns.run(["umount", mnt])
    deadline = time.monotonic() + 60
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), "the daemon did not stop after umount"


def test_fstab_line_mounts_with_mount_a_and_umount(workdir, ns):
    mnt, cache = workdir / "mnt", workdir / "cache"
    mnt.mkdir()
    fstab = workdir / "fstab"
    fstab.write_text(
        "# a test-owned fstab\n"
        f"ckptfs {mnt} fuse.ckptfs cache_dir={cache},ram_cache=64M,_netdev,nofail,"
        "x-systemd.requires=network-online.target 0 0\n")
    try:
        ns.run(["mount", "--fstab", fstab, "-a", "-f"], timeout=120)  # a fake mount mounts nothing
        assert ns.fstype(mnt) != "fuse.ckptfs"
        ns.run(["mount", "--fstab", fstab, "-a"], timeout=120)
        assert ns.fstype(mnt) == "fuse.ckptfs"
        pid = daemon_pid(cache)
        ns.run(["mount", "--fstab", fstab, "-a"], timeout=120)  # again: already there, no error
        assert daemon_pid(cache) == pid
        ns.path(mnt / "f.bin").write_bytes(b"saved through fstab")
        unmount_and_wait(ns, mnt, cache)
        assert ns.fstype(mnt) != "fuse.ckptfs"
        # The same line again: the file is there, committed at the unmount.
        ns.run(["mount", "--fstab", fstab, str(mnt)], timeout=120)
        assert ns.path(mnt / "f.bin").read_bytes() == b"saved through fstab"
        unmount_and_wait(ns, mnt, cache)
    finally:
        ns.run(["umount", "-l", mnt], check=False)


def test_mount_t_fuse_ckptfs_with_a_config_file(workdir, ns):
    mnt, cache, remote = workdir / "mnt", workdir / "cache", workdir / "remote"
    mnt.mkdir()
    remote.mkdir()
    conf = workdir / "ckptfs.conf"
    conf.write_text(f"# options, one per line or comma-separated\ncache_dir={cache}\n"
                    f"backend=file://{remote}\n"
                    "ram_cache=32M, sync_interval=0.5   # trailing comment\n")
    try:
        ns.run(["mount", "-t", "fuse.ckptfs", "ckptfs", mnt, "-o", f"config={conf}"],
               timeout=120)
        assert ns.fstype(mnt) == "fuse.ckptfs"
        log = (cache / "ckptfs.log").read_text()
        assert f"writing back to file://{remote}" in log
        ns.path(mnt / "g.bin").write_bytes(b"x" * 100000)
        published = wait_for(lambda: list(remote.rglob("g.bin")), bool, timeout=60)
        assert published, "the backend named in the config file got no file record"
        unmount_and_wait(ns, mnt, cache)
    finally:
        ns.run(["umount", "-l", mnt], check=False)


def test_a_bad_config_file_fails_with_its_line(workdir):
    conf = workdir / "bad.conf"
    conf.write_text("ram_cache=64M\nwrite_threads=lots\n")
    mnt = workdir / "mnt"
    mnt.mkdir()
    r = run([CKPTFS_BIN, "mount", mnt, "--cache-dir", workdir / "c", "-o", f"config={conf}"],
            check=False)
    assert r.returncode == 2
    assert f"{conf}:2:" in r.stderr and "write_threads=lots" in r.stderr


def test_a_mistyped_command_is_not_a_mount(workdir):
    (workdir / "m").mkdir()
    r = run([CKPTFS_BIN, "stat", workdir / "m"], check=False)
    assert r.returncode == 2 and "unknown command 'stat'" in r.stderr
    assert mount_fstype(workdir / "m") != "fuse.ckptfs"
    r = run([CKPTFS_BIN, "mount", workdir / "m", "-o", f"config={workdir}"], check=False)
    assert r.returncode == 2 and "not a readable file" in r.stderr


def test_systemd_unit_commands_mount_and_unmount(workdir):
    """The unit's ExecStart and ExecStop, with systemd's %i and %f filled in as systemd would."""
    unit = (REPO_ROOT / "packaging" / "ckptfs@.service.in").read_text()
    start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    stop = re.search(r"^ExecStop=(.*)$", unit, re.M).group(1)
    mnt, cache = workdir / "mnt", workdir / "cache"
    mnt.mkdir()
    instance = subprocess.run(["systemd-escape", "--path", str(mnt)], stdout=subprocess.PIPE,
                              text=True, check=True).stdout.strip()
    etc = workdir / "etc"
    etc.mkdir()
    (etc / f"{instance}.conf").write_text(f"cache_dir={cache}\n")

    def expand(cmd):
        cmd = cmd.replace("@CKPTFS_BIN@", str(CKPTFS_BIN)).replace("/etc/ckptfs/", f"{etc}/")
        return cmd.replace("%i", instance).replace("%f", str(mnt)).split()

    try:
        run(expand(start), timeout=120)  # Type=forking: returns once mounted
        assert mount_fstype(mnt) == "fuse.ckptfs"
        (mnt / "h").write_bytes(b"unit")
        pid = daemon_pid(cache)
        run(expand(stop), timeout=120)  # returns once the daemon is gone
        assert not pid_alive(pid)
        assert mount_fstype(mnt) != "fuse.ckptfs"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], stderr=subprocess.DEVNULL)


def test_cmake_install_puts_everything_in_place(workdir):
    build = CKPTFS_BIN.parent.parent
    if not (build / "cmake_install.cmake").exists():
        pytest.fail(f"{CKPTFS_BIN} is not in a CMake build directory")
    dest = workdir / "dest"
    env = dict(os.environ, DESTDIR=str(dest))
    r = run(["cmake", "--install", build], env=env, timeout=300)
    prefix = dest / "usr" / "local"
    binary = prefix / "bin" / "ckptfs"
    assert binary.exists()
    assert run([binary, "--version"]).stdout.startswith("ckptfs ")
    link = dest / "sbin" / "mount.fuse.ckptfs"
    assert link.is_symlink() and os.readlink(link) == "/usr/local/bin/ckptfs"
    assert (prefix / "lib" / "libckptfs_gpu.so").exists()
    assert list(prefix.glob("lib/python3.*/dist-packages/ckptfs_gpu.py"))
    unit = (prefix / "lib" / "systemd" / "system" / "ckptfs@.service").read_text()
    assert "ExecStart=/usr/local/bin/ckptfs mount %f -o config=/etc/ckptfs/%i.conf" in unit
    assert "mount.fuse.ckptfs" in r.stdout
    shutil.rmtree(dest)
    # Another prefix at install time: everything, the helper's target included, follows it.
    r = run(["cmake", "--install", build, "--prefix", "/opt/ckptfs"], env=env, timeout=300)
    assert (dest / "opt" / "ckptfs" / "bin" / "ckptfs").exists()
    assert os.readlink(dest / "sbin" / "mount.fuse.ckptfs") == "/opt/ckptfs/bin/ckptfs"
    assert list((dest / "opt" / "ckptfs").glob("lib/python3.*/dist-packages/ckptfs_gpu.py"))
    shutil.rmtree(dest)
