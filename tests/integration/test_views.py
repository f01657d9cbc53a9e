# Resharded views of Megatron-LM checkpoints (docs/views.md) through a real mount: a source
# checkpoint written into the mount by tests/reshard/megatron_fixture.py (Megatron's own layout,
# every structural fact traced there to Megatron-LM's source), its ROOT/.views/tpT-ppP files loaded
# with torch.load and compared bit for bit with the reference that megatron_fixture computes in
# Python from the source files (independent of the C++ view code). Runs in /usr/bin/python3.
import argparse
import errno
import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import (CKPTFS_BIN, REPO_ROOT, check_reads_are_stable, expect_errno, read_file,
                      run, wait_for)

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402

ITER = "iter_0000100"

# Every case marks the rules (distinct Adam steps per source rank, replicated tensors that differ
# per TP rank, a head copy that differs from the embeddings), so that taking a value from the
# wrong source rank shows. vocab 1000, make_vocab_size_divisible_by 96: padded(1) = 1056,
# padded(2) = padded(4) = 1152, so TP 1 -> 4 extends the table and 4 -> 1 cuts it.
MARKS = dict(distinct_steps=True, skew_replicas=True, skew_head=True)
GQA_SWIGLU = dict(num_query_groups=4, swiglu=True, normalization="RMSNorm",
                  position_embedding_type="rope", bias=False)

CASES = {
    # TP only
    "mcore-tied-tp4-to-tp2": (dict(era="mcore"), (4, 1), (2, 1)),
    "mcore-tied-tp4-to-tp1": (dict(era="mcore"), (4, 1), (1, 1)),
    "legacy-untied-tp1-to-tp4": (dict(era="legacy", untie=True), (1, 1), (4, 1)),
    "legacy-tied-tp2-to-tp4": (dict(era="legacy", cuda_locations=True), (2, 1), (4, 1)),
    # PP only (layers renumbered; the tied head copy dropped / made from the embeddings)
    "mcore-tied-pp2-to-pp1": (dict(era="mcore"), (1, 2), (1, 1)),
    "legacy-tied-pp1-to-pp2": (dict(era="legacy"), (1, 1), (1, 2)),
    "mcore-tied-pp1-to-pp2": (dict(era="mcore", cuda_locations=True), (2, 1), (2, 2)),
    "legacy-untied-pp2-to-pp4": (dict(era="legacy", untie=True), (1, 2), (1, 4)),
    # both at once
    "mcore-untied-tp2pp2-to-tp4pp1": (dict(era="mcore", untie=True), (2, 2), (4, 1)),
    "legacy-tied-tp1pp1-to-tp2pp2": (dict(era="legacy"), (1, 1), (2, 2)),
    "mcore-tied-tp2pp2-to-tp1pp4": (dict(era="mcore"), (2, 2), (1, 4)),
    # GQA + SwiGLU (RMSNorm, rotary, no biases)
    "mcore-gqa-swiglu-tp2-to-tp4": (dict(era="mcore", **GQA_SWIGLU), (2, 1), (4, 1)),
    "mcore-gqa-swiglu-tp4pp1-to-tp1pp2": (dict(era="mcore", untie=True, **GQA_SWIGLU),
                                          (4, 1), (1, 2)),
    "legacy-gqa-swiglu-tp4-to-tp2pp2": (dict(era="legacy", num_query_groups=4, swiglu=True),
                                        (4, 1), (2, 2)),
    # megatron.core: TP a multiple of the 4 query groups (a rank holds part of a group's rows)
    "mcore-gqa-tp2-to-tp8": (dict(era="mcore", **GQA_SWIGLU), (2, 1), (8, 1)),
    "mcore-gqa-tp8pp2-to-tp2pp1": (dict(era="mcore", untie=True, **GQA_SWIGLU), (8, 2), (2, 1)),
    # args.vocab_size None (Megatron's default): the source's padded size is the vocabulary
    "legacy-no-vocab-size-tp1-to-tp4": (dict(era="legacy", args_vocab_size=False), (1, 1), (4, 1)),
    # Transformer Engine's extra state: empty uint8 tensors
    "mcore-te-extra-state-tp2-to-tp1": (dict(era="mcore", extra_state="empty"), (2, 1), (1, 1)),
    # Transformer Engine's FusedAdam: 'step' in the param groups, no per-parameter step
    "mcore-fused-adam-tp2pp2-to-tp4pp1": (dict(era="mcore", fused_adam=True), (2, 2), (4, 1)),
    # megatron.core since 2026: param groups sorted, the weight-decay group first on every stage
    "mcore-sorted-groups-tp1pp2-to-tp2pp4": (dict(era="mcore", sorted_groups=True), (1, 2), (2, 4)),
    # Qwen2's QKV biases (args.add_qkv_bias) and Qwen3's per-head q/k norms
    "mcore-qkv-bias-tp2-to-tp4pp2": (dict(era="mcore", qkv_bias=True, **GQA_SWIGLU),
                                     (2, 1), (4, 2)),
    "mcore-qk-norm-tp4pp2-to-tp2": (dict(era="mcore", qk_layernorm=True, **GQA_SWIGLU),
                                    (4, 2), (2, 1)),
}


def spec(t, p):
    return f"tp{t}-pp{p}"


def make_source(root, cfg_kw, shape, marks=True, iteration=100):
    cfg = mf.ModelConfig(**cfg_kw, **(MARKS if marks else {}))
    mf.save_checkpoint(root, cfg, *shape, iteration=iteration)
    return cfg


def count_tensors(obj, seen=None):
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        seen.add(id(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            count_tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            count_tensors(v, seen)
    elif isinstance(obj, argparse.Namespace):
        count_tensors(vars(obj), seen)
    return len(seen)


def check_zip(path, source_file):
    """docs 'Synthesized files': a torch zip whose CRCs check, every record stored and its data
    aligned to 64 bytes, the source's record prefix, a protocol-2 data.pkl, one storage per tensor
    named 0, 1, ... and the source's other records byte for byte."""
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None, f"{path}: bad CRC"
        infos = z.infolist()
        with open(path, "rb") as f:
            for i in infos:
                assert i.compress_type == zipfile.ZIP_STORED, i.filename
                f.seek(i.header_offset)
                h = f.read(30)
                assert h[:4] == b"PK\x03\x04", i.filename
                name_len, extra_len = struct.unpack("<HH", h[26:30])
                assert (i.header_offset + 30 + name_len + extra_len) % 64 == 0, i.filename
        names = [i.filename for i in infos]
        assert all(n.startswith("model_optim_rng/") for n in names), names
        assert z.read("model_optim_rng/data.pkl")[:2] == b"\x80\x02"
        storages = sorted(int(n.rsplit("/", 1)[1]) for n in names
                          if n.startswith("model_optim_rng/data/"))
        n = count_tensors(torch.load(path, map_location="cpu"))
        assert storages == list(range(n)), f"{path}: {len(storages)} storages for {n} tensors"
        others = {x for x in names if x != "model_optim_rng/data.pkl"
                  and not x.startswith("model_optim_rng/data/")}
        with zipfile.ZipFile(source_file) as s:
            src_others = {x for x in s.namelist() if x != "model_optim_rng/data.pkl"
                          and not x.startswith("model_optim_rng/data/")}
            assert others == src_others
            for x in others:
                assert z.read(x) == s.read(x), x


def check_view(root, source_shape, target, dirname=ITER):
    """Every file of ROOT/.views/SPEC/dirname against the reference."""
    T, P = target
    view = root / ".views" / spec(T, P)
    ref = mf.reference_shard(root, T, P, dirname)
    assert read_file(view / mf.TRACKER) == read_file(root / mf.TRACKER)
    mf.compare_view(view, ref, dirname)
    src_files, _, _ = mf.rank_files(root, dirname)
    Ts, Ps = source_shape
    for (t, p) in ref.files:
        path = view / dirname / mf.rank_name(t, p, P) / mf.FILE
        check_zip(path, src_files[(t * Ts // T, p * Ps // P)])
        check_reads_are_stable(path)
    return ref


@pytest.mark.parametrize("case", list(CASES))
def test_view_equals_reference(mnt, case):
    cfg_kw, source, target = CASES[case]
    root = mnt / "ckpt"
    make_source(root, cfg_kw, source)
    check_view(root, source, target)
    # The source's own shape is a view too, equal to the reference (which equals the source,
    # except what the rules take from TP rank 0: replicated tensors).
    check_view(root, source, source)


def test_round_trip_tp4_tp2_tp4(mnt):
    # A tp2 view copied out as a real checkpoint and viewed again at tp4 is the original tp4
    # checkpoint: GQA's per-group QKV rows (megatron/core/transformer/attention.py) and SwiGLU's
    # [gate_t; up_t] shards (transformer/mlp.py) survive being cut differently and rejoined.
    # padded(4) = padded(2) = 1152: the whole vocabulary table survives the round trip.
    a, b = mnt / "a", mnt / "b"
    make_source(a, dict(era="mcore", untie=True, **GQA_SWIGLU), (4, 1), marks=False)
    shutil.copytree(a / ".views" / "tp2-pp1", b)
    assert sorted(os.listdir(b / ITER)) == ["mp_rank_00", "mp_rank_01"]
    check_view(b, (2, 1), (4, 1))
    orig, _, _ = mf.rank_files(a)
    for t in range(4):
        got = torch.load(b / ".views" / "tp4-pp1" / ITER / f"mp_rank_{t:02d}" / mf.FILE,
                         map_location="cpu")
        want = torch.load(orig[(t, 0)], map_location="cpu")
        for k in ("model", "optimizer", "args", "opt_param_scheduler", "iteration",
                  "checkpoint_version", "num_floating_point_operations_so_far"):
            mf.assert_same(got[k], want[k], f"mp_rank_{t:02d}.{k}")
        # rng_state comes from the primary rank: tp2 rank t//2, itself from tp4 rank 2*(t//2).
        primary = torch.load(orig[(2 * (t // 2), 0)], map_location="cpu")
        mf.assert_same(got["rng_state"], primary["rng_state"], "rng_state")


def test_views_directory_resolves_on_lookup_and_is_read_only(mnt):
    # Rank directory names: mp_rank_TT, or mp_rank_TT_PPP when PP > 1 (Megatron-LM
    # megatron/training/checkpointing.py get_checkpoint_name).
    root = mnt / "ckpt"
    make_source(root, dict(era="mcore", num_query_groups=4), (2, 2))
    # Hidden from listings (as ZFS hides .zfs), there on lookup.
    assert ".views" not in os.listdir(root)
    ls = subprocess.run(["ls", "-a", str(root)], stdout=subprocess.PIPE, text=True, check=True)
    assert ".views" not in ls.stdout.split()
    assert os.path.isdir(root / ".views")
    # heads 8, query groups 4, ffn 128, 4 layers, megatron.core: T in {1, 2, 4, 8} (8 a multiple
    # of the groups), P in {1, 2, 4}. LayerNorm and learned positions: no hf view.
    want = {spec(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4)}
    specs = set(os.listdir(root / ".views"))
    assert {"tp2-pp2", "tp1-pp1"} <= specs
    assert specs == want, specs ^ want
    view = root / ".views" / "tp4-pp1"
    assert sorted(os.listdir(view)) == [ITER, mf.TRACKER]
    assert sorted(os.listdir(view / ITER)) == [f"mp_rank_{t:02d}" for t in range(4)]
    assert sorted(os.listdir(root / ".views" / "tp1-pp4" / ITER)) == \
        [f"mp_rank_00_{p:03d}" for p in range(4)]
    f = view / ITER / "mp_rank_03" / mf.FILE
    for d in (root / ".views", view, view / ITER, view / ITER / "mp_rank_03"):
        assert os.stat(d).st_mode & 0o7777 == 0o555, d
    assert os.stat(f).st_mode & 0o7777 == 0o444
    # Every byte of a view file counts in st_blocks: sparse-aware tools must read it all.
    assert os.stat(f).st_blocks * 512 >= os.stat(f).st_size > 0
    fd = os.open(f, os.O_RDONLY)  # nor do SEEK_DATA and SEEK_HOLE find a hole in it
    try:
        size = os.fstat(fd).st_size
        assert os.lseek(fd, 1, os.SEEK_DATA) == 1 and os.lseek(fd, 1, os.SEEK_HOLE) == size
        with pytest.raises(OSError) as e:
            os.lseek(fd, size, os.SEEK_DATA)
        assert e.value.errno == errno.ENXIO
    finally:
        os.close(fd)
    assert os.stat(view / mf.TRACKER).st_mode & 0o7777 == 0o444
    with pytest.raises(OSError) as e:
        os.open(f, os.O_WRONLY)
    assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM), e.value
    with pytest.raises(OSError):
        os.mkdir(view / "x")
    with pytest.raises(OSError):
        os.unlink(f)
    # A directory that holds no checkpoint has no views.
    plain = mnt / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_bytes(b"hello")
    assert ".views" not in os.listdir(plain)


def test_tree_walkers_do_not_read_views(mnt, tmp_path):
    """cp -r, du and find walk what readdir returns: none of them meets .views by default."""
    root = mnt / "ckpt"
    make_source(root, dict(era="mcore", num_query_groups=4), (2, 2))
    files = {os.path.relpath(os.path.join(r, f), root): os.path.getsize(os.path.join(r, f))
             for r, _, fs in os.walk(root) for f in fs}
    assert files and not any(".views" in p for p in files)
    run(["cp", "-r", str(root), str(tmp_path / "copy")])
    copied = {os.path.relpath(os.path.join(r, f), tmp_path / "copy")
              for r, _, fs in os.walk(tmp_path / "copy") for f in fs}
    assert copied == set(files)
    du = run(["du", "-s", "--apparent-size", "--block-size=1", str(root)])
    dirs = sum(os.path.getsize(os.path.join(r, d)) for r, ds, _ in os.walk(root) for d in ds)
    assert int(du.stdout.split()[0]) == sum(files.values()) + dirs + os.path.getsize(root)
    found = run(["find", str(root)]).stdout
    assert ".views" not in found
    # Listing inside .views still shows the specs.
    assert "tp1-pp1" in os.listdir(root / ".views")


def test_views_listed_with_views_visible(make_mount):
    m = make_mount(options="views=visible")
    root = m / "ckpt"
    make_source(root, dict(era="mcore", num_query_groups=4), (2, 2))
    assert ".views" in os.listdir(root)
    ls = subprocess.run(["ls", "-a", str(root)], stdout=subprocess.PIPE, text=True, check=True)
    assert ".views" in ls.stdout.split()
    plain = m / "plain"
    plain.mkdir()
    assert ".views" not in os.listdir(plain)


def test_every_complete_iteration_is_viewed(mnt):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="legacy", **MARKS)
    full = mf.save_checkpoint(root, cfg, 2, 1, iteration=100)
    mf.save_checkpoint(root, cfg, 2, 1, iteration=200, full=full)
    assert read_file(root / mf.TRACKER) == b"200"
    view = root / ".views" / "tp1-pp1"
    assert sorted(os.listdir(view)) == ["iter_0000100", "iter_0000200", mf.TRACKER]
    check_view(root, (2, 1), (1, 1), "iter_0000100")
    check_view(root, (2, 1), (1, 1), "iter_0000200")
    # The bytes are a function of the source and the spec alone: the same after a remount.
    files = [view / d / "mp_rank_00" / mf.FILE for d in ("iter_0000100", "iter_0000200")]
    before = [read_file(f) for f in files]
    mnt.remount()
    assert [read_file(f) for f in files] == before


def test_views_follow_a_new_save(mnt):
    # A view planned before a save must not keep serving what it planned: a new iteration moves
    # the view's tracker, and an iteration saved again (other values) is planned anew.
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", **MARKS)
    mf.save_checkpoint(root, cfg, 2, 1, iteration=100)
    view = root / ".views" / "tp1-pp1"
    assert read_file(view / mf.TRACKER) == b"100"
    old = read_file(view / ITER / "mp_rank_00" / mf.FILE)
    mf.save_checkpoint(root, cfg, 2, 1, iteration=200)
    # The kernel keeps view entries for a second.
    got = wait_for(lambda: read_file(view / mf.TRACKER), lambda b: b == b"200", timeout=10)
    assert got == b"200"
    cfg2 = mf.ModelConfig(era="mcore", seed=99, **MARKS)
    mf.save_checkpoint(root, cfg2, 2, 1, iteration=100)
    time.sleep(1.5)
    new = read_file(view / ITER / "mp_rank_00" / mf.FILE)
    assert new != old
    check_view(root, (2, 1), (1, 1), ITER)


def test_invalid_spec_fails_with_einval_and_a_reason(mnt):
    root = mnt / "ckpt"
    make_source(root, dict(era="mcore"), (2, 1))
    # num_attention_heads 8, num_layers 4
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp3-pp1")
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp2-pp3")
    assert "tp3-pp1" not in os.listdir(root / ".views")
    log = mnt.log()
    assert "tp3-pp1" in log and "does not divide" in log, log[-2000:]
    bad = run([CKPTFS_BIN, "inspect", root, "--view", "tp3-pp1"], check=False)
    assert bad.returncode == 1, bad
    assert "does not divide" in bad.stdout + bad.stderr
    good = run([CKPTFS_BIN, "inspect", root, "--view", "tp4-pp2"], check=False)
    assert good.returncode == 0, good
    # The valid views still work after the failed lookups.
    check_view(root, (2, 1), (4, 2))


def test_tp_a_multiple_of_the_query_groups_is_for_megatron_core_only(mnt):
    legacy, core = mnt / "legacy", mnt / "core"
    make_source(legacy, dict(era="legacy", num_query_groups=4), (2, 1))
    make_source(core, dict(era="mcore", num_query_groups=4), (2, 1))
    expect_errno(errno.EINVAL, os.stat, legacy / ".views" / "tp8-pp1")
    assert "tp8-pp1" not in os.listdir(legacy / ".views")
    errors = os.getxattr(legacy / ".views", "user.ckptfs.view_errors").decode()
    assert "legacy" in errors and "num_query_groups 4" in errors, errors
    assert "tp8-pp1" in os.listdir(core / ".views")
    check_view(core, (2, 1), (8, 1))
    # Megatron since 2026 records neither use_legacy_models nor use_mcore_models: the names tell.
    bare = mnt / "bare"
    make_source(bare, dict(era="mcore", num_query_groups=4,
                           extra_args=dict(use_legacy_models=None, use_mcore_models=None)), (2, 1))
    assert "tp8-pp1" in os.listdir(bare / ".views")
    check_view(bare, (2, 1), (8, 1))


def test_inspect_view_off_a_mount_plans_it_there(tmp_path):
    # Off a mount the view is planned by the command itself (tools/convert.cc; test_convert.py
    # checks its listings against the mount's): the files, their sizes and their sources.
    root = tmp_path / "ckpt"
    make_source(root, dict(era="mcore"), (2, 1))
    good = run([CKPTFS_BIN, "inspect", root, "--view", "tp1-pp1"], check=False)
    assert good.returncode == 0, good
    rank = f"{ITER}/mp_rank_00/{mf.FILE}"
    assert f"  {rank}  <- {ITER}/mp_rank_00/{mf.FILE},{ITER}/mp_rank_01/{mf.FILE}\n" in \
        good.stdout, good.stdout
    assert "view tp1-pp1: 2 files" in good.stdout and "planned without a mount" in good.stdout


def test_unknown_parameter_fails_the_view_naming_it(mnt):
    # decoder.layers.0.mystery.weight [h, h]: a parameter (with its optimizer state, as a real
    # extra module would have) that no rule of docs/views.md covers.
    root = mnt / "ckpt"
    make_source(root, dict(era="mcore", mystery=True), (2, 1))
    name = "model.decoder.layers.0.mystery.weight"
    with pytest.raises(mf.ViewError, match=name.replace(".", r"\.")):
        mf.reference_shard(root, 1, 1)  # the reference agrees: no rule covers it

    def read_view():
        view = root / ".views" / "tp1-pp1"
        os.stat(view)
        for d in os.listdir(view / ITER):
            read_file(view / ITER / d / mf.FILE)

    expect_errno(errno.EINVAL, read_view)
    log = mnt.log()
    assert name in log, log[-2000:]
    bad = run([CKPTFS_BIN, "inspect", root, "--view", "tp1-pp1"], check=False)
    assert bad.returncode == 1 and name in bad.stdout + bad.stderr, bad


class _DaemonWrites:
    """strace of the daemon's writev(2) calls while the `with` block runs: what it wrote to
    /dev/fuse, and the kernel's answer to each. Observes what the daemon sent and the kernel
    accepted, where mincore(2) would observe what the kernel still holds (reclaim may take a page
    at any time)."""

    FUSE_NOTIFY_STORE = 4  # fuse_notify_code in linux/fuse.h

    def __init__(self, pid, out):
        self.pid, self.out = pid, out

    def __enter__(self):
        if not shutil.which("strace"):
            pytest.fail("strace is missing (scripts/install-deps.sh installs it)")
        # -xx: every byte in hex; -s 40: the 16-byte header, the 24-byte store header and the
        # first 40 bytes of the data.
        self.proc = subprocess.Popen(
            ["strace", "-f", "-qq", "-xx", "-s", "40", "-e", "trace=writev", "-e", "signal=none",
             "-o", str(self.out), "-p", str(self.pid)], stderr=subprocess.PIPE, text=True)

        def tracers():
            out = []
            for t in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    status = Path(f"/proc/{self.pid}/task/{t}/status").read_text()
                except FileNotFoundError:
                    continue  # a thread that ended meanwhile
                out.append(int(re.search(r"^TracerPid:\s+(\d+)", status, re.M).group(1)))
            return out

        def attached(ts):
            return bool(ts) and all(t == self.proc.pid for t in ts)

        # Every thread of the daemon traced (threads started later are followed by -f).
        if not attached(wait_for(tracers, lambda ts: attached(ts) or self.proc.poll() is not None,
                                 timeout=60)):
            self.proc.kill()
            pytest.fail(f"strace did not attach to the daemon: {self.proc.communicate()[1]}")
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)  # detaches, then ends by the same signal
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode in (0, -signal.SIGINT), err

    def page_cache_stores(self):
        """[(inode, offset, size, first bytes, accepted)] of every FUSE_NOTIFY_STORE written,
        accepted when the kernel took the whole message."""
        calls, pending = [], {}
        for line in self.out.read_text().splitlines():
            tid, _, call = line.partition(" ")
            call = call.strip()
            if call.endswith("<unfinished ...>"):
                pending[tid] = call[:-len("<unfinished ...>")]
                continue
            if call.startswith("<... writev resumed>"):
                call = pending.pop(tid) + call[len("<... writev resumed>"):]
            if call.startswith("writev("):
                calls.append(call)
        stores = []
        for call in calls:
            parts = [bytes.fromhex(b.replace("\\x", ""))
                     for b in re.findall(r'iov_base="((?:\\x[0-9a-f]{2})*)"', call)]
            if len(parts) != 3 or len(parts[0]) != 16 or len(parts[1]) != 24:
                continue
            length, code, unique = struct.unpack("<IiQ", parts[0])
            if code != self.FUSE_NOTIFY_STORE or unique != 0:
                continue
            ino, off, size, _ = struct.unpack("<QQII", parts[1])
            result = re.search(r"\)\s*=\s*(-?\d+)", call[call.rindex("]"):])
            accepted = result is not None and int(result.group(1)) == length
            stores.append((ino, off, size, parts[2], accepted))
        return stores


def test_first_open_puts_the_whole_file_in_the_page_cache(mnt, workdir):
    # A view file's first open reads its records to checksum them (the whole source records
    # within, whose CRCs are known, are read for this too) and hands every byte of the file to
    # the kernel's page cache (fuse_lowlevel_notify_store) in whole pages: the kernel marks a
    # page valid only when one store covers all of it, so the pages around record boundaries go
    # once the zip headers hold their CRCs. The reads that follow need not reach the daemon.
    # What ckptfs guarantees is the hand-over: the kernel may reclaim the pages at any time
    # after, and the reads then come to the daemon, which must serve the same bytes. What the
    # fill saves is measured by bench/bench_reshard.py (--only moe) and
    # bench/bench_ds_universal.py.
    root = mnt / "ckpt"
    make_source(root, dict(era="mcore", hidden_size=256, ffn_hidden_size=512, num_layers=2),
                (2, 1))
    page = mmap.PAGESIZE

    def check_stored(path, stores):
        """Every page of `path` was stored by its first open (or the getxattr that opened it),
        each store whole pages (or up to the end of the file) with the view's bytes, the kernel
        accepted each, and no page twice."""
        ino = os.stat(path).st_ino
        mine = [s for s in stores if s[0] == ino]
        assert mine, f"{path}: its first open stored nothing in the page cache"
        refused = [s[1:3] for s in mine if not s[4]]
        assert not refused, f"{path}: the kernel refused the stores at (offset, size) {refused}"
        data = read_file(path)
        at = 0
        for _, off, size, head, _ in sorted(mine, key=lambda s: s[1]):
            assert off % page == 0, f"{path}: a store starts inside a page at {off}"
            assert size % page == 0 or off + size == len(data), (path, off, size)
            assert off == at, f"{path}: bytes [{at}, {off}) not stored, or stored twice"
            assert data[off:off + len(head)] == head, (path, off)
            at = off + size
        assert at == len(data), f"{path}: stored up to {at} of {len(data)}"
        # The gathered records span many pages: what is checked is not the trivial case.
        assert len(data) > 64 * page

    path = root / ".views" / "tp1-pp1" / ITER / "mp_rank_00" / mf.FILE
    # The tensor index (what the GPU loader asks first) opens a view file too: the same fill.
    other = root / ".views" / "tp4-pp1" / ITER / "mp_rank_00" / mf.FILE
    for f in (path, other):
        os.stat(f)  # looked up, not opened
    with _DaemonWrites(mnt.daemon_pid(), workdir / "first.strace") as first:
        os.close(os.open(path, os.O_RDONLY))
        assert os.getxattr(other, "user.ckptfs.tensors")
    stores = first.page_cache_stores()
    check_stored(path, stores)
    check_stored(other, stores)
    # The gather is the first open's: later opens read no source and store nothing.
    with _DaemonWrites(mnt.daemon_pid(), workdir / "again.strace") as again:
        os.close(os.open(path, os.O_RDONLY))
        os.close(os.open(other, os.O_RDONLY))
    assert again.page_cache_stores() == []
    # The kernel lets the pages go (as reclaim would): the reads come to the daemon, which
    # serves the view's bytes without the cache's help.
    for f in (path, other):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    check_view(root, (2, 1), (1, 1), ITER)
    check_view(root, (2, 1), (4, 1), ITER)
    check_reads_are_stable(path)
