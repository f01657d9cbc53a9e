# `ckptfs gc --dry-run` against a real backend (a file:// directory and radosgw): after files are
# deleted through a mount, it counts exactly the chunks no remaining record references (a chunk
# shared with a remaining file is not counted), deletes nothing, and refuses to run without
# --dry-run or with a record it cannot read. Runs in /usr/bin/python3.
import json
import os

import pytest

from conftest import CKPTFS_BIN, run, wait_for, write_file
from test_remote import REMOTE_CHUNKS, mount_on, new_remote, state_of  # noqa: F401 (fixture)

MiB = 1 << 20


def gc(remote, *args):
    env = {**os.environ, **(remote.env or {})}
    return run([CKPTFS_BIN, "gc", *remote.mount_args, *args], check=False, env=env)


def field(out, name):
    line = next(l for l in out.splitlines() if l.startswith(name))
    return int(line.split()[1])


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
    assert p.returncode == 2 and "--dry-run" in p.stderr
    assert len(remote.objects("chunks/")) == chunks_before


@pytest.mark.timeout(120)
def test_gc_refuses_with_an_unreadable_record(make_mount, new_remote):
    remote = new_remote("file")
    m = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    write_file(m / "f.bin", os.urandom(MiB))
    assert wait_for(lambda: state_of(m / "f.bin"), lambda s: s == "remote", 120) == "remote"
    record = remote.root / "files.d" / "f.bin"
    record.write_bytes(record.read_bytes()[:-1] + b"!")
    p = gc(remote, "--dry-run")
    assert p.returncode == 1 and "files/f.bin" in p.stderr
    assert "delete nothing" in p.stdout
