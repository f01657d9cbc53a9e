# `ckptfs convert SRC DST --view SPEC` and `ckptfs inspect ROOT --view SPEC` without a mount
# (tools/convert.cc): the same checkpoint saved in a plain directory and copied into a mount;
# every view kind converted from the plain directory, and from the mount's path, must give the
# files the mount's ROOT/.views/SPEC serves, bit for bit, names and all; refusals carry the
# reason the mount keeps in user.ckptfs.view_errors, and leave nothing behind.
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CKPTFS_BIN, REPO_ROOT, run, wait_for

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import deepspeed_fixture as df  # noqa: E402
import deepspeed_moe_fixture as dmf  # noqa: E402
import megatron_fixture as mf  # noqa: E402
import megatron_moe_fixture as mm  # noqa: E402

REAL_DCP = REPO_ROOT.parent / "shared" / "fixtures" / "dcp-torch2.11"
LLAMA = dict(era="mcore", swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
             bias=False)


def tree(d):
    """{relative path: bytes} of every file under d."""
    out = {}
    for dirpath, _, files in os.walk(d):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def convert(src, dst, spec):
    return run([CKPTFS_BIN, "convert", src, dst, "--view", spec], check=False, timeout=600)


def check_converted(plain, mounted, specs, out):
    """Each spec converted from the plain directory and from the mount's path equals the mount's
    view of it, and `inspect --view` off the mount lists the same files and sizes."""
    for spec in specs:
        want = tree(mounted / ".views" / spec)
        assert want, f"the mount's view {spec} is empty"
        for name, src in (("plain", plain), ("mount", mounted)):
            dst = out / f"{name}-{spec}"
            r = convert(src, dst, spec)
            assert r.returncode == 0, (spec, name, r.stderr)
            got = tree(dst)
            assert sorted(got) == sorted(want), (spec, name, sorted(got), sorted(want))
            for path, b in want.items():
                assert got[path] == b, f"{spec} from {name}: {path} differs from the mount's view"
            assert not [p for p in os.listdir(out) if ".convert-" in p], "a temporary was left"
        listing = run([CKPTFS_BIN, "inspect", plain, "--view", spec]).stdout
        for path, b in want.items():
            assert f"{len(b):12d}  {path}  <- " in listing, (path, listing)
        assert f"view {spec}: {len(want)} files, {sum(map(len, want.values()))} bytes" in listing


def twin(tmp_path, mnt, make):
    """The checkpoint make(dir) writes, in a plain directory and copied into the mount."""
    plain = tmp_path / "plain"
    make(plain)
    mounted = mnt / "ckpt"
    shutil.copytree(plain, mounted)
    return plain, mounted


def test_megatron_views(mnt, tmp_path):
    plain, mounted = twin(tmp_path, mnt, lambda d: mf.save_checkpoint(
        d, mf.ModelConfig(**LLAMA), 2, 2))
    check_converted(plain, mounted, ["tp1-pp1", "tp4-pp1", "tp2-pp2", "hf"], tmp_path)


def test_megatron_moe_views(mnt, tmp_path):
    plain, mounted = twin(tmp_path, mnt, lambda d: mm.save_checkpoint(d, mm.MoeConfig(), 2, 1, 2))
    check_converted(plain, mounted, ["tp1-pp1-ep1", "tp1-pp1-ep4", "tp2-pp1", "hf"], tmp_path)


def test_deepspeed_views(mnt, tmp_path):
    plain, mounted = twin(tmp_path, mnt, lambda d: df.generate(d, dp=4, tp=2))
    check_converted(plain, mounted, ["dp2", "dp8", "universal"], tmp_path)


def test_deepspeed_moe_views(mnt, tmp_path):
    plain, mounted = twin(tmp_path, mnt, lambda d: dmf.generate(d, dp=4, ep=2))
    check_converted(plain, mounted, ["dp2", "dp8"], tmp_path)


def test_torch_dist_views(mnt, tmp_path):
    fixture = REPO_ROOT / "tests" / "reshard" / "torch_dist_fixture.py"
    plain, mounted = twin(tmp_path, mnt, lambda d: subprocess.run(
        [sys.executable, str(fixture), str(d), "--tp", "2", "--pp", "1", "--config",
         json.dumps(LLAMA)], check=True, timeout=300))
    iteration = sorted(p for p in os.listdir(plain) if p.startswith("iter_"))[-1]
    check_converted(plain, mounted, ["hf"], tmp_path)
    check_converted(plain / iteration, mounted / iteration, ["consolidated"], tmp_path / "it")


def test_dcp_view_of_a_real_torch_2_11_checkpoint(mnt, tmp_path):
    if not REAL_DCP.is_dir():
        assert not os.environ.get("CI"), f"{REAL_DCP} is missing: CI lays shared/ beside the clone"
        pytest.skip(f"{REAL_DCP} is not beside this checkout")
    # Read where it lies (a plain directory, read-only to this test) and through the mount.
    shutil.copytree(REAL_DCP / "ckpt", mnt / "ckpt")
    check_converted(REAL_DCP / "ckpt", mnt / "ckpt", ["consolidated"], tmp_path)


def test_refusals_say_why_and_leave_nothing(mnt, tmp_path):
    plain, mounted = twin(tmp_path, mnt, lambda d: mf.save_checkpoint(
        d, mf.ModelConfig(era="mcore"), 2, 1))
    dst = tmp_path / "out"
    # num_attention_heads 8: the mount refuses tp3 with a reason; convert gives the same one.
    assert not os.path.exists(mounted / ".views" / "tp3-pp1")
    why = os.getxattr(mounted / ".views", "user.ckptfs.view_errors").decode()
    line = next(x for x in why.splitlines() if x.startswith("tp3-pp1: "))
    for src in (plain, mounted):
        r = convert(src, dst, "tp3-pp1")
        assert r.returncode == 1 and f"view {line}" in r.stderr, (r.stderr, line)
        r = run([CKPTFS_BIN, "inspect", plain, "--view", "tp3-pp1"], check=False)
        assert r.returncode == 1 and f"view {line}" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["plain"], os.listdir(tmp_path)
    # Not a checkpoint, no such spec, an existing destination (left as it was).
    r = convert(tmp_path, dst, "tp1-pp1")
    assert r.returncode == 1 and "holds no checkpoint" in r.stderr, r.stderr
    r = convert(plain, dst, "tq1")
    assert r.returncode == 1 and "view tq1" in r.stderr, r.stderr
    dst.mkdir()
    (dst / "keep").write_bytes(b"mine")
    r = convert(plain, dst, "tp1-pp1")
    assert r.returncode == 1 and "exists" in r.stderr, r.stderr
    assert tree(dst) == {"keep": b"mine"}


def test_a_failed_write_leaves_nothing(mnt, tmp_path):
    # A destination on a full filesystem: the conversion fails with the reason, and neither DST
    # nor its temporary is left there.
    plain = tmp_path / "plain"
    mf.save_checkpoint(plain, mf.ModelConfig(**LLAMA), 2, 1)
    small = tmp_path / "small"
    small.mkdir()
    run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small])
    try:
        r = convert(plain, small / "out", "tp1-pp1")
        assert r.returncode == 1 and "No space left on device" in r.stderr, r.stderr
        assert os.listdir(small) == []
    finally:
        run(["umount", small])


def test_from_an_unmounted_cache_directory(mnt, tmp_path):
    # Checkpoints saved into a mount whose daemon is then killed (kill -9: the last files written
    # may still be staged, their bytes in staging files, not yet cut into chunks) are converted
    # from the cache directory alone: its metadata read-only, chunks from the local tier. The
    # result is the view the mount served, bit for bit; the next mount serves it again.
    mf.save_checkpoint(mnt / "gpt", mf.ModelConfig(**LLAMA), 2, 2)
    df.generate(mnt / "ds", dp=4)
    specs = [("gpt", "tp1-pp1"), ("gpt", "hf"), ("ds", "dp2"), ("ds", "universal")]
    want = {(root, spec): tree(mnt / root / ".views" / spec) for root, spec in specs}
    # A large last file, to be likely still staged at the kill.
    big = mnt / "gpt" / "iter_0000100" / "mp_rank_00_000" / "model_optim_rng.pt"
    data = big.read_bytes()
    os.unlink(big)
    with open(big, "wb") as f:
        f.write(data)
    mnt.kill_daemon()
    mnt.umount()
    for root, spec in specs:
        dst = tmp_path / f"{root}-{spec}"
        r = run([CKPTFS_BIN, "convert", f"/{root}", dst, "--view", spec, "--cache-dir",
                 mnt.cache], check=False, timeout=600)
        assert r.returncode == 0, (root, spec, r.stderr)
        got = tree(dst)
        assert sorted(got) == sorted(want[(root, spec)]), (root, spec)
        for path, b in want[(root, spec)].items():
            assert got[path] == b, f"{root}/{spec}: {path} differs from the mount's view"
    listing = run([CKPTFS_BIN, "inspect", "gpt", "--view", "tp1-pp1", "--cache-dir",
                   mnt.cache]).stdout
    assert "iter_0000100/mp_rank_00/model_optim_rng.pt  <- " in listing, listing
    r = run([CKPTFS_BIN, "convert", "/nothing", tmp_path / "x", "--view", "tp1-pp1",
             "--cache-dir", mnt.cache], check=False)
    assert r.returncode == 1 and "/nothing in " in r.stderr, r.stderr
    mnt.mount()
    for (root, spec), files in want.items():
        assert tree(mnt / root / ".views" / spec) == files


def test_evicted_chunks_come_from_the_backend(make_mount, workdir, tmp_path):
    # A cache directory whose chunks are in a remote tier and no longer on the local one (every
    # chunk file removed after the upload, as eviction removes them): convert --cache-dir reads
    # them from --backend, verified against their names. Without the backend, or with an object
    # damaged in it, the conversion fails with the reason and leaves nothing.
    backend = workdir / "backend"
    backend.mkdir()
    m = make_mount(args=["--backend", f"file://{backend}"])
    mf.save_checkpoint(m / "gpt", mf.ModelConfig(**LLAMA), 2, 2)
    files = [p for p in (m / "gpt").rglob("*") if p.is_file()]
    for p in files:
        got = wait_for(lambda: os.getxattr(p, "user.ckptfs.state").decode(),
                       lambda s: s == "remote", 120)
        assert got == "remote", (p, got)
    want = tree(m / "gpt" / ".views" / "tp1-pp1")
    m.umount()
    evicted = [p for p in m.chunks_dir.rglob("*") if p.is_file()]
    assert evicted, "no chunk files to evict"
    for p in evicted:
        p.unlink()

    def convert_from_cache(dst, *more):
        return run([CKPTFS_BIN, "convert", "/gpt", dst, "--view", "tp1-pp1", "--cache-dir",
                    m.cache, *more], check=False, timeout=600)

    r = convert_from_cache(tmp_path / "none")
    assert r.returncode == 1 and "--backend" in r.stderr, r.stderr
    assert not (tmp_path / "none").exists()
    assert not [p for p in os.listdir(tmp_path) if ".convert-" in p], "a temporary was left"

    r = convert_from_cache(tmp_path / "ok", "--backend", f"file://{backend}")
    assert r.returncode == 0, r.stderr
    got = tree(tmp_path / "ok")
    assert sorted(got) == sorted(want)
    for path, b in want.items():
        assert got[path] == b, f"{path} differs from the mount's view"
    listing = run([CKPTFS_BIN, "inspect", "/gpt", "--view", "tp1-pp1", "--cache-dir", m.cache,
                   "--backend", f"file://{backend}"]).stdout
    assert "iter_0000100/mp_rank_00/model_optim_rng.pt  <- " in listing, listing
    assert not [p for p in m.chunks_dir.rglob("*") if p.is_file()], "fetched chunks were kept"

    # A flipped byte in every chunk object: caught by the names, whichever the view reads first.
    for obj in (backend / "chunks.d").rglob("*"):
        if obj.is_file() and obj.stat().st_size > 100:
            with open(obj, "r+b") as f:
                f.seek(100)
                b = f.read(1)
                f.seek(100)
                f.write(bytes([b[0] ^ 0xFF]))
    r = convert_from_cache(tmp_path / "bad", "--backend", f"file://{backend}")
    assert r.returncode == 1 and "does not hash to its name" in r.stderr, r.stderr
    assert not (tmp_path / "bad").exists()
