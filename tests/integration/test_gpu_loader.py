# gpu/ckptfs_gpu.py against a real mount: tensors loaded through the mount's tensor index and
# libckptfs_gpu.so are bitwise what torch.load returns. Runs in /usr/bin/python3 (Debian's
# PyTorch 1.13); the library comes from $CKPTFS_GPU_LIB, else from CKPTFS_BIN's build directory.
import errno
import os
import sys

import pytest
import torch

from conftest import CKPTFS_BIN, REPO_ROOT, write_file
from test_formats import flatten, save_safetensors, tensors_attr
from test_torch import make_state

os.environ.setdefault("CKPTFS_GPU_LIB",
                      str(CKPTFS_BIN.resolve().parent.parent / "gpu" / "libckptfs_gpu.so"))
sys.path.insert(0, str(REPO_ROOT / "gpu"))
import ckptfs_gpu  # noqa: E402
from ckptfs_gpu import CkptfsGpuError  # noqa: E402


@pytest.fixture(autouse=True)
def library():
    lib = os.environ["CKPTFS_GPU_LIB"]
    if not os.path.exists(lib):
        pytest.fail(f"no libckptfs_gpu.so at {lib} (build the ckptfs_gpu target or set "
                    "CKPTFS_GPU_LIB)")
    assert ckptfs_gpu.library_path() == lib


def raw(t):
    """t's elements as bytes, in logical order."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise_equal(got, want, name):
    assert got.dtype == want.dtype, name
    assert got.shape == want.shape, name
    assert torch.equal(raw(got.cpu()), raw(want.cpu())), name  # loaded on a GPU, or not


def reference(path):
    """{name: tensor} of torch.load(path), named as the mount's index names them."""
    return dict(flatten(torch.load(path)))


def check_against_torch(path, **kw):
    want = reference(path)
    listed = {t["name"]: t for t in tensors_attr(path)}
    got = ckptfs_gpu.load(path, **kw)
    assert list(got) == list(want)
    for name, t in got.items():
        assert_bitwise_equal(t, want[name], name)
        if "stride" in listed[name]:  # kept strided, as torch.load keeps it
            assert list(t.stride()) == listed[name]["stride"] == list(want[name].stride()), name
    return got


def test_load_matches_torch_load(mnt):
    state = make_state(1)
    state["extra"] = {"i8": torch.randint(-128, 128, (1000,), dtype=torch.int8),
                      "i16": torch.randint(-999, 999, (3, 7), dtype=torch.int16),
                      "i32": torch.randint(-999, 999, (11,), dtype=torch.int32),
                      "c128": torch.randn(5, dtype=torch.complex128)}
    p = mnt / "ckpt.pt"
    torch.save(state, p)
    got = check_against_torch(p)
    # device=None: the GPU when torch sees one and the library was built with HIP, else host.
    default = "cuda" if torch.cuda.is_available() and ckptfs_gpu.has_hip() else "cpu"
    assert all(t.device.type == default for t in got.values())
    assert {"bfloat16", "int64", "bool", "complex64", "float16"} <= {
        str(t.dtype).replace("torch.", "") for t in got.values()}
    strided = [x["name"] for x in ckptfs_gpu.index(p) if "stride" in x]
    assert "transposed" in strided and "strided" in strided
    assert "nested.list.1.deep" in got
    # The same through the pread engine and through requests cut to odd sizes (short reads).
    check_against_torch(p, options={"use_pread": 1})
    check_against_torch(p, options={"max_op_bytes": 4097, "piece_bytes": 65536, "queue_depth": 4})


def test_index_is_the_mounts(mnt):
    p = mnt / "ckpt.pt"
    torch.save(make_state(2), p)
    assert ckptfs_gpu.index(p) == tensors_attr(p)


def test_selection_loads_exactly_the_named_tensors(mnt):
    p = mnt / "ckpt.pt"
    torch.save(make_state(3), p)
    want = reference(p)
    names = ["model.bf16", "strided", "model.mask"]
    got = ckptfs_gpu.load(p, names=names, device="cpu")
    assert list(got) == names
    for n in names:
        assert_bitwise_equal(got[n], want[n], n)
    assert ckptfs_gpu.load(p, names=[]) == {}
    with pytest.raises(CkptfsGpuError) as info:
        ckptfs_gpu.load(p, names=["model.bf16", "model.nope", "decoder.x"])
    msg = str(info.value)
    assert "'model.nope'" in msg and "'decoder.x'" in msg and "model.bf16" not in msg
    assert str(p) in msg
    assert info.value.errno == errno.ENOENT


def test_safetensors(mnt):
    g = torch.Generator().manual_seed(4)
    sd = {"emb": torch.randn(300, 17, generator=g).to(torch.bfloat16),
          "w": torch.randn(64, 64, generator=g),
          "h": torch.randn(33, generator=g).to(torch.float16),
          "ids": torch.arange(-50, 50, dtype=torch.int64),
          "q": torch.randint(-128, 128, (77,), dtype=torch.int8, generator=g),
          "m": torch.rand(19, generator=g) > 0.5}
    p = mnt / "model.safetensors"
    save_safetensors(sd, p)
    assert os.getxattr(p, "user.ckptfs.format") == b"safetensors"
    got = ckptfs_gpu.load(p)
    assert list(got) == list(sd)
    for n, t in sd.items():
        assert_bitwise_equal(got[n], t, n)


def test_index_in_pages(mnt):
    # Long names and many tensors: far more than the 64 KiB one attribute can hold.
    g = torch.Generator().manual_seed(5)
    sd = {f"model.decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight":
          torch.randn(1 + i % 7, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
          for i in range(2500)}
    p = mnt / "many.pt"
    torch.save(sd, p)
    with pytest.raises(OSError) as info:
        os.getxattr(p, "user.ckptfs.tensors")
    assert info.value.errno == errno.E2BIG
    assert int(os.getxattr(p, "user.ckptfs.tensors.pages")) > 2
    got = ckptfs_gpu.load(p)
    assert list(got) == list(sd)
    for n, t in sd.items():
        assert_bitwise_equal(got[n], t, n)
    some = list(sd)[::500]
    assert list(ckptfs_gpu.load(p, names=some)) == some


def test_view_file_loads_like_torch_load(mnt):
    # A resharded view file has its own tensor index, so a rank of the new shape loads its
    # shard with no conversion and no pickle run: here TP 2 -> TP 1 (each tensor's bytes
    # gathered from both source ranks).
    sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
    import megatron_fixture as mf
    root = mnt / "mg"
    mf.save_checkpoint(root, mf.ModelConfig(era="mcore"), 2, 1, iteration=100)
    view = root / ".views" / "tp1-pp1" / "iter_0000100" / "mp_rank_00" / mf.FILE
    assert os.getxattr(view, "user.ckptfs.format") == b"torch-zip"
    listed = tensors_attr(view)
    assert listed and all(t["offset"] + t["length"] <= os.path.getsize(view) for t in listed)
    got = check_against_torch(view)
    assert len(got) == len(listed)
    # The view's directories and the source's chunk attributes stay what they were.
    with pytest.raises(OSError) as info:
        os.getxattr(view.parent, "user.ckptfs.tensors")
    assert info.value.errno == errno.ENODATA
    with pytest.raises(OSError) as info:
        os.getxattr(view, "user.ckptfs.chunks")
    assert info.value.errno == errno.ENODATA


def test_not_a_checkpoint(mnt, workdir):
    p = mnt / "notes.txt"
    write_file(p, b"hello, not a checkpoint\n" * 100)
    with pytest.raises(CkptfsGpuError) as info:
        ckptfs_gpu.load(p)
    assert "not a checkpoint" in str(info.value) and str(p) in str(info.value)
    assert info.value.errno == errno.ENODATA
    # Off the mount: no index at all.
    off = workdir / "plain.pt"
    torch.save({"w": torch.ones(3)}, off)
    with pytest.raises(CkptfsGpuError) as info:
        ckptfs_gpu.load(off)
    assert "not on a ckptfs mount" in str(info.value)
    with pytest.raises(CkptfsGpuError) as info:
        ckptfs_gpu.load(mnt / "missing.pt")
    assert info.value.errno == errno.ENOENT and "no such file" in str(info.value)


def test_damaged_checkpoints_raise(mnt):
    import io
    buf = io.BytesIO()
    torch.save(make_state(6), buf)
    data = buf.getvalue()
    for name, blob in {"truncated.pt": data[: len(data) // 2], "no_end.pt": data[:-10],
                       "zeroed_tail.pt": data[:-200] + b"\0" * 200}.items():
        write_file(mnt / name, blob)
        with pytest.raises(CkptfsGpuError) as info:
            ckptfs_gpu.load(mnt / name)
        assert info.value.errno == errno.EIO, name
        assert "damaged or truncated" in str(info.value), name
    # The mount still serves a good file afterwards.
    torch.save(make_state(6), mnt / "good.pt")
    check_against_torch(mnt / "good.pt")


def test_device_read_without_a_device_is_a_clear_error(mnt):
    # Without HIP in the library, or with HIP and no device to read into.
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import ctypes
    p = mnt / "ckpt.pt"
    torch.save({"w": torch.arange(10.0)}, p)
    lib = ctypes.CDLL(ckptfs_gpu.library_path())
    lib.ckptfs_gpu_last_error.restype = ctypes.c_char_p
    buf = torch.empty(10)
    t = ckptfs_gpu.index(p)[0]
    ext = ckptfs_gpu._Extent(t["offset"], t["length"], buf.data_ptr(), b"w")
    rc = lib.ckptfs_gpu_read(os.fsencode(p), ctypes.byref(ext), 1, 0, None)
    if ckptfs_gpu.has_hip():
        assert lib.ckptfs_gpu_device_count() == 0
        assert rc == -errno.EINVAL
        assert b"no HIP device 0 (this process sees 0)" in lib.ckptfs_gpu_last_error()
    else:
        assert rc == -errno.EOPNOTSUPP
        assert b"ckptfs_gpu was built without HIP" in lib.ckptfs_gpu_last_error()
    # The host path of the same library still works.
    assert torch.equal(ckptfs_gpu.load(p, device="cpu")["w"], torch.arange(10.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU on this machine")
def test_load_to_gpu_matches_torch_load(mnt):
    p = mnt / "ckpt.pt"
    torch.save(make_state(7), p)
    want = dict(flatten(torch.load(p, map_location="cuda")))
    got = ckptfs_gpu.load(p, device="cuda")
    assert list(got) == list(want)
    for name, t in got.items():
        assert t.device.type == "cuda", name
        assert_bitwise_equal(t, want[name], name)
