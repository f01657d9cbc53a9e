# The remote tier through real mounts: write-back to a real S3 server (Ceph radosgw, started once
# per session by the `rgw` fixture) and to a file:// directory, a second node with an empty cache
# that sees and reads what the first wrote, a file moved away and back during its upload,
# eviction under cache_size and refetch, uploads that resume after the daemon dies, injected
# backend faults and corruption, three nodes on one bucket, durability=remote, and clear errors
# for a bad bucket or bad credentials.
#
# Everything here is asynchronous (uploads, the namespace sync): tests poll with bounded waits and
# never assert on timings. Runs in the pytest process, which must be Debian's /usr/bin/python3.
import errno
import io
import os
import re
import time
from pathlib import Path

import pytest
import torch

from conftest import expect_errno, read_file, run, wait_for, write_file

MiB = 1 << 20
STATE = "user.ckptfs.state"
# Small chunks: many chunks (and so many backend calls) in files of a few MiB.
REMOTE_CHUNKS = "chunk_min=64K,chunk_avg=256K,chunk_max=1M"


# --- backends ---

class S3Remote:
    """A fresh bucket on the session's radosgw, used under a key prefix."""

    kind = "s3"

    def __init__(self, rgw, bucket, prefix="ckpt-prefix"):
        self.rgw, self.bucket, self.prefix = rgw, bucket, prefix
        self.url = f"s3://{bucket}/{prefix}"
        self.mount_args = ["--backend", self.url, "--s3-endpoint", rgw.endpoint]
        self.env = {k: v for k, v in rgw.env.items() if k != "AWS_ENDPOINT_URL"}

    def objects(self, sub=""):
        """{key: size} of the objects under PREFIX/sub, keys without the prefix."""
        p = self.prefix + "/"
        return {k[len(p):]: n for k, n in self.rgw.objects(self.bucket, p + sub).items()}

    def read(self, key):
        return self.rgw.get(self.bucket, f"{self.prefix}/{key}")

    def requests(self, method, sub=""):
        """Keys (without the prefix) of the successful `method` requests radosgw logged."""
        p = self.prefix + "/"
        return [k[len(p):] for k in self.rgw.requests(method, self.bucket, p + sub)]


class FileRemote:
    """A file:// backend directory (backends/posix_backend.h: directory names end in ".d")."""

    kind = "file"

    def __init__(self, root):
        self.root = Path(root)
        self.url = f"file://{self.root}"
        self.mount_args = ["--backend", self.url]
        self.env = None

    @staticmethod
    def _key_part(name, is_dir):
        if name.startswith("%"):
            name = name[1:]
        if is_dir:
            return name[:-2]
        return name[:-2] if name.endswith((".d.e", ".e.e")) else name

    def objects(self, sub=""):
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            if rel.parts and rel.parts[0] == ".tmp":
                continue
            parts = [self._key_part(p, True) for p in rel.parts]
            for f in filenames:
                key = "/".join(parts + [self._key_part(f, False)])
                if key.startswith(sub):
                    out[key] = os.path.getsize(os.path.join(dirpath, f))
        return out

    def read(self, key):
        parts = key.split("/")
        path = self.root.joinpath(*[p + ".d" for p in parts[:-1]], parts[-1])
        return path.read_bytes()


@pytest.fixture
def new_remote(request, workdir):
    """Factory: new_remote("s3" | "file") -> an empty backend of that kind for this test."""
    def factory(kind, name="backend"):
        if kind == "s3":
            rgw = request.getfixturevalue("rgw")
            return S3Remote(rgw, rgw.make_bucket(request.node.name))
        d = workdir / name
        d.mkdir()
        return FileRemote(d)
    return factory


def mount_on(make_mount, remote, name, options=None, faults=None):
    """A mount on remote; faults: a FaultSpec injected around the backend (--backend-faults)."""
    return make_mount(options=options, name=name, args=backend_args(remote, faults),
                      env=remote.env)


def backend_args(remote, faults=None):
    return remote.mount_args + (["--backend-faults", faults] if faults else [])


# --- helpers ---

def state_of(path):
    return os.getxattr(path, STATE).decode()


def wait_state(paths, want="remote", timeout=120):
    """Polls user.ckptfs.state of every path until all are `want`."""
    deadline = time.monotonic() + timeout
    while True:
        states = {str(p): state_of(p) for p in paths}
        if all(s == want for s in states.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not all {want} after {timeout} s: {states}")
        time.sleep(0.1)


def wait_true(cond, what, timeout=60):
    """Polls cond() until it holds; fails naming `what` after timeout seconds."""
    if not wait_for(cond, bool, timeout=timeout):
        raise AssertionError(f"{what}: not within {timeout} s")


def exists(path):
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False


def tensors(seed, sizes):
    """A state dict of random float32 tensors of the given element counts."""
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(n, generator=g) for i, n in enumerate(sizes)}


def ckpt_bytes(obj):
    """What torch.save writes for obj (to a file object: the archive is named "archive")."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def assert_same_state(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def local_chunks(m):
    """{chunk id hex: size} of the chunks on a mount's local tier: chunk files and pack extents."""
    out = {p.name: p.stat().st_size for p in m.chunk_files()}
    out.update((cid, e[2]) for cid, e in m.pack_extents().items())
    return out


def remote_chunks(remote):
    """{chunk id hex: size} of the chunk objects in a backend."""
    return {k.rsplit("/", 1)[1]: n for k, n in remote.objects("chunks/").items()}


# --- 1. write-back and a second node ---

@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["s3", "file"])
def test_write_back_then_a_second_node_with_an_empty_cache_loads_it(make_mount, new_remote,
                                                                     kind):
    remote = new_remote(kind)
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    state = tensors(1, [700_000, 300_000, 5_000, 1])
    path = "run/step-10/model.pt"
    os.makedirs(a / "run/step-10")
    torch.save(state, a / path)
    wait_state([a / path])

    objects = remote.objects()
    assert f"files/{path}" in objects
    assert "dirs/run" in objects and "dirs/run/step-10" in objects
    assert remote.read(f"files/{path}").startswith(b"CKFR")
    # Every chunk of the file (the only file of this cache) is in the backend, at its size.
    mine = local_chunks(a)
    assert len(mine) >= 4
    theirs = remote_chunks(remote)
    assert mine == theirs, "the backend's chunks differ from the local tier's"
    for key, size in remote.objects("chunks/").items():
        assert re.fullmatch(r"chunks/([0-9a-f]{2})/\1[0-9a-f]{30}", key), key

    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    wait_true(lambda: exists(b / path), f"{path} on the second node")
    assert state_of(b / path) == "remote"
    assert os.stat(b / path).st_size == os.stat(a / path).st_size
    assert_same_state(torch.load(b / path), state)
    assert read_file(b / path) == read_file(a / path)
    # Every chunk came from the backend, verified, and stays in b's cache.
    assert local_chunks(b) == mine


@pytest.mark.timeout(180)
def test_a_rename_away_and_back_during_the_upload_leaves_the_file_in_the_bucket(make_mount,
                                                                               new_remote):
    """`rename A B; rename B A` right after A's close, while A's upload is under way (each PUT is
    held 300 ms, so A's record goes after the renames): the bucket ends up holding A, A's state
    says remote only then, and a fresh node reads A whole."""
    remote = new_remote("file")
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS, faults="delay_ms=300,ops=put")
    data = os.urandom(4 * MiB)
    write_file(a / "A.pt", data)
    # Chunks go first, the record last: the first chunk in the bucket means the upload is on.
    wait_true(lambda: remote.objects("chunks/"), "A.pt's first chunk in the bucket")
    os.rename(a / "A.pt", a / "B.pt")
    os.rename(a / "B.pt", a / "A.pt")
    wait_state([a / "A.pt"])
    files = remote.objects("files/")
    assert "files/A.pt" in files and "files/B.pt" not in files, files
    assert remote.read("files/A.pt")  # the record the state promises

    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    wait_true(lambda: exists(b / "A.pt"), "A.pt on a fresh node")
    assert read_file(b / "A.pt") == data
    assert not exists(b / "B.pt")
    assert read_file(a / "A.pt") == data  # a's own sync left it alone


# --- 2. eviction and refetch ---

@pytest.mark.timeout(240)
def test_cache_size_bounds_the_local_tier_and_evicted_chunks_are_refetched(make_mount,
                                                                           new_remote):
    remote = new_remote("s3")
    limit = 8 * MiB
    # remote_timeout bounds how long a writer waits for room before it fails with ENOSPC.
    opts = "chunk_max=1M,chunk_avg=256K,chunk_min=64K,cache_size=8M,remote_timeout=60"
    a = mount_on(make_mount, remote, "a", options=opts)
    os.mkdir(a / "ckpt")
    want = {}
    for i in range(12):  # 12 files of 4 MiB: 48 MiB, 6 times the limit
        data = ckpt_bytes(tensors(100 + i, [MiB]))
        name = f"ckpt/shard-{i:02d}.pt"
        write_file(a / name, data)
        want[name] = data
    wait_state([a / n for n in want])
    # Once everything is uploaded the local tier holds at most cache_size of chunk files (the
    # upload that marks chunks remote evicts): exactly the limit, no slack.
    on_disk = a.chunk_bytes_on_disk()
    assert on_disk <= limit, f"{on_disk} bytes of chunks on disk, limit {limit}"
    everything = remote_chunks(remote)
    assert sum(everything.values()) > 5 * limit
    assert set(local_chunks(a)) <= set(everything)

    # Saving again what was evicted writes those chunks anew; they are evictable again (the
    # backend has them), so more such files than cache_size fit in turn.
    for i in range(3):
        write_file(a / f"ckpt/copy-{i:02d}.pt", want[f"ckpt/shard-{i:02d}.pt"])
        want[f"ckpt/copy-{i:02d}.pt"] = want[f"ckpt/shard-{i:02d}.pt"]
    wait_state([a / f"ckpt/copy-{i:02d}.pt" for i in range(3)])
    assert a.chunk_bytes_on_disk() <= limit
    assert remote_chunks(remote) == everything

    # A restart empties the RAM and page caches: what is not on disk must come from radosgw.
    a.remount()
    missing = set(everything) - set(local_chunks(a))
    assert sum(everything[c] for c in missing) >= sum(everything.values()) - limit
    for name, data in want.items():
        assert read_file(a / name) == data, name
    assert_same_state(torch.load(a / "ckpt/shard-03.pt"), tensors(103, [MiB]))
    fetched = set()
    wait_true(lambda: fetched.update(k.rsplit("/", 1)[1]
                                     for k in remote.requests("GET", "chunks/"))
              or missing <= fetched, "radosgw logging a GET of every evicted chunk", timeout=20)
    # Every fetch evicts after it: once reads (and any prefetch) are done, the limit holds.
    wait_true(lambda: a.chunk_bytes_on_disk() <= limit, "the local tier back under cache_size",
              timeout=30)
    assert "failed verification" not in a.log()


# --- 3. uploads resume after a restart ---

@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind,stop", [("s3", "kill"), ("file", "kill"), ("file", "umount")])
def test_uploads_resume_after_the_daemon_restarts(make_mount, new_remote, kind, stop):
    remote = new_remote(kind)
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS, faults="fail=1,ops=put")
    os.makedirs(a / "ckpt/step-1")
    want = {}
    for i in range(3):
        name = f"ckpt/step-1/rank-{i}.pt"
        torch.save(tensors(10 + i, [400_000, 3_000]), a / name)
        want[name] = read_file(a / name)
    write_file(a / "ckpt/step-1/notes.txt", b"plain bytes\n" * 1000)
    want["ckpt/step-1/notes.txt"] = b"plain bytes\n" * 1000
    # Committed locally (close returned), but the backend refuses every PUT.
    wait_state([a / n for n in want], "uploading", timeout=30)
    assert remote.objects() == {}
    if stop == "kill":
        a.kill_daemon()
        with pytest.raises(OSError) as dead:
            os.stat(a / "not-cached")
        assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), dead.value
    a.umount()

    a.args = backend_args(remote)  # the backend works again
    a.mount()
    for name, data in want.items():
        assert read_file(a / name) == data, name
    wait_state([a / n for n in want])
    assert {f"files/{n}" for n in want} <= set(remote.objects("files/"))

    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    for name, data in want.items():
        wait_true(lambda: exists(b / name), f"{name} on a fresh node")
        assert read_file(b / name) == data, name
    assert_same_state(torch.load(b / "ckpt/step-1/rank-2.pt"), tensors(12, [400_000, 3_000]))


# --- 4. injected backend faults ---

@pytest.mark.timeout(240)
def test_ten_percent_backend_faults_lose_no_save_and_no_read(make_mount, new_remote):
    remote = new_remote("s3")
    faults = "fail=0.1,ops=put+get+head,seed="
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS, faults=f"{faults}7")
    os.mkdir(a / "ckpt")
    states = {}
    for i in range(10):
        name = f"ckpt/part-{i}.pt"
        states[name] = tensors(200 + i, [300_000, 150_000, 1_000])
        torch.save(states[name], a / name)  # never fails: the backend is behind the writer
    wait_state([a / n for n in states], timeout=180)
    assert "injected fault" in a.log()

    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS, faults=f"{faults}11")
    for name, state in states.items():
        wait_true(lambda: exists(b / name), f"{name} on the second node", timeout=60)
        assert read_file(b / name) == read_file(a / name), name
        assert_same_state(torch.load(b / name), state)
    assert len(local_chunks(b)) == len(remote_chunks(remote))


# --- 5. a backend that returns corrupted bytes ---

@pytest.mark.timeout(180)
def test_corrupted_fetches_fail_with_eio_or_are_fetched_again(make_mount, new_remote):
    remote = new_remote("file")
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    state = tensors(300, [500_000, 200_000])
    torch.save(state, a / "model.pt")
    wait_state([a / "model.pt"])
    good = read_file(a / "model.pt")
    ids = set(local_chunks(a))

    # The reader learns the file from an intact listing, then its backend starts flipping a bit
    # in every GET (no namespace sync then: the records would be damaged too).
    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    wait_true(lambda: exists(b / "model.pt"), "model.pt on the reader")
    b.umount()
    b.options = f"{REMOTE_CHUNKS},sync_interval=0"
    b.args = backend_args(remote, "flip=1,ops=get")
    b.mount()
    for _ in range(2):  # never wrong bytes: EIO, also when asked again
        expect_errno(errno.EIO, read_file, b / "model.pt")
    bad = set(re.findall(r"chunk ([0-9a-f]{32}) from \S+ failed verification", b.log()))
    assert bad and bad <= ids, f"the log names no chunk of the file: {bad}"
    assert local_chunks(b) == {}, "a corrupt copy was kept"

    # Some GETs corrupted (seeded; one FUSE thread and no readahead, so the same GETs every run):
    # fetching again mends them.
    b.umount()
    b.options = f"{REMOTE_CHUNKS},sync_interval=0,max_threads=1,readahead_chunks=0"
    b.args = backend_args(remote, "flip=0.3,seed=5,ops=get")
    b.mount()
    assert read_file(b / "model.pt") == good
    assert_same_state(torch.load(b / "model.pt"), state)
    assert "fetching it again" in b.log()
    assert set(local_chunks(b)) == ids


@pytest.mark.timeout(120)
def test_a_file_record_damaged_on_the_way_is_detected_and_read_again(make_mount, new_remote):
    remote = new_remote("file")
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    names = [f"m{i}.pt" for i in range(3)]
    for i, name in enumerate(names):
        torch.save(tensors(350 + i, [100_000]), a / name)
    wait_state([a / n for n in names])
    # The first three GETs, the three records of the reader's first sync pass, come back with a
    # bit flipped; a flipped chunk id would leave the file unreadable on this node for good.
    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS, faults="flip=1,count=3,ops=get")
    for name in names:
        wait_true(lambda: exists(b / name), f"{name} on the reader")
        assert read_file(b / name) == read_file(a / name), name
    assert b.log().count("fails its checksum") == 3


# --- 6. three nodes on one bucket ---

@pytest.mark.timeout(240)
def test_three_nodes_share_one_bucket(make_mount, new_remote):
    remote = new_remote("s3")
    nodes = [mount_on(make_mount, remote, f"n{i}", options=REMOTE_CHUNKS) for i in range(3)]
    d = "ckpt/step-100"
    for n in nodes:
        os.makedirs(n / d, exist_ok=True)
    ranks = {}
    for i, n in enumerate(nodes):
        name = f"{d}/rank-{i}.pt"
        torch.save(tensors(400 + i, [250_000, 7_000]), n / name)
        ranks[name] = read_file(n / name)
    for n in nodes:
        wait_true(lambda: all(exists(n / name) for name in ranks), f"every rank on {n.mnt}")
        assert sorted(os.listdir(n / d)) == sorted(Path(r).name for r in ranks)
        for name, data in ranks.items():
            assert read_file(n / name) == data, (n.mnt, name)

    # A tensor every node saves (identical bytes): node 0 uploads it, the others find it there.
    common = ckpt_bytes({"embedding": tensors(499, [600_000])["t0"]})
    before = set(local_chunks(nodes[0]))
    write_file(nodes[0] / f"{d}/common-0.pt", common)
    wait_state([nodes[0] / f"{d}/common-0.pt"])
    shared = set(local_chunks(nodes[0])) - before  # the chunks of the common file
    assert len(shared) >= 3
    for i in (1, 2):
        write_file(nodes[i] / f"{d}/common-{i}.pt", common)
    for i in (1, 2):
        wait_state([nodes[i] / f"{d}/common-{i}.pt"])
    for n in nodes:
        for i in range(3):
            wait_true(lambda: exists(n / f"{d}/common-{i}.pt"), f"common-{i}.pt on {n.mnt}")
            assert read_file(n / f"{d}/common-{i}.pt") == common
    files = set(remote.objects("files/"))
    assert {f"files/{d}/common-{i}.pt" for i in range(3)} <= files
    # radosgw's log: each chunk of the common file was PUT once, by node 0.
    wait_true(lambda: sum(k.startswith("files/") and "common-" in k
                          for k in remote.requests("PUT")) >= 3, "radosgw logging the PUTs")
    puts = remote.requests("PUT", "chunks/")
    for c in shared:
        assert sum(k.endswith("/" + c) for k in puts) == 1, f"chunk {c} was uploaded again"
    assert set(remote_chunks(remote)) >= shared

    # A delete on one node removes the file on the others.
    os.unlink(nodes[1] / f"{d}/rank-0.pt")
    for n in (nodes[0], nodes[2]):
        wait_true(lambda: not exists(n / f"{d}/rank-0.pt"), f"rank-0.pt gone from {n.mnt}")
        assert "rank-0.pt" not in os.listdir(n / d)
    assert f"files/{d}/rank-0.pt" not in remote.objects("files/")
    assert read_file(nodes[0] / f"{d}/rank-1.pt") == ranks[f"{d}/rank-1.pt"]


# --- 7. durability=remote ---

def save_and_fsync(path, obj):
    """torch.save into an open file, fsync, and the file's state right after fsync returned."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
        return state_of(path)


@pytest.mark.timeout(120)
def test_fsync_with_durability_remote_waits_for_the_backend(make_mount, new_remote):
    remote = new_remote("s3")
    state = tensors(500, [300_000])
    r = mount_on(make_mount, remote, "r", options=f"{REMOTE_CHUNKS},durability=remote",
                 faults="delay_ms=300,ops=put")
    assert save_and_fsync(r / "model.pt", state) == "remote"
    assert "files/model.pt" in remote.objects("files/")
    assert state_of(r / "model.pt") == "remote"

    # durability=local: fsync is done once the local tier holds the file; PUTs take 3 s each.
    lo = mount_on(make_mount, remote, "lo", options=f"{REMOTE_CHUNKS},durability=local",
                  faults="delay_ms=3000,ops=put")
    assert save_and_fsync(lo / "local.pt", state) == "uploading"
    assert_same_state(torch.load(lo / "local.pt"), state)
    wait_state([lo / "local.pt"], timeout=60)


# --- 8. a bad backend is refused at mount time ---

@pytest.mark.timeout(180)
def test_a_missing_bucket_or_wrong_credentials_fail_the_mount(make_mount, rgw, workdir):
    env = dict(rgw.env)
    names = iter(range(100))

    def fails(args, env):
        m = make_mount(name=f"bad{next(names)}", mount=False, args=args, env=env)
        p = run(m.mount_command(), timeout=120, check=False, env=m.environ())
        assert p.returncode != 0, f"mounted with {args}: {p.stdout}"
        assert not m.mounted()
        return p.stderr

    err = fails(["--backend", "s3://ckptfs-no-such-bucket-4711/x"], env)
    assert "ckptfs-no-such-bucket-4711" in err and "does not exist" in err, err

    bucket = rgw.make_bucket("creds")
    for var, value in [("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
                       ("AWS_ACCESS_KEY_ID", "NOSUCHACCESSKEY00000")]:
        err = fails(["--backend", f"s3://{bucket}"], {**env, var: value})
        assert "credentials" in err and bucket in err, err

    err = fails(["--backend", f"file://{workdir}/no-such-dir"], None)
    assert "no-such-dir" in err, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["s3", "file"])
def test_a_fresh_mount_serves_the_buckets_namespace_as_mount_returns(make_mount, new_remote,
                                                                      kind):
    # A job started right after `ckptfs mount` must find every checkpoint directory: the mount
    # returns only once its first sync from the bucket is done.
    remote = new_remote(kind)
    a = mount_on(make_mount, remote, "a")
    names = [f"iter_{i:07d}" for i in range(200)]
    for n in names:
        (a / n).mkdir()
        write_file(a / n / "model_optim_rng.pt", n.encode())
    wait_state([a / n / "model_optim_rng.pt" for n in names])
    for attempt in range(3):
        b = mount_on(make_mount, remote, f"fresh{attempt}")
        assert sorted(os.listdir(b.mnt)) == names  # no wait: as `ckptfs mount` returned
        assert read_file(b / names[-1] / "model_optim_rng.pt") == names[-1].encode()
        assert "first sync from" in b.log()
        b.umount()


@pytest.mark.timeout(120)
def test_a_mount_whose_bucket_cannot_be_listed_fails_with_the_reason(make_mount, new_remote):
    remote = new_remote("file")
    a = mount_on(make_mount, remote, "a")
    write_file(a / "x.pt", b"x")
    wait_state([a / "x.pt"])
    b = make_mount(options="mount_timeout=2", name="b", mount=False,
                   args=backend_args(remote, "fail=1,ops=list"), env=remote.env)
    p = run(b.mount_command(), check=False, timeout=60)
    assert p.returncode != 0 and not b.mounted()
    assert "could not be read within 2" in p.stderr, p.stderr
