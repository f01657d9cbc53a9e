# Prefetch hints and pins through a real mount: user.ckptfs.prefetch, .cached and .pin,
# `ckptfs prefetch --wait`, and the warming of a checkpoint when one of its files is opened.
# Two nodes share a file:// backend (a temporary directory): node A writes and uploads, node B
# starts with an empty cache directory and sees A's files through the namespace sync.
# Runs in /usr/bin/python3 (Debian's PyTorch).
import errno
import json
import os
import shutil

import pytest
import torch

from conftest import CKPTFS_BIN, expect_errno, read_file, run, wait_for, write_file

MiB = 1 << 20
# Small chunks, so that a cache_size of 8 MiB (at least four chunks of chunk_max) is allowed.
SMALL = "chunk_max=1M,chunk_avg=256K,chunk_min=64K"


# --- helpers ---

def cached(path):
    return json.loads(os.getxattr(path, "user.ckptfs.cached"))


def prefetching(path):
    return os.getxattr(path, "user.ckptfs.prefetch") == b"1"


def state(path):
    try:
        return os.getxattr(path, "user.ckptfs.state").decode()
    except FileNotFoundError:
        return None


def wait_remote(*paths, timeout=120):
    for p in paths:
        got = wait_for(lambda: state(p), lambda s: s == "remote", timeout)
        assert got == "remote", f"{p} never reached the backend (state {got!r})"


def wait_visible(path, timeout=30):
    assert wait_for(lambda: os.path.exists(path), bool, timeout), f"{path} never appeared"


def wait_cached(path, timeout=120):
    c = wait_for(lambda: cached(path), lambda c: c["cached_bytes"] == c["bytes"], timeout)
    assert c["cached_bytes"] == c["bytes"], f"{path} is not all local after {timeout} s: {c}"
    return c


def read_uncached(path):
    """Reads the whole file through the daemon: the kernel's cached pages are dropped first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while True:
            b = os.read(fd, 4 * MiB)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


@pytest.fixture
def nodes(make_mount, workdir):
    """nodes(options_a, options_b, args_b): node A mounted on a fresh file:// backend; B() mounts
    node B (empty cache directory) on the same backend when called."""
    backend = workdir / "backend"
    backend.mkdir()
    url = f"file://{backend}"

    def make(options_a=SMALL, options_b=SMALL, args_b=()):
        a = make_mount(options=options_a, name="a", args=["--backend", url])
        b = lambda: make_mount(options=options_b, name="b", args=["--backend", url, *args_b])
        return a, b, backend

    return make


def save_checkpoint(path, mib, seed):
    g = torch.Generator().manual_seed(seed)
    n = mib * MiB // 4 // 2
    torch.save({"w": torch.randn(n, generator=g), "b": torch.randn(n, generator=g),
                "step": seed}, path)


# --- tests ---

@pytest.mark.timeout(300)
def test_prefetch_pulls_a_file_onto_the_local_tier_without_reading_it(nodes):
    a, make_b, backend = nodes()
    (a / "ckpt").mkdir()
    save_checkpoint(a / "ckpt" / "model.pt", 8, seed=1)
    want = read_file(a / "ckpt" / "model.pt")
    wait_remote(a / "ckpt" / "model.pt")

    b = make_b()
    f = b / "ckpt" / "model.pt"
    wait_visible(f)
    before = cached(f)
    assert before["files"] == 1 and before["bytes"] >= 8 * MiB
    assert before["cached_bytes"] < before["bytes"]
    assert before["cached_chunks"] < before["chunks"]
    assert b.chunk_bytes_on_disk() < before["bytes"]

    os.setxattr(f, "user.ckptfs.prefetch", b"1")  # returns at once; the work runs behind
    after = wait_cached(f)
    assert after["cached_chunks"] == after["chunks"] == before["chunks"]
    assert wait_for(lambda: prefetching(f), lambda p: not p, 30) is False
    # The chunks are on B's disk tier, and the file was never read.
    assert b.chunk_bytes_on_disk() >= after["bytes"]
    assert b.chunks_on_disk() >= after["chunks"]

    # The backend loses every chunk: B reads the file from its local tier alone.
    shutil.rmtree(backend / "chunks.d")
    assert read_uncached(f) == want
    assert torch.load(f)["step"] == 1


@pytest.mark.timeout(300)
def test_prefetch_of_a_directory_counts_every_file_under_it(nodes):
    a, make_b, _ = nodes()
    paths = ["run/iter_0000010/mp_rank_00/model_optim_rng.pt",
             "run/iter_0000010/mp_rank_01/model_optim_rng.pt",
             "run/iter_0000020/mp_rank_00/model_optim_rng.pt"]
    for i, p in enumerate(paths):
        (a / p).parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(a / p, 2, seed=10 + i)
    write_file(a / "run" / "latest_checkpointed_iteration.txt", b"20")
    wait_remote(*(a / p for p in paths), a / "run" / "latest_checkpointed_iteration.txt")

    b = make_b()
    for p in paths:
        wait_visible(b / p)
    wait_visible(b / "run" / "latest_checkpointed_iteration.txt")
    whole = cached(b / "run")
    assert whole["files"] == 4 and whole["cached_bytes"] < whole["bytes"]
    one = cached(b / "run" / "iter_0000010")
    assert one["files"] == 2 and one["bytes"] < whole["bytes"]

    os.setxattr(b / "run" / "iter_0000010", "user.ckptfs.prefetch", b"1")
    wait_cached(b / "run" / "iter_0000010")
    later = cached(b / "run" / "iter_0000020")  # not asked for (a few header chunks may be shared)
    assert later["cached_bytes"] < later["bytes"]

    # `ckptfs prefetch --wait` returns once the whole tree is local.
    p = run([CKPTFS_BIN, "prefetch", b / "run", "--wait"], timeout=240)
    assert "on the local tier" in p.stderr
    c = cached(b / "run")
    assert c["cached_bytes"] == c["bytes"] and c["files"] == 4


@pytest.mark.timeout(300)
def test_prefetch_0_cancels_the_work_queued(nodes):
    # Every backend call of node B takes 300 ms: the cancel lands long before the fetches end.
    a, make_b, _ = nodes(args_b=["--backend-faults", "delay_ms=300"])
    write_file(a / "big.bin", os.urandom(16 * MiB))
    wait_remote(a / "big.bin")

    b = make_b()
    f = b / "big.bin"
    wait_visible(f)
    os.setxattr(f, "user.ckptfs.prefetch", b"1")
    os.setxattr(f, "user.ckptfs.prefetch", b"0")
    assert wait_for(lambda: prefetching(f), lambda p: not p, 30) is False
    # Only the fetches already running finished: a few chunks, not the file.
    c = wait_for(lambda: cached(f), lambda c: False, 2)  # what the running fetches brought
    assert c["cached_chunks"] < c["chunks"] // 2, c
    # Asked again, it completes.
    os.setxattr(f, "user.ckptfs.prefetch", b"1")
    wait_cached(f)


@pytest.mark.timeout(300)
def test_a_prefetch_job_follows_a_reader_that_jumps(nodes):
    # One prefetch thread on node B and 100 ms per backend call: the job's order is visible.
    a, make_b, _ = nodes(options_b=SMALL + ",upload_threads=1",
                         args_b=["--backend-faults", "delay_ms=100"])
    d = a / "d"
    d.mkdir()
    for i in range(8):
        write_file(d / f"f{i}.bin", os.urandom(4 * MiB))
    wait_remote(*[d / f"f{i}.bin" for i in range(8)])

    b = make_b()
    files = [b / "d" / f"f{i}.bin" for i in range(8)]
    wait_visible(files[-1])
    os.setxattr(b / "d", "user.ckptfs.prefetch", b"1")  # the job goes f0, f1, ... in order
    wait_cached(files[0])
    # A reader jumps to f6: the job goes on from there (f6, then f7) and comes back for f1..f5.
    with open(files[6], "rb") as f:
        assert len(f.read(4096)) == 4096
    wait_cached(files[6])
    wait_cached(files[7])
    skipped = [cached(p)["cached_chunks"] for p in files[3:6]]
    assert skipped == [0, 0, 0], f"the job did not follow the reader: {skipped}"
    wait_cached(b / "d")  # and nothing is left out
    assert read_file(files[4]) == read_file(d / "f4.bin")


@pytest.mark.timeout(300)
def test_pinned_chunks_survive_eviction_and_remount(nodes):
    a, make_b, _ = nodes(options_b=SMALL + ",cache_size=8M")
    (a / "data").mkdir()
    write_file(a / "data" / "pinned.bin", os.urandom(4 * MiB))
    others = [a / "data" / f"other{i}.bin" for i in range(7)]  # 28 MiB: 32 MiB in all
    for o in others:
        write_file(o, os.urandom(4 * MiB))
    wait_remote(a / "data" / "pinned.bin", *others)

    b = make_b()
    pinned = b / "data" / "pinned.bin"
    others = [b / "data" / o.name for o in others]
    for p in [pinned, *others]:
        wait_visible(p)

    os.setxattr(pinned, "user.ckptfs.pin", b"1")  # pin implies prefetch
    assert os.getxattr(pinned, "user.ckptfs.pin") == b"1"
    assert "user.ckptfs.pin" in os.listxattr(pinned)
    wait_cached(pinned)

    def read_others():
        for o in others:
            assert len(read_uncached(o)) == 4 * MiB

    read_others()  # 28 MiB through an 8 MiB tier
    assert cached(pinned)["cached_bytes"] == cached(pinned)["bytes"]
    rest = sum(cached(o)["cached_bytes"] for o in others)
    assert rest < 28 * MiB, "nothing was evicted: the test does not test eviction"

    # The pin is a stored attribute: it holds after a remount.
    b.remount()
    assert os.getxattr(pinned, "user.ckptfs.pin") == b"1"
    read_others()
    assert cached(pinned)["cached_bytes"] == cached(pinned)["bytes"]

    # Unpinned ("0", or removexattr), its chunks are evicted like any others.
    os.setxattr(pinned, "user.ckptfs.pin", b"0")
    expect_errno(errno.ENODATA, os.getxattr, pinned, "user.ckptfs.pin")
    read_others()
    assert cached(pinned)["cached_bytes"] < cached(pinned)["bytes"]
    assert len(read_uncached(pinned)) == 4 * MiB  # fetched again from the backend


@pytest.mark.timeout(300)
def test_opening_one_rank_warms_its_checkpoint(nodes):
    a, make_b, _ = nodes()
    megatron = ["iter_0000100/mp_rank_00/model_optim_rng.pt",
                "iter_0000100/mp_rank_01/model_optim_rng.pt"]
    plain = ["plain/a.pt", "plain/b.pt"]
    for i, p in enumerate(megatron + plain):
        (a / p).parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(a / p, 2, seed=100 + i)
    wait_remote(*(a / p for p in megatron + plain))

    b = make_b()
    for p in megatron + plain:
        wait_visible(b / p)
    sibling = b / megatron[1]
    assert cached(sibling)["cached_bytes"] < cached(sibling)["bytes"]
    # Opening rank 0 warms rank 1 (the whole iteration directory), which nobody reads.
    with open(b / megatron[0], "rb") as f:
        f.read(16)
    wait_cached(sibling)
    wait_cached(b / "iter_0000100")
    # A checkpoint file in a directory of no known layout: its siblings.
    with open(b / plain[0], "rb") as f:
        f.read(16)
    wait_cached(b / plain[1])


@pytest.mark.timeout(120)
def test_hints_without_a_backend(mnt):
    """Every chunk is local: prefetch completes at once; the attributes still answer."""
    (mnt / "d").mkdir()
    write_file(mnt / "d" / "x.bin", os.urandom(3 * MiB))
    write_file(mnt / "d" / "empty", b"")
    os.setxattr(mnt / "d", "user.ckptfs.prefetch", b"1")
    c = cached(mnt / "d")
    assert c["files"] == 2 and c["bytes"] == 3 * MiB and c["cached_bytes"] == c["bytes"]
    assert not prefetching(mnt / "d")
    os.setxattr(mnt / "d", "user.ckptfs.prefetch", b"0")  # cancels nothing; fine
    run([CKPTFS_BIN, "prefetch", mnt / "d" / "x.bin", "--wait"], timeout=60)
    run([CKPTFS_BIN, "prefetch", mnt / "d"], timeout=60)
    # Values other than "0" and "1" are refused; the computed attributes are read-only.
    expect_errno(errno.EINVAL, os.setxattr, mnt / "d", "user.ckptfs.prefetch", b"yes")
    expect_errno(errno.EINVAL, os.setxattr, mnt / "d", "user.ckptfs.pin", b"2")
    expect_errno(errno.EPERM, os.setxattr, mnt / "d", "user.ckptfs.cached", b"1")
    expect_errno(errno.ENODATA, os.removexattr, mnt / "d", "user.ckptfs.pin")
    os.setxattr(mnt / "d", "user.ckptfs.pin", b"1")
    assert os.getxattr(mnt / "d", "user.ckptfs.pin") == b"1"
    os.removexattr(mnt / "d", "user.ckptfs.pin")
    expect_errno(errno.ENODATA, os.getxattr, mnt / "d", "user.ckptfs.pin")
    # Not a ckptfs mount: the command says so.
    p = run([CKPTFS_BIN, "prefetch", "/proc/self/status"], check=False)
    assert p.returncode != 0
