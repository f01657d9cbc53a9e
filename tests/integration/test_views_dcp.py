# The consolidated view of a DCP checkpoint (docs/views.md) through a real mount: the fixtures of
# tests/formats/data (FileSystemWriter's layout, real torch.save items) copied into the mount, then
# model.pt read by Debian's torch and model.safetensors parsed, against the state dict the
# fixture generator saved (make_dcp_fixtures.state_dict()).
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from conftest import REPO_ROOT, expect_errno

DATA = REPO_ROOT / "tests" / "formats" / "data"
CHECK = REPO_ROOT / "tests" / "reshard" / "dcp_view_check.py"
sys.path.insert(0, str(DATA))
from make_dcp_fixtures import state_dict  # noqa: E402

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(body[a:b])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else \
            torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return header, out


@pytest.mark.parametrize("fixture", ["dcp_torch_save", "dcp_safetensors"])
def test_consolidated_view(mnt, fixture):
    root = mnt / "ckpt"
    shutil.copytree(DATA / fixture, root)
    assert ".views" not in os.listdir(root)  # hidden; resolves on lookup
    views = root / ".views"
    assert os.listdir(views) == ["consolidated"]
    view = views / "consolidated"
    assert sorted(os.listdir(view)) == ["model.pt", "model.safetensors"]

    # model.pt: a sound zip that torch.load reads to exactly the saved state dict.
    p = subprocess.run([sys.executable, str(CHECK), str(view / "model.pt"), str(DATA)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout
    with zipfile.ZipFile(view / "model.pt") as z:
        assert z.testzip() is None

    # model.safetensors: the tensors under "model", prefix dropped, names sorted.
    header, tensors = read_safetensors(view / "model.safetensors")
    assert header["__metadata__"] == {"format": "pt"}
    want = {k[len("model."):]: v for k, v in state_dict().items()
            if k.startswith("model.") and isinstance(v, torch.Tensor)}
    assert sorted(tensors) == sorted(want)
    assert [k for k in header if k != "__metadata__"] == sorted(want)
    for name, w in want.items():
        assert tensors[name].dtype == w.dtype and torch.equal(tensors[name], w.contiguous()), name

    # Read-only, and the same bytes on every read.
    assert (view / "model.pt").read_bytes() == (view / "model.pt").read_bytes()
    expect_errno(errno.EROFS, open, view / "model.pt", "r+b")


def test_missing_data_file_fails_the_view(mnt):
    root = mnt / "ckpt"
    shutil.copytree(DATA / "dcp_torch_save", root)
    os.unlink(root / "__1_0.distcp")
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "consolidated")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "__1_0.distcp" in why, why


def test_plain_directories_have_no_views(mnt):
    d = mnt / "plain"
    d.mkdir()
    (d / "a.pt").write_bytes(b"x")
    assert ".views" not in os.listdir(d)
    expect_errno(errno.ENOENT, os.stat, d / ".views")


# A DCP checkpoint written by torch 2.11 itself (../shared/fixtures/dcp-torch2.11: a model in
# fp32 and bf16, AdamW state keyed by parameter name with 0-d step tensors, nested dicts, Python
# scalars and strings), and reference.pt, torch.save of the same state dict.
REAL_DCP = REPO_ROOT.parent / "shared" / "fixtures" / "dcp-torch2.11"


def _flatten(obj, prefix=""):
    """(path, leaf) in dict order: the key order of every dict, nested ones included."""
    if isinstance(obj, dict):
        out = [(prefix, f"dict{list(obj)}")]
        for k, v in obj.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, obj)]


def test_consolidated_view_of_a_real_torch_2_11_checkpoint(mnt):
    if not REAL_DCP.is_dir():
        assert not os.environ.get("CI"), f"{REAL_DCP} is missing: CI lays shared/ beside the clone"
        pytest.skip(f"{REAL_DCP} is not beside this checkout")
    sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
    import sharing  # noqa: E402
    root = mnt / "real"
    shutil.copytree(REAL_DCP / "ckpt", root)
    got = torch.load(root / ".views" / "consolidated" / "model.pt")
    want = torch.load(REAL_DCP / "reference.pt")
    g, w = _flatten(got), _flatten(want)
    # Every dict's keys in the state dict's order (torch's dcp_to_torch_save keeps it).
    assert [p for p, _ in g] == [p for p, _ in w]
    for (path, a), (_, b) in zip(g, w):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
            assert torch.equal(a.view(torch.uint8) if a.dim() else a.reshape(1).view(torch.uint8),
                               b.view(torch.uint8) if b.dim() else b.reshape(1).view(torch.uint8)), path
        else:
            assert type(a) is type(b) and a == b, (path, a, b)
    # dcp_to_torch_save loads every tensor on its own: no object or storage is shared.
    assert sharing.objects(got) == [] and sharing.storages(got) == {}
    with zipfile.ZipFile(root / ".views" / "consolidated" / "model.pt") as z:
        assert z.testzip() is None
