"""Writes the torch.save fixtures of tests/formats/ with Debian's real torch, and next to each the
facts torch itself reports about it, for the C++ tests to check the parsers against.

Run with /usr/bin/python3 (the interpreter that has python3-torch):
    /usr/bin/python3 tests/formats/data/make_torch_fixtures.py tests/formats/data

<name>.pt       the torch.save output
<name>.expect   one line per record:  record NAME DATA_OFFSET SIZE   (from Python's zipfile)
                one line per tensor:  tensor NAME DTYPE SHAPE OFFSET LENGTH FNV1A64
                  where OFFSET/LENGTH are the bytes the tensor spans in the file (its storage's
                  record start + storage_offset * itemsize), and FNV1A64 hashes the bytes torch
                  holds in that span (read back from the loaded tensor, not from the file).
"""
import argparse
import collections
import io
import os
import pickle
import struct
import sys
import zipfile

import torch

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a64(data):
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def span_bytes(t):
    """The bytes of t's storage that t reaches, as torch holds them."""
    if t.numel() == 0:
        return b""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    flat = torch.empty(0, dtype=t.dtype).set_(t.storage(), t.storage_offset(), (span,), (1,))
    return flat.view(torch.uint8).numpy().tobytes()


def walk(obj, path, out, leaf=lambda o: isinstance(o, torch.Tensor), value=lambda o: o):
    """(key path, value(leaf)) for every leaf under obj, in pickling order."""
    join = lambda k: f"{path}.{k}" if path else str(k)
    if leaf(obj):
        out.append((path, value(obj)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            walk(v, join(k), out, leaf, value)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            walk(v, join(i), out, leaf, value)
    elif isinstance(obj, argparse.Namespace):
        for k, v in vars(obj).items():
            walk(v, join(k), out, leaf, value)


def record_offsets(path):
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset)
            h = f.read(30)
            name_len, extra_len = struct.unpack("<HH", h[26:30])
            yield info.filename, info.header_offset + 30 + name_len + extra_len, info.file_size


def write(out_dir, name, obj):
    path = os.path.join(out_dir, name + ".pt")
    torch.save(obj, path)
    records = list(record_offsets(path))
    data_offset = {n.split("/", 1)[1]: off for n, off, _ in records}
    loaded = torch.load(path)
    tensors = []
    walk(loaded, "", tensors)
    # Which record holds each tensor's storage: read data.pkl with Python's pickle, turning each
    # tensor into (storage key) instead of calling torch.

    class Ids(pickle.Unpickler):
        def find_class(self, mod, nm):
            if (mod, nm) == ("torch._utils", "_rebuild_tensor_v2"):
                return lambda st, off, size, stride, *a: ("T", st, off)
            if (mod, nm) == ("torch._utils", "_rebuild_parameter"):
                return lambda t, *a: t
            if mod == "torch":
                return nm
            return super().find_class(mod, nm)

        def persistent_load(self, pid):
            return pid[2]

    with zipfile.ZipFile(path) as z:
        prefix = z.namelist()[0].split("/")[0]
        raw = Ids(io.BytesIO(z.read(prefix + "/data.pkl"))).load()
    raw_tensors = []
    walk(raw, "", raw_tensors, leaf=lambda o: isinstance(o, tuple) and len(o) == 3 and o[0] == "T",
         value=lambda o: o[1])
    key_of = dict(raw_tensors)
    with open(os.path.join(out_dir, name + ".expect"), "w") as f:
        for n, off, size in records:
            f.write(f"record {n} {off} {size}\n")
        for tpath, t in tensors:
            key = key_of[tpath]
            b = span_bytes(t)
            off = data_offset["data/" + key] + t.storage_offset() * t.element_size()
            dtype = str(t.dtype).replace("torch.", "")
            shape = ",".join(str(s) for s in t.shape) or "-"
            f.write(f"tensor {tpath} {dtype} {shape} {off} {len(b)} {fnv1a64(b):016x}\n")


def main():
    out_dir = sys.argv[1]
    torch.manual_seed(0)
    base = torch.randn(64, 400)  # 100 KiB: big enough to be cut at its boundaries
    sd = collections.OrderedDict()
    sd["embed.weight"] = torch.randn(128, 256)  # 128 KiB
    sd["layers.0.norm.weight"] = torch.ones(256)
    sd["layers.0.fc.weight"] = torch.randn(300, 100).half()
    sd["layers.0.fc.bias"] = torch.zeros(300, dtype=torch.bfloat16)
    sd["view.rows"] = base[10:20]         # a view: storage offset, shared storage
    sd["view.cols"] = base[:, 5:9]         # non-contiguous view of the same storage
    sd["view.t"] = base.t()                # transposed
    sd["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    sd["empty"] = torch.empty(0, 7)
    sd["ints"] = torch.arange(1000, dtype=torch.int64)
    sd["int8"] = torch.arange(-100, 100, dtype=torch.int8)
    sd["mask"] = torch.tensor([True, False, True])
    sd["complex"] = torch.randn(20, dtype=torch.complex64)
    sd["param"] = torch.nn.Parameter(torch.randn(40, 40))
    ckpt = {
        "model": sd,
        "optimizer": {"state": {0: {"step": 7, "exp_avg": torch.randn(32, 32)}},
                      "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "args": argparse.Namespace(lr=0.01, name="run", layers=2, mask=torch.ones(4)),
        "iteration": 1234,
        "nested": [(torch.tensor([1, 2]), {"deep": torch.full((3, 3), 2.0)})],
    }
    write(out_dir, "torch_nested", ckpt)
    write(out_dir, "torch_two_big", {"a": torch.randn(200, 100), "b": torch.randn(150, 100)})
    legacy = os.path.join(out_dir, "torch_legacy.pt")
    torch.save({"w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)


if __name__ == "__main__":
    main()
