# Differential test: one seeded random sequence of file operations applied to a ckptfs mount and to
# a directory on the local disk; after every step both trees must look the same (listings, sizes,
# full contents, what open handles read).
#
#   CKPTFS_DIFF_SEED=N     replay one sequence (the seed is printed, and named in every failure)
#   CKPTFS_DIFF_STEPS=N    steps (default 400)
#   CKPTFS_DIFF_SECONDS=S  wall-clock cap per configuration (default 60): the run stops early,
#                          passing, after S s
import errno
import os
import random
import stat
import time

import pytest

from conftest import SMALL_CHUNKS

KiB = 1 << 10
MiB = 1 << 20
MAX_SIZE = 3 * MiB
MAX_HANDLES = 4


class Tree:
    """One side of the comparison: a root and the descriptors opened under it."""

    def __init__(self, root, drop_cache):
        self.root = str(root)
        self.drop_cache = drop_cache

    def path(self, rel):
        return os.path.join(self.root, rel)

    def listing(self):
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                rel = os.path.relpath(p, self.root)
                out[rel] = ("dir", 0) if stat.S_ISDIR(st.st_mode) else ("file", st.st_size)
        return out

    def content(self, rel):
        fd = os.open(self.path(rel), os.O_RDONLY)
        try:
            if self.drop_cache:  # read what the daemon has, not the kernel's cached pages
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            chunks = []
            while True:
                b = os.read(fd, 4 * MiB)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks)
        finally:
            os.close(fd)


def outcome(fn):
    """fn()'s result, or ("error", errno)."""
    try:
        return fn()
    except OSError as e:
        return ("error", errno.errorcode.get(e.errno, e.errno))


class Differential:
    def __init__(self, mount_root, local_root, seed):
        self.seed = seed
        self.rng = random.Random(seed)
        self.a = Tree(mount_root, drop_cache=True)
        self.b = Tree(local_root, drop_cache=False)
        self.handles = []  # [{"fds": (fd_a, fd_b), "append": bool, "name": str}]
        self.history = []
        self.blocks = [self.rng.randbytes(64 * KiB) for _ in range(4)]  # repeated: dedup paths
        for t in (self.a, self.b):
            os.mkdir(t.path("sub"))

    # --- helpers ---
    def fail_msg(self, what):
        return (f"{what}\nseed {self.seed} (replay: CKPTFS_DIFF_SEED={self.seed} with the same "
                f"config); "
                f"last steps:\n  " + "\n  ".join(self.history[-25:]))

    def both(self, fn):
        """Applies fn(tree, index) to both sides; both must agree on the outcome."""
        ra = outcome(lambda: fn(self.a, 0))
        rb = outcome(lambda: fn(self.b, 1))
        assert ra == rb, self.fail_msg(f"outcomes differ: mount {ra!r}, local {rb!r}")
        return ra

    def subdir(self):
        return "sub" if os.path.isdir(self.b.path("sub")) else "sub2"

    def names(self):
        d = self.subdir()
        return [f"f{i}" for i in range(6)] + [f"{d}/g{i}" for i in range(3)]

    def existing_files(self):
        return sorted(k for k, v in self.b.listing().items() if v[0] == "file")

    def data(self, n):
        if self.rng.random() < 0.25:
            out = b"".join(self.rng.choice(self.blocks) for _ in range(n // (64 * KiB) + 1))
            return out[:n]
        return self.rng.randbytes(n)

    def length(self):
        return self.rng.choice([1, 7, 100, 4 * KiB, 4 * KiB + 1, 17 * KiB, 64 * KiB, 200 * KiB,
                                MiB, MiB + 333, 2 * MiB])

    def file_size(self, rel):
        return os.stat(self.b.path(rel)).st_size

    # --- operations ---
    def op_open(self):
        if len(self.handles) >= MAX_HANDLES:
            return self.op_close()
        name = self.rng.choice(self.names())
        flags = os.O_RDWR | os.O_CREAT
        if self.rng.random() < 0.3:
            flags |= os.O_TRUNC
        append = self.rng.random() < 0.15
        if append:
            flags |= os.O_APPEND
        self.history.append(f"open {name} flags={flags:#o}")
        fds = []
        self.both(lambda t, i: fds.append(os.open(t.path(name), flags, 0o644)))
        if len(fds) == 2:
            self.handles.append({"fds": tuple(fds), "append": append, "name": name})
        else:
            for fd in fds:
                os.close(fd)

    def op_close(self):
        if not self.handles:
            return self.op_open()
        h = self.handles.pop(self.rng.randrange(len(self.handles)))
        self.history.append(f"close handle on {h['name']}")
        self.both(lambda t, i: os.close(h["fds"][i]))

    def op_write_handle(self):
        if not self.handles:
            return self.op_write_path()
        h = self.rng.choice(self.handles)
        size = os.fstat(h["fds"][1]).st_size
        n = self.length()
        off = self.rng.randrange(0, size + 64 * KiB + 1)
        if h["append"]:
            n = min(n, max(1, MAX_SIZE - size))
        else:
            off = min(off, MAX_SIZE)
            n = min(n, MAX_SIZE + 64 * KiB - off)
        data = self.data(n)
        self.history.append(f"write handle on {h['name']} off={off} len={n} append={h['append']}")
        if h["append"]:
            self.both(lambda t, i: os.write(h["fds"][i], data))
        else:
            self.both(lambda t, i: os.pwrite(h["fds"][i], data, off))

    def op_write_path(self):
        name = self.rng.choice(self.names())
        b_path = self.b.path(name)
        size = os.stat(b_path).st_size if os.path.exists(b_path) else 0
        off = min(self.rng.randrange(0, size + 64 * KiB + 1), MAX_SIZE)
        n = min(self.length(), MAX_SIZE + 64 * KiB - off)
        data = self.data(n)
        self.history.append(f"write path {name} off={off} len={n}")

        def w(t, i):
            fd = os.open(t.path(name), os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                return os.pwrite(fd, data, off)
            finally:
                os.close(fd)
        self.both(w)

    def op_rewrite(self):
        """The torch.save pattern: open with O_TRUNC, write front to back, close."""
        name = self.rng.choice(self.names())
        n = self.rng.choice([0, 10, 64 * KiB, MiB, 2 * MiB + 5])
        data = self.data(n)
        self.history.append(f"rewrite {name} len={n}")

        def w(t, i):
            with open(t.path(name), "wb") as f:
                f.write(data)
        self.both(w)

    def op_truncate(self):
        new = self.rng.choice([0, 1, 4 * KiB, 100_000, MiB, self.rng.randrange(MAX_SIZE)])
        if self.handles and self.rng.random() < 0.5:
            h = self.rng.choice(self.handles)
            self.history.append(f"ftruncate handle on {h['name']} to {new}")
            self.both(lambda t, i: os.ftruncate(h["fds"][i], new))
        else:
            files = self.existing_files()
            if not files:
                return self.op_rewrite()
            name = self.rng.choice(files)
            self.history.append(f"truncate {name} to {new}")
            self.both(lambda t, i: os.truncate(t.path(name), new))

    def op_rename(self):
        files = self.existing_files()
        if not files:
            return self.op_rewrite()
        src = self.rng.choice(files)
        dst = self.rng.choice(self.names())  # often an existing file: replaced
        self.history.append(f"rename {src} -> {dst}")
        self.both(lambda t, i: os.rename(t.path(src), t.path(dst)))
        for h in self.handles:
            if h["name"] == src:
                h["name"] = dst

    def op_rename_dir(self):
        d = self.subdir()
        other = "sub2" if d == "sub" else "sub"
        self.history.append(f"rename dir {d} -> {other}")
        self.both(lambda t, i: os.rename(t.path(d), t.path(other)))
        for h in self.handles:
            if h["name"].startswith(d + "/"):
                h["name"] = other + h["name"][len(d):]

    def op_unlink(self):
        files = self.existing_files()
        if not files:
            return self.op_rewrite()
        name = self.rng.choice(files)
        self.history.append(f"unlink {name}")
        self.both(lambda t, i: os.unlink(t.path(name)))

    def op_fsync(self):
        if not self.handles:
            return self.op_open()
        h = self.rng.choice(self.handles)
        self.history.append(f"fsync handle on {h['name']}")
        self.both(lambda t, i: os.fsync(h["fds"][i]))

    def op_read_handle(self):
        if not self.handles:
            return self.op_open()
        h = self.rng.choice(self.handles)
        size = os.fstat(h["fds"][1]).st_size
        off = self.rng.randrange(0, size + 2)
        n = self.rng.choice([1, 4096, 100_000, MiB])
        self.history.append(f"read handle on {h['name']} off={off} len={n}")
        self.both(lambda t, i: os.pread(h["fds"][i], n, off))

    OPS = [("op_open", 10), ("op_close", 8), ("op_write_handle", 22), ("op_write_path", 8),
           ("op_rewrite", 8), ("op_truncate", 8), ("op_rename", 8), ("op_rename_dir", 1),
           ("op_unlink", 5), ("op_fsync", 3), ("op_read_handle", 6)]

    def step(self):
        names, weights = zip(*self.OPS)
        getattr(self, self.rng.choices(names, weights)[0])()

    # --- checks ---
    def compare(self):
        la, lb = self.a.listing(), self.b.listing()
        assert la == lb, self.fail_msg(f"listings differ:\n mount {la}\n local {lb}")
        for rel, (kind, size) in lb.items():
            if kind != "file":
                continue
            ca, cb = self.a.content(rel), self.b.content(rel)
            if ca != cb:
                first = next((i for i in range(min(len(ca), len(cb))) if ca[i] != cb[i]),
                             min(len(ca), len(cb)))
                raise AssertionError(self.fail_msg(
                    f"{rel}: contents differ (mount {len(ca)} bytes, local {len(cb)} bytes, "
                    f"first difference at {first})"))
            assert len(cb) == size
        for h in self.handles:
            sa, sb = os.fstat(h["fds"][0]).st_size, os.fstat(h["fds"][1]).st_size
            assert sa == sb, self.fail_msg(f"open handle on {h['name']}: size {sa} vs {sb}")

    def close_all(self):
        while self.handles:
            h = self.handles.pop()
            self.history.append(f"close handle on {h['name']}")
            self.both(lambda t, i: os.close(h["fds"][i]))


CONFIGS = {
    # Small chunks: files of a few MiB cross many chunk boundaries. The smallest reorder window
    # (one write): writes ahead of the stream soon overflow it into the staging file.
    "small-chunks": SMALL_CHUNKS + ",reorder_buffer=1M",
    # Default chunks; a one-write queue (every write waits for the one before) and plain pread.
    "default-chunks": "write_queue=1M,io_engine=pread",
    "writeback": "writeback_cache=1",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_random_operations_match_local_disk(make_mount, workdir, config):
    seed = int(os.environ.get("CKPTFS_DIFF_SEED", random.SystemRandom().randrange(2**32)))
    steps = int(os.environ.get("CKPTFS_DIFF_STEPS", "400"))
    cap = float(os.environ.get("CKPTFS_DIFF_SECONDS", "60"))
    print(f"differential seed {seed} (replay: CKPTFS_DIFF_SEED={seed}), config {config}")
    m = make_mount(options=CONFIGS[config])
    local = workdir / "local"
    local.mkdir()
    d = Differential(m.mnt, local, seed)
    start = time.monotonic()
    done = 0
    try:
        for i in range(steps):
            if time.monotonic() - start > cap:
                break
            d.step()
            d.compare()
            done += 1
            if i % 100 == 99:  # a clean remount in the middle: everything persists
                d.close_all()
                d.compare()
                d.history.append("remount")
                m.remount()
                d.compare()
        d.close_all()
        d.compare()
        m.remount()
        d.compare()
    finally:
        for h in d.handles:
            for fd in h["fds"]:
                try:
                    os.close(fd)
                except OSError:
                    pass
    print(f"{done} steps in {time.monotonic() - start:.1f} s")
    # The store's books balance: what manifests reference is exactly what is on disk.
    s = m.stats()
    files = [v for v in d.b.listing().values() if v[0] == "file"]
    # (stats counts files with committed bytes: one created and never written has none)
    assert sum(1 for _, size in files if size) <= s["files"] <= len(files), d.fail_msg(f"{s}")
    assert s["logical_bytes"] == sum(size for _, size in files), d.fail_msg(f"stats {s}")
    assert s["stored_bytes"] == m.chunk_bytes_on_disk(), d.fail_msg(f"stats {s}")
    assert s["chunks"] == m.chunks_on_disk(), d.fail_msg(f"stats {s}")
    assert not os.listdir(m.cache / "staging")
