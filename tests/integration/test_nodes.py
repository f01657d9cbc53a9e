# Eight nodes on one radosgw bucket (docs/journal.md): eight mounts with their own cache
# directories, each writing its ranks of one checkpoint; the union on every mount; two nodes
# writing one path at once; and a restore storm: eight cold mounts loading one checkpoint with
# several readers each, and each its own rank, counted at radosgw (every chunk fetched at most
# once per node). Bounded: small checkpoints, 8 mounts, timeouts on every wait.
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import read_file
from test_remote import (REMOTE_CHUNKS, ckpt_bytes, exists, mount_on, new_remote,  # noqa: F401
                         tensors, wait_state, wait_true)

NODES = 8


def chunk_gets(remote):
    """{chunk id hex: GETs radosgw logged for it}, once its log has stopped growing."""
    def count():
        counts = {}
        for k in remote.requests("GET", "chunks/"):
            c = k.rsplit("/", 1)[1]
            counts[c] = counts.get(c, 0) + 1
        return counts
    last = count()
    for _ in range(30):
        time.sleep(1)
        now = count()
        if now == last:
            return now
        last = now
    return last


@pytest.mark.timeout(600)
def test_eight_nodes_see_the_union_and_agree_on_a_contested_path(make_mount, new_remote):  # noqa: F811
    remote = new_remote("s3")
    nodes = [mount_on(make_mount, remote, f"n{i}", options=REMOTE_CHUNKS) for i in range(NODES)]
    d = "ckpt/step-1"
    for n in nodes:
        os.makedirs(n / d, exist_ok=True)
    ranks = {}
    for i, n in enumerate(nodes):  # two ranks per node
        for r in (2 * i, 2 * i + 1):
            name = f"{d}/rank-{r:02d}.pt"
            torch.save(tensors(600 + r, [40_000]), n / name)
            ranks[name] = read_file(n / name)
    want = sorted(Path(k).name for k in ranks)
    for n in nodes:
        wait_true(lambda: sorted(os.listdir(n / d)) == want, f"every rank on {n.mnt}", 120)
        for name, data in ranks.items():
            assert read_file(n / name) == data, (n.mnt, name)
    # Every change was announced in the journal: one entry per record and directory at least.
    assert len(remote.objects("journal/")) >= len(ranks)

    # Nodes 2 and 5 save the same path at once, different bytes. Every node ends with one of
    # the two whole (never a mix), and all eight with the same one: the record put last.
    path = f"{d}/latest.pt"
    versions = [ckpt_bytes(tensors(700 + k, [60_000])) for k in range(2)]
    together(lambda k: ((nodes[2], nodes[5])[k] / path).write_bytes(versions[k]), range(2))

    def settled():
        seen = []
        for n in nodes:
            if not exists(n / path):
                return None
            seen.append(read_file(n / path))
        return seen if all(s == seen[0] for s in seen) else None
    wait_true(lambda: settled() is not None, "one version of latest.pt on every node", 120)
    got = settled()[0]
    assert got in versions, "a mix of the two saves"
    # The bucket's record is that version's: a ninth, fresh mount reads the same bytes.
    fresh = mount_on(make_mount, remote, "fresh", options=REMOTE_CHUNKS)
    assert read_file(fresh / path) == got


def together(fn, args):
    """fn(a) for every a in args, each on its own thread, all at once; returns when all end."""
    threads = [threading.Thread(target=fn, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def load_all(paths, readers):
    """torch.load of each path on `readers` threads at once; {path: [state dicts]}."""
    out = {p: [] for p in paths}
    errors = []
    lock = threading.Lock()

    def work(p):
        try:
            sd = torch.load(p)
            with lock:
                out[p].append(sd)
        except Exception as e:  # noqa: BLE001  (reported below)
            with lock:
                errors.append(f"{p}: {e!r}")
    together(work, [p for p in paths for _ in range(readers)])
    assert errors == []
    return out


@pytest.mark.timeout(600)
def test_a_restore_storm_fetches_every_chunk_once_per_node(make_mount, new_remote):  # noqa: F811
    remote = new_remote("s3")
    writer = mount_on(make_mount, remote, "writer", options=REMOTE_CHUNKS)
    (writer / "shared").mkdir()
    (writer / "ranks").mkdir()
    shared = tensors(800, [300_000])  # one checkpoint every node loads
    torch.save(shared, writer / "shared" / "model.pt")
    own = {r: tensors(900 + r, [150_000]) for r in range(NODES)}  # a rank file per node
    for r, sd in own.items():
        torch.save(sd, writer / "ranks" / f"rank-{r}.pt")
    paths = ["shared/model.pt"] + [f"ranks/rank-{r}.pt" for r in range(NODES)]
    wait_state([writer / p for p in paths])
    writer.umount()
    assert chunk_gets(remote) == {}, "the writer fetched chunks"

    # Eight cold mounts, three readers each, all on shared/model.pt at once.
    nodes = [mount_on(make_mount, remote, f"s{i}", options=REMOTE_CHUNKS) for i in range(NODES)]
    got = [None] * NODES

    def node(i):
        got[i] = load_all([nodes[i] / "shared" / "model.pt"], readers=3)
    together(node, range(NODES))
    for i in range(NODES):
        for sd in got[i][nodes[i] / "shared" / "model.pt"]:
            assert all(torch.equal(sd[k], shared[k]) for k in shared)
    storm = chunk_gets(remote)
    assert len(storm) >= 3
    over = {c: n for c, n in storm.items() if n > NODES}
    assert over == {}, f"chunks fetched more than once per node: {over}"
    for n in nodes:
        n.umount()

    # Eight more cold mounts, each loading its own rank (two readers each). With warm=file a
    # node pulls in only what it opens, so every chunk of a rank file is fetched once in all.
    # (The default, warm=checkpoint, would have each node fetch every rank: once per node.)
    nodes = [mount_on(make_mount, remote, f"o{i}", options=REMOTE_CHUNKS + ",warm=file")
             for i in range(NODES)]

    def own_rank(i):
        got[i] = load_all([nodes[i] / "ranks" / f"rank-{i}.pt"], readers=2)
    together(own_rank, range(NODES))
    for i in range(NODES):
        for sd in got[i][nodes[i] / "ranks" / f"rank-{i}.pt"]:
            assert all(torch.equal(sd[k], own[i][k]) for k in own[i])
    after = chunk_gets(remote)
    ranks = {c: n - storm.get(c, 0) for c, n in after.items() if n - storm.get(c, 0) > 0}
    assert len(ranks) >= NODES
    assert {c: n for c, n in ranks.items() if n > 1} == {}, "a rank's chunk fetched twice"


@pytest.mark.timeout(300)
def test_a_node_that_fell_behind_a_truncated_journal_lists_the_bucket(make_mount, new_remote):  # noqa: F811
    # Node b is stopped (SIGSTOP) while a saves 12 files and `ckptfs gc` cuts the journal to its
    # newest 2 entries: when b runs again, the entries after its cursor are gone, and it lists
    # the bucket instead, seeing every file.
    import signal
    from test_gc import gc
    remote = new_remote("s3")
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    (a / "run").mkdir()
    wait_true(lambda: exists(b / "run"), "run/ on b")
    pid = b.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        names = [f"run/f{i}.bin" for i in range(12)]
        for i, name in enumerate(names):
            (a / name).write_bytes(os.urandom(1000 + i))
        wait_state([a / n for n in names])
        p = gc(remote, "--grace", "1", "--journal-keep", "2")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "journal entries" in p.stdout, p.stdout
        assert len(remote.objects("journal/")) == 2
    finally:
        os.kill(pid, signal.SIGCONT)
    for name in names:
        wait_true(lambda: exists(b / name), f"{name} on b", 60)
        assert read_file(b / name) == read_file(a / name)
    assert "truncated past what this node read" in b.log()
    # gc wrote a record snapshot before the cut, and kept the entries after it: a fresh mount
    # reads it and sees every file.
    assert "snapshot records 12 files" in p.stdout, p.stdout
    c = mount_on(make_mount, remote, "c", options=REMOTE_CHUNKS)
    assert "read the record snapshot" in c.log()
    for name in names:
        assert read_file(c / name) == read_file(a / name)


def tree(root):
    """{relative path: bytes} of every file under root, directories with a trailing '/'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d)) + "/"] = b""
        for f in filenames:
            out[os.path.normpath(os.path.join(rel, f))] = read_file(os.path.join(dirpath, f))
    return out


def settled_gets(remote, sub):
    """GETs radosgw logged under sub, once its log has stopped growing."""
    last = remote.requests("GET", sub)
    for _ in range(30):
        time.sleep(1)
        now = remote.requests("GET", sub)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.timeout(300)
def test_a_new_mount_reads_the_record_snapshot_and_the_journal_after_it(make_mount, new_remote):  # noqa: F811
    # Node a saves 24 files; `ckptfs snapshot` packs their records; a then saves, replaces and
    # deletes files and makes and removes directories. A fresh mount b sees exactly a's
    # namespace, and radosgw's log shows it read only the records changed after the snapshot.
    from conftest import CKPTFS_BIN, run
    remote = new_remote("s3")
    a = mount_on(make_mount, remote, "a", options=REMOTE_CHUNKS)
    (a / "run").mkdir()
    (a / "run" / "old").mkdir()
    names = [f"run/f{i:02d}.bin" for i in range(24)]
    for i, name in enumerate(names):
        (a / name).write_bytes(os.urandom(2000 + i))
    wait_state([a / n for n in names])
    p = run([CKPTFS_BIN, "snapshot", *remote.mount_args], check=False,
            env={**os.environ, **remote.env}, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "snapshot records 24 files" in p.stdout, p.stdout
    assert remote.objects("snapshot/"), "no snapshot in the bucket"

    (a / "run" / "g.bin").write_bytes(os.urandom(3000))
    (a / "run" / "f01.bin").write_bytes(os.urandom(3001))
    os.unlink(a / "run" / "f02.bin")
    (a / "run" / "new").mkdir()
    os.rmdir(a / "run" / "old")
    wait_state([a / "run" / "g.bin", a / "run" / "f01.bin"])
    wait_true(lambda: "files/run/f02.bin" not in remote.objects("files/")
              and "dirs/run/old" not in remote.objects("dirs/"), "the deletions in the bucket", 60)
    before = len(settled_gets(remote, "files/"))

    b = mount_on(make_mount, remote, "b", options=REMOTE_CHUNKS)
    assert tree(b.mnt) == tree(a.mnt)
    assert "read the record snapshot" in b.log()
    read = settled_gets(remote, "files/")[before:]
    assert set(read) <= {"files/run/g.bin", "files/run/f01.bin", "files/run/f02.bin"}, read
    assert len(read) <= 3, read
