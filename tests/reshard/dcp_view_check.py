"""Checks a materialized model.pt of the DCP consolidated view with Debian's torch (1.13).

Run by dcp_view_test with /usr/bin/python3:
    dcp_view_check.py MODEL_PT DATA_DIR
DATA_DIR is tests/formats/data: the state dict every DCP fixture holds is make_dcp_fixtures'
state_dict(), whose flattened names are also the fixtures' planner_data paths joined with '.'.
Prints "ok" and exits 0 when the file is a sound zip that torch.load reads to exactly that state
dict (every tensor contiguous, of the same dtype and shape and equal values).
"""
import os
import sys
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sharing  # noqa: E402


def main():
    path, data_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, data_dir)
    from make_dcp_fixtures import state_dict

    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None, "a record's CRC-32 is wrong"
        names = z.namelist()
        assert names[0] == "model/data.pkl" and names[-1] == "model/version", names
        assert z.read("model/version") == b"3\n"

    # What torch >= 2.6 loads by default: only tensors and plain containers. (1.13's restricted
    # unpickler lacks opcodes the view writes for plain floats, so it loads unrestricted there.)
    got = torch.load(path, weights_only=int(torch.__version__.split(".")[0]) >= 2)
    # torch's dcp_to_torch_save loads every tensor into storage of its own: nothing is shared.
    assert sharing.objects(got) == [] and sharing.storages(got) == {}, "shared objects"
    want = state_dict()
    leaves = []

    def walk(v, prefix):
        if isinstance(v, dict):
            for k, x in v.items():
                assert isinstance(k, str), (prefix, k)
                walk(x, f"{prefix}.{k}" if prefix else k)
        else:
            leaves.append(prefix)

    walk(got, "")
    assert sorted(leaves) == sorted(want), (leaves, list(want))
    for fqn, w in want.items():
        v = got
        for k in fqn.split("."):
            v = v[k]
        if isinstance(w, torch.Tensor):
            assert isinstance(v, torch.Tensor), fqn
            assert v.dtype == w.dtype and v.shape == w.shape, (fqn, v.dtype, v.shape)
            assert v.is_contiguous() and not v.requires_grad, fqn
            assert torch.equal(v, w), (fqn, v, w)
        else:
            assert v == w and type(v) is type(w), (fqn, v, w)
    print("ok")


if __name__ == "__main__":
    main()
