# Checkpoint recognition through the mount: the user.ckptfs.* attributes and `ckptfs inspect`
# checked against torch itself, hostile and damaged files, and checkpoint-aware dedup measured with
# `ckptfs stats PATH`. Runs in /usr/bin/python3 (Debian's PyTorch 1.13).
import argparse
import errno
import io
import json
import os
import pickle
import subprocess
import zipfile

import pytest
import torch

from conftest import CKPTFS_BIN, expect_errno, read_file, run, write_file
from test_torch import make_state

MiB = 1 << 20


def tensors_attr(path):
    """user.ckptfs.tensors, from its pages when it does not fit one attribute."""
    pages = int(os.getxattr(path, "user.ckptfs.tensors.pages"))
    out = []
    for i in range(pages):
        out += json.loads(os.getxattr(path, f"user.ckptfs.tensors.{i}"))
    return out


def flatten(obj, path=""):
    """(key path, tensor) pairs in the order torch pickles them, named as ckptfs names them."""
    join = lambda k: f"{path}.{k}" if path else str(k)
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, join(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten(v, join(i))
    elif isinstance(obj, argparse.Namespace):
        for k, v in vars(obj).items():
            yield from flatten(v, join(k))


def span_bytes(t):
    """The bytes of t's storage that t reaches, as torch holds them."""
    if t.numel() == 0:
        return b""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    flat = torch.empty(0, dtype=t.dtype).set_(t.storage(), t.storage_offset(), (span,), (1,))
    return flat.view(torch.uint8).numpy().tobytes()


def check_ranges_against_torch(path):
    """Every tensor ckptfs lists: name, dtype, shape, and the file bytes at its range, as torch
    has them."""
    listed = tensors_attr(path)
    want = list(flatten(torch.load(path)))
    assert [t["name"] for t in listed] == [n for n, _ in want]
    with open(path, "rb") as f:
        for info, (name, t) in zip(listed, want):
            assert info["dtype"] == str(t.dtype).replace("torch.", ""), name
            assert info["shape"] == list(t.shape), name
            if not t.is_contiguous():
                assert info["stride"] == list(t.stride()), name
            f.seek(info["offset"])
            assert f.read(info["length"]) == span_bytes(t), name
    return listed


def test_tensor_ranges_match_torch(mnt):
    state = make_state(3)
    p = mnt / "ckpt.pt"
    torch.save(state, p)
    assert os.getxattr(p, "user.ckptfs.format") == b"torch-zip"
    listed = check_ranges_against_torch(p)
    assert len(listed) > 20
    # One attribute holds it all here, and says the same as the pages.
    assert json.loads(os.getxattr(p, "user.ckptfs.tensors")) == listed
    # The attributes are computed, not stored: not listed, not settable.
    assert "user.ckptfs.tensors" not in os.listxattr(p)
    expect_errno(errno.EPERM, os.setxattr, p, "user.ckptfs.format", b"x")


def test_nn_module_state_dict_and_optimizer(mnt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 10)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": 5}
    torch.save(state, mnt / "m.pt")
    check_ranges_against_torch(mnt / "m.pt")


def test_many_tensors_come_in_pages(mnt):
    state = {f"t{i}": torch.full((2,), float(i)) for i in range(3000)}
    p = mnt / "many.pt"
    torch.save(state, p)
    expect_errno(errno.E2BIG, os.getxattr, p, "user.ckptfs.tensors")
    pages = int(os.getxattr(p, "user.ckptfs.tensors.pages"))
    assert pages > 1
    for i in range(pages):
        assert len(os.getxattr(p, f"user.ckptfs.tensors.{i}")) <= 64 * 1024
    expect_errno(errno.ENODATA, os.getxattr, p, f"user.ckptfs.tensors.{pages}")
    check_ranges_against_torch(p)


def test_inspect(mnt):
    state = {"model": model_state(6, layers=2), "misc": make_state(4)}
    torch.save(state, mnt / "a.pt")
    torch.save(state, mnt / "b.pt")
    out = run([CKPTFS_BIN, "inspect", mnt / "b.pt"]).stdout
    assert "format   torch-zip" in out
    assert "misc.model.layer1.weight" in out and "float16" in out
    doc = json.loads(run([CKPTFS_BIN, "inspect", "--json", mnt / "b.pt"]).stdout)
    assert doc["format"] == "torch-zip"
    assert doc["size"] == os.stat(mnt / "b.pt").st_size
    assert [t["name"] for t in doc["tensors"]] == [n for n, _ in flatten(torch.load(mnt / "b.pt"))]
    # b.pt repeats a.pt's tensors: nearly all of its bytes are shared.
    assert doc["chunks"]["shared_bytes"] >= 0.95 * doc["chunks"]["bytes"], doc["chunks"]
    bad = run([CKPTFS_BIN, "inspect", "/etc/hostname"], check=False)
    assert bad.returncode != 0 and "not on a ckptfs mount" in bad.stderr


def torch_like_zip(pkl, records=()):
    """A zip laid out like torch.save's, with the given data.pkl bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        for name, data in records:
            z.writestr("archive/" + name, data)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def test_malicious_pickle_is_never_executed(mnt, workdir):
    marker = workdir / "pwned"
    evil = (b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    evil_v2 = pickle.dumps(0, protocol=2)[:2] + b"\x8c\x02os\x8c\x06system\x93\x8c\x05touch\x85R."
    for i, pkl in enumerate((evil, evil_v2)):
        p = mnt / f"evil{i}.pt"
        write_file(p, torch_like_zip(pkl))
        assert os.getxattr(p, "user.ckptfs.format") == b"torch-zip"
        assert tensors_attr(p) == []  # parsed as data: a call of os.system is not a tensor
        run([CKPTFS_BIN, "inspect", p])
    assert not marker.exists()


def test_damaged_checkpoints_give_clear_errors_and_keep_bytes(mnt):
    good = io.BytesIO()
    torch.save(make_state(5), good)
    data = good.getvalue()
    cases = {
        "truncated.pt": data[: len(data) // 2],
        "no_end.pt": data[:-10],
        # A tensor that claims more bytes than its storage record has.
        "lying.pt": torch_like_zip(
            b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02("
            b"(X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05"
            b"X\x03\x00\x00\x00cpuq\x06M\xe8\x03tq\x07QK\x00M\xe8\x03\x85q\x08K\x01\x85q\t\x89"
            b"ccollections\nOrderedDict\nq\n)Rq\x0btq\x0cRq\rs.",
            [("data/0", b"\x00" * 16)]),
        "garbage_pickle.pt": torch_like_zip(b"\x80\x02\xff\xfe\xfd"),
    }
    for name, blob in cases.items():
        write_file(mnt / name, blob)
        err = expect_errno(errno.EIO, os.getxattr, mnt / name, "user.ckptfs.tensors.pages")
        assert read_file(mnt / name) == blob, name  # nothing lost
        r = run([CKPTFS_BIN, "inspect", mnt / name], check=False)
        assert r.returncode != 0, name
    log = mnt.log()
    assert "no zip end-of-central-directory record" in log
    assert "reaches past the end of storage" in log or "holds 16 bytes" in log


def stored(mnt, rel):
    out = run([CKPTFS_BIN, "stats", mnt / rel]).stdout
    vals = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("_bytes"):
            vals[parts[0]] = int(parts[1])
    return vals


def model_state(seed, layers=8, width=1024):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(layers):
        sd[f"layers.{i}.attn.qkv.weight"] = torch.randn(3 * width // 4, width, generator=g)
        sd[f"layers.{i}.attn.qkv.bias"] = torch.randn(3 * width // 4, generator=g)
        sd[f"layers.{i}.norm.weight"] = torch.ones(width)
        sd[f"layers.{i}.mlp.fc.weight"] = torch.randn(width, width, generator=g).half()
    return sd


def test_dedup_identical_dp_ranks(mnt):
    os.mkdir(mnt / "dp")
    sd = model_state(1)
    for rank in range(8):
        torch.save({"model": sd, "rank": rank}, mnt / "dp" / f"mp_rank_00_dp_{rank}.pt")
    one = os.stat(mnt / "dp" / "mp_rank_00_dp_0.pt").st_size
    s = stored(mnt, "dp")
    print(f"8 DP ranks: stored/one file = {s['stored_bytes'] / one:.4f}")
    assert s["logical_bytes"] >= 8 * one - 8 * 1024
    assert s["stored_bytes"] <= 1.02 * one, s


def test_dedup_frozen_base_finetune(mnt):
    os.mkdir(mnt / "ft")
    base = model_state(2)
    unique = sum(t.numel() * t.element_size() for t in base.values())
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        head = {"head.weight": torch.randn(2048, 1024, generator=g),
                "head.bias": torch.randn(2048, generator=g)}
        exp_avg = {k: torch.randn_like(v) for k, v in head.items()}
        unique += sum(t.numel() * t.element_size() for t in (*head.values(), *exp_avg.values()))
        torch.save({"model": {**base, **head}, "optimizer": {"exp_avg": exp_avg}, "step": step},
                   mnt / "ft" / f"step{step}.pt")
    s = stored(mnt, "ft")
    print(f"fine-tune, 5 steps: stored/unique = {s['stored_bytes'] / unique:.4f}")
    assert s["stored_bytes"] <= 1.02 * unique, (s, unique)


def test_dedup_same_tensors_other_order_and_file(mnt):
    os.mkdir(mnt / "order")
    sd = model_state(4)
    unique = sum(t.numel() * t.element_size() for t in sd.values())
    torch.save(sd, mnt / "order" / "a.pt")
    reordered = {f"renamed.{k}": sd[k] for k in reversed(list(sd))}
    torch.save({"nested": {"deeper": reordered}, "extra": 1}, mnt / "order" / "b.pt")
    s = stored(mnt, "order")
    print(f"reordered copy: stored/unique = {s['stored_bytes'] / unique:.4f}")
    assert s["stored_bytes"] <= 1.02 * unique, (s, unique)


def test_stats_per_directory(mnt):
    for d in ("x", "y"):
        os.mkdir(mnt / d)
    sd = model_state(5, layers=2)
    torch.save(sd, mnt / "x" / "a.pt")
    torch.save(sd, mnt / "y" / "b.pt")
    write_file(mnt / "y" / "other", os.urandom(MiB))
    out = run([CKPTFS_BIN, "stats", mnt.mnt]).stdout
    rows = {l.split()[-1]: l.split() for l in out.splitlines() if l.rstrip().endswith("/")}
    assert set(rows) == {"x/", "y/"}
    x_stored, x_excl = int(rows["x/"][1]), int(rows["x/"][2])
    y_stored, y_excl = int(rows["y/"][1]), int(rows["y/"][2])
    # The tensors are shared between x and y: little of x is its own, y owns its random file.
    assert x_excl < 0.02 * x_stored
    assert y_excl >= MiB
    assert stored(mnt, "y/other")["stored_bytes"] == MiB


def save_safetensors(tensors, path):
    """A .safetensors file written per the format's specification (Debian has no safetensors
    package): 8-byte little-endian header length, the JSON header padded with spaces to 8 bytes,
    then the tensors back to back."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int8: "I8", torch.bool: "BOOL"}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else \
            t.reshape(1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for b in blobs:
            f.write(b)


def test_safetensors_ranges_and_cross_format_dedup(mnt):
    os.mkdir(mnt / "st")
    sd = model_state(7, layers=2)
    sd["scalar"] = torch.tensor(1.5)
    sd["flags"] = torch.tensor([True, False])
    torch.save(sd, mnt / "st" / "model.pt")
    before = stored(mnt, "st")["stored_bytes"]
    p = mnt / "st" / "model.safetensors"
    save_safetensors(sd, p)
    assert os.getxattr(p, "user.ckptfs.format") == b"safetensors"
    listed = tensors_attr(p)
    assert [t["name"] for t in listed] == list(sd)
    with open(p, "rb") as f:
        for info in listed:
            t = sd[info["name"]]
            assert info["dtype"] == str(t.dtype).replace("torch.", "")
            assert info["shape"] == list(t.shape)
            f.seek(info["offset"])
            assert f.read(info["length"]) == t.reshape(-1).view(torch.uint8).numpy().tobytes()
    # The same tensors in the other format add only the header and the small tensors.
    added = stored(mnt, "st")["stored_bytes"] - before
    print(f"safetensors copy of a torch file adds {added} bytes")
    assert added < 64 * 1024, added


def test_inspect_directory_layouts(mnt):
    # Megatron-LM legacy: iter_{:07d}/mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt and the tracker
    # (megatron/training/checkpointing.py: get_checkpoint_name, get_checkpoint_tracker_filename).
    meg = mnt / "megatron"
    for tp in range(2):
        for pp in range(2):
            d = meg / "iter_0000200" / f"mp_rank_{tp:02d}_{pp:03d}"
            os.makedirs(d)
            torch.save({"model": {"w": torch.ones(2)}, "iteration": 200}, d / "model_optim_rng.pt")
    write_file(meg / "latest_checkpointed_iteration.txt", b"200")
    out = run([CKPTFS_BIN, "inspect", meg]).stdout
    assert "layout    megatron" in out
    assert "iter_0000200: tp=2 pp=2" in out and "complete=yes" in out
    # DeepSpeed: <tag>/mp_rank_{tp:02d}_model_states.pt and
    # [bf16_]zero_pp_rank_{dp}_mp_rank_{tp:02d}_optim_states.pt, tag file `latest`
    # (deepspeed/runtime/engine.py: _get_ckpt_name, _get_zero_ckpt_prefix, save_checkpoint).
    ds = mnt / "deepspeed"
    os.makedirs(ds / "global_step10")
    torch.save({"module": {"w": torch.ones(2)}}, ds / "global_step10" / "mp_rank_00_model_states.pt")
    for dp in range(4):
        torch.save({"optimizer_state_dict": {}},
                   ds / "global_step10" / f"bf16_zero_pp_rank_{dp}_mp_rank_00_optim_states.pt")
    write_file(ds / "latest", b"global_step10")
    doc = json.loads(run([CKPTFS_BIN, "inspect", "--json", ds]).stdout)
    assert doc["layout"] == "deepspeed"
    assert "dp=4" in doc["description"] or "dp_size=4" in doc["description"], doc
    # A plain directory is no checkpoint layout.
    os.mkdir(mnt / "plain")
    assert "layout    unknown" in run([CKPTFS_BIN, "inspect", mnt / "plain"]).stdout


def test_dcp_checkpoint_through_the_mount(mnt):
    # The DCP fixtures of tests/formats/data (FileSystemWriter's layout, made by
    # make_dcp_fixtures.py with real torch.save items): copied in, then read back by content.
    src = os.path.join(os.path.dirname(__file__), "..", "formats", "data", "dcp_torch_save")
    dst = mnt / "dcp"
    os.mkdir(dst)
    for name in sorted(os.listdir(src)):
        write_file(dst / name, read_file(os.path.join(src, name)))
    assert os.getxattr(dst / ".metadata", "user.ckptfs.format") == b"dcp-metadata"
    assert os.getxattr(dst / "__1_0.distcp", "user.ckptfs.format") == b"dcp-data"
    # By content alone the archives are numbered; each range holds the chunk torch saved.
    listed = tensors_attr(dst / "__1_0.distcp")
    data = read_file(dst / "__1_0.distcp")
    assert [t["name"] for t in listed] == ["0", "1", "2"]
    with open(os.path.join(src, "__1_0.distcp"), "rb") as f:
        raw = f.read()
    for info in listed:
        assert data[info["offset"]:info["offset"] + info["length"]] == \
            raw[info["offset"]:info["offset"] + info["length"]]
    # With .metadata beside it, inspect names the chunks by their state-dict names.
    doc = json.loads(run([CKPTFS_BIN, "inspect", "--json", dst / "__1_0.distcp"]).stdout)
    assert [t["name"] for t in doc["tensors"]] == ["model.w", "model.t", "model.idx"]
    w = doc["tensors"][0]
    assert w["global_shape"] == [8, 6] and w["global_offset"] == [4, 0] and w["shape"] == [4, 6]
    assert doc["tensors"][1]["stride"] == [1, 4]  # the transposed view, saved as it is
    out = run([CKPTFS_BIN, "inspect", dst / ".metadata"]).stdout
    assert "format   dcp-metadata (version 1.0.0)" in out
    assert "tensors  5" in out and "in 2 files; 2 non-tensor items" in out
    # A data file missing: inspect says so and fails.
    os.unlink(dst / "__0_0.distcp")
    r = subprocess.run([CKPTFS_BIN, "inspect", dst / ".metadata"], capture_output=True, text=True)
    assert r.returncode == 1 and "problem: __0_0.distcp is missing" in r.stdout
