"""Writes the DCP (torch.distributed.checkpoint) fixtures of tests/formats/ and, next to each, the
facts the C++ tests check the parser against.

Debian's torch 1.13 cannot run DCP's save under Python 3.11, so the checkpoints are laid out here
the way torch 2.x's FileSystemWriter lays them out, read from its source
(torch/distributed/checkpoint/{metadata,filesystem,default_planner}.py):
- each rank writes `__{rank}_0.distcp`: its non-tensor items first, then its tensors, back to back
  with nothing in between; with the torch_save format each item is a whole `torch.save` archive
  (the tensor chunk itself, not made contiguous when it views its whole storage; a non-tensor
  value pickled the same way); with the safetensors format (torch >= 2.8) the tensors are one
  safetensors blob at the end, and each tensor's storage offset is that blob's start;
- `.metadata` is `pickle.dump(Metadata(...))` at protocol 4 of the dataclasses in
  torch.distributed.checkpoint.metadata (TensorProperties pickles its state as a 5-tuple; in
  torch 2.0-2.2 it lives in torch.distributed._shard.sharded_tensor.metadata), storage_data maps
  MetadataIndex(fqn, chunk offsets) to filesystem._StorageInfo(relative_path, offset, length).
Stand-in classes with torch's module and class names produce the same pickle opcodes; the
tensors, torch.Size, dtypes and layouts are real torch objects, pickled by real torch.

Run with /usr/bin/python3 (which has python3-torch):
    /usr/bin/python3 tests/formats/data/make_dcp_fixtures.py tests/formats/data

For each fixture directory DIR (dcp_torch_save, dcp_torch22, dcp_safetensors), DIR.expect has
    tensor FQN DTYPE SIZE OFFSETS SIZES FILE RAW_OFFSET RAW_LENGTH FNV1A64   (one per chunk)
    bytes FQN FILE OFFSET LENGTH
where sizes and offsets are comma-joined ("-" for none), RAW_* is where the chunk's data lies in
FILE, found with Python's zipfile or the safetensors header, and FNV1A64 hashes those bytes.
"""
import copyreg
import dataclasses
import enum
import io
import json
import os
import pathlib
import pickle
import struct
import sys
import types
import zipfile
from typing import Any, Optional

import torch

from make_torch_fixtures import fnv1a64  # the hash the C++ tests check ranges with


def module(name):
    m = types.ModuleType(name)
    sys.modules[name] = m
    return m


def place(mod, cls):
    cls.__module__ = mod.__name__
    cls.__qualname__ = cls.__name__
    setattr(mod, cls.__name__, cls)
    return cls


def dcp_classes(props_module, enum_name):
    """The DCP dataclasses, registered under torch's module names."""
    md = module("torch.distributed.checkpoint.metadata")
    fs = module("torch.distributed.checkpoint.filesystem")
    pm = md if props_module == md.__name__ else module(props_module)

    @dataclasses.dataclass
    class ChunkStorageMetadata:
        offsets: Any
        sizes: Any

    MemFormat = enum.Enum(enum_name, {"TORCH_CONTIGUOUS_FORMAT": 0, "TORCH_CHANNELS_LAST": 1,
                                      "TORCH_PRESERVE_FORMAT": 2})

    @dataclasses.dataclass
    class TensorProperties:
        dtype: Any = None
        layout: Any = torch.strided
        requires_grad: bool = False
        memory_format: Any = torch.contiguous_format
        pin_memory: bool = False

        def __getstate__(self):
            return (self.dtype, self.layout, self.requires_grad,
                    MemFormat.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)

    @dataclasses.dataclass
    class TensorStorageMetadata:
        properties: Any
        size: Any
        chunks: list

    @dataclasses.dataclass
    class BytesStorageMetadata:
        pass

    @dataclasses.dataclass
    class StorageMeta:
        checkpoint_id: Any = None
        save_id: Optional[str] = None
        load_id: Optional[str] = None
        modules: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        offset: Any = None
        index: Optional[int] = dataclasses.field(hash=False, compare=False, default=None)

        def __init__(self, fqn, offset=None, index=None):
            object.__setattr__(self, "fqn", fqn)
            object.__setattr__(self, "index", index)
            if offset is not None:
                object.__setattr__(self, "offset", torch.Size(offset))

    @dataclasses.dataclass
    class _StorageInfo:
        relative_path: str
        offset: int
        length: int
        transform_descriptors: Any = None

        def __getstate__(self):
            return {k: v for k, v in self.__dict__.items() if v is not None}

    for c in (ChunkStorageMetadata, TensorStorageMetadata, BytesStorageMetadata, StorageMeta,
              MetadataIndex):
        place(md, c)
    place(pm, TensorProperties)
    place(pm, MemFormat)
    place(fs, _StorageInfo)
    return types.SimpleNamespace(**{c.__name__: c for c in (
        ChunkStorageMetadata, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
        StorageMeta, MetadataIndex, _StorageInfo)}, md=md)


def metadata_class(md, fields):
    """Metadata with the fields a torch version has (storage_meta since 2.4, version since 2.9)."""
    spec = [("state_dict_metadata", dict)] + [(f, Any, dataclasses.field(default=None))
                                              for f in fields]
    cls = dataclasses.make_dataclass("Metadata", spec)
    return place(md, cls)


def state_dict():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(8, 6, generator=g)
    t = torch.randn(3, 4, generator=g).t()  # a transposed view of its whole storage
    return {
        "model.w": w,  # sharded by rows: rank 0 has rows 0-3, rank 1 rows 4-7
        "model.b": torch.randn(6, generator=g).to(torch.bfloat16),  # replicated: rank 0 saves it
        "model.t": t,  # whole, saved by rank 1
        "model.scale": torch.tensor(0.5, dtype=torch.float64),  # 0-d
        "model.idx": torch.arange(5, dtype=torch.int64),
        "optim.state.0.step": 7,
        "optim.param_groups": [{"lr": 0.01, "params": ["model.w"]}],
    }


def plan(sd):
    """Per rank: (bytes items, tensor items), each (fqn, chunk offsets, chunk tensor)."""
    w = sd["model.w"]
    ranks = [([], []), ([], [])]
    ranks[0][0].append(("optim.state.0.step", None, sd["optim.state.0.step"]))
    ranks[0][0].append(("optim.param_groups", None, sd["optim.param_groups"]))
    ranks[0][1].append(("model.w", [0, 0], w[0:4]))
    ranks[0][1].append(("model.b", [0], sd["model.b"]))
    ranks[0][1].append(("model.scale", [], sd["model.scale"]))
    ranks[1][1].append(("model.w", [4, 0], w[4:8]))
    ranks[1][1].append(("model.t", [0, 0], sd["model.t"]))
    ranks[1][1].append(("model.idx", [0], sd["model.idx"]))
    return ranks


def torch_save_bytes(obj):
    buf = io.BytesIO()
    if isinstance(obj, torch.Tensor):
        # FileSystemWriter clones only a tensor that views part of a larger storage.
        if obj.storage().size() != obj.numel():
            obj = obj.clone()
    torch.save(obj, buf)
    return buf.getvalue()


def raw_range_in_archive(archive):
    """Where the one storage record's data starts in a torch.save archive, by Python's zipfile."""
    z = zipfile.ZipFile(io.BytesIO(archive))
    (info,) = [i for i in z.infolist() if "/data/" in i.filename]
    name_len, extra_len = struct.unpack("<HH", archive[info.header_offset + 26:
                                                       info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def safetensors_blob(tensors):
    """A safetensors file of (name, tensor) as the reference writer lays it out."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64"}
    header, datas, off = {}, [], 0
    for name, t in tensors:
        data = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.dim() else \
            t.reshape(1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        datas.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(datas), 8 + len(h)


def write_fixture(out, name, props_module, enum_name, meta_fields, fmt):
    C = dcp_classes(props_module, enum_name)
    Metadata = metadata_class(C.md, meta_fields)
    sd = state_dict()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    sdm, storage, expect = {}, {}, []
    for rank, (byte_items, tensor_items) in enumerate(plan(sd)):
        rel = f"__{rank}_0.distcp"
        data = bytearray()
        for fqn, _, obj in byte_items:
            blob = torch_save_bytes(obj)
            sdm[fqn] = C.BytesStorageMetadata()
            storage[C.MetadataIndex(fqn)] = C._StorageInfo(rel, len(data), len(blob))
            expect.append(f"bytes {fqn} {rel} {len(data)} {len(blob)}")
            data += blob
        if fmt == "safetensors":
            start = len(data)
            blob, data_start = safetensors_blob([(f, t) for f, _, t in tensor_items])
            header = json.loads(blob[8:data_start])
        for fqn, offsets, t in tensor_items:
            full = sd[fqn]
            if fqn not in sdm:
                props = C.TensorProperties(dtype=full.dtype)
                sdm[fqn] = C.TensorStorageMetadata(props, full.size(), [])
            sdm[fqn].chunks.append(C.ChunkStorageMetadata(torch.Size(offsets), t.size()))
            if fmt == "safetensors":
                nbytes = t.numel() * t.element_size()
                idx = C.MetadataIndex(fqn, offsets, len(sdm[fqn].chunks) - 1)
                storage[idx] = C._StorageInfo(rel, start, nbytes)
                a, b = header[fqn]["data_offsets"]
                raw_off, raw_len = start + data_start + a, b - a
            else:
                blob_t = torch_save_bytes(t)
                idx = C.MetadataIndex(fqn, offsets, len(sdm[fqn].chunks) - 1)
                storage[idx] = C._StorageInfo(rel, len(data), len(blob_t))
                back = torch.load(io.BytesIO(blob_t))
                assert back.dtype == t.dtype and torch.equal(back, t) and \
                    back.stride() == t.stride(), fqn
                rec_off, rec_len = raw_range_in_archive(blob_t)
                raw_off, raw_len = len(data) + rec_off, rec_len
                data += blob_t
            expect.append(None)  # filled once the file's bytes are final
            expect[-1] = (fqn, str(full.dtype).replace("torch.", ""), list(full.shape), offsets,
                          list(t.shape), rel, raw_off, raw_len)
        if fmt == "safetensors":
            data += blob
        with open(os.path.join(d, rel), "wb") as f:
            f.write(data)
        for i, e in enumerate(expect):
            if isinstance(e, tuple) and e[5] == rel:
                fqn, dtype, size, offsets, sizes, rel_, raw_off, raw_len = e
                j = lambda v: ",".join(map(str, v)) if v else "-"
                expect[i] = (f"tensor {fqn} {dtype} {j(size)} {j(offsets)} {j(sizes)} {rel} "
                             f"{raw_off} {raw_len} {fnv1a64(data[raw_off:raw_off + raw_len])}")
    planner = {fqn: tuple(fqn.split(".")) for fqn in sdm}
    kwargs = {"planner_data": planner, "storage_data": storage}
    if "storage_meta" in meta_fields:
        kwargs["storage_meta"] = C.StorageMeta(pathlib.Path("/ckpt") / name, "save-uuid")
    if "version" in meta_fields:
        kwargs["version"] = "1.0.0"
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(Metadata(sdm, **kwargs), f, protocol=4)
    with open(os.path.join(out, name + ".expect"), "w") as f:
        f.write("\n".join(expect) + "\n")


def main():
    out = sys.argv[1]
    full = ["planner_data", "storage_data", "storage_meta", "version"]
    write_fixture(out, "dcp_torch_save", "torch.distributed.checkpoint.metadata",
                  "_MEM_FORMAT_ENCODING", full, "torch_save")
    write_fixture(out, "dcp_torch22", "torch.distributed._shard.sharded_tensor.metadata",
                  "MEM_FORMAT_ENCODING", ["planner_data", "storage_data"], "torch_save")
    write_fixture(out, "dcp_safetensors", "torch.distributed.checkpoint.metadata",
                  "_MEM_FORMAT_ENCODING", full, "safetensors")


if __name__ == "__main__":
    main()
