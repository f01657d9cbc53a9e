# Shared fixtures of the mount integration tests: they run against a real FUSE mount of the
# ckptfs binary and must be run as root by /usr/bin/python3 (Debian's PyTorch lives there).
#
# Environment:
#   CKPTFS_BIN       the ckptfs binary (default: build/tools/ckptfs under the repository root)
#   CKPTFS_TEST_TMP  where temporary mountpoints and cache directories go (default: /tmp)
#   CKPTFS_TEST_TIMEOUT  seconds one test may run before it is interrupted (default: 600)
#   CKPTFS_TEST_MOUNT_OPTIONS  -o options added to every test mount (e.g. writeback_cache=1), to run
#                    the suite against another configuration
#   CKPTFS_TEST_RGW_DIR  a radosgw already started there with scripts/rgw.sh: the `rgw` fixture uses
#                    it (and leaves it running) instead of starting one for the session
import errno
import hashlib
import os
import struct

# The tests load checkpoints they wrote themselves, which hold what frameworks' checkpoints hold
# (argparse.Namespace args, numpy values): trusted input, loaded as Megatron and DeepSpeed load it,
# with weights_only=False, also where torch >= 2.6 defaults to True. Tests that check what a
# default torch.load of torch 2.x accepts pass weights_only=True themselves.
os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CKPTFS_BIN = Path(os.environ.get("CKPTFS_BIN", REPO_ROOT / "build" / "tools" / "ckptfs"))
TEST_TMP = Path(os.environ.get("CKPTFS_TEST_TMP", "/tmp"))
DEFAULT_TIMEOUT = int(os.environ.get("CKPTFS_TEST_TIMEOUT", "600"))
EXTRA_OPTIONS = os.environ.get("CKPTFS_TEST_MOUNT_OPTIONS", "")

# Small chunks for tests that want many chunk boundaries in small files.
SMALL_CHUNKS = "chunk_min=4K,chunk_avg=16K,chunk_max=64K"


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): interrupt the test after this long")
    config.addinivalue_line("markers", "large: writes several GiB (still part of the default run)")


def run(cmd, timeout=120, check=True, **kw):
    """Runs a command, capturing its output; fails with both streams shown."""
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def _unescape_mountinfo(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and s[i + 1:i + 4].isdigit() and len(s[i + 1:i + 4]) == 3:
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_fstype(path, pid="self"):
    """The filesystem type mounted exactly at path (the last stacked), or None; in the mount
    namespace of process `pid` (this process's by default)."""
    path = os.path.abspath(path)
    found = None
    with open(f"/proc/{pid}/mountinfo", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            if _unescape_mountinfo(fields[4]) == path:
                found = fields[dash + 1]
    return found


def pid_alive(pid):
    """True while pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False


class CkptMount:
    """One ckptfs mount: a mountpoint and its cache directory."""

    def __init__(self, mnt, cache, options=None, log_level="info", args=(), env=None):
        self.mnt = Path(mnt)
        self.cache = Path(cache)
        self.options = options
        self.log_level = log_level
        self.args = list(args)  # more `ckptfs mount` arguments (--backend URL, ...)
        self.env = env  # variables added to the daemon's environment (AWS_*)

    # --- paths ---
    def __truediv__(self, rel):
        return self.mnt / rel

    @property
    def log_path(self):
        return self.cache / "ckptfs.log"

    @property
    def chunks_dir(self):
        return self.cache / "chunks"

    # --- life cycle ---
    def mount(self):
        run(self.mount_command(), timeout=60, env=self.environ())
        assert self.mounted(), f"{self.mnt} is not a ckptfs mount after `ckptfs mount`"

    def mount_command(self):
        cmd = [CKPTFS_BIN, "mount", self.mnt, "--cache-dir", self.cache,
               "--log-level", self.log_level, *self.args]
        opts = ",".join(o for o in (EXTRA_OPTIONS, self.options) if o)
        if opts:
            cmd += ["-o", opts]
        return cmd

    def environ(self):
        return {**os.environ, **self.env} if self.env else None

    def mounted(self):
        return mount_fstype(self.mnt) == "fuse.ckptfs"

    def umount(self):
        """Unmounts with `ckptfs umount` (which waits for the daemon to stop)."""
        run([CKPTFS_BIN, "umount", self.mnt], timeout=360)
        assert not self.mounted()

    def force_umount(self):
        """Gets the mount out of the way whatever state it is in; never raises."""
        if not self.mounted():
            return
        try:
            p = run([CKPTFS_BIN, "umount", self.mnt], timeout=360, check=False)
            if p.returncode == 0 and not self.mounted():
                return
        except subprocess.TimeoutExpired:
            pass
        try:
            subprocess.run(["umount", "-l", str(self.mnt)], timeout=60, check=False)
        except subprocess.TimeoutExpired:
            pass
        pid = self.daemon_pid()
        if pid and pid_alive(pid):
            # A lazily detached mount may keep its daemon alive; wait a little, then stop it.
            deadline = time.monotonic() + 30
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid) and _comm(pid) == "ckptfs":
                os.kill(pid, signal.SIGKILL)

    def remount(self):
        self.umount()
        self.mount()

    def daemon_pid(self):
        try:
            return int((self.cache / "lock").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def kill_daemon(self):
        """kill -9 of the daemon; returns once it is gone."""
        pid = self.daemon_pid()
        assert pid and pid_alive(pid) and _comm(pid) == "ckptfs"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(pid), "the daemon survived SIGKILL"

    def crash_and_remount(self, *fds):
        """kill -9 of the daemon with `fds` still open on the mount (closed afterwards: the
        daemon is gone, so their close fails), then a remount, which recovers."""
        self.kill_daemon()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.umount()
        self.mount()

    # --- observation ---
    def stats(self):
        """`ckptfs stats`, parsed: {name: int or float}."""
        out = run([CKPTFS_BIN, "stats", self.mnt]).stdout
        result = {}
        for line in out.splitlines():
            if not line.strip():
                break  # the per-directory table follows
            k, v = line.split(None, 1)
            if k != "path":
                result[k] = float(v) if "." in v else int(v)
        return result

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def chunk_files(self):
        """Every chunk file on the local tier: chunks/<2 hex>/<32 hex>."""
        out = []
        for sub in self.chunks_dir.glob("??"):
            out.extend(p for p in sub.iterdir() if len(p.name) == 32)
        return out

    def pack_extents(self):
        """The chunks kept in packs (-o packs=1) as their indexes list them:
        {chunk id hex: (pack path, offset, length)}. An index (chunks/packs/<name>.idx) is a log
        of 48-byte records: '+' or '-', b"CKPACK\\0", the id (16), offset and length (8 each,
        little-endian), a check (8)."""
        out = {}
        for idx in sorted((self.chunks_dir / "packs").glob("*.idx")):
            data = idx.read_bytes()
            for at in range(0, len(data) - len(data) % 48, 48):
                r = data[at:at + 48]
                if r[1:8] != b"CKPACK\0":
                    break
                off, length = struct.unpack("<QQ", r[24:40])
                if r[0:1] == b"+":
                    out[r[8:24].hex()] = (idx.with_suffix(".pack"), off, length)
                else:
                    out.pop(r[8:24].hex(), None)
        return out

    def chunk_bytes_on_disk(self):
        """Bytes of the chunks on the local tier, chunk files and pack extents, each chunk once:
        a compaction in progress holds a chunk in both homes for a moment, and the daemon
        counts it once."""
        return sum(length for _, _, length in self.chunk_locations().values())

    def chunk_ids_on_disk(self):
        """The ids (hex) of the chunks on the local tier, sorted: chunk files and pack extents."""
        return sorted(self.chunk_locations())

    def chunks_in_two_homes(self):
        """Chunks (hex ids) held both by a chunk file and by a pack's extent: only while a
        compaction moves them."""
        return sorted({p.name for p in self.chunk_files()} & set(self.pack_extents()))

    def chunks_on_disk(self):
        """Chunks on the local tier: chunk files and pack extents, each chunk once."""
        return len(self.chunk_locations())

    def chunk_locations(self):
        """Where each chunk of the local tier lies: {id hex: (path, offset, length)}, a chunk
        file (offset 0, its whole size) or an extent of a pack."""
        out = {p.name: (p, 0, p.stat().st_size) for p in self.chunk_files()}
        out.update(self.pack_extents())
        return out

    def corrupt_chunk(self, name, at=None):
        """Flips a byte of chunk `name` where it lies on the local tier (its chunk file, or its
        extent's bytes in its pack), `at` bytes into the chunk (its middle by default)."""
        path, offset, length = self.chunk_locations()[name]
        at = length // 2 if at is None else at
        assert 0 <= at < length, (name, at, length)
        with open(path, "r+b") as f:
            f.seek(offset + at)
            b = f.read(1)
            f.seek(offset + at)
            f.write(bytes([b[0] ^ 0xFF]))

    def losable_chunks(self):
        """The chunks lose_chunk can take off the local tier one at a time: every chunk file,
        and the last extent of each pack."""
        out = [p.name for p in self.chunk_files()]
        last = {}
        for name, (path, offset, _) in self.pack_extents().items():
            if path not in last or offset > last[path][1]:
                last[path] = (name, offset)
        return sorted(out + [name for name, _ in last.values()])

    def lose_chunk(self, name):
        """Takes chunk `name` (one of losable_chunks) off the local tier. A chunk file is
        unlinked under the live mount. A pack's extent is listed in the daemon's memory, so the
        mount stops first; the pack is cut short at the extent, and the next mount drops the
        extents past its end (cache/packs.h), as a lost chunk file."""
        path, offset, _ = self.chunk_locations()[name]
        if path.parent.name != "packs":
            os.unlink(path)
            return
        assert all(o < offset for p, o, _ in self.pack_extents().values() if p == path
                   and o != offset), f"{name} is not the last extent of {path}"
        self.umount()
        os.truncate(path, offset)
        self.mount()
        assert name not in self.chunk_locations()

    def lose_all_chunks(self):
        """Takes every chunk off the local tier: chunk files are unlinked under the live mount;
        packs are unlinked between two mounts (their extents are in the daemon's memory)."""
        for p in self.chunk_files():
            os.unlink(p)
        packs = sorted((self.chunks_dir / "packs").glob("*.pack"))
        if packs:
            self.umount()
            for p in packs:
                os.unlink(p)
            self.mount()
        assert self.chunks_on_disk() == 0


def _comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return None


@pytest.fixture(scope="session")
def ckptfs_bin():
    if not CKPTFS_BIN.is_file():
        pytest.fail(f"no ckptfs binary at {CKPTFS_BIN} (build it or set CKPTFS_BIN)")
    if os.geteuid() != 0:
        pytest.fail("the mount tests must run as root")
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing")
    return CKPTFS_BIN


@pytest.fixture
def workdir(request):
    """A fresh directory for one test, removed afterwards (mounts must be gone by then)."""
    TEST_TMP.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="ckptfs-it-", dir=TEST_TMP))
    os.chmod(d, 0o755)  # non-root users must be able to reach the mountpoint
    yield d
    # Never recurse into something still mounted.
    with open("/proc/self/mountinfo", errors="surrogateescape") as f:
        busy = [l for l in f if str(d) in l]
    if not busy:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_mount(ckptfs_bin, workdir, request):
    """Factory: make_mount(options=None, cache=None, name="m", args=(), env=None) mounts
    ckptfs on a fresh mountpoint (with a fresh cache directory unless one is given) and returns a
    CkptMount; args are more `ckptfs mount` arguments, env more daemon environment. Everything
    it mounted is unmounted at teardown, even when the test failed."""
    mounts = []

    def factory(options=None, cache=None, name="m", log_level="info", mount=True, args=(),
                env=None):
        mnt = workdir / f"{name}.mnt"
        mnt.mkdir()
        os.chmod(mnt, 0o755)
        cache = Path(cache) if cache else workdir / f"{name}.cache"
        m = CkptMount(mnt, cache, options, log_level, args, env)
        mounts.append(m)
        if mount:
            m.mount()
        return m

    yield factory
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for m in reversed(mounts):
        if failed:
            tail = m.log().splitlines()[-40:]
            print(f"\n--- tail of {m.log_path} ---\n" + "\n".join(tail))
        m.force_umount()
    for m in mounts:
        assert not m.mounted(), f"could not unmount {m.mnt}"


@pytest.fixture
def mnt(make_mount):
    """A ckptfs mount with default options on a fresh mountpoint and cache directory."""
    return make_mount()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


class TimeLimitExceeded(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Interrupts a test body that runs past its limit (marker `timeout`, else
    CKPTFS_TEST_TIMEOUT), so that a hung mount fails that test instead of stalling the run. Only
    the body: fixture teardown (the unmounts) always runs to the end."""
    marker = item.get_closest_marker("timeout")
    limit = int(marker.args[0]) if marker else DEFAULT_TIMEOUT

    def on_alarm(signum, frame):
        raise TimeLimitExceeded(f"test ran past its {limit} s limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --- helpers shared by the test files ---

def expect_errno(err, fn, *args, **kw):
    """Calls fn and asserts that it raises OSError with errno err."""
    with pytest.raises(OSError) as info:
        fn(*args, **kw)
    assert info.value.errno == err, f"expected {errno.errorcode[err]}, got {info.value!r}"
    return info.value


def write_file(path, data, fsync=False):
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def spec_sha(spec):
    """The SHA-256 of the bytes the crash and power-loss workloads write for "SEED:SIZE":
    random.Random(SEED).randbytes, 1 MiB at a time, SIZE bytes in all."""
    dseed, size = map(int, spec.split(":"))
    r, h = random.Random(dseed), hashlib.sha256()
    for at in range(0, size, 1 << 20):
        h.update(r.randbytes(min(1 << 20, size - at)))
    return h.hexdigest()


def check_reads_are_stable(path):
    """A read-only file (a view): the same bytes on every read, whole or in pieces at odd
    offsets; st_size agrees."""
    whole = read_file(path)
    assert read_file(path) == whole
    assert os.stat(path).st_size == len(whole)
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in (0, 1, 63, 64, 4095, 4097, len(whole) // 3, len(whole) - 7):
            for size in (1, 100, 8191, 70000):
                assert os.pread(fd, size, off) == whole[off:off + size], (off, size)
    finally:
        os.close(fd)


MS_SYNC = 4  # msync(2), Linux


def libc_mappings():
    """libc with mmap, msync and munmap typed for raw shared mappings (Python's mmap keeps a
    duplicate of the descriptor: only these outlive the descriptor's close)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def write_and_keep_mapped(path, data):
    """Creates `path` holding `data`, maps it shared and writable, and closes the descriptor:
    returns (libc, address) of the mapping, which outlives the close (munmap it)."""
    import ctypes
    import mmap
    libc = libc_mappings()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        addr = libc.mmap(None, len(data), mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    finally:
        os.close(fd)
    return libc, addr


def wait_for(probe, done, timeout=20.0):
    """Calls probe() until done(result) holds or timeout seconds pass; returns the last result.
    For effects the kernel delivers asynchronously (RELEASE after close(2))."""
    deadline = time.monotonic() + timeout
    while True:
        r = probe()
        if done(r) or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


# --- the remote tier: a real S3 server (Ceph radosgw) for the session ---

RGW_SCRIPT = REPO_ROOT / "scripts" / "rgw.sh"


class Rgw:
    """A radosgw started by scripts/rgw.sh: its endpoint, the AWS_* variables a client needs,
    boto3 access and its logs."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.env = {}
        for line in (self.dir / "env").read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                k, v = line[len("export "):].split("=", 1)
                self.env[k] = v
        self.endpoint = self.env["AWS_ENDPOINT_URL"]
        self._client = None

    def client(self):
        """A boto3 S3 client (path-style; Debian's boto3 ignores AWS_ENDPOINT_URL)."""
        if self._client is None:
            import boto3
            from botocore.config import Config
            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint, region_name=self.env["AWS_REGION"],
                aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                config=Config(s3={"addressing_style": "path"}, connect_timeout=5,
                              read_timeout=60, retries={"max_attempts": 3}))
        return self._client

    def make_bucket(self, hint="t"):
        """A new, empty bucket with a unique name."""
        hint = "".join(c if c.isalnum() else "-" for c in hint.lower())[:30].strip("-") or "t"
        name = f"ckptfs-{hint}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket, prefix=""):
        """{key: size} of every object under prefix."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                            Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = o["Size"]
        return out

    def get(self, bucket, key):
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def access_log(self):
        """radosgw's log: one `beast:` line per request ("PUT /bucket/key HTTP/1.1" 200 ...)."""
        try:
            return (self.dir / "log" / "client.rgw.a.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def requests(self, method, bucket, prefix=""):
        """Successful requests of `method` to keys of bucket under prefix, from the access log:
        a list of keys, one per request."""
        start = f'"{method} /{bucket}/{prefix}'
        keys = []
        for line in self.access_log().splitlines():
            at = line.find(start)
            if at < 0 or " beast: " not in line:
                continue
            request, _, rest = line[at + 1:].partition('" ')
            if rest.split(" ", 1)[0].startswith("2"):
                keys.append(request.split(" ")[1][len(bucket) + 2:].split("?")[0])
        return keys


def _rgw_log_tails(directory, lines=20):
    out = []
    for p in sorted((Path(directory) / "log").glob("*")):
        tail = p.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {p} ---\n" + "\n".join(tail))
    return "\n".join(out)


@pytest.fixture(scope="session")
def rgw():
    """One radosgw for the whole session (scripts/rgw.sh), stopped at the end. A radosgw that
    does not start fails the tests that need it, with its logs: it is never a reason to skip."""
    given = os.environ.get("CKPTFS_TEST_RGW_DIR")
    if given:
        p = subprocess.run(["bash", str(RGW_SCRIPT), "status", given], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        if p.returncode != 0:
            pytest.fail(f"CKPTFS_TEST_RGW_DIR={given}: no radosgw answers there:\n{p.stdout}")
        yield Rgw(given)
        return
    TEST_TMP.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="ckptfs-rgw-", dir=TEST_TMP))
    env = {**os.environ, "RGW_TIMEOUT": os.environ.get("RGW_TIMEOUT", "90")}
    try:
        p = subprocess.run(["bash", str(RGW_SCRIPT), "start", str(d)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired as e:
        subprocess.run(["bash", str(RGW_SCRIPT), "stop", str(d)], timeout=120, check=False)
        pytest.fail(f"scripts/rgw.sh start {d} did not return in 600 s\n{e.stderr}")
    if p.returncode != 0:
        subprocess.run(["bash", str(RGW_SCRIPT), "stop", str(d)], timeout=120, check=False)
        pytest.fail(f"scripts/rgw.sh start {d} failed ({p.returncode}):\n{p.stderr}")
    try:
        server = Rgw(d)
        server.client().list_buckets()
    except Exception as e:  # noqa: BLE001 - any failure here means no usable S3 server
        tails = _rgw_log_tails(d)
        subprocess.run(["bash", str(RGW_SCRIPT), "stop", str(d)], timeout=120, check=False)
        pytest.fail(f"radosgw in {d} started but does not answer S3: {e!r}\n{p.stderr}\n{tails}")
    try:
        yield server
    finally:
        subprocess.run(["bash", str(RGW_SCRIPT), "stop", str(d)], timeout=120, check=False)
        shutil.rmtree(d, ignore_errors=True)
