# PyTorch checkpoints through the mount: torch.save / torch.load round trips, mmap reads of a
# checkpoint, a zip64 checkpoint over 4 GiB, and dedup of identical checkpoints.
# Runs in the pytest process, which must be Debian's /usr/bin/python3 (PyTorch 1.13).
import argparse
import gc
import hashlib
import io
import json
import mmap
import os
import zipfile

import pytest
import torch

from conftest import read_file, write_file

MiB = 1 << 20
GiB = 1 << 30


def make_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(256, 512, generator=g)
    shared = torch.arange(1000, dtype=torch.float32)
    base = torch.randn(64, 48, generator=g)
    return {
        "model": {
            "layer1.weight": weight,
            "layer1.bias": torch.randn(512, generator=g),
            "bf16": torch.randn(128, 33, generator=g).to(torch.bfloat16),
            "fp16": torch.randn(77, generator=g).to(torch.float16),
            "steps": torch.randint(-2**62, 2**62, (300,), dtype=torch.int64, generator=g),
            "mask": torch.rand(1000, generator=g) > 0.5,
            "scalar": torch.tensor(3.5),
            "int_scalar": torch.tensor(7, dtype=torch.int64),
            "empty": torch.empty(0, 5),
            "uint8": torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=g),
            "float64": torch.randn(10, generator=g, dtype=torch.float64),
            "complex": torch.randn(6, generator=g, dtype=torch.complex64),
        },
        # Views sharing one storage.
        "shared_full": shared,
        "shared_head": shared[:10],
        "shared_tail": shared[900:],
        "shared_view2d": shared.view(10, 100),
        # Non-contiguous views.
        "transposed": base.t(),
        "strided": base[::3, 1::2],
        "expanded_like": base[:, :1].expand(64, 5),
        "nested": {"list": [torch.ones(3), {"deep": torch.zeros(2, 2, dtype=torch.int32)}, 5],
                   "tuple": (1, "two", torch.full((4,), 9.0))},
        "args": argparse.Namespace(lr=1e-3, name="run-7", betas=(0.9, 0.999)),
        "epoch": 12,
        "name": "checkpoint ünïcode",
        "none": None,
        "bytes": b"\x00\x01raw",
    }


def assert_same(a, b, path="root"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype, path
        assert a.shape == b.shape, path
        assert a.stride() == b.stride(), path
        assert a.storage_offset() == b.storage_offset(), path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, argparse.Namespace):
        assert isinstance(b, argparse.Namespace) and vars(a) == vars(b), path
    else:
        assert a == b and type(a) is type(b), path


def storage_ptr(t):
    return t.storage().data_ptr()


def test_save_load_round_trip(mnt, workdir):
    state = make_state()
    p = mnt / "ckpt.pt"
    torch.save(state, p)
    # The bytes on the mount are the bytes torch.save writes on a local disk (same file name:
    # the zip names its records after it).
    (workdir / "ref").mkdir()
    torch.save(state, workdir / "ref" / "ckpt.pt")
    expect = read_file(workdir / "ref" / "ckpt.pt")
    assert os.stat(p).st_size == len(expect)
    assert read_file(p) == expect
    loaded = torch.load(p)
    assert_same(state, loaded)
    # Shared storage is still shared, at the same offsets.
    ptr = storage_ptr(loaded["shared_full"])
    for k in ("shared_head", "shared_tail", "shared_view2d"):
        assert storage_ptr(loaded[k]) == ptr, k
    assert loaded["shared_tail"].data_ptr() == loaded["shared_full"].data_ptr() + 900 * 4
    loaded["shared_full"][0] = -1.0
    assert loaded["shared_head"][0].item() == -1.0
    assert storage_ptr(loaded["transposed"]) == storage_ptr(loaded["strided"])
    assert not loaded["transposed"].is_contiguous()
    # Once more after a remount (nothing served from the daemon's or the kernel's caches).
    mnt.remount()
    assert_same(state, torch.load(p))


def test_load_with_file_object_and_map_location(mnt):
    state = make_state(1)
    p = mnt / "f.pt"
    with open(p, "wb") as f:
        torch.save(state, f)
    with open(p, "rb") as f:
        loaded = torch.load(f, map_location="cpu")
    assert_same(state, loaded)
    # Overwriting a checkpoint in place with a smaller one leaves exactly the new one.
    small = {"w": torch.ones(3)}
    torch.save(small, p)
    assert_same(small, torch.load(p))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None


def test_mmap_reads_of_checkpoint(mnt):
    state = make_state(2)
    p = mnt / "m.pt"
    torch.save(state, p)
    data = read_file(p)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:] == data
        # torch.load from the mapped bytes.
        assert_same(state, torch.load(io.BytesIO(m[:])))
        # Tensor bytes read in place equal the saved tensor's bytes.
        with zipfile.ZipFile(p) as z:
            for info in z.infolist():
                if "/data/" not in info.filename:
                    continue
                # Local header: 30 bytes + name + extra, then the record (stored uncompressed).
                hdr = m[info.header_offset:info.header_offset + 30]
                name_len = int.from_bytes(hdr[26:28], "little")
                extra_len = int.from_bytes(hdr[28:30], "little")
                start = info.header_offset + 30 + name_len + extra_len
                assert m[start:start + info.file_size] == z.read(info.filename)
    w = state["model"]["layer1.weight"]
    raw = w.numpy().tobytes()
    assert data.find(raw) >= 0


def pattern_block(block_index_start, nblocks, base):
    """nblocks MiB of pattern: `base` (1 MiB) with each MiB's first 8 bytes set to its index."""
    t = base.repeat(nblocks)
    idx = torch.arange(block_index_start, block_index_start + nblocks, dtype=torch.int64)
    t.view(nblocks, MiB)[:, :8] = idx.view(torch.uint8).view(nblocks, 8)
    return t


@pytest.mark.large
@pytest.mark.timeout(900)
def test_checkpoint_over_4gib_zip64(mnt):
    big_mib = 4 * 1024 + 64  # 4 GiB + 64 MiB
    group = 64  # MiB per fill / compare step
    base = torch.randint(0, 256, (MiB,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    big = torch.empty(big_mib * MiB, dtype=torch.uint8)
    for g in range(0, big_mib, group):
        big[g * MiB:(g + group) * MiB] = pattern_block(g, group, base)
    small = torch.randn(1000, generator=torch.Generator().manual_seed(6))
    p = mnt / "big.pt"
    torch.save({"big": big, "small": small, "step": 42}, p)
    del big
    gc.collect()
    size = os.stat(p).st_size
    assert size > big_mib * MiB
    with zipfile.ZipFile(p) as z:  # the central directory is zip64
        sizes = {i.filename.split("/", 1)[1]: i.file_size for i in z.infolist()}
    assert max(sizes.values()) == big_mib * MiB
    assert max(sizes.values()) > 0xFFFFFFFF
    loaded = torch.load(p)
    assert loaded["step"] == 42
    assert torch.equal(loaded["small"], small)
    lb = loaded["big"]
    assert lb.dtype == torch.uint8 and lb.shape == (big_mib * MiB,)
    for g in range(0, big_mib, group):
        assert torch.equal(lb[g * MiB:(g + group) * MiB], pattern_block(g, group, base)), g
    del loaded, lb
    gc.collect()
    s = mnt.stats()
    assert s["logical_bytes"] == size
    # ckptfs finds the tensors past 4 GiB too, at the bytes torch wrote.
    listed = {t["name"]: t for t in json.loads(os.getxattr(p, "user.ckptfs.tensors"))}
    assert listed["big"]["length"] == big_mib * MiB
    assert listed["small"]["offset"] > 0xFFFFFFFF
    with open(p, "rb") as f:
        f.seek(listed["small"]["offset"])
        assert f.read(listed["small"]["length"]) == small.numpy().tobytes()


def test_identical_files_are_stored_once(mnt):
    data = os.urandom(64 * MiB)
    write_file(mnt / "a", data)
    one = mnt.stats()
    disk_one = mnt.chunk_bytes_on_disk()
    assert one["stored_bytes"] == 64 * MiB
    assert disk_one == 64 * MiB
    write_file(mnt / "b", data)
    two = mnt.stats()
    assert two["files"] == 2
    assert two["logical_bytes"] == 128 * MiB
    assert two["stored_bytes"] == one["stored_bytes"]
    assert two["chunks"] == one["chunks"]
    assert two["dedup_ratio"] == pytest.approx(2.0)
    assert mnt.chunk_bytes_on_disk() == disk_one
    assert read_file(mnt / "b") == data
    # Deleting one copy keeps the shared chunks for the other.
    os.unlink(mnt / "a")
    assert mnt.stats()["stored_bytes"] == 64 * MiB
    mnt.remount()
    assert hashlib.sha256(read_file(mnt / "b")).digest() == hashlib.sha256(data).digest()


def test_same_state_dict_saved_twice_is_stored_once(mnt):
    g = torch.Generator().manual_seed(7)
    state = {f"layer{i}.weight": torch.randn(2048, 3072, generator=g) for i in range(4)}  # 96 MiB
    state["step"] = 1000
    torch.save(state, mnt / "step-1.pt")
    one = mnt.stats()
    torch.save(state, mnt / "copy-of-step-1.pt")
    two = mnt.stats()
    size = os.stat(mnt / "step-1.pt").st_size
    assert size > 96 * MiB
    assert one["stored_bytes"] <= size * 1.01
    # The second save differs only in the zip headers (they carry the archive's name). Chunks are
    # cut where each tensor starts and ends, so only the small chunks between tensors are new.
    print("stored after one save", one["stored_bytes"], "after two", two["stored_bytes"])
    assert two["stored_bytes"] - one["stored_bytes"] < 64 * 1024, (one, two)
    assert two["dedup_ratio"] > 1.99
    assert two["logical_bytes"] == size + os.stat(mnt / "copy-of-step-1.pt").st_size
    for name in ("step-1.pt", "copy-of-step-1.pt"):
        assert_same(state, torch.load(mnt / name))
