#!/usr/bin/python3
"""Writes the .safetensors fixtures of tests/formats/safetensors_test.cc.

Debian 12 does not package the safetensors library (no python3-safetensors), so this script writes
the format itself, following the specification in huggingface/safetensors README.md ("Format") and
what the reference writer (safetensors/src/tensor.rs, `prepare` and `serialize`) does:
  - 8 bytes: N, little-endian u64; N bytes: the JSON header; then the byte buffer;
  - the header is compact JSON (serde_json: no spaces, non-ASCII as raw UTF-8, control characters
    as \\u00xx), "__metadata__" first when present, then one entry per tensor with the fields in
    the order dtype, shape, data_offsets;
  - tensors laid out by descending dtype (the spec's enum order is increasing alignment), then by
    name, back to back, offsets relative to the buffer;
  - the header padded with spaces to a multiple of 8 bytes.
Tensor bytes come from Debian's torch (and numpy for dtypes torch 1.13 lacks), little-endian,
row-major. Run with /usr/bin/python3 from anywhere; it rewrites the files beside itself. The
output is deterministic, so rerunning it leaves git clean.
"""

import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "safetensors")

# The spec's dtypes in the reference's enum order, with bits per element.
DTYPES = [
    ("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8),
    ("F8_E5M2", 8), ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
    ("I16", 16), ("U16", 16), ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32),
    ("C64", 64), ("F64", 64), ("I64", 64), ("U64", 64),
]
RANK = {name: i for i, (name, _) in enumerate(DTYPES)}
BITS = dict(DTYPES)

TORCH_DTYPE = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32",
    torch.complex64: "C64", torch.float64: "F64", torch.int64: "I64",
}


def from_torch(t):
    """(dtype name, shape, bytes) of a torch tensor."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: take the raw 16-bit patterns
        data = t.view(torch.int16).numpy().tobytes()
    else:
        data = t.numpy().tobytes()
    return TORCH_DTYPE[t.dtype], list(t.shape), data


def raw(dtype, shape, data):
    """A tensor given as raw bytes, for dtypes torch 1.13 cannot hold."""
    n = 1
    for d in shape:
        n *= d
    assert n * BITS[dtype] == 8 * len(data), (dtype, shape, len(data))
    return dtype, list(shape), bytes(data)


def header_json(entries, metadata):
    """Compact JSON like serde_json: no spaces, UTF-8 kept, control characters escaped."""
    obj = {}
    if metadata is not None:
        obj["__metadata__"] = metadata
    for name, dtype, shape, begin, end in entries:
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def write(path, tensors, metadata=None, header_order=None):
    """Writes tensors {name: (dtype, shape, bytes)} the way the reference writer lays them out.

    header_order, if given, lists the names in the order the JSON entries are written (a
    third-party writer's choice); the data layout stays the reference's.
    """
    names = sorted(tensors, key=lambda n: (-RANK[tensors[n][0]], n.encode("utf-8")))
    entries, offset, buffer = {}, 0, b""
    for name in names:
        dtype, shape, data = tensors[name]
        entries[name] = (name, dtype, shape, offset, offset + len(data))
        offset += len(data)
        buffer += data
    order = header_order if header_order is not None else names
    header = header_json([entries[n] for n in order], metadata)
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        f.write(buffer)


def basic():
    # What a small model's state dict looks like, with the "format": "pt" metadata that
    # transformers' save_pretrained passes; plus a scalar and an empty tensor, both legal.
    tensors = {
        "embed.weight": from_torch(torch.arange(12, dtype=torch.float32).reshape(3, 4)),
        "layers.0.bias": from_torch(torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16)),
        "step": from_torch(torch.tensor(1000, dtype=torch.int64)),
        "mask": from_torch(torch.tensor([True, False, True, True, False])),
        "empty": from_torch(torch.zeros(0, 4, dtype=torch.float16)),
        "counts": from_torch(torch.tensor([-1, 2, -3, 4], dtype=torch.int32)),
        "freqs": from_torch(torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64)),
        "scale": from_torch(torch.tensor([1.5, -2.25], dtype=torch.float64)),
    }
    write(os.path.join(OUT, "basic.safetensors"), tensors, metadata={"format": "pt"})


def all_dtypes():
    # One tensor per dtype of the spec, element i holding byte pattern i where it can.
    tensors = {
        "bool": from_torch(torch.tensor([True, False])),
        "f4": raw("F4", [4], [0x21, 0x43]),
        "f6_e2m3": raw("F6_E2M3", [4], [1, 2, 3]),
        "f6_e3m2": raw("F6_E3M2", [4], [4, 5, 6]),
        "u8": from_torch(torch.tensor([0, 1, 254, 255], dtype=torch.uint8)),
        "i8": from_torch(torch.tensor([-128, -1, 0, 127], dtype=torch.int8)),
        "f8_e5m2": raw("F8_E5M2", [2], [0x3C, 0xC0]),
        "f8_e4m3": raw("F8_E4M3", [2], [0x38, 0xB8]),
        "f8_e8m0": raw("F8_E8M0", [2], [0x7F, 0x80]),
        "f8_e4m3fnuz": raw("F8_E4M3FNUZ", [2], [0x40, 0xC0]),
        "f8_e5m2fnuz": raw("F8_E5M2FNUZ", [2], [0x40, 0xC0]),
        "i16": from_torch(torch.tensor([-32768, 32767], dtype=torch.int16)),
        "u16": raw("U16", [2], np.array([1, 65535], dtype="<u2").tobytes()),
        "f16": from_torch(torch.tensor([1.0, -0.5], dtype=torch.float16)),
        "bf16": from_torch(torch.tensor([1.0, -0.5], dtype=torch.bfloat16)),
        "i32": from_torch(torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32)),
        "u32": raw("U32", [2], np.array([1, 2**32 - 1], dtype="<u4").tobytes()),
        "f32": from_torch(torch.tensor([1.0, -0.5], dtype=torch.float32)),
        "c64": from_torch(torch.tensor([1 - 1j], dtype=torch.complex64)),
        "f64": from_torch(torch.tensor([1.0, -0.5], dtype=torch.float64)),
        "i64": from_torch(torch.tensor([-(2**63), 2**63 - 1], dtype=torch.int64)),
        "u64": raw("U64", [2], np.array([1, 2**64 - 1], dtype="<u8").tobytes()),
    }
    assert {t[0] for t in tensors.values()} == set(BITS)
    write(os.path.join(OUT, "all_dtypes.safetensors"), tensors)


def odd_names():
    # Names that need JSON escapes or are not ASCII, and no metadata: the writer must produce
    # the same header bytes.
    tensors = {
        'quote"back\\slash': from_torch(torch.tensor([1], dtype=torch.int8)),
        "new\nline\ttab\x01ctl\x7f": from_torch(torch.tensor([2], dtype=torch.int8)),
        "caf\u00e9.\u6743\u91cd.\U0001F600": from_torch(torch.tensor([3], dtype=torch.int8)),
        "slash/ok": from_torch(torch.tensor([4.0], dtype=torch.float32)),
    }
    write(os.path.join(OUT, "odd_names.safetensors"), tensors)


def header_order():
    # JSON entries not in data order (as some third-party writers produce): readers go by the
    # offsets, and ckptfs reports tensors in header order.
    tensors = {
        "a": from_torch(torch.tensor([1.0, 2.0], dtype=torch.float32)),
        "b": from_torch(torch.tensor([3, 4], dtype=torch.int16)),
        "c": from_torch(torch.tensor([5], dtype=torch.int64)),
    }
    write(os.path.join(OUT, "header_order.safetensors"), tensors,
          metadata={"z": "last key first", "a": ""}, header_order=["b", "c", "a"])


def main():
    os.makedirs(OUT, exist_ok=True)
    basic()
    all_dtypes()
    odd_names()
    header_order()


if __name__ == "__main__":
    main()
