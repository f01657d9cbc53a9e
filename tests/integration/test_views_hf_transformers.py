# transformers' own loader on the hf view: AutoModelForCausalLM.from_pretrained reads
# ROOT/.views/hf/ unmodified (every weight used, none missing or reshaped), and the model's logits
# equal, to fp32 round-off, those of the forward pass written in test_views_hf_logits.py the way
# Megatron computes it from its own rank files. Debian 12 has no transformers: there these tests
# are skipped, and a machine that has it (the GPU node, scripts/gpu-node-checks.sh) runs them.
import json
import sys

import pytest
import torch

from conftest import REPO_ROOT

transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
import megatron_fixture as mf  # noqa: E402
from test_views_hf import ARCHS, LLAMA  # noqa: E402
from test_views_hf_logits import megatron_forward  # noqa: E402


def from_pretrained(view):
    """The view loaded in float32 on the CPU, and transformers' report of what it did not use."""
    major = int(transformers.__version__.split(".")[0])
    dtype = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(view), output_loading_info=True, attn_implementation="eager", **dtype)
    return model.eval(), info


@pytest.mark.parametrize("arch,untie,groups,shape", [
    ("llama", True, 4, (2, 2)),   # GQA, untied head, TP 2 x PP 2
    ("llama", False, 2, (4, 1)),  # tied embeddings; TP 4 a multiple of the 2 query groups
    ("llama", True, 0, (2, 1)),   # no GQA: one group per head
    ("mistral", True, 2, (2, 2)),  # a sliding window (eager attention: the mask is exact)
    ("qwen2", False, 2, (2, 1)),  # q, k and v biases
    ("qwen3", True, 2, (2, 2)),   # per-head q/k norms
])
def test_from_pretrained_logits_equal_megatrons(mnt, arch, untie, groups, shape):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=untie, num_query_groups=groups, **ARCHS[arch][1])
    mf.save_checkpoint(root, cfg, *shape)
    view = root / ".views" / "hf"
    model, info = from_pretrained(view)
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(what), (what, info[what])
    assert type(model).__name__ == ARCHS[arch][0]
    config = json.loads((view / "config.json").read_text())
    assert model.config.num_key_value_heads == config["num_key_value_heads"] == cfg.groups
    assert model.config.tie_word_embeddings == (not untie)

    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = model(tokens[None]).logits[0].double()
    want = megatron_forward(root, cfg, *shape, tokens)
    assert got.shape == want.shape == (12, cfg.vocab_size)
    # float32 against a float64 reference: a few ulps of the largest logit, far below what a wrong
    # head grouping or gate/up swap gives (test_views_hf_logits.py shows that margin).
    tol = 1e-5 * want.abs().max().item()
    err = (got - want).abs().max().item()
    print(f"from_pretrained logits: max |err| {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol, (err, tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU on this machine")
def test_from_pretrained_on_the_gpu_matches_the_cpu(mnt):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, **LLAMA)
    mf.save_checkpoint(root, cfg, 2, 2)
    model, _ = from_pretrained(root / ".views" / "hf")
    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        cpu = model(tokens[None]).logits[0].double()
        gpu = model.to("cuda")(tokens[None].to("cuda")).logits[0].double().cpu()
    tol = 1e-3 * cpu.abs().max().item()  # the GPU's float32 kernels may use other reductions
    assert (gpu - cpu).abs().max().item() <= tol


@pytest.mark.parametrize("case", ["mixtral-sequential-tp2pp2ep2", "qwen3moe-te-mixed-tp2ep4",
                                  "qwen2moe-shared-mixed-tp2pp2ep2"])
def test_from_pretrained_moe_logits_equal_megatrons(mnt, case):
    # The MoE architectures from the Hub's per-expert names (transformers 5 fuses them on load).
    from test_views_hf_moe import CASES, megatron_moe_forward
    sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
    import megatron_moe_fixture as mm
    kw, shape, cls, _ = CASES[case]
    cfg = mm.MoeConfig(**kw)
    root = mnt / "ckpt"
    mm.save_checkpoint(root, cfg, *shape)
    model, info = from_pretrained(root / ".views" / "hf")
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(what), (what, info[what])
    assert type(model).__name__ == cls
    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = model(tokens[None]).logits[0].double()
    want = megatron_moe_forward(root, cfg, *shape, tokens)
    tol = 1e-5 * want.abs().max().item()
    err = (got - want).abs().max().item()
    print(f"from_pretrained {cls} logits: max |err| {err:.3g}, tolerance {tol:.3g}")
    assert err <= tol, (err, tol)
