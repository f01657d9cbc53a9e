# megatron.core's torch_dist checkpoints (dist_checkpointing on PyTorch DCP) through a real mount:
# written by tests/reshard/torch_dist_fixture.py in Megatron's layout (its docstring traces each
# fact to Megatron-LM's source), then recognized by `ckptfs inspect`, served whole by the DCP
# consolidated view of the iteration directory, and as a Hugging Face model by ROOT/.views/hf.
# The expected tensors are built from the fixture's full model, not from the chunks it wrote.
import json
import subprocess
import sys

import pytest
import torch

from conftest import CKPTFS_BIN, REPO_ROOT, run

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402

FIXTURE = REPO_ROOT / "tests" / "reshard" / "torch_dist_fixture.py"
LLAMA = dict(era="mcore", swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
             bias=False)


def write(root, tp, pp, **kw):
    """The torch_dist checkpoint of ModelConfig(LLAMA + kw) at TP x PP, and that config."""
    subprocess.run(["/usr/bin/python3", str(FIXTURE), str(root), "--tp", str(tp), "--pp", str(pp),
                    "--config", json.dumps(kw)], check=True, timeout=300)
    return mf.ModelConfig(**{**LLAMA, **kw})


# The fixture's module registers stand-ins for torch's DCP classes: it runs in a child.
GLOBAL = ("import sys, json, torch; sys.path.insert(0, sys.argv[1]); import torch_dist_fixture as f, "
          "megatron_fixture as mf; cfg = mf.ModelConfig(**json.loads(sys.argv[2])); "
          "torch.save(f.global_tensors(mf.FullModel(cfg), int(sys.argv[3])), sys.argv[4])")


@pytest.fixture
def expected(workdir):
    """expected(kw, tp): {key: tensor} of the model at its global shapes, from its pieces."""
    def make(cfg_kw, tp):
        out = workdir / "expected.pt"
        subprocess.run(["/usr/bin/python3", "-c", GLOBAL, str(REPO_ROOT / "tests" / "reshard"),
                        json.dumps({**LLAMA, **cfg_kw}), str(tp), str(out)], check=True,
                       timeout=300)
        return torch.load(out)
    return make


@pytest.mark.parametrize("kw,shape", [
    (dict(num_query_groups=4, untie=True), (2, 2)),
    (dict(num_query_groups=2, extra_state="empty"), (4, 1)),  # TE's extra state; TP 4 > 2 groups
])
def test_consolidated_view_holds_the_model_as_one(mnt, expected, kw, shape):
    root = mnt / "ckpt"
    write(root, *shape, **kw)
    want = expected(kw, shape[0])
    got = torch.load(root / "iter_0000100" / ".views" / "consolidated" / "model.pt")
    tensors = {k: v for k, v in got.items() if isinstance(v, torch.Tensor)}
    assert sorted(tensors) == sorted(want)
    for k, t in want.items():
        assert tensors[k].dtype == t.dtype and tensors[k].shape == t.shape, k
        assert torch.equal(tensors[k].view(torch.int16), t.view(torch.int16)), k
    # The ShardedObjects as saved: each linear's extra state per layer, each rank's RNG state.
    T, P = shape
    rng = [k for k in got if k.startswith("rng_state/shard_")]
    assert sorted(rng) == sorted(f"rng_state/shard_{p}.{t}_{P}.{T}" for p in range(P)
                                 for t in range(T))
    assert isinstance(got[rng[0]][0][0]["torch_rng_state"], torch.Tensor)
    extra = got["decoder.layers.self_attention.linear_qkv._extra_state/shard_0_4"]
    if kw.get("extra_state") == "empty":
        assert extra[0].dtype == torch.uint8 and extra[0].numel() == 0
    else:
        assert extra == [None]
